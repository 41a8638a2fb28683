"""The serving section: latency and throughput against load, measured with 95% CIs beside predicted.

Reads what ``python -m calibrate serve`` wrote (``serve_predictions.csv``,
``serve_curves.csv``, ``serve_calibration.json``, ``advice.json``); fits nothing.

* :func:`latency_vs_load_chart` — per configuration, e2e latency (p50 and p95) and
  throughput against load: closed-loop concurrency in one column, open-loop
  arrival rate in the other; measured points with their CI bars (held-out points
  hollow), predicted curves as lines.
* :func:`section_html` — that chart, the held-out error against its targets and the
  advice table, as one HTML fragment a report page can include.

``python -m reports.serving CAL_DIR --out serving.html`` writes the section as a page.
"""

from __future__ import annotations

import html
import json
import sys
from pathlib import Path

import altair as alt
import pandas as pd

PREDICTIONS = "serve_predictions.csv"
CURVES = "serve_curves.csv"
CALIBRATION = "serve_calibration.json"
ADVICE = "advice.json"
PANELS = (("e2e_p50_ms", "e2e latency p50 (ms)"), ("e2e_p95_ms", "e2e latency p95 (ms)"),
          ("throughput_tokens_per_s", "throughput (tokens/s)"))


def _load_axis(frame: pd.DataFrame) -> pd.DataFrame:
    """``kind`` (closed loop / open loop) and ``x`` (concurrency or requests/s) from the ``load`` column."""
    out = frame.copy()
    out["kind"] = ["concurrency (closed loop)" if str(v).startswith("c") else "arrival rate, req/s (open loop)"
                   for v in out["load"]]
    out["x"] = [float(str(v)[1:]) for v in out["load"]]
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
    meas = _load_axis(predictions[predictions["metric"].isin([m for m, _ in PANELS])])
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


def section_html(cal_dir: str | Path, chart_file: str = "serving.html") -> str:
    """The serving section of a report (an HTML fragment): error summary, the chart (embedded), the advice."""
    d = Path(cal_dir)
    for name in (PREDICTIONS, CURVES, CALIBRATION):
        if not (d / name).is_file():
            raise ValueError(f"{str(d)!r} holds no {name}: write it with python -m calibrate serve RUN --out {d}")
    chart = latency_vs_load_chart(pd.read_csv(d / PREDICTIONS), pd.read_csv(d / CURVES))
    cal = json.loads((d / CALIBRATION).read_text())
    advice = json.loads((d / ADVICE).read_text()) if (d / ADVICE).is_file() else {}
    spec = chart.to_json()
    return ("<section id='serving'><h2>Serving: latency and throughput against load</h2>"
            f"<p>Measured (points, 95% CI bars; held-out points marked) against the calibrated serving simulator "
            f"(lines). Held out: k {html.escape(str(cal['split']['test_k']))}, loads "
            f"{html.escape(str(cal['split']['test_loads']))}.</p>{_error_html(cal.get('summary', {}))}"
            "<div id='serving-chart'></div>"
            "<script src='https://cdn.jsdelivr.net/npm/vega@5'></script>"
            "<script src='https://cdn.jsdelivr.net/npm/vega-lite@5'></script>"
            "<script src='https://cdn.jsdelivr.net/npm/vega-embed@6'></script>"
            f"<script>vegaEmbed('#serving-chart', {spec});</script>{_advice_html(advice)}</section>")


def main(argv: list[str] | None = None) -> int:
    from sim.cliargs import OneLineParser, nonempty_arg

    p = OneLineParser(prog="python -m reports.serving", description=__doc__.splitlines()[0])
    p.add_argument("cal_dir", type=nonempty_arg("calibration directory"))
    p.add_argument("--out", required=True, type=nonempty_arg("file name"), help="HTML file to write")
    args = p.parse_args(argv)
    try:
        body = section_html(args.cal_dir)
        Path(args.out).write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>serving</title></head>"
                                  f"<body>{body}</body></html>\n")
    except (ValueError, OSError) as e:
        print(f"python -m reports.serving: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
