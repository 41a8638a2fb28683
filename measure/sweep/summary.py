"""A sweep's summary: per draft the geometric-mean speedup with its CI, the best cell, the unstable cells in words."""

from __future__ import annotations

import math
from typing import Any

from measure import stats
from measure.rows import CellRow
from measure.sweep.config import LIBRARY_RATIO_TARGET


def cell_estimate(c: CellRow) -> stats.Estimate:
    """The speedup of a ``cells.csv`` row with its CI."""
    return c.estimate("speedup")


def unstable_message(c: CellRow) -> str:
    """``cell … unstable: <reason>; re-run on a quiet machine or with --repeats``."""
    return (f"cell {c.cell_id} unstable: {c.unstable_reason or 'baseline noisy'}; re-run on a quiet "
            "machine or with more --repeats")


def routing(cells: list[CellRow]) -> dict | None:
    """Model pooling: with two or more drafts, the best draft (at its best γ) per domain and temperature — or
    plain decoding where no cell beats it — against the single draft that is best over every domain.

    ``gain`` is the geometric mean over the domains of (routed speedup ÷ the single best draft's speedup): what
    sending each request's domain to its own best draft buys. Point values; each route keeps its cell's CI.
    None with one draft.
    """
    drafts = list(dict.fromkeys(c.draft for c in cells))
    scored = [c for c in cells if cell_estimate(c).value is not None]
    if len(drafts) < 2 or not scored:
        return None
    keys = list(dict.fromkeys((c.domain, c.temperature) for c in scored))

    def best_of(domain_t: tuple[str, float], draft: str | None = None) -> CellRow | None:
        mine = [c for c in scored if (c.domain, c.temperature) == domain_t and draft in (None, c.draft)]
        return max(mine, key=lambda c: cell_estimate(c).value or 0.0) if mine else None

    def speed(c: CellRow | None) -> float:
        v = cell_estimate(c).value if c is not None else None
        return max(float(v), 1.0) if v is not None else 1.0  # plain decoding is always an option

    def gmean(xs: list[float]) -> float:
        return float(math.exp(sum(math.log(x) for x in xs) / len(xs)))

    single = max(drafts, key=lambda d: gmean([speed(best_of(k, d)) for k in keys]))
    routes: list[dict[str, Any]] = []
    for k in keys:
        b = best_of(k)
        use = b if b is not None and speed(b) > 1.0 else None
        e = cell_estimate(use) if use is not None else stats.Estimate(1.0, 1.0, 1.0)
        routes.append({"domain": k[0], "temperature": k[1], "draft": use.draft if use else "off",
                       "cell_id": use.cell_id if use else None, "speedup": e.value, "speedup_lo": e.lo,
                       "speedup_hi": e.hi, "single_best_speedup": speed(best_of(k, single))})
    gain = gmean([r["speedup"] / r["single_best_speedup"] for r in routes])
    return {"single_best_draft": single, "routes": routes, "gain": gain}


def library_ratio_outside(cells: list[CellRow], target: tuple[float, float] = LIBRARY_RATIO_TARGET) -> list[dict]:
    """The cells whose ``baseline_vs_library`` (our baseline ÷ the engine's own plain decoding) leaves
    ``target``: cell id, the ratio and its CI."""
    lo, hi = target
    out = []
    for c in cells:
        e = c.estimate("baseline_vs_library")
        if e.value is not None and not lo <= e.value <= hi:
            out.append({"cell_id": c.cell_id, "ratio": e.value, "lo": e.lo, "hi": e.hi})
    return out


def peer_agreement(cells: list[CellRow]) -> dict:
    """Whether our speedup's CI overlaps the peer's (the engine's own speculative decoding, same prompts in the
    same visits) in each cell that has both with their CIs: how many cells, how many overlap, the cells that do
    not."""
    seen = {c.cell_id: stats.overlaps(c.estimate("speedup"), c.estimate("speedup_peer")) for c in cells}
    both = [c for c in cells if seen[c.cell_id] is not None]
    apart = [c for c in both if not seen[c.cell_id]]
    return {"n_cells": len(both), "n_overlap": len(both) - len(apart),
            "apart": [{"cell_id": c.cell_id, "speedup": c.speedup, "speedup_lo": c.speedup_lo,
                       "speedup_hi": c.speedup_hi, "speedup_peer": c.speedup_peer,
                       "speedup_peer_lo": c.speedup_peer_lo, "speedup_peer_hi": c.speedup_peer_hi} for c in apart]}


def summarize(cells: list[CellRow], synthetic: bool) -> dict:
    """``run.json`` summary: per draft the geometric-mean speedup with its CI, the best cell with its CI
    (and a note when that CI includes 1.0 or overlaps the runner-up's), and the unstable cells in words.

    No headline maximum: the best of several noisy cells is reported only with its interval.
    """
    if not cells:
        return {}
    per_draft: dict[str, dict] = {}
    for draft in dict.fromkeys(c.draft for c in cells):
        mine = [c for c in cells if c.draft == draft]
        gm = stats.geomean_ci([cell_estimate(c) for c in mine])
        ranked = sorted((c for c in mine if cell_estimate(c).value is not None),
                        key=lambda c: -(cell_estimate(c).value or 0.0))
        entry: dict[str, Any] = {"n_cells": len(mine), "geomean_speedup": gm.value, "geomean_speedup_lo": gm.lo,
                                 "geomean_speedup_hi": gm.hi,
                                 "n_unstable": sum(c.is_unstable for c in mine)}
        if ranked:
            best = ranked[0]
            be = cell_estimate(best)
            notes = []
            if be.contains(1.0):
                notes.append("its 95% CI includes 1.0 (no measurable speedup)")
            if len(ranked) > 1:
                ov = stats.overlaps(be, cell_estimate(ranked[1]))
                if ov:
                    notes.append(f"its CI overlaps the runner-up's ({ranked[1].cell_id}): not distinguishable")
            if best.is_unstable:
                notes.append("it is flagged unstable")
            entry.update(best_cell=best.cell_id, best_speedup=be.value, best_speedup_lo=be.lo,
                         best_speedup_hi=be.hi, best_note="; ".join(notes) or None)
        per_draft[draft] = entry
    greedy = [c for c in cells if c.temperature == 0]
    unstable = [c for c in cells if c.is_unstable]
    vs_lib = [e for e in (c.estimate("baseline_vs_library") for c in cells) if e.value is not None]
    out: dict[str, Any] = {
        "estimator": "speedup = mean tokens/s (method) / mean tokens/s (baseline) over (prompt, repeat) pairs; "
                     "95% CI: Fieller's interval for a ratio of paired means, Student t (n - 1 df)",
        "drafts": per_draft, "n_cells": len(cells), "n_unstable": len(unstable),
        "unstable": [unstable_message(c) for c in unstable], "synthetic": synthetic,
        "all_greedy_outputs_identical": all(c.outputs_identical is True for c in greedy) if greedy else None}
    if vs_lib:
        gm = stats.geomean_ci(vs_lib)
        out["baseline_vs_library"] = {"geomean": gm.value, "lo": gm.lo, "hi": gm.hi, "n_cells": len(vs_lib),
                                      "target": list(LIBRARY_RATIO_TARGET), "outside": library_ratio_outside(cells)}
    peer = peer_agreement(cells)
    if peer["n_cells"]:
        out["speedup_vs_peer"] = peer
    route = routing(cells)
    if route is not None:
        out["routing"] = route
    if synthetic:
        out["note"] = "synthetic (random-weight) models: timing only; acceptance is not a measurement"
    return out


def summary_lines(summary: dict) -> list[str]:
    """The summary in words, one line per draft plus one per unstable cell."""
    lines = []
    for draft, e in (summary.get("drafts") or {}).items():
        gm = stats.Estimate(e.get("geomean_speedup"), e.get("geomean_speedup_lo"), e.get("geomean_speedup_hi"))
        line = f"{draft}: geometric-mean speedup {gm.as_text(3)} over {e['n_cells']} cells"
        if e.get("best_cell"):
            be = stats.Estimate(e.get("best_speedup"), e.get("best_speedup_lo"), e.get("best_speedup_hi"))
            line += f"; best cell {e['best_cell']} {be.as_text(3)}"
            if e.get("best_note"):
                line += f" — {e['best_note']}"
        line += f"; {e['n_unstable']} unstable"
        lines.append(line)
    lib = summary.get("baseline_vs_library")
    if lib:
        est = stats.Estimate(lib.get("geomean"), lib.get("lo"), lib.get("hi"))
        lo, hi = lib.get("target") or LIBRARY_RATIO_TARGET
        lines.append(f"our baseline ÷ the engine's own plain decoding, same prompts in the same visits: geometric "
                     f"mean {est.as_text(3)} over {lib['n_cells']} cells (expected {lo:g}–{hi:g})")
        for c in lib.get("outside") or []:
            ratio = stats.Estimate(c.get("ratio"), c.get("lo"), c.get("hi"))
            lines.append(f"cell {c['cell_id']}: our baseline ÷ the engine's own {ratio.as_text(3)}, outside "
                         f"{lo:g}–{hi:g}: our plain decoding is not the engine's here")
    peer = summary.get("speedup_vs_peer")
    if peer:
        lines.append(f"our speedup's CI overlaps the engine's own speculative decoding's in {peer['n_overlap']} of "
                     f"{peer['n_cells']} cells")
        for c in peer.get("apart") or []:
            ours = stats.Estimate(c.get("speedup"), c.get("speedup_lo"), c.get("speedup_hi"))
            theirs = stats.Estimate(c.get("speedup_peer"), c.get("speedup_peer_lo"), c.get("speedup_peer_hi"))
            lines.append(f"cell {c['cell_id']}: our speedup {ours.as_text(3)}, the engine's own {theirs.as_text(3)}: "
                         "apart")
    route = summary.get("routing")
    if route:
        lines.append(f"routing each domain to its best draft: {route['gain']:.3f}x over the single best draft "
                     f"({route['single_best_draft']}) everywhere")
        for r in route["routes"]:
            est = stats.Estimate(r["speedup"], r["speedup_lo"], r["speedup_hi"])
            lines.append(f"  {r['domain']} (T={r['temperature']:g}) -> {r['draft']}"
                         + (f" [{r['cell_id']}] {est.as_text(3)}" if r["cell_id"] else " (no cell beats plain decoding)"))
    lines += summary.get("unstable") or []
    return lines
