"""The pruned-head experiments' command lines: ``python -m measure head-sweep`` and ``python -m measure head-recall``.

Arguments are parsed and checked here (one line naming the value and flag, exit
status 2, before any model loads), the experiments run from their configs
(:func:`measure.head.head_sweep.run_head_sweep`,
:func:`measure.head.head_recall.run_head_recall`) and their tables are printed
here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from measure import records, stats
from measure.cli import quiet_third_party
from measure.head.head_recall import DEFAULT_KS, HeadRecallConfig, run_head_recall
from measure.head.head_sweep import MAX_HEAD_K, SWEEP_VARIANTS, HeadSweepConfig, run_head_sweep
from measure.prompts import DOMAINS
from measure.sweep import summary_lines
from measure.records import strict_dumps
from toolkit.cli import OneLineParser, csv_items, exit_on_next_interrupt, fail, int_arg


# -- head-sweep ---------------------------------------------------------------------------------
def add_head_sweep_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Options of the head sweep (``python -m measure head-sweep``)."""
    d = HeadSweepConfig()
    p.add_argument("--target", default=d.target, help="target model spec (default %(default)s)")
    p.add_argument("--draft", default=d.draft, help="model-backed draft kind whose lm_head is pruned (default %(default)s)")
    p.add_argument("--ks", default=",".join(d.head_ks), help="head sizes K, comma separated; 'full' = dense")
    p.add_argument("--variants", default=",".join(d.variants), help=f"subset of {','.join(SWEEP_VARIANTS)}")
    p.add_argument("--domains", default=",".join(d.domains), help=f"subset of {','.join(DOMAINS)}")
    p.add_argument("--prompts-per-domain", type=int_arg(1, 10_000), default=d.prompts_per_domain)
    p.add_argument("--max-new-tokens", type=int_arg(1, 100_000), default=d.max_new_tokens)
    p.add_argument("--gamma", type=int_arg(1, 64), default=d.gamma, help="fixed draft length γ of the end-to-end runs")
    p.add_argument("--repeats", type=int_arg(1, 1000), default=d.repeats, help="repeats per prompt and cell")
    p.add_argument("--until-stable", type=int_arg(0, 100), default=0, help="re-measure an unstable cell up to N times")
    p.add_argument("--n-clusters", type=int_arg(1, MAX_HEAD_K), default=d.n_clusters)
    p.add_argument("--scoring", default=d.scoring, choices=("cosine", "mean", "max_norm"), help="cluster scoring")
    p.add_argument("--rank", type=int_arg(1, 65_536), default=d.lowrank_rank,
                   help="rank r of the low-rank selector's scorer")
    p.add_argument("--moment-texts", type=int_arg(1, 100_000), default=d.moment_texts,
                   help="calibration conversations the low-rank scorer's hidden-state moment is estimated on")
    p.add_argument("--calibration-texts", type=int_arg(1, 100_000), default=d.calibration_texts)
    p.add_argument("--context-tokens", type=int_arg(1, 1_000_000), default=d.context_tokens)
    p.add_argument("--head-repeats", type=int_arg(1, 100_000), default=d.head_repeats)
    p.add_argument("--device", default=d.device)
    p.add_argument("--dtype", default=d.dtype)
    p.add_argument("--seed", type=int_arg(0, 2**31 - 1), default=d.seed)
    p.add_argument("--threads", type=int_arg(1, 1024), default=None,
                   help="torch CPU threads (default: torch's); 1 avoids OpenMP stalls on a shared machine")
    p.add_argument("--no-profile", action="store_true", help="skip the profiler split")
    p.add_argument("--cache-dir", default=None, help="cluster cache (default ~/.cache/specscope/clusters)")
    p.add_argument("--quiet", action="store_true", help="silence third-party loading output")
    p.add_argument("--out", required=True, help="run directory to write (resumed if it exists)")
    return p


def config_from_args(args: argparse.Namespace) -> HeadSweepConfig:
    """A validated :class:`HeadSweepConfig` from parsed :func:`add_head_sweep_arguments` options."""
    prog = "python -m measure head-sweep"
    return HeadSweepConfig(
        target=args.target, draft=args.draft, head_ks=tuple(csv_items("--ks", args.ks, prog)),
        variants=tuple(csv_items("--variants", args.variants, prog)),
        domains=tuple(csv_items("--domains", args.domains, prog)), prompts_per_domain=args.prompts_per_domain,
        max_new_tokens=args.max_new_tokens, gamma=args.gamma, n_clusters=args.n_clusters, scoring=args.scoring,
        lowrank_rank=args.rank, moment_texts=args.moment_texts,
        calibration_texts=args.calibration_texts, context_tokens=args.context_tokens,
        head_repeats=args.head_repeats, device=args.device, dtype=args.dtype, seed=args.seed,
        profile=not args.no_profile, cache_dir=args.cache_dir, repeats=args.repeats,
        until_stable=args.until_stable, threads=args.threads)


def format_table(run: records.Run) -> str:
    """The head sweep as a fixed-width table (one line per variant and K; speedup with its 95% CI)."""
    rows = list(run.meta.get("head_sweep_rows", {}).values())
    heads = ("variant", "K", "head ms", "fast ms", "step ms", "accept", "recall", "e2e acc", "tok/s", "base",
             "speedup [95% CI]", "same", "unstable")

    def ci(r: dict) -> str:
        return stats.Estimate(r.get("speedup"), r.get("speedup_lo"), r.get("speedup_hi")).as_text(3)

    lines = [[r["variant"], str(r["head_k"]), f"{r['head_ms']:.3f}", f"{r['head_fast_ms']:.3f}",
              f"{r['draft_step_ms']:.2f}", f"{r['acceptance_rate']:.4f}", f"{r['kept_recall']:.4f}",
              f"{r['e2e_acceptance_rate']:.3f}", f"{r['tokens_per_s']:.2f}", f"{r['tokens_per_s_baseline']:.2f}",
              ci(r), str(r["outputs_identical"]), str(r.get("n_unstable", "-"))]
             for r in sorted(rows, key=lambda r: (r["variant"] != "dense", r["variant"], r["head_k"]))]
    w = [max(len(h), *(len(x[i]) for x in lines)) if lines else len(h) for i, h in enumerate(heads)]
    out = ["  ".join(h.ljust(n) for h, n in zip(heads, w))]
    out += ["  ".join(c.ljust(n) for c, n in zip(x, w)) for x in lines]
    return "\n".join(out)


def head_sweep_main(argv: list[str] | None = None) -> int:
    """``python -m measure head-sweep``: run the sweep, print the table; one-line errors, exit 2."""
    prog = "python -m measure head-sweep"
    parser = add_head_sweep_arguments(OneLineParser(
        prog=prog, description="Pruned draft vocabulary head: the K sweep (cells of the main sweep)."))
    args = parser.parse_args(argv)
    command = prog + " " + " ".join(sys.argv[1:] if argv is None else argv)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        fail(prog, f"--out {str(out)!r} is a file, not a directory; choose a directory path")
    try:
        cfg = config_from_args(args)
    except ValueError as e:
        fail(prog, str(e))
    if args.quiet:
        quiet_third_party()
    try:
        run = run_head_sweep(cfg, out, command=command, quiet=args.quiet,
                             progress=lambda m: print(f"[head_sweep] {m}", file=sys.stderr, flush=True))
    except ValueError as e:
        fail(prog, str(e))
    except KeyboardInterrupt:
        exit_on_next_interrupt(130)
        print(f"interrupted: finished cells are kept in {out} (re-run with the same --out to resume)",
              file=sys.stderr)
        return 130
    print(format_table(run))
    for line in summary_lines(run.summary):
        print(line)
    print(records.strict_dumps({"out": str(args.out), "summary": run.summary}))
    return 0


# -- head-recall --------------------------------------------------------------------------------
def _ints(text: str, option: str) -> list[int]:
    out = []
    for t in (x.strip() for x in str(text).split(",")):
        if not t:
            continue
        try:
            out.append(int(t))
        except ValueError:
            raise ValueError(f"{option} value {t!r} is not an integer (comma-separated integers expected)") from None
    return out


def head_recall_parser(prog: str) -> argparse.ArgumentParser:
    """Options of ``python -m measure head-recall``."""
    d = HeadRecallConfig()
    ap = OneLineParser(prog=prog, description="Offline recall of the pruned-head selectors: is the dense head's "
                       "argmax among the K kept tokens?")
    ap.add_argument("--model", default=d.model, help="target model spec (default %(default)s)")
    ap.add_argument("--draft", default=d.draft, help="model-backed draft whose head is pruned (default %(default)s)")
    ap.add_argument("--ks", default=",".join(map(str, DEFAULT_KS)), help="head sizes K (comma list, each >= 1)")
    ap.add_argument("--ranks", default=",".join(map(str, d.ranks)), help="ranks of the low-rank scorer (comma "
                    "list, each >= 1)")
    ap.add_argument("--domains", default=",".join(d.domains))
    ap.add_argument("--prompts-per-domain", type=int_arg(1, 10_000), default=d.prompts_per_domain)
    ap.add_argument("--max-tokens", type=int_arg(2, 1_000_000), default=d.max_tokens,
                    help="tokens of held-out text per prompt (>= 2: one position is predicted from the one before)")
    ap.add_argument("--n-clusters", type=int_arg(1, MAX_HEAD_K), default=d.n_clusters)
    ap.add_argument("--moment-texts", type=int_arg(1, 100_000), default=d.moment_texts)
    ap.add_argument("--calibration-texts", type=int_arg(1, 100_000), default=d.calibration_texts)
    ap.add_argument("--seed", type=int_arg(0, 2**31 - 1), default=d.seed)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--out", required=True, help="directory for recall.csv and recall.json")
    return ap


def _recall_config(args: argparse.Namespace, prog: str) -> HeadRecallConfig:
    """A validated :class:`HeadRecallConfig` from parsed options (``ValueError`` naming the flag)."""
    return HeadRecallConfig(
        model=args.model, draft=args.draft, ks=tuple(_ints(",".join(csv_items("--ks", args.ks, prog)), "--ks")),
        ranks=tuple(_ints(",".join(csv_items("--ranks", args.ranks, prog)), "--ranks")),
        domains=tuple(csv_items("--domains", args.domains, prog)), prompts_per_domain=args.prompts_per_domain,
        max_tokens=args.max_tokens, n_clusters=args.n_clusters, moment_texts=args.moment_texts,
        calibration_texts=args.calibration_texts, seed=args.seed, cache_dir=args.cache_dir)


def _writable_dir(out: Path) -> None:
    """Create and probe the output directory first, so results are never lost at the end (``ValueError``)."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} is a file, not a directory; choose a directory path")
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / ".write_probe").write_text("")
        (out / ".write_probe").unlink()
    except OSError as e:
        raise ValueError(f"--out {str(out)!r} is not writable: {e.strerror or e}") from None


def head_recall_main(argv: list[str] | None = None) -> int:
    """``python -m measure head-recall``: one-line errors (exit 2) before any model loads; the recall table."""
    prog = "python -m measure head-recall"
    args = head_recall_parser(prog).parse_args(argv)
    out = Path(args.out)
    try:
        config = _recall_config(args, prog)
        _writable_dir(out)
    except ValueError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    command = "python -m measure head-recall " + " ".join(sys.argv[1:] if argv is None else argv)
    try:
        table, meta = run_head_recall(config, out, command)
    except ValueError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    wide = table[table.domain == "all"].pivot(index="selector", columns="head_k", values="recall")
    print(wide.sort_values(wide.columns[len(wide.columns) // 2], ascending=False).to_string(float_format="%.4f"))
    print(strict_dumps(meta))
    return 0
