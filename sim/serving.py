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
does a constant amount of work per step and per request, whatever the batch.

Times are in milliseconds; lengths in tokens.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from array import array
from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from sim.acceptance import AcceptanceModel
from sim.cost import CostModel
from sim.policies import FixedGamma, GammaSpec

#: Draws made at once from the round distribution (refilled when used up).
_POOL_ROUNDS = 1 << 16


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
    _memo: dict = field(default_factory=dict, compare=False, repr=False)

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
            t = self._memo.get(key)
            if t is None:
                t = self._memo[key] = float(self._gen_ms(seqs, max_draft, ctx))
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
    arrivals_ms: Sequence[float] | None = None

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
        return tuple(float(v) for v in np.percentile(x, (50, 95, 99)))  # type: ignore[return-value]
    order = np.argsort(x, kind="stable")
    cw = np.cumsum(w[order])
    out = []
    for q in (0.50, 0.95, 0.99):
        i = int(np.searchsorted(cw, q * cw[-1], side="left"))
        out.append(float(x[order][min(i, x.size - 1)]))
    return tuple(out)  # type: ignore[return-value]


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

    Per pool it keeps what the ring needs of each round apart from the request's own context (tokens,
    tokens produced since the pool started, attention work at context 0), so admitting a request is a
    few slice additions, whatever its length.
    """

    def __init__(self, acceptance: AcceptanceModel | None, gamma: int, rng: np.random.Generator) -> None:
        self.rng, self.gamma = rng, (gamma if acceptance is not None else 0)
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
        k = (np.zeros(_POOL_ROUNDS, dtype=np.int64) if self.cdf.size == 1
             else np.searchsorted(self.cdf, self.rng.random(_POOL_ROUNDS), side="right"))
        d, a = self.d_of[k], self.a_of[k]
        self.cum = np.cumsum(a + 1)  # tokens produced by pool rounds 0..i
        self.cum_d = np.cumsum(d)
        before = (self.cum - a - 1).astype(float)
        t = (d + 1).astype(float)
        self.block = np.stack([np.ones(_POOL_ROUNDS), t, before, t * (before + 0.5 * (t + 1)),
                               (a + 1).astype(float), t - 1.0])
        self.dl, self.al = d.tolist(), a.tolist()
        self.p = 0

    def admit(self, ring: "_Ring", start: int, remaining: int, ctx0: float, cap: bool) -> tuple[int, int, int]:
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
        while remaining - done > margin:  # rounds whose draft cannot reach the budget: slices of the pool
            if self.p >= _POOL_ROUNDS:
                self._refill()
            p, cum = self.p, self.cum
            base = int(cum[p - 1]) if p else 0
            # first round that starts with at most `margin` tokens left (cap) / that reaches the budget
            stop = int(np.searchsorted(cum, base + remaining - done - margin, side="left")) + (0 if cap else 1)
            stop = max(min(stop, _POOL_ROUNDS), p + (0 if cap else 1))
            if stop > p:
                ring.add_block(start + rounds, self.block[:, p:stop], ctx0 + done - base)
                made = int(cum[stop - 1]) - base
                acc += made - (stop - p)
                drafted += int(self.cum_d[stop - 1]) - (int(self.cum_d[p - 1]) if p else 0)
                rounds += stop - p
                done += made
                self.p = stop
            if cap and stop < _POOL_ROUNDS:
                break
        while cap and remaining > done:  # the last rounds one by one, drafts capped at the budget
            if self.p >= _POOL_ROUNDS:
                self._refill()
            di = min(self.dl[self.p], remaining - done - 1)
            ai = min(self.al[self.p], di)
            ring.add_round(start + rounds, di + 1, ctx0 + done, ai + 1)
            self.p += 1
            rounds += 1
            drafted += di
            acc += ai
            done += ai + 1
        return rounds, drafted, acc


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

    Rows (one array per total, steps along the columns): generating sequences, their tokens, Σ context,
    attention work, tokens emitted, the longest draft (kept only with ``track_max_draft``). Requests that
    draft nothing (no speculation) are kept apart as running sums (:meth:`add_plain`): their totals at a
    step follow from how many run and their contexts' sum, so they cost nothing per round.
    """

    def __init__(self, horizon: int, track_max_draft: bool) -> None:
        size = 1 << max(10, int(horizon + 64).bit_length())
        self.mask = size - 1
        self.rows = np.zeros((6, size))
        self.track = track_max_draft
        self.plain_n = 0  # requests generating one token a step
        self.plain_c = 0.0  # Σ (context at its first step − that step) over them
        self.plain_events: dict[int, list[float]] = {}  # step -> [Δ count, Δ context sum] applied at that step

    def add_plain(self, step: int, n: int, ctx: float) -> None:
        """A request that generates one token a step at steps ``step .. step + n − 1``, context ``ctx`` at the
        first (growing by one a step)."""
        for at, sign in ((step, 1.0), (step + n, -1.0)):
            ev = self.plain_events.setdefault(at, [0.0, 0.0])
            ev[0] += sign
            ev[1] += sign * (ctx - step)

    def _parts(self, step: int, n: int) -> tuple[tuple[slice, slice], ...]:
        i = step & self.mask
        if i + n <= self.mask + 1:
            return ((slice(i, i + n), slice(0, n)),)
        k = self.mask + 1 - i
        return (slice(i, None), slice(0, k)), (slice(0, n - k), slice(k, n))

    def add_block(self, step: int, block: np.ndarray, shift: float) -> None:
        """Add pool rounds at steps ``step, step + 1, ...``: ``block`` rows are 1, tokens, context − ``shift``,
        attention work at that context, the tokens emitted and the draft length; contexts shifted by ``shift``."""
        rows = self.rows
        for dst, src in self._parts(step, block.shape[1]):
            rows[:5, dst] += block[:5, src]
            if shift:
                rows[2, dst] += shift
                rows[3, dst] += shift * block[1, src]
            if self.track:
                np.maximum(rows[5, dst], block[5, src], out=rows[5, dst])

    def add(self, step: int, t: np.ndarray, ctx: np.ndarray, emitted: np.ndarray) -> None:
        """Add a request's rounds (tokens ``t`` at contexts ``ctx``, ``emitted`` tokens) at steps ``step, ...``."""
        block = np.stack([np.ones_like(t), t, ctx, t * (ctx + 0.5 * (t + 1)), emitted, t - 1.0])
        self.add_block(step, block, 0.0)

    def add_round(self, step: int, tokens: int, ctx: float, emitted: int) -> None:
        """Add one round of ``tokens`` at context ``ctx`` that emits ``emitted`` tokens at ``step``."""
        i = step & self.mask
        rows = self.rows
        rows[0, i] += 1.0
        rows[1, i] += tokens
        rows[2, i] += ctx
        rows[3, i] += tokens * (ctx + 0.5 * (tokens + 1))
        rows[4, i] += emitted
        if tokens - 1 > rows[5, i]:
            rows[5, i] = tokens - 1

    def pop(self, step: int) -> list[float]:
        i = step & self.mask
        col = self.rows[:, i]
        out = col.tolist()
        col[:] = 0.0
        ev = self.plain_events.pop(step, None)
        if ev is not None:
            self.plain_n += int(ev[0])
            self.plain_c += ev[1]
        n = self.plain_n
        if n:
            ctx = self.plain_c + n * step
            out[0] += n
            out[1] += n
            out[2] += ctx
            out[3] += ctx + n
            out[4] += n
        return out


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
    if policy is None:
        rounds_by: list[_FixedRounds | _PolicyRounds] = [_FixedRounds(None, 1, rounds_rng)]
    else:
        spec = GammaSpec.parse(policy)
        pol = spec.policy()
        models = list(acceptance) if isinstance(acceptance, (list, tuple)) else [acceptance]
        if not models:
            raise ValueError("acceptance: an empty list of models")
        rngs = [rounds_rng] if len(models) == 1 else rounds_rng.spawn(len(models))
        rounds_by = [(_FixedRounds(m, pol.gamma, g) if isinstance(pol, FixedGamma) else _PolicyRounds(m, spec, g))
                     for m, g in zip(models, rngs)]  # type: ignore[arg-type]
    n_models = len(rounds_by)
    n, n_new = workload.n_requests, workload.new_tokens
    prompts = np.atleast_1d(np.asarray(workload.prompt_tokens, dtype=np.int64))
    n_prompts = prompts.size
    overhead = float(workload.request_overhead_ms)
    slots, prefill, cap, n_batch = scheduler.slots, scheduler.prefill, scheduler.cap_drafts, scheduler.n_batch_tokens
    load = workload.load

    send = np.full(n, math.nan)
    first = np.full(n, math.nan)
    finish = np.full(n, math.nan)
    produced = np.zeros(n, dtype=np.int64)
    rounds_of = np.zeros(n, dtype=np.int64)
    drafted_of = np.zeros(n, dtype=np.int64)
    client_of = np.zeros(n, dtype=np.int64)
    # arrivals at the server's queue: (time, request id)
    pending: list[tuple[float, int]] = []
    sent = 0
    if isinstance(load, OpenLoop):
        if workload.arrivals_ms is not None:
            send[:] = np.asarray(workload.arrivals_ms, dtype=float)
        else:
            send[:] = np.cumsum(arrivals_rng.exponential(1000.0 / load.rate_per_s, size=n))
        pending = [(float(send[i]) + overhead, i) for i in range(n)]  # already in time order
        sent = n
        pending.reverse()  # popped from the end
    else:
        for c in range(min(load.concurrency, n)):
            send[sent] = 0.0
            client_of[sent] = c
            heapq.heappush(pending, (overhead, sent))
            sent += 1

    ring = _Ring((n_new + int(prompts.max()) // n_batch + 4) * 2, bool(getattr(cost, "uses_max_draft", False)))
    finishes: dict[int, list[int]] = {}  # step -> requests whose last token ends that step
    firsts: dict[int, list[int]] = {}  # step -> requests whose first token ends that step
    queue: list[int] = []
    q_head = 0
    free = slots
    step_ms = array("d")
    step_seqs = array("q")
    step_emitted = array("q")
    drafted = accepted = n_rounds = 0
    done = 0
    t = 0.0
    s = 0
    closed = isinstance(load, ClosedLoop)
    think = float(load.think_ms) if isinstance(load, ClosedLoop) else 0.0
    step_fn = cost.step_ms
    ctx_base = float(context_tokens)
    prompting: deque[list] = deque()  # [request, prompt tokens left, context after the prompt], FIFO

    def start_rounds(r: int, start: int, have: int, ctx0: float) -> None:
        """Draw request ``r``'s rounds (it has ``have`` tokens) and put them into the steps from ``start``."""
        nonlocal drafted, accepted, n_rounds
        nr, dr, acc = rounds_by[r % n_models].admit(ring, start, n_new - have, ctx0 + have, cap)
        drafted += dr
        accepted += acc
        n_rounds += nr
        rounds_of[r] = nr
        drafted_of[r] = dr
        produced[r] = have + acc + nr
        if not have:
            firsts.setdefault(start, []).append(r)
        finishes.setdefault(start + nr - 1 if nr else start - 1, []).append(r)

    while done < n:
        if pending:  # requests in the queue by this boundary
            if closed:
                while pending and pending[0][0] <= t:
                    queue.append(heapq.heappop(pending)[1])
            else:
                while pending and pending[-1][0] <= t:
                    queue.append(pending.pop()[1])
        if free == slots and q_head == len(queue):  # idle server: it starts when the next request arrives
            assert pending, "requests left but none pending, queued or running"
            t = max(t, pending[0][0] if closed else pending[-1][0])
            continue
        while free and q_head < len(queue):  # free slots take queued requests, first come first served
            r = queue[q_head]
            q_head += 1
            free -= 1
            p_len = int(prompts[r % n_prompts])
            if prefill:  # its prompt goes into the batches from this step on
                prompting.append([r, max(p_len, 1), ctx_base + p_len])
            else:  # the first round is the first step; its first token is the first token
                start_rounds(r, s, 0, ctx_base + p_len)
        # one step: one batch of every generating slot's tokens, then prompt tokens up to n_batch
        seqs, tokens, ctx_sum, attn, emitted, dmax = ring.pop(s)
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
            firsts.setdefault(s, []).append(r)
        if seqs or p_seqs:
            dt = step_fn(int(seqs), tokens + p_tok, int(dmax), ctx_sum, attn, p_tok, p_seqs, int(emitted))
            t += dt
            step_ms.append(dt)
            step_seqs.append(int(seqs))
            step_emitted.append(int(emitted) + p_done)
        if s in firsts:
            for r in firsts.pop(s):
                first[r] = t
        if s in finishes:
            for r in finishes.pop(s):
                finish[r] = t
                done += 1
                free += 1
                if closed and sent < n:  # its client sends the next request
                    send[sent] = t + think
                    client_of[sent] = client_of[r]
                    heapq.heappush(pending, (t + think + overhead, sent))
                    sent += 1
        s += 1
    return ServeRun(send_ms=send, first_token_ms=first, finish_ms=finish, tokens=produced,
                    step_ms=np.asarray(step_ms, dtype=float), step_seqs=np.asarray(step_seqs, dtype=np.int64),
                    step_emitted=np.asarray(step_emitted, dtype=np.int64), request_rounds=rounds_of,
                    request_drafted=drafted_of,
                    zero_gap_tokens=accepted, drafted=drafted, accepted=accepted, rounds=n_rounds)
