"""Calibrate the serving simulator on a ``python -m measure serve`` run and predict loads it did not fit on.

* **The step cost** (:class:`sim.serving.LinearStepCost`) is fitted by
  non-negative least squares to the synthetic units' steps
  (``serve_step_cost.csv``: sequences × tokens per sequence × context, the
  median gap between the server's steps) and, for the prompt step and the
  request's way to the server, to the TTFT of single requests (one prompt of a
  known length, an idle server).
* **Acceptance** per draft length k comes from the real, non-synthetic
  training units' ``/metrics`` counter deltas (drafts, drafted and accepted
  tokens, accepted per position) and the requests' token counts (rounds =
  tokens − 1 − accepted): the proposal probability and conditional α_i of a
  :class:`~sim.acceptance.ProposalAcceptance` are adjusted until the simulated
  server's counters match the measured ones (the server caps a draft at the
  tokens a request has left, so the raw per-position rates understate α at
  the far positions). A k never measured takes α_i pooled over the measured k
  that reach position i (the last one repeated beyond).
* **Prediction**: every unit's exact workload (its requests' prompt lengths,
  closed-loop clients or its measured send times) is simulated on
  :func:`sim.serving.simulate_server` with llama-server's scheduler and
  ``seeds`` draws; the unit statistics (throughput, e2e p50/p95, TTFT, TPOT) are
  computed as the measurement computes them and averaged over repeats on the
  log scale, then set against the measured value and its 95% CI.

Held out by default: the middle draft length (when three or more were
measured), every other concurrency and every arrival rate; the rest trains.

Benchmark files (:mod:`calibrate.benchfiles`: GuideLLM, ``vllm bench serve``,
inference-perf) arrive as the same :class:`ServeData` without step-cost units:
the step cost then starts from the speculation-off units
(:func:`initial_step_from_units`) and is fitted to the training units alone
(:data:`UNITS_ONLY`) — or, given the deployment's model, GPU and engine, it is
the kernel-table (or roofline) forward of that model
(:class:`sim.serving.ForwardStepCost`) with only an efficiency and a per-step
overhead fitted (:func:`initial_step_from_forward`); a group run once takes its interval over its requests
(:func:`measured`); acceptance without per-request counts takes the rounds from
the units' totals, and without per-position counters an i.i.d. α
(:func:`iid_per_pos`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from calibrate.errors import HeldOutError
from measure.records import load_run
from measure.runkinds import SERVE, kind_of
from measure.serve.units import METRICS, Estimate, LoadSpec, ServeConfig, log_interval
from sim.acceptance import AcceptanceModel, PerPositionAcceptance, ProposalAcceptance
from sim.serving import (
    ClosedLoop,
    ForwardStepCost,
    round_pmf,
    LinearStepCost,
    OpenLoop,
    ServeRun,
    StepCost,
    StepLoad,
    Workload,
    llama_server,
    simulate_server,
)

#: What is validated per group (the issue's three) and what is shown besides.
JUDGED = ("throughput_tokens_per_s", "e2e_p50_ms", "e2e_p95_ms")
SHOWN = JUDGED + ("ttft_p50_ms", "tpot_p50_ms")
TARGETS_PCT = {"throughput_tokens_per_s": 5.0, "e2e_p50_ms": 10.0, "e2e_p95_ms": 15.0}
#: How ``serve_calibration.json`` ``summary`` names the fields of a :class:`calibrate.errors.HeldOutError`.
SERVE_FIELDS = {"n": "n_rows", "mape_pct": "mape_pct", "target_pct": "target_pct", "n_inside_ci": "n_inside_ci",
                "n_with_ci": "n_with_ci"}
#: Step-cost rows behind fewer steps than this are left out of the fit.
MIN_STEPS = 3


@dataclass(frozen=True)
class ServeData:
    """A serving run read back: its units (real and synthetic), requests, step costs and ``run.json``."""

    path: Path
    units: Any
    requests: Any
    steps: Any
    meta: dict

    @property
    def slots(self) -> int:
        return int(self.meta["config"]["slots"])

    @property
    def batch_tokens(self) -> int:
        return int(self.meta["config"].get("batch_tokens") or 2048)

    @property
    def new_tokens(self) -> int:
        return int(self.meta["config"]["max_new_tokens"])


def load_serve(path: str | Path, allow_incomplete: bool = False) -> ServeData:
    """Read a serving run; one-line ``ValueError`` when it is not one, is not complete, or has no real units."""
    run = load_run(path)
    if kind_of(run.meta) is not SERVE:
        raise ValueError(f"{str(path)!r} is not a serving run (written by {SERVE.command})")
    if run.status != "complete" and not allow_incomplete:
        raise ValueError(f"{str(path)!r} is {run.status}, not complete: finish it (the same command resumes) or "
                         "pass --allow-incomplete")
    units = run.table("serve_units")
    if not len(units) or not (~units["synthetic"].astype(bool)).any():
        raise ValueError(f"{str(path)!r} has no finished real (non-synthetic) units")
    return ServeData(Path(path), units, run.table("serve_requests"), run.table("serve_step_cost"), run.meta)


# -- the step cost ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepFit:
    """The fitted step cost, the request overhead (client → server queue) and how well they fit."""

    cost: LinearStepCost | ForwardStepCost
    request_overhead_ms: float
    n_steps: int
    n_ttft: int
    median_abs_residual_pct: float
    notes: tuple[str, ...] = ()
    n_units: int = 0  # real training units the cost was also fitted to (0: the synthetic step-cost units alone)
    units_median_abs_residual_pct: float | None = None


def _server_prompt_ms(ttft: Any, requests: Any) -> tuple[list[float | None], float | None]:
    """Per single-request TTFT row, the server's own prompt time (median ``timings.prompt_ms`` of the unit's
    requests of that prompt length), and the request overhead: the median of TTFT − prompt time over them
    (client, HTTP, tokenising: time the server is not computing). None where the server gave no timings."""
    if requests is None or not len(requests) or "prompt_ms" not in requests:
        return [None] * len(ttft), None
    req = requests[requests["prompt_ms"].notna() & requests["ttft_ms"].notna() & requests["error"].isna()]
    server, gaps = [], []
    for r in ttft.itertuples():
        g = req[(req["cell_id"] == r.cell_id) & (req["prompt_tokens"] == r.prompt_tokens)]
        server.append(float(g["prompt_ms"].astype(float).median()) if len(g) else None)
        gaps.extend((g["ttft_ms"].astype(float) - g["prompt_ms"].astype(float)).tolist())
    return server, (float(np.median(gaps)) if gaps else None)


@dataclass(frozen=True)
class CostRows:
    """Weighted least-squares rows of the step cost: features (the fitted cost's ``features`` order, by default
    :meth:`LinearStepCost.features`), milliseconds and weights."""

    a: np.ndarray
    y: np.ndarray
    w: np.ndarray

    @staticmethod
    def of(rows: list[tuple[float, ...]], y: list[float], w: list[float],
           n: int = len(LinearStepCost.FIELDS)) -> "CostRows":
        return CostRows(np.asarray(rows, dtype=float).reshape(-1, n), np.asarray(y, dtype=float),
                        np.asarray(w, dtype=float))

    def __add__(self, other: "CostRows") -> "CostRows":
        return CostRows(np.vstack([self.a, other.a]), np.concatenate([self.y, other.y]),
                        np.concatenate([self.w, other.w]))

    def solve(self, free: Sequence[bool]) -> np.ndarray:
        """Non-negative least squares over the ``free`` coefficients (the others held at 0)."""
        from scipy.optimize import nnls

        cols = np.flatnonzero(np.asarray(free, dtype=bool))
        theta = np.zeros(self.a.shape[1])
        theta[cols], _ = nnls(self.a[:, cols] * self.w[:, None], self.y * self.w)
        return theta

    def residual_pct(self, theta: np.ndarray) -> np.ndarray:
        return np.abs(self.a @ theta - self.y) / self.y * 100.0


def _synthetic_rows(steps: Any, requests: Any) -> tuple[CostRows, CostRows, float | None, int, int]:
    """The step-cost units' rows: (step rows, prompt rows, request overhead measured apart or None, steps behind
    the step rows, prompt rows). In a synthetic unit every slot drafts in full and emits one token."""

    if steps is None or not len(steps):
        raise ValueError("no step-cost rows: measure the run with --step-cost (synthetic-acceptance units time what "
                         "a server step costs)")
    # a group of fewer than MIN_STEPS steps is too often two slots' tokens that arrived apart, not a step
    gen = steps[steps["prompt_tokens"].isna() & steps["step_ms"].notna() & (steps["n_steps"] >= MIN_STEPS)]
    ttft = steps[steps["prompt_tokens"].notna() & (steps["seqs"] == 1) & steps["ttft_ms"].notna()]
    if len(gen) < 3 or not len(ttft):
        raise ValueError(f"too few step-cost rows to fit ({len(gen)} step rows, {len(ttft)} single-request TTFT "
                         "rows; need >= 3 and >= 1): add --step-cost-concurrency 1 and more step-cost units")
    server_ms, overhead_ms = _server_prompt_ms(ttft, requests)
    measured_apart = overhead_ms is not None and all(v is not None for v in server_ms)
    rows, y, w = [], [], []
    for r in gen.itertuples():
        t, ctx, s = int(r.tokens_per_seq), float(r.context_tokens), int(r.seqs)
        load = StepLoad(s, s * t, t - 1, s * ctx, s * t * (ctx + 0.5 * (t + 1)), 0, 0, s)
        rows.append(LinearStepCost.features(load))
        y.append(float(r.step_ms))
        w.append(math.sqrt(float(r.n_steps)))
    prows, py, pw = [], [], []
    for r, srv in zip(ttft.itertuples(), server_ms):
        p = int(r.prompt_tokens)
        prows.append(LinearStepCost.features(StepLoad(0, p, 0, 0.0, 0.5 * p * (p + 1), p, 1)))
        py.append(float(srv) if measured_apart and srv is not None else float(r.ttft_ms))
        pw.append(math.sqrt(max(float(r.n_steps), 1.0)) * 2.0)  # few rows: weighted up so they are fitted
    return (CostRows.of(rows, y, w), CostRows.of(prows, py, pw), overhead_ms if measured_apart else None,
            int(gen["n_steps"].sum()), len(ttft))


def _linear_cost(theta: np.ndarray, source: str) -> LinearStepCost:
    """The linear step cost of coefficients ``theta`` (in :attr:`LinearStepCost.FIELDS` order)."""
    return LinearStepCost(**dict(zip(LinearStepCost.FIELDS, (float(v) for v in theta))), metadata={"source": source})


#: Coefficients only the real (non-synthetic) units can tell apart: the synthetic units emit one token a slot
#: (acceptance forced to 0), so what an accepted token costs does not show there.
REAL_ONLY = ("per_accepted_ms",)


def fit_step_cost(steps: Any, requests: Any = None) -> StepFit:
    """NNLS of the synthetic units' step medians (weights: steps behind each) and single-request prompt steps.

    With the server's own prompt times (``requests``' ``prompt_ms``, llama-server's ``timings``) the prompt
    rows are those times and the request overhead is measured apart (TTFT − prompt time); without them, the
    TTFTs with the overhead as one more unknown (which then also takes any fixed part of the prompt step).
    Only the coefficients of :attr:`LinearStepCost.FIELDS` the synthetic units can show are fitted
    (:data:`REAL_ONLY` stay 0): :func:`fit_step_cost_on_units` adds the real training units.
    """
    from scipy.optimize import nnls

    step_rows, prompt_rows, overhead_ms, n_steps, n_ttft = _synthetic_rows(steps, requests)
    free = [f not in REAL_ONLY for f in LinearStepCost.FIELDS]
    both = step_rows + prompt_rows
    if overhead_ms is None:  # the overhead as one more unknown of the prompt rows
        a = np.hstack([both.a[:, free], np.r_[np.zeros(len(step_rows.y)), np.ones(len(prompt_rows.y))][:, None]])
        sol, _ = nnls(a * both.w[:, None], both.y * both.w)
        theta = np.zeros(len(free))
        theta[np.flatnonzero(free)] = sol[:-1]
        overhead, resid = float(sol[-1]), np.abs(a @ sol - both.y) / both.y * 100.0
    else:
        theta = both.solve(free)
        overhead, resid = max(float(overhead_ms), 0.0), both.residual_pct(theta)
    cost = _linear_cost(theta, "calibrate serve: NNLS on serve_step_cost.csv")
    notes = []
    if cost.per_token_ms == 0.0:
        notes.append("the fit found no cost per verified token: the step-cost units did not vary k enough")
    if overhead_ms is not None:
        notes.append(f"request overhead measured apart: median TTFT − server prompt time = {overhead:.1f} ms")
    return StepFit(cost, overhead, n_steps, n_ttft, float(np.median(resid)), tuple(notes))


class _Recorder:
    """A :class:`~sim.serving.StepCost` that prices steps with ``cost`` and keeps each step's features (``cost``'s
    own: :meth:`LinearStepCost.features` or :meth:`ForwardStepCost.features`)."""

    uses_max_draft = False

    def __init__(self, cost: LinearStepCost | ForwardStepCost) -> None:
        self.cost = cost
        self.features: list[tuple[float, ...]] = []
        self.seqs: list[int] = []

    def step_ms(self, seqs: int, tokens: int, max_draft: int, ctx_sum: float, attn: float, prompt_tokens: int,
                prompt_seqs: int, emitted: int = 0) -> float:
        load = StepLoad(seqs, tokens, max_draft, ctx_sum, attn, prompt_tokens, prompt_seqs, emitted)
        self.features.append(self.cost.features(load))
        self.seqs.append(seqs)
        return self.cost.step_ms(seqs, tokens, max_draft, ctx_sum, attn, prompt_tokens, prompt_seqs, emitted)

    def describe(self) -> dict:
        return {"kind": "recorder", "cost": self.cost.describe()}


def _unit_rows(model: "Model", data: ServeData, units: Any, seeds: int, seed: int) -> CostRows:
    """Two rows per real unit, each the mean step of the unit's exact workload simulated ``seeds`` times with the
    model as it stands (which steps, what in each: the composition; the step cost is what is fitted):

    * the server's busy time: Σ over steps of the step's features against the measured duration less the
      simulated idle time (the time no request was in the server), per step;
    * the requests' generation time: Σ over steps of generating slots × features against Σ over requests of
      (last − first token), per slot-step.

    Single-request prompt steps of concurrency-1 units (the server's own ``prompt_ms``) are rows too."""
    from measure.serve.units import UnitId

    rows, y, w = [], [], []
    cost = model.step.cost
    for u in units.itertuples():
        req = data.requests[(data.requests["cell_id"] == u.cell_id) & data.requests["error"].isna()]
        if not len(req):
            continue
        uid = UnitId.parse(u.cell_id)
        busy = np.zeros(len(cost.FIELDS))
        gen = np.zeros_like(busy)
        idle = n_steps = n_slot_steps = 0.0
        for i in range(seeds):
            rec = _Recorder(cost)
            run = model.run_unit(data, u.cell_id, seed + i, cost=rec)
            f, sq = np.asarray(rec.features), np.asarray(rec.seqs, dtype=float)
            busy += f.sum(axis=0) / seeds
            gen += (sq[:, None] * f).sum(axis=0) / seeds
            idle += (float(run.finish_ms.max() - run.send_ms.min()) - float(run.step_ms.sum())) / seeds
            n_steps += len(sq) / seeds
            n_slot_steps += float(sq.sum()) / seeds
        busy_ms = float(u.duration_s) * 1000.0 - idle
        gen_ms = float((req["e2e_ms"].astype(float) - req["ttft_ms"].astype(float)).sum())
        if n_steps > 0 and busy_ms > 0:
            rows.append(tuple(busy / n_steps))
            y.append(busy_ms / n_steps)
            w.append(math.sqrt(n_steps))
        if n_slot_steps > 0 and gen_ms > 0:
            rows.append(tuple(gen / n_slot_steps))
            y.append(gen_ms / n_slot_steps)
            w.append(math.sqrt(n_slot_steps))
        if uid.load.closed and uid.load.concurrency == 1 and "prompt_ms" in req:
            timed = req["prompt_ms"].notna()
            # without the server's own prompt times (a benchmark file), the TTFT: the prompt step plus the way
            # to the server, which the per-step overhead then takes
            col = "prompt_ms" if timed.any() else "ttft_ms"
            for r in req[req[col].notna() & req["prompt_tokens"].notna()].itertuples():
                p = int(r.prompt_tokens)
                rows.append(cost.features(StepLoad(0, p, 0, 0.0, 0.5 * p * (p + 1), p, 1)))
                y.append(float(getattr(r, col)))
                w.append(2.0)
    return CostRows.of(rows, y, w, len(cost.FIELDS))


#: The coefficients fitted where no step-cost units were measured (benchmark files): a per-step overhead and
#: the costs per sequence, verified token, prompt token and accepted token; attention work stays at 0 (the
#: real units' contexts vary too little to tell it from the per-token cost).
UNITS_ONLY = ("base_ms", "per_seq_ms", "per_token_ms", "per_prompt_token_ms", "per_accepted_ms")


def has_step_units(data: ServeData) -> bool:
    """Whether ``data`` has synthetic step-cost units (``measure serve --step-cost``)."""
    return data.steps is not None and len(data.steps) > 0


def _off_lowest(data: ServeData, train_units: Any) -> tuple[float, float, float]:
    """The median TPOT, prompt tokens and TTFT of the speculation-off training units at their lowest concurrency
    (a TPOT of 10 ms where none was recorded, no prompt where none was counted)."""
    off = train_units[(train_units["spec_k"] == 0) & train_units["concurrency"].notna()]
    if not len(off):
        raise ValueError("no speculation-off training unit at a concurrency: hold out fewer loads")
    low = off[off["concurrency"] == off["concurrency"].min()]
    req = data.requests[data.requests["cell_id"].isin(set(low["cell_id"])) & data.requests["error"].isna()]
    tpot = float(np.nanmedian(req["tpot_ms"].astype(float))) if req["tpot_ms"].notna().any() else 10.0
    prompt = float(np.nanmedian(req["prompt_tokens"].astype(float))) if req["prompt_tokens"].notna().any() else 0.0
    return tpot, prompt, float(np.nanmedian(req["ttft_ms"].astype(float)))


def initial_step_from_units(data: ServeData, train_units: Any) -> StepFit:
    """A starting step cost from the training units alone (no step-cost units): the median TPOT of the
    speculation-off units at the lowest concurrency per step, their median TTFT over the median prompt per
    prompt token; :func:`fit_step_cost_on_units` then fits it to every training unit."""
    tpot, prompt, ttft = _off_lowest(data, train_units)
    per_prompt = max(ttft - tpot, 0.0) / prompt if prompt > 0 else 0.0
    cost = LinearStepCost(max(tpot, 1e-3), per_prompt_token_ms=per_prompt,
                          metadata={"source": "calibrate serve: start from the speculation-off units"})
    return StepFit(cost, 0.0, 0, 0, math.nan, ("no step-cost units (benchmark files): the step cost is fitted to "
                                                "the training units alone; the request overhead is part of the "
                                                "prompt step",))


def initial_step_from_forward(data: ServeData, train_units: Any, start: ForwardStepCost) -> StepFit:
    """A starting step cost from a forward (the kernel tables or the roofline of the deployment's model, GPU and
    engine): no overhead, and the efficiency that makes one sequence's step at its mean context (median prompt +
    half the tokens) the median TPOT of the speculation-off units at the lowest concurrency;
    :func:`fit_step_cost_on_units` then fits the efficiency and the overhead to every training unit."""
    tpot, prompt, _ = _off_lowest(data, train_units)
    forward_ms = start.generating_ms(1, 1.0, prompt + data.new_tokens / 2)
    cost = start.fitted(max(tpot, 1e-3) / forward_ms if forward_ms > 0 else 1.0, 0.0,
                        {"source": "calibrate serve: start from the forward, scaled to the speculation-off TPOT"})
    return StepFit(cost, 0.0, 0, 0, math.nan, (f"no step-cost units (benchmark files): the step cost is the "
                                                f"{start.source_line()} forward, its efficiency and a per-step "
                                                "overhead fitted to the training units; the request overhead is "
                                                "part of the prompt step",))


def fit_step_cost_on_units(model: "Model", data: ServeData, train_units: Any, iterations: int = 3, seeds: int = 4,
                           seed: int = 0) -> StepFit:
    """The step cost refitted to the real training units as well as the synthetic ones (every coefficient free).

    The synthetic units time steps that always draft in full and emit one token a slot; the real server's steps
    mix slots with and without drafts, emit every accepted token (each sampled and streamed) and pass the
    speculation hooks even when nothing drafts. The training units' own times (their busy time and their
    requests' generation times, :func:`_unit_rows`) show what those cost: the composition comes from simulating
    each unit with the model as it stands, so the fit is repeated ``iterations`` times. ``train_units`` must
    hold training units only: nothing else of ``data`` enters the fit but the step-cost units. A
    :class:`~sim.serving.ForwardStepCost` keeps its forward: NNLS over its two columns (efficiency, overhead)."""
    start = model.step.cost
    if isinstance(start, ForwardStepCost):  # the forward is kept; its efficiency and overhead are fitted
        synth, free = CostRows.of([], [], [], len(start.FIELDS)), [True] * len(start.FIELDS)
    elif has_step_units(data):
        synth_steps, synth_prompts, _, _, _ = _synthetic_rows(data.steps, data.requests)
        synth, free = synth_steps + synth_prompts, [True] * len(LinearStepCost.FIELDS)
    else:
        synth, free = CostRows.of([], [], []), [f in UNITS_ONLY for f in LinearStepCost.FIELDS]
    step = model.step
    for it in range(iterations):
        real = _unit_rows(model, data, train_units, seeds, seed + 1000 * it)
        rows = synth + real
        theta = rows.solve(free)
        cost = _refitted(start, theta, has_step_units(data))
        resid = real.residual_pct(theta)
        step = StepFit(cost, step.request_overhead_ms, step.n_steps, step.n_ttft,
                       float(np.median(rows.residual_pct(theta))), model.step.notes, len(train_units),
                       float(np.median(resid)) if resid.size else None)
        model = Model(step, model.acceptance, model.slots, model.batch_tokens, model.new_tokens, model.prompt_scales)
    return step


def _refitted(start: LinearStepCost | ForwardStepCost, theta: np.ndarray,
              step_units: bool) -> LinearStepCost | ForwardStepCost:
    """The step cost of coefficients ``theta`` (NNLS over ``start``'s features), with where they were fitted."""
    if isinstance(start, ForwardStepCost):
        return start.fitted(float(theta[0]), float(theta[1]), {
            "source": "calibrate serve: NNLS of efficiency and overhead_ms on the real training units"})
    src = "serve_step_cost.csv and the real training units" if step_units else \
        f"the real training units alone ({', '.join(UNITS_ONLY)} free)"
    return _linear_cost(theta, f"calibrate serve: NNLS on {src}")


# -- acceptance -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Counters:
    """What the server counted over some units of one k: rounds, drafts, drafted and accepted per position."""

    k: int
    rounds: int
    drafts: int
    draft_tokens: int
    accepted_per_pos: tuple[int, ...]

    @property
    def accepted(self) -> int:
        return int(sum(self.accepted_per_pos))


def counters_of(units: Any, requests: Any, k: int) -> Counters | None:
    """Pooled counters of the given (real) units of draft length ``k``; None without /metrics counters."""
    u = units[(units["spec_k"] == k) & units["metrics"].astype(bool) & units["drafts"].notna()]
    if not len(u):
        return None
    req = requests[requests["cell_id"].isin(set(u["cell_id"])) & requests["error"].isna()]
    if req["draft_n_accepted"].notna().any():
        rounds = int((req["completion_tokens"] - 1 - req["draft_n_accepted"].fillna(0)).sum())
    else:  # no per-request counts (a benchmark file): the units' accepted total
        rounds = int((req["completion_tokens"] - 1).sum()) - int(u["accepted_tokens"].fillna(0).sum())
    pos = np.zeros(k, dtype=np.int64)
    for text in u["accepted_per_pos"].dropna():
        vals = [int(x) for x in str(text).split()][:k]
        pos[: len(vals)] += vals
    drafts = int(u["drafts"].sum())
    if not pos.any() and drafts and u["accepted_tokens"].fillna(0).sum() > 0:
        pos = iid_per_pos(drafts, int(u["accepted_tokens"].sum()), k)
    return Counters(k, rounds, drafts, int(u["draft_tokens"].sum()), tuple(int(v) for v in pos))


def iid_per_pos(drafts: int, accepted: int, k: int) -> np.ndarray:
    """Accepted per position when only the totals are known (a server or file without per-position
    counters): the i.i.d. α whose mean accepted per draft is ``accepted / drafts``, drafts × α^i."""
    from calibrate.ingest.normalise import iid_alpha_from_tau

    a = iid_alpha_from_tau(min(1.0 + accepted / drafts, k + 1.0), k)
    return np.array([round(drafts * a ** (i + 1)) for i in range(k)], dtype=np.int64)


def simulate_counters(acc: AcceptanceModel, k: int, new_tokens: int, n_requests: int,
                      rng: np.random.Generator) -> Counters:
    """What llama-server would count for ``n_requests`` requests of ``new_tokens`` drafting with ``acc`` at ``k``:
    the prompt step gives the first token, every draft is capped at the tokens left minus one.

    Rounds are drawn at once from the joint (drafted, accepted) distribution; a request takes them in turn,
    whole while its budget is far, one by one (capped) in its last ``k`` tokens."""
    pmf = round_pmf(acc, k)
    d_of, a_of = np.nonzero(pmf > 0)
    cdf = np.cumsum(pmf[d_of, a_of])
    cdf[-1] = 1.0
    budget = new_tokens - 1
    n_draw = int(n_requests * budget / max(float((pmf * (np.arange(k + 1)[None, :] + 1)).sum()), 1.0) * 1.3) + 64
    idx = np.searchsorted(cdf, rng.random(n_draw), side="right")
    d, a = d_of[idx], a_of[idx]
    cum = np.cumsum(a + 1)
    rounds = drafts = drafted = 0
    pos = np.zeros(k + 2, dtype=np.int64)  # histogram of accepted lengths
    p = 0
    for _ in range(n_requests):
        base = int(cum[p - 1]) if p else 0
        stop = int(np.searchsorted(cum, base + budget - k, side="left"))  # rounds that cannot meet the cap
        stop = min(max(stop, p), n_draw)
        if stop > p:
            dd, aa = d[p:stop], a[p:stop]
            rounds += stop - p
            drafts += int(np.count_nonzero(dd))
            drafted += int(dd.sum())
            pos += np.bincount(aa, minlength=k + 2)[: k + 2]
            left = budget - (int(cum[stop - 1]) - base)
            p = stop
        else:
            left = budget
        while left > 0:  # the last rounds: drafts capped at the tokens left minus one
            if p >= n_draw:
                i = int(np.searchsorted(cdf, rng.random(), side="right"))
                di, ai = int(d_of[i]), int(a_of[i])
            else:
                di, ai = int(d[p]), int(a[p])
                p += 1
            di = min(di, left - 1)
            ai = min(ai, di)
            rounds += 1
            if di:
                drafts += 1
                drafted += di
            pos[ai] += 1
            left -= ai + 1
    ge = np.cumsum(pos[::-1])[::-1]  # drafts with at least j accepted, j = 0..
    return Counters(k, rounds, drafts, drafted, tuple(int(ge[j]) for j in range(1, k + 1)))


def fit_acceptance(c: Counters, new_tokens: int, iterations: int = 6, n_requests: int = 400,
                   seed: int = 0) -> ProposalAcceptance:
    """The proposal probability and α_1..α_k whose simulated counters match ``c`` (multiplicative updates)."""
    if c.drafts == 0 or c.rounds == 0:
        raise ValueError(f"k={c.k}: the server drafted nothing in the training units (no n-gram matches?)")
    target_p = c.drafts / c.rounds
    target_r = np.asarray(c.accepted_per_pos, dtype=float) / c.drafts

    def conditional(r: np.ndarray) -> np.ndarray:
        prev = np.concatenate([[1.0], r[:-1]])
        return np.clip(np.divide(r, prev, out=np.zeros_like(r), where=prev > 0), 1e-4, 1.0 - 1e-9)

    p, alphas = min(target_p, 1.0), conditional(target_r)
    for it in range(iterations):
        model = ProposalAcceptance(float(min(max(p, 1e-6), 1.0)), PerPositionAcceptance(tuple(alphas)))
        sim = simulate_counters(model, c.k, new_tokens, n_requests, np.random.default_rng(seed + it))
        sim_p = sim.drafts / max(sim.rounds, 1)
        sim_r = np.asarray(sim.accepted_per_pos, dtype=float) / max(sim.drafts, 1)
        p = p * target_p / max(sim_p, 1e-9)
        alphas = np.clip(alphas * conditional(target_r) / conditional(np.maximum(sim_r, 1e-9)), 1e-4, 1.0 - 1e-9)
    return ProposalAcceptance(float(min(max(p, 1e-6), 1.0)), PerPositionAcceptance(tuple(float(a) for a in alphas)))


@dataclass(frozen=True)
class PromptScale:
    """One prompt's acceptance against its draft length's pooled model: the proposal probability times
    ``p_ratio`` and every α_i times ``alpha_scale`` (capped below 1). Code repeats more than conversation;
    one pooled model gives every request the same rounds and so too little spread of their latencies."""

    p_ratio: float = 1.0
    alpha_scale: float = 1.0

    def apply(self, acc: ProposalAcceptance) -> ProposalAcceptance:
        if self == PromptScale() or not isinstance(acc.inner, PerPositionAcceptance):
            return acc
        return ProposalAcceptance(float(min(max(acc.p_propose * self.p_ratio, 1e-4), 1.0)),
                                  PerPositionAcceptance(tuple(min(a * self.alpha_scale, 0.995) for a in acc.inner.alphas)))


def _bisect(f, lo: float, hi: float, target: float, steps: int = 14) -> float:
    """x in [lo, hi] with f(x) ≈ target for an increasing f (log-scale bisection; the bound when out of reach)."""
    if f(lo) >= target:
        return lo
    if f(hi) <= target:
        return hi
    for _ in range(steps):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
    return math.sqrt(lo * hi)


def fit_prompt_scale(pooled: ProposalAcceptance, k: int, new_tokens: int, rounds: int, drafted: int, accepted: int,
                     n_requests: int = 150, seed: int = 0) -> PromptScale:
    """The scale whose simulated requests draft per round and accept per drafted token what this prompt's
    requests did (the server's per-request ``timings``: ``draft_n``, ``draft_n_accepted``): two bisections
    on common random numbers, the proposal ratio first, then the α scale, twice."""
    if rounds <= 0:
        return PromptScale()
    if drafted == 0:
        return PromptScale(0.01, 1.0)

    def counters(sc: PromptScale) -> Counters:
        return simulate_counters(sc.apply(pooled), k, new_tokens, n_requests, np.random.default_rng(seed))

    sc = PromptScale()
    p_hi = 1.0 / max(pooled.p_propose, 1e-4)
    for _ in range(2):
        a_scale = sc.alpha_scale
        p = _bisect(lambda x: (lambda c: c.draft_tokens / max(c.rounds, 1))(counters(PromptScale(x, a_scale))),
                    0.01, p_hi, drafted / rounds)
        a = _bisect(lambda x: (lambda c: c.accepted / max(c.draft_tokens, 1))(counters(PromptScale(p, x))),
                    0.02, 5.0, accepted / drafted)
        sc = PromptScale(p, a)
    return sc


def prompt_scales(requests: Any, units: Any, acceptance: dict[int, ProposalAcceptance], new_tokens: int,
                  seed: int = 0) -> dict[str, PromptScale]:
    """Per prompt id, the scale fitted on its requests in ``units`` (speculative, with the server's per-request
    counts), averaged over the draft lengths weighted by rounds."""
    spec = units[(units["spec_k"] > 0)]
    req = requests[requests["cell_id"].isin(set(spec["cell_id"])) & requests["error"].isna()
                   & requests["draft_n"].notna()].merge(spec[["cell_id", "spec_k"]], on="cell_id")
    out: dict[str, PromptScale] = {}
    for pid, g in req.groupby("prompt_id"):
        num_p = num_a = den = 0.0
        for k, gk in g.groupby("spec_k"):
            if int(k) not in acceptance:
                continue
            acc = gk["draft_n_accepted"].fillna(0)
            rounds = int((gk["completion_tokens"] - 1 - acc).sum())
            sc = fit_prompt_scale(acceptance[int(k)], int(k), new_tokens, rounds, int(gk["draft_n"].sum()),
                                  int(acc.sum()), seed=seed)
            num_p += sc.p_ratio * rounds
            num_a += sc.alpha_scale * rounds
            den += rounds
        if den > 0:
            out[str(pid)] = PromptScale(num_p / den, num_a / den)
    return out


def pooled_acceptance(fits: dict[int, ProposalAcceptance], weights: dict[int, Counters], k: int) -> ProposalAcceptance:
    """Acceptance at a draft length not trained on: α_i pooled over the fitted k reaching position i (weights: the
    drafts that got there), the last one repeated beyond; the proposal probability pooled by rounds."""
    if not fits:
        raise ValueError(f"no draft length was trained on, so k={k} cannot be predicted")
    alphas: list[float] = []
    for i in range(k):
        num = den = 0.0
        for kk, fit in fits.items():
            inner = fit.inner
            if i < kk and isinstance(inner, PerPositionAcceptance):
                reach = weights[kk].drafts * (1.0 if i == 0 else weights[kk].accepted_per_pos[i - 1]
                                              / max(weights[kk].drafts, 1))
                num += reach * inner.alphas[i]
                den += reach
        alphas.append(num / den if den > 0 else alphas[-1])
    p = sum(f.p_propose * weights[kk].rounds for kk, f in fits.items()) / sum(weights[kk].rounds for kk in fits)
    return ProposalAcceptance(float(p), PerPositionAcceptance(tuple(alphas)))


# -- prediction -------------------------------------------------------------------------------------------------
def unit_stats(run: ServeRun) -> dict[str, float]:
    """A simulated unit's statistics, computed as ``measure serve`` computes a measured unit's."""
    tokens = float(run.tokens.sum())
    dur = float(run.finish_ms.max() - run.send_ms.min())
    e2e, ttft, tpot = run.e2e_ms, run.ttft_ms, run.tpot_ms
    return {"throughput_tokens_per_s": tokens / dur * 1000.0, "e2e_p50_ms": float(np.percentile(e2e, 50)),
            "e2e_p95_ms": float(np.percentile(e2e, 95)), "ttft_p50_ms": float(np.percentile(ttft, 50)),
            "tpot_p50_ms": float(np.percentile(tpot, 50)) if tpot.size else math.nan}


@dataclass(frozen=True)
class Model:
    """Everything a prediction needs: the step cost, the request overhead, acceptance per k, the server."""

    step: StepFit
    acceptance: dict[int, ProposalAcceptance]
    slots: int
    batch_tokens: int
    new_tokens: int
    prompt_scales: dict = field(default_factory=dict)

    def run(self, config: ServeConfig, load: LoadSpec, prompt_tokens: Sequence[int], n_requests: int,
            send_ms: Sequence[float] | None, seed: int, prompt_ids: Sequence[str] | None = None,
            cost: StepCost | None = None) -> ServeRun:
        """One simulated unit (``cost``: another step cost, e.g. one that records the steps)."""
        wl = Workload(n_requests, self.new_tokens, ClosedLoop(load.concurrency) if load.closed
                      else OpenLoop(load.rate_per_s), prompt_tokens=list(prompt_tokens),
                      request_overhead_ms=self.step.request_overhead_ms,
                      arrivals_ms=None if load.closed or send_ms is None else list(send_ms))
        acc: Any = self.acceptance[config.k] if config.speculative else None
        if acc is not None and prompt_ids is not None and self.prompt_scales:
            acc = [self.prompt_scales.get(str(pid), PromptScale()).apply(acc) for pid in prompt_ids]
        return simulate_server(wl, llama_server(self.slots, self.batch_tokens), cost or self.step.cost, acc,
                               f"fixed:{config.k}" if config.speculative else None, seed=seed)

    def simulate(self, config: ServeConfig, load: LoadSpec, prompt_tokens: Sequence[int], n_requests: int,
                 send_ms: Sequence[float] | None, seed: int,
                 prompt_ids: Sequence[str] | None = None) -> dict[str, float]:
        return unit_stats(self.run(config, load, prompt_tokens, n_requests, send_ms, seed, prompt_ids))

    def run_unit(self, data: ServeData, cell_id: str, seed: int, cost: StepCost | None = None) -> ServeRun:
        """One simulation of a measured unit's exact workload: its requests' prompts, its load, its send times."""
        from measure.serve.units import UnitId

        uid = UnitId.parse(cell_id)
        req = data.requests[data.requests["cell_id"] == cell_id].sort_values("request_index")
        prompts = [int(p) if p == p else 0 for p in req["prompt_tokens"]]
        ids = [str(p) for p in req["prompt_id"]]
        send = (req["send_s"].astype(float) * 1000.0).tolist()
        send = [s - send[0] for s in send] if send else None
        return self.run(uid.config, uid.load, prompts, len(req), send, seed, ids, cost)


def predict_unit(model: Model, data: ServeData, cell_id: str, seeds: int, seed: int) -> dict[str, float]:
    """The mean over ``seeds`` simulations of one measured unit's exact workload (log scale for positives)."""
    out: dict[str, list[float]] = {}
    for i in range(seeds):
        for k, v in unit_stats(model.run_unit(data, cell_id, seed + i)).items():
            out.setdefault(k, []).append(v)
    return {k: float(np.exp(np.mean(np.log(v)))) if all(x > 0 for x in v) else float(np.mean(v))
            for k, v in out.items()}


@dataclass(frozen=True)
class Split:
    """Which draft lengths and loads train the model; the rest are held out."""

    train_k: tuple[int, ...]
    test_k: tuple[int, ...]
    train_loads: tuple[str, ...]
    test_loads: tuple[str, ...]

    def is_train(self, k: int, load: str) -> bool:
        return (k == 0 or k in self.train_k) and load in self.train_loads


def default_split(units: Any, holdout_k: Sequence[int] | None = None,
                  holdout_loads: Sequence[str] | None = None) -> Split:
    """The middle k (of three or more) and every other concurrency plus every rate held out, unless given."""
    real = units[~units["synthetic"].astype(bool)]
    ks = sorted(int(k) for k in real["spec_k"].unique() if k > 0)
    loads = list(dict.fromkeys(real["load"]))
    specs = {ld: LoadSpec.parse(ld) for ld in loads}
    conc = sorted((ld for ld in loads if specs[ld].closed), key=lambda ld: specs[ld].concurrency)
    rates = [ld for ld in loads if not specs[ld].closed]
    test_k = tuple(holdout_k) if holdout_k is not None else ((ks[len(ks) // 2],) if len(ks) >= 3 else ())
    test_loads = tuple(holdout_loads) if holdout_loads is not None else tuple(conc[1::2] + rates)
    unknown = [ld for ld in test_loads if ld not in loads]
    if unknown:
        raise ValueError(f"--holdout-loads {','.join(unknown)}: not measured; measured loads: {', '.join(loads)}")
    bad_k = [k for k in test_k if k not in ks]
    if bad_k:
        raise ValueError(f"--holdout-k {','.join(map(str, bad_k))}: not measured; measured k: "
                         f"{', '.join(map(str, ks))}")
    train_k = tuple(k for k in ks if k not in test_k)
    train_loads = tuple(ld for ld in loads if ld not in test_loads)
    if not train_loads:
        raise ValueError("every load is held out: nothing left to train on")
    if ks and not train_k:
        raise ValueError("every draft length is held out: acceptance cannot be fitted")
    return Split(tuple(k for k in ks if k not in test_k), test_k, train_loads, test_loads)


@dataclass(frozen=True)
class ServeCalibration:
    """A calibrated serving model and its predictions against every measured group."""

    model: Model
    split: Split
    rows: list[dict]
    counters: dict[int, Counters]
    notes: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        """MAPE, share inside the measured CIs and the targets, per metric, over the held-out groups."""
        out: dict[str, Any] = {}
        held = [r for r in self.rows if r["split"] == "held-out"]
        for m in JUDGED:
            rs = [r for r in held if r["metric"] == m and r["predicted"] is not None and r["measured"]]
            err = HeldOutError.of(m, [r["ape_pct"] for r in rs], [r["inside_ci"] for r in rs], TARGETS_PCT[m])
            out[m] = err.as_dict(SERVE_FIELDS)
        allin = [r["inside_ci"] for r in held if r["metric"] in JUDGED and r["inside_ci"] is not None]
        out["share_inside_ci"] = float(np.mean(allin)) if allin else None
        return out


def training_units(data: ServeData, split: Split) -> Any:
    """The real units ``split`` trains on: its training k (and speculation off) at its training loads."""
    real = data.units[~data.units["synthetic"].astype(bool)]
    return real[[split.is_train(int(k), ld) for k, ld in zip(real["spec_k"], real["load"])]]


def fit_serve_model(data: ServeData, split: Split, seed: int = 0, refit: bool = True,
                    start: ForwardStepCost | None = None) -> tuple[Model, dict[int, Counters], list[str]]:
    """The model fitted on the step-cost units and the training units of ``split`` (nothing of a held-out unit
    enters it): the model, the training counters per k, and notes.

    ``refit=False``: the step cost from the step-cost units alone (:func:`fit_step_cost`), as before the real
    training units were fitted to as well (:func:`fit_step_cost_on_units`). ``start``: benchmark files only,
    the step cost is that forward (kernel tables or roofline) with its efficiency and overhead fitted
    (:func:`initial_step_from_forward`)."""
    real_units = data.units[~data.units["synthetic"].astype(bool)]
    train_units = training_units(data, split)
    if start is not None:
        if has_step_units(data):
            raise ValueError("a step cost from the kernel tables or roofline (--hardware) is for benchmark files; "
                             "a measure serve run with step-cost units fits its own")
        step, refit = initial_step_from_forward(data, train_units, start), True
    elif has_step_units(data):
        step = fit_step_cost(data.steps, data.requests)
    else:
        step, refit = initial_step_from_units(data, train_units), True
    counters, fits = {}, {}
    notes = list(step.notes)
    never: dict[int, ProposalAcceptance] = {}
    for k in split.train_k:
        c = counters_of(train_units, data.requests, k)
        if c is None:
            notes.append(f"k={k}: no /metrics counters in its training units: acceptance unavailable")
            continue
        if c.drafts == 0:  # e.g. llama.cpp's ngram-simple with k < n: copy_max < size_n, no draft at all
            never[k] = ProposalAcceptance(0.0, PerPositionAcceptance((0.0,) * k))
            notes.append(f"k={k}: the server never drafted in {c.rounds} rounds (llama.cpp's ngram-simple drafts "
                         "nothing when k is below the lookup n-gram): simulated as never proposing")
            continue
        counters[k], fits[k] = c, fit_acceptance(c, data.new_tokens, seed=seed)
    acceptance = {**never, **fits}
    n_lookup = max([int(n) for n in real_units["spec_ngram_n"] if n > 0] or [0])
    for k in sorted({int(k) for k in real_units["spec_k"] if k > 0} - set(acceptance)):
        if k < n_lookup:
            acceptance[k] = ProposalAcceptance(0.0, PerPositionAcceptance((0.0,) * k))
            notes.append(f"k={k} never trained on and below the lookup n-gram ({n_lookup}): never proposing")
            continue
        acceptance[k] = pooled_acceptance(fits, counters, k)
        notes.append(f"k={k} never trained on: alpha_i pooled over k = {', '.join(map(str, sorted(fits)))}")
    scales = prompt_scales(data.requests, train_units, fits, data.new_tokens, seed=seed)  # drafting k only
    model = Model(step, acceptance, data.slots, data.batch_tokens, data.new_tokens, scales)
    if refit:
        step = fit_step_cost_on_units(model, data, train_units, seed=seed)
        model = Model(step, acceptance, data.slots, data.batch_tokens, data.new_tokens, scales)
        besides = " besides the step-cost units" if has_step_units(data) else ""
        notes.append(f"step cost {'refitted' if besides else 'fitted'} to the {step.n_units} real training units"
                     f"{besides} (median residual {step.units_median_abs_residual_pct:.1f}% on their rows)")
    return model, counters, notes


def measured(g: Any, metric: str) -> Estimate:
    """A group's measured value with its 95% CI over repeats; a group run once (a benchmark file) takes the
    interval over its requests where the unit has one (``<metric>_lo``/``_hi``)."""
    meas = log_interval(g[metric].tolist())
    lo_col, hi_col = f"{metric}_lo", f"{metric}_hi"
    if len(g) == 1 and lo_col in g and hi_col in g:
        lo, hi = g[lo_col].iloc[0], g[hi_col].iloc[0]
        if lo == lo and hi == hi and lo is not None and hi is not None:
            return Estimate(meas.value, float(lo), float(hi), "over the requests of one run")
    return meas


def calibrate_serve(data: ServeData, split: Split, seeds: int = 8, seed: int = 0, refit: bool = True,
                    start: ForwardStepCost | None = None) -> ServeCalibration:
    """Fit on the training part of ``data`` (:func:`fit_serve_model`, ``start``: a forward to start the step cost
    from); predict every real group (training and held out) from its units' exact workloads."""
    model, counters, notes = fit_serve_model(data, split, seed, refit, start)
    acceptance = model.acceptance
    real_units = data.units[~data.units["synthetic"].astype(bool)]
    rows = []
    for (config, load), g in real_units.groupby(["config", "load"], sort=False):
        cfg = ServeConfig.parse(config)
        if cfg.speculative and cfg.k not in acceptance:
            continue
        preds = [predict_unit(model, data, cid, seeds, seed) for cid in g["cell_id"]]
        split_name = "train" if split.is_train(cfg.k, load) else "held-out"
        for m in SHOWN:
            meas = measured(g, m)
            vals = [p[m] for p in preds if p.get(m) is not None and p[m] == p[m] and p[m] > 0]
            pred = float(np.exp(np.mean(np.log(vals)))) if vals else None
            ape = abs(pred / meas.value - 1.0) * 100.0 if pred is not None and meas.value else None
            rows.append({"config": config, "load": load, "k": cfg.k, "split": split_name, "metric": m,
                         "measured": meas.value, "measured_lo": meas.lo, "measured_hi": meas.hi,
                         "predicted": pred, "ape_pct": ape,
                         "inside_ci": None if pred is None else meas.contains(pred), "repeats": len(g)})
    return ServeCalibration(model, split, rows, counters, notes)


def metric_names() -> tuple[str, ...]:
    """The unit metrics a serving run records (for reports)."""
    return METRICS
