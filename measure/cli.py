"""``python -m measure``: run a measurement sweep, print a summary table and one JSON line.

With no arguments: the packaged SmolLM2-135M target with the default draft
(chosen by measurement on a 2-core CPU, see ``DEFAULT_DRAFTS``) over the three
prompt domains, greedy; on a CUDA machine also the synthetic
``gpt2-small-large`` and ``llama3-1b-3b`` pairs for timing (each in its own
run directory next to the first). Bad input exits with a one-line error.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from pathlib import Path

DEFAULT_TARGET = "smollm2-135m"
#: Chosen by measurement on the 2-core CPU (README, "Measured on this CPU"):
#: ``python -m measure --draft ngram:3,int8,bf16 --gamma 4 --prompts 2 --max-new-tokens 64
#: --no-cost --no-peer`` gave 1.16x / 0.89x / 0.97x (code / conversation / docs) for
#: prompt lookup, 1.17x / 0.85x / 0.84x for an int8 copy and 1.01x / 1.03x / 0.98x for a
#: bf16 copy; prompt lookup ties for the best mean and needs no second copy of the model.
DEFAULT_DRAFTS = ("ngram:3",)
#: Two draft lengths, so that ``calibrate --holdout gamma`` has one to fit and one to predict.
DEFAULT_GAMMAS = ("fixed:2", "fixed:4")
GPU_DEFAULT_PAIRS = ("gpt2-small-large", "llama3-1b-3b")


def _csv(text: str) -> list[str]:
    return [t.strip() for t in str(text).split(",") if t.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m measure", description=__doc__.splitlines()[0],
                                epilog="subcommands: python -m measure head-sweep --help (pruned draft head K sweep), "
                                       "python -m measure head-recall --help (selector recall, offline)")
    p.add_argument("--target", default=None, help=f"target model spec (default {DEFAULT_TARGET})")
    p.add_argument("--draft", default=None,
                   help="comma list of draft kinds: ngram[:N], early:N, layers:a-b,.. (use ';' between), "
                        "int8, bf16, fp16, model:<spec> (default: %s)" % ",".join(DEFAULT_DRAFTS))
    p.add_argument("--pair", default=None, help="synthetic preset pair (e.g. gpt2-small-large): "
                   "target and draft with random weights, timing only")
    p.add_argument("--gamma", default=",".join(DEFAULT_GAMMAS),
                   help="comma list of γ: integers or policies fixed:G, heuristic:G, threshold:G")
    p.add_argument("--temperature", default="0", help="comma list of temperatures >= 0 (0 = greedy)")
    p.add_argument("--domains", default=None, help="comma list of prompt domains (default: all)")
    p.add_argument("--prompts", type=int, default=2, help="prompts per domain")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--max-prompt-tokens", type=int, default=256)
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=1, help="warm-up generations per cell (not recorded)")
    p.add_argument("--out", default=None, help="run directory (default runs/measure-<timestamp>); "
                   "an existing run directory is resumed, skipping finished cells")
    p.add_argument("--no-peer", action="store_true", help="skip transformers' assisted generation")
    p.add_argument("--no-traces", action="store_true", help="skip teacher-forced acceptance traces")
    p.add_argument("--no-cost", action="store_true", help="skip the cost curves")
    p.add_argument("--cost-contexts", default="64,160,256", help="context lengths of the cost curves")
    p.add_argument("--cost-max-tokens", type=int, default=16)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _split_drafts(text: str) -> list[str]:
    """Split on ',' except inside a ``layers:`` list (use ';' between drafts there)."""
    if ";" in text:
        return [t.strip() for t in text.split(";") if t.strip()]
    out: list[str] = []
    for part in _csv(text):
        if out and out[-1].startswith("layers:") and part[0].isdigit():
            out[-1] += "," + part
        else:
            out.append(part)
    return out


def _config_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser, target: str,
                      drafts: list[str]):
    from measure.prompts import DOMAINS
    from measure.sweep import SweepConfig

    try:
        temps = tuple(float(t) for t in _csv(args.temperature))
    except ValueError:
        parser.error(f"--temperature {args.temperature!r}: expected comma-separated numbers >= 0")
    for t in temps:
        if not t >= 0:
            parser.error(f"--temperature {t:g}: must be >= 0")
    gammas = []
    for g in _csv(args.gamma):
        if g.lstrip("-").isdigit():
            if int(g) < 1:
                parser.error(f"--gamma {g}: must be an integer >= 1 (or fixed:G, heuristic:G, threshold:G)")
            g = f"fixed:{int(g)}"
        gammas.append(g)
    try:
        contexts = tuple(int(c) for c in _csv(args.cost_contexts))
    except ValueError:
        parser.error(f"--cost-contexts {args.cost_contexts!r}: expected comma-separated integers")
    domains = tuple(_csv(args.domains)) if args.domains else DOMAINS
    try:
        return SweepConfig(target=target, drafts=tuple(drafts), gammas=tuple(gammas), temperatures=temps,
                           domains=domains, prompts_per_domain=args.prompts, max_new_tokens=args.max_new_tokens,
                           max_prompt_tokens=args.max_prompt_tokens, device=args.device, dtype=args.dtype,
                           seed=args.seed, warmup=args.warmup, peer=not args.no_peer, traces=not args.no_traces,
                           cost_curves=not args.no_cost, cost_contexts=contexts,
                           cost_max_tokens=args.cost_max_tokens)
    except ValueError as e:
        parser.error(str(e))


def _fmt(v: object, nd: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def print_table(run) -> None:
    cells = run.table("cells")
    synth = " [SYNTHETIC weights: timing only, acceptance is not a measurement]" if run.summary.get("synthetic") else ""
    print(f"\n{run.meta['models']['target']['name']} on {run.meta['hardware']['device_name']}{synth}")
    cols = ("draft", "gamma_policy", "temperature", "domain", "tokens_per_s_baseline", "tokens_per_s_speculative",
            "tokens_per_s_peer", "speedup", "acceptance_rate", "mean_accepted_per_round", "outputs_identical")
    heads = ("draft", "gamma", "temp", "domain", "tok/s base", "tok/s spec", "tok/s peer", "speedup", "accept",
             "acc/round", "identical")
    rows = [[_fmt(r[c]) for c in cols] for r in cells.to_dict("records")]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(heads)]
    print("  ".join(h.ljust(w) for h, w in zip(heads, widths)))
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)))


def _one(args, parser, target: str, drafts: list[str], out: Path, command: str) -> dict:
    from measure.sweep import run_sweep

    cfg = _config_from_args(args, parser, target, drafts)
    try:
        run = run_sweep(cfg, out, command=command,
                        progress=None if args.quiet else (lambda m: print(m, file=sys.stderr)),
                        show_bar=not args.quiet)
    except ValueError as e:
        raise SystemExit(f"measure: error: {e}") from None
    print_table(run)
    print(f"run directory: {run.path}")
    return {"run_dir": str(run.path), "status": run.status, **run.summary}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["head-sweep"]:  # subcommand: the pruned draft head's K sweep
        from measure.head_sweep import main as head_sweep_main

        return head_sweep_main(argv[1:])
    if argv[:1] == ["head-recall"]:  # subcommand: offline recall of the pruned-head selectors
        from measure.head_recall import main as head_recall_main

        return head_recall_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("prompts", "max_new_tokens", "max_prompt_tokens", "cost_max_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: must be >= 1")
    command = "python -m measure " + " ".join(shlex.quote(a) for a in argv)
    out = Path(args.out) if args.out else Path("runs") / time.strftime("measure-%Y%m%d-%H%M%S")

    from measure.models import resolve_device

    try:
        device = resolve_device(args.device)
    except ValueError as e:
        parser.error(str(e))
    jobs: list[tuple[str, list[str], Path]] = []
    if args.pair:
        jobs.append(_pair_job(args.pair, parser, out))
    else:
        target = args.target or DEFAULT_TARGET
        drafts = _split_drafts(args.draft) if args.draft else list(DEFAULT_DRAFTS)
        jobs.append((target, drafts, out))
        no_model_args = args.target is None and args.draft is None
        if no_model_args and device.startswith("cuda"):
            jobs += [_pair_job(p, parser, out.with_name(f"{out.name}-{p}")) for p in GPU_DEFAULT_PAIRS]
    results = []
    try:
        for target, drafts, o in jobs:
            results.append(_one(args, parser, target, drafts, o, command))
    except KeyboardInterrupt:
        print(f"interrupted; finished cells are kept in {jobs[len(results)][2]} (re-run with the same --out "
              "to resume)", file=sys.stderr)
        return 130
    summary = results[0] if len(results) == 1 else {"runs": results}
    print(json.dumps(summary, default=lambda x: None if isinstance(x, float) and math.isnan(x) else str(x)))
    return 0


def _pair_job(name: str, parser: argparse.ArgumentParser, out: Path) -> tuple[str, list[str], Path]:
    from presets.pairs import PAIRS

    if name not in PAIRS:
        parser.error(f"--pair {name!r}: unknown pair; valid: {', '.join(PAIRS)}")
    pair = PAIRS[name]
    return f"synthetic:{pair.target.name}", [f"model:synthetic:{pair.draft.name}"], out
