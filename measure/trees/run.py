"""The tree experiment: token trees (and chains) against the baseline, lossless, into a new run directory.

A *cell* is one draft shape: a ``--tree`` (drafted and verified by
:func:`measure.trees.loop.tree_generate`, one target forward per round) or a
``--gamma`` chain (the chain loop, :func:`measure.decoding.speculative_generate`
with ``fixed:γ``). The models are opened as every sweep opens them
(:func:`measure.sweep.session.open_session`); after one warm-up generation per
cell, the cells are visited in passes — repeat 1 of every prompt of every cell,
then repeat 2 — so a machine that is slow for a while biases no cell, and each
visit runs the baseline and the cell on the same prompt back to back (the order
alternating). Greedy only; every speculative output is judged against the
baseline's (:mod:`measure.engines.lossless`: identical, a near tie within the
engine's tolerance, or a failure, which fails the run).

Each finished visit is staged on disk at once (:class:`TreeVisit`,
``visits.partial.jsonl``, by the one visit loop a sweep's cells share,
:func:`measure.sweep.visits.visit_all`); a cell's rows go to its tables when
every visit is measured, its ``tree_cells`` row last. So a run
killed at any point (Ctrl-C, SIGTERM, SIGKILL) loses at most the visit that
was running: re-running it into the same directory resumes it through the
run directory's one opener (:func:`measure.runkinds.open_run_dir`: lock, fingerprint check,
unfinished cells' rows dropped), keeps the finished cells and staged visits,
and measures only the missing visits (:func:`run_trees`).

Between the visits the sweep's cost curves are timed a few points at a time
(:class:`measure.sweep.cost.CostCurves`: target forwards of 1..max(``budget + 1``, 16)
tokens over the run's contexts, the draft's step), so ``calibrate`` can price
tree shapes never measured.

The run directory (``docs/RUN_FORMAT.md``, "Tree runs"): ``run.json`` (kind
``trees``); ``generations.csv`` and ``rounds.csv`` in their usual columns;
``cost_target.csv`` and ``cost_draft.csv``; ``tree_nodes.csv`` (every drafted
node), ``tree_ranks.csv`` (every position decided, with the rank the target's
token had among the draft's candidates) and ``tree_cells.csv`` (one row per
cell, written last: it marks the cell finished). The command line: :mod:`measure.trees.cli`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Iterator
from typing import Any
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from measure import engines, records
from measure.decoding import autoregressive_generate, speculative_generate
from measure.devices import resolve_device
from measure.drafts import parse_draft_spec
from measure.engines.lossless import LosslessCheck, judge_against_baseline
from measure.engines.transformers.models import check_model_spec, context_tokens, vocab_tokens
from measure.ids import TreeCellId
from measure.prompts import Prompt
from measure.runkinds import TREES, open_run_dir
from measure.rows import GenerationRow, RoundRow, TreeCellRow, TreeNodeRow, TreeRankRow
from measure.seam import EngineOptions, GenerationResult, TreeDecoder
from measure.stats import speedup_ci
from measure.sweep.config import MAX_GAMMA, SweepConfig, engine_options, select_prompts
from measure.sweep.cost import CostCurves, cost_curves_left, prompt_lengths, record_cost, screen_cost
from measure.sweep.identity import environment, fingerprint
from measure.sweep.session import Session, open_session
from measure.sweep.visits import in_order, missing_visits, read_staged, visit_all, write_unit
from measure.timing import Timer
from measure.trees.loop import (TreeOption, TreeRoundRecord, check_tree_option, make_tree_drafter, parse_tree_option,
                                tree_generate, tree_sequences)
from sim.policies import GammaSpec, make_policy


#: What a tree run shares with a chain sweep, declared once in :class:`~measure.sweep.config.SweepConfig` (the
#: models, prompts, repeats, engine and cost curves), in the order ``run.json`` records a tree run's config.
SHARED = ("target", "domains", "prompts_per_domain", "max_new_tokens", "max_prompt_tokens", "repeats", "warmup", "seed",
          "device", "dtype", "cache", "threads", "cost_curves", "engine")


@dataclass(frozen=True)
class TreeRunConfig:
    """What ``python -m measure tree`` measures (validated by :func:`check_config` before any model loads): the
    ``trees`` and ``gammas`` chains of one draft, over the models, prompts, repeats and engine of ``sweep`` (the
    settings a tree run shares with a chain sweep: :data:`SHARED`, and its one draft; the sweep's other fields
    stay at their defaults — the run's own sweep is :func:`sweep_config`). :meth:`of` takes them flat."""

    sweep: SweepConfig
    trees: tuple[str, ...]
    gammas: tuple[int, ...] = ()
    quiet: bool = False

    def __post_init__(self) -> None:
        if len(self.sweep.drafts) != 1:
            raise ValueError(f"--draft: a tree run measures one draft, got {', '.join(self.sweep.drafts)}")

    @classmethod
    def of(cls, target: str, draft: str, trees: tuple[str, ...], gammas: tuple[int, ...] = (), quiet: bool = False,
           **shared: Any) -> "TreeRunConfig":
        """A tree run's config from flat settings (:data:`SHARED` by name; a tree run's defaults: domain
        ``code``, device ``cpu``); ``ValueError`` naming a bad value."""
        unknown = sorted(set(shared) - set(SHARED))
        if unknown:
            raise TypeError(f"TreeRunConfig.of: unknown setting(s) {', '.join(unknown)}; valid: {', '.join(SHARED)}")
        settings = {"domains": ("code",), "device": "cpu", **shared}
        return cls(SweepConfig(target=target, drafts=(draft,), **settings), tuple(trees), tuple(gammas), quiet)

    @property
    def draft(self) -> str:
        return self.sweep.drafts[0]

    def as_dict(self) -> dict:
        """The config as ``run.json`` records it: the shared settings flat beside the tree run's own, in the order
        a tree run has always recorded them."""
        shared = {name: getattr(self.sweep, name) for name in SHARED}
        target, engine = shared.pop("target"), shared.pop("engine")
        return {"target": target, "draft": self.draft, "trees": self.trees, "gammas": self.gammas, **shared,
                "quiet": self.quiet, "engine": engine}

    def widest(self, options: list[TreeOption]) -> int:
        """The most draft tokens one round of any cell verifies."""
        return max([o.budget for o in options] + list(self.gammas))


def run_tree_sequences(options: list[TreeOption]) -> int:
    """The sequences each llama.cpp context of the run holds (``n_seq_max``): the most any of its trees needs
    (:func:`~measure.trees.loop.tree_sequences`); 0 without a tree (its chains run in the default context)."""
    return max((tree_sequences(o) for o in options), default=0)


def check_config(cfg: TreeRunConfig) -> list[TreeOption]:
    """The parsed tree options; one-line ``ValueError`` for any bad value, without loading a model."""
    if cfg.sweep.engine == "transformers":
        check_model_spec(cfg.sweep.target, "--target ")
        ds = parse_draft_spec(cfg.draft)
        if ds.kind == "model":
            check_model_spec(ds.arg, "--draft model:")
        draft_spec = ds.to_str()
        ctx, vocab = context_tokens(cfg.sweep.target), vocab_tokens(cfg.sweep.target)
    else:  # the engine's own spec checks (files, GGUF magic, its draft forms); the vocabulary is read on loading
        engines.check_specs(cfg.sweep.engine, cfg.sweep.target, [cfg.draft])
        draft_spec, ctx, vocab = cfg.draft, engines.context_tokens(cfg.sweep.engine, cfg.sweep.target), None
    if not cfg.trees and not cfg.gammas:
        raise ValueError("--tree: give at least one tree (or a --gamma chain), e.g. --tree depth=4,topk=2,budget=8")
    options = []
    for text in cfg.trees:
        opt = parse_tree_option(text)
        check_tree_option(opt, draft_spec=draft_spec, engine=cfg.sweep.engine, context_tokens=ctx, vocab_size=vocab)
        options.append(opt)
    if len({o.label() for o in options}) < len(options):
        raise ValueError(f"--tree: a tree is given twice ({', '.join(o.label() for o in options)})")
    for g in cfg.gammas:
        if not 1 <= g <= MAX_GAMMA:
            raise ValueError(f"--gamma {g}: must be an integer in 1..{MAX_GAMMA}")
    longest = cfg.sweep.max_prompt_tokens + cfg.sweep.max_new_tokens + cfg.widest(options) + 1
    if ctx is not None and longest > ctx:
        raise ValueError(f"--max-prompt-tokens {cfg.sweep.max_prompt_tokens} + --max-new-tokens "
                         f"{cfg.sweep.max_new_tokens} + the largest budget + 1 = {longest} tokens exceeds the "
                         f"target's context of {ctx}")
    return options


def sweep_config(cfg: TreeRunConfig, options: list[TreeOption]) -> SweepConfig:
    """The sweep's config for the tree run's models, prompts and cost curves (greedy, no peer, no library
    baseline, no traces; cost curves over 1..max(widest round's ``budget + 1``, 16) tokens, the verified ones
    with more repeats, as a sweep sizes them: :func:`measure.costpoints.plan_cost_points`)."""
    widest = cfg.widest(options)
    return replace(cfg.sweep, gammas=(GammaSpec("fixed", min(widest, MAX_GAMMA)),), temperatures=(0.0,), peer=False,
                   library=False, traces=False, cost_max_tokens=widest + 1 if widest > MAX_GAMMA else None)


@dataclass(frozen=True)
class TreeVisit:
    """One (repeat, prompt) of a cell as the rows of its tables: the unit a tree run stages on disk
    (``visits.partial.jsonl``, :meth:`measure.records.RunWriter.stage`) as soon as it is measured."""

    cell_id: str
    repeat: int
    prompt_index: int
    generations: tuple[GenerationRow, ...]
    rounds: tuple[RoundRow, ...]
    nodes: tuple[TreeNodeRow, ...]
    ranks: tuple[TreeRankRow, ...]

    def to_record(self) -> dict:
        """The visit as the JSON object staged on disk (its rows by :meth:`measure.rows.Row.to_json`)."""
        return {"cell_id": self.cell_id, "repeat": self.repeat, "prompt_index": self.prompt_index,
                **{t: [r.to_json() for r in rows] for t, rows in zip(VISIT_TABLES, self.tables())}}

    def tables(self) -> tuple[tuple, ...]:
        """The visit's rows, table by table in :data:`VISIT_TABLES` order."""
        return self.generations, self.rounds, self.nodes, self.ranks

    @classmethod
    def from_record(cls, rec: dict) -> "TreeVisit":
        """The visit a staged record holds; ``ValueError`` naming the field that is missing or of the wrong type."""
        for key in ("repeat", "prompt_index"):
            v = rec.get(key)
            if not isinstance(v, int) or isinstance(v, bool):
                raise ValueError(f"{key} {v!r} is not an integer")
        for key in VISIT_TABLES:
            rows = rec.get(key)
            if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
                raise ValueError(f"{key} is not a list of rows")
        return cls(str(rec["cell_id"]), rec["repeat"], rec["prompt_index"],
                   tuple(GenerationRow.from_json(r) for r in rec["generations"]),
                   tuple(RoundRow.from_json(r) for r in rec["rounds"]),
                   tuple(TreeNodeRow.from_json(r) for r in rec["tree_nodes"]),
                   tuple(TreeRankRow.from_json(r) for r in rec["tree_ranks"]))

    def problem(self, repeats: int, n_prompts: int) -> str | None:
        """Why this visit cannot belong to a cell of ``repeats`` repeats over ``n_prompts`` prompts (None if
        it can): indices out of range, rows of another cell, not one baseline and one speculative generation."""
        if not 0 <= self.repeat < repeats:
            return f"repeat {self.repeat} is outside the run's {repeats} repeats"
        if not 0 <= self.prompt_index < n_prompts:
            return f"prompt_index {self.prompt_index} is outside the run's {n_prompts} prompts"
        if any(r.cell_id != self.cell_id for rows in self.tables() for r in rows):
            return "it holds rows of another cell"
        if sorted(r.mode for r in self.generations) != ["baseline", "speculative"]:
            return "its generations are not one baseline and one speculative"
        return None


#: The tables a visit writes, as its staged record names them.
VISIT_TABLES = ("generations", "rounds", "tree_nodes", "tree_ranks")


def _tps(row: GenerationRow) -> float:
    return float(row.tokens_per_s) if row.tokens_per_s is not None else float("nan")


@dataclass
class TreeCell:
    """One cell being measured: its shape and its visits so far, by (repeat, prompt index)."""

    cell: TreeCellId
    loop: str  # "tree" or "chain"
    option: TreeOption | None  # None: a chain-loop cell of ``gamma`` tokens
    gamma: int = 0
    visits: dict[tuple[int, int], TreeVisit] = field(default_factory=dict)

    @property
    def cell_id(self) -> str:
        return self.cell.to_str()

    def speculative_rows(self) -> list[GenerationRow]:
        """The speculative generation of every visit, in measured order (repeat, then prompt)."""
        return [next(r for r in self.visits[k].generations if r.mode == "speculative") for k in sorted(self.visits)]

    @property
    def statuses(self) -> list[str]:
        """Each visit's lossless verdict (``identical``, ``near_tie``, ``failure``), in measured order."""
        return [str(r.lossless) for r in self.speculative_rows()]

    def row(self, domain: str, n_prompts: int, repeats: int, synthetic: bool, hardware: str) -> TreeCellRow:
        """The cell's ``tree_cells.csv`` row from its visits."""
        opt, spec = self.option, self.speculative_rows()
        base = [next(r for r in self.visits[k].generations if r.mode == "baseline") for k in sorted(self.visits)]
        accepted, drafted = sum(r.accepted or 0 for r in spec), sum(r.drafted or 0 for r in spec)
        n_rounds, statuses = sum(r.n_rounds or 0 for r in spec), self.statuses
        base_tps, spec_tps = [_tps(r) for r in base], [_tps(r) for r in spec]
        return TreeCellRow.make(
            cell_id=self.cell_id, draft=self.cell.draft, loop=self.loop, shape=self.cell.shape,
            depth=opt.depth if opt else self.gamma, topk=opt.topk if opt else 1, budget=opt.budget if opt else self.gamma,
            domain=domain, n_prompts=n_prompts, repeats=repeats, new_tokens=sum(r.new_tokens for r in spec),
            tokens_per_s_baseline=float(np.mean(base_tps)), tokens_per_s_speculative=float(np.mean(spec_tps)),
            speedup=speedup_ci(base_tps, spec_tps),
            mean_accepted_per_round=accepted / n_rounds if n_rounds else None,
            mean_nodes_per_round=drafted / n_rounds if n_rounds else None, n_rounds=n_rounds,
            outputs_identical=all(s == "identical" for s in statuses), synthetic=synthetic, hardware=hardware,
            n_near_tie=statuses.count("near_tie"), n_lossless_failures=statuses.count("failure"))


@dataclass(frozen=True)
class RunContext:
    """What every visit of a tree run uses: the writer, the opened models, the timer."""

    writer: records.RunWriter
    session: Session
    config: TreeRunConfig
    timer: Timer

    @property
    def eos(self) -> tuple[int, ...]:
        return tuple(self.session.target.eos_token_ids)

    def baseline(self, ids: torch.Tensor) -> GenerationResult:
        return autoregressive_generate(self.session.decoder, ids, 0.0, self.config.sweep.max_new_tokens, None,
                                       self.eos, self.timer)

    def speculative(self, cell: TreeCell, ids: torch.Tensor) -> tuple[GenerationResult, tuple[TreeRoundRecord, ...]]:
        """One generation of ``cell`` (the chain loop, or the tree loop with its per-round records)."""
        draft = self.session.drafts[0]
        if cell.option is None:
            r = speculative_generate(self.session.decoder, draft, ids, make_policy(f"fixed:{cell.gamma}"), 0.0,
                                     self.config.sweep.max_new_tokens, None, self.eos, self.timer)
            return r, ()
        dec = self.session.decoder
        if not isinstance(dec, TreeDecoder):
            raise ValueError(f"--engine {self.session.engine.name}: its decoder cannot verify a token tree")
        g = tree_generate(dec, make_tree_drafter(draft, cell.option), ids, 0.0, self.config.sweep.max_new_tokens, self.eos,
                          self.timer)
        return g.result, g.tree_rounds


def _generation_row(cell: TreeCell, prompt: Prompt, rep: int, order: int, mode: str, r: GenerationResult,
                    check: LosslessCheck) -> GenerationRow:
    spec = mode == "speculative"
    return GenerationRow(
        cell_id=cell.cell_id, prompt_id=prompt.prompt_id, domain=prompt.domain, mode=mode,
        prompt_tokens=r.prompt_tokens, new_tokens=r.new_tokens, wall_s=r.wall_s,
        tokens_per_s=r.tokens_per_s if math.isfinite(r.tokens_per_s) else None, ttft_ms=r.ttft_ms,
        peak_mem_bytes=r.peak_mem_bytes, outputs_identical=check.status == "identical", repeat=rep, order=order,
        drafted=r.drafted if spec else None, accepted=r.accepted if spec else None,
        n_rounds=len(r.rounds) if spec else None, tokens=tuple(r.tokens), lossless=check.status if spec else None,
        divergence_position=check.position if spec else None, divergence_margin=check.margin if spec else None)


def _tree_rows(cell: TreeCell, prompt: Prompt, rep: int,
               rounds: tuple[TreeRoundRecord, ...]) -> tuple[list[TreeNodeRow], list[TreeRankRow]]:
    nodes, ranks = [], []
    for tr in rounds:
        i = tr.round.round
        nodes += [TreeNodeRow(cell.cell_id, prompt.prompt_id, rep, i, j, tr.parents[j], tr.depths[j], tr.ranks[j],
                              tr.tokens[j], int(tr.accepted[j])) for j in range(len(tr.depths))]
        ranks += [TreeRankRow(cell.cell_id, prompt.prompt_id, rep, i, d, r, k) for d, r, k in tr.target_ranks]
    return nodes, ranks


def visit(ctx: RunContext, cell: TreeCell, prompt: Prompt, rep: int, prompt_index: int, order: int) -> TreeVisit:
    """One (prompt, repeat) of ``cell``: baseline and speculative back to back (the order alternating with
    ``order``, the run's count of generations before this visit), judged; returns it as rows (nothing written)."""
    ids = ctx.session.enc[prompt.prompt_id]
    modes = ("baseline", "speculative") if order % 4 == 0 else ("speculative", "baseline")
    res: dict[str, GenerationResult] = {}
    rounds: tuple[TreeRoundRecord, ...] = ()
    for mode in modes:
        if mode == "baseline":
            res[mode] = ctx.baseline(ids)
        else:
            res[mode], rounds = ctx.speculative(cell, ids)
    spec = res["speculative"]
    check = judge_against_baseline(ctx.session.engine, ctx.session.target, ids, res["baseline"].tokens, spec.tokens)
    nodes, ranks = _tree_rows(cell, prompt, rep, rounds)
    return TreeVisit(cell.cell_id, rep, prompt_index,
                     tuple(_generation_row(cell, prompt, rep, order + k, m, res[m], check) for k, m in enumerate(modes)),
                     tuple(RoundRow(**asdict(rr), cell_id=cell.cell_id, prompt_id=prompt.prompt_id, repeat=rep)
                           for rr in spec.rounds), tuple(nodes), tuple(ranks))


def finish(writer: records.CellWriter[TreeCellRow], cell: TreeCell, row: TreeCellRow) -> None:
    """Write a measured cell: its visits' rows table by table (repeat, then prompt), its ``tree_cells`` row last."""
    visits = in_order(cell.visits)
    write_unit(writer, {table: [r for v in visits for r in v.tables()[i]] for i, table in enumerate(VISIT_TABLES)},
               row)


def staged_visits(writer: records.RunWriter, cells: list[TreeCell], repeats: int, n_prompts: int) -> int:
    """Put the visits staged on disk by an interrupted run into the unfinished ``cells`` they belong to; a record
    that cannot belong is quarantined with the reason (:meth:`measure.records.RunWriter.quarantine`). Returns
    how many were taken."""
    by_id = {c.cell_id: c for c in cells}
    taken = 0
    for v in read_staged(writer, TreeVisit.from_record, by_id, lambda v: v.problem(repeats, n_prompts)):
        cell = by_id[v.cell_id]
        taken += (v.repeat, v.prompt_index) not in cell.visits
        cell.visits[(v.repeat, v.prompt_index)] = v
    return taken


def make_cells(cfg: TreeRunConfig, options: list[TreeOption], draft_name: str, domain: str) -> list[TreeCell]:
    """The run's cells, trees first (in ``--tree`` order), then the chains."""
    cells = [TreeCell(TreeCellId(draft_name, o.label(), domain), "tree", o) for o in options]
    return cells + [TreeCell(TreeCellId.chain(draft_name, g, domain), "chain", None, g) for g in cfg.gammas]


@dataclass(frozen=True)
class OpenedTreeRun:
    """A run directory opened (or resumed) for a tree run, before any model loads: its writer (the fingerprint
    checked) and what ``run.json`` records of the run's setup."""

    writer: records.RunWriter
    meta: dict
    sweep: SweepConfig
    prompts: dict[str, list[Prompt]]
    device: str
    hardware: dict
    versions: dict
    engine_options: EngineOptions


def open_tree_run(cfg: TreeRunConfig, options: list[TreeOption], out_dir: str | Path, command: str = "",
                  say: Callable[[str], None] = lambda _m: None, force_new: bool = False) -> OpenedTreeRun:
    """Open ``out_dir`` for ``cfg``, or resume the tree run there (:func:`measure.runkinds.open_run_dir`): a run of
    another kind is refused, a resume measured differently raises :class:`measure.records.FingerprintMismatch`
    (nothing written); ``force_new``: the run there set aside first, under its lock."""
    out = Path(out_dir)
    scfg = sweep_config(cfg, options)
    device = resolve_device(cfg.sweep.device)
    prompts, selection = select_prompts(scfg)
    hardware, versions, source = environment(device)
    fp = {**fingerprint(scfg, device, selection, hardware, versions), "trees": [o.label() for o in options],
          "gammas": list(cfg.gammas), "draft": cfg.draft}
    writer = open_run_dir(TREES, out, fingerprint=fp, force_new=force_new, say=say)
    eopts = replace(engine_options(scfg, device, cfg.sweep.threads, cfg.quiet),
                    tree_sequences=run_tree_sequences(options))
    meta = dict(command=command, **source, hardware=hardware, versions=versions, prompt_selection=selection,
                config=TREES.stamp({**cfg.as_dict(), "sweep": scfg.as_dict(), "engine_options": asdict(eopts)}))
    return OpenedTreeRun(writer, meta, scfg, prompts, device, hardware, versions, eopts)


def _open_models(opened: OpenedTreeRun, cfg: TreeRunConfig, options: list[TreeOption],
                 say: Callable[[str], None]) -> RunContext:
    """``run.json`` written and the models opened (:func:`open_session`, the target checked against a resumed
    run's fingerprint); returns the context every visit uses."""
    writer = opened.writer
    writer.update(**opened.meta)
    session = open_session(opened.sweep, opened.prompts, opened.engine_options, quiet=cfg.quiet, say=say,
                           check=writer.check_fingerprint)
    writer.update(models=session.models(), versions=session.versions(opened.versions), prompts=session.prompts_meta())
    for opt in options:  # the vocabulary of a GGUF target is known now, before any generation
        check_tree_option(opt, draft_spec=cfg.draft, engine=cfg.sweep.engine, vocab_size=session.target.vocab_size)
    return RunContext(writer, session, cfg, Timer(opened.device))


def _cost_curves(ctx: RunContext, options: list[TreeOption], on_disk: records.Run,
                 say: Callable[[str], None]) -> CostCurves | None:
    """The cost-curve points still to time between the visits (None: none left, or no ``cost_curves``)."""
    s = ctx.session
    cost = cost_curves_left(sweep_config(ctx.config, options), s.target, list(s.drafts), ctx.timer, on_disk,
                            prompt_lengths(s.prompts, s.enc))
    if cost is None:
        return None
    assert cost.plan is not None
    ctx.writer.update(cost_plan=cost.plan.describe(len(s.drafts)))
    say(f"timing the cost curves' {len(cost)} points a few at a time between the visits "
        f"({cost.plan.summary(len(s.drafts))})")
    return cost


def _verdicts(row: TreeCellRow) -> set[str]:
    """The lossless verdicts a finished cell's visits had (from its counts)."""
    near, failed = row.n_near_tie or 0, row.n_lossless_failures or 0
    identical = row.n_prompts * row.repeats - near - failed
    return {v for v, n in (("identical", identical), ("near_tie", near), ("failure", failed)) if n > 0}


def _warm_up(ctx: RunContext, cells: list[TreeCell], first: Prompt, n_visits: int,
             say: Callable[[str], None]) -> None:
    """``warmup`` generations of the baseline and of each cell with visits left to measure (never recorded)."""
    ids = ctx.session.enc[first.prompt_id]
    for cell in cells:
        if len(cell.visits) == n_visits:
            continue
        say(f"warming up {cell.cell_id}")
        for _ in range(ctx.config.sweep.warmup):
            ctx.baseline(ids)
            ctx.speculative(cell, ids)


def _passes(cells: list[TreeCell], done: Container[str], n_prompts: int, repeats: int,
            say: Callable[[str], None]) -> Iterator[tuple[TreeCell, int, int]]:
    """A tree run's schedule: the visits of the unfinished cells, in passes (repeat, then cell, then prompt)."""
    for rep in range(repeats):
        if any((rep, pi) not in c.visits for c in cells if c.cell_id not in done for pi in range(n_prompts)):
            say(f"pass {rep + 1} of {repeats} over {len(cells)} cells x {n_prompts} prompts")
        for cell in cells:
            if cell.cell_id in done:
                continue
            for pi in range(n_prompts):
                yield cell, rep, pi


def _measure(ctx: RunContext, options: list[TreeOption], hardware: dict,
             say: Callable[[str], None]) -> list[TreeCellRow]:
    """Measure the cells' missing visits (each staged on disk at once), then write every unfinished cell."""
    cfg, s, w = ctx.config, ctx.session, ctx.writer
    prompts = [p for ps in s.prompts.values() for p in ps]
    domain = ",".join(s.prompts)
    cells = make_cells(cfg, options, s.drafts[0].name, domain)
    on_disk = records.load_run(w.path)
    done = {r.cell_id: r for r in on_disk.rows(TreeCellRow)}
    todo = [c for c in cells if c.cell_id not in done]
    n_visits = cfg.sweep.repeats * len(prompts)
    taken = staged_visits(w, todo, cfg.sweep.repeats, len(prompts))
    missing = sum(len(missing_visits(c.visits, cfg.sweep.repeats, len(prompts))) for c in todo)
    if w.resumed:
        say(f"resuming {w.path}: {len(done)} of {len(cells)} cells finished, {taken} visit(s) kept from before; "
            f"measuring the {missing} missing")
    _warm_up(ctx, todo, prompts[0], n_visits, say)
    cost = _cost_curves(ctx, options, on_disk, say) if cfg.sweep.cost_curves else None
    per_visit = math.ceil(len(cost) / max(missing, 1)) if cost is not None else 0
    index = {c.cell_id: ci for ci, c in enumerate(cells)}

    def measure(cell: TreeCell, rep: int, pi: int) -> TreeVisit:
        order = 2 * ((rep * len(cells) + index[cell.cell_id]) * len(prompts) + pi)  # generations before it
        return visit(ctx, cell, prompts[pi], rep, pi, order)

    def after(_cell: TreeCell, _v: TreeVisit) -> None:
        if cost is not None and len(cost):
            record_cost(w, cost.measure(per_visit))

    visit_all(w, _passes(cells, done, len(prompts), cfg.sweep.repeats, say), lambda c: c.visits, measure, after)
    if cost is not None and len(cost):
        record_cost(w, cost.measure())
    if cfg.sweep.cost_curves and (cost is not None or "cost_screening" not in w.meta):
        screen_cost(w, cost, say)
    label = records.hardware_label({**hardware, "torch_threads": torch.get_num_threads()})
    rows = []
    for cell in cells:
        row = done.get(cell.cell_id) or cell.row(domain, len(prompts), cfg.sweep.repeats, s.synthetic, label)
        if cell.cell_id not in done:
            finish(w, cell, row)
        rows.append(row)
    w.clear_staged()
    w.update(summary={"cells": len(rows), "all_identical": all(r.outputs_identical for r in rows),
                      "lossless": sorted(set().union(*(_verdicts(r) for r in rows)))})
    return rows


def run_trees(cfg: TreeRunConfig, out_dir: str | Path, command: str = "",
              say: Callable[[str], None] = lambda _m: None, force_new: bool = False) -> list[TreeCellRow]:
    """Measure every cell of ``cfg`` into ``out_dir``; returns the cell rows.

    Re-running the same config into the same ``out_dir`` resumes it: the finished cells are kept, every visit
    staged by the interrupted run (``visits.partial.jsonl``) is used and only the missing visits are measured.
    """
    options = check_config(cfg)
    opened = open_tree_run(cfg, options, out_dir, command, say, force_new)
    with opened.writer.recording():
        ctx = _open_models(opened, cfg, options, say)
        return _measure(ctx, options, opened.hardware, say)


__all__ = ["OpenedTreeRun", "RunContext", "TreeCell", "TreeRunConfig", "TreeVisit", "VISIT_TABLES",
           "check_config", "finish", "make_cells", "open_tree_run", "run_trees", "run_tree_sequences", "staged_visits",
           "sweep_config", "visit"]
