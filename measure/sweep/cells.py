"""A sweep's cells: every cell of (draft [× head K], γ policy, temperature, domain) measured by the same code.

One pipeline for every cell, whatever the draft or engine (:func:`measure_cells`):

* **Interleaving and repeats.** A *visit* is one (prompt, repeat) of a
  cell: the baseline, our speculative loop and the peer (the engine's own
  speculative decoding) back to back in a rotating order (ABC, BCA, CAB, …,
  continuing across prompts and repeats). The visits of all the sweep's
  cells are interleaved (``interleave="sweep"``, the default): prompt 1 of
  repeat 1 of every cell, then prompt 2 of every cell, …, then repeat 2, so
  a cell's pairs are spread over the whole measurement, not bunched into one
  minute in which this machine may sit in a slow or fast mode for one
  forward shape (``"cell"``: one cell's visits back to back, then the next
  cell). Every mode of every cell is warmed up first; warm-ups are never
  recorded.
* **One estimator** (:mod:`measure.stats`): speedup = mean tokens/s of the
  method / mean tokens/s of the baseline over the cell's (prompt, repeat)
  pairs, with Fieller's paired 95% CI; every tokens/s has its Student-t CI.
* **Noise.** A cell whose baseline (normalised per prompt, in measured order;
  interleaved, also by the machine's pace in each pass,
  :func:`measure.stats.normalise_by_pace`) varies or drifts beyond the
  thresholds is flagged ``unstable`` with the reason in words; ``until_stable`` re-measures such a cell up to N times.
* **Records.** Each finished visit is staged on disk at once
  (``visits.partial.jsonl``, by the visit loop a tree run shares:
  :mod:`measure.sweep.visits`); a cell's rows go to its tables when its last
  visit is done (its ``cells.csv`` row last), so an interruption loses at
  most the visit that was running, and a resume measures only the missing
  visits. Every generation's token ids are saved (``generations.csv``
  ``tokens``), so losslessness and acceptance recompute from the files.

The cells reach models only through the session (:mod:`measure.sweep.session`).
The local driver (:mod:`measure.sweep.driver`) and the pruned-head K sweep
(:mod:`measure.head.head_sweep`, a pruned draft and its ``head_k``) call
:func:`measure_cells`; a Ray worker measures one cell with :func:`run_cell`.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Hashable, Iterator, Mapping, Sequence

import torch

from measure import racing, records, stats
from measure.decoding import acceptance_trace, autoregressive_generate, proposal_runs, speculative_generate
from measure.engines.lossless import judge_against_baseline
from measure.ids import CellId
from measure.prior import (CalibrationPrior, GroupRace, PriorPlan, load_prior, plan_group, prior_line,
                           prior_summary)
from measure.prompts import Prompt
from measure.rows import CellRow, GenerationRow, RoundRow, TokenLatencyRow, TraceRow
from measure.seam import Decoder, Draft, Engine, GenerationResult, PeerResult, RoundRecord, TargetModel
from measure.sweep.config import SweepConfig
from measure.sweep.session import Session
from measure.sweep.visits import read_staged, visit_all, write_unit
from measure.timing import Timer
from sim.policies import GammaSpec


@dataclass
class CellContext:
    """What every cell of a sweep shares: where it writes, the session's models and prompts, the timer."""

    writer: records.CellWriter[CellRow]
    session: Session
    config: SweepConfig
    timer: Timer
    bar: Any = None
    #: peers found failing by this context (draft name -> error): a worker's context outlives the cells it runs
    peer_errors: dict = field(default_factory=dict)
    hardware: str | None = None  # records.hardware_label of the machine measuring the cells

    @property
    def engine(self) -> Engine:
        return self.session.engine

    @property
    def target(self) -> TargetModel:
        return self.session.target

    @property
    def decoder(self) -> Decoder:
        return self.session.decoder

    @property
    def prompts(self) -> dict[str, list[Prompt]]:
        return self.session.prompts

    @property
    def enc(self) -> dict[str, torch.Tensor]:
        return self.session.enc


def _gen(seed: int, index: int, device: str) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed * 1_000_003 + index)


def rotation(index: int, modes: tuple[str, ...]) -> tuple[str, ...]:
    """The order of the ``index``-th (prompt, repeat) visit: ABC, BCA, CAB, ABC, …"""
    k = index % len(modes)
    return modes[k:] + modes[:k]


def visit_modes(ctx: CellContext, draft: Draft, spec: GammaSpec, name: str) -> tuple[str, ...]:
    """The modes every visit of a cell measures: the one place that decides them, from the run's config, what
    the engine declares it has for this pair (:meth:`measure.seam.Engine.has_peer`, ``has_library``: no
    generation) and the peers ``run.json`` records as failing (``peer_errors``) — so the first pass, a resume
    and every ``--warmup`` agree (issue #43: a resume with ``--warmup 0`` used to quarantine every visit)."""
    cfg, t = ctx.config, ctx.target
    modes = ["baseline", "speculative"]
    if cfg.peer and name not in peer_failures(ctx) and ctx.engine.has_peer(t, draft, spec.gamma):
        modes.append("peer")
    if cfg.library and ctx.engine.has_library(t):
        modes.append("library")
    return tuple(modes)


def peer_failures(ctx: CellContext) -> dict[str, str]:
    """The drafts whose peer failed in this run (``run.json`` ``peer_errors``: the error in words) or in this
    context."""
    return {**(ctx.writer.meta.get("peer_errors") or {}), **ctx.peer_errors}


def _peer_failed(ctx: CellContext, name: str, e: Exception) -> None:
    """Record that the peer of draft ``name`` failed (``peer_errors``): its cells are measured without it."""
    errs = peer_failures(ctx)
    errs[name] = ctx.peer_errors[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    ctx.writer.update(peer_errors=errs)


def _warm(ctx: CellContext, draft: Draft, spec: GammaSpec, temp: float, modes: tuple[str, ...]) -> None:
    """Warm ``modes`` up, ``config.warmup`` times each (never recorded)."""
    cfg, t = ctx.config, ctx.target
    ids = ctx.enc[next(iter(ctx.enc))]
    n = min(8, cfg.max_new_tokens)
    for _ in range(cfg.warmup):
        for mode in modes:
            _generate_mode(ctx, mode, draft, spec, temp, ids, n, _gen(cfg.seed, -1, t.device), cfg.seed)


def _warm_modes(ctx: CellContext, draft: Draft, spec: GammaSpec, temp: float, name: str) -> tuple[str, ...]:
    """Warm the cell's modes up (:func:`visit_modes`); the modes it is measured in. A peer that fails while it
    warms up is recorded (``peer_errors``) and left out of every visit of its draft's cells."""
    modes = visit_modes(ctx, draft, spec, name)
    _warm(ctx, draft, spec, temp, tuple(m for m in modes if m != "peer"))
    if "peer" in modes:
        try:
            _warm(ctx, draft, spec, temp, ("peer",))
        except records.RunInterrupted:
            raise
        except Exception as e:  # a peer that cannot run this pair is recorded, not fatal
            _peer_failed(ctx, name, e)
            modes = visit_modes(ctx, draft, spec, name)
    return modes


@dataclass(frozen=True)
class Generation:
    """One counted generation of a cell: one mode, one prompt, one repeat."""

    tokens: Sequence[int]
    wall_s: float
    ttft_ms: float | None
    latency_ms: Sequence[float]
    rounds: Sequence[RoundRecord]
    drafted: int | None
    accepted: int | None
    n_rounds: int | None
    order: int  # position of this mode in the visit's rotation
    peak_mem_bytes: int | None

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.wall_s if self.wall_s > 0 else float("nan")


@dataclass
class CellSeries:
    """Per (prompt, repeat) visit of a cell: tokens/s of each mode, and the peer's own counts."""

    prompt: list[str] = field(default_factory=list)
    repeat: list[int] = field(default_factory=list)
    base: list[float] = field(default_factory=list)
    spec: list[float] = field(default_factory=list)
    peer: list[float] = field(default_factory=list)
    library: list[float] = field(default_factory=list)
    peer_drafted: int = 0
    peer_accepted: int = 0


@dataclass(frozen=True)
class CellMeasurement:
    """The counted generations of a cell: the rows of its tables, and the series its statistics use."""

    gen_rows: list[GenerationRow]
    round_rows: list[RoundRow]
    lat_rows: list[TokenLatencyRow]
    series: CellSeries


def _generate_mode(ctx: CellContext, mode: str, draft: Draft, spec: GammaSpec, temp: float, ids: torch.Tensor,
                   n: int, gen: torch.Generator, seed: int) -> GenerationResult | PeerResult:
    """One generation of ``mode`` (a decoding result, or the engine's :class:`~measure.seam.PeerResult`).

    A mode :func:`visit_modes` chose always generates: an engine whose peer or library baseline answers None
    after declaring it has one breaks the seam, said in one line (``ValueError``)."""
    t = ctx.target
    if mode == "baseline":
        return autoregressive_generate(ctx.decoder, ids, temp, n, gen, t.eos_token_ids, ctx.timer)
    if mode == "speculative":
        return speculative_generate(ctx.decoder, draft, ids, spec.policy(), temp, n, gen, t.eos_token_ids,
                                    ctx.timer)
    if mode == "library":
        pr = ctx.engine.library_generate(t, ids, temp, n, seed)
    else:  # the peer gets the initial γ only: it runs its engine's constant schedule whatever the policy
        pr = ctx.engine.peer_generate(t, draft, ids, spec.gamma, temp, n, seed)
    if pr is None:
        raise ValueError(f"engine {ctx.engine.name!r} declares a {mode} for this cell but generated none "
                         f"(its has_{'library' if mode == 'library' else 'peer'} and {mode}_generate disagree)")
    return pr


def _generate(ctx: CellContext, mode: str, draft: Draft, spec: GammaSpec, temp: float, ids: torch.Tensor,
              seed_i: int, rep: int, order: int) -> Generation:
    """One counted generation of ``mode``."""
    cfg, t, timer = ctx.config, ctx.target, ctx.timer
    timer.reset_peak_memory()
    r = _generate_mode(ctx, mode, draft, spec, temp, ids, cfg.max_new_tokens, _gen(seed_i, rep, t.device),
                       seed_i + rep)
    if isinstance(r, GenerationResult):  # our loops
        if mode == "baseline":
            return Generation(r.tokens, r.wall_s, r.ttft_ms, r.token_latency_ms, (), None, None, None, order,
                              timer.peak_memory_bytes())
        return Generation(r.tokens, r.wall_s, r.ttft_ms, r.token_latency_ms, r.rounds, r.drafted, r.accepted,
                          len(r.rounds), order, timer.peak_memory_bytes())
    return Generation(r.tokens, r.wall_s, r.ttft_ms, (), (), r.drafted, r.accepted, r.rounds, order,
                      timer.peak_memory_bytes())


def _generation_rows(ctx: CellContext, cid: str, prompt: Prompt, domain: str, ids: torch.Tensor, rep: int,
                     temp: float, res: dict[str, Generation]) -> tuple[list[GenerationRow], list[TokenLatencyRow]]:
    """``generations.csv`` and ``token_latency.csv`` rows of one visit (greedy outputs judged against the baseline)."""
    gen_rows: list[GenerationRow] = []
    lat_rows: list[TokenLatencyRow] = []
    base_toks = res["baseline"].tokens
    for mode, r in res.items():
        same = None if temp != 0 or mode == "baseline" else tuple(r.tokens) == tuple(base_toks)
        check = judge_against_baseline(ctx.engine, ctx.target, ids, base_toks, r.tokens) if same is not None else None
        n = len(r.tokens)
        gen_rows.append(GenerationRow(
            cell_id=cid, prompt_id=prompt.prompt_id, domain=domain, mode=mode, prompt_tokens=int(ids.shape[1]),
            new_tokens=n, wall_s=r.wall_s, tokens_per_s=n / r.wall_s if r.wall_s > 0 else None, ttft_ms=r.ttft_ms,
            peak_mem_bytes=r.peak_mem_bytes, outputs_identical=same, repeat=rep, order=r.order, drafted=r.drafted,
            accepted=r.accepted, n_rounds=r.n_rounds, tokens=tuple(r.tokens),
            lossless=check.status if check else None, divergence_position=check.position if check else None,
            divergence_margin=check.margin if check else None))
        lat_rows += [TokenLatencyRow(cid, prompt.prompt_id, mode, i, v, rep) for i, v in enumerate(r.latency_ms)]
    return gen_rows, lat_rows


@dataclass(frozen=True)
class CellPlan:
    """A cell to measure: its identity and the draft object that runs it."""

    cell: CellId
    draft: Draft

    @property
    def cell_id(self) -> str:
        return self.cell.to_str()


@dataclass(frozen=True)
class Visit:
    """One (repeat, prompt) of a cell: the modes back to back in rotated order, as rows of its tables.

    The unit an interleaved sweep stages on disk (``visits.partial.jsonl``) as soon as it is measured.
    """

    cell_id: str
    attempt: int
    repeat: int
    prompt_index: int
    gen_rows: tuple[GenerationRow, ...]
    lat_rows: tuple[TokenLatencyRow, ...]
    round_rows: tuple[RoundRow, ...]

    def to_record(self) -> dict:
        """The visit as the JSON object staged on disk (its rows by :meth:`measure.rows.Row.to_json`)."""
        return {"cell_id": self.cell_id, "attempt": self.attempt, "repeat": self.repeat,
                "prompt_index": self.prompt_index, "generations": [r.to_json() for r in self.gen_rows],
                "token_latency": [r.to_json() for r in self.lat_rows],
                "rounds": [r.to_json() for r in self.round_rows]}

    @classmethod
    def from_record(cls, rec: dict) -> "Visit":
        """The visit a staged record holds; ``ValueError`` naming the field that is missing or of the wrong type."""
        for key in ("attempt", "repeat", "prompt_index"):
            v = rec.get(key)
            if not isinstance(v, int) or isinstance(v, bool):
                raise ValueError(f"{key} {v!r} is not an integer")
        for key in ("generations", "token_latency", "rounds"):
            rows = rec.get(key)
            if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
                raise ValueError(f"{key} is not a list of rows")
        if not isinstance(rec.get("cell_id"), str):
            raise ValueError(f"cell_id {rec.get('cell_id')!r} is not a string")
        return cls(rec["cell_id"], rec["attempt"], rec["repeat"], rec["prompt_index"],
                   tuple(GenerationRow.from_json(r) for r in rec["generations"]),
                   tuple(TokenLatencyRow.from_json(r) for r in rec["token_latency"]),
                   tuple(RoundRow.from_json(r) for r in rec["rounds"]))

    def keeping(self, modes: Sequence[str]) -> "Visit":
        """The visit with the generations of ``modes`` only (a peer found failing later is dropped from the visits
        measured with it; the baseline and speculative generations stay)."""
        return Visit(self.cell_id, self.attempt, self.repeat, self.prompt_index,
                     tuple(r for r in self.gen_rows if r.mode in modes),
                     tuple(r for r in self.lat_rows if r.mode in modes), self.round_rows)

    def problem(self, repeats: int, n_prompts: int, modes: Sequence[str]) -> str | None:
        """Why this visit cannot belong to a cell measured with ``repeats`` repeats of ``n_prompts`` prompts in
        ``modes`` (None if it can): indices out of range, rows of another cell, a generation per mode."""
        if not 0 <= self.repeat < repeats:
            return f"repeat {self.repeat} is outside the run's {repeats} repeats"
        if not 0 <= self.prompt_index < n_prompts:
            return f"prompt_index {self.prompt_index} is outside the cell's {n_prompts} prompts"
        if self.attempt < 1:
            return f"attempt {self.attempt} is not >= 1"
        cell_ids = ([r.cell_id for r in self.gen_rows] + [r.cell_id for r in self.lat_rows]
                    + [r.cell_id for r in self.round_rows])
        if any(c != self.cell_id for c in cell_ids):
            return "it holds rows of another cell"
        got = sorted(r.mode for r in self.gen_rows)
        if got != sorted(modes):
            return f"its generations are {got}, the cell measures {sorted(modes)}"
        return None


def _tps(row: GenerationRow | None) -> float:
    v = None if row is None else row.tokens_per_s
    return float(v) if v is not None else float("nan")


def measurement_of(visits: Sequence[Visit]) -> CellMeasurement:
    """A cell's tables and series from its visits, in the order they were measured (repeat, then prompt)."""
    out = CellMeasurement([], [], [], CellSeries())
    series = out.series
    for v in sorted(visits, key=lambda v: (v.repeat, v.prompt_index)):
        out.gen_rows.extend(v.gen_rows)
        out.lat_rows.extend(v.lat_rows)
        out.round_rows.extend(v.round_rows)
        by_mode = {r.mode: r for r in v.gen_rows}
        peer = by_mode.get("peer")
        if peer is not None and peer.drafted is not None and peer.accepted is not None:
            series.peer_drafted += int(peer.drafted)
            series.peer_accepted += int(peer.accepted)
        series.prompt.append(str(by_mode["baseline"].prompt_id))
        series.repeat.append(v.repeat)
        series.base.append(_tps(by_mode["baseline"]))
        series.spec.append(_tps(by_mode["speculative"]))
        series.peer.append(_tps(peer))
        series.library.append(_tps(by_mode.get("library")))
    return out


def _visit(ctx: CellContext, plan: CellPlan, modes: tuple[str, ...], rep: int, pi: int, attempt: int) -> Visit:
    """Measure one (repeat, prompt) of a cell: every mode back to back, in the visit's rotated order."""
    cfg, cell = ctx.config, plan.cell
    cid = plan.cell_id
    p = ctx.prompts[cell.domain][pi]
    ids = ctx.enc[p.prompt_id]  # [1, S]
    seed_i = cfg.seed * 7919 + pi
    visit = rep * len(ctx.prompts[cell.domain]) + pi
    res: dict[str, Generation] = {}
    for pos, mode in enumerate(rotation(visit, modes)):
        try:
            res[mode] = _generate(ctx, mode, plan.draft, cell.gamma, cell.temperature, ids, seed_i, rep, pos)
        except records.RunInterrupted:
            raise
        except Exception as e:
            if mode != "peer":
                raise
            _peer_failed(ctx, cell.draft, e)  # measured without it from here on (measure_cells drops it)
    gen_rows, lat_rows = _generation_rows(ctx, cid, p, cell.domain, ids, rep, cell.temperature, res)
    round_rows = [RoundRow(cid, p.prompt_id, **asdict(rr), repeat=rep) for rr in res["speculative"].rounds]
    return Visit(cid, attempt, rep, pi, tuple(gen_rows), tuple(lat_rows), tuple(round_rows))


def _cell_row(ctx: CellContext, draft: Draft, cell: CellId, m: CellMeasurement, modes: tuple[str, ...],
              stab: stats.Stability, attempt: int) -> CellRow:
    """The ``cells.csv`` row of a measured cell: means and 95% CIs, acceptance, lossless verdicts, noise flags."""
    t, series = ctx.target, m.series
    sp = stats.speedup_ci(series.base, series.spec)
    pe = stats.speedup_ci(series.base, series.peer) if "peer" in modes else stats.Estimate(None, None, None)
    tb, ts = stats.mean_ci(series.base), stats.mean_ci(series.spec)
    tp = stats.mean_ci(series.peer) if "peer" in modes else stats.Estimate(None, None, None)
    none = stats.Estimate(None, None, None)
    tl = stats.mean_ci(series.library) if "library" in modes else none
    bl = stats.speedup_ci(series.library, series.base) if "library" in modes else none  # baseline ÷ library
    spec_rows = [r for r in m.gen_rows if r.mode == "speculative"]
    drafted = sum(r.drafted or 0 for r in spec_rows)
    accepted = sum(r.accepted or 0 for r in spec_rows)
    n_rounds = sum(r.n_rounds or 0 for r in spec_rows)
    same = [r.outputs_identical for r in spec_rows if r.outputs_identical is not None]
    verdicts = [r.lossless for r in spec_rows if r.lossless is not None]
    peer_d, peer_a = series.peer_drafted, series.peer_accepted
    return CellRow.make(
        cell=cell, n_prompts=len(ctx.prompts[cell.domain]), new_tokens=sum(r.new_tokens for r in spec_rows),
        tokens_per_s_baseline=tb, tokens_per_s_speculative=ts, tokens_per_s_peer=tp, speedup=sp,
        acceptance_rate=accepted / drafted if drafted else None,
        mean_accepted_per_round=accepted / n_rounds if n_rounds else None, n_rounds=n_rounds,
        outputs_identical=all(same) if same else None, synthetic=bool(t.synthetic or draft.synthetic),
        repeats=len(set(series.repeat)), speedup_peer=pe, peer_acceptance_rate=peer_a / peer_d if peer_d else None,
        baseline_cv=stab.cv, baseline_drift=stab.drift, unstable=stab.unstable,
        unstable_reason=stab.reason or None, attempts=attempt, hardware=ctx.hardware,
        n_near_tie=verdicts.count("near_tie") if verdicts else None,
        n_lossless_failures=verdicts.count("failure") if verdicts else None,
        tokens_per_s_library=tl, baseline_vs_library=bl)


def _trace_rows(ctx: CellContext, draft: Draft, cell: CellId, gen_rows: list[GenerationRow]) -> list[TraceRow]:
    """``traces.csv`` rows: per prompt, the (γ-independent) acceptance trace along the baseline's output.

    Every cell records the trace of its prompts, so a calibration that holds a
    cell out still has the trace from the cells it trains on.
    """
    temp, cid = cell.temperature, cell.to_str()
    rows: list[TraceRow] = []
    for p in ctx.prompts[cell.domain]:
        ids = ctx.enc[p.prompt_id]
        # the first repeat measured (a cell a prior deferred has none in the first pass)
        base = min((r for r in gen_rows if r.mode == "baseline" and r.prompt_id == p.prompt_id),
                   key=lambda r: r.repeat or 0).tokens
        full = torch.cat([ids, torch.tensor([list(base)], device=ids.device)], dim=1)  # [1, S+n]
        vals = acceptance_trace(ctx.decoder, draft, full, int(ids.shape[1]), temp)
        proposed: Sequence[int | None]
        runs: Sequence[int | None]
        if temp == 0:
            proposed, runs = proposal_runs(draft, full, int(ids.shape[1]), vals)
        else:  # sampled outputs depend on γ: no γ-free proposal runs
            proposed = runs = [None] * len(vals)
        rows += [TraceRow(cid, cell.draft, temp, cell.domain, p.prompt_id, i, v, proposed[i], runs[i])
                 for i, v in enumerate(vals)]
    return rows


def _finish(ctx: CellContext, plan: CellPlan, m: CellMeasurement, modes: tuple[str, ...],
            stab: stats.Stability, attempt: int) -> CellRow:
    """Write a measured cell (its tables, then its ``cells.csv`` row last); returns the row."""
    row = _cell_row(ctx, plan.draft, plan.cell, m, modes, stab, attempt)
    trace_rows = _trace_rows(ctx, plan.draft, plan.cell, m.gen_rows) if ctx.config.traces else []
    write_unit(ctx.writer, {"generations": m.gen_rows, "token_latency": m.lat_rows, "rounds": m.round_rows,
                            "traces": trace_rows}, row)
    return row


#: The candidate "plain decoding" in a race of ``--until-decided``.
OFF = "off"


def _prior_plan(prior: CalibrationPrior | None, plans: Sequence[CellPlan], rule: racing.RaceRule) -> PriorPlan | None:
    """The deferrals a calibration's predictions make among one race group's cells (and ``off``)."""
    if prior is None or rule.max_looks < 2:  # one pass: nothing can be measured after it
        return None
    guesses: dict[str, float | None] = {
        p.cell_id: prior.predict(p.cell.draft, p.cell.domain, p.cell.gamma.gamma if p.cell.gamma.is_fixed else None,
                                 p.cell.temperature, p.cell.head_k) for p in plans}
    return plan_group({**guesses, OFF: 1.0}, prior.uncertainty, (OFF,))


def _log_speedup(v: Visit) -> float:
    """A visit's unit in a race: log(speculative tokens/s ÷ baseline tokens/s of the same visit)."""
    by_mode = {r.mode: r for r in v.gen_rows}
    return math.log(_tps(by_mode["speculative"]) / _tps(by_mode["baseline"]))


class _Race:
    """``--until-decided``: a race (:mod:`measure.racing`) per group of cells that answer one question — the same
    domain, temperature and head K; the drafts and γ policies are the candidates, and so is ``off`` (plain
    decoding, a log speedup of 0 on every unit: "do not speculate" can win) — looked at after each pass.

    A cell the race no longer needs (eliminated, or resolved: it cannot beat its leader by the regret) is
    *stopped*: later passes skip it and it is written with the visits it has. With a ``prior``
    (:mod:`measure.prior`) the cells it defers are stopped from the first pass until their check. Every look is a
    pure function of the staged visits of the passes before it, so a resumed run looks again and stops the same
    cells.
    """

    def __init__(self, rule: racing.RaceRule, plans: Sequence[CellPlan], prior: CalibrationPrior | None = None,
                 units_per_pass: Mapping[str, int] | None = None) -> None:
        self.rule, self.prior = rule, prior
        self.groups: dict[str, list[CellPlan]] = {}
        for p in plans:
            key = f"{p.cell.domain} T={p.cell.temperature:g}" + (f" K={p.cell.head_k}" if p.cell.head_k else "")
            self.groups.setdefault(key, []).append(p)
        self.races = {key: GroupRace(rule, tuple(p.cell_id for p in ps) + (OFF,), _prior_plan(prior, ps, rule), (OFF,))
                      for key, ps in self.groups.items()}
        self.units_per_pass = {key: (units_per_pass or {}).get(ps[0].cell.domain, 1) for key, ps in self.groups.items()}
        self.stopped: set[str] = {p.cell_id for key, ps in self.groups.items() for p in ps
                                  if p.cell_id not in self.races[key].first_pass()}
        self.looks: list[dict] = []
        self.samples: dict[str, dict[str, dict[Hashable, float]]] = {}
        self.visit_s: dict[str, float] = {}

    def look(self, look_index: int, staged: Mapping[str, Mapping[tuple[int, int], Visit]]) -> list[str]:
        """Look at the passes ``0..look_index``; returns a line per group whose race changed."""
        notes: list[str] = []
        record: dict[str, Any] = {"look": look_index, "groups": {}}
        for key, plans in self.groups.items():
            samples: dict[str, dict[Hashable, float]] = {
                p.cell_id: {u: _log_speedup(v) for u, v in staged[p.cell_id].items() if u[0] <= look_index}
                for p in plans}
            samples[OFF] = {u: 0.0 for unit in samples.values() for u in unit}
            self.samples[key] = samples
            self.visit_s.update({p.cell_id: sum(r.wall_s for v in staged[p.cell_id].values() for r in v.gen_rows)
                                 / len(staged[p.cell_id]) for p in plans if staged[p.cell_id]})
            race = self.races[key]
            gl = race.look(samples, look_index, self.units_per_pass[key])
            state, keep = gl.state, set(gl.measure_next)
            newly = [p.cell_id for p in plans if p.cell_id not in keep and p.cell_id not in self.stopped]
            again = [p.cell_id for p in plans if p.cell_id in keep and p.cell_id in self.stopped]
            self.stopped.update(newly)
            self.stopped.difference_update(again)
            record["groups"][key] = {**gl.record(), **({"measure_next": list(gl.measure_next)} if race.plan else {})}
            if newly or again:
                notes.append(f"race {key}: after pass {look_index + 1}, leader {state.leader}"
                             + (f"; stopped {', '.join(newly)}" if newly else "")
                             + (f"; measuring again {', '.join(again)}" if again else "")
                             + (f" ({gl.stop_reason})" if gl.stop_reason else ""))
        self.looks.append(record)
        return notes

    def all_stopped(self) -> bool:
        return all(p.cell_id in self.stopped for plans in self.groups.values() for p in plans)

    def summary(self, reason: str) -> dict:
        """What ``run.json`` records of the race: the rule, every look, why the measuring stopped, and with a
        prior what it predicted, deferred and saved (:mod:`measure.prior`)."""
        out = {"rule": asdict(self.rule), "looks": self.looks, "stopped_by": reason,
               "decided": {k: r.state.leader for k, r in self.races.items()
                           if r.state is not None and self.looks and self.looks[-1]["groups"][k]["stop_reason"]
                           == "decided"}}
        if self.prior is not None:
            out["prior"] = prior_summary(self.prior, self.races, self.samples, self.units_per_pass, self.visit_s)
        return out


@contextlib.contextmanager
def _naming(what: str) -> Iterator[None]:
    """A :class:`measure.records.RunInterrupted` (an engine's process died) raised inside says what was running."""
    try:
        yield
    except records.RunInterrupted as e:
        raise records.RunInterrupted(f"{e} while {what}; every finished visit is kept: re-run with the same "
                                     "--out to resume") from None


def _staged_visits(ctx: CellContext, plans: Sequence[CellPlan], modes: dict[str, tuple[str, ...]]
                   ) -> tuple[dict[str, dict[tuple[int, int], Visit]], dict[str, int]]:
    """The visits staged on disk that belong to ``plans`` as configured (by cell, by (repeat, prompt)), and each
    cell's attempt; a visit that cannot belong is quarantined with the reason. The generations of a peer that
    failed after they were measured are dropped, the visit kept."""
    wanted = {p.cell_id: p for p in plans}
    staged: dict[str, dict[tuple[int, int], Visit]] = {cid: {} for cid in wanted}
    attempts = {cid: 1 for cid in wanted}
    failed = peer_failures(ctx)

    def adjust(v: Visit) -> Visit:
        return v.keeping(modes[v.cell_id]) if "peer" not in modes[v.cell_id] and wanted[v.cell_id].cell.draft in failed \
            else v

    def problem(v: Visit) -> str | None:
        return v.problem(ctx.config.repeats, len(ctx.prompts[wanted[v.cell_id].cell.domain]), modes[v.cell_id])

    for v in read_staged(ctx.writer, Visit.from_record, wanted, problem, adjust):
        if v.attempt < attempts[v.cell_id]:
            continue
        if v.attempt > attempts[v.cell_id]:  # a later attempt supersedes the visits of an earlier one
            attempts[v.cell_id], staged[v.cell_id] = v.attempt, {}
        staged[v.cell_id][(v.repeat, v.prompt_index)] = v
    return staged, attempts


def _drop_peer(ctx: CellContext, plans: Sequence[CellPlan], draft: str, modes: dict[str, tuple[str, ...]],
               staged: dict[str, dict[tuple[int, int], Visit]]) -> None:
    """The peer of ``draft`` failed mid-run (recorded in ``peer_errors``): its cells are measured without it,
    and their visits measured so far keep every other mode."""
    for q in plans:
        if q.cell.draft == draft:
            modes[q.cell_id] = visit_modes(ctx, q.draft, q.cell.gamma, draft)
            staged[q.cell_id] = {k: v.keeping(modes[q.cell_id]) for k, v in staged[q.cell_id].items()}


def _over_budget(budget_s: float | None, started: float) -> bool:
    """Whether ``--time-budget`` has run out (checked before each visit of a race, not only between passes)."""
    return budget_s is not None and time.monotonic() - started > budget_s


@dataclass
class _Stop:
    """Where the passes of :func:`measure_cells` stand: when they started, why they stopped, and the pass the time
    budget cut short in its middle (None: none)."""

    started: float
    by: str = "every pass measured"
    cut_pass: int | None = None


def _passes(ctx: CellContext, group: Sequence[CellPlan], staged: Mapping[str, Mapping[tuple[int, int], Visit]],
            race: _Race | None, stop: _Stop, say: Callable[[str], None]) -> Iterator[tuple[CellPlan, int, int]]:
    """The visits of ``group`` still to measure, in passes (repeat, then prompt, then cell): the schedule of
    :func:`measure_cells`. With a race it is looked at before each pass after the first, and the passes stop
    (``stop``) when it is decided or the time budget has run out (checked before each visit of a later pass)."""
    cfg = ctx.config
    n_prompts = max(len(ctx.prompts[p.cell.domain]) for p in group)
    for rep in range(cfg.repeats):
        if race is not None and rep > 0:
            for note in race.look(rep - 1, staged):
                say(note)
            if race.all_stopped():
                stop.by = "decided"
                return
            if _over_budget(cfg.time_budget_s, stop.started):
                stop.by = "time budget"
                return
        for pi in range(n_prompts):
            for plan in group:
                cid = plan.cell_id
                if pi >= len(ctx.prompts[plan.cell.domain]) or (rep, pi) in staged[cid]:
                    continue
                if race is not None and cid in race.stopped:
                    continue
                if race is not None and rep > 0 and _over_budget(cfg.time_budget_s, stop.started):
                    # (the first pass always completes: every prompt's trace needs its visit)
                    stop.by, stop.cut_pass = "time budget", rep  # overshoots by one visit at most
                    return
                yield plan, rep, pi


# long: resume of staged visits, the passes (:func:`_passes`), the race's last look and the until-stable
#   re-measurement are one loop; each visit and each finished cell is a call
def measure_cells(ctx: CellContext, plans: Sequence[CellPlan], on_attempt: Callable[[str], None] | None = None,
                  on_row: Callable[[CellRow], None] | None = None,
                  between: Callable[[], None] | None = None) -> list[CellRow]:
    """Measure ``plans`` (module docstring) and write each; returns their ``cells.csv`` rows in plan order.

    With ``interleave="sweep"`` the cells are visited in passes — repeat 1 of
    prompt 1 of every cell, then prompt 2 of every cell, …, then repeat 2 —
    so each cell's pairs are spread over the whole measurement and a machine
    that sits in a slow or fast mode for a minute biases no cell; with
    ``"cell"`` each cell's visits run back to back. Every finished visit is
    staged on disk (:meth:`measure.records.RunWriter.stage`) and read back on
    resume, so an interruption loses at most the visit that was running.
    ``on_row`` sees each cell's row as it is written; ``between`` is called
    after each visit (the sweep times a few cost-curve points there, :class:`CostCurves`).
    """
    cfg = ctx.config
    modes = {}
    for p in plans:
        with _naming(f"warming up cell {p.cell_id}"):
            modes[p.cell_id] = _warm_modes(ctx, p.draft, p.cell.gamma, p.cell.temperature, p.cell.draft)
    n_repairs = len(ctx.writer.repairs)
    staged, attempts = _staged_visits(ctx, plans, modes)
    for note in ctx.writer.repairs[n_repairs:]:
        if on_attempt:
            on_attempt(note)
    if ctx.bar is not None:
        ctx.bar.update(sum(len(vs) for vs in staged.values()))
    rows: dict[str, CellRow] = {}
    active = list(plans)
    race = _Race(cfg.race_rule(), plans, load_prior(cfg.prior, cfg.target, cfg.engine) if cfg.prior else None,
                 {d: len(ps) for d, ps in ctx.prompts.items()}) if cfg.until_decided else None
    stop = _Stop(time.monotonic())
    say = on_attempt or (lambda _m: None)

    def measure(plan: CellPlan, rep: int, pi: int) -> Visit:
        if ctx.bar is not None:
            ctx.bar.set_description(f"repeat {rep + 1}/{cfg.repeats} {plan.cell.draft} "
                                    f"{plan.cell.gamma.to_str()} {plan.cell.domain}")
        with _naming(f"measuring cell {plan.cell_id} (repeat {rep + 1}, prompt {pi + 1})"):
            return _visit(ctx, plan, modes[plan.cell_id], rep, pi, attempts[plan.cell_id])

    def after(plan: CellPlan, _v: Visit) -> None:
        if "peer" in modes[plan.cell_id] and plan.cell.draft in peer_failures(ctx):
            _drop_peer(ctx, plans, plan.cell.draft, modes, staged)
        if ctx.bar is not None:
            ctx.bar.update(1)
        if between is not None:
            with _naming("timing cost-curve points between the visits"):
                between()

    while active:
        groups = ([active] if cfg.interleave == "sweep" else [[p] for p in active])
        for group in groups:
            visit_all(ctx.writer, _passes(ctx, group, staged, race, stop, say), lambda p: staged[p.cell_id], measure,
                      after)
            if race is not None and (stop.by == "every pass measured" or stop.cut_pass is not None):
                # the look after the last pass, or over the visits of the pass the budget cut short
                for note in race.look(cfg.repeats - 1 if stop.cut_pass is None else stop.cut_pass, staged):
                    say(note)
                if stop.cut_pass is None:
                    stop.by = "decided" if race.all_stopped() else "out of passes"
            if stop.cut_pass is not None:
                break
        ms = {p.cell_id: measurement_of(list(staged[p.cell_id].values())) for p in active if staged[p.cell_id]}
        if cfg.interleave == "sweep" and len(active) > 1:  # each cell spans the run: against the pass's pace
            what = "baseline (against the machine's pace in its pass)"
            normed = stats.normalise_by_pace({cid: (m.series.prompt, m.series.repeat, m.series.base)
                                              for cid, m in ms.items()})
        else:
            what = "baseline"
            normed = {cid: stats.normalise_per_prompt(m.series.prompt, m.series.base) for cid, m in ms.items()}
        again = []
        for plan in active:
            cid = plan.cell_id
            if cid not in ms:  # deferred by a prior, the race stopped before its check: left for a resume
                if on_attempt:
                    on_attempt(f"cell {cid} not measured: the prior deferred it and the race stopped first "
                               f"({stop.by}); re-run with the same --out to measure it")
                continue
            m = ms[cid]
            stab = stats.stability(normed[cid], cfg.cv_threshold, cfg.drift_threshold, what)
            if stab.unstable and attempts[cid] <= cfg.until_stable:
                if on_attempt:
                    on_attempt(f"cell {cid} unstable ({stab.reason}); re-measuring (attempt {attempts[cid] + 1} of "
                               f"{cfg.until_stable + 1})")
                attempts[cid] += 1
                staged[cid] = {}
                if ctx.bar is not None:
                    ctx.bar.total += len(ctx.prompts[plan.cell.domain]) * cfg.repeats
                again.append(plan)
                continue
            with _naming(f"writing cell {cid} (its acceptance traces)"):
                rows[cid] = _finish(ctx, plan, m, modes[cid], stab, attempts[cid])
            if on_row:
                on_row(rows[cid])
        active = again
    if race is not None:
        ctx.writer.update(race=race.summary(stop.by))
        if race.prior is not None and on_attempt:
            on_attempt(prior_line(ctx.writer.meta["race"]["prior"]))
    return [rows[p.cell_id] for p in plans if p.cell_id in rows]


def run_cell(ctx: CellContext, draft: Draft, spec: GammaSpec, temp: float, domain: str,
             head_k: int | None = None, draft_label: str | None = None,
             on_attempt: Callable[[str], None] | None = None) -> CellRow:
    """Measure one cell with :func:`measure_cells` and write it; returns its ``cells.csv`` row.

    ``draft_label`` names the draft in the records (the head sweep's
    ``<draft>+<variant>``); ``head_k`` the kept vocabulary of a pruned head.
    """
    cell = CellId(draft_label or draft.name, spec, temp, domain, head_k)
    return measure_cells(ctx, [CellPlan(cell, draft)], on_attempt=on_attempt)[0]
