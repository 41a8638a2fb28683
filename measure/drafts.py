"""Drafts for speculative decoding, written against the seam, and the draft specs that name them.

Draft specs (validated without loading a model by :func:`parse_draft_spec` and,
for layer bounds, :func:`check_draft_spec`; an engine builds the draft,
``engine.make_draft(spec, target)``):

* ``model:<model spec>`` — a separate model (any model spec of the engine);
  it must share the target's vocabulary.
* ``early:N`` — early exit: the target's first N layers, sharing its
  embeddings, final norm and head.
* ``layers:0-5,20-29`` — any layer subset of the target (skipped layers), same sharing.
* ``int8`` — a dynamic-int8 copy of the target's Linear layers (CPU).
* ``bf16`` / ``fp16`` — a half-precision copy of the target.
* ``ngram`` / ``ngram:N`` — model-free prompt lookup: continue the most recent
  earlier occurrence of the last n ≤ N tokens (N = 3 by default).
* ``ngram:N:first`` — transformers' prompt-lookup rule
  (``PromptLookupCandidateGenerator``): the earliest occurrence, the
  continuation cut before the first EOS.

Here: :class:`ModelDraft`, a draft over any engine's :class:`~measure.seam.Decoder`
(the caller makes the decoder and hands it in: the transformers engine's
model copies and the llama.cpp engine's ``model:`` and ``quant:`` drafts alike;
``draft.model.lm_head`` of a transformers draft may be swapped for a
kept-vocabulary head, whose fast path is used greedily, or any module returning
full-vocab logits), and the
engine-agnostic prompt-lookup draft (:class:`NGramDraft`, :func:`ngram_draft`).
The builders of the transformers-only kinds (``early``, ``layers``, ``int8``,
``bf16``, ``fp16``, ``model``) are in :mod:`measure.engines.transformers.drafts`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from measure.decoding import probs_from_logits, sample
from measure.seam import Decoder, Draft, SparseProbs


# -- draft specs -----------------------------------------------------------------------------
NGRAM_RULES = ("recent", "first")
_FORMS = {
    "model": "model:<spec>",
    "early": "early:N",
    "layers": "layers:a-b,c",
    "int8": "int8",
    "bf16": "bf16",
    "fp16": "fp16",
    "ngram": "ngram, ngram:N, ngram:N:first",
}


#: The draft kinds a spec may name.
DRAFT_KINDS = tuple(_FORMS)


def _valid_forms() -> str:
    return ", ".join(_FORMS.values())


@dataclass(frozen=True)
class DraftSpec:
    """A parsed draft spec: ``kind`` and its argument text (``"ngram"``, ``"3:first"``)."""

    kind: str
    arg: str = ""

    def to_str(self) -> str:
        return f"{self.kind}:{self.arg}" if self.arg else self.kind

    @classmethod
    def parse(cls, text: str) -> "DraftSpec":
        return parse_draft_spec(text)

    @property
    def ngram(self) -> tuple[int, str]:
        """(N, rule) of an ``ngram`` spec."""
        if self.kind != "ngram":
            raise ValueError(f"draft {self.to_str()!r} is not an ngram draft")
        n, _, rule = self.arg.partition(":")
        return (int(n) if n else 3), ("first" if rule == "first" else "recent")


def _bad(text: str, why: str, kind: str | None = None) -> ValueError:
    forms = _FORMS.get(kind, "") if kind in _FORMS else _valid_forms()
    return ValueError(f"draft {text!r}: {why}; valid: {forms}")


def layer_ranges(text: str, arg: str) -> list[tuple[int, int]]:
    """``(first, last)`` layer ranges of a ``layers:`` list ``arg`` (``0-5,20-29``); ``text`` names the spec in errors."""
    parts = arg.split(",")
    out = []
    for part in parts:
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m:
            raise _bad(text, f"bad layer list {arg!r} (e.g. layers:0-5,20-29)", "layers")
        a, b = int(m.group(1)), int(m.group(2) or m.group(1))
        if b < a:
            raise _bad(text, f"layer range {a}-{b} is descending", "layers")
        out.append((a, b))
    return out


def parse_draft_spec(text: str) -> DraftSpec:
    """Validate a draft spec without loading anything → :class:`DraftSpec` (``ValueError``: one line)."""
    t = str(text).strip()
    if not t:
        raise _bad(str(text), "empty draft spec")
    kind, sep, arg = t.partition(":")
    if kind not in DRAFT_KINDS:
        raise ValueError(f"unknown draft kind {t!r}; valid: {_valid_forms()}")
    if kind == "model":
        if not arg.strip():
            raise _bad(t, "needs a model spec, e.g. model:smollm2-135m", kind)
    elif kind == "early":
        if not arg.isdigit() or int(arg) < 1:
            raise _bad(t, "N must be an integer >= 1 (layers kept)", kind)
        arg = str(int(arg))
    elif kind == "layers":
        if not arg:
            raise _bad(t, "needs a layer list", kind)
        layer_ranges(t, arg)
    elif kind in ("int8", "bf16", "fp16"):
        if sep:
            raise _bad(t, f"{kind!r} takes no argument", kind)
    elif kind == "ngram":
        if sep:
            n, sep2, rule = arg.partition(":")
            if not n.isdigit() or int(n) < 1:
                raise _bad(t, f"N must be an integer >= 1, got {n!r}", kind)
            if sep2 and rule != "first":
                raise _bad(t, f"unknown matching rule {rule!r} (only 'first')", kind)
            arg = f"{int(n)}:first" if sep2 else str(int(n))
    return DraftSpec(kind, arg)


def parse_layers(text: str, n_layers: int) -> list[int]:
    """``"0-5,20-29"`` → sorted unique layer indices, each in ``[0, n_layers)``."""
    out: set[int] = set()
    for a, b in layer_ranges(f"layers:{text}", text):
        out.update(range(a, b + 1))
    if not out or min(out) < 0 or max(out) >= n_layers:
        raise ValueError(f"layer list {text!r} must name layers in 0..{n_layers - 1}")
    return sorted(out)


def check_draft_spec(spec: str | DraftSpec, n_layers: int | None) -> DraftSpec:
    """:func:`parse_draft_spec` plus the checks that need only the target's layer count (no weights)."""
    ds = spec if isinstance(spec, DraftSpec) else parse_draft_spec(spec)
    if n_layers is None:
        return ds
    text = ds.to_str()
    if ds.kind == "early" and not 1 <= int(ds.arg) < n_layers:
        raise _bad(text, f"needs 1 <= N < {n_layers} (target layers), got {ds.arg}", "early")
    if ds.kind == "layers":
        hi = max(b for _, b in layer_ranges(text, ds.arg))
        if hi >= n_layers:
            raise _bad(text, f"layer {hi} out of range: the target has layers 0..{n_layers - 1}", "layers")
    return ds


# -- drafts --------------------------------------------------------------------------------
class ModelDraft(Draft):
    """A draft backed by a model with its own KV-cached :class:`~measure.seam.Decoder`, whatever the engine.

    ``decoder``: the draft model's decoder, made by the engine that loaded it;
    ``model``: the module behind it where there is one (a transformers causal
    LM: its parameters are counted, its ``lm_head`` may be swapped, the peer
    uses it), else None (a llama.cpp draft: ``info`` then carries its
    ``params``); ``loaded``: the loaded model record, kept alive with the draft.
    Greedy steps take the decoder's ``forward_argmax``, sampled ones its
    kept-vocabulary ``forward_topk`` where its head is a pruned one.
    """

    def __init__(self, name: str, kind: str, decoder: Decoder, model: Any = None, synthetic: bool = False,
                 info: dict | None = None, loaded: Any = None) -> None:
        self.name, self.kind, self.model, self.synthetic = name, kind, model, synthetic
        self.info = dict(info or {})
        self.loaded = loaded
        self.decoder = decoder
        self.vocab_size = int(decoder.vocab_size)

    def describe(self) -> dict:
        """The ``run.json`` ``drafts`` entry: kind, synthetic, params (counted from ``model``, else ``info``'s)
        and ``info``."""
        if self.model is None and "params" in self.info:
            return {"kind": self.kind, "synthetic": self.synthetic, **self.info}
        params = (int(sum(p.numel() for p in {id(p): p for p in self.model.parameters()}.values()))
                  if self.model is not None else None)
        return {"kind": self.kind, "synthetic": self.synthetic, "params": params, **self.info}

    @property
    def cached_tokens(self) -> int:
        return self.decoder.n_cached

    def start(self, prompt_ids: torch.Tensor) -> None:
        """New sequence: prefill the draft cache with the prompt ``[1, S]``."""
        self.decoder.reset()
        self.decoder.forward_argmax(prompt_ids, last_only=True)

    def propose(self, tokens: torch.Tensor, gamma: int, temperature: float,
                generator: torch.Generator | None) -> tuple[torch.Tensor, Any]:
        """Draft ``gamma`` tokens after ``tokens`` ``[1, L]`` → tokens ``[γ]`` (on the device), q (None if greedy).

        Greedy: the argmax never leaves the device. Sampling: q ``[γ, V]``, or a
        :class:`~measure.decoding.SparseProbs` over the ``K`` kept tokens of a pruned head.
        """
        dec = self.decoder
        inp = tokens[:, dec.n_cached:]  # [1, u], u >= 1 uncached tokens
        out = torch.empty(gamma, dtype=torch.long, device=tokens.device)  # [γ]
        if temperature == 0:
            for i in range(gamma):
                x = dec.forward_argmax(inp, last_only=True)  # [1]
                out[i:i + 1] = x
                inp = out[i:i + 1].view(1, 1)
            return out, None
        qs, ids = [], []
        for i in range(gamma):
            pruned = dec.forward_topk(inp, True)
            if pruned is not None:  # a pruned head: a K-sized distribution, no -inf over V
                kid, klogits = pruned  # [1, K], [1, K]
                q = probs_from_logits(klogits, temperature)  # [1, K]
                out[i:i + 1] = kid[0, sample(q, generator)]
                ids.append(kid)
            else:
                q = probs_from_logits(dec.forward(inp, last_only=True), temperature)  # [1, V]
                out[i:i + 1] = sample(q, generator)
            qs.append(q)
            inp = out[i:i + 1].view(1, 1)
        if ids:
            return out, SparseProbs(torch.cat(ids), torch.cat(qs))
        return out, torch.cat(qs)

    def rollback(self, n_tokens: int) -> None:
        """Keep the first ``n_tokens`` positions of the draft cache."""
        self.decoder.rollback(n_tokens)

    @torch.inference_mode()
    def position_probs(self, tokens: torch.Tensor, prompt_tokens: int, temperature: float) -> torch.Tensor:
        """Teacher-forced q at each generated position of ``tokens`` ``[1, L]`` → ``[L − prompt_tokens, V]``.

        Greedy: one-hot on the draft's argmax. Leaves the draft's cache empty.
        """
        dec = self.decoder
        dec.reset()
        if temperature == 0:
            ids = dec.forward_argmax(tokens[:, :-1])[prompt_tokens - 1:]  # [n]
            dec.reset()
            return torch.zeros(ids.shape[0], self.vocab_size, device=tokens.device).scatter_(1, ids[:, None], 1.0)
        logits = dec.forward(tokens[:, :-1])[prompt_tokens - 1:]  # [n, V]
        dec.reset()
        return probs_from_logits(logits, temperature)


def ngram_lookup(seq: Sequence[int], max_ngram: int, gamma: int, rule: str = "recent",
                 eos_token_ids: Sequence[int] = ()) -> list[int]:
    """Brute-force reference of the lookup rules (what :class:`NGramIndex` answers incrementally).

    For n from ``min(max_ngram, len(seq) − 1)`` down to 1: find an earlier
    occurrence of the last n tokens that has a continuation; ``rule="recent"``
    takes the most recent, ``"first"`` the earliest (transformers'
    ``PromptLookupCandidateGenerator``, whose continuation is also cut before
    the first EOS token, and which stops at the first matching n even if that
    leaves nothing). Returns up to ``gamma`` tokens, possibly none.
    """
    L = len(seq)
    seq = list(seq)
    for n in range(min(max_ngram, L - 1), 0, -1):
        tail = seq[L - n:]
        starts = range(L - n - 1, -1, -1) if rule == "recent" else range(0, L - n)
        for s in starts:
            if seq[s:s + n] == tail:
                cont = seq[s + n:s + n + gamma]
                if rule == "first" and eos_token_ids:
                    cut = next((i for i, t in enumerate(cont) if t in eos_token_ids), None)
                    cont = cont[:cut] if cut is not None else cont
                return cont
    return []


class NGramIndex:
    """Incremental n-gram index of a growing token sequence: O(N) per appended token, O(N) per lookup.

    ``tables[n]`` maps each n-gram that has a continuation to its most recent
    (``rule="recent"``) or earliest (``"first"``) start; the gram ending at the
    last token is entered when the next token arrives, so a lookup of the tail
    never finds the tail itself — exactly :func:`ngram_lookup`.
    """

    def __init__(self, max_ngram: int, rule: str = "recent", eos_token_ids: Sequence[int] = ()) -> None:
        if rule not in NGRAM_RULES:
            raise ValueError(f"ngram rule {rule!r}: valid: {', '.join(NGRAM_RULES)}")
        self.max_ngram, self.rule = int(max_ngram), rule
        self.eos = frozenset(int(t) for t in eos_token_ids) if rule == "first" else frozenset()
        self.seq: list[int] = []
        self.tables: list[dict[tuple[int, ...], int]] = [{} for _ in range(self.max_ngram + 1)]

    def append(self, token: int) -> None:
        seq = self.seq
        seq.append(int(token))
        end = len(seq) - 1  # grams ending just before the new token now have a continuation
        first = self.rule == "first"
        for n in range(1, min(self.max_ngram, end) + 1):
            key = tuple(seq[end - n:end])
            if first:
                self.tables[n].setdefault(key, end - n)
            else:
                self.tables[n][key] = end - n

    def extend(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            self.append(t)

    def propose(self, gamma: int) -> list[int]:
        """Continuation after the sequence (at most ``gamma`` tokens, possibly empty)."""
        seq = self.seq
        L = len(seq)
        for n in range(min(self.max_ngram, L - 1), 0, -1):
            s = self.tables[n].get(tuple(seq[L - n:]))
            if s is not None:
                cont = seq[s + n:s + n + gamma]
                if self.eos:
                    cut = next((i for i, t in enumerate(cont) if t in self.eos), None)
                    cont = cont[:cut] if cut is not None else cont
                return cont
        return []


class NGramDraft(Draft):
    """Model-free prompt-lookup draft (Saxena 2023; transformers' ``prompt_lookup_num_tokens``).

    ``rule="recent"`` (spec ``ngram:N``): the most recent earlier occurrence of
    the last n tokens (n from ``max_ngram`` down to 1); ``rule="first"`` (spec
    ``ngram:N:first``): transformers' earliest-match rule. It may propose fewer
    than γ tokens, or none. Deterministic: q is one-hot. The index is kept
    incrementally: the loop reports each round's tokens through :meth:`observe`.
    """

    kind = "ngram"
    synthetic = False
    model = None

    def __init__(self, name: str, max_ngram: int = 3, rule: str = "recent",
                 eos_token_ids: Sequence[int] = (), vocab_size: int | None = None) -> None:
        if isinstance(max_ngram, bool) or not isinstance(max_ngram, int) or max_ngram < 1:
            raise ValueError(f"ngram size must be an integer >= 1, got {max_ngram!r}")
        if rule not in NGRAM_RULES:
            raise ValueError(f"ngram rule {rule!r}: valid: {', '.join(NGRAM_RULES)}")
        self.name, self.max_ngram, self.rule = name, int(max_ngram), rule
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.vocab_size = vocab_size
        self.index = self.new_index([])

    def describe(self) -> dict:
        return {"kind": self.kind, "synthetic": False, "max_ngram": self.max_ngram, "rule": self.rule, "params": 0}

    def new_index(self, seq: Sequence[int]) -> NGramIndex:
        """A fresh :class:`NGramIndex` with this draft's rule over ``seq``."""
        idx = NGramIndex(self.max_ngram, self.rule, self.eos_token_ids)
        idx.extend(seq)
        return idx

    def start(self, prompt_ids: torch.Tensor) -> None:
        self.index = self.new_index(prompt_ids[0].tolist())

    def observe(self, new_tokens: Sequence[int]) -> None:
        """Tokens the loop emitted (host ints), appended to the index."""
        self.index.extend(new_tokens)

    def lookup(self, seq: Sequence[int], gamma: int) -> list[int]:
        """Continuation proposed after ``seq`` (brute force: :func:`ngram_lookup` with this draft's rule)."""
        return ngram_lookup(seq, self.max_ngram, gamma, self.rule, self.eos_token_ids)

    def propose(self, tokens: torch.Tensor, gamma: int, temperature: float,
                generator: torch.Generator | None) -> tuple[torch.Tensor, None]:
        L = int(tokens.shape[1])
        have = len(self.index.seq)
        if have > L:  # not the sequence we indexed: rebuild
            self.index = self.new_index(tokens[0].tolist())
        elif have < L:  # a caller that does not observe(): catch up from the tensor
            self.index.extend(tokens[0, have:].tolist())
        cont = self.index.propose(gamma)
        return torch.tensor(cont, dtype=tokens.dtype, device=tokens.device), None  # [k], q one-hot

    def rollback(self, n_tokens: int) -> None:
        pass  # the index only ever holds emitted tokens

    def position_probs(self, tokens: torch.Tensor, prompt_tokens: int, temperature: float,
                       vocab_size: int | None = None) -> torch.Tensor:
        """One-hot on the first looked-up token at each generated position (zero row if none)."""
        seq = tokens[0].tolist()
        n = len(seq) - prompt_tokens
        v = vocab_size or self.vocab_size
        if v is None:
            raise ValueError(f"draft {self.name!r}: position_probs needs the vocabulary size (vocab_size)")
        q = torch.zeros(n, v, device=tokens.device)
        idx = self.new_index(seq[:prompt_tokens])
        for i in range(n):
            cont = idx.propose(1)
            if cont:
                q[i, cont[0]] = 1.0
            idx.append(seq[prompt_tokens + i])
        return q


def ngram_draft(spec: str | DraftSpec, vocab_size: int | None = None, eos_token_ids: Sequence[int] = ()) -> NGramDraft:
    """The :class:`NGramDraft` of an ``ngram`` spec (``ngram``, ``ngram:N``, ``ngram:N:first``; every engine's)."""
    ds = spec if isinstance(spec, DraftSpec) else parse_draft_spec(spec)
    n, rule = ds.ngram
    name = f"ngram:{n}" + (":first" if rule == "first" else "")
    return NGramDraft(name, n, rule, eos_token_ids=eos_token_ids, vocab_size=vocab_size)
