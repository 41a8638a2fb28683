"""The cost curves: target forward and draft step times per (tokens, context), a queue of points to time.

Timed through the seam (:class:`CostCurves`), all at once or a few points
between a sweep's visits; a resumed run times only the points not on disk
(:func:`cost_points_done`).
"""

from __future__ import annotations

import collections
import random
from dataclasses import astuple, dataclass, replace
from typing import AbstractSet, Any, Callable, Sequence

import torch

from measure import costpoints, records
from measure.prompts import Prompt
from measure.rows import CostDraftRow, CostTargetRow
from measure.seam import Decoder, Draft, TargetModel
from measure.sweep.config import SweepConfig
from measure.timing import Timer


#: A timed point on disk: a target forward ``(n_tokens, context_tokens, repeat)``, a draft step ``(draft,
#: context_tokens, repeat)``.
TargetKey = costpoints.Key
DraftKey = tuple[str, int, int]


@dataclass(frozen=True)
class CostPoint:
    """One point of the cost curves: a target forward of ``n`` tokens after ``context`` cached, or (``draft``
    set, the index of a draft) one draft step after ``context``. ``repeat`` -1 is the untimed warm-up."""

    repeat: int
    context: int
    n: int = 0
    draft: int | None = None


class CostCurves:
    """The cost-curve micro-benchmark as a queue of points, timed all at once or a few between a sweep's visits.

    Target forward ms per (tokens verified 1..max_tokens, context) and draft
    step ms per context, timed through the engine seam
    (``target.new_decoder()``: forward ``n`` tokens after ``c`` cached, roll
    back to ``c``; a draft's ``propose`` of one token after ``start``). Every
    repeat visits all points in a fresh seeded random order, after one
    untimed warm-up pass. Timed a few points after each visit of the
    interleaved sweep (:func:`measure.sweep.cells.measure_cells` ``between``),
    the curves see the machine in the same slow and fast modes as the cells
    they are compared with (timed in one block before the cells, they did not:
    ``results/2026-11-24-readme-evidence.md`` §3.4).
    ``verified`` ``(n_max, r)``: the token counts 1..n_max (those the
    sweep's cells verify) get ``max(repeats, r)`` repeats. ``done_target`` / ``done_draft``: keys ``(n_tokens,
    context_tokens, repeat)`` / ``(draft, context_tokens, repeat)`` already
    on disk (a resumed run), not timed again. ``plan``: the sizing these points came from, when a sweep
    made them (:func:`cost_curves_for`).
    """

    plan: costpoints.CostPlan | None = None

    def __init__(self, target: TargetModel, drafts: Sequence[Draft], timer: Timer, contexts: tuple[int, ...],
                 max_tokens: int, repeats: int, seed: int, done_target: AbstractSet[TargetKey] = frozenset(),
                 done_draft: AbstractSet[DraftKey] = frozenset(), verified: tuple[int, int] = (0, 0)) -> None:
        self.target, self.drafts, self.timer = target, drafts, timer
        g = torch.Generator().manual_seed(seed)
        rng = random.Random(seed)
        self.ids = torch.randint(0, target.vocab_size, (1, max(contexts) + max_tokens + 1),
                                 generator=g).to(target.device)  # [1, C+K]
        points = ([CostPoint(0, c, n) for c in contexts for n in range(1, max_tokens + 1)]
                  + [CostPoint(0, c, draft=i) for i in range(len(drafts)) for c in contexts])
        todo: list[CostPoint] = []
        n_verified, rep_verified = verified
        for rep in range(max(repeats, rep_verified)):
            order = [replace(p, repeat=rep) for p in points
                     if rep < repeats or (p.draft is None and p.n <= n_verified)]
            rng.shuffle(order)
            todo.extend(p for p in order if not self._done(p, done_target, done_draft))
        self.warm_up = [replace(p, repeat=-1) for p in points] if todo else []
        self.pending = collections.deque(todo)
        self._decs: dict[int, Decoder] = {}

    def _done(self, p: CostPoint, done_target: AbstractSet[TargetKey], done_draft: AbstractSet[DraftKey]) -> bool:
        if p.draft is None:
            return (p.n, p.context, p.repeat) in done_target
        return (self.drafts[p.draft].name, p.context, p.repeat) in done_draft

    def __len__(self) -> int:
        """Points still to time (the warm-up not counted)."""
        return len(self.pending)

    @torch.inference_mode()
    def _time(self, p: CostPoint) -> float:
        if p.draft is None:
            dec = self._decs.get(p.context)
            if dec is None:
                dec = self._decs[p.context] = self.target.new_decoder()
                dec.forward(self.ids[:, :p.context], last_only=True)
            x = self.ids[:, p.context:p.context + p.n]  # [1, n]
            with self.timer.span() as s:
                dec.forward(x)
            dec.rollback(p.context)
            return s.ms
        d = self.drafts[p.draft]
        d.start(self.ids[:, :p.context])
        tokens = self.ids[:, :p.context + 1]  # one uncached token -> one draft step
        with self.timer.span() as s:
            d.propose(tokens, 1, 0.0, None)
        d.rollback(p.context)
        return s.ms

    def measure(self, count: int | None = None) -> tuple[list[CostTargetRow], list[CostDraftRow]]:
        """Time the next ``count`` points (every pending one when None), the warm-up pass first.

        Returns the ``cost_target`` and ``cost_draft`` rows of the timed points.
        """
        while self.warm_up:
            self._time(self.warm_up.pop(0))
        t_rows: list[CostTargetRow] = []
        d_rows: list[CostDraftRow] = []
        n = len(self.pending) if count is None else min(count, len(self.pending))
        for _ in range(n):
            p = self.pending.popleft()
            ms = self._time(p)
            if p.draft is None:
                t_rows.append(CostTargetRow(p.n, p.context, p.repeat, ms))
            else:
                d_rows.append(CostDraftRow(self.drafts[p.draft].name, None, p.context, p.repeat, ms))
        if not self.pending:
            self._decs.clear()  # the decoders' KV caches are not needed any more
        return t_rows, d_rows


def cost_curves_left(config: SweepConfig, target: TargetModel, drafts: Sequence[Draft], timer: Timer,
                     run: records.Run, prompt_tokens: dict[str, list[int]]) -> CostCurves | None:
    """The cost-curve points ``run`` (as on disk) still has to time (None: none, or no cost curves asked for);
    ``prompt_tokens``: :func:`prompt_lengths`."""
    if not config.cost_curves:
        return None
    cost = cost_curves_for(config, target, drafts, timer, *cost_points_done(run), prompt_tokens=prompt_tokens)
    return cost if len(cost) else None


def prompt_lengths(prompts: dict[str, list[Prompt]], enc: dict[str, torch.Tensor]) -> dict[str, list[int]]:
    """Per domain, the token counts of its encoded prompts (what sizes the cost points)."""
    return {d: [int(enc[p.prompt_id].shape[1]) for p in ps] for d, ps in prompts.items()}


def cost_points_done(run: records.Run) -> tuple[set[TargetKey], set[DraftKey]]:
    """Keys of the cost-curve points ``run`` has on disk: ``(n_tokens, context, repeat)`` of the target's,
    ``(draft, context, repeat)`` of the drafts' (what :class:`CostCurves` leaves out on a resume)."""
    done_t = {(r.n_tokens, r.context_tokens, r.repeat) for r in run.rows(CostTargetRow)}
    done_d = {(r.draft, r.context_tokens, r.repeat) for r in run.rows(CostDraftRow)}
    return done_t, done_d


def cost_curves_for(config: SweepConfig, target: TargetModel, drafts: Sequence[Draft], timer: Timer,
                    done_target: AbstractSet[TargetKey] = frozenset(),
                    done_draft: AbstractSet[DraftKey] = frozenset(), *,
                    prompt_tokens: dict[str, list[int]]) -> CostCurves:
    """The cost curves a sweep's config asks for, sized to the run (:func:`measure.costpoints.plan_cost_points`:
    the token counts its cells verify with more repeats); ``prompt_tokens``: :func:`prompt_lengths`."""
    plan = costpoints.plan_cost_points(config, prompt_tokens)
    cost = CostCurves(target, drafts, timer, plan.contexts, plan.max_tokens, plan.repeats, config.seed,
                      done_target=done_target, done_draft=done_draft, verified=(plan.n_verified, plan.repeats_verified))
    cost.plan = plan
    return cost


def record_cost(writer: records.CellWriter[Any],
                rows: tuple[list[CostTargetRow], list[CostDraftRow]]) -> None:
    """Append timed cost points (:meth:`CostCurves.measure`) to ``cost_target.csv`` / ``cost_draft.csv``."""
    t_rows, d_rows = rows
    writer.append("cost_target", t_rows)
    writer.append("cost_draft", d_rows)


def screen_cost(writer: records.RunWriter, cost: CostCurves | None, say: Callable[[str], None]) -> None:
    """Screen the run's target cost points against their neighbours (:func:`measure.costpoints.screen_and_retime`):
    an out-of-line point is re-timed once with ``cost`` (None: dropped), what was done said in words and recorded
    in ``run.json`` ``cost_screening``."""
    import pandas as pd

    retime = None
    if cost is not None:
        def retime(keys: list[tuple[int, int, int]]) -> pd.DataFrame:
            cost.warm_up = [CostPoint(-1, c, n) for n, c in dict.fromkeys((n, c) for n, c, _ in keys)]
            cost.pending.extend(CostPoint(r, c, n) for n, c, r in keys)
            rows = cost.measure()
            record_cost(writer, rows)
            return pd.DataFrame([astuple(r) for r in rows[0]], columns=CostTargetRow.columns())

    table = records.load_run(writer.path).table("cost_target")
    screening = costpoints.screen_and_retime(table, writer.meta.get("cost_screening"), retime)
    writer.update(cost_screening=screening)
    for note in screening["notes"]:
        say(note)
