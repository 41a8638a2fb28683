"""``python -m sim validate`` — predict every published result from its published acceptance alone.

Each row of the published table (:mod:`sim.published`) is priced through the
step-cost seam (:mod:`sim.stepcost`) twice — kernel tables and roofline —
from the row's target, draft, GPU, engine, dtype, TP and batch, with the
row's τ (bonus token included) turned into the i.i.d. α at its chain length.
An SGLang EAGLE tree (``gamma`` steps, ``tree_topk``, ``tree_num_draft_tokens``)
is priced as the round SGLang's EAGLE worker runs for those flags
(:func:`sim.trees.sglang_round_cost`: draft forwards over 1 then ``topk``
tokens per sequence, the target's verification of the tree's tokens with the
same attention rule as a chain, the draft's extend pass over ``steps + 1``
positions), with the published accept length as τ.
Printed: per row the prediction, the error against the published speedup and
the source; the median |error| per source on the rows both could price; the
rows whose acceptance was borrowed from a batch-1 row of the same source
(``acceptance_from``, :mod:`sim.published`); every published slowdown at
batch > 1 with its prediction per source (or why it is not expressed) and the
count of those predicted below 1; the rows it cannot express, with the reason.

The rows are split into fit and held-out halves first (by a hash of the row
id, so the split does not depend on any result); nothing is fitted or chosen
on the held-out half, whose error is reported apart. What the engines spend
beyond the kernels is an overhead model (:data:`OVERHEAD_MODELS`, simplest
first: a fixed overhead per draft step; + one per round; + one per sequence
beyond the first; a per-step one and a per-round one per engine; the same
with an engine's trees apart from its chains; SGLang's per-round term held at
the value its own measurement gives), each fitted on the fit half by a grid
search minimising the median |error|. The model adopted per source is the one
with the least leave-one-out median |error| on the fit half (every fit row
predicted by the model fitted on the others; :data:`MODEL_RULE`), so a model
with more terms is adopted only where it predicts rows it was not fitted on
better. Printed per model: its fitted values, the leave-one-out error, the
held-out errors (all, batch-1, batch > 1) and the published slowdowns at
batch > 1 it predicts with its false alarms; everything after is priced with
the adopted model. ``--write-overheads`` writes the adopted models with where
they came from (:mod:`sim.engine_overheads`), which ``python -m sim`` adds to
a GPU chain's round.

A row whose own published baseline is not lockstep decoding is not
expressed: the plain decoding's step its figures imply
(:attr:`sim.published.PublishedResult.baseline_step_ms`) more than
:data:`BASELINE_LIMIT` times either way from the step the kernels column
prices for its batch in lockstep (the published benchmark was bound by
something no step cost reproduces: its harness, its host, a tail of fewer
sequences). The spread of that ratio over the expressed rows is printed, and
a published slowdown so excluded says what lockstep pricing would predict.

Every row is priced under each MoE routing of the kernel tables
(:data:`sim.kernels.MOE_ROUTINGS`), each with its own per-step overhead fitted
on the fit half; the routing with the least kernel median |error| on the fit
half is adopted (:data:`ROUTING_RULE`; held-out rows are not consulted) and
the rest of the report is priced under it. Printed per routing: the fit and
held-out medians (batch-1, batch > 1, all) and the slowdowns at batch > 1 it
predicts with its false alarms; and which rows the routing changes (MoE
targets only: a dense model has no routing).

Assumptions, stated: a row without TP runs on the fewest GPUs of its node
that hold the weights and KV cache; without a dtype, the checkpoint's own
(fp8 where its config.json says so, else bf16); the context is the
row's input tokens plus half its output tokens, else 1024; "concurrency B" is
priced as B sequences in lockstep; a tree draft outside SGLang's EAGLE
worker, a request-rate row, a row
without a published acceptance or chain length, a draft kind the seam cannot
price (Hydra, lookahead, REST, PLD) and a GPU or engine it does not know are
not expressed, nor is a row on more GPUs than one node.
"""

from __future__ import annotations

import hashlib
import statistics
import sys
from pathlib import Path
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np

from presets.hardware import HARDWARE
from sim.acceptance import IIDAcceptance, implied_alpha_from_tau
from sim.analytic import predict_row
from sim.engine_overheads import OVERHEADS_FILE, SOURCES, FittedOverhead, table_sha256, write_overheads
from sim.published import PUBLISHED_FILE, PublishedResult, load_published
from sim.kernels import ATTENTION_RULES, DEFAULT_MOE_ROUTING, MOE_ROUTINGS
from sim.modelref import resolve_model
from sim.stepcost import (SGLANG_OVERLAP_ROUND_MS, TP_SIZES, EngineOverheads, EngineRoundOverhead, GpuSetup, StepCost,
                          build_step_cost, round_kind)
from sim.trees import sglang_round_cost
from toolkit.cli import OneLineParser, nonempty_arg

PROG = "python -m sim validate"
HARDWARE_NAMES = {"h100": "h100-sxm", "h200": "h200", "a100": "a100-80gb", "b200": "b200", "b300": "b300",
                  "gb200": "gb200", "l40s": "l40s", "l4": "l4", "t4": "t4"}
DRAFT_NAMES = {"eagle": "eagle", "eagle2": "eagle", "eagle3": "eagle3", "mtp": "mtp", "medusa": "medusa",
               "ngram": "ngram", "suffix": "ngram", "pld": "ngram"}
TREE_DRAFTS = ("eagle", "eagle2", "eagle3", "mtp")  # SGLang drafts these with its EAGLE worker's tree
ASKED = {"kernels": "auto", "roofline": "roofline"}  # the kernels column falls back (and says so) off the tables
OVERHEAD_GRID_MS = [i / 100 for i in range(0, 301)]
JOINT_STEP_GRID_MS = [i / 100 for i in range(0, 61)]  # per draft step, fitted jointly with the per-round term
ROUND_GRID_MS = [i / 20 for i in range(0, 61)]  # per round: 0 to 3 ms by 0.05
SEQUENCE_GRID_MS = [i / 100 for i in range(0, 51)]  # per sequence beyond the first: 0 to 0.5 ms by 0.01
ENGINE_ROUND_GRID_MS = [i / 5 for i in range(0, 31)]  # per round of one engine (chain or tree): 0 to 6 ms by 0.2
Overhead = float | EngineRoundOverhead | EngineOverheads  # a float is a per-draft-step overhead alone
BASELINE_LIMIT = 2.0
"""How far, as a factor either way, a row's published plain-decoding step may lie from the step the kernels
column prices for its batch in lockstep before the row is not expressed: beyond it the published baseline was
not B sequences decoding together on the GPU (a benchmark bound by its harness, its host or a tail of fewer
sequences), which no step cost reproduces."""


@dataclass(frozen=True)
class TreeFlags:
    """A published SGLang EAGLE tree: ``topk`` and ``num_draft_tokens`` (the root included; the steps are the
    row's ``gamma``) and the published accept length, which a tree's τ is taken as directly."""

    topk: int
    num_draft_tokens: int
    tau: float


@dataclass
class Priced:
    """One row made expressible: its costs per source (a source that failed holds its reason). A chain carries
    the i.i.d. α implied by its τ; a tree (``tree``) its flags and τ (``alpha`` is then ``None``)."""

    row: PublishedResult
    alpha: float | None
    gamma: int
    batch: int
    context_tokens: float
    costs: dict[str, StepCost]
    held_out: bool
    tree: TreeFlags | None = None

    def speedup(self, source: str, overhead: Overhead) -> float:
        """The predicted speedup with an engine overhead per round: a float is added to every draft step (a
        chain drafts γ tokens every round, so the round grows by γ · overhead, the same as
        a per-step cost through ``predict_row``); an :class:`EngineRoundOverhead` adds its round time."""
        tokens, round_ms, base_ms = self.parts[source]
        if isinstance(overhead, EngineOverheads):
            overhead = overhead.for_engine(self.row.engine, self.tree is not None)
        extra = (overhead.round_ms(self.gamma, self.batch) if isinstance(overhead, EngineRoundOverhead)
                 else self.gamma * overhead)
        return tokens * base_ms / (round_ms + extra)

    @cached_property
    def parts(self) -> dict[str, tuple[float, float, float]]:
        """Per source: tokens per round, round time and baseline step time (ms), without overhead."""
        out = {}
        for source, cost in self.costs.items():
            if self.tree is not None:
                t = self.tree
                rc = sglang_round_cost(cost, self.gamma, t.topk, t.num_draft_tokens, self.context_tokens, self.batch)
                out[source] = (t.tau, rc.draft_ms + rc.verify_ms + rc.overhead_ms,
                               cost.target_step_ms(self.context_tokens, self.batch))
                continue
            assert self.alpha is not None
            row = predict_row(IIDAcceptance(self.alpha), cost, self.gamma, self.context_tokens, self.batch)
            out[source] = (row.expected_tokens_per_round, row.round_time_ms, row.baseline_ms_per_token)
        return out


def is_held_out(row_id: str) -> bool:
    """The split, fixed before any fitting: the low bit of the SHA-256 of the row id."""
    return hashlib.sha256(row_id.encode()).digest()[0] % 2 == 1


def _why_not(r: PublishedResult) -> str | None:
    checks = [
        (r.published_speedup is None, "no published speedup or tokens/s pair"),
        (r.tau_incl_bonus is None, "no published acceptance convertible to tau (incl. bonus)"),
        (r.tree_topk is not None and (r.engine != "sglang" or r.draft_kind not in TREE_DRAFTS),
         f"a {r.draft_kind} tree in {r.engine} (the seam prices SGLang's EAGLE trees: {', '.join(TREE_DRAFTS)})"),
        (r.gamma is None, "no chain length"),
        (r.batch_kind == "request_rate" or r.batch is None, "a request-rate row (needs the serve mode)"),
        (r.hardware not in HARDWARE_NAMES, f"hardware {r.hardware} has no profile"),
        (r.draft_kind not in DRAFT_NAMES and not (r.draft_kind == "model" and r.draft_model),
         f"draft kind {r.draft_kind} is not priced by the seam"),
        (r.engine not in ("sglang", "vllm", "trtllm"), f"engine {r.engine}: no kernel tables"),
        ((r.gpus or 1) > 8 or (r.tp or 1) > 8, f"{r.gpus} GPUs: more than one node (multi-node parallelism and "
         "per-rank figures are not modelled)"),
    ]
    return next((why for bad, why in checks if bad), None)


def _checkpoint_dtype(target: str) -> str:
    """The dtype a row without one ran at: the checkpoint's own (fp8 where its config.json is quantized so, as
    DeepSeek-V3/R1's are), else bf16."""
    try:
        quant = resolve_model(target).config.get("quantization_config") or {}
    except ValueError:
        return "bf16"
    return "fp8" if str(quant.get("quant_method", "")).lower() == "fp8" else "bf16"


def _setup_for(r: PublishedResult, routing: str) -> tuple[str, str, GpuSetup]:
    hw = HARDWARE[HARDWARE_NAMES[str(r.hardware)]]
    dtype = r.dtype if r.dtype in ("bf16", "fp16", "fp8", "nvfp4") else _checkpoint_dtype(r.target)
    draft = DRAFT_NAMES.get(r.draft_kind) or str(r.draft_model)
    return r.target, draft, GpuSetup(hw, r.engine, r.tp or 1, r.tp or 1, dtype, True, routing)


def price_row(r: PublishedResult, rule: str = "kv-once", routing: str = DEFAULT_MOE_ROUTING) -> Priced | str:
    """The row's costs per source (an MoE model's kernel tables under ``routing``), or why it cannot be
    expressed."""
    why = _why_not(r)
    if why is not None:
        return why
    assert r.gamma is not None and r.tau_incl_bonus is not None and r.batch is not None
    tau = min(r.tau_incl_bonus, r.gamma + 1.0)  # a tree of `gamma` steps accepts at most gamma + 1 tokens too
    context = float(r.input_tokens + (r.output_tokens or 0) / 2) if r.input_tokens else 1024.0
    target, draft, setup = _setup_for(r, routing)
    tps = [setup.tp] if r.tp else list(TP_SIZES)
    drafted = r.gamma if r.tree_num_draft_tokens is None else max(r.gamma, r.tree_num_draft_tokens - 1)
    costs: dict[str, StepCost] = {}
    last = ""
    for source in SOURCES:
        for tp in tps:
            try:
                costs[source] = build_step_cost(target, draft, replace(setup, tp=tp, ep=tp), ASKED[source], r.batch,
                                                context, drafted, rule)
                break
            except ValueError as exc:
                last = str(exc)
    if set(costs) != set(SOURCES):
        return f"cannot be priced: {last}"
    if r.tree_topk is not None and r.tree_num_draft_tokens is not None:
        tree = TreeFlags(r.tree_topk, r.tree_num_draft_tokens, tau)
        return Priced(r, None, r.gamma, r.batch, context, costs, is_held_out(r.id), tree)
    try:
        alpha = implied_alpha_from_tau(tau, r.gamma)
    except ValueError as exc:
        return f"tau {tau:g} at gamma {r.gamma}: {exc}"
    return Priced(r, alpha, r.gamma, r.batch, context, costs, is_held_out(r.id))


def _err(pred: float, pub: float) -> float:
    return pred / pub - 1.0


Grid = Iterator[tuple[np.ndarray, np.ndarray, Callable[[int], Overhead]]]
"""A model's parameter grid, in chunks: the |error| of every row under each grid point (points × rows), each
point's parameter sum (the tie-break: the smaller overhead) and how to build the overhead of point ``i``."""


def _arrays(rows: list[Priced], source: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per row: the round time without overhead, the gain (the predicted speedup over the published one is
    gain / round time), γ and the sequences beyond the first."""
    parts = np.array([p.parts[source] for p in rows])  # tokens, round ms, baseline ms per row
    pub = np.array([float(p.row.published_speedup or 1) for p in rows])
    gamma = np.array([p.gamma for p in rows], dtype=float)
    extra = np.array([max(p.batch - 1, 0) for p in rows], dtype=float)
    return parts[:, 1], parts[:, 0] * parts[:, 2] / pub, gamma, extra


def _per_step_grid(rows: list[Priced], source: str) -> Grid:
    round_ms, gain, gamma, _ = _arrays(rows, source)
    step = np.array(OVERHEAD_GRID_MS)
    yield np.abs(gain / (round_ms + step[:, None] * gamma) - 1.0), step, lambda i: float(step[i])


def _round_grid(rows: list[Priced], source: str, per_sequence: bool) -> Grid:
    round_ms, gain, gamma, extra = _arrays(rows, source)
    seq = np.array(SEQUENCE_GRID_MS if per_sequence else [0.0])
    grid = np.stack(np.meshgrid(JOINT_STEP_GRID_MS, ROUND_GRID_MS, seq, indexing="ij"), axis=-1).reshape(-1, 3)
    added = grid[:, :1] * gamma + grid[:, 1:2] + grid[:, 2:3] * extra  # (grid points, rows)
    yield (np.abs(gain / (round_ms + added) - 1.0), grid.sum(axis=1),
           lambda i: EngineRoundOverhead(*(float(v) for v in grid[i])))


def _engine_grid(rows: list[Priced], source: str, fixed: dict[str, float] | None = None,
                 by_shape: bool = False) -> Grid:
    fixed = fixed or {}
    kinds = [round_kind(p.row.engine, by_shape and p.tree is not None) for p in rows]
    engines = sorted(set(kinds) | set(fixed))
    round_ms, gain, gamma, _ = _arrays(rows, source)
    which = np.array([engines.index(k) for k in kinds], dtype=int)
    grids = [np.array([fixed[e]] if e in fixed else ENGINE_ROUND_GRID_MS) for e in engines]
    rounds = np.stack(np.meshgrid(*grids, indexing="ij"), axis=-1).reshape(-1, len(engines))
    base_ms = round_ms + rounds[:, which]  # round time of each row under each round combination
    sums = rounds.sum(axis=1)

    def maker(step: float) -> Callable[[int], Overhead]:
        return lambda i: EngineOverheads(step, tuple((e, float(r)) for e, r in zip(engines, rounds[i])))
    for step in JOINT_STEP_GRID_MS:
        yield np.abs(gain / (base_ms + step * gamma) - 1.0), step + sums, maker(step)


def _leave_one_out_medians(a: np.ndarray) -> np.ndarray:
    """Column ``j`` of the result: the median of each row of ``a`` without its element ``j`` (one sort per row:
    the element at place ``k`` of what is left is the sorted row's ``k``, or ``k + 1`` past ``j``'s rank)."""
    n = a.shape[1]
    order = np.argsort(a, axis=1, kind="stable")
    ranked = np.take_along_axis(a, order, axis=1)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(n), a.shape), axis=1)
    lo, hi = (n - 2) // 2, (n - 1) // 2  # the middle places of n - 1 values
    return (np.where(lo < rank, ranked[:, lo:lo + 1], ranked[:, lo + 1:lo + 2])
            + np.where(hi < rank, ranked[:, hi:hi + 1], ranked[:, hi + 1:hi + 2])) / 2


def _search(grid: Grid, leave_one_out: bool = False) -> list[Overhead]:
    """The grid point with the least median |error| (ties within 1e-12: the smallest parameter sum, then the first
    point): one, or with ``leave_one_out`` one per row, fitted without that row."""
    best: list[tuple[float, float, Overhead] | None] = []
    for errors, sums, make in grid:
        medians = _leave_one_out_medians(errors) if leave_one_out else _row_medians(errors)[:, None]
        if not best:
            best = [None] * medians.shape[1]
        least = medians.min(axis=0)
        tied = np.where(medians <= least + 1e-12, sums[:, None], np.inf)
        points = tied.argmin(axis=0)
        for j, (err, i) in enumerate(zip(least, points)):
            b = best[j]
            if b is None or err < b[0] - 1e-12 or (err <= b[0] + 1e-12 and sums[i] < b[1]):
                best[j] = (float(err), float(sums[i]), make(int(i)))
    return [b[2] for b in best if b is not None]


def fit_overhead(rows: list[Priced], source: str) -> float:
    """The per-draft-step overhead (ms, 0..3 on a 0.01 grid) minimising the median |error| on ``rows``."""
    if not rows:
        return 0.0
    fitted = _search(_per_step_grid(rows, source))[0]
    assert isinstance(fitted, float)
    return fitted


def fit_round_overhead(rows: list[Priced], source: str, per_sequence: bool = True) -> EngineRoundOverhead:
    """The per-step, per-round and (with ``per_sequence``) per-extra-sequence overheads minimising, jointly on
    their grids, the median |error| on ``rows``; ties go to the smallest sum, then the first on the grids."""
    if not rows:
        return EngineRoundOverhead()
    fitted = _search(_round_grid(rows, source, per_sequence))[0]
    assert isinstance(fitted, EngineRoundOverhead)
    return fitted


def median_error(rows: list[Priced], source: str, overhead: Overhead) -> float | None:
    """The median |error| of ``rows`` under ``overhead`` (``None`` for no rows)."""
    if not rows:
        return None
    return statistics.median(abs(_err(p.speedup(source, overhead), float(p.row.published_speedup or 1)))
                             for p in rows)


def _row_medians(a: np.ndarray) -> np.ndarray:
    """The median of each row of ``a`` (what ``np.median(a, axis=1)`` gives, by a partial sort: faster)."""
    n = a.shape[1]
    part = np.partition(a, [(n - 1) // 2, n // 2], axis=1)
    return (part[:, (n - 1) // 2] + part[:, n // 2]) / 2


def fit_engine_overheads(rows: list[Priced], source: str, fixed: dict[str, float] | None = None,
                         by_shape: bool = False) -> EngineOverheads:
    """One per-step overhead and a per-round overhead per engine of ``rows`` (with ``by_shape``, per round kind:
    an engine's chains and its trees apart, :func:`sim.stepcost.round_kind`; those in ``fixed`` held at their
    given value) minimising, jointly on their grids, the median |error| on ``rows``; ties go to the smallest sum."""
    if not rows:
        fixed = fixed or {}
        return EngineOverheads(0.0, tuple((e, fixed[e]) for e in sorted(fixed)))
    fitted = _search(_engine_grid(rows, source, fixed, by_shape))[0]
    assert isinstance(fitted, EngineOverheads)
    return fitted


@dataclass(frozen=True)
class OverheadModel:
    """One model of what the engines spend beyond the kernels, fitted by a grid search (:data:`Grid`)."""

    name: str
    grid: Callable[[list[Priced], str], Grid]

    def fit(self, rows: list[Priced], source: str) -> Overhead:
        """Fitted on ``rows`` (no rows: no overhead)."""
        return _search(self.grid(rows, source))[0] if rows else 0.0

    def leave_one_out(self, rows: list[Priced], source: str) -> list[Overhead]:
        """Per row of ``rows``: the model fitted on the others."""
        return _search(self.grid(rows, source), leave_one_out=True) if len(rows) > 1 else [0.0] * len(rows)

    def describe(self, o: Overhead) -> str:
        """The fitted values, in ms."""
        if isinstance(o, EngineOverheads):
            return f"{o.per_draft_step_ms:.2f} ms/step; " + ", ".join(f"{e} {r:.2f}" for e, r in o.per_round_ms) \
                + " ms/round"
        if isinstance(o, EngineRoundOverhead):
            return (f"{o.per_draft_step_ms:.2f} ms/step + {o.per_round_ms:.2f} ms/round"
                    + (f" + {o.per_extra_sequence_ms:.2f} ms/extra sequence" if "sequence" in self.name else ""))
        return f"{o:.2f} ms/step"


OVERHEAD_MODELS = (
    OverheadModel("per draft step", _per_step_grid),
    OverheadModel("+ per round", lambda rows, s: _round_grid(rows, s, per_sequence=False)),
    OverheadModel("+ per extra sequence", lambda rows, s: _round_grid(rows, s, per_sequence=True)),
    OverheadModel("per engine", _engine_grid),
    OverheadModel("per engine, trees apart", lambda rows, s: _engine_grid(rows, s, by_shape=True)),
    OverheadModel("SGLang's from its source", lambda rows, s: _engine_grid(rows, s, {"sglang": SGLANG_OVERLAP_ROUND_MS})),
)
"""The overhead models tried, simplest first: a fixed overhead per draft step (the engines' draft loop:
sampling, top-k, bookkeeping, launches the kernel tables do not time); + one per round; + one per sequence
beyond the first; a per-step one and a per-round one per engine (SGLang ran speculative rounds without its
overlap scheduler before "spec v2"); the same with an engine's trees apart from its chains; SGLang's per-round
term held at the value its own measurement gives (:data:`sim.stepcost.SGLANG_OVERLAP_ROUND_MS`)."""
MODEL_RULE = ("adopted per source: the model with the least leave-one-out median |error| over the fit rows the "
              "kernel tables priced (each fit row predicted by the model fitted on the other fit rows), ties to the "
              "simpler; held-out rows are not consulted")


@dataclass(frozen=True)
class ModelScore:
    """One overhead model for one source: fitted on the fit rows, with its leave-one-out median |error| there."""

    model: OverheadModel
    source: str
    fitted: Overhead
    leave_one_out: float | None


def score_models(priced: list[Priced], source: str) -> list[ModelScore]:
    """Every model of :data:`OVERHEAD_MODELS` fitted on the fit rows of ``priced`` and scored by leave-one-out."""
    fit = [p for p in priced if not p.held_out]
    covered = [i for i, p in enumerate(fit) if p.costs["kernels"].target_side.source == "kernels"]
    out = []
    for model in OVERHEAD_MODELS:
        loo = model.leave_one_out(fit, source)
        errs = [abs(_err(fit[i].speedup(source, loo[i]), float(fit[i].row.published_speedup or 1))) for i in covered]
        out.append(ModelScore(model, source, model.fit(fit, source), statistics.median(errs) if errs else None))
    return out


def choose_model(scores: Sequence[ModelScore]) -> ModelScore:
    """The score :data:`MODEL_RULE` adopts: the least leave-one-out error, ties to the earlier (simpler) model."""
    return min(scores, key=lambda sc: (float("inf") if sc.leave_one_out is None else round(sc.leave_one_out, 12),
                                       OVERHEAD_MODELS.index(sc.model)))


def _median(values: list[float]) -> str:
    return f"{100 * statistics.median(values):.1f}%" if values else "-"


def rule_evidence(priced: list[Priced], overhead: Overhead, routing: str = DEFAULT_MOE_ROUTING) -> list[str]:
    """The attention rule's evidence: the kernel error at batch > 1 (where the bracket is wide) under each rule."""
    wide = [p for p in priced if p.batch > 1 and p.costs["kernels"].target_side.source == "kernels"]
    out = []
    for rule in ATTENTION_RULES:
        errs = []
        for p in wide:
            q = price_row(p.row, rule, routing)
            if isinstance(q, Priced):
                errs.append(abs(_err(q.speedup("kernels", overhead), float(p.row.published_speedup or 1))))
        out.append(f"{rule} {_median(errs)}")
    return [f"attention rule, kernel median |error| on the {len(wide)} batch > 1 rows (adopted overhead): "
            + ", ".join(out)]


def borrowed_lines(rows: list[PublishedResult]) -> list[str]:
    """The rows whose acceptance was borrowed from a batch-1 row of the same source (``acceptance_from``)."""
    lent = [r for r in rows if r.acceptance_from is not None]
    if not lent:
        return ["acceptance borrowed from a batch-1 row of the same source: none"]
    return [f"acceptance borrowed from a batch-1 row of the same source ({len(lent)} rows):"] + [
        f"  {r.id} <- {r.acceptance_from} ({r.acceptance_kind} {r.acceptance:g})" for r in lent]


def is_published_slowdown(r: PublishedResult) -> bool:
    """A published speedup below 1 at batch > 1 (a request-rate row counts: many requests share the GPU)."""
    return (r.published_speedup or 1.0) < 1.0 and (r.batch_kind == "request_rate" or (r.batch or 1) > 1)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def slowdown_counts(priced: list[Priced], source: str, overhead: Overhead) -> tuple[int, int, int, int]:
    """Predictions at batch > 1: published slowdowns predicted below 1, those expressed, published speedups
    predicted below 1 (false alarms), those expressed."""
    wide = [p for p in priced if p.batch > 1]
    slow = [p for p in wide if is_published_slowdown(p.row)]
    fast = [p for p in wide if not is_published_slowdown(p.row)]
    return (sum(p.speedup(source, overhead) < 1 for p in slow), len(slow),
            sum(p.speedup(source, overhead) < 1 for p in fast), len(fast))


def model_lines(priced: list[Priced], scores: Mapping[str, Sequence[ModelScore]],
                chosen: Mapping[str, ModelScore]) -> list[str]:
    """Per source and overhead model: its values fitted on the fit rows, its leave-one-out error there, its
    held-out errors (all, batch-1, batch > 1) and the slowdowns at batch > 1 it predicts; then the choice."""
    covered = [p for p in priced if p.costs["kernels"].target_side.source == "kernels"]
    held = [p for p in covered if p.held_out]
    sets = (held, [p for p in held if p.batch == 1], [p for p in held if p.batch > 1])
    lines = ["engine overhead models, each fitted on the fit rows (medians over the rows the kernel tables priced; "
             f"held out: {len(held)} rows, {len(sets[1])} at batch 1, {len(sets[2])} at batch > 1):"]
    for s in SOURCES:
        for sc in scores[s]:
            errs = [_pct(median_error(rows, s, sc.fitted)) for rows in sets]
            hit, slow, alarm, fast = slowdown_counts(priced, s, sc.fitted)
            lines.append(f"  {s:8s} {sc.model.name:24s} {sc.model.describe(sc.fitted):66s} leave-one-out "
                         f"{_pct(sc.leave_one_out):>6s}; held out {errs[0]:>6s} (batch-1 {errs[1]:>6s}, batch > 1 "
                         f"{errs[2]:>6s}); slowdowns at batch > 1 {hit} of {slow}, false alarms {alarm} of {fast}")
    return lines + [f"{MODEL_RULE}: " + "; ".join(f"{s} {chosen[s].model.name}" for s in SOURCES)
                    + "; the rows below are priced with it"]


def slowdown_lines(rows: list[PublishedResult], priced: list[Priced], skipped: dict[str, str],
                   overhead: Mapping[str, Overhead], gated: Sequence[Priced] = ()) -> list[str]:
    """Every published slowdown at batch > 1: its prediction per source (and whether it is below 1), or why
    it is not expressed (for a row whose published baseline is not lockstep decoding, :data:`BASELINE_LIMIT`,
    also what it would be priced as lockstep); then the count the issue asks for (a slowdown "predicted" by the
    kernel column) and the false alarms (published speedups at batch > 1 predicted below 1)."""
    by_id = {p.row.id: p for p in priced}
    as_lockstep = {p.row.id: p for p in gated}

    def predictions(p: Priced) -> str:
        preds = {s: p.speedup(s, overhead[s]) for s in SOURCES}
        return ", ".join(f"{s} {preds[s]:.2f}x ({'a slowdown' if preds[s] < 1 else 'not a slowdown'})"
                         for s in SOURCES)
    slow = [r for r in rows if is_published_slowdown(r)]
    lines = [f"published slowdowns at batch > 1 (request-rate rows included): {len(slow)}"]
    for r in slow:
        p = by_id.get(r.id)
        head = f"  {r.id}: published {float(r.published_speedup or 1):.2f}x"
        if p is not None:
            lines.append(f"{head}, predicted {predictions(p)}")
            continue
        g = as_lockstep.get(r.id)
        lines.append(f"{head}, not expressed: {skipped.get(r.id, '?')}"
                     + (f"; priced as lockstep decoding it would be {predictions(g)}" if g is not None else ""))
    hits = {s: slowdown_counts(priced, s, overhead[s]) for s in SOURCES}
    k, f = hits["kernels"], hits["roofline"]
    return lines + [f"published slowdowns at batch > 1: {k[1]} expressed, {k[0]} predicted as slowdowns (kernels; "
                    f"roofline: {f[0]}); published speedups at batch > 1 predicted as slowdowns (false alarms): "
                    f"{k[2]} of {k[3]} (kernels; roofline: {f[2]})"]


def baseline_ratio(p: Priced) -> float | None:
    """The row's published plain-decoding step over the lockstep step the kernels column prices (``None``
    without a published baseline)."""
    published = p.row.baseline_step_ms
    return None if published is None else published / p.costs["kernels"].target_step_ms(p.context_tokens, p.batch)


def baseline_lines(run: RoutingRun) -> list[str]:
    """How the published baselines compare with the lockstep step priced: the spread over the expressed rows and
    the rows beyond :data:`BASELINE_LIMIT`."""
    kept = [r for p in run.priced if (r := baseline_ratio(p)) is not None]
    far = [(p.row.id, baseline_ratio(p)) for p in run.gated]
    spread = (f"ratio median {statistics.median(kept):.2f}, {min(kept):.2f} to {max(kept):.2f}" if kept else "none")
    return [f"published baseline step / lockstep step priced (kernels column): {len(kept) + len(far)} rows publish a "
            f"baseline; the {len(kept)} expressed: {spread}; beyond {BASELINE_LIMIT:g}x either way, not expressed: "
            + (", ".join(f"{rid} {r:.2f}x" for rid, r in far) if far else "none")]


def baseline_mismatch(p: Priced) -> str | None:
    """Why a row's own published baseline rules out pricing it as lockstep decoding, or ``None``: the plain
    decoding's step its figures imply (:attr:`PublishedResult.baseline_step_ms`) lies more than
    :data:`BASELINE_LIMIT` times either way from the target step the kernels column prices for ``batch``
    sequences in lockstep."""
    ratio = baseline_ratio(p)
    if ratio is None or 1 / BASELINE_LIMIT <= ratio <= BASELINE_LIMIT:
        return None
    published, cost = float(p.row.baseline_step_ms or 0), p.costs["kernels"]
    model = published / ratio
    many = f"{p.batch} sequences" if p.batch > 1 else "one sequence"
    return (f"its published baseline implies {published:.1f} ms per decode step at batch {p.batch}, {ratio:.2f}x "
            f"the step priced ({cost.target_side.source}) for {many} in lockstep, {model:.1f} ms (beyond "
            f"{BASELINE_LIMIT:g}x either way): not {many} decoding in lockstep, or bound by what step costs do not "
            "time")


@dataclass(frozen=True)
class RoutingRun:
    """Every row priced with the MoE tables under one routing: the expressed rows, the reasons for the rest, the
    per-step overhead per source fitted on the fit rows, and the rows priced but not expressed because their
    published baseline is not lockstep decoding (``gated``)."""

    routing: str
    priced: list[Priced]
    skipped: list[tuple[str, str]]
    overhead: dict[str, float]
    gated: list[Priced] = field(default_factory=list)

    def covered(self, held_out: bool) -> list[Priced]:
        """The fit (or held-out) rows the kernel tables priced: the rows every median is over."""
        return [p for p in self.priced if p.held_out == held_out and p.costs["kernels"].target_side.source == "kernels"]

    def error(self, held_out: bool, batch: str = "all") -> float | None:
        """The kernel median |error| under the fitted per-step overhead (``batch``: all, 1 or >1)."""
        rows = [p for p in self.covered(held_out) if batch == "all" or (p.batch == 1) == (batch == "1")]
        return median_error(rows, "kernels", self.overhead["kernels"])

    def slowdowns(self) -> tuple[int, int, int, int]:
        """Kernel predictions at batch > 1 under the fitted per-step overhead (:func:`slowdown_counts`)."""
        return slowdown_counts(self.priced, "kernels", self.overhead["kernels"])


def price_all(rows: list[PublishedResult], routing: str) -> RoutingRun:
    """Every row priced under ``routing``, the per-step overhead fitted per source on the fit rows; a row whose
    published baseline is not lockstep decoding (:func:`baseline_mismatch`) is not expressed, and kept apart."""
    priced, skipped, gated = [], [], []
    for r in rows:
        p = price_row(r, routing=routing)
        if isinstance(p, str):
            skipped.append((r.id, p))
        elif (why := baseline_mismatch(p)) is not None:
            skipped.append((r.id, why))
            gated.append(p)
        else:
            priced.append(p)
    fit = [p for p in priced if not p.held_out]
    return RoutingRun(routing, priced, skipped, {s: fit_overhead(fit, s) for s in SOURCES}, gated)


ROUTING_RULE = ("adopted: the routing with the least kernel median |error| on the fit rows the kernel tables priced "
                "(each routing with its own per-step overhead fitted on them), ties to the earlier in "
                f"{', '.join(MOE_ROUTINGS)}; held-out rows are not consulted")


def choose_routing(runs: Sequence[RoutingRun]) -> RoutingRun:
    """The run whose routing the fit rows prefer (:data:`ROUTING_RULE`): only fit rows enter the choice."""
    return min(runs, key=lambda run: (run.error(False) if run.error(False) is not None else float("inf"),
                                      MOE_ROUTINGS.index(run.routing)))


def routing_lines(runs: Sequence[RoutingRun], chosen: RoutingRun) -> list[str]:
    """Per MoE routing: its fitted per-step overhead, the kernel fit and held-out medians (all rows, batch-1,
    batch > 1), the published slowdowns at batch > 1 it predicts and its false alarms; then the rule and the
    choice."""
    lines = ["MoE routing of the kernel tables (kernel median |error| under each routing's own per-step overhead "
             "fitted on the fit rows; rows the kernel tables priced):"]
    for run in runs:
        hit, slow, alarm, fast = run.slowdowns()
        errs = [_pct(run.error(held, b)) for held in (False, True) for b in ("all", "1", ">1")]
        lines.append(f"  {run.routing:15s} {run.overhead['kernels']:.2f} ms/step  fit {errs[0]:>6s} (batch-1 "
                     f"{errs[1]:>6s}, batch > 1 {errs[2]:>6s}); held out {errs[3]:>6s} (batch-1 {errs[4]:>6s}, "
                     f"batch > 1 {errs[5]:>6s}); slowdowns at batch > 1 predicted {hit} of {slow}, false alarms "
                     f"{alarm} of {fast}")
    default = "" if chosen.routing == DEFAULT_MOE_ROUTING else f" (the shipped default is {DEFAULT_MOE_ROUTING})"
    return lines + [routing_changes(runs), f"{ROUTING_RULE}: {chosen.routing}{default}; the rows below are priced "
                    "under it"]


def _is_moe(target: str) -> bool:
    try:
        return resolve_model(target).arch.is_moe
    except ValueError:
        return False


def routing_changes(runs: Sequence[RoutingRun]) -> str:
    """Which rows' kernel costs the routing changes (their targets), and whether any is a dense model's."""
    parts = [{p.row.id: p.parts["kernels"] for p in run.priced} for run in runs]
    target = {p.row.id: p.row.target for p in runs[0].priced}
    changed = [rid for rid in parts[0] if any(other.get(rid) != parts[0][rid] for other in parts[1:])]
    dense = [rid for rid in changed if not _is_moe(target[rid])]
    return (f"the routing changes the kernel costs of {len(changed)} rows (targets: "
            f"{', '.join(sorted({target[r] for r in changed})) or 'none'}); the other {len(parts[0]) - len(changed)} "
            "are priced identically under each; " + (f"dense rows changed: {', '.join(dense)}" if dense
                                                      else "no dense row changed"))


def _row_lines(priced: list[Priced], overhead: Mapping[str, Overhead]) -> tuple[list[str], dict]:
    """One line per expressed row, and the |errors| the medians are taken over."""
    lines = [f"{'row':52s} {'set':4s} {'b':>3s} {'g':>2s} {'pub':>5s} {'kern':>6s} {'err':>7s} {'roof':>6s} "
             f"{'err':>7s}  target source (draft source)"]
    errs: dict[tuple[str, str, bool], list[float]] = {}
    for p in priced:
        pub = float(p.row.published_speedup or 1)
        preds = {s: p.speedup(s, overhead[s]) for s in SOURCES}
        raw = {s: p.speedup(s, 0.0) for s in SOURCES}
        covered = p.costs["kernels"].target_side.source == "kernels"  # medians: the rows the tables priced
        for s in SOURCES if covered else ():
            errs.setdefault((s, "fitted", p.held_out), []).append(abs(_err(preds[s], pub)))
            errs.setdefault((s, "raw", p.held_out), []).append(abs(_err(raw[s], pub)))
            if p.batch == 1 and p.row.hardware in HARDWARE_NAMES:
                errs.setdefault((s, "b1", p.held_out), []).append(abs(_err(preds[s], pub)))
        k = p.costs["kernels"].describe()
        lines.append(f"{p.row.id[:52]:52s} {'held' if p.held_out else 'fit':4s} {p.batch:3d} {p.gamma:2d} {pub:5.2f} "
                     f"{preds['kernels']:6.2f} {100 * _err(preds['kernels'], pub):+6.1f}% {preds['roofline']:6.2f} "
                     f"{100 * _err(preds['roofline'], pub):+6.1f}%  {k['target']['source']} ({k['draft']['source']})"
                     + (f"  tree topk {p.tree.topk}, {p.tree.num_draft_tokens} tokens" if p.tree else ""))
    return lines, errs


@dataclass(frozen=True)
class Validation:
    """The whole validation: its text, and per source the adopted overhead with where it came from."""

    text: str
    adopted: dict[str, FittedOverhead]


def report(rows: list[PublishedResult]) -> str:
    """The whole validation as text."""
    return validate(rows).text


def validate(rows: list[PublishedResult], table: Path = PUBLISHED_FILE) -> Validation:
    """Every row priced, the routing and the overhead model chosen on the fit rows, everything printed; the
    adopted overheads recorded with the table's SHA-256 (``table``: the file ``rows`` were read from)."""
    runs = [price_all(rows, routing) for routing in MOE_ROUTINGS]
    chosen = choose_routing(runs)
    priced, skipped = chosen.priced, chosen.skipped
    fit = [p for p in priced if not p.held_out]
    scores = {s: score_models(priced, s) for s in SOURCES}
    adopted = {s: choose_model(scores[s]) for s in SOURCES}
    overhead = {s: adopted[s].fitted for s in SOURCES}
    lines = [f"{len(rows)} published rows: {len(priced)} expressed, {len(skipped)} not; split by id hash: "
             f"{len(fit)} fit, {len(priced) - len(fit)} held out", *routing_lines(runs, chosen),
             *model_lines(priced, scores, adopted), ""]
    row_lines, errs = _row_lines(priced, overhead)
    lines += [*row_lines, ""]
    lines.append(f"medians over the {sum(p.costs['kernels'].target_side.source == 'kernels' for p in priced)} rows "
                 "the kernel tables priced (both sources on the same rows):")
    for held, name in ((False, "fit rows"), (True, "held-out rows")):
        for kind, what in (("raw", "no overhead"), ("fitted", "adopted overhead"), ("b1", "batch-1, adopted")):
            lines.append(f"median |error|, {name}, {what}: " + ", ".join(
                f"{s} {_median(errs.get((s, kind, held), []))}" for s in SOURCES))
    lines.extend(rule_evidence(priced, overhead["kernels"], chosen.routing))
    lines.extend(borrowed_lines(rows))
    lines.extend(baseline_lines(chosen))
    lines.extend(slowdown_lines(rows, priced, dict(skipped), overhead, chosen.gated))
    lines += ["", "not expressed:"] + [f"  {rid}: {why}" for rid, why in skipped]
    held_rows = [p for p in priced if p.held_out and p.costs["kernels"].target_side.source == "kernels"]
    sha = table_sha256(table)
    fitted = {s: FittedOverhead.of(s, adopted[s].model.name, overhead[s], fit_rows=len(fit),
                                   leave_one_out_error=adopted[s].leave_one_out,
                                   held_out_error=median_error(held_rows, s, overhead[s]), table_sha256=sha)
              for s in SOURCES}
    return Validation("\n".join(lines), fitted)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sim validate [--table FILE] [--write-overheads [FILE]]``: 0, or 2 with one line on a bad table."""
    p = OneLineParser(prog=PROG, description="Predict every published result from its acceptance; print errors.")
    p.add_argument("--table", type=nonempty_arg("file name"), help="published-results TOML (default: the shipped)")
    p.add_argument("--write-overheads", nargs="?", const=str(OVERHEADS_FILE), type=nonempty_arg("file name"),
                   metavar="FILE", help="write the adopted engine overheads (default: the shipped "
                   "sim/data/engine_overheads.toml, which python -m sim adds to a GPU chain's round)")
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    table = Path(args.table) if args.table else PUBLISHED_FILE
    try:
        result = validate(load_published(args.table), table)
        if args.write_overheads:
            write_overheads(Path(args.write_overheads), result.adopted)
    except (ValueError, OSError) as exc:
        print(f"{PROG}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    print(result.text)
    if args.write_overheads:
        print(f"engine overheads written to {args.write_overheads}")
    return 0
