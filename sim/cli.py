"""``python -m sim`` — predict the speedup of speculative decoding before measuring anything.

Examples::

    python -m sim --preset llama3-1b-3b
    python -m sim --preset llama3-8b-70b --hardware a100-80gb --alpha 0.7 --format json
    python -m sim --cost-ratio 0.05 --alpha 0.8 --gamma-max 12
    python -m sim --preset gpt2-small-large --mode event --seed 1
    python -m sim --preset llama3-1b-8b --mode serve --arrival-rate 20
    python -m sim --cost-model runs/cal/cost_model-ngram.json --acceptance runs/cal/acceptance-ngram.json
    python -m sim --list-presets

Every bad value exits with status 2 and one line naming it and the valid choices.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from presets import HARDWARE, PAIRS, RooflineForward, get_hardware, get_pair, make_pair
from sim.acceptance import (
    AcceptanceModel,
    IIDAcceptance,
    PerPositionAcceptance,
    acceptance_from_dict,
    implied_alpha_from_tau,
)
from sim.analytic import break_even_alpha, cost_per_million_tokens, predict, speedup_leviathan
from sim.cost import CostModel, LeviathanCost, RooflineCost, load_cost_model
from sim.events import simulate_request, simulate_serving
from sim.policies import POLICY_KINDS

MODES = ("analytic", "event", "serve")
FORMATS = ("table", "json", "csv")
CHART_SUFFIXES = (".html", ".png", ".svg")
DEFAULT_PRESET = "llama3-1b-3b"


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sim",
        description="Predict speculative-decoding speedup from acceptance, draft length and a cost model.",
    )
    p.add_argument("--list-presets", action="store_true", help="list pairs, models and hardware, then exit")
    p.add_argument("--preset", help=f"draft/target pair by exact name (default {DEFAULT_PRESET})")
    p.add_argument("--draft", help="draft model name (with --target: a pair of your own)")
    p.add_argument("--target", help="target model name (with --draft)")
    p.add_argument("--hardware", help="hardware profile (default: the pair's)")
    a = p.add_mutually_exclusive_group()
    a.add_argument("--alpha", type=float, help="i.i.d. acceptance rate in [0, 1] (default: the preset's)")
    a.add_argument("--alpha-per-position", type=_floats, metavar="A1,A2,...",
                   help="conditional acceptance per draft position; the last repeats")
    a.add_argument("--tau", type=float, help="mean tokens per round measured at --gamma (vLLM/Spec-Bench tau); "
                   "the implied i.i.d. alpha is used")
    a.add_argument("--acceptance", metavar="FILE", help="acceptance model JSON (as written by calibrate)")
    c = p.add_mutually_exclusive_group()
    c.add_argument("--cost-ratio", type=float, metavar="C",
                   help="pure Leviathan cost model: draft step = C x target step, verify = target step")
    c.add_argument("--cost-model", metavar="FILE", help="cost model JSON (as written by calibrate)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--gamma", type=int, help="evaluate one draft length")
    g.add_argument("--gamma-max", type=int, default=8, help="evaluate draft lengths 1..N (default 8)")
    p.add_argument("--context-tokens", type=float, default=512.0, help="context length the costs use (default 512)")
    p.add_argument("--mode", default="analytic", help=f"one of {', '.join(MODES)} (default analytic)")
    p.add_argument("--policy", default="fixed", help=f"gamma policy for event/serve: {', '.join(POLICY_KINDS)}")
    p.add_argument("--new-tokens", type=int, help="tokens per simulated request (default 4096 in event mode, "
                   "256 in serve mode)")
    p.add_argument("--requests", type=int, default=200, help="requests in serve mode")
    p.add_argument("--arrival-rate", type=float, default=5.0, help="Poisson arrivals per second in serve mode")
    p.add_argument("--max-batch", type=int, default=32, help="largest batch in serve mode")
    p.add_argument("--seed", type=int, default=0, help="seed of every random draw (default 0)")
    p.add_argument("--usd-per-hour", type=float, help="device price: adds cost per 1M generated tokens")
    p.add_argument("--format", default="table", help=f"one of {', '.join(FORMATS)} (default table)")
    p.add_argument("--out", metavar="FILE", help="write the output here instead of stdout")
    p.add_argument("--chart", metavar="FILE", help="write charts (.html or .png): speedup vs alpha and vs gamma")
    return p


@dataclass(frozen=True)
class Setup:
    preset: str | None
    hardware: str | None
    acceptance: AcceptanceModel
    cost: CostModel
    cost_ratio: float | None
    gammas: list[int]
    pair: Any


def _check_choice(name: str, value: str, valid: Sequence[str]) -> None:
    if value not in valid:
        raise CliError(f"unknown {name} {value!r}; valid: {', '.join(valid)}")


def resolve(args: argparse.Namespace) -> Setup:
    """Turn CLI arguments into validated models; raise CliError on any bad value."""
    _check_choice("mode", args.mode, MODES)
    _check_choice("format", args.format, FORMATS)
    _check_choice("policy", args.policy, POLICY_KINDS)
    if args.gamma is not None and args.gamma < 1:
        raise CliError(f"--gamma must be >= 1, got {args.gamma}")
    if args.gamma_max is not None and args.gamma_max < 1:
        raise CliError(f"--gamma-max must be >= 1, got {args.gamma_max}")
    gammas = [args.gamma] if args.gamma is not None else list(range(1, args.gamma_max + 1))
    if args.context_tokens < 0:
        raise CliError(f"--context-tokens must be >= 0, got {args.context_tokens}")
    if args.new_tokens is None:
        args.new_tokens = 256 if args.mode == "serve" else 4096
    for name in ("new_tokens", "requests", "max_batch"):
        if getattr(args, name) < 1:
            raise CliError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.arrival_rate <= 0:
        raise CliError(f"--arrival-rate must be > 0, got {args.arrival_rate}")
    if args.chart and Path(args.chart).suffix not in CHART_SUFFIXES:
        raise CliError(f"--chart {args.chart!r}: unknown suffix {Path(args.chart).suffix!r}; "
                       f"valid: {', '.join(CHART_SUFFIXES)}")
    if args.usd_per_hour is not None and args.usd_per_hour < 0:
        raise CliError(f"--usd-per-hour must be >= 0, got {args.usd_per_hour}")

    # The pair: a preset, a pair of the user's, or none at all (pure Leviathan / fitted file).
    pair = None
    if (args.draft is None) != (args.target is None):
        raise CliError("--draft and --target go together")
    if args.draft is not None:
        if args.preset:
            raise CliError("give either --preset or --draft/--target, not both")
        pair = make_pair(args.draft, args.target)
    elif args.preset is not None:
        pair = get_pair(args.preset)
    elif args.cost_ratio is None and args.cost_model is None:
        pair = get_pair(DEFAULT_PRESET)

    hardware = args.hardware or (pair.default_hardware if pair else None)
    if hardware is not None:
        get_hardware(hardware)  # validates the name

    # Acceptance.
    if args.alpha is not None:
        if not 0.0 <= args.alpha <= 1.0 or math.isnan(args.alpha):
            raise CliError(f"--alpha must be in [0, 1], got {args.alpha}")
        acceptance: AcceptanceModel = IIDAcceptance(args.alpha)
    elif args.alpha_per_position is not None:
        bad = [x for x in args.alpha_per_position if not 0.0 <= x <= 1.0]
        if bad or not args.alpha_per_position:
            raise CliError(f"--alpha-per-position values must be in [0, 1], got {bad or 'nothing'}")
        acceptance = PerPositionAcceptance(tuple(args.alpha_per_position))
    elif args.tau is not None:
        if args.gamma is None:
            raise CliError("--tau needs --gamma: the draft length the mean tokens per round was measured at")
        acceptance = IIDAcceptance(implied_alpha_from_tau(args.tau, args.gamma))
    elif args.acceptance is not None:
        try:
            acceptance = acceptance_from_dict(json.loads(Path(args.acceptance).read_text()))
        except FileNotFoundError:
            raise CliError(f"acceptance file not found: {args.acceptance}") from None
        except (json.JSONDecodeError, KeyError) as exc:
            raise CliError(f"acceptance file {args.acceptance} is not a valid acceptance model: {exc}") from None
    elif pair is not None:
        acceptance = IIDAcceptance(pair.default_alpha)
    else:
        raise CliError("no acceptance given: use --alpha, --alpha-per-position, --tau or --acceptance")

    # Cost.
    cost_ratio = None
    if args.cost_ratio is not None:
        if args.cost_ratio < 0 or math.isnan(args.cost_ratio):
            raise CliError(f"--cost-ratio must be >= 0, got {args.cost_ratio}")
        cost: CostModel = LeviathanCost(args.cost_ratio)
        cost_ratio = args.cost_ratio
        hardware = None
    elif args.cost_model is not None:
        cost = load_cost_model(args.cost_model)
        hardware = None
    else:
        hw = get_hardware(hardware)
        cost = RooflineCost(RooflineForward(pair.draft, hw), RooflineForward(pair.target, hw))
        cost_ratio = cost.cost_ratio(args.context_tokens)
    if cost_ratio is None:
        cost_ratio = cost.draft_step_ms(args.context_tokens) / cost.target_step_ms(args.context_tokens)
    return Setup(pair.name if pair else None, hardware, acceptance, cost, cost_ratio, gammas, pair)


def _analytic_rows(s: Setup, args: argparse.Namespace) -> list[dict]:
    rows = []
    for r in predict(s.acceptance, s.cost, s.gammas, args.context_tokens):
        d = {
            "gamma": r.gamma,
            "expected_tokens_per_round": r.expected_tokens_per_round,
            "round_time_ms": r.round_time_ms,
            "speedup": r.speedup,
            "tokens_per_s": r.tokens_per_s_speculative,
            "tokens_per_s_baseline": r.tokens_per_s_baseline,
            # accepted/drafted is what many tools print; it is NOT alpha.
            "accepted_over_drafted": (r.expected_tokens_per_round - 1.0) / r.gamma,
            "break_even_alpha": break_even_alpha(r.gamma, s.cost, context_tokens=args.context_tokens),
        }
        rows.append(d)
    return rows


def _event_rows(s: Setup, args: argparse.Namespace) -> list[dict]:
    analytic = {r["gamma"]: r for r in _analytic_rows(s, args)}
    rows = []
    for g in s.gammas:
        res = simulate_request(s.acceptance, s.cost, f"{args.policy}:{g}", args.new_tokens,
                               args.context_tokens, seed=args.seed)
        base_ms_per_token = res.baseline_time_ms / res.n_tokens
        rows.append({
            "gamma": g,
            "policy": f"{args.policy}:{g}",
            "expected_tokens_per_round": res.tokens_per_round,
            "round_time_ms": res.time_ms / res.rounds,
            "speedup": res.speedup,
            "tokens_per_s": 1000.0 * res.n_tokens / res.time_ms,
            "tokens_per_s_baseline": 1000.0 / base_ms_per_token,
            "accepted_over_drafted": res.accepted / res.drafted,
            "rounds": res.rounds,
            "closed_form_speedup": analytic[g]["speedup"],
        })
    return rows


def _serve_rows(s: Setup, args: argparse.Namespace) -> list[dict]:
    rows = []
    for g in s.gammas:
        r = simulate_serving(s.acceptance, s.cost, f"{args.policy}:{g}", n_requests=args.requests,
                             arrival_rate_per_s=args.arrival_rate, n_tokens=args.new_tokens,
                             context_tokens=args.context_tokens, max_batch=args.max_batch, seed=args.seed)
        sp, b = r.speculative, r.baseline
        rows.append({
            "gamma": g,
            "policy": r.policy,
            "speedup": r.latency_speedup_p50,
            "throughput_speedup": r.throughput_speedup,
            "tokens_per_s": sp.throughput_tokens_per_s,
            "tokens_per_s_baseline": b.throughput_tokens_per_s,
            "latency_p50_ms": sp.latency_p50_ms,
            "latency_p95_ms": sp.latency_p95_ms,
            "latency_p99_ms": sp.latency_p99_ms,
            "baseline_latency_p50_ms": b.latency_p50_ms,
            "baseline_latency_p95_ms": b.latency_p95_ms,
            "baseline_latency_p99_ms": b.latency_p99_ms,
            "mean_batch": sp.mean_batch,
            "expected_tokens_per_round": s.acceptance.expected_tokens(g),
        })
    return rows


def run(args: argparse.Namespace) -> dict:
    s = resolve(args)
    rows = {"analytic": _analytic_rows, "event": _event_rows, "serve": _serve_rows}[args.mode](s, args)
    if args.usd_per_hour is not None:
        for r in rows:
            r["usd_per_1m_tokens"] = cost_per_million_tokens(r["tokens_per_s"], args.usd_per_hour)
            r["usd_per_1m_tokens_baseline"] = cost_per_million_tokens(r["tokens_per_s_baseline"], args.usd_per_hour)
    best = max(rows, key=lambda r: (r["speedup"], -r["gamma"]))
    doc: dict[str, Any] = {
        "preset": s.preset,
        "hardware": s.hardware,
        "mode": args.mode,
        "cost_ratio": s.cost_ratio,
        "context_tokens": args.context_tokens,
        "acceptance_model": s.acceptance.describe(),
        "cost_model": s.cost.describe(),
        "optimal_gamma": best["gamma"],
        "optimal_speedup": best["speedup"],
        "seed": args.seed,
        "rows": rows,
    }
    if isinstance(s.acceptance, PerPositionAcceptance):
        doc["alpha_per_position"] = list(s.acceptance.alphas)
    else:
        doc["alpha"] = getattr(s.acceptance, "alpha", None)
    if s.pair is not None:
        doc["alpha_source"] = s.pair.alpha_source if args.alpha is None and args.tau is None and \
            args.alpha_per_position is None and args.acceptance is None else "command line"
    if args.tau is not None:
        doc["tau"] = args.tau
        doc["note"] = ("alpha implied from tau at gamma=%d; accepted/drafted = (tau-1)/gamma = %.3f is not alpha"
                       % (args.gamma, (args.tau - 1) / args.gamma))
    if args.chart:
        write_charts(s, args, doc, Path(args.chart))
        doc["chart"] = args.chart
    return doc


def write_charts(s: Setup, args: argparse.Namespace, doc: dict, path: Path) -> None:
    """Speedup against α (γ = 1..8) and against γ for this setup; builders live in ``reports``."""
    import pandas as pd

    from reports.charts import save_chart, speedup_vs_alpha_chart, speedup_vs_gamma_chart

    alphas = np.linspace(0.0, 1.0, 51)
    recs = []
    for g in range(1, 9):
        for a in alphas:
            r = predict(IIDAcceptance(float(a)), s.cost, [g], args.context_tokens)[0]
            recs.append({"alpha": float(a), "gamma": g, "speedup": r.speedup})
    by_gamma = pd.DataFrame([{"gamma": r["gamma"], "speedup": r["speedup"], "source": "predicted",
                              "optimal": r["gamma"] == doc["optimal_gamma"]} for r in doc["rows"]])
    title = doc["preset"] or "custom"
    chart = speedup_vs_alpha_chart(pd.DataFrame(recs)).properties(title=f"{title}: speedup vs alpha") | \
        speedup_vs_gamma_chart(by_gamma).properties(title=f"{title}: speedup vs gamma")
    path.parent.mkdir(parents=True, exist_ok=True)
    save_chart(chart, path)


def format_table(doc: dict) -> str:
    head = [f"preset: {doc['preset'] or '-'}   hardware: {doc['hardware'] or '-'}   mode: {doc['mode']}"]
    acc = doc["acceptance_model"]
    acc_txt = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in acc.items())
    head.append(f"acceptance: {acc_txt}   cost ratio c = {doc['cost_ratio']:.4g}   "
                f"context = {doc['context_tokens']:.0f} tokens")
    if doc.get("alpha_source"):
        head.append(f"alpha source: {doc['alpha_source']}")
    if doc.get("note"):
        head.append(f"note: {doc['note']}")
    cols = [c for c in ("gamma", "expected_tokens_per_round", "round_time_ms", "tokens_per_s", "speedup")
            if c in doc["rows"][0]]
    extra = [c for c in ("closed_form_speedup", "break_even_alpha", "latency_p50_ms", "baseline_latency_p50_ms",
                         "throughput_speedup", "usd_per_1m_tokens") if c in doc["rows"][0]]
    cols += extra
    names = {"expected_tokens_per_round": "tokens/round", "round_time_ms": "round ms",
             "tokens_per_s": "tok/s", "closed_form_speedup": "closed form", "break_even_alpha": "break-even a",
             "latency_p50_ms": "p50 ms", "baseline_latency_p50_ms": "base p50 ms",
             "throughput_speedup": "thru x", "usd_per_1m_tokens": "$/1M tok"}

    def fmt(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 1000 else f"{v:.0f}"
        return str(v)

    table = [[names.get(c, c) for c in cols] + [""]]
    for r in doc["rows"]:
        table.append([fmt(r.get(c)) for c in cols] + ["<- optimal" if r["gamma"] == doc["optimal_gamma"] else ""])
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) + "  " + row[-1] for row in table]
    base = doc["rows"][0]["tokens_per_s_baseline"]
    if doc["mode"] == "serve":
        best = next(r for r in doc["rows"] if r["gamma"] == doc["optimal_gamma"])
        tail = (f"optimal gamma = {doc['optimal_gamma']}: p50 request latency {doc['optimal_speedup']:.3f}x lower, "
                f"throughput {best['throughput_speedup']:.3f}x of the autoregressive {base:.1f} tok/s "
                "under the same arrivals")
    else:
        tail = (f"optimal gamma = {doc['optimal_gamma']}: speedup {doc['optimal_speedup']:.3f}x "
                f"over {base:.1f} tok/s autoregressive")
    if doc["optimal_speedup"] < 1.0:
        tail += "  (speculative decoding is SLOWER here at every gamma)"
    return "\n".join(head + [""] + lines + ["", tail])


def format_csv(doc: dict) -> str:
    buf = io.StringIO()
    keys = list(doc["rows"][0].keys())
    w = csv.DictWriter(buf, fieldnames=keys + ["optimal"])
    w.writeheader()
    for r in doc["rows"]:
        w.writerow({**r, "optimal": r["gamma"] == doc["optimal_gamma"]})
    return buf.getvalue()


def list_presets() -> str:
    from presets import MODELS

    lines = ["pairs (draft -> target, default alpha):"]
    for p in PAIRS.values():
        lines.append(f"  {p.name:24s} {p.draft.name} -> {p.target.name}  alpha={p.default_alpha}  "
                     f"hardware={p.default_hardware}")
    lines.append("models:")
    for m in MODELS.values():
        lines.append(f"  {m.name:16s} {m.params / 1e6:9.1f}M params  vocab {m.vocab_size}  layers {m.n_layers}")
    lines.append("hardware:")
    for h in HARDWARE.values():
        lines.append(f"  {h.name:10s} {h.description}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["check"]:  # python -m sim check ...: hold a claimed speedup against the simulator
        from sim.check_cli import main as check_main
        return check_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list_presets:
        print(list_presets())
        return 0
    try:
        doc = run(args)
    except (CliError, ValueError) as exc:
        print(f"python -m sim: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"python -m sim: error: cannot write {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    text = {"json": lambda d: json.dumps(d, indent=2), "csv": format_csv, "table": format_table}[args.format](doc)
    if args.out:
        try:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(text + ("\n" if not text.endswith("\n") else ""))
        except OSError as exc:
            print(f"python -m sim: error: cannot write --out {args.out}: {exc.strerror}", file=sys.stderr)
            return 2
        print(f"wrote {args.out}")
    else:
        try:
            print(text)
        except BrokenPipeError:  # e.g. piped into `head`
            sys.stdout = None
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
