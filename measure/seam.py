"""The seam: every protocol and small record that crosses ``measure``'s layers.

The loops and drafts (:mod:`measure.decoding`, :mod:`measure.drafts`) are
written against these types only, the engine adapters (:mod:`measure.engines`)
implement them, and the sweep (:mod:`measure.sweep`) holds them together:

* :class:`Decoder` — one model's KV-cached token sequence. ``forward`` feeds
  ``n`` tokens after what is cached and returns their logits; ``rollback``
  keeps a prefix. Every loop in :mod:`measure.decoding` (baseline,
  speculative rounds, teacher-forced traces, cost curves) is written against
  it, so the loop is the same code whatever the engine. The caller makes the
  decoder (``target.new_decoder()``) and passes it to the loops.
* :class:`TreeDecoder` — a decoder that also verifies a token tree in one
  forward (a tree attention mask) and keeps the accepted path's cache entries.
* :class:`TargetModel` — a loaded model: hands out decoders, describes itself.
* :class:`Engine` — loads a target and drafts from specs, tokenises prompts,
  names its versions for ``run.json``, and runs the engine's own speculative
  decoding as a peer when it has one (:class:`PeerResult`), configured by
  :class:`EngineOptions`.
* :class:`Draft` — what the speculative loop needs from a draft; a sampled
  pruned draft returns its probabilities as :class:`SparseProbs`.

Abilities are declared, not probed: :class:`Decoder`, :class:`TreeDecoder` and
:class:`Draft` are base classes (protocols that engines subclass explicitly)
carrying a default for every fast path — greedy ids, top-k log-probabilities,
a tree's argmax and top-k, a kept-vocabulary head's logits, a decoder's own
greedy loop, a draft's ``observe`` and lookup index — computed from the plain
``forward`` (or doing nothing). An engine overrides what it does faster and the
loops call the methods directly: no ``getattr`` on a decoder, draft or target
(tests/project/test_no_ability_probes.py).
* :class:`KeptVocabularyHead` — an output head that scores ``K`` kept tokens
  of the vocabulary (the pruned draft head, :mod:`measure.head.pruned_head`):
  a decoder takes its ids-and-logits fast path where a model has one.
* :class:`GenerationResult` / :class:`RoundRecord` — what the loops return.

Logits cross the seam as float32 torch tensors on the decoder's device (a
llama.cpp engine wraps its host buffer with ``torch.from_numpy``, no copy),
token ids as ``torch.long`` tensors ``[1, n]``.

Cache invariant kept by the loops: after ``forward`` of ``n`` tokens,
``n_cached`` grew by ``n``; ``rollback(m)`` with ``m <= n_cached`` leaves
exactly the first ``m`` positions, as if only they had ever been fed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:  # torch only in annotations: the llama.cpp worker imports the engines without torch
    import torch

#: ``--engine`` choices; each names a module of this package exposing ``make_engine(options) -> Engine``.
ENGINES = ("transformers", "llamacpp")
#: ``--cache`` choices (transformers engine): a preallocated static KV cache, or transformers' DynamicCache.
CACHES = ("static", "dynamic")


@dataclass(frozen=True)
class EngineOptions:
    """Engine settings that change timings; recorded in ``run.json`` and part of a run's fingerprint.

    ``threads``: CPU threads (None: the engine's default). ``cache``/``compile``:
    the transformers engine's KV cache kind and ``torch.compile`` of its decode
    steps; ``max_len_tokens``: what a static cache is sized for (prompt + new
    tokens + γ_max + 1). ``quiet``: silence third-party loading output. ``tree_sequences``: a tree run's
    (:mod:`measure.trees`) most root-to-leaf paths in one round plus the committed sequence; the llama.cpp
    engine then makes every context of the run with ``n_seq_max`` of it and a unified KV cache (what llama.cpp's
    own tree speculation sets); 0, every other run: llama.cpp's own single-sequence context.
    """

    device: str = "cpu"
    threads: int | None = None
    cache: str = "static"
    compile: bool = False
    max_len_tokens: int = 512
    quiet: bool = False
    tree_sequences: int = 0

    def __post_init__(self) -> None:
        if self.cache not in CACHES:
            raise ValueError(f"--cache {self.cache!r}: unknown; valid: {', '.join(CACHES)}")
        if self.threads is not None and not 1 <= self.threads <= 1024:
            raise ValueError(f"--threads {self.threads}: must be in 1..1024")
        if self.max_len_tokens < 2:
            raise ValueError(f"max_len_tokens {self.max_len_tokens}: must be >= 2")
        if self.tree_sequences < 0:
            raise ValueError(f"tree_sequences {self.tree_sequences}: must be >= 0")


def topk_logprobs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's ``k`` best ids (best first, ``[n, k]`` long) and their log-probabilities (``[n, k]`` float32)
    from logits ``[n, V]`` (``k`` capped at ``V``): what the seam's default top-k paths return."""
    vals, ids = logits.float().log_softmax(-1).topk(min(int(k), int(logits.shape[-1])))
    return ids, vals


@runtime_checkable
class Decoder(Protocol):
    """One model's KV-cached sequence (batch size 1).

    An engine's decoder subclasses this class and implements ``n_cached``, ``reset``, ``forward`` and
    ``rollback``. The other methods are *fast paths* with a default here, computed from ``forward``; an engine
    overrides the ones it does faster (the llama.cpp decoder all of them: only ids and a few scores cross its
    process boundary, not ``[n, V]`` logits), and the loops call them directly, never asking whether they
    exist (tests/measure/test_measure_seam.py holds each engine to the ones it declares).
    """

    vocab_size: int

    @property
    def n_cached(self) -> int:
        """Positions currently in the cache."""
        ...

    def reset(self) -> None:
        """Empty the cache (a new sequence)."""
        ...

    def forward(self, input_ids: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Feed ``input_ids`` ``[1, n]`` after the cache → float logits ``[n, V]`` (``[1, V]`` if ``last_only``).

        The cache grows by ``n``. ``last_only`` lets the engine project only the
        last position through its head (a prefill, or a draft step after
        several uncached tokens).
        """
        ...

    def rollback(self, n_tokens: int) -> None:
        """Keep the first ``n_tokens`` cached positions (no-op if not more are cached)."""
        ...

    # -- fast paths: defaults from forward, overridden where an engine has a faster way -----------------------
    def forward_argmax(self, input_ids: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Like :meth:`forward`, but only the greedy ids ``[n]`` (``[1]`` if ``last_only``), on the device.
        Default: the argmax of :meth:`forward`'s logits."""
        return self.forward(input_ids, last_only).argmax(-1)

    def forward_topk_logprobs(self, input_ids: torch.Tensor, k: int,
                              last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Like :meth:`forward`, but only each row's ``k`` best ids (best first) and their log-probabilities:
        ``[n, k]`` long and float32 (``[1, k]`` if ``last_only``). Default: :func:`topk_logprobs` of
        :meth:`forward`'s logits."""
        return topk_logprobs(self.forward(input_ids, last_only), k)

    def forward_topk(self, input_ids: torch.Tensor,
                     last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Where the model's output head is a :class:`KeptVocabularyHead` (a pruned draft head): feed like
        :meth:`forward` and return the kept ids ``[n, K]`` and their float32 logits ``[n, K]``, no ``-inf``
        scattered over the vocabulary. Default: None, the model has no such head (use :meth:`forward`), and
        nothing is fed."""
        del input_ids, last_only
        return None

    def greedy_generate(self, input_ids: torch.Tensor, max_new_tokens: int,
                        eos_token_ids: Sequence[int] = ()) -> GenerationResult | None:
        """Greedy decoding of ``input_ids`` ``[1, S]`` from an empty cache with the token loop where the model
        computes (the llama.cpp engine's worker: one message per generation, none per token), or None when the
        decoder has no loop of its own: the default, and :func:`measure.decoding.autoregressive_generate` then
        runs the loop itself through :meth:`forward_argmax`."""
        del input_ids, max_new_tokens, eos_token_ids
        return None


@runtime_checkable
class TreeDecoder(Decoder, Protocol):
    """A :class:`Decoder` that verifies a token tree in one forward (:mod:`measure.trees`). A token tree's nodes
    are fed together under a tree attention mask, then only the accepted path is kept in the cache: the
    transformers engine's 4D mask with its keys and values moved into place; llama.cpp's tree tokens carrying
    the sequence ids of the paths through them, then the accepted path's sequence kept
    (:mod:`measure.engines.llamacpp_native.tree`).

    Its fast paths, as :class:`Decoder`'s, have defaults from :meth:`forward_tree` that an engine overrides
    (the llama.cpp one: ids and a few scores come back instead of ``[m, V]`` logits).
    """

    def forward_tree(self, input_ids: torch.Tensor, prefix_tokens: int, slot_positions: torch.Tensor,
                     visible: torch.Tensor) -> torch.Tensor:
        """Float32 logits ``[m, V]`` of ``input_ids`` ``[1, m]`` fed after the cache, each token seeing the first
        ``prefix_tokens`` cached positions and the later slots ``visible`` marks (bool ``[m, n_cached + m −
        prefix_tokens]``) at positions ``slot_positions``. The cache grows by ``m``."""
        ...

    def keep_slots(self, start: int, slots: list[int]) -> None:
        """Move cached positions ``slots`` (ascending, each ≥ ``start``) to ``start``, ``start + 1``, … and keep
        the first ``start + len(slots)``."""
        ...

    def forward_tree_argmax(self, input_ids: torch.Tensor, prefix_tokens: int, slot_positions: torch.Tensor,
                            visible: torch.Tensor) -> torch.Tensor:
        """Each tree row's argmax ``[m]`` long (the target's verification). Default: the argmax of
        :meth:`forward_tree`'s logits."""
        return self.forward_tree(input_ids, prefix_tokens, slot_positions, visible).argmax(-1)

    def forward_tree_topk(self, input_ids: torch.Tensor, prefix_tokens: int, slot_positions: torch.Tensor,
                          visible: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each tree row's ``k`` best ids ``[m, k]`` long, best first, and their log-probabilities ``[m, k]``
        float32 (a draft's candidates). Default: :func:`topk_logprobs` of :meth:`forward_tree`'s logits."""
        return topk_logprobs(self.forward_tree(input_ids, prefix_tokens, slot_positions, visible), k)


@runtime_checkable
class TargetModel(Protocol):
    """A loaded model as the sweep sees it, whatever the engine (an engine's target subclasses it)."""

    name: str
    synthetic: bool
    vocab_size: int
    device: str
    eos_token_ids: tuple[int, ...]
    #: the model's transformers tokenizer, or None where the engine tokenises itself (llama.cpp)
    tokenizer: Any

    def describe(self) -> dict:
        """The ``run.json`` ``models`` entry (name, source, params, dtype, file hash …)."""
        ...

    def new_decoder(self) -> Decoder:
        """A fresh, empty :class:`Decoder` over this model's weights."""
        ...


@dataclass(frozen=True)
class PeerResult:
    """One generation by the engine's own code beside our loop: its speculative decoding (the *peer*) or its
    plain decoding (the *library* baseline our baseline is held against).

    ``drafted``/``accepted`` are the engine's own counts where it reports
    them (None otherwise), so a tokens/s gap between the peer and our loop can
    be explained from the records. ``wall_s`` runs from the call to the last
    token, prefill included (as our loop's); ``ttft_ms`` where it is known.
    """

    tokens: tuple[int, ...]
    wall_s: float
    drafted: int | None = None
    accepted: int | None = None
    rounds: int | None = None
    ttft_ms: float | None = None


@runtime_checkable
class Engine(Protocol):
    """An inference engine behind the seam (see module docstring).

    ``near_tie_tolerance``: the logit margin under which a greedy divergence of
    the speculative output from the baseline is the engine's batch-vs-single
    numerical noise, not a bug (:mod:`measure.engines.lossless`); 0 demands
    identical outputs.
    """

    name: str
    near_tie_tolerance: float

    def load_target(self, spec: str, *, device: str, dtype: str, seed: int) -> TargetModel:
        """Load the target from a model spec (hub id, local path, ``gguf:FILE``, packaged name …)."""
        ...

    def make_draft(self, spec: str, target: TargetModel, *, seed: int) -> Draft:
        """A draft for ``target`` from a draft spec (``ngram:N``, ``model:<spec>``, ``bf16`` …)."""
        ...

    def encode(self, target: TargetModel, text: str, max_prompt_tokens: int) -> torch.Tensor:
        """Token ids ``[1, S]`` of a user message (chat template where the model has one)."""
        ...

    def versions(self) -> Mapping[str, str | None]:
        """Library versions and engine settings (threads …) that change a timing, for ``run.json``."""
        ...

    def has_peer(self, target: TargetModel, draft: Any, gamma: int) -> bool:
        """Whether the engine has its own speculative decoding for this draft and γ (:meth:`peer_generate` runs
        it), decided from the objects alone, without generating: a sweep's visit modes follow from it."""
        ...

    def has_library(self, target: TargetModel) -> bool:
        """Whether the engine has its own plain decoding of ``target`` (:meth:`library_generate` runs it),
        decided without generating."""
        ...

    def peer_generate(self, target: TargetModel, draft: Any, input_ids: torch.Tensor, gamma: int,
                      temperature: float, max_new_tokens: int, seed: int) -> PeerResult | None:
        """The engine's own speculative decoding with the same draft and γ, or None if it has none for it."""
        ...

    def library_generate(self, target: TargetModel, input_ids: torch.Tensor, temperature: float,
                         max_new_tokens: int, seed: int) -> PeerResult | None:
        """The engine's own plain decoding of the prompt (as its users call it), or None where the engine
        offers none to hold our baseline against."""
        ...



@dataclass(frozen=True)
class SparseProbs:
    """Draft probabilities supported on ``K`` tokens per row (a pruned head): ids ``[k, K]``, probs ``[k, K]``."""

    ids: torch.Tensor
    probs: torch.Tensor

    def at(self, tokens: torch.Tensor) -> torch.Tensor:
        """``q_i(tokens[i])`` → ``[k]`` (0 where the token is outside row i's kept set)."""
        return (self.probs * (self.ids == tokens[:, None])).sum(1)

    def dense_row(self, i: int, vocab_size: int) -> torch.Tensor:
        """Row ``i`` as a full-vocabulary distribution ``[V]``."""
        import torch

        return torch.zeros(vocab_size, device=self.probs.device).scatter_(0, self.ids[i], self.probs[i])


class LookupIndex(Protocol):
    """What a lookup draft proposes after a growing sequence, answered incrementally
    (:class:`measure.drafts.NGramIndex`)."""

    def append(self, token: int) -> None:
        """The sequence grew by ``token``."""
        ...

    def propose(self, gamma: int) -> list[int]:
        """The draft's continuation after the sequence: at most ``gamma`` tokens, possibly none."""
        ...


class Draft(Protocol):
    """What the speculative loop needs from a draft (see :mod:`measure.drafts`): every draft subclasses it.

    ``propose`` gets the whole sequence so far ``[1, L]`` (a view of the loop's
    buffer) and returns ``[k]`` tokens on the device (``k <= γ``) and, when
    sampling, their distributions (``[k, V]`` or :class:`SparseProbs`).
    ``position_probs`` gives the teacher-forced distributions of the acceptance
    traces. ``observe`` and ``new_index`` have defaults (nothing to observe, no
    index) that a lookup draft overrides.
    """

    name: str
    kind: str
    synthetic: bool = False

    def describe(self) -> dict:
        """The ``run.json`` ``drafts`` entry (kind, synthetic, params …)."""
        ...

    def start(self, prompt_ids: torch.Tensor) -> None:
        """A new sequence: the prompt ``[1, S]``."""
        ...

    def propose(self, tokens: torch.Tensor, gamma: int, temperature: float,
                generator: torch.Generator | None) -> tuple[torch.Tensor, Any]:
        """Up to ``gamma`` tokens after ``tokens`` ``[1, L]`` and their distributions (None: one-hot, or greedy)."""
        ...

    def rollback(self, n_tokens: int) -> None:
        """Keep the first ``n_tokens`` positions (the accepted ones) of what the draft holds."""
        ...

    def position_probs(self, tokens: torch.Tensor, prompt_tokens: int, temperature: float) -> torch.Tensor:
        """Teacher-forced q at each generated position of ``tokens`` ``[1, L]`` → ``[L − prompt_tokens, V]``."""
        ...

    def observe(self, new_tokens: Sequence[int]) -> None:
        """Each round's emitted tokens (host ints), so a lookup draft keeps its index without a device-to-host
        copy. Default: nothing to keep."""
        del new_tokens

    def new_index(self, seq: Sequence[int]) -> LookupIndex | None:
        """A fresh :class:`LookupIndex` over ``seq`` for a draft that copies its proposals from the sequence;
        default None: a model draft, which proposes what teacher forcing gives (:func:`measure.decoding.proposal_runs`)."""
        del seq
        return None


class KeptLogits(Protocol):
    """Logits of the kept tokens only: ids ``[n, K]`` and their logits ``[n, K]``."""

    ids: torch.Tensor
    logits: torch.Tensor


@runtime_checkable
class KeptVocabularyHead(Protocol):
    """An output head that keeps ``head_k`` of the vocabulary's rows per position (a pruned draft head).

    ``greedy``: hidden states ``[n, H]`` → argmax token ids ``[n]`` over the kept
    rows; ``project``: the kept ids and their logits (:class:`KeptLogits`), no
    ``-inf`` scattered over the full vocabulary. A decoder whose model's output
    head is one takes these paths (:class:`measure.engines.transformers.TransformersDecoder`).
    """

    head_k: int

    def greedy(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def project(self, hidden: torch.Tensor) -> KeptLogits: ...


@dataclass(frozen=True)
class RoundRecord:
    """One speculative round. ``context_tokens``: sequence length before the round."""

    round: int
    gamma: int
    context_tokens: int
    drafted: int
    accepted: int
    draft_ms: float
    verify_ms: float
    overhead_ms: float


@dataclass(frozen=True)
class GenerationResult:
    """Output and timings of one generation (baseline or speculative).

    ``tokens``: the new tokens only. ``wall_s`` runs from the first forward to
    the last emitted token (prefill included). ``token_latency_ms[i]``: time
    since the previous token was emitted (tokens emitted by one round share its
    instant: the first carries the round's time, the rest 0).
    """

    tokens: tuple[int, ...]
    prompt_tokens: int
    wall_s: float
    ttft_ms: float
    token_latency_ms: tuple[float, ...]
    rounds: tuple[RoundRecord, ...] = ()
    peak_mem_bytes: int = 0

    @property
    def new_tokens(self) -> int:
        return len(self.tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def drafted(self) -> int:
        return sum(r.drafted for r in self.rounds)

    @property
    def accepted(self) -> int:
        return sum(r.accepted for r in self.rounds)
