"""The answer: ingested acceptance + a cost model → :mod:`sim` → speedup per k, optimal k, break-even α.

The cost model is, in this order of preference, llama-bench output among the
ingested files, a cost-model file (``calibrate``'s output for a ``measure``
run; a directory holding one is accepted), or a preset pair's roofline on a
hardware profile. Serving mode adds the closed form at batch sizes 1..max
and the SimPy serving simulation (``sim.events.simulate_serving``) at a list
of arrival rates: how the optimal k and the speedup move with load. Every
output says which inputs were measured and which assumed.

Files written (``--out DIR``) are the ones ``python -m sim`` reads:
``acceptance.json`` (``AcceptanceModel.describe()``, read by
``sim.acceptance.acceptance_from_dict``), ``cost_model.json``
(``TabulatedCost.save``, read by ``sim.cost.load_cost_model``) when the costs
came from llama-bench, and ``ingest.json`` with everything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from calibrate.ingest.detect import Ingested
from calibrate.ingest.llamabench import cost_from_rows
from calibrate.ingest.records import AcceptanceRecord
from presets import get_hardware, get_pair
from sim.acceptance import AcceptanceModel, IIDAcceptance, PerPositionAcceptance
from sim.analytic import break_even_alpha, optimal_gamma, predict
from sim.cost import CostModel, TabulatedCost, load_cost_model, pair_roofline_cost
from sim.events import simulate_serving
from toolkit.jsonio import clean_json, strict_dumps


@dataclass(frozen=True)
class CostChoice:
    """The cost model, where it came from (measured or assumed) and how to name it to ``python -m sim``."""

    cost: CostModel
    measured: bool
    description: str
    sim_args: tuple[str, ...]
    lines: tuple[str, ...] = ()
    write_file: bool = False
    context_tokens: float = 512.0
    context_note: str = "assumed; --context-tokens"


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


def choose_cost(ing: Ingested, preset: str | None, hardware: str | None, cost_model: str | None,
                context_tokens: float | None) -> CostChoice:
    """Pick the cost model; a one-line ValueError when none, or two, are given."""
    given = [n for n, v in (("llama-bench output", ing.bench), ("--cost-model", cost_model),
                            ("--preset", preset)) if v is not None]
    if len(given) > 1:
        raise ValueError(f"give one cost source, not {' and '.join(given)}")
    if hardware is not None and preset is None:
        raise ValueError("--hardware needs --preset (the draft/target pair whose roofline it prices)")
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
        meta = getattr(cost, "metadata", {}) or {}
        src = meta.get("source") or meta.get("run") or "a cost-model file"
        return CostChoice(cost, True, f"measured: {p} ({src})", ("--cost-model", str(p)),
                          context_tokens=512.0 if context_tokens is None else context_tokens)
    if preset is not None:
        pair = get_pair(preset)
        hw = get_hardware(hardware or pair.default_hardware)
        cost = pair_roofline_cost(pair, hw)
        what = (f"the {pair.draft.head_kind.title} on {pair.target.name} (its own layers and the LM head it reads)"
                if pair.is_head else f"{pair.draft.name} -> {pair.target.name}")
        return CostChoice(cost, False, f"assumed: roofline of {what} on {hw.name} "
                          "(datasheet bandwidth and FLOP/s x stated efficiencies, per-forward overheads)",
                          ("--preset", preset, "--hardware", hw.name),
                          context_tokens=512.0 if context_tokens is None else context_tokens)
    raise ValueError("no cost model: give llama-bench output among the files, --cost-model FILE "
                     "(calibrate's cost_model-*.json of a measure run), or --preset P [--hardware H]")


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
    if serve is not None:
        b = 1
        while b <= serve.max_batch:
            at_b = predict(acc, cost.cost, range(1, gamma_max + 1), ctx, batch=b)
            o = optimal_gamma(at_b)
            batch_rows.append({"batch": b, "optimal_k": o.gamma if o.speedup >= 1.0 else 0,
                               "speedup": o.speedup, "speedup_by_k": [p.speedup for p in at_b]})
            b *= 2
        for rate in serve.arrival_rates_per_s:
            per_k = []
            for g in range(1, gamma_max + 1):
                res = simulate_serving(acc, cost.cost, f"fixed:{g}", n_requests=serve.requests,
                                       arrival_rate_per_s=rate, n_tokens=serve.new_tokens, context_tokens=ctx,
                                       max_batch=serve.max_batch, seed=serve.seed)
                per_k.append((g, res))
            # an overloaded side has no latency ratio (sim reports None: its queue grows without bound)
            lat = max(per_k, key=lambda x: (x[1].latency_speedup_p50 or 0.0, -x[0]))
            thr = max(per_k, key=lambda x: (x[1].throughput_speedup, -x[0]))
            serve_rows.append({
                "arrival_rate_per_s": rate,
                "mean_batch_baseline": per_k[0][1].baseline.mean_batch,
                "optimal_k_latency": lat[0] if (lat[1].latency_speedup_p50 or 0.0) >= 1.0 else 0,
                "latency_speedup_p50": lat[1].latency_speedup_p50,
                "optimal_k_throughput": thr[0] if thr[1].throughput_speedup >= 1.0 else 0,
                "throughput_speedup": thr[1].throughput_speedup,
                "latency_speedup_p50_by_k": [r.latency_speedup_p50 for _, r in per_k],
                "throughput_speedup_by_k": [r.throughput_speedup for _, r in per_k],
            })
    return Answer(ing.record, acc, cost, ctx, tuple(rows), best.gamma, best.speedup,
                  _inputs(ing.record, cost, gamma_max, ctx), tuple(batch_rows), tuple(serve_rows))


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
    p.write_text(json.dumps(ans.acceptance.describe(), indent=2) + "\n")
    written["acceptance"] = str(p)
    if ans.cost.write_file and isinstance(ans.cost.cost, TabulatedCost):
        p = out / "cost_model.json"
        ans.cost.cost.save(p)
        written["cost_model"] = str(p)
    p = out / "ingest.json"
    p.write_text(strict_dumps(summary(ans, gamma_max) | {"files": written,
                                                         "sim_command": sim_command(ans, out, gamma_max)},
                              indent=2) + "\n")
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
    })
