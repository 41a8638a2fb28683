"""The local driver: a sweep run here, a cell at a time, into one run directory (:func:`run_sweep`).

:func:`open_run` opens the run directory (prompts selected, environment read,
fingerprint checked) for this driver and for the Ray one
(:func:`measure.executors.run_sweep_distributed`); :func:`pending_cells` says
which cells a resume still has to measure.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

import torch

from measure import records, runplan
from measure.ids import CellId
from measure.rows import CellRow
from measure.devices import resolve_device
from measure.prompts import Prompt
from measure.runkinds import CHAIN, open_run_dir
from measure.seam import Engine
from measure.sweep.cells import CellContext, CellPlan, measure_cells
from measure.sweep.config import SweepConfig, engine_options, select_prompts
from measure.sweep.cost import CostCurves, cost_curves_left, prompt_lengths, record_cost, screen_cost
from measure.sweep.identity import environment, fingerprint
from measure.sweep.session import open_session
from measure.sweep.summary import summarize
from measure.timing import Timer
from sim.policies import GammaSpec


class PendingCell(NamedTuple):
    """A cell of the sweep not finished yet."""

    draft_index: int
    temperature: float
    domain: str
    gamma: GammaSpec

    def cell(self, draft_names: Sequence[str]) -> CellId:
        return CellId(draft_names[self.draft_index], self.gamma, float(self.temperature), self.domain)

    def cell_id(self, draft_names: Sequence[str]) -> str:
        return self.cell(draft_names).to_str()


def pending_cells(config: SweepConfig, draft_names: list[str], domains: list[str],
                  writer: records.RunWriter) -> list[PendingCell]:
    """The unfinished cells, in sweep order."""
    plan = [PendingCell(i, t, dom, g) for i in range(len(draft_names)) for t in config.temperatures
            for dom in domains for g in config.gammas]
    return [c for c in plan if not writer.is_finished(c.cell_id(draft_names))]


@dataclass(frozen=True)
class OpenedRun:
    """A run directory opened for a sweep, before any model loads: its writer (the fingerprint checked) and
    what ``run.json`` records of the sweep's setup."""

    writer: records.RunWriter
    meta: dict
    prompts: dict[str, list[Prompt]]
    selection: dict
    device: str
    hardware: dict
    versions: dict


def open_run(config: SweepConfig, out_dir: str | Path, command: str = "", say: Callable[[str], None] = lambda _m: None,
             force_new: bool = False, system_check: dict | None = None,
             cluster_hardware: dict | None = None, extend: bool = False) -> OpenedRun:
    """Open (or resume) ``out_dir`` for ``config`` (:func:`measure.runkinds.open_run_dir`): prompts selected,
    environment read, fingerprint checked; ``force_new``: the run there set aside first, under its lock.

    A resume with a different fingerprint, or asking for other cells than the run holds, raises
    :class:`measure.records.FingerprintMismatch` (nothing written); ``extend`` (``--extend``) lets a complete run
    gain γ policies, drafts or domains, recorded as an extension (:mod:`measure.runplan`).
    ``cluster_hardware``: the fingerprint's hardware of a sweep whose cells run elsewhere (a Ray cluster; each
    cell records its worker's hardware), which also leaves ``config.device`` for the workers to resolve.
    """
    distributed = cluster_hardware is not None
    device = config.device if distributed else resolve_device(config.device)
    prompts, selection = select_prompts(config)
    out = Path(out_dir)
    hardware, versions, source = environment("cpu" if distributed else device)
    if cluster_hardware is not None:
        hardware = dict(cluster_hardware)
    fp = fingerprint(config, device, selection, hardware, versions)
    asked = runplan.PlanRequest(runplan.Plan.of(config.drafts, config.gammas, config.temperatures, list(prompts)),
                                extend, {p.prompt_id: p.message for ps in prompts.values() for p in ps})
    # refuses a different fingerprint, or other cells than the run holds (unless --extend adds them), before writing
    writer = open_run_dir(CHAIN, out, fingerprint=fp, plan=asked.opener(out, fp), force_new=force_new, extend=extend,
                          say=say)
    if writer.opening is not None:
        say(runplan.opening_text(writer.opening, len(writer.finished_cells)))
    meta = dict(command=command, **source, hardware=hardware, versions=versions, config=CHAIN.stamp(config.as_dict()),
                prompt_selection=selection, **({"system_check": system_check} if system_check is not None else {}))
    return OpenedRun(writer, meta, prompts, selection, device, hardware, versions)


def run_sweep(config: SweepConfig, out_dir: str | Path, command: str = "",
              progress: Callable[[str], None] | None = None, show_bar: bool = True,
              on_cell: Callable[[CellRow], None] | None = None, force_new: bool = False,
              system_check: dict | None = None, quiet: bool = False, engine: Engine | None = None,
              extend: bool = False) -> records.Run:
    """Run (or resume) the sweep into ``out_dir`` here, a cell at a time; returns the run read back.

    ``on_cell`` sees each finished cell's row (the CLI prints the table as
    cells finish). A resume with a different fingerprint, or asking for other
    cells than the run holds, raises :class:`measure.records.FingerprintMismatch`
    (nothing written); ``extend``: :func:`open_run`.
    ``engine``: an engine object to use instead of ``make_engine(config.engine, ...)`` (tests).
    The same sweep on a Ray cluster: :func:`measure.executors.run_sweep_distributed`.
    """
    say = progress or (lambda _m: None)
    opened = open_run(config, out_dir, command, say, force_new, system_check, extend=extend)
    writer = opened.writer
    with writer.recording():
        writer.update(**opened.meta)
        session = open_session(config, opened.prompts, engine_options(config, opened.device, config.threads, quiet),
                               quiet=quiet, say=say, check=writer.check_fingerprint, engine=engine)
        writer.update(models=session.models(), versions=session.versions(opened.versions))
        writer.update(prompts=session.prompts_meta())
        timer = Timer(opened.device)
        on_disk = records.load_run(writer.path)
        done_cells: list[CellRow] = on_disk.rows(CellRow)
        for c in done_cells:
            if on_cell:
                on_cell(c)
        todo = pending_cells(config, [d.name for d in session.drafts], list(session.prompts), writer)
        cost = cost_curves_left(config, session.target, list(session.drafts), timer, on_disk,
                                prompt_lengths(session.prompts, session.enc))
        if cost is not None:
            assert cost.plan is not None  # cost_curves_for sizes every CostCurves it makes
            sized = cost.plan.summary(len(session.drafts))
            writer.update(cost_plan=cost.plan.describe(len(session.drafts)))
            if config.interleave == "cell" or not todo:
                say(f"timing cost curves ({sized}, sized to the run; repeats interleaved across token counts and "
                    "contexts)")
                record_cost(writer, cost.measure())
            else:
                say(f"timing the cost curves' {len(cost)} points a few at a time between the visits ({sized}, sized "
                    "to the run)")
        bar = None
        if show_bar:
            from tqdm import tqdm

            bar = tqdm(total=sum(len(session.prompts[c.domain]) * config.repeats for c in todo), desc="measure",
                       unit="prompt×repeat", file=sys.stderr, dynamic_ncols=True)
        hardware = records.hardware_label({**opened.hardware, "torch_threads": torch.get_num_threads()})
        ctx = CellContext(writer, session, config, timer, bar, hardware=hardware)
        try:
            _run_cells(ctx, todo, done_cells, on_cell, say, cost)
        finally:
            if bar is not None:
                bar.close()
        if config.cost_curves and (cost is not None or "cost_screening" not in writer.meta):
            screen_cost(writer, cost, say)
        writer.update(summary=summarize(done_cells, session.synthetic))
    return records.load_run(writer.path)


def _run_cells(ctx: CellContext, todo: list[PendingCell], done_cells: list[CellRow],
               on_cell: Callable[[CellRow], None] | None, say: Callable[[str], None],
               cost: CostCurves | None = None) -> None:
    """Measure the pending cells (interleaved, :func:`measure_cells`); the run's summary is rewritten after
    each finished cell. ``cost``: cost-curve points still to time, spread evenly over the visits (the
    points left over timed after the last visit)."""
    bar, drafts = ctx.bar, ctx.session.drafts
    names = [d.name for d in drafts]

    def finished(row: CellRow) -> None:
        done_cells.append(row)
        ctx.writer.update(summary=summarize(done_cells, ctx.session.synthetic))
        if on_cell:
            if bar is not None:
                bar.clear()
            on_cell(row)
            if bar is not None:
                bar.refresh()

    plans = [CellPlan(c.cell(names), drafts[c.draft_index]) for c in todo]
    between = None
    if cost is not None and len(cost):
        visits = sum(len(ctx.prompts[c.domain]) for c in todo) * ctx.config.repeats
        per_visit = math.ceil(len(cost) / max(visits, 1))

        def between() -> None:
            if len(cost):
                record_cost(ctx.writer, cost.measure(per_visit))

    measure_cells(ctx, plans, on_attempt=say, on_row=finished, between=between)
    if cost is not None and len(cost):
        record_cost(ctx.writer, cost.measure())
    ctx.writer.clear_staged()
