"""The token-tree report: speedup against verify budget for chains and trees, measured with 95% CIs beside
predicted, and whether branching pays.

Reads what ``python -m calibrate trees`` wrote (``tree_predictions.csv``,
``tree_curves.csv``, ``tree_calibration.json``, ``advice.json``); fits nothing.

* :func:`speedup_vs_budget_chart` — x: the verify budget (draft tokens a round
  verifies besides the root), y: speedup over the baseline. Measured cells as
  points with their 95% CI bars (shape: chain or tree), each cell's held-out
  prediction as an open mark beside it, and the calibrated predictions as
  lines: the best tree of each budget, the chain on the tree loop and on the
  chain loop.
* :func:`trees_section` — that chart, the held-out error against its targets and
  the advice, as a :class:`reports.builder.Section`; :func:`section_html` the
  same as one HTML fragment (the chart inline as SVG).
* :func:`trees_pages` — the sections of the page ``python -m reports`` writes for a
  tree calibration (or a tree run holding one in ``calibration/``), which
  :func:`build_trees_report` (:data:`REPORT`) has the one page builder draw.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

import altair as alt
import pandas as pd

from measure.records import RUN_JSON
from measure.runkinds import TREES
from reports.builder import Figure, KindReport, Links, Page, ReportResult, Section, build, draw, table_html

from toolkit.files import resolve_from
from toolkit.tables import Column

PREDICTIONS = "tree_predictions.csv"
CURVES = "tree_curves.csv"
CALIBRATION = TREES.calibration_file
ADVICE = "advice.json"
CAL_DIR = TREES.calibration_dir
CHART = "speedup_vs_budget"
AGAIN = "re-run python -m calibrate trees to write it again"
#: What the page reads of each file ``python -m calibrate trees`` writes, and what their values must be.
PREDICTION_COLUMNS = ("split", "kind", "shape", "loop", "n_nodes", "measured_speedup", "measured_speedup_lo",
                      "measured_speedup_hi", "predicted_speedup", "ape_speedup_pct", "inside_ci")
PREDICTION_VALUES = (Column("n_nodes", lo=1, integer=True), Column("measured_speedup", lo=0.0, lo_open=True),
                     Column("measured_speedup_lo", required=False), Column("measured_speedup_hi", required=False),
                     Column("predicted_speedup", lo=0.0, lo_open=True), Column("ape_speedup_pct", lo=0.0))
CURVE_COLUMNS = ("budget", "series", "predicted_speedup")
CURVE_VALUES = (Column("budget", lo=1, integer=True), Column("predicted_speedup", lo=0.0, lo_open=True))
ADVICE_KEYS: dict[str, type | tuple[type, ...]] = {"answer": str, "budget": int, "best_chain": dict,
                                                    "best_tree": dict, "sglang": dict, "vllm": dict}


@dataclass(frozen=True)
class TreeCalibrationFiles:
    """A tree calibration directory read whole and checked (:func:`read_tree_calibration`)."""

    path: Path
    cal: dict
    advice: dict
    predictions: pd.DataFrame
    curves: pd.DataFrame


def read_tree_calibration(d: Path) -> TreeCalibrationFiles:
    """Every file of the tree calibration ``d`` the page draws from, checked before anything is drawn: the JSON
    documents with the keys the page reads (a ``{}`` calibration drew a page without its error, a deleted
    ``advice.json`` one without its answer), the tables whole (torn rows, ``inf``, missing columns), and the
    best-tree curve over every budget the advice searched (budgets 1..N, as ``tree_curves.csv`` is written).
    One ``ValueError`` line."""
    from reports.page import read_doc, read_table

    cal = read_doc(d / CALIBRATION, "tree calibration", {"run": str, "draft": str, "summary": dict}, AGAIN)
    cal["run"] = str(resolve_from(d, cal["run"], RUN_JSON))  # from d (older: from the working directory)
    advice = read_doc(d / ADVICE, "advice file", ADVICE_KEYS, AGAIN)
    pred = read_table(d / PREDICTIONS, PREDICTION_COLUMNS, PREDICTION_VALUES, AGAIN)
    curves = read_table(d / CURVES, CURVE_COLUMNS, CURVE_VALUES, AGAIN)
    if len(curves.columns):
        best = sorted(int(b) for b in curves.loc[curves["series"] == "best tree", "budget"])
        if best != list(range(1, advice["budget"] + 1)):
            raise ValueError(f"{str(d / CURVES)!r} holds the best tree at {len(best)} of the {advice['budget']} "
                             f"budgets the advice searched (1..{advice['budget']}): cut short?; {AGAIN}")
    return TreeCalibrationFiles(d, cal, advice, pred, curves)


def tree_calibration_dir(src: str | Path) -> Path | None:
    """``src`` if it holds a tree calibration, its ``calibration/`` if it is a tree run holding one, else None (not
    a tree directory); a tree run without its calibration is a one-line ``ValueError``."""
    from reports.page import run_calibration_dir

    return run_calibration_dir(src, TREES)


def measured_frame(predictions: pd.DataFrame) -> pd.DataFrame:
    """The held-out rows as the chart draws them: the cell's verify budget, kind, measured [CI], predicted."""
    need = {"split", "kind", "shape", "loop", "n_nodes", "measured_speedup", "measured_speedup_lo",
            "measured_speedup_hi", "predicted_speedup"}
    missing = sorted(need - set(predictions.columns))
    if missing:
        raise ValueError(f"{PREDICTIONS}: missing columns {missing}")
    held = predictions[predictions["split"] == "held_out"].copy()
    if held.empty:
        raise ValueError(f"{PREDICTIONS}: no held-out rows to plot")
    held["budget"] = held["n_nodes"].astype(int)
    held["label"] = [f"{k}: {s} ({loop} loop)" for k, s, loop in zip(held["kind"], held["shape"], held["loop"])]
    return held


def speedup_vs_budget_chart(predictions: pd.DataFrame, curves: pd.DataFrame) -> alt.TopLevelMixin:
    """Measured speedup (points, 95% CI bars) and the held-out prediction of each cell (open marks) against the
    verify budget, over the predicted best tree and chains (lines)."""
    for col in ("budget", "series", "predicted_speedup"):
        if col not in curves.columns:
            raise ValueError(f"{CURVES}: missing column {col!r}")
    if curves.empty:
        raise ValueError(f"{CURVES}: no rows to plot")
    held = measured_frame(predictions)
    x = alt.X("budget:Q", title="verify budget (draft tokens per round)", scale=alt.Scale(zero=False),
              axis=alt.Axis(tickMinStep=1, format="d"))
    lines = alt.Chart(curves).mark_line(point=alt.OverlayMarkDef(size=20)).encode(
        x=x, y=alt.Y("predicted_speedup:Q", title="speedup over the baseline", scale=alt.Scale(zero=False)),
        color=alt.Color("series:N", title="predicted (calibrated, all cells)",
                        scale=alt.Scale(range=["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd"])),
        tooltip=["series", "budget", alt.Tooltip("predicted_speedup:Q", format=".3f"), "paths"])
    bars = alt.Chart(held.dropna(subset=["measured_speedup_lo", "measured_speedup_hi"])).mark_rule(
        color="black").encode(x=x, y="measured_speedup_lo:Q", y2="measured_speedup_hi:Q")
    shape = alt.Shape("kind:N", title="measured cell")
    points = alt.Chart(held).mark_point(filled=True, size=70, color="black").encode(
        x=x, y="measured_speedup:Q", shape=shape,
        tooltip=["label", alt.Tooltip("measured_speedup:Q", format=".3f"),
                 alt.Tooltip("measured_speedup_lo:Q", format=".3f"), alt.Tooltip("measured_speedup_hi:Q", format=".3f"),
                 alt.Tooltip("predicted_speedup:Q", format=".3f", title="held-out prediction")])
    pred = alt.Chart(held).mark_point(filled=False, size=110, color="#cf222e", strokeWidth=1.5).encode(
        x=x, y="predicted_speedup:Q", shape=shape,
        tooltip=["label", alt.Tooltip("predicted_speedup:Q", format=".3f", title="held-out prediction")])
    return alt.layer(lines, bars, points, pred).properties(width=560, height=320)


def _error_html(summary: dict) -> str:
    names = {"all": "chains and trees", "chain": "chains", "tree": "trees", "beam": "per-round beams (apart)"}
    lines = []
    for name, v in summary.get("held_out", {}).items():
        share = f"{v['n_inside_ci']}/{v['n_with_ci']}" if v.get("n_with_ci") else "no CI"
        lines.append(f"<li>{html.escape(names.get(name, name))}: held-out speedup MAPE {v['speedup_mape_pct']:.2f}% "
                     f"(max {v['max_ape_pct']:.1f}%, {v['n_cells']} cells), {share} inside the measured 95% CI</li>")
    t = summary.get("targets")
    if t:
        lines.append(f"<li>targets: MAPE ≤ {t['speedup_mape_pct']:g}% — {'met' if t['mape_met'] else 'missed'}; "
                     f"≥ {100 * t['share_inside_ci']:.0f}% inside — {'met' if t['inside_met'] else 'missed'}</li>")
    return "<ul>" + "".join(lines) + "</ul>"


def _advice_html(advice: dict) -> str:
    if not advice:
        return ""
    ci = advice.get("speedup_intervals") or {}

    def line(name: str, what: str, pred: dict) -> str:
        lo, hi = ci.get(name, (None, None))
        span = f" [95% CI {lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else ""
        return f"<li>{what}: predicted {pred['speedup']:.3f}×{span}</li>"

    sg, vl = advice["sglang"], advice["vllm"]
    return (f"<h3>Does branching pay here?</h3><p class='big'>{html.escape(advice['answer'])}</p><ul>"
            + line("best_chain", f"best chain (γ = {advice['best_chain']['n_nodes']})", advice["best_chain"])
            + line("best_tree", f"best tree ({advice['best_tree']['n_nodes']} nodes, depth "
                   f"{advice['best_tree']['depth']})", advice["best_tree"])
            + line("sglang", f"SGLang <code>{html.escape(sg['command'])}</code>", sg["prediction"])
            + line("vllm", f"vLLM <code>{html.escape(vl['command'])}</code>", vl["prediction"]) + "</ul>")


def section_html(cal_dir: str | Path) -> str:
    """The tree section of a report (an HTML fragment): error summary, the chart (inline SVG), the advice."""
    files = read_tree_calibration(Path(cal_dir))
    return draw((trees_section(files, speedup_vs_budget_chart(files.predictions, files.curves)),)).html


def trees_section(files: TreeCalibrationFiles, chart: alt.TopLevelMixin) -> Section:
    """The tree section: the error against its targets, ``chart`` (:func:`speedup_vs_budget_chart`), the advice."""
    cal, advice = files.cal, files.advice
    return Section((
        "<section id='trees'><h2>Speedup against verify budget: chains and trees</h2>"
        "<p class='key'>Black: measured, with 95% CI bars (shape: chain or tree). Red, open: each cell's held-out "
        "prediction (fitted on the other shapes only). Lines: the calibration on every cell — the best tree of "
        f"each budget and the chains.</p>{_error_html(cal.get('summary', {}))}",
        Figure(CHART, chart), f"{_advice_html(advice)}</section>"))


def _cells_html(pred: pd.DataFrame) -> str:
    from reports.page import judged_columns

    held = measured_frame(pred)
    held = judged_columns(held, "measured_speedup", "measured_speedup_lo", "measured_speedup_hi", "{:.3f}")
    cols = ["kind", "loop", "shape", "budget", "measured [95% CI]", "predicted_speedup", "ape_speedup_pct",
            "inside CI"]
    return table_html(held[cols].rename(columns={"predicted_speedup": "held-out prediction",
                                                 "ape_speedup_pct": "error %"}), "{:.3f}")


def trees_pages(d: Path, files: TreeCalibrationFiles) -> tuple[Page]:
    """The page of the tree calibration ``d`` (read: ``files``): the tree section and its chart's links, every
    cell against its held-out prediction, the calibration's notes."""
    cal, pred = files.cal, files.predictions
    title = f"specscope token-tree report: {cal.get('draft', '?')} draft, {Path(str(cal.get('run', ''))).name}"
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in cal.get("notes") or [])
    sections = (trees_section(files, speedup_vs_budget_chart(pred, files.curves)),
                Section((Links(CHART), "<h2 id='cells'>Every cell, measured against its held-out prediction</h2>",
                         _cells_html(pred))),
                Section((f"<details><summary>Calibration notes</summary><ul>{notes}</ul></details>" if notes else "",)))
    return (Page(title, sections, source=d),)


#: The tree run's report: :func:`tree_calibration_dir`, read whole, :func:`trees_pages`.
REPORT = KindReport((TREES,), tree_calibration_dir, read_tree_calibration, trees_pages)


def build_trees_report(src: str | Path, out: str | Path | None = None, png: bool = True) -> ReportResult:
    """Write ``report.html`` (and the chart as interactive HTML and PNG) for a tree calibration into ``out``
    (default: ``<calibration>/report``)."""
    return build(REPORT, src, out, png)


__all__ = ["REPORT", "build_trees_report", "measured_frame", "section_html", "speedup_vs_budget_chart",
           "tree_calibration_dir", "trees_pages", "trees_section"]
