"""The answer: ingested acceptance + a cost model → :mod:`sim` → speedup per k, optimal k, break-even α.

The cost model is, in this order of preference, llama-bench output among the
ingested files, a cost-model file (``calibrate``'s output for a ``measure``
run; a directory holding one is accepted), or GPU step costs of a model pair
on a hardware profile: a preset's roofline, or — with ``--target/--draft``, a
GPU flag (``--tp``, ``--ep``, ``--dtype``, ``--cost-source``) or a GPU added
with the seam — the step-cost seam (:mod:`sim.stepcost`: kernel tables where
they cover the GPU, the ingested engine and the model, else the roofline),
decided as ``python -m sim`` decides it; the output names the source of each
side. Serving mode adds the closed form at batch sizes 1..max (up to the
largest batch whose KV cache fits the GPU beside both models' weights,
:func:`sim.stepcost.sequence_memory`) and the SimPy serving simulation
(``sim.events.simulate_serving``) at a list of arrival rates: how the optimal
k and the speedup move with load. Every output says which inputs were
measured and which assumed.

Files written (``--out DIR``) are the ones ``python -m sim`` reads:
``acceptance.json`` (``AcceptanceModel.describe()``, read by
``sim.acceptance.acceptance_from_dict``), ``cost_model.json``
(``TabulatedCost.save``, read by ``sim.cost.load_cost_model``) when the costs
came from llama-bench, and ``ingest.json`` with everything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from calibrate.ingest.detect import Ingested
from calibrate.ingest.llamabench import cost_from_rows
from calibrate.ingest.records import AcceptanceRecord
from presets import get_hardware, get_pair
from sim.acceptance import AcceptanceModel, IIDAcceptance, PerPositionAcceptance
from sim.analytic import break_even_alpha, optimal_gamma, predict
from sim.cost import CostModel, TabulatedCost, cost_provenance, load_cost_model, pair_roofline_cost
from sim.engine_overheads import engine_cost
from sim.events import simulate_serving
from sim.kernels import DEFAULT_MOE_ROUTING
from sim.kernels import ENGINES as KERNEL_ENGINES
from sim.stepcost import (
    USABLE_MEMORY_FRACTION,
    GpuSetup,
    build_step_cost,
    sequence_memory,
    source_lines,
)
from calibrate.written import write_checked
from toolkit.jsonio import clean_json


@dataclass(frozen=True)
class CostChoice:
    """The cost model, where it came from (measured, fitted, supplied or assumed: ``description``; ``measured``
    only for numbers timed on a machine, :func:`sim.cost.cost_provenance`) and how to name it to ``python -m sim``."""

    cost: CostModel
    measured: bool
    description: str
    sim_args: tuple[str, ...]
    lines: tuple[str, ...] = ()
    write_file: bool = False
    context_tokens: float = 512.0
    context_note: str = "assumed; --context-tokens"
    models: tuple[str, str] | None = None  # target and draft: model sizes known, batches checked against memory
    setup: GpuSetup | None = None


@dataclass(frozen=True)
class GpuFlags:
    """The step-cost flags ``python -m sim`` takes too: models beyond the presets, parallelism, dtype, source, the
    kernel tables' MoE routing."""

    target: str | None = None
    draft: str | None = None
    tp: int | None = None
    ep: int | None = None
    dtype: str | None = None
    cost_source: str | None = None
    moe_routing: str | None = None
    engine_overhead: str = "fitted"  # not a GPU flag: it does not choose the seam, it is passed on when "none"

    FLAGS = ("tp", "ep", "dtype", "cost_source", "moe_routing")

    def given(self) -> list[str]:
        """The GPU flags given (``--target``/``--draft`` not among them)."""
        return [f"--{k.replace('_', '-')}" for k in self.FLAGS if getattr(self, k) is not None]

    def sim_args(self) -> tuple[str, ...]:
        return tuple(a for k in self.FLAGS if getattr(self, k) is not None
                     for a in (f"--{k.replace('_', '-')}", str(getattr(self, k)))) + (
            ("--engine-overhead", "none") if self.engine_overhead == "none" else ())


@dataclass(frozen=True)
class ServeSettings:
    """Serving-mode knobs: arrival rates (requests/s), largest batch, requests and tokens per request, seed."""

    arrival_rates_per_s: tuple[float, ...] = (1.0, 4.0, 16.0, 64.0)
    max_batch: int = 32
    requests: int = 100
    new_tokens: int = 128
    seed: int = 0


@dataclass(frozen=True)
class Answer:
    """Predictions for k = 1..γ_max from one acceptance record and one cost model."""

    record: AcceptanceRecord
    acceptance: AcceptanceModel
    cost: CostChoice
    context_tokens: float
    rows: tuple[dict, ...]
    optimal_k: int
    optimal_speedup: float
    inputs: tuple[str, ...]
    batch_rows: tuple[dict, ...] = ()
    serve_rows: tuple[dict, ...] = ()
    files: dict = field(default_factory=dict)
    memory: dict | None = None  # the batch the preset GPU's memory holds (weights + KV cache), when known
    batch_crossover: dict | None = None  # the smallest batch where speculation stops paying (closed form)


def choose_cost(ing: Ingested, preset: str | None, hardware: str | None, cost_model: str | None,
                context_tokens: float | None, gpu: GpuFlags = GpuFlags(), gamma_max: int = 8) -> CostChoice:
    """Pick the cost model; a one-line ValueError when none, or two, are given."""
    if (gpu.target is None) != (gpu.draft is None):
        raise ValueError("--target and --draft go together: give both, or --preset")
    given = [n for n, v in (("llama-bench output", ing.bench), ("--cost-model", cost_model),
                            ("--preset", preset), ("--target/--draft", gpu.target)) if v is not None]
    if len(given) > 1:
        raise ValueError(f"give one cost source, not {' and '.join(given)}")
    if hardware is not None and preset is None and gpu.target is None:
        raise ValueError("--hardware needs --preset or --target/--draft (the model pair whose GPU costs it prices)")
    if gpu.given() and preset is None and gpu.target is None:
        raise ValueError(f"{gpu.given()[0]} prices a model pair on a GPU: give --preset or --target/--draft")
    if ing.bench is not None:
        b = cost_from_rows(ing.bench.path, ing.bench.fmt, list(ing.bench.rows),
                           512.0 if context_tokens is None else context_tokens)
        return CostChoice(b.cost, True, f"measured by llama-bench ({b.fmt}, {ing.bench.path}); "
                          f"verify cost = pp n (the llama.cpp maintainers' approximation)", (), b.lines, True,
                          float(b.reference_depth_tokens) if context_tokens is None else context_tokens,
                          "llama-bench reference depth" if context_tokens is None else "--context-tokens")
    if cost_model is not None:
        p = Path(cost_model)
        if p.is_dir():
            found = sorted(p.glob("cost_model*.json"))
            if len(found) != 1:
                raise ValueError(f"--cost-model {cost_model}: a directory must hold exactly one cost_model*.json, "
                                 f"found {len(found)}{': ' + ', '.join(f.name for f in found) if found else ''}")
            p = found[0]
        cost = load_cost_model(p)
        where, measured = cost_provenance(cost)  # a hand-written file is supplied, never "measured"
        return CostChoice(cost, measured, f"{where}: {p}", ("--cost-model", str(p)),
                          context_tokens=512.0 if context_tokens is None else context_tokens)
    if preset is not None or gpu.target is not None:
        return _gpu_cost(ing, preset, hardware, gpu, 512.0 if context_tokens is None else context_tokens, gamma_max)
    raise ValueError("no cost model: give llama-bench output among the files, --cost-model FILE "
                     "(calibrate's cost_model-*.json of a measure run), --preset P or --target T --draft D [--hardware H]")


def _gpu_cost(ing: Ingested, preset: str | None, hardware: str | None, gpu: GpuFlags, context_tokens: float,
              gamma_max: int) -> CostChoice:
    """A model pair's GPU step costs: a preset's roofline, or the step-cost seam where ``python -m sim`` would use
    it (``--target/--draft``, a GPU flag, a GPU added with the seam); the kernel tables are the ingested engine's.
    A pair that does not fit the GPU is one ``ValueError`` line naming the setups that fit."""
    from sim.cli import ROOFLINE_ONLY_HARDWARE

    pair = get_pair(preset) if preset is not None else None
    if pair is not None:
        target, draft = pair.target.name, pair.head.kind if pair.head is not None else pair.draft.name
    else:
        assert gpu.target is not None and gpu.draft is not None
        target, draft = gpu.target, gpu.draft
    hw = get_hardware(hardware or (pair.default_hardware if pair is not None else "h100-sxm"))
    engine = ing.record.engine if ing.record is not None and ing.record.engine in KERNEL_ENGINES else None
    tp = gpu.tp or 1
    setup = GpuSetup(hw, engine or "vllm", tp, gpu.ep or tp, gpu.dtype or "bf16", engine is not None,
                     gpu.moe_routing or DEFAULT_MOE_ROUTING)
    try:
        if pair is None or gpu.given() or hw.name not in ROOFLINE_ONLY_HARDWARE:
            seam = build_step_cost(target, draft, setup, gpu.cost_source or "auto", 1, context_tokens, gamma_max)
            cost: CostModel = engine_cost(seam, gpu.engine_overhead, setup.engine)  # as python -m sim: one answer
            args = ("--preset", str(preset)) if pair is not None else ("--target", target, "--draft", draft)
            engine_args = ("--engine", engine) if engine and gpu.cost_source != "roofline" else ()
            what = f"GPU step costs of {pair.name if pair else f'{draft} -> {target}'} on {tp} x {hw.name} " \
                   "(sim/stepcost.py)"
            sim_args = (*args, "--hardware", hw.name, *engine_args, *gpu.sim_args())
        else:
            from sim.cli import check_preset_fits

            check_preset_fits(pair, hw.name, context_tokens, gamma_max)
            cost = pair_roofline_cost(pair, hw)
            what = "roofline of " + (
                f"the {pair.head.head_kind.title} on {pair.target.name} (its own layers and the LM head it reads)"
                if pair.head is not None else f"{pair.draft.name} -> {pair.target.name}") + \
                f" on {hw.name} (datasheet bandwidth and FLOP/s x stated efficiencies, per-forward overheads)"
            sim_args = ("--preset", str(preset), "--hardware", hw.name)
    except ValueError as exc:  # ingest has no --batch: the context is what it can shrink
        raise ValueError(str(exc).replace("a smaller --batch or --context-tokens", "a smaller --context-tokens")
                         ) from None
    return CostChoice(cost, False, f"assumed: {what}", sim_args, tuple(source_lines(cost.describe())),
                      context_tokens=context_tokens, models=(target, draft), setup=setup)


def acceptance_model(record: AcceptanceRecord) -> AcceptanceModel:
    """Per-position α_i when the record has them, else the implied i.i.d. α; ValueError when neither."""
    if record.positions:
        return PerPositionAcceptance(record.alphas)
    if record.iid_alpha is not None:
        return IIDAcceptance(record.iid_alpha)
    why = next((n for n in record.notes if "alpha not available" in n), "no acceptance figures")
    raise ValueError(f"cannot predict from {', '.join(record.sources)}: {why}")


def _inputs(record: AcceptanceRecord, cost: CostChoice, gamma_max: int, context_tokens: float) -> tuple[str, ...]:
    lines = [f"acceptance: measured by {record.engine} ({', '.join(record.formats)}; {record.observations} "
             f"observation(s) from {', '.join(record.sources)})"]
    if record.positions:
        k = len(record.positions)
        lines.append(f"per-position alpha: measured for positions 1..{k}"
                     + (f"; positions {k + 1}..{gamma_max} assumed = alpha_{k}" if gamma_max > k else ""))
    elif record.iid_alpha is not None:
        lines.append(f"per-position alpha: assumed i.i.d. (alpha = {record.iid_alpha:.4f} implied by {record.iid_basis})")
    lines.append(f"costs: {cost.description}")
    lines.append(f"context: {context_tokens:.0f} tokens ({cost.context_note})")
    return tuple(lines)


def answer(ing: Ingested, cost: CostChoice, gamma_max: int, serve: ServeSettings | None = None) -> Answer:
    """Closed-form predictions for k = 1..γ_max (and the serving sweep when ``serve`` is given)."""
    if ing.record is None:
        raise ValueError("no acceptance figures among the files: give an engine's spec-decode metrics too "
                         "(llama-bench output only prices the forwards)")
    if gamma_max < 1:
        raise ValueError(f"--gamma-max must be >= 1, got {gamma_max}")
    acc = acceptance_model(ing.record)
    ctx = cost.context_tokens
    rows = []
    preds = predict(acc, cost.cost, range(1, gamma_max + 1), ctx)
    for r in preds:
        rows.append({"k": r.gamma, "expected_tokens_per_round": r.expected_tokens_per_round,
                     "round_time_ms": r.round_time_ms, "tokens_per_s": r.tokens_per_s_speculative,
                     "tokens_per_s_baseline": r.tokens_per_s_baseline, "speedup": r.speedup,
                     "break_even_alpha": break_even_alpha(r.gamma, cost.cost, context_tokens=ctx)})
    best = optimal_gamma(preds)
    batch_rows: list[dict] = []
    serve_rows: list[dict] = []
    memory = None
    if serve is not None:
        memory = batch_memory(cost, ctx, serve.new_tokens, gamma_max)
        top = serve.max_batch if memory is None else min(serve.max_batch, memory["max_batch"])
        b = 1
        while b <= top:
            at_b = predict(acc, cost.cost, range(1, gamma_max + 1), ctx, batch=b)
            o = optimal_gamma(at_b)
            on = o.speedup > 1.0
            batch_rows.append({"batch": b, "best_k": o.gamma if on else 0, "speedup": o.speedup if on else 1.0,
                               "best_k_if_on": o.gamma, "best_speedup_if_on": o.speedup,
                               "speedup_by_k": [p.speedup for p in at_b]})
            b *= 2
        limit = memory["max_batch"] if memory is not None else 1 << 16
        batch_crossover = crossover_batch(acc, cost.cost, ctx, gamma_max, limit)
        for rate in serve.arrival_rates_per_s:
            per_k = []
            for g in range(1, gamma_max + 1):
                res = simulate_serving(acc, cost.cost, f"fixed:{g}", n_requests=serve.requests,
                                       arrival_rate_per_s=rate, n_tokens=serve.new_tokens, context_tokens=ctx,
                                       max_batch=top, seed=serve.seed)
                per_k.append((g, res))
            serve_rows.append(_rate_row(rate, per_k))
    return Answer(ing.record, acc, cost, ctx, tuple(rows), best.gamma, best.speedup,
                  _inputs(ing.record, cost, gamma_max, ctx), tuple(batch_rows), tuple(serve_rows), memory=memory,
                  batch_crossover=batch_crossover if serve is not None else None)


def crossover_batch(acc: AcceptanceModel, cost: CostModel, ctx: float, gamma_max: int, limit: int) -> dict:
    """The smallest batch (closed form) at which no k in 1..γ_max beats speculation off, searched up to
    ``limit`` (the largest batch memory holds, or 65,536): ``{"batch": B or None, "limit": limit}``."""

    def pays(b: int) -> bool:
        return optimal_gamma(predict(acc, cost, range(1, gamma_max + 1), ctx, batch=b)).speedup > 1.0

    if not pays(1):
        return {"batch": 1, "limit": limit}
    lo, hi = 1, 2
    while hi <= limit and pays(hi):
        lo, hi = hi, hi * 2
    if hi > limit:
        if pays(limit):
            return {"batch": None, "limit": limit}
        hi = limit
    while hi - lo > 1:  # pays(lo), not pays(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if pays(mid) else (lo, mid)
    return {"batch": hi, "limit": limit}


def batch_memory(cost: CostChoice, context_tokens: float, new_tokens: int, gamma_max: int) -> dict | None:
    """The largest batch whose KV cache fits the GPU beside both models' weights; None when unknown.

    Per GPU, as the step-cost seam counts it (:func:`sim.stepcost.sequence_memory`: weights at the dtype over the
    TP group, the target's real KV cache — grouped-query or MLA, at the KV dtype — and the draft's), against
    :data:`sim.stepcost.USABLE_MEMORY_FRACTION` of the GPU's memory; a sequence holds (context + new tokens +
    γ_max) positions. None without a model pair, or on hardware without a fixed memory size.
    """
    setup = cost.setup
    if cost.models is None or setup is None:
        return None
    hw = setup.hardware
    if hw.memory_bytes is None:
        return None
    positions = context_tokens + new_tokens + gamma_max
    need = sequence_memory(*cost.models, setup, positions)
    assert need.usable_bytes is not None
    free = need.usable_bytes - need.weights_bytes
    if free < need.kv_bytes:
        raise ValueError(f"{cost.models[0]} and {cost.models[1]} ({need.weights_bytes / 1e9:.1f} GB of weights per GPU) "
                         f"leave no room for one sequence's KV cache ({need.kv_bytes / 1e9:.2f} GB at {positions:.0f} "
                         f"tokens) in {USABLE_MEMORY_FRACTION:.0%} of {hw.name}'s {hw.memory_bytes / 1e9:.0f} GB; "
                         "valid: a larger --tp, --dtype fp8, a smaller --context-tokens or --new-tokens")
    return {"hardware": hw.name, "gpus": setup.tp, "memory_bytes": hw.memory_bytes,
            "usable_bytes": need.usable_bytes, "weights_bytes": need.weights_bytes,
            "kv_bytes_per_sequence": need.kv_bytes, "positions_per_sequence": positions,
            "max_batch": int(free // need.kv_bytes)}


def _rate_row(rate: float, per_k: list) -> dict:
    """One arrival rate, one answer: the best k and its speedup in p50 latency when both sides keep up, in
    capacity (sustainable requests/s) when either is overloaded (no latency ratio is then bounded); off (0,
    1.0x) when no k beats speculation off."""
    lat_ok = [(g, r) for g, r in per_k if r.latency_speedup_p50 is not None]
    if lat_ok:
        g, r = max(lat_ok, key=lambda x: (x[1].latency_speedup_p50, -x[0]))
        basis, value = "p50 latency", float(r.latency_speedup_p50)
    else:
        g, r = max(per_k, key=lambda x: (x[1].capacity_speedup, -x[0]))
        basis, value = "capacity", float(r.capacity_speedup)
    on = value > 1.0
    return {"arrival_rate_per_s": rate, "mean_batch_baseline": per_k[0][1].baseline.mean_batch,
            "best_k": g if on else 0, "speedup": value if on else 1.0, "speedup_basis": basis,
            "best_k_if_on": g, "best_speedup_if_on": value,
            "latency_speedup_p50_by_k": [x.latency_speedup_p50 for _, x in per_k],
            "throughput_speedup_by_k": [x.throughput_speedup for _, x in per_k],
            "capacity_speedup_by_k": [x.capacity_speedup for _, x in per_k]}


def crossover(rows: Sequence[dict], key: str, unit: str) -> str:
    """Where speculation stops paying, in one line (``key``: the load column of ``rows``)."""
    if not rows:
        return ""
    off = [r for r in rows if r["best_k"] == 0]
    if not off:
        return f"speculation pays at every {unit} here (up to {rows[-1][key]:g})"
    if len(off) == len(rows):
        return f"speculation pays at no {unit} here: leave it off"
    first_off = off[0][key]
    if all(r["best_k"] == 0 for r in rows if r[key] >= first_off):
        last_on = max(r[key] for r in rows if r["best_k"] > 0)
        return f"speculation stops paying between {unit} {last_on:g} and {first_off:g}: off from {first_off:g} on"
    return (f"speculation pays at {unit} " + ", ".join(f"{r[key]:g}" for r in rows if r['best_k'] > 0)
            + " and not at " + ", ".join(f"{r[key]:g}" for r in off))


def sim_command(ans: Answer, out: Path, gamma_max: int) -> str:
    """The ``python -m sim`` line that reproduces the closed-form table from the written files."""
    cost_args = ("--cost-model", str(out / "cost_model.json")) if ans.cost.write_file else ans.cost.sim_args
    return " ".join(["python -m sim", "--acceptance", str(out / "acceptance.json"), *cost_args,
                     "--gamma-max", str(gamma_max), "--context-tokens", f"{ans.context_tokens:g}"])


def write_files(ans: Answer, out: Path, gamma_max: int) -> dict[str, str]:
    """acceptance.json, cost_model.json (llama-bench costs only) and ingest.json; returns name → path."""
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    p = out / "acceptance.json"
    write_checked(p, ans.acceptance.describe())
    written["acceptance"] = str(p)
    if ans.cost.write_file and isinstance(ans.cost.cost, TabulatedCost):
        p = out / "cost_model.json"
        write_checked(p, ans.cost.cost.describe())
        written["cost_model"] = str(p)
    p = out / "ingest.json"
    write_checked(p, summary(ans, gamma_max) | {"files": written, "sim_command": sim_command(ans, out, gamma_max)})
    written["ingest"] = str(p)
    return written


def summary(ans: Answer, gamma_max: int) -> dict:
    """Everything as one JSON-able dict."""
    return clean_json({
        "acceptance": ans.record.as_dict(),
        "acceptance_model": ans.acceptance.describe(),
        "cost_model": ans.cost.cost.describe(),
        "cost_measured": ans.cost.measured,
        "inputs": list(ans.inputs),
        "context_tokens": ans.context_tokens,
        "gamma_max": gamma_max,
        "predictions": list(ans.rows),
        "optimal_k": ans.optimal_k,
        "optimal_speedup": ans.optimal_speedup,
        "by_batch": list(ans.batch_rows),
        "serving": list(ans.serve_rows),
        "memory": ans.memory,
        "batch_crossover": ans.batch_crossover,
    })
