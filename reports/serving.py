"""The serving report: latency and throughput against load, measured with 95% CIs beside predicted, and advice.

Reads what ``python -m calibrate serve`` wrote (``serve_predictions.csv``,
``serve_curves.csv``, ``serve_calibration.json``, ``advice.json``) and the
run's own ``run.json`` (what was measured, its per-group speedups paired by
repeat, the other processes' CPU per unit); fits nothing.

* :func:`latency_vs_load_chart` — per configuration, e2e latency (p50 and p95) and
  throughput against load: closed-loop concurrency in one column, open-loop
  arrival rate in the other; measured points with their CI bars (held-out points
  marked), predicted curves as lines.
* :func:`serving_section` — that chart, the held-out error against its targets and
  the advice table, as a :class:`reports.builder.Section`; :func:`section_html` the
  same as one HTML fragment (the chart inline as SVG: the page needs no network).
* :func:`serving_pages` — the sections of the page ``python -m reports`` writes for a
  serving calibration: the answer first (where speculation pays, measured and
  advised, the held-out error against its targets, the advised k's regret, what to
  do next), then what was measured, the chart, every group, the advice and configs,
  the run's race; :func:`build_serving_report` (:data:`REPORT`) has the one page
  builder draw them.

``python -m reports CAL_DIR`` (or the run directory holding ``calibration-serve/``)
writes ``report.html`` into ``CAL_DIR/report`` (or ``--out DIR``); so does
``python -m reports.serving CAL_DIR``.
"""

from __future__ import annotations

import html
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import altair as alt
import pandas as pd

from measure.ids import LoadSpec
from measure.records import RUN_JSON
from measure.runkinds import SERVE
from reports.builder import Figure, KindReport, Links, Page, ReportResult, Section, build, draw, table_html
from reports.race import race_sections

from toolkit.files import resolve_from
from toolkit.tables import Column

PREDICTIONS = "serve_predictions.csv"
CURVES = "serve_curves.csv"
CALIBRATION = SERVE.calibration_file
ADVICE = "advice.json"
PANELS = (("e2e_p50_ms", "e2e latency p50 (ms)"), ("e2e_p95_ms", "e2e latency p95 (ms)"),
          ("throughput_tokens_per_s", "throughput (tokens/s)"))
AGAIN = "re-run python -m calibrate serve to write it again"
#: What the page reads of each file ``python -m calibrate serve`` writes, and what their values must be.
PREDICTION_COLUMNS = ("config", "load", "split", "metric", "measured", "measured_lo", "measured_hi", "predicted",
                      "ape_pct", "inside_ci")
PREDICTION_VALUES = (Column("measured", lo=0.0, lo_open=True), Column("measured_lo", required=False),
                     Column("measured_hi", required=False), Column("predicted", lo=0.0, lo_open=True, required=False),
                     Column("ape_pct", lo=0.0, required=False))
CURVE_COLUMNS = ("config", "load", *(f"predicted_{m}" for m, _ in PANELS))
CURVE_VALUES = tuple(Column(f"predicted_{m}", lo=0.0, lo_open=True, required=False) for m, _ in PANELS)
ADVICE_KEYS: dict[str, type | tuple[type, ...]] = {"rows": list, "vllm": (dict, str), "trtllm": (dict, str),
                                                    "llama_server": (dict, str), "sglang": (dict, str)}
ADVICE_ROW_KEYS = ("concurrency", "best_k", "speedup", "speedup_lo", "speedup_hi", "speedup_by_k")


@dataclass(frozen=True)
class ServingCalibration:
    """A serving calibration directory read whole and checked (:func:`read_serving_calibration`)."""

    path: Path
    cal: dict
    advice: dict
    predictions: pd.DataFrame
    curves: pd.DataFrame


def read_serving_calibration(d: Path) -> ServingCalibration:
    """Every file of the serving calibration ``d`` the page draws from, checked before anything is drawn: the
    JSON documents with the keys the page reads (a deleted ``advice.json`` left the page without its answer, a
    ``{}`` calibration was a KeyError), the tables whole (torn rows, ``inf``, missing columns), and a predicted
    curve for every measured group (half of ``serve_curves.csv`` drew the rest). One ``ValueError`` line."""
    from reports.page import read_doc, read_table

    cal = read_doc(d / CALIBRATION, "serving calibration", {"split": dict, "summary": dict}, AGAIN)
    if isinstance(cal.get("run"), str):  # recorded relative to d (older: to the working directory)
        cal["run"] = str(resolve_from(d, cal["run"], RUN_JSON))
    for key in ("test_k", "test_loads"):
        if key not in cal["split"]:
            raise ValueError(f"serving calibration {str(d / CALIBRATION)!r} has no split {key!r}; {AGAIN}")
    advice = read_doc(d / ADVICE, "advice file", ADVICE_KEYS, AGAIN)
    for i, row in enumerate(advice["rows"]):
        missing = [k for k in ADVICE_ROW_KEYS if not isinstance(row, dict) or k not in row]
        if missing:
            raise ValueError(f"advice file {str(d / ADVICE)!r}: row {i + 1} has no {', '.join(missing)}; {AGAIN}")
    pred = read_table(d / PREDICTIONS, PREDICTION_COLUMNS, PREDICTION_VALUES, AGAIN)
    curves = read_table(d / CURVES, CURVE_COLUMNS, CURVE_VALUES, AGAIN)
    lost = sorted(set(zip(pred["config"], pred["load"])) - set(zip(curves["config"], curves["load"]))) \
        if len(pred) and len(curves.columns) else []
    if lost:
        raise ValueError(f"{str(d / CURVES)!r} has no predicted curve for {len(lost)} measured group(s) (first: "
                         f"{lost[0][0]} at {lost[0][1]}): cut short?; {AGAIN}")
    return ServingCalibration(d, cal, advice, pred, curves)


def _load_axis(frame: pd.DataFrame) -> pd.DataFrame:
    """``kind`` (closed loop / open loop) and ``x`` (concurrency or requests/s) from the ``load`` column."""
    out = frame.copy()
    loads = [LoadSpec.parse(str(v)) for v in out["load"]]
    out["kind"] = ["concurrency (closed loop)" if ld.closed else "arrival rate, req/s (open loop)" for ld in loads]
    out["x"] = [ld.amount for ld in loads]
    return out


def latency_vs_load_chart(predictions: pd.DataFrame, curves: pd.DataFrame) -> alt.Chart:
    """Measured (points, 95% CI bars) and predicted (lines) latency and throughput against load per configuration."""
    need_p = {"config", "load", "split", "metric", "measured", "measured_lo", "measured_hi"}
    need_c = {"config", "load"} | {f"predicted_{m}" for m, _ in PANELS}
    for df, need, name in ((predictions, need_p, PREDICTIONS), (curves, need_c, CURVES)):
        missing = sorted(need - set(df.columns))
        if missing:
            raise ValueError(f"{name}: missing columns {missing}")
        if df.empty:
            raise ValueError(f"{name}: no rows to plot")
    # only the plotted columns: others (inside_ci, an object column with NaN where a group has no CI) would
    # reach the chart's JSON as a bare NaN, which Vega-Lite refuses
    plotted = ["config", "load", "split", "metric", "measured", "measured_lo", "measured_hi"]
    meas = _load_axis(predictions.loc[predictions["metric"].isin([m for m, _ in PANELS]), plotted])
    pred = _load_axis(curves)
    kinds = sorted(set(meas["kind"]) | set(pred["kind"]), key=lambda k: not k.startswith("concurrency"))
    color = alt.Color("config:N", title="configuration")
    x = alt.X("x:Q", title=None)
    rows = []
    for metric, title in PANELS:
        panels = []
        for kind in kinds:
            m = meas[(meas["metric"] == metric) & (meas["kind"] == kind)]
            p = pred[pred["kind"] == kind].rename(columns={f"predicted_{metric}": "predicted"})
            line = alt.Chart(p[["config", "x", "predicted"]].dropna()).mark_line().encode(
                x=x, y=alt.Y("predicted:Q", title=title), color=color)
            bars = alt.Chart(m.dropna(subset=["measured_lo", "measured_hi"])).mark_rule().encode(
                x=x, y="measured_lo:Q", y2="measured_hi:Q", color=color)
            points = alt.Chart(m).mark_point(size=50).encode(
                x=x, y="measured:Q", color=color, shape=alt.Shape("split:N", title="measured point"),
                tooltip=["config", "load", "split", alt.Tooltip("measured:Q", format=".1f"),
                         alt.Tooltip("measured_lo:Q", format=".1f"), alt.Tooltip("measured_hi:Q", format=".1f")])
            panels.append(alt.layer(line, bars, points).properties(width=300, height=200,
                                                                   title=f"{title} against {kind}"))
        rows.append(alt.hconcat(*panels))
    return alt.vconcat(*rows).resolve_scale(color="shared", shape="shared")


def _error_html(summary: dict) -> str:
    lines = []
    for metric, v in summary.items():
        if not isinstance(v, dict) or v.get("mape_pct") is None:
            continue
        ok = "meets" if v["mape_pct"] <= v["target_pct"] else "misses"
        lines.append(f"<li>{html.escape(metric)}: held-out MAPE {v['mape_pct']:.2f}% ({ok} the {v['target_pct']:g}% "
                     f"target), {v['n_inside_ci']}/{v['n_with_ci']} predictions inside the measured 95% CI</li>")
    share = summary.get("share_inside_ci")
    if share is not None:
        lines.append(f"<li>inside the measured CIs overall: {100 * share:.0f}%</li>")
    return "<ul>" + "".join(lines) + "</ul>"


def _advice_html(advice: dict) -> str:
    rows = advice.get("rows") or []
    if not rows:
        return ""
    ks = sorted(int(k) for k in rows[0]["speedup_by_k"])
    head = "".join(f"<th>{'off' if k == 0 else f'k={k}'}</th>" for k in ks)
    body = []
    for r in rows:
        best = "off" if r["best_k"] == 0 else str(r["best_k"])
        ci = "1 (off)" if r["best_k"] == 0 else f"{r['speedup']:.3f} [{r['speedup_lo']:.3f}, {r['speedup_hi']:.3f}]"
        cells = "".join(f"<td>{r['speedup_by_k'][str(k)]:.3f}</td>" for k in ks)
        body.append(f"<tr><td>{r['concurrency']}</td><td>{best}</td><td>{ci}</td>{cells}</tr>"
                    + (f"<tr><td></td><td colspan='{len(ks) + 2}'>cliff: {html.escape(r['cliff'])}</td></tr>"
                       if r.get("cliff") else ""))
    configs = "".join(f"<li>{html.escape(name)}: <code>{html.escape(json.dumps(advice[key]) if isinstance(advice[key], dict) else advice[key])}</code></li>"
                      for name, key in (("vLLM speculative_config", "vllm"), ("TensorRT-LLM", "trtllm"),
                                        ("llama-server", "llama_server"), ("SGLang", "sglang")))
    return ("<h3>Best k per concurrency</h3><table><tr><th>concurrency</th><th>best k</th>"
            f"<th>speedup [95% CI]</th>{head}</tr>{''.join(body)}</table><ul>{configs}</ul>")


def section_html(cal_dir: str | Path) -> str:
    """The serving section of a report (an HTML fragment): error summary, the chart (inline SVG), the advice."""
    sc = read_serving_calibration(Path(cal_dir))
    return draw((serving_section(sc, latency_vs_load_chart(sc.predictions, sc.curves)),)).html


def serving_section(sc: ServingCalibration, chart: alt.TopLevelMixin) -> Section:
    """The serving section: the held-out split, the error against its targets, ``chart``
    (:func:`latency_vs_load_chart`), the advice."""
    cal, advice = sc.cal, sc.advice
    return Section((
        "<section id='serving'><h2>Latency and throughput against load</h2>"
        f"<p class='key'>Points: measured, with 95% CI bars (shape: held out or trained on). Lines: the "
        f"calibrated serving simulator. Held out: k {html.escape(str(cal['split']['test_k']))}, loads "
        f"{html.escape(str(cal['split']['test_loads']))}.</p>{_error_html(cal.get('summary', {}))}",
        Figure("serving", chart), f"{_advice_html(advice)}</section>"))


# -- the page ---------------------------------------------------------------------------------------------------
SERVE_CAL_DIR = SERVE.calibration_dir


def serve_calibration_dir(src: str | Path) -> Path | None:
    """``src`` if it is a serving calibration, its ``calibration-serve/`` if it is a serving run holding one, else
    None (not a serving directory); a serving run without a calibration is a one-line ``ValueError``."""
    from reports.page import run_calibration_dir

    return run_calibration_dir(src, SERVE)


def _run_meta(cal: dict) -> tuple[dict | None, Any]:
    """The run's ``run.json`` and ``serve_units`` table, when the run directory is still where it was."""
    from measure.records import load_run

    try:
        run = load_run(cal["run"])
        return run.meta, run.table("serve_units")
    except (OSError, ValueError, KeyError, TypeError):
        return None, None


def _measured_html(meta: dict | None, units: Any, cal: dict) -> str:
    e = html.escape
    if meta is None:
        return f"<p>The run directory <code>{e(str(cal.get('run')))}</code> is not readable here.</p>"
    c = meta.get("config", {})
    server = meta.get("server") or {}
    build = server.get("build") or {}
    target = (meta.get("models") or {}).get("target") or {}
    rows = [("model", f"{target.get('name', '?')} ({target.get('source', '')})"),
            ("server", f"{server.get('version') or '?'}" + (f"; build {build.get('key')}" if build else "")
             + (f"; CPU backend {server['cpu_backend'].get('variant')}" if server.get("cpu_backend") else "")),
            ("configurations", ", ".join(c.get("configs", []))),
            ("loads", ", ".join(c.get("loads", [])) + f" (slots {c.get('slots')}, {c.get('requests')} requests of "
             f"{c.get('max_new_tokens')} new tokens per unit, {c.get('repeats')} repeats)"),
            ("hardware", str(units["hardware"].iloc[0]) if units is not None and len(units) else "?"),
            ("run", f"{cal.get('run')} ({meta.get('status')})")]
    body = "".join(f"<tr><th>{e(k)}</th><td>{e(str(v))}</td></tr>" for k, v in rows)
    if meta.get("command"):
        body += f"<tr><th>command</th><td><code>{e(meta['command'])}</code></td></tr>"
    return f'<table class="tbl setup">{body}</table>'


def _measured_speedups(meta: dict | None) -> list[dict]:
    """Per closed-loop load: the best measured speculative configuration and its speedup (paired by repeat)."""
    groups = ((meta or {}).get("summary") or {}).get("groups") or []
    best: dict[str, dict] = {}
    for g in groups:
        sp = g.get("throughput_speedup") or {}
        if g.get("load") is None or not LoadSpec.parse(str(g["load"])).closed or sp.get("value") is None:
            continue
        if g["load"] not in best or sp["value"] > best[g["load"]]["value"]:
            best[g["load"]] = {"load": g["load"], "config": g["config"], **sp}
    return sorted(best.values(), key=lambda r: LoadSpec.parse(str(r["load"])).concurrency)


def _contention(units: Any) -> str | None:
    """A sentence on the units other processes shared the CPU with (None without the columns or any such unit)."""
    if units is None or "other_cpu_share" not in units or units["other_cpu_share"].isna().all():
        return None
    other = units["other_cpu_share"].astype(float).fillna(0) + units["steal_share"].astype(float).fillna(0)
    busy = int((other >= 0.1).sum())
    if not busy:
        return None
    return (f"{busy} of {len(units)} units shared the CPU with other processes (>= 0.1 cores; at most "
            f"{other.max():.2f}): their repeats disagree more, and the CIs are wider for it.")


def _ci(v: dict) -> str:
    lo, hi = v.get("lo"), v.get("hi")
    return f"{v['value']:.3f}x" + (f" [{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else "")


def _answer_html(cal: dict, advice: dict, meta: dict | None, units: Any) -> str:
    e = html.escape
    rows = advice.get("rows") or []
    paying = [r for r in rows if r["best_k"] > 0]
    if not rows:
        big = "No advice: the calibration has no advice rows."
    elif not paying:
        big = "Speculation does not pay at any concurrency here: run the server without it."
    elif len(paying) == len(rows):
        big = f"Speculation pays at every concurrency up to {rows[-1]['concurrency']} (the slots)."
    else:
        big = (f"Speculation pays up to concurrency {paying[-1]['concurrency']} and costs throughput from "
               f"{next(r['concurrency'] for r in rows if r['concurrency'] > paying[-1]['concurrency'])} on.")
    parts = [f'<p class="big">{e(big)}</p>']
    if paying:
        r0 = paying[0]
        parts.append(f"<p>Predicted best at concurrency {r0['concurrency']}: k = {r0['best_k']}, "
                     f"{r0['speedup']:.3f}x [{r0['speedup_lo']:.3f}, {r0['speedup_hi']:.3f}] the throughput of "
                     "speculation off.</p>")
    meas = _measured_speedups(meta)
    if meas:
        parts.append("<p>Measured, best speculative configuration against off (paired by repeat, 95% CI): "
                     + "; ".join(f"{m['load']}: {e(m['config'])} {_ci(m)}" for m in meas) + ".</p>")
    summ = cal.get("summary") or {}
    errs = []
    for metric, name in (("throughput_tokens_per_s", "throughput"), ("e2e_p50_ms", "p50 latency"),
                         ("e2e_p95_ms", "p95 latency")):
        v = summ.get(metric) or {}
        if v.get("mape_pct") is not None:
            cls = "ok" if v["mape_pct"] <= v["target_pct"] else "bad"
            errs.append(f"{name} <span class='{cls}'>{v['mape_pct']:.1f}%</span> (target {v['target_pct']:g}%)")
    if errs:
        share = summ.get("share_inside_ci")
        parts.append("<p>Held-out error (MAPE): " + ", ".join(errs)
                     + (f"; {100 * share:.0f}% of predictions inside the measured 95% CIs (target 80%)"
                        if share is not None else "") + ".</p>")
    reg = cal.get("regret") or []
    if reg:
        worst = max(reg, key=lambda g: g["regret"])
        ci = (f" [95% CI {100 * worst['regret_lo']:.1f}, {100 * worst['regret_hi']:.1f}]"
              if worst.get("regret_lo") is not None and worst.get("regret_hi") is not None else "")
        noise = " — within the noise: the advised and the best k are not told apart" if worst.get(
            "within_noise") and worst["regret"] > 0 else ""
        parts.append(f"<p>Advised k against the measured best: largest regret {100 * worst['regret']:.1f}%{ci} at "
                     f"concurrency {worst['concurrency']} (target 3%){e(noise)}.</p>")
    steps = []
    if advice.get("llama_server"):
        steps.append(f"<li>Start llama-server with <code>{e(str(advice['llama_server']))}</code> (other engines: "
                     "the configs below).</li>")
    cont = _contention(units)
    if cont:
        steps.append(f"<li class='caveat'>{e(cont)} Re-measure on a quiet machine, or add repeats "
                     "(<code>--repeats</code>, <code>--extend</code>).</li>")
    wide = [g for g in reg if g.get("within_noise") and g["regret"] > 0]
    if wide:
        steps.append("<li>More repeats would tell apart the k that measured within the noise at concurrency "
                     + ", ".join(str(g["concurrency"]) for g in wide) + ".</li>")
    if steps:
        parts.append("<p>What to do next:</p><ol>" + "".join(steps) + "</ol>")
    return '<div class="answer">' + "".join(parts) + "</div>"


def _groups_html(pred: pd.DataFrame) -> str:
    """Every (configuration, load, metric) judged: measured [95% CI], predicted, error, inside the CI."""
    from reports.page import judged_columns

    keep = judged_columns(pred[pred["metric"].isin([m for m, _ in PANELS])], "measured", "measured_lo",
                          "measured_hi", "{:.1f}")
    cols = ["config", "load", "split", "metric", "measured [95% CI]", "predicted", "ape_pct", "inside CI"]
    return table_html(keep[cols].rename(columns={"ape_pct": "error %"}), "{:.1f}")


def serving_pages(d: Path, sc: ServingCalibration) -> tuple[Page]:
    """The page of the serving calibration ``d`` (read: ``sc``): the answer, what was measured, the serving
    section and its chart's links, every group, the run's race (``--until-decided``), the calibration's notes."""
    cal, advice, pred = sc.cal, sc.advice, sc.predictions
    meta, units = _run_meta(cal)
    target = ((meta or {}).get("models") or {}).get("target", {}).get("name", "a model")
    title = f"specscope serving report: {target} on llama-server" if meta and not (meta.get("config") or {}).get(
        "url") else f"specscope serving report: {target}"
    races = race_sections({str(cal.get("run")): meta}) if meta else []  # a --until-decided run: its race
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in cal.get("notes") or [])
    sections = (Section((_answer_html(cal, advice, meta, units),
                         f"<h2 id='measured'>What was measured</h2>{_measured_html(meta, units, cal)}")),
                serving_section(sc, latency_vs_load_chart(pred, sc.curves)),
                Section((Links("serving"), "<h2 id='groups'>Every group, measured against predicted</h2>",
                         _groups_html(pred))),
                Section(tuple(p for r in races for p in (replace(r.figure, links=False), r.text))),
                Section((f"<details><summary>Calibration notes</summary><ul>{notes}</ul></details>" if notes else "",)))
    return (Page(title, sections, source=d),)


#: The serving run's report: :func:`serve_calibration_dir`, read whole, :func:`serving_pages`.
REPORT = KindReport((SERVE,), serve_calibration_dir, read_serving_calibration, serving_pages)


def build_serving_report(src: str | Path, out: str | Path | None = None, png: bool = True) -> ReportResult:
    """Write ``report.html`` (and the chart as interactive HTML, and PNG) for a serving calibration into ``out``
    (default: ``<calibration>/report``)."""
    return build(REPORT, src, out, png)


def main(argv: list[str] | None = None) -> int:
    from toolkit.cli import OneLineParser, nonempty_arg

    p = OneLineParser(prog="python -m reports.serving", description=__doc__.splitlines()[0])
    p.add_argument("cal_dir", type=nonempty_arg("calibration directory"))
    p.add_argument("--out", default=None, type=nonempty_arg("directory"),
                   help="output directory (default: CAL_DIR/report)")
    p.add_argument("--no-png", action="store_true", help="skip the PNG (faster)")
    args = p.parse_args(argv)
    try:
        res = build_serving_report(args.cal_dir, args.out, png=not args.no_png)
    except (ValueError, OSError) as e:
        print(f"python -m reports.serving: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(f"report written to {res.html_path.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
