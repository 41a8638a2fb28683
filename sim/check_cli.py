"""``python -m sim check`` — hold a speedup claim against what the simulator says is possible.

Examples::

    python -m sim check --preset gpt2-small-large --hardware t4 --gamma 4 --speedup 2.5
    python -m sim check --preset llama2-7b-13b --hardware a100-80gb --gamma 4 --speedup 2.9 \\
        --baseline-ms 89 --speculative-ms 31
    python -m sim check --cost-ratio 0.02 --gamma 7 --alpha 0.75 --speedup 3.4
    python -m sim check --preset distilgpt2-gpt2-medium --hardware t4 --gamma-max 8 --speedup 2.5 --format json
    python -m sim check --preset eagle3-llama3.1-8b --hardware h100-sxm --speedup 3.5   # a draft head
    python -m sim check --draft mtp --target Llama-3.1-8B --speedup 1.8 --gamma 1
    python -m sim check --claims                       # the table of published claims, with verdicts
    python -m sim check --claims --format markdown     # the same, as docs/guides/check-a-claim.md's table

It prints the bound at α = 1, the α the claim needs, the verdict and what
would have to be true (see :mod:`sim.claims`). Every bad value exits with
status 2 and one line naming it and the valid choices or range.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import Sequence

from presets import HEAD_KINDS, HEAD_PAIRS, MODELS, PAIRS, get_hardware, get_pair, make_pair
from sim.claims import (
    CLAIMS,
    DEFAULT_CONTEXT_TOKENS,
    ClaimCheck,
    RooflineCheck,
    Verdict,
    check_claims,
    check_roofline,
    check_speedup,
    roofline_cost,
)
from sim.cli import GPU_FLAGS, _add_gpu_flags, _uses_seam, seam_cost
from sim.cost import CostModel, LeviathanCost
from sim.limits import BYTES_PER_PARAM_ARG, CONTEXT_TOKENS_ARG, COST_RATIO_ARG, GAMMA_LIMIT, GAMMA_WHY
from sim.stepcost import BYTES_PER_PARAM, source_lines
from sim.typical import TYPICAL_ALPHA, typical_alpha
from toolkit.cli import OneLineParser, choice_arg, float_arg, int_arg

PROG = "python -m sim check"
FORMATS = ("table", "json", "markdown")
GAMMA_MAX_DEFAULT = 16  # not argparse's default: "--gamma 4 --gamma-max 16" must still be seen as a conflict
#: The flags of one claim of the user's: ``--claims`` checks the built-in table and would ignore every one.
CLAIM_FLAGS = ("speedup", "preset", "draft", "target", "hardware", "cost_ratio", "gamma", "gamma_max", "alpha",
               "tau", "baseline_ms", "speculative_ms", "bytes_per_param", "context_tokens", *GPU_FLAGS)


class CheckError(Exception):
    """A user-facing error: one line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    """The ``sim check`` options; every ``type=`` refuses NaN, ±inf and out-of-range values (:mod:`sim.limits`)."""
    p = OneLineParser(prog=PROG, description="Hold a claimed speculative-decoding speedup against the simulator.")
    p.add_argument("--claims", action="store_true", help="check every claim of the built-in table and print it")
    p.add_argument("--speedup", type=float_arg(0.0, lo_open=True),
                   help="the claimed speedup over plain decoding (> 0)")
    # names are looked up after parsing (presets' own one-line errors list the valid ones), so that
    # --claims can first refuse them as flags it would ignore
    p.add_argument("--preset", help=f"draft/target pair by exact name (e.g. {', '.join(list(PAIRS)[:3])}, ...), or "
                   f"a draft head on its target ({', '.join(HEAD_PAIRS)})")
    p.add_argument("--draft", help=f"draft model name, or a draft head kind ({', '.join(HEAD_KINDS)}) (with "
                   "--target: a pair of your own)")
    p.add_argument("--target", help="target model name (with --draft)")
    p.add_argument("--hardware", help="hardware profile (default: the pair's)")
    _add_gpu_flags(p, batch=False)
    p.add_argument("--cost-ratio", type=COST_RATIO_ARG, metavar="C",
                   help="pure Leviathan cost model instead of a preset: draft step = C x target step")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--gamma", type=int_arg(1, GAMMA_LIMIT, GAMMA_WHY), help=f"the claim's draft length, "
                   f"1..{GAMMA_LIMIT} (default: the most favourable in 1..--gamma-max)")
    g.add_argument("--gamma-max", type=int_arg(1, GAMMA_LIMIT, GAMMA_WHY),
                   help=f"largest γ searched when --gamma is not given (default {GAMMA_MAX_DEFAULT})")
    a = p.add_mutually_exclusive_group()
    a.add_argument("--alpha", type=float_arg(0.0, 1.0), help="the acceptance rate the claim states, in [0, 1]")
    a.add_argument("--tau", type=float_arg(1.0, GAMMA_LIMIT + 1.0),
                   help="the mean tokens per round the claim states (>= 1)")
    p.add_argument("--baseline-ms", type=float_arg(0.0, lo_open=True),
                   help="the claim's baseline ms per token (checked against the roofline)")
    p.add_argument("--speculative-ms", type=float_arg(0.0, lo_open=True),
                   help="the claim's speculative ms per token")
    p.add_argument("--bytes-per-param", type=BYTES_PER_PARAM_ARG,
                   help="weight precision, overriding the hardware's (e.g. 0.5 int4)")
    p.add_argument("--context-tokens", type=CONTEXT_TOKENS_ARG,
                   help=f"context length the costs use (default {DEFAULT_CONTEXT_TOKENS:g})")
    p.add_argument("--format", default="table", type=choice_arg("format", FORMATS),
                   help=f"one of {', '.join(FORMATS)} (default table)")
    return p


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _validate(args: argparse.Namespace) -> None:
    """Refuse what the parser cannot see: flags the mode would ignore, a missing claim, contradictory pairs."""
    if args.claims:
        given = [_flag(n) for n in CLAIM_FLAGS if getattr(args, n) is not None]
        if given:
            raise CheckError(f"--claims checks the built-in table and would ignore {', '.join(given)}: drop "
                             f"{'it' if len(given) == 1 else 'them'}, or drop --claims to check a claim of your own")
        return
    if args.format == "markdown":
        raise CheckError("--format markdown is for the --claims table; for one claim use table or json")
    if args.speedup is None:
        raise CheckError("--speedup is required (the claimed speedup), or use --claims for the built-in table")
    if (args.draft is None) != (args.target is None):
        raise CheckError("--draft and --target go together")
    if args.draft is not None and args.preset is not None:
        raise CheckError("give either --preset or --draft/--target, not both")
    has_pair = args.preset is not None or args.draft is not None
    if args.cost_ratio is not None and has_pair:
        raise CheckError("give either --cost-ratio or a pair (--preset, --draft/--target), not both")
    if args.cost_ratio is None and not has_pair:
        raise CheckError("name the pair: --preset NAME (or --draft/--target), or give --cost-ratio C; "
                         f"valid presets: {', '.join(PAIRS)}")
    if args.cost_ratio is not None and (args.hardware or args.baseline_ms or args.speculative_ms
                                        or args.bytes_per_param):
        raise CheckError("--hardware, --baseline-ms, --speculative-ms and --bytes-per-param need a pair, "
                         "not --cost-ratio")
    if _uses_seam(args) and (args.baseline_ms or args.speculative_ms or args.bytes_per_param):
        raise CheckError("--baseline-ms, --speculative-ms and --bytes-per-param check the preset roofline; with "
                         "--engine/--tp/--ep/--dtype/--cost-source (or a model beyond the presets) give --dtype "
                         "instead, and drop the timings")
    if args.gamma_max is None:
        args.gamma_max = GAMMA_MAX_DEFAULT
    if args.context_tokens is None:
        args.context_tokens = DEFAULT_CONTEXT_TOKENS


def check_user_claim(args: argparse.Namespace) -> tuple[Verdict, RooflineCheck | None, dict]:
    """The verdict (and roofline check) for the claim on the command line."""
    pair = hw = None
    if args.cost_ratio is None and _uses_seam(args):
        return _seam_claim(args)
    if args.cost_ratio is not None:
        cost: CostModel = LeviathanCost(args.cost_ratio)
    else:
        pair = make_pair(args.draft, args.target) if args.draft else get_pair(args.preset)
        hw = get_hardware(args.hardware or pair.default_hardware)
        if args.bytes_per_param is not None:
            hw = replace(hw, bytes_per_param=args.bytes_per_param)
        cost = roofline_cost(pair, hw)
    verdict = check_speedup(cost, args.speedup, args.gamma, alpha=args.alpha, tau=args.tau,
                            gamma_max=args.gamma_max, context_tokens=args.context_tokens,
                            parameter_ratio=pair.draft.params / pair.target.params if pair else None,
                            typical=typical_alpha(pair))
    roof = None
    if pair is not None and (args.baseline_ms is not None or args.speculative_ms is not None):
        roof = check_roofline(pair, get_hardware(args.hardware or pair.default_hardware), verdict.gamma,
                              args.speedup, args.baseline_ms, args.speculative_ms, args.context_tokens,
                              args.bytes_per_param)
    setup = {"preset": pair.name if pair else None, "hardware": hw.name if hw else None,
             "draft_head": pair.draft.as_dict() if pair is not None and pair.is_head else None,
             "bytes_per_param": hw.bytes_per_param if hw else None, "cost_model": cost.describe(),
             "context_tokens": args.context_tokens}
    return verdict, roof, setup


def _seam_claim(args: argparse.Namespace) -> tuple[Verdict, RooflineCheck | None, dict]:
    """A claim priced by the step-cost seam (any model, GPU flags): kernel tables or roofline, named."""
    known = args.preset is not None or (args.target in MODELS and args.draft in [*MODELS, *HEAD_KINDS])
    pair = (get_pair(args.preset) if args.preset else make_pair(args.draft, args.target)) if known else None
    gammas = [args.gamma] if args.gamma is not None else [args.gamma_max]
    cost = seam_cost(args, pair, gammas, args.engine_overhead == "fitted")
    verdict = check_speedup(cost, args.speedup, args.gamma, alpha=args.alpha, tau=args.tau,
                            gamma_max=args.gamma_max, context_tokens=args.context_tokens,
                            parameter_ratio=None, typical=typical_alpha(pair))
    desc = cost.describe()
    name = pair.name if pair else f"{args.draft} -> {args.target}"
    setup = {"preset": name, "hardware": args.hardware or (pair.default_hardware if pair else "h100-sxm"),
             "draft_head": pair.draft.as_dict() if pair is not None and pair.is_head else None,
             "bytes_per_param": BYTES_PER_PARAM[args.dtype or "bf16"], "cost_model": desc,
             "context_tokens": args.context_tokens, "cost_source": source_lines(desc)}
    return verdict, None, setup


def format_verdict(v: Verdict, roof: RooflineCheck | None, setup: dict) -> str:
    """The human-readable report of one check."""
    model = (f"{setup['preset']} on {setup['hardware']} ({setup['bytes_per_param']:g} bytes/param), "
             f"context {setup['context_tokens']:g} tokens" if setup["preset"]
             else f"Leviathan et al. model, c = {setup['cost_model']['cost_ratio']:g}")
    lines = [
        f"claim: {v.claimed_speedup:g}x at gamma = {v.gamma}" + ("" if v.gamma_stated else
                                                               f" (not stated: most favourable of "
                                                               f"{v.gamma_candidates[0]}-{v.gamma_candidates[-1]})"),
        f"cost model: {model}",
        *[f"  {line}" for line in setup.get("cost_source", [])],
        f"  draft step = {v.cost_ratio:.4f} of a target step; verifying {v.gamma + 1} tokens = "
        f"{v.verify_ratio:.4f} target steps",
        "speedup at gamma = %d over alpha:" % v.gamma,
        "  alpha   " + " ".join(f"{a:5.2f}" for a, _ in v.curve[::2]),
        "  speedup " + " ".join(f"{s:5.2f}" for _, s in v.curve[::2]),
        f"bound at alpha = 1: {v.bound_at_alpha1:.3f}x",
        "alpha needed: " + ("not reachable" if v.alpha_needed is None else f"{v.alpha_needed:.3f}")
        + ("" if v.alpha_stated is None else f" (stated/implied: {v.alpha_stated:.3f})"),
        f"verdict: {v.verdict}",
    ]
    if v.typical_alpha != TYPICAL_ALPHA:  # a draft head: say where its acceptance range comes from
        t = v.typical_alpha
        lines.append(f"typical alpha for {t.label}: {t.low:g}-{t.high:g}, from:")
        lines.extend(f"  - {note}" for note in t.notes)
    if v.would_have_to_be_true:
        lines.append(f"what would have to be true: {v.would_text()}")
    if roof is not None:
        lines.extend(f"roofline: {f}" for f in roof.findings)
    return "\n".join(lines)


def claims_table(checks: list[ClaimCheck]) -> str:
    """The built-in claims as a plain-text table."""
    head = f"{'claim':<30} {'status':<18} {'claimed':>7} {'gamma':>5} {'c':>6} {'bound':>6} {'alpha':>6}  verdict"
    lines = [head]
    for ch in checks:
        r = ch.row()
        need = "-" if r["alpha_needed"] is None else f"{r['alpha_needed']:.3f}"
        lines.append(f"{r['claim']:<30} {r['status']:<18} {r['claimed_speedup']:>7.2f} {r['gamma']:>5} "
                     f"{r['cost_ratio']:>6.3f} {r['bound_at_alpha1']:>6.2f} {need:>6}  {r['verdict_short']}")
    return "\n".join(lines)


def claims_markdown(checks: list[ClaimCheck]) -> str:
    """The built-in claims as a markdown table (docs/guides/check-a-claim.md, the report's claims page)."""
    lines = ["| claim | source | mapped to | claimed | γ | c | bound at α = 1 | α needed | verdict |",
             "|---|---|---|---:|---:|---:|---:|---:|---|"]
    for ch in checks:
        r = ch.row()
        need = "—" if r["alpha_needed"] is None else f"{r['alpha_needed']:.3f}"
        gamma = f"{r['gamma']}" if r["gamma_stated"] else f"{r['gamma']}*"
        status = "" if r["status"] == "verified" else " **(not verified here)**"
        lines.append(f"| {r['quote']} | {r['source']}{status} | {r['mapped_to']} | {r['claimed_speedup']:g}× | "
                     f"{gamma} | {r['cost_ratio']:.3f} | {r['bound_at_alpha1']:.2f}× | {need} | "
                     f"{r['verdict_short']} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        _validate(args)
        if args.claims:
            checks = check_claims(CLAIMS)
            text = {"json": lambda: json.dumps([c.as_dict() for c in checks], indent=2, ensure_ascii=False),
                    "markdown": lambda: claims_markdown(checks), "table": lambda: claims_table(checks)}[args.format]()
        else:
            verdict, roof, setup = check_user_claim(args)
            if args.format == "json":
                text = json.dumps({**setup, "verdict": verdict.as_dict(),
                                   "roofline": roof.as_dict() if roof else None}, indent=2, ensure_ascii=False)
            else:
                text = format_verdict(verdict, roof, setup)
    except (CheckError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    print(text)  # a reader that stops early (`| head`): toolkit.cli.entry_point, around sim's main
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
