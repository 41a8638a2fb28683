"""Serving simulator: continuous batching across slots with per-slot speculation, as llama-server schedules it.

A plain event loop over server *steps* (no SimPy: one process per request
did not scale to 10^6 requests). What a step is, read off llama.cpp's
``tools/server/server-context.cpp`` (``update_slots``/``pre_decode``/
``post_decode``, the release vendored by llama-cpp-python 0.3.36):

* ``slots`` slots serve requests; a request waits in a FIFO queue until a slot
  is free. New requests are assigned between steps (the server's task queue is
  processed between ``update_slots`` calls), so one that arrives while a step
  runs waits for it to end; an idle server starts at once.
* Every step is **one** ``llama_decode`` of one batch: each generating slot
  adds its last sampled token plus its own draft (``d`` tokens, drafted per
  slot: an n-gram draft may propose nothing; ``d`` is capped at
  ``remaining - 1`` so a request never overshoots its ``max_tokens``), then
  slots that still have a prompt add prompt tokens until the batch holds
  ``n_batch_tokens`` (llama-server ``-b``, default 2048). Slots are *ragged*:
  nothing pads a slot's tokens to the longest draft.
* After the step each generating slot emits ``accepted + 1`` tokens at once (one
  burst: the client sees the first after the step, the others ~0 ms later); a
  slot whose prompt finished emits its first token (its TTFT) and drafts from
  the next step on. A finished slot is free for the queue at that boundary.

The time of a step comes from a :class:`StepCost` of the step's composition
(:class:`StepLoad`: sequences, tokens, contexts, prompt tokens), so a cost
fitted on the real server (``calibrate``) and one built from ``sim``'s
per-forward :class:`~sim.cost.CostModel` (:class:`LockstepCost`) drive the same
loop. :class:`Scheduler` also describes the older lockstep model the project's
``--mode serve`` used (no prompt step, no draft cap, every sequence drafting as
far as the longest: :data:`LOCKSTEP`).

Speed: each request's rounds are drawn when it is admitted (vectorised draws
from the round distribution for a fixed draft length; the policy's own loop
for adaptive ones) and added to per-step totals in a ring buffer, so the loop
does a constant amount of work per step and per request, whatever the batch:
per request a few NumPy additions of contiguous rows, per step a read of one
Python list (the ring is read a window of steps at a time) and, for a
:class:`LinearStepCost`, its formula written out in the loop. Every total is
summed as the first version of this loop summed it, so a seed gives the same
numbers, bit for bit (``tests/support/serve_golden.py``).

Times are in milliseconds; lengths in tokens.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol, Sequence, runtime_checkable

import numpy as np

from sim.acceptance import AcceptanceModel
from sim.cost import CostModel, ForwardCost
from sim.policies import FixedGamma, GammaSpec

if TYPE_CHECKING:
    from sim.stepcost import GpuSetup

#: Draws made at once from the round distribution (refilled when used up).
_POOL_ROUNDS = 1 << 16
#: Steps whose totals the loop reads from the ring at once (a power of two).
_WINDOW = 16
#: Round distributions of at most this many outcomes are drawn by comparisons (faster than a search).
_COMPARE_CDF_MAX = 16
#: Whole-number contexts take the shorter way of adding a request's last rounds (:meth:`_FixedRounds.admit`);
#: False sends every run the general way (the tests hold both to the same numbers).
_WHOLE_CONTEXTS = True


def check_count(name: str, n: float) -> int:
    """``n`` as an int when it is a whole number >= 1; else a ``ValueError`` naming it."""
    if int(n) != n or n < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {n}")
    return int(n)


# -- what a step costs -------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepLoad:
    """The composition of one server step (what its time depends on).

    ``seqs``: generating slots in the batch; ``tokens``: their tokens (1 + draft
    each) plus prompt tokens; ``max_draft``: the longest draft; ``ctx_sum``: the
    generating slots' contexts summed; ``attn``: attention work, Σ over the
    batch's tokens of the positions each attends to; ``prompt_tokens`` /
    ``prompt_seqs``: the prompt part of the batch; ``emitted``: the tokens the
    generating slots emit at the step's end (1 + accepted each: every one is
    sampled, detokenised and streamed).
    """

    seqs: int
    tokens: int
    max_draft: int
    ctx_sum: float
    attn: float
    prompt_tokens: int = 0
    prompt_seqs: int = 0
    emitted: int = 0


@runtime_checkable
class StepCost(Protocol):
    """Milliseconds of one server step of a given composition."""

    def step_ms(self, seqs: int, tokens: int, max_draft: int, ctx_sum: float, attn: float,
                prompt_tokens: int, prompt_seqs: int, emitted: int) -> float:
        """Time of one step (the fields of :class:`StepLoad`, passed flat: this runs once per step)."""
        ...

    def describe(self) -> dict:
        """JSON-able description."""
        ...


@dataclass(frozen=True)
class LockstepCost:
    """A per-forward :class:`~sim.cost.CostModel` priced as the lockstep batch ``sim --mode serve`` modelled.

    A step of ``b`` sequences whose longest draft is ``g`` costs ``g`` batched
    draft steps, one batched ``(g + 1)``-token verify and the round overhead at
    the mean context (speculative side); ``draft=False`` prices a step as one
    batched target forward (the autoregressive baseline). Prompt tokens are
    charged as one more verify of their mean length (the lockstep model had no
    prompt step; the price of prefill is the CostModel's, not the server's).
    Step times are memoised by (sequences, longest draft, mean context to the
    nearest ``context_quantum_tokens``): a roofline forward costs microseconds
    to evaluate and a serving run has millions of steps.
    """

    cost: CostModel
    draft: bool = True
    context_quantum_tokens: float = 1.0
    uses_max_draft = True  # the simulator keeps the per-step longest draft for it
    _memo: dict[tuple[int, int, float], float] = field(default_factory=dict, compare=False, repr=False)

    def _gen_ms(self, seqs: int, max_draft: int, ctx: float) -> float:
        c = self.cost
        if not self.draft:
            return c.target_step_ms(ctx, seqs)
        t = sum(c.draft_step_ms(ctx + i, seqs) for i in range(max_draft))
        return t + c.verify_ms(max_draft + 1, ctx, seqs) + c.round_overhead_ms(max_draft)

    def step_ms(self, seqs: int, tokens: int, max_draft: int, ctx_sum: float, attn: float,
                prompt_tokens: int, prompt_seqs: int, emitted: int = 0) -> float:
        t = 0.0
        if seqs:
            q = self.context_quantum_tokens
            ctx = round(ctx_sum / seqs / q) * q if q > 0 else ctx_sum / seqs
            key = (seqs, max_draft, ctx)
            memo = self._memo.get(key)
            if memo is None:
                memo = self._memo[key] = float(self._gen_ms(seqs, max_draft, ctx))
            t = memo
        if prompt_seqs:
            t += self.cost.verify_ms(max(1, round(prompt_tokens / prompt_seqs)), 0.0, prompt_seqs)
        return float(t)

    def describe(self) -> dict:
        return {"kind": "lockstep", "draft": self.draft, "context_quantum_tokens": self.context_quantum_tokens,
                "cost_model": self.cost.describe()}


@dataclass(frozen=True)
class LinearStepCost:
    """A server step's time, linear in its composition (what ``calibrate`` fits to a real server's steps).

    ``base_ms`` + ``per_seq_ms`` × sequences (generating and prompting) + ``per_token_ms`` × generating tokens
    (1 + draft per slot: each is verified) + ``per_prompt_token_ms`` × prompt tokens + ``per_attn_ms`` ×
    attention work / 1000 (Σ over the batch's tokens of the positions each attends to) + ``per_accepted_ms`` ×
    accepted draft tokens (emitted beyond the slot's one token a step: each is sampled, detokenised and streamed;
    ``calibrate`` fits it to the real units, the synthetic ones emit one token a slot). Coefficients are >= 0;
    ``per_accepted_ms`` defaults to 0 (a cost fitted before it existed).
    """

    base_ms: float
    per_seq_ms: float = 0.0
    per_token_ms: float = 0.0
    per_prompt_token_ms: float = 0.0
    per_attn_ms: float = 0.0
    per_accepted_ms: float = 0.0
    metadata: dict = field(default_factory=dict, compare=False)

    FIELDS = ("base_ms", "per_seq_ms", "per_token_ms", "per_prompt_token_ms", "per_attn_ms", "per_accepted_ms")

    def __post_init__(self) -> None:
        for name in self.FIELDS:
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")

    def step_ms(self, seqs: int, tokens: int, max_draft: int, ctx_sum: float, attn: float,
                prompt_tokens: int, prompt_seqs: int, emitted: int = 0) -> float:
        t = (self.base_ms + self.per_seq_ms * (seqs + prompt_seqs) + self.per_token_ms * (tokens - prompt_tokens)
             + self.per_prompt_token_ms * prompt_tokens + self.per_attn_ms * attn / 1000.0)
        if emitted > seqs:
            t += self.per_accepted_ms * (emitted - seqs)
        return t

    @staticmethod
    def features(load: StepLoad) -> tuple[float, ...]:
        """What multiplies each coefficient (in :attr:`FIELDS` order) in a step of composition ``load``."""
        return (1.0, float(load.seqs + load.prompt_seqs), float(load.tokens - load.prompt_tokens),
                float(load.prompt_tokens), load.attn / 1000.0, float(max(load.emitted - load.seqs, 0)))

    def describe(self) -> dict:
        return {"kind": "linear_step", **{k: getattr(self, k) for k in self.FIELDS}, "metadata": dict(self.metadata)}

    @classmethod
    def from_dict(cls, d: dict) -> "LinearStepCost":
        """The inverse of :meth:`describe`; a one-line ``ValueError`` for anything else."""
        if not isinstance(d, dict) or d.get("kind") != "linear_step":
            raise ValueError(f"not a linear step cost (kind {d.get('kind') if isinstance(d, dict) else d!r})")
        unknown = sorted(set(d) - {"kind", "metadata", *cls.FIELDS})
        if unknown:
            raise ValueError(f"unknown field {unknown[0]!r} in a linear step cost; valid: {', '.join(cls.FIELDS)}")
        if "base_ms" not in d:
            raise ValueError("a linear step cost lacks the field 'base_ms'")
        return cls(**{k: d[k] for k in cls.FIELDS if k in d}, metadata=dict(d.get("metadata") or {}))



#: What a :class:`ForwardStepCost`'s setup records: enough to build its forward again (:meth:`ForwardStepCost.from_dict`).
FORWARD_SETUP_FIELDS = ("target", "hardware", "engine", "tp", "ep", "dtype", "source")


@dataclass(frozen=True)
class ForwardStepCost:
    """A server step priced by a per-forward cost (kernel tables or the roofline): ``efficiency`` × F + ``overhead_ms``.

    F is the step's composition priced with ``forward`` (a :class:`sim.cost.ForwardCost` of the seam,
    :func:`sim.stepcost.target_side`):

    * the generating part, ``b`` slots with ``n`` tokens (1 + draft each) at contexts summing to ``C``: one forward
      of ``b`` sequences × ``n / b`` query tokens at the mean context ``C / b`` (``forward_ms(n / b, C / b, b)``),
      bilinear between the whole numbers of tokens around ``n / b`` (slots are ragged: some draft less) and the
      ``context_quantum_tokens`` grid around ``C / b`` (each corner evaluated once and kept);
    * the prompt part, ``p`` prompt tokens of ``s`` prompts: their prefill, ``prefill_ms(p / s, s)``;
    * a mixed step is **one** forward (the engines batch prompt chunks with the generating tokens): the prompt part
      plus what the generating part adds beyond one token of one sequence at no context, ``forward_ms(1, 0, 1)``
      — the weight read and fixed launch cost a forward pays once, which both parts hold. Summing the two
      forwards would pay it twice on every step a request joins, which at concurrency 8 is most of the prompts'.

    A prompt chunk's attention to the chunks before it is not priced (the prefill has no context): at the default
    2048-token batch prompts rarely split. ``efficiency`` (the measured deployment against the tables: >1 slower)
    and ``overhead_ms`` (per step: the scheduler, sampling, the HTTP stream, drafting the tables do not see) are the
    two numbers ``calibrate serve`` fits; the forward is not. ``setup`` names the model, GPU, engine, TP, dtype and
    the source that priced the forward (with why), so a written calibration builds the same forward again.
    """

    forward: ForwardCost
    efficiency: float = 1.0
    overhead_ms: float = 0.0
    setup: dict = field(default_factory=dict, compare=False)
    context_quantum_tokens: float = 64.0
    metadata: dict = field(default_factory=dict, compare=False)
    uses_max_draft = False
    FIELDS = ("efficiency", "overhead_ms")
    _memo: dict[tuple, float] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in self.FIELDS:
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        if not (math.isfinite(self.context_quantum_tokens) and self.context_quantum_tokens > 0):
            raise ValueError(f"context_quantum_tokens must be a finite number > 0, got {self.context_quantum_tokens!r}")

    def _at(self, seqs: int, n_tokens: int, ctx: float) -> float:
        key = (seqs, n_tokens, ctx)
        v = self._memo.get(key)
        if v is None:
            v = self._memo[key] = float(self.forward.forward_ms(n_tokens, ctx, seqs))
        return v

    def generating_ms(self, seqs: int, tokens_per_seq: float, ctx: float) -> float:
        """One forward of ``seqs`` sequences × ``tokens_per_seq`` tokens at mean context ``ctx`` (bilinear)."""
        g = self.context_quantum_tokens
        q0 = max(int(tokens_per_seq), 1)
        fq = max(tokens_per_seq - q0, 0.0)
        c0 = math.floor(max(ctx, 0.0) / g) * g
        fc = (max(ctx, 0.0) - c0) / g

        def at_q(q: int) -> float:
            v = self._at(seqs, q, c0)
            return v + fc * (self._at(seqs, q, c0 + g) - v) if fc > 0 else v

        v = at_q(q0)
        return v + fq * (at_q(q0 + 1) - v) if fq > 0 else v

    def prompt_ms(self, prompt_tokens: int, prompt_seqs: int) -> float:
        """The prefill of ``prompt_seqs`` prompts of ``prompt_tokens`` tokens in all."""
        p = max(1, round(prompt_tokens / prompt_seqs))
        key = ("prompt", prompt_seqs, p)
        v = self._memo.get(key)
        if v is None:
            prefill = getattr(self.forward, "prefill_ms", None)
            v = float(prefill(p, prompt_seqs) if prefill is not None else self.forward.forward_ms(p, 0.0, prompt_seqs))
            self._memo[key] = v
        return v

    def forward_part_ms(self, seqs: int, tokens: int, ctx_sum: float, prompt_tokens: int, prompt_seqs: int) -> float:
        """F: the step's composition priced by the forward (before the efficiency and the overhead)."""
        gen = self.generating_ms(seqs, (tokens - prompt_tokens) / seqs, ctx_sum / seqs) if seqs else 0.0
        if not prompt_seqs:
            return gen
        prompt = self.prompt_ms(prompt_tokens, prompt_seqs)
        return prompt + max(gen - self._at(1, 1, 0.0), 0.0) if seqs else prompt

    def step_ms(self, seqs: int, tokens: int, max_draft: int, ctx_sum: float, attn: float,
                prompt_tokens: int, prompt_seqs: int, emitted: int = 0) -> float:
        return self.efficiency * self.forward_part_ms(seqs, tokens, ctx_sum, prompt_tokens, prompt_seqs) \
            + self.overhead_ms

    def features(self, load: StepLoad) -> tuple[float, float]:
        """What multiplies each fitted field (:attr:`FIELDS` order) in a step of composition ``load``: (F, 1)."""
        return (self.forward_part_ms(load.seqs, load.tokens, load.ctx_sum, load.prompt_tokens, load.prompt_seqs), 1.0)

    def fitted(self, efficiency: float, overhead_ms: float, metadata: dict | None = None) -> "ForwardStepCost":
        """The same forward with other fitted fields (the priced corners are kept)."""
        return replace(self, efficiency=float(efficiency), overhead_ms=float(overhead_ms),
                       metadata=dict(self.metadata if metadata is None else metadata), _memo=self._memo)

    def source_line(self) -> str:
        """Which source priced the forward, and why."""
        s = self.setup
        return f"{s.get('source', '?')} ({s.get('why', 'no reason recorded')})"

    def line(self) -> str:
        """The fitted cost in one line: the fields and the forward's source."""
        return (f"efficiency {self.efficiency:.4g} x the {self.setup.get('source', '?')} forward of "
                f"{self.setup.get('target')} + overhead {self.overhead_ms:.3f} ms per step")

    def describe(self) -> dict:
        return {"kind": "forward_step", **{k: getattr(self, k) for k in self.FIELDS}, "setup": dict(self.setup),
                "context_quantum_tokens": self.context_quantum_tokens, "forward": self.forward.describe(),
                "metadata": dict(self.metadata)}

    @classmethod
    def from_dict(cls, d: dict) -> "ForwardStepCost":
        """The inverse of :meth:`describe`: the forward built again from its setup on the source that priced it
        (kernels stay kernels: no silent roofline); a one-line ``ValueError`` for anything else."""
        if not isinstance(d, dict) or d.get("kind") != "forward_step":
            raise ValueError(f"not a forward step cost (kind {d.get('kind') if isinstance(d, dict) else d!r})")
        known = {"kind", "metadata", "setup", "forward", "context_quantum_tokens", *cls.FIELDS}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown field {unknown[0]!r} in a forward step cost; valid: {', '.join(sorted(known))}")
        setup = d.get("setup")
        missing = [k for k in (*cls.FIELDS, "setup") if k not in d] or \
            [f"setup.{k}" for k in FORWARD_SETUP_FIELDS if not isinstance(setup, dict) or k not in setup]
        if missing:
            raise ValueError(f"a forward step cost lacks the field {missing[0]!r}")
        assert isinstance(setup, dict)
        from presets.hardware import get_hardware
        from sim.stepcost import GpuSetup

        from sim.kernels import DEFAULT_MOE_ROUTING

        gpus = GpuSetup(get_hardware(str(setup["hardware"])), str(setup["engine"]), int(setup["tp"]), int(setup["ep"]),
                        str(setup["dtype"]), not setup.get("engine_default", False),
                        str(setup.get("moe_routing") or DEFAULT_MOE_ROUTING))
        built = forward_step_cost(str(setup["target"]), gpus, str(setup["source"]))
        return built.fitted(d["efficiency"], d["overhead_ms"], d.get("metadata") or {})


def forward_step_cost(target: str, setup: "GpuSetup", asked: str = "auto", batch: int = 1,
                      context_tokens: float = 0.0) -> ForwardStepCost:
    """A :class:`ForwardStepCost` (efficiency 1, no overhead) of ``target`` on ``setup``, priced by the seam
    (:func:`sim.stepcost.target_side`: ``asked`` auto, kernels or roofline). Before any pricing, one ``ValueError``
    line for an unknown model, an impossible dtype or TP, or weights and the KV cache of ``batch`` sequences at
    ``context_tokens`` that do not fit the GPUs."""
    from sim.stepcost import COST_SOURCES, check_fits, check_gpu_setup, target_side
    from sim.modelref import resolve_model

    if asked not in COST_SOURCES:
        raise ValueError(f"unknown cost source {asked!r}; valid: {', '.join(COST_SOURCES)}")
    ref = resolve_model(target, "--target")
    check_gpu_setup(setup, ref.arch)
    check_fits(ref.arch, 0.0, setup, batch, context_tokens)
    fwd, side = target_side(ref, setup, asked)
    info = {"target": target, "model": ref.name, "model_origin": ref.origin, "hardware": setup.hardware.name,
            "engine": setup.engine, "engine_default": not setup.engine_given, "tp": setup.tp, "ep": setup.ep,
            "dtype": setup.dtype, "cost_source_asked": asked, "source": side.source, "why": side.why,
            "moe_routing": setup.moe_routing}
    return ForwardStepCost(fwd, setup=info)


def step_cost_from_dict(d: dict) -> LinearStepCost | ForwardStepCost:
    """A written server step cost (``serve_calibration.json``'s ``step_cost``) read back, whichever its kind."""
    kind = d.get("kind") if isinstance(d, dict) else None
    if kind == "linear_step":
        return LinearStepCost.from_dict(d)
    if kind == "forward_step":
        return ForwardStepCost.from_dict(d)
    raise ValueError(f"unknown step cost kind {kind!r}; valid: linear_step, forward_step")

# -- how the server schedules --------------------------------------------------------------------------
@dataclass(frozen=True)
class Scheduler:
    """How steps are built: slots, whether a prompt is a step's work, whether drafts stop at the budget."""

    slots: int
    prefill: bool = True
    cap_drafts: bool = True
    n_batch_tokens: int = 2048

    def __post_init__(self) -> None:
        check_count("slots", self.slots)
        check_count("n_batch_tokens", self.n_batch_tokens)


def llama_server(slots: int, n_batch_tokens: int = 2048) -> Scheduler:
    """llama-server's scheduler with ``-np slots -b n_batch_tokens``."""
    return Scheduler(slots, prefill=True, cap_drafts=True, n_batch_tokens=n_batch_tokens)


def lockstep(max_batch: int) -> Scheduler:
    """The lockstep model of the earlier ``sim --mode serve``: no prompt step, rounds may overshoot."""
    return Scheduler(max_batch, prefill=False, cap_drafts=False, n_batch_tokens=1 << 30)


@dataclass(frozen=True)
class OpenLoop:
    """Poisson arrivals at ``rate_per_s`` requests/s (seeded)."""

    rate_per_s: float

    def __post_init__(self) -> None:
        if not 0 < self.rate_per_s < math.inf:
            raise ValueError(f"arrival rate must be a finite number > 0 requests/s, got {self.rate_per_s}")


@dataclass(frozen=True)
class ClosedLoop:
    """``concurrency`` clients, each sending its next request ``think_ms`` after its previous one finished."""

    concurrency: int
    think_ms: float = 0.0

    def __post_init__(self) -> None:
        check_count("concurrency", self.concurrency)
        if not 0 <= self.think_ms < math.inf:
            raise ValueError(f"think time must be a finite number >= 0 ms, got {self.think_ms}")


@dataclass(frozen=True)
class Workload:
    """What the clients send: ``n_requests`` requests of ``new_tokens`` each, prompts of ``prompt_tokens``
    (one length for all, or a sequence used in turn), under an :class:`OpenLoop` or :class:`ClosedLoop` load.

    ``request_overhead_ms``: from a client sending a request to the server's queue holding it (HTTP,
    tokenisation), added to every latency and to a closed-loop client's turnaround.
    ``arrivals_ms`` (open loop only, optional): the send times themselves, instead of drawing them.
    """

    n_requests: int
    new_tokens: int
    load: OpenLoop | ClosedLoop
    prompt_tokens: int | Sequence[int] = 0
    request_overhead_ms: float = 0.0
    arrivals_ms: Sequence[float] | np.ndarray | None = None

    def __post_init__(self) -> None:
        check_count("n_requests", self.n_requests)
        check_count("new_tokens", self.new_tokens)
        p = np.atleast_1d(np.asarray(self.prompt_tokens, dtype=float))
        if p.size == 0 or np.any(~np.isfinite(p)) or np.any(p < 0) or np.any(p != np.round(p)):
            raise ValueError(f"prompt tokens must be whole numbers >= 0, got {self.prompt_tokens!r}")
        if not 0 <= self.request_overhead_ms < math.inf:
            raise ValueError(f"request overhead must be a finite number >= 0 ms, got {self.request_overhead_ms}")
        if self.arrivals_ms is not None:
            a = np.asarray(self.arrivals_ms, dtype=float)
            if not isinstance(self.load, OpenLoop):
                raise ValueError("explicit arrival times apply to an open-loop load only")
            if a.shape != (self.n_requests,) or np.any(~np.isfinite(a)) or np.any(np.diff(a) < 0):
                raise ValueError(f"arrival times must be {self.n_requests} finite, non-decreasing ms values")


# -- results -----------------------------------------------------------------------------------------
def _pcts(x: np.ndarray, w: np.ndarray | None = None) -> tuple[float, float, float]:
    """p50, p95, p99 (weighted: the lower weighted percentile) of ``x``."""
    if x.size == 0:
        return (math.nan,) * 3
    if w is None:
        p50, p95, p99 = (float(v) for v in np.percentile(x, (50, 95, 99)))
        return p50, p95, p99
    order = np.argsort(x, kind="stable")
    cw = np.cumsum(w[order])

    def at(q: float) -> float:
        i = int(np.searchsorted(cw, q * cw[-1], side="left"))
        return float(x[order][min(i, x.size - 1)])

    return at(0.50), at(0.95), at(0.99)


@dataclass(frozen=True)
class LatencyStats:
    """p50/p95/p99 of one latency, in ms."""

    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float


def latency_stats(x: np.ndarray, w: np.ndarray | None = None) -> LatencyStats:
    """Percentiles and mean of ``x`` (optionally weighted by counts ``w``)."""
    p50, p95, p99 = _pcts(np.asarray(x, dtype=float), None if w is None else np.asarray(w, dtype=float))
    if x.size == 0:
        return LatencyStats(p50, p95, p99, math.nan)
    mean = float(np.average(x, weights=w)) if w is not None else float(np.mean(x))
    return LatencyStats(p50, p95, p99, mean)


@dataclass(frozen=True)
class ServeRun:
    """One simulated run: per request its send time, TTFT, finish and tokens; per step its time and batch.

    Inter-token times follow from the steps: a slot generating in a step emits
    its first token of the step ``step_ms`` after its previous one (every
    generating slot emitted at the previous step's end) and the rest of its
    burst at once, so the inter-token samples are ``step_ms`` with weight
    ``step_seqs`` plus ``zero_gap_tokens`` zeros.
    """

    send_ms: np.ndarray
    first_token_ms: np.ndarray
    finish_ms: np.ndarray
    tokens: np.ndarray
    step_ms: np.ndarray
    step_seqs: np.ndarray
    step_emitted: np.ndarray
    request_rounds: np.ndarray  # per request: its rounds after the prompt step (verify steps it took part in)
    request_drafted: np.ndarray  # per request: the draft tokens it verified
    zero_gap_tokens: int
    drafted: int
    accepted: int
    rounds: int

    @property
    def ttft_ms(self) -> np.ndarray:
        return self.first_token_ms - self.send_ms

    @property
    def e2e_ms(self) -> np.ndarray:
        return self.finish_ms - self.send_ms

    @property
    def tpot_ms(self) -> np.ndarray:
        """(last token − first token) / (tokens − 1) per request (requests of one token excluded)."""
        ok = self.tokens > 1
        return (self.finish_ms[ok] - self.first_token_ms[ok]) / (self.tokens[ok] - 1)

    def stats(self) -> "ServeStats":
        return ServeStats.of(self)


@dataclass(frozen=True)
class ServeStats:
    """Throughput and latency distributions of one simulated run."""

    requests: int
    tokens: int
    makespan_ms: float
    throughput_tokens_per_s: float
    ttft: LatencyStats
    tpot: LatencyStats
    itl: LatencyStats
    e2e: LatencyStats
    mean_batch: float
    steps: int

    @classmethod
    def of(cls, run: ServeRun) -> "ServeStats":
        tokens = int(run.tokens.sum())
        makespan = float(run.finish_ms.max() - run.send_ms.min())
        gaps = np.concatenate([run.step_ms[run.step_seqs > 0], [0.0]])
        weights = np.concatenate([run.step_seqs[run.step_seqs > 0], [run.zero_gap_tokens]]).astype(float)
        busy = run.step_seqs > 0
        return cls(
            requests=int(run.tokens.size), tokens=tokens, makespan_ms=makespan,
            throughput_tokens_per_s=tokens / makespan * 1000.0 if makespan > 0 else math.inf,
            ttft=latency_stats(run.ttft_ms), tpot=latency_stats(run.tpot_ms),
            itl=latency_stats(gaps, weights), e2e=latency_stats(run.e2e_ms),
            mean_batch=float(run.step_seqs[busy].mean()) if busy.any() else 0.0,
            steps=int(run.step_ms.size))


# -- rounds of one request -------------------------------------------------------------------------------
def round_pmf(acceptance: AcceptanceModel, gamma: int) -> np.ndarray:
    """P(drafted = d, accepted = a) of one round at draft length γ, shape ``[γ + 1, γ + 1]``.

    A recorded run trace gives its replayed rounds' joint frequencies; any other
    model drafts either γ tokens or none (``drafted_probs``), and given that it
    drafted, P(accepted ≥ j) = prefix_accept_probs[j − 1] / P(drafted = γ).
    """
    g = check_count("gamma", gamma)
    out = np.zeros((g + 1, g + 1))
    replay = getattr(acceptance, "replay", None)
    if callable(replay):
        _, d, a = replay(g)
        np.add.at(out, (np.asarray(d), np.asarray(a)), 1.0)
        return out / out.sum()
    drafted = np.asarray(acceptance.drafted_probs(g), dtype=float)
    if np.any(drafted[1:g] > 1e-12):
        raise ValueError(f"{type(acceptance).__name__} drafts lengths between 1 and {g - 1}: no joint round "
                         "distribution is known for it")
    out[0, 0] = drafted[0]
    if drafted[g] > 0:
        ge = np.concatenate([[1.0], np.asarray(acceptance.prefix_accept_probs(g), dtype=float) / drafted[g], [0.0]])
        out[g, :] = drafted[g] * np.clip(ge[:-1] - ge[1:], 0.0, None)
    return out / out.sum()


class _FixedRounds:
    """Rounds of fixed draft length γ, drawn in pools of :data:`_POOL_ROUNDS` from :func:`round_pmf`.

    Per pool it keeps, one row per round, what the ring adds for it apart from the request's own context
    (:attr:`block`: 1, tokens, tokens produced since the pool started, attention work at context 0, tokens
    emitted; :attr:`shift_rows`: what a context shift multiplies, 0, 0, 1, tokens, 0; :attr:`drafts`), so
    admitting a request is a few additions of contiguous rows, whatever its length; and the draft, accepted
    and running totals as integer arrays, so that finding where a request's rounds end is a bisection.

    A request's last rounds (drafts capped at its budget) are written over the pool's rows they use (each
    pool round serves one request once) and added with the rest. With whole-number contexts
    (:attr:`whole_contexts`) every total is a whole number, summed exactly in any order, and only the rows
    whose draft the cap shortened are rewritten; otherwise the last rounds are added at their own contexts
    (one addition each) and the others as pool row + shift (two), as the loop always added them, so that
    each total is rounded as it was.
    """

    def __init__(self, acceptance: AcceptanceModel | None, gamma: int, rng: np.random.Generator) -> None:
        self.rng, self.gamma = rng, (gamma if acceptance is not None else 0)
        self.whole_contexts = False  # True: every context is a whole number (see admit)
        if acceptance is None:  # no speculation: every round drafts nothing
            self.cdf, self.d_of, self.a_of = np.array([1.0]), np.array([0]), np.array([0])
        else:
            pmf = round_pmf(acceptance, gamma)
            d, a = np.nonzero(pmf > 0)
            self.cdf = np.cumsum(pmf[d, a])
            self.cdf[-1] = 1.0
            self.d_of, self.a_of = d.astype(np.int64), a.astype(np.int64)
        self._refill()

    def _refill(self) -> None:
        if self.cdf.size == 1:
            k = np.zeros(_POOL_ROUNDS, dtype=np.int64)
        elif self.cdf.size <= _COMPARE_CDF_MAX:  # searchsorted(cdf, u, "right") = how many cdf entries are <= u
            u = self.rng.random(_POOL_ROUNDS)
            k = np.zeros(_POOL_ROUNDS, dtype=np.int64)
            for c in self.cdf[:-1]:  # the last is 1.0 > u
                k += u >= c
        else:
            k = np.searchsorted(self.cdf, self.rng.random(_POOL_ROUNDS), side="right")
        d, a = self.d_of[k], self.a_of[k]
        cum = np.cumsum(a + 1)  # tokens produced by pool rounds 0..i
        before = (cum - a - 1).astype(float)
        t = (d + 1).astype(float)
        self.block = np.empty((_POOL_ROUNDS, 5))
        self.block[:, 0] = 1.0
        self.block[:, 1] = t
        self.block[:, 2] = before
        self.block[:, 3] = t * (before + 0.5 * (t + 1))
        self.block[:, 4] = a + 1
        self.shift_rows = np.zeros((_POOL_ROUNDS, 5))
        self.shift_rows[:, 2] = 1.0
        self.shift_rows[:, 3] = t
        self.drafts = t - 1.0
        self.cum, self.cum_d, self.dl, self.al = _int_array(cum), _int_array(np.cumsum(d)), _int_array(d), _int_array(a)
        self.p = 0

    # long: the pool's slices, then the capped last rounds, written over the pool rows they use
    def admit(self, ring: _Ring, start: int, remaining: int, ctx0: float, cap: bool) -> tuple[int, int, int]:
        """Put the rounds that produce ``remaining`` tokens into ``ring`` from step ``start`` on (contexts from
        ``ctx0``); returns (rounds, drafted, accepted).

        ``cap``: a draft never runs past the budget (d <= remaining - 1, as llama-server caps it), so the last
        round ends exactly on it; otherwise the last round may overshoot.
        """
        if self.gamma == 0:  # no speculation: one token a round
            ring.add_plain(start, remaining, ctx0)
            return remaining, 0, 0
        rounds = drafted = acc = done = 0
        margin = self.gamma if cap else 0
        span = None  # pool rows [q0, self.p) not added yet: (q0, ring step of q0, context shift, rows shifted)
        while remaining - done > margin:  # rounds whose draft cannot reach the budget: slices of the pool
            if self.p >= _POOL_ROUNDS:
                self._refill()
            p, cum = self.p, self.cum
            base = cum[p - 1] if p else 0
            # first round that starts with at most `margin` tokens left (cap) / that reaches the budget; the
            # rounds before p produced less (base), so the search starts at p
            stop = bisect_left(cum, base + remaining - done - margin, p) + (0 if cap else 1)
            stop = max(min(stop, _POOL_ROUNDS), p + (0 if cap else 1))
            if stop > p:
                span = (p, start + rounds, ctx0 + done - base, stop - p)
                made = cum[stop - 1] - base
                acc += made - (stop - p)
                drafted += self.cum_d[stop - 1] - (self.cum_d[p - 1] if p else 0)
                rounds += stop - p
                done += made
                self.p = stop
                if stop == _POOL_ROUNDS:  # the pool is used up: add its rows now
                    self._add(ring, span)
                    span = None
            if cap and stop < _POOL_ROUNDS:
                break
        if cap and remaining > done:  # the last rounds one by one, drafts capped at the budget
            if self.p >= _POOL_ROUNDS:
                self._refill()
            p, dl, al, cum, blk = self.p, self.dl, self.al, self.cum, self.block
            whole = self.whole_contexts
            if span is None:
                span = (p, start + rounds, ctx0 + done - (self.cum[p - 1] if p else 0), 0)
            capped: list[list[float]] = []
            while remaining > done:
                if p >= _POOL_ROUNDS:
                    self.p = p
                    self._add(ring, span, capped, whole)
                    self._refill()
                    p, dl, al, cum, blk = 0, self.dl, self.al, self.cum, self.block
                    span, capped = (0, start + rounds, ctx0 + done, 0), []
                di, ai, left = dl[p], al[p], remaining - done - 1
                if di > left:
                    di = left
                    if ai > di:
                        ai = di
                    if whole:  # only this row differs from the pool's (its draft and what that changes)
                        before = float(cum[p - 1] if p else 0)
                        blk[p] = (1.0, di + 1, before, (di + 1) * (before + 0.5 * (di + 2)), ai + 1)
                        self.shift_rows[p, 3] = di + 1
                        if ring.track:
                            self.drafts[p] = di
                if not whole:
                    ctx = ctx0 + done
                    capped.append([1.0, di + 1, ctx, (di + 1) * (ctx + 0.5 * (di + 2)), ai + 1])
                p += 1
                rounds += 1
                drafted += di
                acc += ai
                done += ai + 1
            self.p = p
            self._add(ring, span, capped, whole)
        elif span is not None:
            self._add(ring, span)
        return rounds, drafted, acc

    def _add(self, ring: _Ring, span: tuple[int, int, float, int], capped: Sequence[list[float]] = (),
             whole: bool = False) -> None:
        """Add pool rows ``span`` to ``ring``: rows ``q0 ..`` at steps ``step ..``, the first ``n_shifted`` of them
        (all with ``whole``) shifted, and the ``capped`` rounds, in the last rows, at their own contexts."""
        q0, step, shift, n_shifted = span
        q1 = self.p
        if capped:  # over the pool rows they use: their own values
            k = q1 - len(capped)
            self.block[k:q1] = capped
            if ring.track:
                self.drafts[k:q1] = [row[1] - 1.0 for row in capped]
        if q1 > q0:
            n = q1 - q0 if whole else n_shifted
            ring.add_block(step, self.block[q0:q1], self.drafts[q0:q1], shift, self.shift_rows[q0:q0 + n])


def _int_array(x: np.ndarray) -> array:
    """``x`` as an ``array('q')``: Python ints on indexing, and a bisection on it runs in C."""
    out = array("q")
    out.frombytes(np.ascontiguousarray(x, dtype=np.int64).tobytes())
    return out


class _PolicyRounds:
    """Rounds of an adaptive γ policy: each request runs its own policy, round by round."""

    def __init__(self, acceptance: AcceptanceModel, spec: GammaSpec, rng: np.random.Generator) -> None:
        self.acceptance, self.spec, self.rng = acceptance, spec, rng

    def admit(self, ring: "_Ring", start: int, remaining: int, ctx0: float, cap: bool) -> tuple[int, int, int]:
        """As :meth:`_FixedRounds.admit`, the request's policy choosing each round's draft length."""
        pol = self.spec.policy()
        ts, ctxs, es = [], [], []
        done = acc = 0
        while remaining > done:
            d, a = self.acceptance.sample_round(pol.gamma, self.rng)
            d, a = int(d), int(a)
            if d:
                pol.update(d, a)
            if cap and d > remaining - done - 1:
                d = remaining - done - 1
                a = min(a, d)
            ts.append(d + 1)
            ctxs.append(ctx0 + done)
            es.append(a + 1)
            acc += a
            done += a + 1
        t = np.asarray(ts, dtype=float)
        ring.add(start, t, np.asarray(ctxs, dtype=float), np.asarray(es, dtype=float))
        return t.size, int(t.sum()) - t.size, acc


# -- the loop -----------------------------------------------------------------------------------------
class _Ring:
    """Per-step totals for the steps ahead, in a ring buffer (constant memory over any number of steps).

    :attr:`sums`: one row per step (generating sequences, their tokens, Σ context, attention work, tokens
    emitted); :attr:`drafts`: the longest draft of each step (kept only with ``track_max_draft``). Requests
    that draft nothing (no speculation) are kept apart as running sums (:meth:`add_plain`): their totals at a
    step follow from how many run and their contexts' sum, so they cost nothing per round.

    The loop reads the totals of the next :data:`_WINDOW` steps at once, as Python lists (:attr:`win`, one
    ``[seqs, tokens, Σ context, attention, emitted]`` per step from step :attr:`w0` on; :attr:`win_drafts`):
    one NumPy call per window instead of one per step. Rounds added to steps inside the window are re-read
    (:meth:`refresh`); :meth:`advance` clears the window's steps and reads the next. Every total is the sum
    of the same terms added in the same order as when each step's totals were a column added to one by one.
    """

    def __init__(self, horizon: int, track_max_draft: bool, window: int = 0) -> None:
        window = window or _WINDOW
        size = 1 << max(10, int(horizon + 64 + window).bit_length())
        assert window & (window - 1) == 0 and window <= size, "the window is a power of two within the ring"
        self.mask = size - 1
        self.sums = np.zeros((size, 5))
        self.track = track_max_draft
        self.drafts = np.zeros(size if track_max_draft else 0)
        self.window = window
        self.w0 = 0
        self.win: list[list[float]] = self.sums[:window].tolist()
        self.win_drafts: list[float] = self.drafts[:window].tolist() if track_max_draft else [0.0] * window
        self.plain_n = 0  # requests generating one token a step
        self.plain_c = 0.0  # Σ (context at its first step − that step) over them
        self.plain_events: dict[int, list[float]] = {}  # step -> [Δ count, Δ context sum] applied at that step

    def advance(self) -> int:
        """Clear the window's steps, read the next window's; returns its first step."""
        w = self.window
        i = self.w0 & self.mask
        self.sums[i:i + w] = 0.0
        if self.track:
            self.drafts[i:i + w] = 0.0
        self.w0 += w
        i = self.w0 & self.mask
        self.win[:] = self.sums[i:i + w].tolist()
        if self.track:
            self.win_drafts[:] = self.drafts[i:i + w].tolist()
        return self.w0

    def refresh(self, step: int) -> None:
        """Re-read the window from ``step`` on (after rounds were added there)."""
        j = step - self.w0
        if j < self.window:
            i = (self.w0 & self.mask) + j
            k = self.window - j
            self.win[j:] = self.sums[i:i + k].tolist()
            if self.track:
                self.win_drafts[j:] = self.drafts[i:i + k].tolist()

    def add_plain(self, step: int, n: int, ctx: float) -> None:
        """A request that generates one token a step at steps ``step .. step + n − 1``, context ``ctx`` at the
        first (growing by one a step)."""
        for at, sign in ((step, 1.0), (step + n, -1.0)):
            ev = self.plain_events.setdefault(at, [0.0, 0.0])
            ev[0] += sign
            ev[1] += sign * (ctx - step)

    def plain(self, step: int, seqs: float, tokens: float, ctx_sum: float, attn: float,
              emitted: float) -> tuple[float, float, float, float, float]:
        """The step's totals with the one-token-a-step requests added."""
        ev = self.plain_events.pop(step, None)
        if ev is not None:
            self.plain_n += int(ev[0])
            self.plain_c += ev[1]
        n = self.plain_n
        if n:
            ctx = self.plain_c + n * step
            return seqs + n, tokens + n, ctx_sum + ctx, attn + (ctx + n), emitted + n
        return seqs, tokens, ctx_sum, attn, emitted

    def _parts(self, step: int, n: int) -> tuple[tuple[slice, slice], ...]:
        i = step & self.mask
        if i + n <= self.mask + 1:
            return ((slice(i, i + n), slice(0, n)),)
        k = self.mask + 1 - i
        return (slice(i, None), slice(0, k)), (slice(0, n - k), slice(k, n))

    def add_block(self, step: int, block: np.ndarray, drafts: np.ndarray, shift: float = 0.0,
                  shift_rows: np.ndarray | None = None) -> None:
        """Add rounds at steps ``step, step + 1, ...``: ``block`` rows are 1, tokens, context, attention work at
        that context, tokens emitted; then ``shift`` × ``shift_rows`` to the first ``len(shift_rows)`` of them (a
        context shift: ``shift_rows`` are 0, 0, 1, tokens, 0); the longest draft from ``drafts``."""
        sums = self.sums
        n_shifted = 0 if shift_rows is None or not shift else shift_rows.shape[0]
        i, k = step & self.mask, block.shape[0]
        if i + k <= self.mask + 1:  # no wrap (nearly always)
            sums[i:i + k] += block
            if self.track:
                np.maximum(self.drafts[i:i + k], drafts, out=self.drafts[i:i + k])
            if n_shifted and shift_rows is not None:
                sums[i:i + n_shifted] += shift * shift_rows
            return
        for dst, src in self._parts(step, k):
            sums[dst] += block[src]
            if self.track:
                np.maximum(self.drafts[dst], drafts[src], out=self.drafts[dst])
        if n_shifted and shift_rows is not None:
            for dst, src in self._parts(step, n_shifted):
                sums[dst] += shift * shift_rows[src]

    def add(self, step: int, t: np.ndarray, ctx: np.ndarray, emitted: np.ndarray) -> None:
        """Add a request's rounds (tokens ``t`` at contexts ``ctx``, ``emitted`` tokens) at steps ``step, ...``."""
        block = np.stack([np.ones_like(t), t, ctx, t * (ctx + 0.5 * (t + 1)), emitted], axis=1)
        self.add_block(step, block, t - 1.0)


def simulate_server(  # long: one event loop (arrivals, admission, prompt chunks, steps, finishes) kept together
    workload: Workload,
    scheduler: Scheduler,
    cost: StepCost,
    acceptance: AcceptanceModel | Sequence[AcceptanceModel] | None = None,
    policy: str | int | GammaSpec | None = None,
    context_tokens: float = 0.0,
    seed: int = 0,
) -> ServeRun:
    """Simulate ``workload`` on a server scheduled by ``scheduler`` with step times from ``cost``.

    ``policy=None`` (or ``acceptance=None``): no speculation, one token per slot
    per step. Otherwise every slot drafts by ``policy`` (``fixed:4``, an adaptive
    spec) with rounds from ``acceptance``: one model for every request, or one
    per prompt (a sequence used in turn, as ``workload.prompt_tokens`` is: request
    ``r`` drafts with ``acceptance[r % len]``). ``context_tokens`` is added to
    every request's prompt (context already in its slot). Same seed, same run.
    """
    if (policy is None) != (acceptance is None):
        raise ValueError("speculation needs both an acceptance model and a gamma policy (or neither)")
    arrivals_rng, rounds_rng = np.random.default_rng(seed).spawn(2)
    if policy is None or acceptance is None:  # both None (checked above)
        rounds_by: list[_FixedRounds | _PolicyRounds] = [_FixedRounds(None, 1, rounds_rng)]
    else:
        spec = GammaSpec.parse(policy)
        pol = spec.policy()
        models = list(acceptance) if isinstance(acceptance, Sequence) else [acceptance]
        if not models:
            raise ValueError("acceptance: an empty list of models")
        rngs = [rounds_rng] if len(models) == 1 else rounds_rng.spawn(len(models))
        rounds_by = [(_FixedRounds(m, pol.gamma, g) if isinstance(pol, FixedGamma) else _PolicyRounds(m, spec, g))
                     for m, g in zip(models, rngs)]
    n_models = len(rounds_by)
    ctx_base = float(context_tokens)
    for rb in rounds_by:  # whole-number contexts: every total is a whole number, summed exactly in any order
        if isinstance(rb, _FixedRounds):
            rb.whole_contexts = _WHOLE_CONTEXTS and ctx_base.is_integer()
    n, n_new = workload.n_requests, workload.new_tokens
    prompts = np.atleast_1d(np.asarray(workload.prompt_tokens, dtype=np.int64))
    prompt_of = prompts.tolist()
    n_prompts = prompts.size
    overhead = float(workload.request_overhead_ms)
    slots, prefill, cap, n_batch = scheduler.slots, scheduler.prefill, scheduler.cap_drafts, scheduler.n_batch_tokens
    load = workload.load
    closed = isinstance(load, ClosedLoop)
    think = float(load.think_ms) if isinstance(load, ClosedLoop) else 0.0

    # Requests reach the server's queue in the order they are numbered, at `arrive[r]` (send + overhead): open
    # loop, sends are drawn in order; closed loop, a client sends when its request finished, and finishes (so
    # sends) come in time order. The queue is the requests nxt_q..nxt - 1; those from `nxt` on have not arrived.
    if isinstance(load, OpenLoop):
        send = (np.asarray(workload.arrivals_ms, dtype=float) if workload.arrivals_ms is not None
                else np.cumsum(arrivals_rng.exponential(1000.0 / load.rate_per_s, size=n)))
        send_of: list[float] = send.tolist()
        arrive = (send + overhead).tolist()
    else:
        send_of = [0.0] * min(load.concurrency, n)
        arrive = [overhead] * len(send_of)
    nxt = nxt_q = 0
    next_arrival = arrive[0]

    ring = _Ring((n_new + int(prompts.max()) // n_batch + 4) * 2, bool(getattr(cost, "uses_max_draft", False)))
    win, win_drafts, window = ring.win, ring.win_drafts, ring.window
    plain = policy is None
    first = [math.nan] * n
    finish = [math.nan] * n
    produced = [0] * n
    rounds_of = [0] * n
    drafted_of = [0] * n
    finishes: dict[int, list[int]] = {}  # step -> requests whose last token ends that step
    firsts: list[int] = []  # requests whose first token ends this step
    free = slots
    step_ms = array("d")
    step_seqs = array("d")
    step_emitted = array("d")
    ms_append, seqs_append, emitted_append = step_ms.append, step_seqs.append, step_emitted.append
    totals = [0, 0, 0]  # drafted, accepted, rounds
    done = 0
    t = 0.0
    s = 0
    prompting: deque[list] = deque()  # [request, prompt tokens left, context after the prompt], FIFO
    linear = type(cost) is LinearStepCost
    if linear:  # its step_ms written out below for steps without a prompt
        c_base, c_seq, c_tok, _, c_attn, c_acc = (getattr(cost, k) for k in LinearStepCost.FIELDS)
    step_fn = cost.step_ms

    def start_rounds(r: int, start: int, have: int, ctx0: float) -> None:
        """Draw request ``r``'s rounds (it has ``have`` tokens) and put them into the steps from ``start``."""
        nr, dr, acc = rounds_by[r % n_models].admit(ring, start, n_new - have, ctx0 + have, cap)
        totals[0] += dr
        totals[1] += acc
        totals[2] += nr
        rounds_of[r] = nr
        drafted_of[r] = dr
        produced[r] = have + acc + nr
        if not plain:
            ring.refresh(start)
        if not have:
            firsts.append(r)
        end = start + nr - 1 if nr else start - 1
        at = finishes.get(end)
        if at is None:
            finishes[end] = [r]
        else:
            at.append(r)

    j = 0  # s - w0: the step's place in the ring's window
    while done < n:
        # the boundary before step s: arrivals join the queue, free slots take queued requests (first come first
        # served), an idle server waits for the next arrival. (While no slot is free an arrival waits for the
        # next boundary with one: the queue's order is the same.)
        if free:
            while next_arrival <= t:
                nxt += 1
                next_arrival = arrive[nxt] if nxt < len(arrive) else math.inf
            if nxt_q < nxt:
                while free and nxt_q < nxt:
                    r = nxt_q
                    nxt_q += 1
                    free -= 1
                    p_len = prompt_of[r % n_prompts]
                    if prefill:  # its prompt goes into the batches from this step on
                        prompting.append([r, max(p_len, 1), ctx_base + p_len])
                    else:  # the first round is the first step; its first token is the first token
                        start_rounds(r, s, 0, ctx_base + p_len)
            elif free == slots:
                assert next_arrival < math.inf, "requests left but none pending, queued or running"
                t = max(t, next_arrival)
                continue
        # step s: one batch of every generating slot's tokens (the ring's totals), then prompt tokens up to n_batch
        seqs, tokens, ctx_sum, attn, emitted = win[j]
        if prompting or plain:
            if plain:
                seqs, tokens, ctx_sum, attn, emitted = ring.plain(s, seqs, tokens, ctx_sum, attn, emitted)
            p_tok = p_seqs = p_done = 0
            while prompting and tokens + p_tok < n_batch:
                job = prompting[0]
                r, left, ctx0 = job
                take = min(left, n_batch - tokens - p_tok)
                attn += take * (ctx0 - left) + 0.5 * take * (take + 1)
                p_tok += take
                p_seqs += 1
                if take < left:
                    job[1] = left - take
                    break
                prompting.popleft()
                p_done += 1
                start_rounds(r, s + 1, 1, ctx0)  # the prompt step yields the first token
                firsts.append(r)
            if seqs or p_seqs:
                dt = step_fn(int(seqs), int(tokens) + p_tok, int(win_drafts[j]), ctx_sum, attn, p_tok, p_seqs,
                             int(emitted))
                t += dt
                ms_append(dt)
                seqs_append(seqs)
                emitted_append(emitted + p_done)
        elif seqs:
            if linear:  # LinearStepCost.step_ms of a step without a prompt (its zero terms dropped: same numbers)
                dt = c_base + c_seq * seqs + c_tok * tokens + c_attn * attn / 1000.0
                if emitted > seqs:
                    dt += c_acc * (emitted - seqs)
            else:
                dt = step_fn(int(seqs), int(tokens), int(win_drafts[j]), ctx_sum, attn, 0, 0, int(emitted))
            t += dt
            ms_append(dt)
            seqs_append(seqs)
            emitted_append(emitted)
        if firsts:
            for r in firsts:
                first[r] = t
            firsts.clear()
        if s in finishes:
            for r in finishes.pop(s):
                finish[r] = t
                done += 1
                free += 1
                if closed and len(arrive) < n:  # its client sends the next request
                    send_of.append(t + think)
                    arrive.append(t + think + overhead)
                    if next_arrival == math.inf:
                        next_arrival = arrive[nxt]
        s += 1
        j += 1
        if j == window:
            ring.advance()
            j = 0
    return ServeRun(send_ms=np.asarray(send_of, dtype=float), first_token_ms=np.asarray(first, dtype=float),
                    finish_ms=np.asarray(finish, dtype=float), tokens=np.asarray(produced, dtype=np.int64),
                    step_ms=np.frombuffer(step_ms, dtype=float).copy(),
                    step_seqs=np.frombuffer(step_seqs, dtype=float).astype(np.int64),
                    step_emitted=np.frombuffer(step_emitted, dtype=float).astype(np.int64),
                    request_rounds=np.asarray(rounds_of, dtype=np.int64),
                    request_drafted=np.asarray(drafted_of, dtype=np.int64),
                    zero_gap_tokens=totals[1], drafted=totals[0], accepted=totals[1], rounds=totals[2])
