"""Advice an engine can take: the best draft length k per concurrency, as configs to paste, with its limits.

From a calibrated serving model (:mod:`calibrate.serve`): for every closed-loop
concurrency 1..slots the simulator predicts throughput with speculation off
and at each k, on the run's own workload (its prompts' lengths, its tokens per
request, as many requests as a unit had); the best k is the one with the
highest throughput, and **0 (off) unless a k beats off**. Each row carries its
predicted speedup with a 95% interval over acceptance drawn from its posterior
(Beta on the server's counters) and the simulator's own noise; the cost fit's
uncertainty is not in it. Neighbouring rows whose k differ and where keeping
one row's k at the next concurrency would lose >= :data:`CLIFF_LOSS` of
throughput are marked as a cliff: a hand-written table with that boundary
one step off loses that much.

Printed as: vLLM ``speculative_config`` with ``num_speculative_tokens_per_batch_size``
(inclusive ranges; later gaps inherit; 0 switches speculation off), TensorRT-LLM
``draft_len_schedule`` (batch size → draft length for batches up to it) and
``max_concurrency`` (speculation off above it), llama-server flags (one k per
server: the best at the slots it runs with) and SGLang flags (one k for every
batch size: the best at the highest concurrency where speculation still pays).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from calibrate.serve import Counters, Model, ServeData
from measure.serve.units import LoadSpec, ServeConfig
from sim.acceptance import PerPositionAcceptance, ProposalAcceptance

#: A neighbouring row's k costing this share of throughput or more is a cliff.
CLIFF_LOSS = 0.05


@dataclass(frozen=True)
class AdviceRow:
    """One concurrency: the best k (0 = off), its predicted throughput speedup over off with a 95% interval, every
    k's predicted speedup, and whether the next row's k would cost >= :data:`CLIFF_LOSS` here (a cliff)."""

    concurrency: int
    best_k: int
    speedup: float
    speedup_lo: float
    speedup_hi: float
    speedup_by_k: dict
    cliff: str | None = None


def _posterior_draw(acc: ProposalAcceptance, c: Counters | None, rng: np.random.Generator) -> ProposalAcceptance:
    """An acceptance model drawn from Beta posteriors on the counters that fitted ``acc`` (``acc`` itself without)."""
    if c is None or c.drafts == 0 or not isinstance(acc.inner, PerPositionAcceptance):
        return acc
    p = float(rng.beta(c.drafts + 1, max(c.rounds - c.drafts, 0) + 1))
    reach = [c.drafts] + list(c.accepted_per_pos[:-1])
    alphas = []
    for i, a in enumerate(acc.inner.alphas):
        n = reach[i] if i < len(reach) else 0
        alphas.append(float(rng.beta(a * n + 1, (1 - a) * n + 1)) if n > 0 else a)
    return ProposalAcceptance(min(p * acc.p_propose / max(c.drafts / max(c.rounds, 1), 1e-9), 1.0),
                              PerPositionAcceptance(tuple(alphas)))


def _throughput(model: Model, k: int, concurrency: int, prompts: Sequence[int], ids: Sequence[str],
                n_requests: int, seeds: int, seed: int) -> float:
    cfg = ServeConfig("ngram", k, 1) if k else ServeConfig("off")
    vals = [model.simulate(cfg, LoadSpec(concurrency=concurrency), prompts, n_requests, None, seed + i, ids)
            ["throughput_tokens_per_s"] for i in range(seeds)]
    return float(np.exp(np.mean(np.log(vals))))


def advise(model: Model, counters: dict[int, Counters], data: ServeData, ks: Sequence[int],
           concurrencies: Sequence[int], seeds: int = 4, draws: int = 12, seed: int = 0) -> list[AdviceRow]:
    """Best k per concurrency on ``data``'s workload (k from ``ks``; 0 = off always a candidate)."""
    real = data.requests.merge(data.units[["cell_id", "synthetic"]], on="cell_id")
    first = real[~real["synthetic"].astype(bool)]
    one_unit = first[first["cell_id"] == first["cell_id"].iloc[0]].sort_values("request_index")
    prompts = [int(p) for p in one_unit["prompt_tokens"].fillna(0)]
    ids = [str(p) for p in one_unit["prompt_id"]]
    n_req = len(one_unit)
    rng = np.random.default_rng(seed)
    rows = []
    for c in concurrencies:
        base = _throughput(model, 0, c, prompts, ids, n_req, seeds, seed)
        by_k = {0: 1.0}
        draws_by_k: dict[int, list[float]] = {}
        for k in ks:
            by_k[k] = _throughput(model, k, c, prompts, ids, n_req, seeds, seed) / base
            sub = []
            for j in range(draws):
                acc = _posterior_draw(model.acceptance[k], counters.get(k), rng)
                m2 = replace(model, acceptance={**model.acceptance, k: acc})
                sub.append(_throughput(m2, k, c, prompts, ids, n_req, 1, seed + 1000 + j) / base)
            draws_by_k[k] = sub
        best = max(by_k, key=lambda kk: (by_k[kk], -kk))
        if best == 0:
            lo = hi = 1.0
        else:
            lo, hi = (float(v) for v in np.percentile(draws_by_k[best], [2.5, 97.5]))
        rows.append(AdviceRow(c, best, by_k[best], lo, hi, by_k))
    for i, (a, b) in enumerate(zip(rows, rows[1:])):
        if a.best_k != b.best_k:
            loss = 1.0 - b.speedup_by_k[a.best_k] / b.speedup
            if loss >= CLIFF_LOSS:
                rows[i + 1] = AdviceRow(**{**b.__dict__, "cliff": f"k = {a.best_k} (the row above) would lose "
                                                                      f"{100 * loss:.0f}% of throughput here"})
    return rows


def ranges(rows: Sequence[AdviceRow], top: int = 4096) -> list[tuple[int, int, int]]:
    """(first, last, k): consecutive concurrencies with the same k merged; the last range runs to ``top``."""
    out: list[list[int]] = []
    for r in rows:
        if out and out[-1][2] == r.best_k:
            out[-1][1] = r.concurrency
        else:
            out.append([r.concurrency, r.concurrency, r.best_k])
    if out:
        out[-1][1] = max(out[-1][1], top)
    return [tuple(x) for x in out]  # type: ignore[misc]


def vllm_config(rows: Sequence[AdviceRow], method: str = "ngram") -> dict:
    """vLLM ``speculative_config`` with a batch-size → k schedule (Dynamic SD, vLLM PR #32374)."""
    k_max = max((r.best_k for r in rows), default=0)
    return {"method": method, "num_speculative_tokens": max(k_max, 1),
            "num_speculative_tokens_per_batch_size": {f"{a}-{b}": k for a, b, k in ranges(rows)}}


def trtllm_config(rows: Sequence[AdviceRow]) -> dict:
    """TensorRT-LLM ``draft_len_schedule`` (batch size → k for batches up to it) and ``max_concurrency``."""
    schedule = {b: k for a, b, k in ranges(rows, top=rows[-1].concurrency if rows else 0) if k > 0}
    last_on = max((r.concurrency for r in rows if r.best_k > 0), default=0)
    return {"draft_len_schedule": schedule, "max_concurrency": last_on or None}


def llama_server_flags(rows: Sequence[AdviceRow], slots: int, ngram_n: int) -> str:
    """One k per server: the best at ``slots`` concurrent requests (``-np``)."""
    at = min(rows, key=lambda r: abs(r.concurrency - slots))
    if at.best_k == 0:
        return f"-np {slots}   (no --spec-type: speculation does not pay at {slots} concurrent requests)"
    return (f"-np {slots} --spec-type ngram-simple --spec-ngram-simple-size-n {ngram_n} "
            f"--spec-ngram-simple-size-m {at.best_k}")


def sglang_flags(rows: Sequence[AdviceRow]) -> str:
    """One k for every batch size: the best at the highest concurrency where speculation still pays."""
    on = [r for r in rows if r.best_k > 0]
    if not on:
        return "(no speculative flags: speculation does not pay at any concurrency measured)"
    r = on[-1]
    return (f"--speculative-algorithm NGRAM --speculative-num-draft-tokens {r.best_k}   (best at concurrency "
            f"{r.concurrency}; SGLang takes one k for every batch size, and speculation loses above "
            f"{r.concurrency} here)" if r.concurrency < rows[-1].concurrency else
            f"--speculative-algorithm NGRAM --speculative-num-draft-tokens {r.best_k}")


@dataclass(frozen=True)
class Regret:
    """At one measured concurrency: the advised k, the measured best k, and the throughput given up."""

    concurrency: int
    advised_k: int
    measured_best_k: int
    regret: float
    measured: dict
    regret_lo: float | None = None  # 95% interval of the regret, paired by repeat (None from one repeat)
    regret_hi: float | None = None

    @property
    def within_noise(self) -> bool:
        """The advised k's throughput is not told apart from the measured best's (the interval holds 0)."""
        return self.regret == 0.0 or (self.regret_lo is not None and self.regret_lo <= 0.0)


def regret(rows: Sequence[AdviceRow], data: ServeData) -> list[Regret]:
    """The advised k against the measured best at every measured closed-loop concurrency (geometric means over
    repeats); regret = 1 − throughput(advised) / throughput(best), with a 95% interval from the ratio paired by
    repeat (the blocks of a repeat ran side by side, so machine drift cancels in it)."""
    from measure.serve.units import log_interval

    real = data.units[~data.units["synthetic"].astype(bool)]
    out = []
    for r in rows:
        g = real[real["load"] == LoadSpec(concurrency=r.concurrency).to_str()]
        if not len(g):
            continue
        meas = {int(k): float(np.exp(np.log(v.astype(float)).mean()))
                for k, v in g.groupby("spec_k")["throughput_tokens_per_s"]}
        if r.best_k not in meas:
            continue
        best = max(meas, key=lambda kk: meas[kk])
        by_rep = g.pivot_table(index="repeat", columns="spec_k", values="throughput_tokens_per_s", aggfunc="first")
        ratio = log_interval(list((by_rep[r.best_k] / by_rep[best]).dropna().astype(float)))
        lo = None if ratio.hi is None else 1.0 - ratio.hi
        hi = None if ratio.lo is None else 1.0 - ratio.lo
        out.append(Regret(r.concurrency, r.best_k, best, 1.0 - meas[r.best_k] / meas[best], meas, lo, hi))
    return out


def format_advice(rows: Sequence[AdviceRow], slots: int, ngram_n: int) -> list[str]:
    """The advice table, the configs to paste and the cliff warnings, in lines."""
    ks = sorted(rows[0].speedup_by_k) if rows else []
    lines = ["best k per concurrency (predicted throughput speedup over speculation off; k = off: it does not pay):",
             "  conc  best k  speedup [95% CI]        " + "  ".join(f"{'off' if k == 0 else f'k={k}':>6s}" for k in ks)]
    for r in rows:
        k = "off" if r.best_k == 0 else str(r.best_k)
        ci = "(off: 1 by definition)" if r.best_k == 0 else f"{r.speedup:.3f}x [{r.speedup_lo:.3f}, {r.speedup_hi:.3f}]"
        lines.append(f"  {r.concurrency:4d}  {k:>6s}  {ci:22s}  " + "  ".join(f"{r.speedup_by_k[kk]:6.3f}" for kk in ks))
        if r.cliff:
            lines.append(f"        CLIFF: {r.cliff}")
    off_from = next((r.concurrency for r in rows if r.best_k == 0 and all(x.best_k == 0 for x in rows
                                                                            if x.concurrency >= r.concurrency)), None)
    if off_from is None:
        lines.append(f"speculation pays at every concurrency up to {rows[-1].concurrency}" if rows else "")
    elif off_from == rows[0].concurrency:
        lines.append("speculation pays at no concurrency: leave it off")
    else:
        lines.append(f"speculation stops paying at concurrency {off_from}: off from there on")
    import json

    lines.append("vLLM speculative_config: " + json.dumps(vllm_config(rows)))
    lines.append("TensorRT-LLM: " + json.dumps(trtllm_config(rows)))
    lines.append("llama-server: " + llama_server_flags(rows, slots, ngram_n))
    lines.append("SGLang: " + sglang_flags(rows))
    return lines


def advice_dict(rows: Sequence[AdviceRow], slots: int, ngram_n: int) -> dict[str, Any]:
    """Everything as JSON-able data."""
    return {"rows": [{**r.__dict__, "speedup_by_k": {str(k): v for k, v in r.speedup_by_k.items()}} for r in rows],
            "vllm": vllm_config(rows), "trtllm": trtllm_config(rows),
            "llama_server": llama_server_flags(rows, slots, ngram_n), "sglang": sglang_flags(rows)}
