"""A deterministic toy engine for fast pipeline tests (no weights, no downloads).

The toy LM's next token is a fixed permutation of the last token, so greedy
output cycles and the prompt-lookup draft is accepted part of the time; each
forward sleeps ``step_s`` (plus a little per token) so timings are real
numbers of a stable size. It implements the engine seam
(:mod:`measure.seam`): ``load_target`` → a target with ``model`` and
``new_decoder()``, ``make_draft`` (``ngram:N``), ``encode``, ``versions``,
``peer_generate`` and ``library_generate`` (its "own" decoding: plain greedy).
Its decoder declares one fast path of the seam, ``forward_argmax`` (the ids
straight from the permutation, no logits), as an engine does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from measure.drafts import NGramDraft
from measure.seam import Decoder, PeerResult, TargetModel

VOCAB = 64


class ToyLM(torch.nn.Module):
    """next(t) = perm[t] with probability ~1 (a sharp logit), ignoring the cache."""

    def __init__(self, vocab: int = VOCAB, seed: int = 0, step_s: float = 0.002) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("perm", torch.randperm(vocab, generator=g))
        self.vocab, self.step_s = vocab, step_s

    def next_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The next token after each of ``input_ids`` ``[1, S]`` → ``[1, S]``, after the step's sleep."""
        time.sleep(self.step_s + 0.0002 * int(input_ids.shape[1]))
        return self.perm[input_ids]

    def forward(self, input_ids: torch.Tensor, past_key_values: Any = None, use_cache: bool = False,
                **_: Any) -> Any:
        nxt = self.next_ids(input_ids)  # [1, S]
        logits = torch.full((*input_ids.shape, self.vocab), -10.0)
        logits.scatter_(-1, nxt[..., None], 10.0)
        return SimpleNamespace(logits=logits)


class ToyDecoder(Decoder):
    """Decoder over :class:`ToyLM` (the cache is only a length), with the fast path ``forward_argmax``."""

    def __init__(self, model: ToyLM) -> None:
        self.model, self.vocab_size, self._n = model, model.vocab, 0

    @property
    def n_cached(self) -> int:
        return self._n

    def reset(self) -> None:
        self._n = 0

    def forward(self, input_ids: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        logits = self.model(input_ids).logits[0]  # [n, V]
        self._n += int(input_ids.shape[1])
        return logits[-1:] if last_only else logits

    def forward_argmax(self, input_ids: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """The greedy ids without logits: the permutation of the fed tokens (the same step time)."""
        ids = self.model.next_ids(input_ids)[0]  # [n]
        self._n += int(input_ids.shape[1])
        return ids[-1:] if last_only else ids

    def rollback(self, n_tokens: int) -> None:
        self._n = min(self._n, n_tokens)


@dataclass
class ToyTarget(TargetModel):
    model: ToyLM
    name: str = "toy"
    synthetic: bool = False
    vocab_size: int = VOCAB
    device: str = "cpu"
    dtype: str = "float32"
    eos_token_ids: tuple[int, ...] = ()
    tokenizer: Any = None

    def describe(self) -> dict:
        return {"name": self.name, "source": "toy", "synthetic": False, "vocab_size": self.vocab_size,
                "params": 0, "dtype": "float32", "device": "cpu"}

    def new_decoder(self) -> ToyDecoder:
        return ToyDecoder(self.model)


@dataclass
class ToyEngine:
    step_s: float = 0.002
    name: str = "toy"
    near_tie_tolerance: float = 0.0
    loads: list = field(default_factory=list)

    def load_target(self, spec: str, *, device: str, dtype: str, seed: int) -> ToyTarget:
        self.loads.append(spec)
        return ToyTarget(ToyLM(seed=seed, step_s=self.step_s))

    def make_draft(self, spec: str, target: ToyTarget, *, seed: int) -> Any:
        n = int(spec.partition(":")[2] or 3)
        d = NGramDraft(f"ngram:{n}", n)
        d.vocab_size = target.vocab_size
        return d

    def encode(self, target: ToyTarget, text: str, max_prompt_tokens: int) -> torch.Tensor:
        ids = [b % target.vocab_size for b in text.encode("utf-8")][-max_prompt_tokens:]
        return torch.tensor([ids], dtype=torch.long)

    def versions(self) -> dict:
        return {"toy": "1"}

    def has_peer(self, target: ToyTarget, draft: Any, gamma: int) -> bool:
        return True

    def has_library(self, target: ToyTarget) -> bool:
        return True

    def library_generate(self, target: ToyTarget, input_ids: torch.Tensor, temperature: float,
                         max_new_tokens: int, seed: int) -> PeerResult:
        """The toy's "own plain decoding": greedy, token by token, recomputing the prefix (no cache)."""
        return self.peer_generate(target, None, input_ids, 0, temperature, max_new_tokens, seed)

    def peer_generate(self, target: ToyTarget, draft: Any, input_ids: torch.Tensor, gamma: int,
                      temperature: float, max_new_tokens: int, seed: int) -> PeerResult:
        t0 = time.perf_counter()
        out: list[int] = []
        x = input_ids
        for _ in range(max_new_tokens):
            tok = int(target.model(x).logits[0, -1].argmax())
            out.append(tok)
            x = torch.tensor([[tok]])
        return PeerResult(tokens=tuple(out), wall_s=time.perf_counter() - t0, drafted=0, accepted=0, rounds=0)


class InterruptedToy(ToyEngine):
    """The toy engine, Ctrl-C'd in the middle of its ``stop_at``-th library generation (warm-ups count)."""

    def __init__(self, stop_at: int) -> None:
        super().__init__()
        self.stop_at, self.calls = stop_at, 0

    def library_generate(self, *a, **kw):
        self.calls += 1
        if self.calls == self.stop_at:
            raise KeyboardInterrupt
        return super().library_generate(*a, **kw)


class NoLibraryToy(ToyEngine):
    """The toy engine without a library baseline (as the transformers engine): its visits hold three modes."""

    def has_library(self, target: ToyTarget) -> bool:
        return False

    def library_generate(self, *a: Any, **kw: Any) -> None:
        return None


class KilledToy(NoLibraryToy):
    """:class:`NoLibraryToy` SIGKILLed-alike (``KeyboardInterrupt``) in its ``stop_at``-th generation of any mode
    (warm-ups count); ``calls`` counts every generation, so a test sees what a resume measured again."""

    def __init__(self, stop_at: int = 0) -> None:
        super().__init__()
        self.stop_at, self.calls = stop_at, 0

    def _count(self) -> None:
        self.calls += 1
        if self.calls == self.stop_at:
            raise KeyboardInterrupt

    def peer_generate(self, *a: Any, **kw: Any) -> PeerResult:
        self._count()
        return super().peer_generate(*a, **kw)
