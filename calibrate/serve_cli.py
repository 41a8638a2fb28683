"""``python -m calibrate serve RUN_DIR`` — fit the serving simulator to a ``measure serve`` run (or to the
benchmark files of GuideLLM, ``vllm bench serve`` or inference-perf), predict held-out loads, advise k per
concurrency.

Examples::

    python -m calibrate serve runs/serve-sweep
    python -m calibrate serve runs/serve-sweep --holdout-k 4 --holdout-loads c2,r1 --out runs/serve-cal
    python -m calibrate serve --off bench/off --spec k=2:bench/k2 --spec k=4:bench/k4 --out runs/bench-cal
    python -m calibrate serve --manifest bench/manifest.json --out runs/bench-cal
    python -m calibrate serve --off bench/off --spec k=4:bench/k4 --hardware h100-sxm --engine vllm \
        --target meta-llama/Llama-3.1-8B-Instruct --out runs/bench-cal

Benchmark files (:mod:`calibrate.benchfiles`): one file or directory per configuration, speculation off
(``--off``) and each draft length (``--spec k=K:PATH``, repeatable), or a manifest (JSON: ``{"off": PATH,
"spec": {"4": PATH, ...}}``, paths relative to it, optional ``"slots"`` and ``"lookup_n"``). The format is
detected; ``/metrics`` scrapes beside a file (``X.before.prom``/``X.after.prom``) give the acceptance
where the file has none. The rows they normalise to are written to ``OUT/run`` (a serving run directory
the report reads). With the deployment named (``--hardware GPU``, and ``--engine``, ``--target MODEL``,
``--tp``, ``--ep``, ``--dtype``, ``--cost-source`` as ``python -m sim`` takes them; ``--target`` defaults to
the model the files name) the step cost is that model's forward on that GPU and engine — the kernel tables
where they cover it, else the roofline, the output says which and why — and only its efficiency and a per-step
overhead are fitted (:class:`sim.serving.ForwardStepCost`); without them, a free linear step cost.

Prints per (configuration, load) the measured throughput and e2e latency p50/p95
with their 95% CIs beside the prediction, the held-out MAPE against the targets
(throughput 5%, p50 10%, p95 15%) and the share inside the measured CIs, then
the best k per concurrency with the configs to paste and the advised k's regret
against the measured best; writes ``serve_calibration.json``,
``serve_predictions.csv``, ``serve_curves.csv`` (latency against load, for the
report) and ``advice.json``; ends with one JSON line. Bad input: one line,
exit status 2.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any, Sequence, cast

from measure.runkinds import SERVE
from presets import HARDWARE, MODELS
from sim.acceptance import PerPositionAcceptance
from sim.cli import GPU_FLAGS, _add_gpu_flags, _model_arg, engine_source_conflict
from toolkit.cli import OneLineParser, check_output_dir, choice_arg, fail, int_arg, nonempty_arg
from toolkit.files import path_from

PROG = "python -m calibrate serve"


def build_parser() -> OneLineParser:
    p = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("run", metavar="RUN_DIR", nargs="?", default=None, type=nonempty_arg("run directory"),
                   help="a run directory written by python -m measure serve (or give benchmark files below)")
    p.add_argument("--off", action="append", default=[], metavar="PATH",
                   help="benchmark file or directory of speculation off (GuideLLM, vllm bench serve, inference-perf)")
    p.add_argument("--spec", action="append", default=[], metavar="k=K:PATH",
                   help="benchmark file or directory of draft length K (repeatable)")
    p.add_argument("--manifest", default=None, metavar="FILE", help="a JSON manifest naming the benchmark files")
    p.add_argument("--slots", type=int_arg(1, 4096), default=None,
                   help="benchmark files: the server's batch slots (default: the largest concurrency measured)")
    p.add_argument("--lookup-n", type=int_arg(1, 64), default=None,
                   help="benchmark files of llama-server prompt lookup: its --spec-ngram-simple-size-n (default 1: "
                   "any k drafts)")
    p.add_argument("--holdout-k", default=None, help="comma list of draft lengths to hold out (default: the middle "
                   "of three or more; 'none' for none)")
    p.add_argument("--holdout-loads", default=None, help="comma list of loads to hold out, e.g. c2,r1 (default: "
                   "every other concurrency and every rate; 'none' for none)")
    p.add_argument("--seeds", type=int_arg(1, 1000), default=8, help="simulations per unit (default 8)")
    p.add_argument("--seed", type=int_arg(0, 2**31 - 1), default=0, help="seed of every simulation (default 0)")
    p.add_argument("--advice-draws", type=int_arg(1, 1000), default=12,
                   help="acceptance draws behind each advised speedup's interval (default 12)")
    p.add_argument("--advise-k", default=None, help="draft lengths the advice chooses from (default: the measured)")
    p.add_argument("--out", default=None, type=nonempty_arg("directory"),
                   help="output directory (default: RUN_DIR/calibration-serve)")
    p.add_argument("--step-cost-units-only", action="store_true",
                   help="fit the step cost to the synthetic step-cost units alone (default: to the real training "
                   "units as well, whose steps mix drafting and non-drafting slots and emit accepted tokens)")
    p.add_argument("--allow-incomplete", action="store_true", help="use a run that is not complete")
    p.add_argument("--hardware", type=choice_arg("hardware", list(HARDWARE)), help="benchmark files: the "
                   "deployment's GPU; the step cost starts from its model's forward there (kernel tables or roofline)")
    p.add_argument("--target", type=_model_arg("model", list(MODELS)), help="with --hardware: the served model, a "
                   "preset name, a Hugging Face id of a shipped config, or a local directory holding config.json "
                   "(default: the model the benchmark files name)")
    _add_gpu_flags(p, batch=False, overhead=False)  # calibrate serve fits its own per-step overhead
    return p


def check_deployment_flags(args: argparse.Namespace, bench: bool) -> None:
    """The deployment flags (``--hardware`` and the rest) agree with each other and with the input; else one line,
    exit status 2."""
    given = [f"--{k.replace('_', '-')}" for k in ("target", *GPU_FLAGS) if getattr(args, k) is not None]
    if args.hardware is None and given:
        fail(PROG, f"{given[0]} needs --hardware GPU (the deployment's GPU; valid: {', '.join(HARDWARE)})")
    if args.hardware is not None and not bench:
        fail(PROG, f"--hardware {args.hardware} applies to benchmark files (--off/--spec or --manifest); a measure "
             "serve run fits its step cost to its own step-cost units")
    conflict = engine_source_conflict(args)
    if conflict:
        fail(PROG, conflict)


def deployment_cost(args: argparse.Namespace, data: Any) -> tuple[Any, list[str]]:
    """The forward step cost of the deployment the flags name (``--target`` or the files' model) and the lines
    that say which model and source; one-line ``ValueError`` for an unknown model or impossible setup."""
    from sim.cli import gpu_setup
    from sim.serving import forward_step_cost

    target, lines = args.target, []
    if target is None:
        target = data.meta.get("model")
        if not target:
            raise ValueError("--hardware needs --target MODEL: the benchmark files name no model; valid: a preset, a "
                             "Hugging Face id of a shipped config, or a local directory holding config.json")
        lines.append(f"model: {target} (named by the benchmark files; --target MODEL to name another)")
    prompts = data.requests["prompt_tokens"].dropna()
    context = (float(prompts.max()) if len(prompts) else 0.0) + data.new_tokens
    try:
        cost = forward_step_cost(target, gpu_setup(args, args.hardware), args.cost_source or "auto", data.slots,
                                 context)
    except ValueError as exc:
        named = "" if args.target is not None else " (the model the benchmark files name; give --target MODEL)"
        raise ValueError(f"{exc}{named}") from None
    s = cost.setup
    engine = "" if s["source"] != "kernels" else f", engine {s['engine']}" + (
        " (the default; --engine vllm|sglang|trtllm)" if s["engine_default"] else "")  # only the tables are per engine
    lines += [f"deployment: {s['model']} ({s['model_origin']}) on {s['tp']} x {s['hardware']} at {s['dtype']}{engine}"
              f", {data.slots} slots", f"cost source: target {cost.source_line()}; draft not priced apart (the "
              "benchmark files time whole steps: the fitted efficiency and overhead take the draft's work)"]
    return cost, lines


def _list(flag: str, text: str | None, conv: type) -> list | None:
    if text is None:
        return None
    if text.strip() == "none":
        return []
    items = [t.strip() for t in text.split(",")]
    if any(not t for t in items):
        fail(PROG, f"{flag} {text!r}: empty item in the comma list")
    try:
        return [conv(t) for t in items]
    except ValueError:
        fail(PROG, f"{flag} {text!r}: expected a comma list of {'integers' if conv is int else 'loads (cN, rX)'}")
    raise AssertionError


def _f(v: float | None, nd: int = 1) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def print_table(rows: list[dict]) -> None:
    """Measured [CI] against predicted for every group and metric judged."""
    from calibrate.serve import JUDGED

    print(f"  {'configuration':12s} {'load':6s} {'split':8s} {'metric':22s} {'measured [95% CI]':>26s} "
          f"{'predicted':>10s} {'err%':>6s} in CI")
    for r in rows:
        if r["metric"] not in JUDGED:
            continue
        ci = (f"{_f(r['measured'])} [{_f(r['measured_lo'])}, {_f(r['measured_hi'])}]"
              if r["measured_lo"] is not None else f"{_f(r['measured'])} (no CI)")
        inside = {True: "yes", False: "no"}.get(r["inside_ci"], "-")
        print(f"  {r['config']:12s} {r['load']:6s} {r['split']:8s} {r['metric']:22s} {ci:>26s} "
              f"{_f(r['predicted']):>10s} {_f(r['ape_pct']):>6s} {inside:>5s}")


def curves(cal, data, seeds: int, seed: int) -> list[dict]:
    """Predicted latency and throughput against load for every configuration: concurrency 1..slots, and the
    measured rates with points between them (the report draws them beside the measured points)."""
    import numpy as np

    from measure.serve.units import LoadSpec, ServeConfig

    real = data.units[~data.units["synthetic"].astype(bool)]
    one = data.requests[data.requests["cell_id"] == real["cell_id"].iloc[0]].sort_values("request_index")
    prompts, n_req = [int(p) for p in one["prompt_tokens"].fillna(0)], len(one)
    ids = [str(p) for p in one["prompt_id"]]
    rates = sorted(spec.rate_per_s for spec in map(LoadSpec.parse, real["load"].unique()) if not spec.closed)
    grid_rates = sorted(set(rates) | ({float(x) for x in np.linspace(min(rates) / 2, max(rates) * 1.2, 8)}
                                      if rates else set()))
    out = []
    for config in dict.fromkeys(real["config"]):
        cfg = ServeConfig.parse(config)
        if cfg.speculative and cfg.k not in cal.model.acceptance:
            continue
        loads = [LoadSpec(concurrency=c) for c in range(1, data.slots + 1)] + [LoadSpec(rate_per_s=r)
                                                                               for r in grid_rates]
        for ld in loads:
            stats = [cal.model.simulate(cfg, ld, prompts, n_req, None, seed + i, ids) for i in range(seeds)]
            row = {"config": config, "load": ld.to_str(), "concurrency": ld.concurrency or None,
                   "rate_per_s": ld.rate_per_s or None}
            for m in stats[0]:
                vals = [s[m] for s in stats if s[m] == s[m] and s[m] > 0]
                row[f"predicted_{m}"] = float(np.exp(np.mean(np.log(vals)))) if vals else None
            out.append(row)
    return out


def bench_lines(data) -> list[str]:
    """What the benchmark files were: per configuration, the tool, version and loads of each file."""
    from collections import Counter

    out = []
    for name, files in data.meta.get("sources", {}).items():
        tools = sorted({f"{f['tool']}" + (f" {f['tool_version']}" if f.get("tool_version") else "") for f in files})
        loads = Counter(ld for f in files for ld in f["loads"])
        models = sorted({f["model"] for f in files if f.get("model")})
        where = files[0]["path"] if len(files) == 1 else f"{len(files)} files, {files[0]['path']} ..."
        out.append(f"{name}: {where} ({', '.join(tools)}; loads " + ", ".join(
            f"{ld}" + (f" x{n}" if n > 1 else "") for ld, n in loads.items())
            + (f"; model {', '.join(models)}" if models else "") + ")")
    return out + [f"note: {n}" for n in data.meta.get("notes", [])]


# long: the command from the run directory to the table, the files and the one JSON line
def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    bench = bool(args.off or args.spec or args.manifest)
    if bench == (args.run is not None):
        fail(PROG, "give either a run directory (RUN_DIR) or benchmark files (--off/--spec or --manifest), "
             "not both" if bench else "give a run directory (RUN_DIR) or benchmark files (--off/--spec or --manifest)")
    check_deployment_flags(args, bench)
    run = Path(args.run) if args.run else None
    if run is not None and not (run / "run.json").is_file():
        fail(PROG, f"{args.run!r} is not a run directory (no run.json); write one with python -m measure serve")
    if run is None and not args.out:
        fail(PROG, "--out DIR is required with benchmark files")
    out = Path(args.out) if args.out else Path(str(run)) / SERVE.calibration_dir
    hk = _list("--holdout-k", args.holdout_k, int)
    hl = _list("--holdout-loads", args.holdout_loads, str)
    ak = _list("--advise-k", args.advise_k, int)
    created = not out.exists()
    try:
        check_output_dir("--out", out)
        from calibrate.advice import advice_dict, advise, format_advice, regret
        from calibrate.serve import calibrate_serve, default_split, load_serve

        if run is not None:
            data = load_serve(run, allow_incomplete=args.allow_incomplete)
        else:
            from calibrate.benchfiles.cli import bench_data

            data = bench_data(args, out / "run")
        start, deploy_lines = deployment_cost(args, data) if args.hardware is not None else (None, [])
        split = default_split(data.units, hk, hl)
        cal = calibrate_serve(data, split, seeds=args.seeds, seed=args.seed, refit=not args.step_cost_units_only,
                              start=start)
        measured_k = sorted({int(k) for k in data.units["spec_k"] if k > 0 and k in cal.model.acceptance})
        ks = ak if ak is not None else measured_k
        unknown = [k for k in ks if k not in cal.model.acceptance]
        if unknown:
            from calibrate.serve import pooled_acceptance

            fits = {k: cal.model.acceptance[k] for k in cal.counters}
            for k in unknown:
                cal.model.acceptance[k] = pooled_acceptance(fits, cal.counters, k)
        rows = advise(cal.model, cal.counters, data, ks, list(range(1, data.slots + 1)), draws=args.advice_draws,
                      seed=args.seed)
        ngram_n = max([int(n) for n in data.units["spec_ngram_n"] if n > 0] or [3])
        reg = regret(rows, data)
    except ValueError as exc:
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # the output directory this call made for nothing: nothing written
        print(f"{PROG}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    if run is None:
        from calibrate.benchfiles.cli import write_run

        write_run(data, out / "run", "python -m calibrate serve " + " ".join(
            shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)))
        run = out / "run"
        for line in bench_lines(data) + deploy_lines:
            print(line)
    from sim.serving import ForwardStepCost

    summary = cal.summary()
    st = cal.model.step
    units = (f" and {st.n_units} real training units (median residual {st.units_median_abs_residual_pct:.1f}% on "
             "theirs)" if st.n_units else "")
    what = st.cost.line() if isinstance(st.cost, ForwardStepCost) else st.cost.describe()
    print(f"step cost: {what}; request overhead {st.request_overhead_ms:.2f} ms; "
          f"median residual {st.median_abs_residual_pct:.1f}% over {st.n_steps} synthetic steps{units}")
    for k, acc in sorted(cal.model.acceptance.items()):
        inner = cast(PerPositionAcceptance, acc.inner)  # calibrate.serve fits per-position α_i
        print(f"acceptance k={k}: proposes in {100 * acc.p_propose:.1f}% of rounds, alpha_i = "
              + ", ".join(f"{a:.3f}" for a in inner.alphas))
    print(f"held out: k {list(split.test_k) or '-'}, loads {list(split.test_loads) or '-'}")
    print_table(cal.rows)
    for m, v in summary.items():
        if isinstance(v, dict):
            print(f"held-out MAPE {m}: {_f(v['mape_pct'], 2)}% (target {v['target_pct']:g}%), "
                  f"{v['n_inside_ci']}/{v['n_with_ci']} inside the measured 95% CI ({v['n']} groups)")
    if summary.get("share_inside_ci") is not None:
        print(f"inside the measured CIs overall: {100 * summary['share_inside_ci']:.0f}%")
    for line in format_advice(rows, data.slots, ngram_n):
        print(line)
    for g in reg:
        ci = (f" [95% CI {100 * g.regret_lo:.1f}, {100 * g.regret_hi:.1f}, paired by repeat]"
              if g.regret_lo is not None and g.regret_hi is not None else "")
        noise = "; within the noise: the two are not told apart" if g.regret > 0 and g.within_noise else ""
        print(f"regret at concurrency {g.concurrency}: advised k = {g.advised_k or 'off'}, measured best "
              f"k = {g.measured_best_k or 'off'}: {100 * g.regret:.1f}% of throughput{ci}{noise}")
    for note in cal.notes:
        print(f"note: {note}", file=sys.stderr)
    doc = {"run": path_from(out, run), "split": cal.split.__dict__, "step_cost": cal.model.step.cost.describe(),
           "request_overhead_ms": cal.model.step.request_overhead_ms,
           "step_fit": {"n_steps": st.n_steps, "n_ttft": st.n_ttft, "n_units": st.n_units,
                        "median_abs_residual_pct": st.median_abs_residual_pct,
                        "units_median_abs_residual_pct": st.units_median_abs_residual_pct},
           "acceptance": {str(k): a.to_dict() for k, a in cal.model.acceptance.items()},
           "summary": summary, "notes": cal.notes,
           "regret": [{**g.__dict__, "within_noise": g.within_noise} for g in reg], "advice": advice_dict(rows, data.slots, ngram_n)}
    from calibrate.written import CalibrationFiles, write_calibration  # each model checked as python -m sim reads it

    try:
        write_calibration(out, CalibrationFiles(
            {SERVE.calibration_file: doc, "advice.json": doc["advice"]},
            {"serve_predictions.csv": cal.rows,
             "serve_curves.csv": curves(cal, data, max(2, args.seeds // 2), args.seed)}))
    except ValueError as exc:
        fail(PROG, exc)
    print(f"written to {out}")
    print(json.dumps({"out": str(out), "summary": summary,
                      "max_regret": max((g.regret for g in reg), default=None)}, default=str))
    return 0
