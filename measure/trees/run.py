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

Between the visits the sweep's cost curves are timed a few points at a time
(:class:`measure.sweep.cost.CostCurves`: target forwards of 1..max(``budget + 1``, 16)
tokens over the run's contexts, the draft's step), so ``calibrate`` can price
tree shapes never measured.

The run directory (``docs/RUN_FORMAT.md``, "Tree runs"): ``run.json`` (kind
``trees``); ``generations.csv`` and ``rounds.csv`` in their usual columns;
``cost_target.csv`` and ``cost_draft.csv``; ``tree_nodes.csv`` (every drafted
node), ``tree_ranks.csv`` (every position decided, with the rank the target's
token had among the draft's candidates) and ``tree_cells.csv`` (one row per
cell, written last). The command line: :mod:`measure.trees.cli`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from measure import engines, records
from measure.decoding import autoregressive_generate, speculative_generate
from measure.devices import resolve_device
from measure.drafts import parse_draft_spec
from measure.engines.lossless import LosslessCheck, baseline_logits_at, check_greedy_lossless
from measure.engines.transformers.models import check_model_spec, context_tokens, vocab_tokens
from measure.ids import TreeCellId
from measure.prompts import DOMAINS, Prompt
from measure.rows import GenerationRow, RoundRow, TreeCellRow, TreeNodeRow, TreeRankRow
from measure.seam import GenerationResult
from measure.stats import speedup_ci
from measure.sweep.config import MAX_GAMMA, SweepConfig, engine_options, select_prompts
from measure.sweep.cost import CostCurves, cost_curves_for, prompt_lengths, record_cost, screen_cost
from measure.sweep.identity import environment, fingerprint
from measure.sweep.session import Session, open_session
from measure.timing import Timer
from measure.trees.loop import (TreeOption, TreeRoundRecord, check_tree_option, make_tree_drafter, parse_tree_option,
                                tree_generate, tree_sequences)
from sim.policies import GammaSpec, make_policy


@dataclass(frozen=True)
class TreeRunConfig:
    """What ``python -m measure tree`` measures (validated by :func:`check_config` before any model loads)."""

    target: str
    draft: str
    trees: tuple[str, ...]
    gammas: tuple[int, ...] = ()
    domains: tuple[str, ...] = ("code",)
    prompts_per_domain: int = 2
    max_new_tokens: int = 64
    max_prompt_tokens: int = 256
    repeats: int = 2
    warmup: int = 1
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float32"
    cache: str = "static"
    threads: int | None = None
    cost_curves: bool = True
    quiet: bool = False
    engine: str = "transformers"

    def widest(self, options: list[TreeOption]) -> int:
        """The most draft tokens one round of any cell verifies."""
        return max([o.budget for o in options] + list(self.gammas))


def run_tree_sequences(options: list[TreeOption]) -> int:
    """The sequences each llama.cpp context of the run holds (``n_seq_max``): the most any of its trees needs
    (:func:`~measure.trees.loop.tree_sequences`); 0 without a tree (its chains run in the default context)."""
    return max((tree_sequences(o) for o in options), default=0)


class TreeRunWriter(records.RunWriter):
    """The run writer of a tree run: a cell is finished when its ``tree_cells`` row is written."""

    finish_table = "tree_cells"


def check_config(cfg: TreeRunConfig) -> list[TreeOption]:
    """The parsed tree options; one-line ``ValueError`` for any bad value, without loading a model."""
    if cfg.engine == "transformers":
        check_model_spec(cfg.target, "--target ")
        ds = parse_draft_spec(cfg.draft)
        if ds.kind == "model":
            check_model_spec(ds.arg, "--draft model:")
        draft_spec = ds.to_str()
        ctx, vocab = context_tokens(cfg.target), vocab_tokens(cfg.target)
    else:  # the engine's own spec checks (files, GGUF magic, its draft forms); the vocabulary is read on loading
        engines.check_specs(cfg.engine, cfg.target, [cfg.draft])
        draft_spec, ctx, vocab = cfg.draft, engines.context_tokens(cfg.engine, cfg.target), None
    if not cfg.trees and not cfg.gammas:
        raise ValueError("--tree: give at least one tree (or a --gamma chain), e.g. --tree depth=4,topk=2,budget=8")
    for d in cfg.domains:
        if d not in DOMAINS:
            raise ValueError(f"--domains {d!r}: unknown domain; valid: {', '.join(DOMAINS)}")
    options = []
    for text in cfg.trees:
        opt = parse_tree_option(text)
        check_tree_option(opt, draft_spec=draft_spec, engine=cfg.engine, context_tokens=ctx, vocab_size=vocab)
        options.append(opt)
    if len({o.label() for o in options}) < len(options):
        raise ValueError(f"--tree: a tree is given twice ({', '.join(o.label() for o in options)})")
    for g in cfg.gammas:
        if not 1 <= g <= MAX_GAMMA:
            raise ValueError(f"--gamma {g}: must be an integer in 1..{MAX_GAMMA}")
    longest = cfg.max_prompt_tokens + cfg.max_new_tokens + cfg.widest(options) + 1
    if ctx is not None and longest > ctx:
        raise ValueError(f"--max-prompt-tokens {cfg.max_prompt_tokens} + --max-new-tokens {cfg.max_new_tokens} + "
                         f"the largest budget + 1 = {longest} tokens exceeds the target's context of {ctx}")
    return options


def sweep_config(cfg: TreeRunConfig, options: list[TreeOption]) -> SweepConfig:
    """The sweep's config for the tree run's models, prompts and cost curves (greedy, no peer, no library
    baseline, no traces; cost curves over 1..max(widest round's ``budget + 1``, 16) tokens, the verified ones
    with more repeats, as a sweep sizes them: :func:`measure.costpoints.plan_cost_points`)."""
    widest = cfg.widest(options)
    return SweepConfig(target=cfg.target, drafts=(cfg.draft,), gammas=(GammaSpec("fixed", min(widest, MAX_GAMMA)),),
                       temperatures=(0.0,), domains=cfg.domains, prompts_per_domain=cfg.prompts_per_domain,
                       max_new_tokens=cfg.max_new_tokens, max_prompt_tokens=cfg.max_prompt_tokens, device=cfg.device,
                       dtype=cfg.dtype, seed=cfg.seed, warmup=cfg.warmup, peer=False, library=False, traces=False,
                       cost_curves=cfg.cost_curves, cost_max_tokens=widest + 1 if widest > MAX_GAMMA else None,
                       repeats=cfg.repeats, engine=cfg.engine,
                       threads=cfg.threads, cache=cfg.cache)


@dataclass
class TreeCell:
    """One cell being measured: its shape and what its visits gathered so far."""

    cell: TreeCellId
    loop: str  # "tree" or "chain"
    option: TreeOption | None  # None: a chain-loop cell of ``gamma`` tokens
    gamma: int = 0
    base_tps: list[float] = field(default_factory=list)
    spec_tps: list[float] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)
    new_tokens: int = 0
    accepted: int = 0
    drafted: int = 0
    n_rounds: int = 0

    @property
    def cell_id(self) -> str:
        return self.cell.to_str()

    def row(self, domain: str, n_prompts: int, repeats: int, synthetic: bool, hardware: str) -> TreeCellRow:
        """The cell's ``tree_cells.csv`` row from its visits."""
        opt = self.option
        return TreeCellRow.make(
            cell_id=self.cell_id, draft=self.cell.draft, loop=self.loop, shape=self.cell.shape,
            depth=opt.depth if opt else self.gamma, topk=opt.topk if opt else 1, budget=opt.budget if opt else self.gamma,
            domain=domain, n_prompts=n_prompts, repeats=repeats, new_tokens=self.new_tokens,
            tokens_per_s_baseline=float(np.mean(self.base_tps)), tokens_per_s_speculative=float(np.mean(self.spec_tps)),
            speedup=speedup_ci(self.base_tps, self.spec_tps),
            mean_accepted_per_round=self.accepted / self.n_rounds if self.n_rounds else None,
            mean_nodes_per_round=self.drafted / self.n_rounds if self.n_rounds else None, n_rounds=self.n_rounds,
            outputs_identical=all(s == "identical" for s in self.statuses), synthetic=synthetic, hardware=hardware,
            n_near_tie=self.statuses.count("near_tie"), n_lossless_failures=self.statuses.count("failure"))


@dataclass(frozen=True)
class RunContext:
    """What every visit of a tree run uses: the writer, the opened models, the timer."""

    writer: TreeRunWriter
    session: Session
    config: TreeRunConfig
    timer: Timer

    @property
    def eos(self) -> tuple[int, ...]:
        return tuple(self.session.target.eos_token_ids)

    def baseline(self, ids: torch.Tensor) -> GenerationResult:
        return autoregressive_generate(self.session.decoder, ids, 0.0, self.config.max_new_tokens, None, self.eos,
                                       self.timer)

    def speculative(self, cell: TreeCell, ids: torch.Tensor) -> tuple[GenerationResult, tuple[TreeRoundRecord, ...]]:
        """One generation of ``cell`` (the chain loop, or the tree loop with its per-round records)."""
        draft = self.session.drafts[0]
        if cell.option is None:
            r = speculative_generate(self.session.decoder, draft, ids, make_policy(f"fixed:{cell.gamma}"), 0.0,
                                     self.config.max_new_tokens, None, self.eos, self.timer)
            return r, ()
        g = tree_generate(self.session.decoder, make_tree_drafter(draft, cell.option), ids, 0.0,
                          self.config.max_new_tokens, self.eos, self.timer)
        return g.result, g.tree_rounds

    def lossless(self, ids: torch.Tensor, baseline: GenerationResult, other: GenerationResult) -> LosslessCheck:
        """The speculative output judged against the baseline's (the engine's near-tie tolerance)."""
        tol = self.session.engine.near_tie_tolerance
        if other.tokens == baseline.tokens:
            return LosslessCheck("identical", tolerance=tol)
        logits_at = baseline_logits_at(self.session.target.new_decoder(), ids, baseline.tokens)
        return check_greedy_lossless(baseline.tokens, other.tokens, logits_at, tol)


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


def visit(ctx: RunContext, cell: TreeCell, prompt: Prompt, rep: int, order: int) -> int:
    """One (prompt, repeat) of ``cell``: baseline and speculative back to back (the order alternating with
    ``order``), judged, written; returns the next ``order``."""
    ids = ctx.session.enc[prompt.prompt_id]
    modes = ("baseline", "speculative") if order % 4 == 0 else ("speculative", "baseline")
    res: dict[str, GenerationResult] = {}
    rounds: tuple[TreeRoundRecord, ...] = ()
    for mode in modes:
        if mode == "baseline":
            res[mode] = ctx.baseline(ids)
        else:
            res[mode], rounds = ctx.speculative(cell, ids)
    base, spec = res["baseline"], res["speculative"]
    check = ctx.lossless(ids, base, spec)
    cell.base_tps.append(base.tokens_per_s)
    cell.spec_tps.append(spec.tokens_per_s)
    cell.statuses.append(check.status)
    cell.new_tokens += spec.new_tokens
    cell.accepted += spec.accepted
    cell.drafted += spec.drafted
    cell.n_rounds += len(spec.rounds)
    w = ctx.writer
    w.append("generations", [_generation_row(cell, prompt, rep, order + k, m, res[m], check)
                             for k, m in enumerate(modes)])
    w.append("rounds", [RoundRow(**asdict(rr), cell_id=cell.cell_id, prompt_id=prompt.prompt_id, repeat=rep)
                        for rr in spec.rounds])
    nodes, ranks = _tree_rows(cell, prompt, rep, rounds)
    w.append("tree_nodes", nodes)
    w.append("tree_ranks", ranks)
    return order + len(modes)


def make_cells(cfg: TreeRunConfig, options: list[TreeOption], draft_name: str, domain: str) -> list[TreeCell]:
    """The run's cells, trees first (in ``--tree`` order), then the chains."""
    cells = [TreeCell(TreeCellId(draft_name, o.label(), domain), "tree", o) for o in options]
    return cells + [TreeCell(TreeCellId(draft_name, f"gamma={g}", domain), "chain", None, g) for g in cfg.gammas]


def _open(cfg: TreeRunConfig, options: list[TreeOption], out_dir: str | Path, command: str,
          say: Callable[[str], None]) -> tuple[RunContext, dict]:
    """The run directory written and the models opened (:func:`open_session`); returns the context and the
    machine's hardware record."""
    scfg = sweep_config(cfg, options)
    device = resolve_device(cfg.device)
    prompts, selection = select_prompts(scfg)
    hardware, versions, source = environment(device)
    fp = {**fingerprint(scfg, device, selection, hardware, versions), "trees": [o.label() for o in options],
          "gammas": list(cfg.gammas), "draft": cfg.draft}
    writer = TreeRunWriter(out_dir, resume=False, fingerprint=fp)
    eopts = replace(engine_options(scfg, device, cfg.threads, cfg.quiet), tree_sequences=run_tree_sequences(options))
    writer.update(command=command, **source, hardware=hardware, versions=versions, prompt_selection=selection,
                  config={**asdict(cfg), "kind": "trees", "sweep": scfg.as_dict(), "engine_options": asdict(eopts)})
    session = open_session(scfg, prompts, eopts, quiet=cfg.quiet, say=say, check=writer.check_fingerprint)
    writer.update(models=session.models(), versions=session.versions(versions), prompts=session.prompts_meta())
    for opt in options:  # the vocabulary of a GGUF target is known now, before any generation
        check_tree_option(opt, draft_spec=cfg.draft, engine=cfg.engine, vocab_size=session.target.vocab_size)
    return RunContext(writer, session, cfg, Timer(device)), hardware


def _cost_curves(ctx: RunContext, options: list[TreeOption], say: Callable[[str], None]) -> CostCurves | None:
    """The cost-curve points to time between the visits (None without ``cost_curves``)."""
    if not ctx.config.cost_curves:
        return None
    s = ctx.session
    cost = cost_curves_for(sweep_config(ctx.config, options), s.target, list(s.drafts), ctx.timer,
                           prompt_tokens=prompt_lengths(s.prompts, s.enc))
    assert cost.plan is not None
    ctx.writer.update(cost_plan=cost.plan.describe(len(s.drafts)))
    say(f"timing the cost curves' {len(cost)} points a few at a time between the visits "
        f"({cost.plan.summary(len(s.drafts))})")
    return cost


def run_trees(cfg: TreeRunConfig, out_dir: str | Path, command: str = "",
              say: Callable[[str], None] = lambda _m: None) -> list[TreeCellRow]:
    """Measure every cell of ``cfg`` into ``out_dir`` (a new run directory); returns the cell rows."""
    options = check_config(cfg)
    ctx, hardware = _open(cfg, options, out_dir, command, say)
    s = ctx.session
    prompts = [p for ps in s.prompts.values() for p in ps]
    cells = make_cells(cfg, options, s.drafts[0].name, ",".join(s.prompts))
    label = records.hardware_label({**hardware, "torch_threads": torch.get_num_threads()})
    with ctx.writer.recording():
        for cell in cells:
            say(f"warming up {cell.cell_id}")
            for _ in range(cfg.warmup):
                ctx.baseline(s.enc[prompts[0].prompt_id])
                ctx.speculative(cell, s.enc[prompts[0].prompt_id])
        cost = _cost_curves(ctx, options, say)
        per_visit = math.ceil(len(cost) / (cfg.repeats * len(cells) * len(prompts))) if cost is not None else 0
        order = 0
        for rep in range(cfg.repeats):
            say(f"pass {rep + 1} of {cfg.repeats} over {len(cells)} cells x {len(prompts)} prompts")
            for cell in cells:
                for prompt in prompts:
                    order = visit(ctx, cell, prompt, rep, order)
                    if cost is not None:
                        record_cost(ctx.writer, cost.measure(per_visit))
        if cost is not None:
            record_cost(ctx.writer, cost.measure())
            screen_cost(ctx.writer, cost, say)
        rows = [c.row(",".join(s.prompts), len(prompts), cfg.repeats, s.synthetic, label) for c in cells]
        for row in rows:
            ctx.writer.finish_cell(row)
        ctx.writer.update(summary={"cells": len(rows), "all_identical": all(r.outputs_identical for r in rows),
                                   "lossless": sorted({st for c in cells for st in c.statuses})})
    return rows


__all__ = ["RunContext", "TreeCell", "TreeRunConfig", "TreeRunWriter", "check_config", "make_cells", "run_trees",
           "run_tree_sequences", "sweep_config", "visit"]
