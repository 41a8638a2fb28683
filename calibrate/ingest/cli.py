"""``python -m calibrate ingest FILE... [options]`` — an engine's spec-decode numbers in, which k out.

Examples::

    python -m calibrate ingest vllm.log --preset llama3-1b-8b --hardware h100-sxm
    python -m calibrate ingest before.prom after.prom --preset llama3-8b-70b --tp 4 --explain
    python -m calibrate ingest server.log bench.json --out runs/ingest   # llama.cpp log + llama-bench costs
    python -m calibrate ingest sglang.log --spec-tokens 3 --cost-model runs/x-cal --mode serve

Prints the acceptance in the project's definitions (conditional α_i with
counts and 95% Wilson intervals, acceptance rate, mean tokens per round with
the bonus token), one line per lossy conversion, the predicted speedup per k,
the optimal k and the break-even α, then one JSON line. Bad input: one line,
exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from calibrate.ingest.answer import (
    Answer,
    GpuFlags,
    ServeSettings,
    answer,
    choose_cost,
    crossover,
    sim_command,
    summary,
    write_files,
)
from calibrate.ingest.detect import ENGINES, Ingested, ingest_files
from calibrate.ingest.records import AcceptanceRecord
from sim.limits import (
    ARRIVAL_RATE_LIMIT_PER_S,
    ARRIVAL_RATE_MIN_PER_S,
    CONTEXT_TOKENS_ARG,
    GAMMA_LIMIT,
    GAMMA_WHY,
    MAX_BATCH_LIMIT,
    NEW_TOKENS_LIMIT,
    REQUESTS_LIMIT,
    SEED_LIMIT,
    SIMULATED_TOKENS_LIMIT,
)
from presets import HARDWARE
from sim.engine_overheads import ENGINE_OVERHEAD_HELP, ENGINE_OVERHEADS
from sim.kernels import DEFAULT_MOE_ROUTING, MOE_ROUTINGS
from sim.stepcost import COST_SOURCES, DRAFT_KINDS, DTYPES
from toolkit.cli import OneLineParser, choice_arg, float_list_arg, int_arg, nonempty_arg
from toolkit.track import TRACKERS, usable_tracker

PROG = "python -m calibrate ingest"
MODES = ("analytic", "serve")
#: Arrival rates one serve run may sweep (each one simulates every k).
ARRIVAL_RATES_LIMIT = 64
#: The flags only ``--mode serve`` reads (``--mode analytic`` would ignore them).
SERVE_FLAGS = ("arrival_rates", "max_batch", "requests", "new_tokens", "seed")


def build_parser() -> argparse.ArgumentParser:
    """The ``ingest`` options; every number bounded as ``python -m sim`` bounds it (:mod:`sim.limits`)."""
    p = OneLineParser(prog=PROG, description="Ingest an engine's speculative-decoding metrics (vLLM, SGLang, "
                      "llama.cpp, TGI) and llama-bench costs; predict the speedup per k with sim.")
    p.add_argument("files", nargs="+", metavar="FILE", type=nonempty_arg("file name"),
                   help="log, /metrics scrape(s), response JSON, llama-bench output")
    p.add_argument("--engine", default="auto", type=choice_arg("--engine", ("auto",) + ENGINES),
                   help=f"auto (default) or one of {', '.join(ENGINES)}")
    p.add_argument("--spec-tokens", type=int_arg(1, GAMMA_LIMIT, GAMMA_WHY), metavar="K",
                   help="the draft length k the engine ran with, for inputs that do not state it (vLLM "
                   "num_speculative_tokens, SGLang speculative_num_steps, llama.cpp --draft-max, TGI --speculate)")
    p.add_argument("--out", metavar="DIR", type=nonempty_arg("directory"),
                   help="write acceptance.json (+ cost_model.json) and ingest.json here")
    p.add_argument("--explain", action="store_true", help="print the conversion table: each input figure, the "
                   "engine's definition and the converted value")
    p.add_argument("--preset", help="cost: a draft/target pair's GPU step costs (python -m sim --list-presets)")
    p.add_argument("--target", type=nonempty_arg("model"), help="cost: the target model (with --draft), as python -m "
                   "sim takes it: a preset name, a Hugging Face id of a shipped config, or a local directory holding "
                   "config.json")
    p.add_argument("--draft", type=nonempty_arg("model"), help=f"cost: the draft (with --target): a model, or "
                   f"{', '.join(DRAFT_KINDS)}")
    p.add_argument("--hardware", type=choice_arg("--hardware", list(HARDWARE)), help="cost: hardware profile for "
                   "--preset or --target/--draft (default: the pair's, else h100-sxm)")
    p.add_argument("--tp", type=int_arg(1, 64), help="cost: tensor-parallel GPUs (default 1)")
    p.add_argument("--ep", type=int_arg(1, 64), help="cost: expert-parallel GPUs of an MoE model (default: --tp)")
    p.add_argument("--dtype", type=choice_arg("--dtype", DTYPES), help=f"cost: weight dtype: {', '.join(DTYPES)} "
                   "(default bf16)")
    p.add_argument("--cost-source", type=choice_arg("--cost-source", COST_SOURCES), help="cost: auto (kernel tables "
                   "where the GPU, the ingested engine and the model are covered, else the roofline), kernels or "
                   "roofline, as python -m sim decides it")
    p.add_argument("--moe-routing", type=choice_arg("--moe-routing", MOE_ROUTINGS), help="cost: token routing the "
                   f"kernel tables' MoE op is measured under, for an MoE model: {', '.join(MOE_ROUTINGS)} (default "
                   f"{DEFAULT_MOE_ROUTING}, as python -m sim)")
    p.add_argument("--engine-overhead", type=choice_arg("--engine-overhead", ENGINE_OVERHEADS), default="fitted",
                   help="cost, GPU step costs: " + ENGINE_OVERHEAD_HELP + ", as python -m sim")
    p.add_argument("--cost-model", metavar="FILE", help="cost: a cost-model JSON (calibrate's cost_model-*.json of a "
                   "measure run, or the directory holding it)")
    p.add_argument("--gamma-max", type=int_arg(1, GAMMA_LIMIT, GAMMA_WHY), default=8,
                   help="predict k = 1..N (default 8, at most 64)")
    p.add_argument("--context-tokens", type=CONTEXT_TOKENS_ARG, help="context the costs use "
                   "(default 512; llama-bench: the measured depth nearest it)")
    p.add_argument("--mode", default="analytic", type=choice_arg("--mode", MODES),
                   help=f"one of {', '.join(MODES)} (default analytic); serve adds optimal k by batch size and by "
                   "arrival rate")
    p.add_argument("--arrival-rates", metavar="R1,R2,...", help="serve mode: Poisson arrival rates in requests/s "
                   "(default 1,4,16,64)", type=float_list_arg(ARRIVAL_RATE_MIN_PER_S, ARRIVAL_RATE_LIMIT_PER_S,
                                                              max_items=ARRIVAL_RATES_LIMIT))
    p.add_argument("--max-batch", type=int_arg(1, MAX_BATCH_LIMIT), help="serve mode: largest batch (default 32)")
    p.add_argument("--requests", type=int_arg(1, REQUESTS_LIMIT),
                   help="serve mode: simulated requests per run (default 100)")
    p.add_argument("--new-tokens", type=int_arg(1, NEW_TOKENS_LIMIT),
                   help="serve mode: tokens per request (default 128)")
    p.add_argument("--seed", type=int_arg(0, SEED_LIMIT), help="serve mode: seed of every random draw (default 0)")
    p.add_argument("--track", choices=TRACKERS, metavar="wandb|mlflow", help="also log the answer (alpha_i with "
                   "CIs, speedup per k, --out's files) to Weights & Biases or MLflow (the track extra; a tracker that "
                   "fails costs one warning line)")
    return p


def serve_settings(args: argparse.Namespace) -> ServeSettings | None:
    """The serving knobs (None in analytic mode); ``ValueError`` for a knob the mode ignores or too much work."""
    given = [f"--{n.replace('_', '-')}" for n in SERVE_FLAGS if getattr(args, n) is not None]
    if args.mode != "serve":
        if given:
            raise ValueError(f"{', '.join(given)} applies to --mode serve only, not --mode {args.mode}")
        return None
    d = ServeSettings()
    s = ServeSettings(tuple(args.arrival_rates or d.arrival_rates_per_s), args.max_batch or d.max_batch,
                      args.requests or d.requests, args.new_tokens or d.new_tokens,
                      d.seed if args.seed is None else args.seed)
    total = len(s.arrival_rates_per_s) * args.gamma_max * s.requests * s.new_tokens
    if total > SIMULATED_TOKENS_LIMIT:
        raise ValueError(f"{total:.3g} simulated tokens ({len(s.arrival_rates_per_s)} arrival rate(s) x "
                         f"{args.gamma_max} k x {s.requests:,} requests x {s.new_tokens:,} tokens) is over the limit "
                         f"of {SIMULATED_TOKENS_LIMIT:.0e} (about a minute of simulation); lower --requests, "
                         "--new-tokens, --gamma-max or the number of --arrival-rates")
    return s


def _f(v: float | None, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def format_record(rec: AcceptanceRecord, files: Sequence[tuple[str, str]]) -> list[str]:
    out = [f"{rec.engine}: {rec.observations} observation(s) from " + ", ".join(f"{p} ({fmt})" for p, fmt in files)
           + (f"; {rec.skipped_lines} partial or truncated line(s) skipped" if rec.skipped_lines else "")]
    out.append("acceptance in the project's definitions:")
    if rec.positions:
        out.append("  position  accepted/judged  alpha_i (conditional)  95% CI")
        for p in rec.positions:
            out.append(f"  {p.position:8d}  {f'{p.accepted}/{p.judged}':>15s}  {p.alpha:21.3f}  "
                       f"[{p.ci_low:.3f}, {p.ci_high:.3f}]")
    elif rec.iid_alpha is not None:
        out.append(f"  alpha (i.i.d., assumed) = {rec.iid_alpha:.4f}, implied by {rec.iid_basis}")
    rate = "-" if rec.acceptance_rate is None else (
        f"{rec.accepted_tokens}/{rec.draft_tokens} = {rec.acceptance_rate:.3f}"
        if rec.accepted_tokens is not None and rec.draft_tokens else f"{rec.acceptance_rate:.3f}")
    out.append(f"  acceptance rate (accepted/drafted): {rate}")
    tau = _f(rec.mean_tokens_per_round)
    extra = [f"k = {rec.k}"] if rec.k is not None else []
    if rec.drafts is not None:
        extra.append(f"{rec.drafts} rounds")
    out.append(f"  mean tokens per round (incl. bonus): {tau}" + (f" at {', '.join(extra)}" if extra else ""))
    for n in rec.notes:
        out.append(f"note: {n}")
    return out


def format_explain(rec: AcceptanceRecord) -> list[str]:
    rows = [("input figure", "value", "engine's definition", "converted")]
    rows += [(f.name, f.value, f.definition, f.converted) for f in rec.figures]
    widths = [min(max(len(r[i]) for r in rows), cap) for i, cap in enumerate((48, 16, 100, 200))]
    out = ["conversion table:"]
    for j, r in enumerate(rows):
        out.append("  " + "  ".join(c.ljust(w) if i < 3 else c for i, (c, w) in enumerate(zip(r, widths))))
        if j == 0:
            out.append("  " + "  ".join("-" * w for w in widths[:3]) + "  " + "-" * 9)
    if rec.observations > 5:
        out.append(f"  (figures of the first 5 of {rec.observations} observations; the rest are converted the same way)")
    return out


def format_answer(ans: Answer, gamma_max: int, max_batch: int = 0) -> list[str]:
    out = ["inputs:"] + [f"  {line}" for line in ans.inputs]
    out += [f"  {line}" for line in ans.cost.lines]
    out.append(f"predicted (closed form, context {ans.context_tokens:.0f} tokens, batch 1):")
    out.append("   k  tokens/round  round ms    tok/s  speedup  break-even alpha")
    for r in ans.rows:
        be = r["break_even_alpha"]
        out.append(f"  {r['k']:2d}  {r['expected_tokens_per_round']:12.3f}  {r['round_time_ms']:8.3f}  "
                   f"{r['tokens_per_s']:7.1f}  {r['speedup']:6.3f}x  {'never' if be is None else f'{be:.3f}':>16s}"
                   + ("  <- optimal" if r["k"] == ans.optimal_k else ""))
    base = ans.rows[0]["tokens_per_s_baseline"]
    line = f"optimal k = {ans.optimal_k}: speedup {ans.optimal_speedup:.3f}x over {base:.1f} tok/s autoregressive"
    if ans.optimal_speedup < 1.0:
        line += " (speculative decoding is SLOWER at every k: turn it off)"
    out.append(line)
    k_eng = ans.record.k
    if k_eng is not None and 1 <= k_eng <= gamma_max and k_eng != ans.optimal_k:
        at = ans.rows[k_eng - 1]["speedup"]
        out.append(f"the engine ran k = {k_eng}: predicted {at:.3f}x there")
    if ans.batch_rows:
        mem = ans.memory
        fits = ""
        if mem is not None:
            gpus = f"{mem['gpus']} x " if mem["gpus"] > 1 else ""
            fits = (f"; batches that fit {gpus}{mem['hardware']} ({mem['usable_bytes'] / 1e9:.0f} of "
                    f"{mem['memory_bytes'] / 1e9:.0f} GB usable): weights {mem['weights_bytes'] / 1e9:.1f} GB + KV "
                    f"cache {mem['kv_bytes_per_sequence'] / 1e9:.3f} GB a sequence at "
                    f"{mem['positions_per_sequence']:.0f} tokens" + (" per GPU" if gpus else ""))
        out.append(f"by batch size (closed form, every sequence in lockstep{fits}):")
        out.append("  batch  best k  speedup")
        for r in ans.batch_rows:
            k = "off" if r["best_k"] == 0 else str(r["best_k"])
            note = "" if r["best_k"] else f"  (off: best k = {r['best_k_if_on']} would be {r['best_speedup_if_on']:.3f}x)"
            out.append(f"  {r['batch']:5d}  {k:>6s}  {r['speedup']:6.3f}x{note}")
        if mem is not None and mem["max_batch"] < max_batch:
            out.append(f"  batch {mem['max_batch'] + 1} and above do not fit: memory binds below --max-batch "
                       f"{max_batch} (the serving simulation runs at batch <= {mem['max_batch']})")
        elif mem is None:
            out.append("  (memory not checked: the cost model carries no model sizes; --preset or --target/--draft have them)")
        cb = ans.batch_crossover or {}
        if cb.get("batch") is None:
            out.append(f"speculation pays at every batch up to {cb.get('limit')}"
                       + (f", the largest that fits {mem['hardware']} (memory binds before speculation stops paying)"
                          if mem is not None else " (searched)"))
        elif cb["batch"] == 1:
            out.append("speculation pays at no batch size: leave it off")
        else:
            out.append(f"speculation stops paying at batch {cb['batch']} (closed form): off from there on")
    if ans.serve_rows:
        out.append("by arrival rate (serving simulation, same arrivals with and without speculation; the speedup is "
                   "p50 latency while both sides keep up, capacity when either is overloaded):")
        out.append("  req/s  mean batch  best k  speedup")
        for r in ans.serve_rows:
            k = "off" if r["best_k"] == 0 else str(r["best_k"])
            basis = "" if r["speedup_basis"] == "p50 latency" else "  (capacity: overloaded)"
            note = "" if r["best_k"] else f"  (off: best k = {r['best_k_if_on']} would be {r['best_speedup_if_on']:.3f}x)"
            out.append(f"  {r['arrival_rate_per_s']:5g}  {r['mean_batch_baseline']:10.1f}  {k:>6s}  "
                       f"{r['speedup']:6.3f}x{basis}{note}")
        out.append(crossover(ans.serve_rows, "arrival_rate_per_s", "arrival rate"))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.track = usable_tracker(args.track, PROG)
    try:
        serve = serve_settings(args)  # before any file is read: a serve run too big to finish is refused at once
        ing: Ingested = ingest_files(list(args.files), args.engine, args.spec_tokens)
        lines: list[str] = []
        if ing.record is not None:
            acc_files = [(p, f) for p, f in ing.files if not f.startswith("llama-bench")]
            lines += format_record(ing.record, acc_files)
            if args.explain:
                lines += format_explain(ing.record)
        gpu = GpuFlags(args.target, args.draft, args.tp, args.ep, args.dtype, args.cost_source, args.moe_routing,
                       args.engine_overhead)
        cost = choose_cost(ing, args.preset, args.hardware, args.cost_model, args.context_tokens, gpu, args.gamma_max)
        ans = answer(ing, cost, args.gamma_max, serve)
        lines += format_answer(ans, args.gamma_max, serve.max_batch if serve is not None else 0)
        doc = summary(ans, args.gamma_max)
        if args.out:
            out = Path(args.out)
            written = write_files(ans, out, args.gamma_max)
            lines.append("wrote " + ", ".join(written.values()))
            lines.append("reproduce: " + sim_command(ans, out, args.gamma_max))
            doc["files"] = written
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{PROG}: error: cannot write {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    if args.track:
        from calibrate.tracking import track_ingest

        track_ingest(args.track, doc, {k: v for k, v in vars(args).items() if k != "track"}, PROG, args.out)
    print(json.dumps({"optimal_k": doc["optimal_k"], "optimal_speedup": doc["optimal_speedup"],
                      "alpha_per_position": [p["alpha"] for p in doc["acceptance"]["alpha_per_position"]],
                      "iid_alpha": doc["acceptance"]["iid_alpha"],
                      "acceptance_rate": doc["acceptance"]["acceptance_rate"],
                      "mean_tokens_per_round": doc["acceptance"]["mean_tokens_per_round"],
                      "speedup_by_k": [r["speedup"] for r in doc["predictions"]],
                      "cost_measured": doc["cost_measured"], "files": doc.get("files", {})}))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
