"""``python -m measure tree``: measure token trees (and chains) against the baseline, lossless, into a run directory.

    python -m measure tree --target smollm2-135m --draft int8 \\
        --tree '[[0],[1],[0,0]]' --tree depth=3,topk=2,budget=6 --gamma 2,4 --prompts 2
    python -m measure tree --engine llamacpp --target smollm2-135m --draft ngram:3 \\
        --tree '[[0],[1],[0,0]]' --tree depth=3,topk=2,budget=5 --gamma 2,4 --prompts 2

Re-running a command with the same ``--out`` resumes the tree run there (after
a Ctrl-C, a SIGTERM or a SIGKILL): its finished cells and visits are kept and
only the missing visits are measured; ``--force-new`` moves it aside instead.
Arguments are parsed and checked here (one line naming the value and flag,
exit status 2, before any model loads, except ``topk`` against the vocabulary
of a GGUF target, checked as soon as the target is loaded); the experiment runs
from its config (:func:`measure.trees.run.run_trees`) and its cells are printed
here: exit 0 when every output was lossless, 1 when one was not.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from measure.cli import quiet_third_party
from measure.drafts import parse_draft_spec
from measure.records import strict_dumps, utc_now
from measure.rows import TreeCellRow
from measure.sweep.config import MAX_GAMMA
from measure.trees.loop import check_tree_option, parse_tree_option
from measure.trees.run import TreeRunConfig, check_config, run_trees
from toolkit.cli import OneLineParser, csv_items, exit_on_next_interrupt, fail, int_arg

PROG = "python -m measure tree"


def _fmt(v: float | None, nd: int = 2) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def print_cells(rows: Sequence[TreeCellRow], out: TextIO | None = None) -> None:
    """The cells as a plain table: shape, nodes and tokens per round, tokens/s, speedup with its 95% CI."""
    out = out or sys.stdout
    print(f"{'loop':6} {'shape':34} {'nodes':>6} {'acc/round':>9} {'tok/s base':>10} {'tok/s spec':>10} "
          f"{'speedup [95% CI]':>22} lossless", file=out)
    for r in rows:
        ci = f"{_fmt(r.speedup)} [{_fmt(r.speedup_lo)}, {_fmt(r.speedup_hi)}]"
        print(f"{r.loop:6} {r.shape[:34]:34} {_fmt(r.mean_nodes_per_round, 1):>6} "
              f"{_fmt(r.mean_accepted_per_round):>9} {r.tokens_per_s_baseline:10.1f} {r.tokens_per_s_speculative:10.1f} "
              f"{ci:>22} {'yes' if r.outputs_identical else 'NO'}", file=out)


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m measure tree``."""
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
    p.add_argument("--engine", default="transformers", help="transformers (default) or llamacpp: both verify a "
                                                               "tree in one target forward")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--cache", default="static", choices=("static", "dynamic"))
    p.add_argument("--threads", type=int_arg(1, 1024), default=None)
    p.add_argument("--seed", type=int_arg(0, 2**31 - 1), default=0)
    p.add_argument("--no-cost-curves", action="store_true", help="skip timing the cost curves (calibrate needs them "
                                                                 "to predict shapes it did not measure)")
    p.add_argument("--out", default=None, help="the run directory (default runs/trees-<timestamp>); a tree run "
                                               "already there is resumed: its finished visits are kept")
    p.add_argument("--force-new", action="store_true", help="move a run already in --out to "
                                                            "<out>.replaced-<UTC> and start afresh")
    p.add_argument("--quiet", action="store_true", help="silence third-party loading output")
    return p


def config_from_args(args: argparse.Namespace) -> TreeRunConfig:
    """A checked :class:`TreeRunConfig` (one-line ``ValueError`` naming any bad value; no model loads)."""
    try:
        temp = float(args.temperature)
    except ValueError:
        raise ValueError(f"--temperature {args.temperature!r}: not a number; valid: 0") from None
    try:
        gammas = tuple(int(g) for g in csv_items("--gamma", args.gamma, PROG)) if args.gamma.strip() else ()
    except ValueError:
        raise ValueError(f"--gamma {args.gamma!r}: need comma-separated integers in 1..{MAX_GAMMA}") from None
    if args.engine == "transformers":
        parse_draft_spec(args.draft)
    for text in args.tree:  # the engine and temperature refusals name the tree
        check_tree_option(parse_tree_option(text), draft_spec=args.draft, engine=args.engine, temperature=temp)
    if temp != 0:
        raise ValueError(f"--temperature {args.temperature}: tree runs are greedy; valid: 0")
    cfg = TreeRunConfig.of(args.target, args.draft, tuple(args.tree), gammas, args.quiet,
                           domains=tuple(csv_items("--domains", args.domains, PROG)), prompts_per_domain=args.prompts,
                           max_new_tokens=args.max_new_tokens, max_prompt_tokens=args.max_prompt_tokens,
                           repeats=args.repeats, warmup=args.warmup, seed=args.seed, device=args.device,
                           dtype=args.dtype, cache=args.cache, threads=args.threads,
                           cost_curves=not args.no_cost_curves, engine=args.engine)
    check_config(cfg)
    return cfg


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m measure tree``: 0 when every output was lossless, 1 when one was not, 2 on bad input."""
    args = build_parser().parse_args(argv)
    try:
        cfg = config_from_args(args)
    except ValueError as e:
        fail(PROG, e)
    out = Path(args.out or f"runs/trees-{utc_now().replace(':', '').replace('-', '')[:15]}")
    if args.quiet:
        quiet_third_party()
    try:
        rows = run_trees(cfg, out, " ".join([PROG, *(argv if argv is not None else sys.argv[2:])]), _say,
                         force_new=args.force_new)
    except ValueError as e:
        fail(PROG, e)
    except KeyboardInterrupt:
        exit_on_next_interrupt(130)
        print(f"interrupted: every finished visit of the run in {out} is kept; re-run the same command with the "
              "same --out to resume", file=sys.stderr)
        return 130
    print_cells(rows)
    print(f"run directory: {out}")
    failures, ties = sum(r.n_lossless_failures or 0 for r in rows), sum(r.n_near_tie or 0 for r in rows)
    print(strict_dumps({"out": str(out), "cells": len(rows), "all_identical": all(r.outputs_identical for r in rows),
                        "near_ties": ties, "lossless_failures": failures}))
    if ties:
        print(f"note: {ties} speculative output(s) left the baseline's at a near tie of the target's logits, within "
              "the engine's tolerance (generations.csv columns lossless, divergence_margin)", file=sys.stderr)
    if failures:
        print(f"{PROG}: error: {failures} speculative output(s) differ from the baseline's beyond a near tie "
              "(generations.csv column lossless)", file=sys.stderr)
        return 1
    return 0


def _say(message: str) -> None:
    print(f"[tree] {message}", file=sys.stderr, flush=True)


__all__ = ["PROG", "build_parser", "config_from_args", "main", "print_cells"]
