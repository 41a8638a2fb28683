"""``python -m measure tree``: measure token trees (and chains) against the baseline, lossless, into a run directory.

    python -m measure tree --target smollm2-135m --draft bf16 \\
        --tree depth=3,topk=2,budget=6 --tree '[[0],[1],[0,0],[0,0,0]]' --gamma 2,4 --prompts 2

A *cell* is one draft shape: a ``--tree`` (drafted and verified by
:func:`measure.trees.tree_generate`, one target forward per round) or a
``--gamma`` chain (the chain loop, :func:`measure.decoding.speculative_generate`
with ``fixed:γ``). Every visit runs the baseline and the cell on the same prompt
back to back (the order alternating), after one warm-up generation per cell,
``--repeats`` times over every prompt; greedy only, and every speculative output
must equal the baseline's token for token (a divergence is recorded and fails
the run with status 1).

The run directory (``docs/RUN_FORMAT.md``): ``run.json``; ``generations.csv``
and ``rounds.csv`` in their usual columns (modes ``baseline`` and
``speculative``; a tree round's ``gamma`` and ``drafted`` are its node count);
``tree_nodes.csv``, one row per drafted node per tree round (depth, rank,
parent, token, accepted); ``tree_cells.csv``, one row per cell with the speedup
and its 95% CI. Every bad value is refused in one line (exit 2) before a model
loads, except ``topk`` against the vocabulary of a GGUF target, checked as soon
as the target is loaded (before the draft).
"""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.cli import csv_items, fail, int_arg

PROG = "python -m measure tree"
MAX_GAMMA = 64


@dataclass(frozen=True)
class TreeCellRow:
    """One ``tree_cells.csv`` row: a tree or chain against the baseline over every prompt and repeat."""

    cell_id: str
    draft: str
    loop: str  # "tree" (one-forward tree verification) or "chain" (the chain loop)
    shape: str  # the --tree value (canonical) or "gamma=G"
    depth: int
    topk: int
    budget: int
    domain: str
    n_prompts: int
    repeats: int
    new_tokens: int
    tokens_per_s_baseline: float
    tokens_per_s_speculative: float
    speedup: float | None
    speedup_lo: float | None
    speedup_hi: float | None
    mean_accepted_per_round: float | None
    mean_nodes_per_round: float | None
    n_rounds: int
    outputs_identical: bool
    synthetic: bool


@dataclass(frozen=True)
class TreeNodeRow:
    """One ``tree_nodes.csv`` row: a drafted node of one tree round."""

    cell_id: str
    prompt_id: str
    repeat: int
    round: int
    node: int
    parent: int
    depth: int
    rank: int
    token: int
    accepted: int  # 1: on the accepted path


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
    quiet: bool = False


def check_config(cfg: TreeRunConfig) -> list[Any]:
    """The parsed tree options; one-line ``ValueError`` for any bad value, without loading a model."""
    from measure.drafts import parse_draft_spec
    from measure.models import check_model_spec, context_tokens
    from measure.prompts import DOMAINS
    from measure.trees import check_tree_option, parse_tree_option, vocab_tokens

    check_model_spec(cfg.target, "--target ")
    ds = parse_draft_spec(cfg.draft)
    if ds.kind == "model":
        check_model_spec(ds.arg, "--draft model:")
    if not cfg.trees and not cfg.gammas:
        raise ValueError("--tree: give at least one tree (or a --gamma chain), e.g. --tree depth=4,topk=2,budget=8")
    for d in cfg.domains:
        if d not in DOMAINS:
            raise ValueError(f"--domains {d!r}: unknown domain; valid: {', '.join(DOMAINS)}")
    ctx, vocab = context_tokens(cfg.target), vocab_tokens(cfg.target)
    options = []
    for text in cfg.trees:
        opt = parse_tree_option(text)
        check_tree_option(opt, draft_spec=ds.to_str(), context_tokens=ctx, vocab_size=vocab)
        options.append(opt)
    for g in cfg.gammas:
        if not 1 <= g <= MAX_GAMMA:
            raise ValueError(f"--gamma {g}: must be an integer in 1..{MAX_GAMMA}")
    longest = cfg.max_prompt_tokens + cfg.max_new_tokens + max([o.budget for o in options] + list(cfg.gammas)) + 1
    if ctx is not None and longest > ctx:
        raise ValueError(f"--max-prompt-tokens {cfg.max_prompt_tokens} + --max-new-tokens {cfg.max_new_tokens} + "
                         f"the largest budget + 1 = {longest} tokens exceeds the target's context of {ctx}")
    return options


def _cell_id(draft: str, shape: str, domain: str) -> str:
    return f"draft={draft}|shape={shape}|temp=0|domain={domain}"


# long: one straight loop over cells, prompts and repeats, writing rows as they are measured
def run_trees(cfg: TreeRunConfig, out_dir: str | Path, command: str = "") -> list[TreeCellRow]:
    """Measure every cell of ``cfg`` into ``out_dir`` (a new run directory); returns the cell rows."""
    import torch

    from measure import records
    from measure.decoding import autoregressive_generate, speculative_generate
    from measure.engines.base import EngineOptions
    from measure.engines.lossless import first_divergence
    from measure.engines.transformers import TransformersEngine
    from measure.models import resolve_device
    from measure.prompts import load_prompts
    from measure.stats import speedup_ci
    from measure.timing import Timer
    from measure.trees import check_tree_option, make_tree_drafter, tree_generate
    from sim.policies import make_policy

    options = check_config(cfg)
    device = resolve_device(cfg.device)
    widest = max([o.budget for o in options] + list(cfg.gammas))
    eng_opts = EngineOptions(device=device, threads=cfg.threads, cache=cfg.cache,
                             max_len_tokens=cfg.max_prompt_tokens + cfg.max_new_tokens + widest + 2, quiet=cfg.quiet)
    engine = TransformersEngine(eng_opts)
    target = engine.load_target(cfg.target, device=device, dtype=cfg.dtype, seed=cfg.seed)
    for opt in options:  # the vocabulary of a GGUF target is known now, before the draft loads
        check_tree_option(opt, draft_spec=cfg.draft, vocab_size=target.vocab_size)
    draft = engine.make_draft(cfg.draft, target, seed=cfg.seed)
    prompts = [p for d in cfg.domains for p in load_prompts(d, cfg.prompts_per_domain, cfg.seed)]
    enc = {p.prompt_id: engine.encode(target, p.message, cfg.max_prompt_tokens) for p in prompts}
    domain = ",".join(cfg.domains)
    meta = {"command": command, "kind": "trees", "config": asdict(cfg), "versions": dict(engine.versions()),
            "models": {"target": target.describe(), "draft": draft.describe()},
            "hardware": {"machine": platform.machine(), "processor": platform.processor(), "device": device}}

    class TreeRunWriter(records.RunWriter):
        finish_table = "tree_cells"

    writer = TreeRunWriter(out_dir, meta=meta, resume=False)
    timer = Timer(torch.device(device))
    eos = tuple(target.eos_token_ids)
    cells: list[tuple[str, str, Any, int]] = [("tree", o.label(), o, 0) for o in options]
    cells += [("chain", f"gamma={g}", None, g) for g in cfg.gammas]
    rows: list[TreeCellRow] = []
    with writer.recording():
        for loop, shape, opt, gamma in cells:
            cid = _cell_id(draft.name, shape, domain)

            def spec(ids: torch.Tensor, opt: Any = opt, gamma: int = gamma) -> tuple[Any, tuple]:
                if opt is None:
                    r = speculative_generate(target, draft, ids, make_policy(f"fixed:{gamma}"), 0.0,
                                             cfg.max_new_tokens, None, eos, timer)
                    return r, ()
                g = tree_generate(target, make_tree_drafter(draft, opt), ids, 0.0, cfg.max_new_tokens, eos, timer)
                return g.result, g.tree_rounds

            for _ in range(cfg.warmup):
                first = enc[prompts[0].prompt_id]
                autoregressive_generate(target, first, 0.0, cfg.max_new_tokens, None, eos, timer)
                spec(first)
            base_tps, spec_tps, gen_rows, round_rows, node_rows = [], [], [], [], []
            identical, new_tokens, accepted, n_rounds, nodes = True, 0, 0, 0, 0
            order = 0
            for rep in range(cfg.repeats):
                for pi, p in enumerate(prompts):
                    ids = enc[p.prompt_id]
                    modes = ("baseline", "speculative") if (rep + pi) % 2 == 0 else ("speculative", "baseline")
                    res: dict[str, Any] = {}
                    trounds: tuple = ()
                    for mode in modes:
                        if mode == "baseline":
                            res[mode] = autoregressive_generate(target, ids, 0.0, cfg.max_new_tokens, None, eos, timer)
                        else:
                            res[mode], trounds = spec(ids)
                    b, s = res["baseline"], res["speculative"]
                    same = b.tokens == s.tokens
                    identical &= same
                    div = first_divergence(b.tokens, s.tokens)
                    base_tps.append(b.tokens_per_s)
                    spec_tps.append(s.tokens_per_s)
                    new_tokens += s.new_tokens
                    accepted += s.accepted
                    n_rounds += len(s.rounds)
                    nodes += s.drafted
                    for mode in modes:
                        r = res[mode]
                        gen_rows.append({"cell_id": cid, "prompt_id": p.prompt_id, "domain": p.domain, "mode": mode,
                                         "prompt_tokens": r.prompt_tokens, "new_tokens": r.new_tokens,
                                         "wall_s": r.wall_s, "tokens_per_s": r.tokens_per_s, "ttft_ms": r.ttft_ms,
                                         "peak_mem_bytes": r.peak_mem_bytes, "outputs_identical": same,
                                         "repeat": rep, "order": order, "drafted": r.drafted if r.rounds else None,
                                         "accepted": r.accepted if r.rounds else None,
                                         "n_rounds": len(r.rounds) if r.rounds else None,
                                         "tokens": " ".join(map(str, r.tokens)),
                                         "lossless": ("identical" if same else "failure") if r is s else None,
                                         "divergence_position": div if r is s else None})
                        order += 1
                    round_rows += [{**asdict(rr), "cell_id": cid, "prompt_id": p.prompt_id, "repeat": rep}
                                   for rr in s.rounds]
                    for tr in trounds:
                        for j in range(len(tr.depths)):
                            node_rows.append(asdict(TreeNodeRow(cid, p.prompt_id, rep, tr.round.round, j,
                                                                tr.parents[j], tr.depths[j], tr.ranks[j],
                                                                tr.tokens[j], int(tr.accepted[j]))))
            est = speedup_ci(base_tps, spec_tps)
            row = TreeCellRow(
                cell_id=cid, draft=draft.name, loop=loop, shape=shape, depth=opt.depth if opt else gamma,
                topk=opt.topk if opt else 1, budget=opt.budget if opt else gamma, domain=domain,
                n_prompts=len(prompts), repeats=cfg.repeats, new_tokens=new_tokens,
                tokens_per_s_baseline=float(np.mean(base_tps)), tokens_per_s_speculative=float(np.mean(spec_tps)),
                speedup=est.value, speedup_lo=est.lo, speedup_hi=est.hi,
                mean_accepted_per_round=accepted / n_rounds if n_rounds else None,
                mean_nodes_per_round=nodes / n_rounds if n_rounds else None, n_rounds=n_rounds,
                outputs_identical=identical, synthetic=bool(target.synthetic))
            writer.append("generations", gen_rows)
            writer.append("rounds", round_rows)
            writer.append("tree_nodes", node_rows)
            writer.finish_cell(asdict(row))
            rows.append(row)
        writer.update(summary={"cells": len(rows), "all_identical": all(r.outputs_identical for r in rows)})
    return rows


def _fmt(v: float | None, nd: int = 2) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def print_cells(rows: Sequence[TreeCellRow], out: Any = None) -> None:
    """The cells as a plain table."""
    out = out or sys.stdout
    print(f"{'loop':6} {'shape':34} {'nodes':>6} {'acc/round':>9} {'tok/s base':>10} {'tok/s spec':>10} "
          f"{'speedup [95% CI]':>22} lossless", file=out)
    for r in rows:
        ci = f"{_fmt(r.speedup)} [{_fmt(r.speedup_lo)}, {_fmt(r.speedup_hi)}]"
        print(f"{r.loop:6} {r.shape[:34]:34} {_fmt(r.mean_nodes_per_round, 1):>6} "
              f"{_fmt(r.mean_accepted_per_round):>9} {r.tokens_per_s_baseline:10.1f} {r.tokens_per_s_speculative:10.1f} "
              f"{ci:>22} {'yes' if r.outputs_identical else 'NO'}", file=out)


def build_parser() -> argparse.ArgumentParser:
    from toolkit.cli import OneLineParser

    p = OneLineParser(prog=PROG, description="Measure token trees (one-forward tree verification) and chains "
                                              "against the baseline, greedy and lossless, into a run directory.")
    p.add_argument("--target", default="smollm2-135m", help="target model spec (default smollm2-135m)")
    p.add_argument("--draft", required=True, help="one draft: a model draft (model:SPEC, early:N, layers:, int8, "
                                                  "bf16, fp16) or prompt lookup ngram:N")
    p.add_argument("--tree", action="append", default=[], metavar="SPEC",
                   help="a tree: depth=D,topk=K[,budget=N] (SGLang's steps/topk, N draft tokens verified) or a path "
                        "list '[[0],[1],[0,0]]'; repeatable")
    p.add_argument("--gamma", default="", help="comma list of chain lengths measured by the chain loop beside")
    p.add_argument("--domains", default="code", help="comma list of prompt domains (default code)")
    p.add_argument("--prompts", type=int_arg(1, 10_000), default=2, help="prompts per domain")
    p.add_argument("--max-new-tokens", type=int_arg(1, 100_000), default=64)
    p.add_argument("--max-prompt-tokens", type=int_arg(1, 1_000_000), default=256)
    p.add_argument("--repeats", type=int_arg(1, 1000), default=2)
    p.add_argument("--warmup", type=int_arg(0, 100), default=1)
    p.add_argument("--temperature", default="0", help="0 only: trees are greedy until multi-candidate rejection "
                                                      "sampling is built")
    p.add_argument("--engine", default="transformers", help="transformers only (tree verification)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--cache", default="static", choices=("static", "dynamic"))
    p.add_argument("--threads", type=int_arg(1, 1024), default=None)
    p.add_argument("--seed", type=int_arg(0, 2**31 - 1), default=0)
    p.add_argument("--out", default=None, help="a new run directory (default runs/trees-<timestamp>)")
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m measure tree``: 0 when every output was lossless, 1 when one was not, 2 on bad input."""
    from measure.trees import check_tree_option, parse_tree_option

    args = build_parser().parse_args(argv)
    try:
        temp = float(args.temperature)
    except ValueError:
        fail(PROG, f"--temperature {args.temperature!r}: not a number; valid: 0")
    try:
        gammas = tuple(int(g) for g in csv_items("--gamma", args.gamma, PROG)) if args.gamma.strip() else ()
    except ValueError:
        fail(PROG, f"--gamma {args.gamma!r}: need comma-separated integers in 1..{MAX_GAMMA}")
    cfg = TreeRunConfig(target=args.target, draft=args.draft, trees=tuple(args.tree), gammas=gammas,
                        domains=tuple(csv_items("--domains", args.domains, PROG)), prompts_per_domain=args.prompts,
                        max_new_tokens=args.max_new_tokens, max_prompt_tokens=args.max_prompt_tokens,
                        repeats=args.repeats, warmup=args.warmup, seed=args.seed, device=args.device,
                        dtype=args.dtype, cache=args.cache, threads=args.threads, quiet=args.quiet)
    try:
        from measure.drafts import parse_draft_spec

        parse_draft_spec(args.draft)
        for text in cfg.trees:  # the engine and temperature refusals name the tree
            check_tree_option(parse_tree_option(text), draft_spec=args.draft, engine=args.engine, temperature=temp)
        if args.engine != "transformers":
            raise ValueError(f"--engine {args.engine}: tree runs use the transformers engine; valid: transformers")
        if temp != 0:
            raise ValueError(f"--temperature {args.temperature}: tree runs are greedy; valid: 0")
        check_config(cfg)
    except ValueError as e:
        fail(PROG, e)
    from measure.records import utc_now

    out = Path(args.out or f"runs/trees-{utc_now().replace(':', '').replace('-', '')[:15]}")
    if (out / "run.json").exists():
        fail(PROG, f"--out {str(out)!r} already holds a run; choose a new directory")
    try:
        rows = run_trees(cfg, out, " ".join([PROG, *(argv if argv is not None else sys.argv[2:])]))
    except ValueError as e:
        fail(PROG, e)
    print_cells(rows)
    print(f"run directory: {out}")
    if not all(r.outputs_identical for r in rows):
        print(f"{PROG}: error: a speculative output differs from the baseline's (see generations.csv)",
              file=sys.stderr)
        return 1
    return 0
