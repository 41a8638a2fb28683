"""The HTML report page: charts and tables from a calibration directory (or a run directory).

:func:`build_report` reads files only — a calibration directory written by
``python -m calibrate`` (``calibration.json`` + CSVs) and the run
directories it names. Given a run directory instead, it reads the
calibration inside it (``<run>/calibration``, where ``python -m calibrate RUN``
writes by default); a run directory without one is refused in one line, since
fitting is calibrate's job. It writes ``report.html`` (charts inline as SVG, so the page
renders without network or JavaScript), one PNG per chart (vl-convert) and
one interactive HTML per chart.

The ``*_frame`` functions turn calibration/run tables into the data frames
the pure builders of :mod:`reports.charts` take.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path

import altair as alt
import pandas as pd
import vl_convert as vlc

from reports import charts
from reports.published import published_table

CAL_JSON = "calibration.json"


# -- frames -----------------------------------------------------------------------
def _short(row: pd.Series) -> str:
    k = row.get("head_k")
    k = "" if k is None or pd.isna(k) else f" K={int(k)}"
    return f"{row['draft']}/{row['domain']} {row['gamma_policy']}{k}"


def pred_vs_meas_frame(predictions: pd.DataFrame) -> pd.DataFrame:
    """Held-out rows when present (else in-sample): ``measured, predicted, method, label, held_out``."""
    p = predictions.dropna(subset=["predicted_speedup"])
    held = p[p["split"] == "held_out"]
    use = held if len(held) else p[p["split"] == "in_sample"]
    return pd.DataFrame({
        "measured": use["measured_speedup"].to_numpy(float),
        "predicted": use["predicted_speedup"].to_numpy(float),
        "method": use["method"].to_numpy(),
        "label": use.apply(_short, axis=1).to_numpy() if len(use) else [],
        "held_out": (use["split"] == "held_out").to_numpy(),
        **({"measured_lo": use["measured_speedup_lo"].to_numpy(float),
            "measured_hi": use["measured_speedup_hi"].to_numpy(float)}
           if {"measured_speedup_lo", "measured_speedup_hi"} <= set(use.columns) else {}),
    })


def speedup_gamma_frame(curves: pd.DataFrame, cells: pd.DataFrame) -> pd.DataFrame:
    """Predicted closed-form curve per series + measured fixed-γ cells, optimal γ marked."""
    pred = curves[curves["method"] == "closed_form"].dropna(subset=["predicted_speedup"])
    pred = pd.DataFrame({"series": pred["series"], "gamma": pred["gamma"].astype(int),
                         "speedup": pred["predicted_speedup"], "source": "predicted"})
    pred["optimal"] = False
    if len(pred):
        best = pred.groupby("series")["speedup"].idxmax()
        pred.loc[best, "optimal"] = True
    fixed = cells[cells["gamma_policy"].astype(str).str.startswith("fixed")]
    meas = pd.DataFrame({
        "series": fixed.apply(lambda r: f"{r['draft']}/{r['domain']}" + (
            "" if r["head_k"] is None or pd.isna(r["head_k"]) else f"/K={int(r['head_k'])}"), axis=1)
        if len(fixed) else [],
        "gamma": fixed["gamma"].astype(int), "speedup": fixed["speedup"].astype(float), "source": "measured",
        "optimal": False,
        **({"speedup_lo": pd.to_numeric(fixed["speedup_lo"], errors="coerce"),
            "speedup_hi": pd.to_numeric(fixed["speedup_hi"], errors="coerce")}
           if {"speedup_lo", "speedup_hi"} <= set(fixed.columns) else {}),
    })
    return pd.concat([pred, meas], ignore_index=True)


def acceptance_frame(per_position: pd.DataFrame, families: pd.DataFrame) -> pd.DataFrame:
    """α_i with CIs per group (pooled "(all cells)" groups dropped when per-group ones exist), plus the
    chosen model's α_i as ``fit``."""
    pp = per_position.copy()
    groups = [g for g in pp["group"].unique() if "(all cells)" not in g]
    if groups:
        pp = pp[pp["group"].isin(groups)]
    fits = {}
    for _, f in families[families["chosen"].astype(bool)].iterrows():
        params = json.loads(f["params"])
        fits[f["group"]] = (f["family"], params)
    out = pp.rename(columns={"group": "series"})
    fit_vals = []
    for _, r in out.iterrows():
        fam, params = fits.get(r["series"], (None, {}))
        i = int(r["position"])
        if fam == "iid":
            v = params["alpha"]
        elif fam == "geometric":
            v = params["a"] * params["r"] ** (i - 1)
        elif fam == "power_law":
            v = params["a"] * i ** (-params["b"])
        elif fam == "per_position":
            a = params["alphas"]
            v = a[min(i, len(a)) - 1]
        else:
            v = float("nan")
        fit_vals.append(min(max(v, 0.0), 1.0))
    out["fit"] = fit_vals
    return out[["series", "position", "n", "accepted", "alpha", "ci_low", "ci_high", "fit"]]


def breakdown_frame(predictions: pd.DataFrame) -> pd.DataFrame:
    """Mean ms per round by component, measured and predicted (closed form, in-sample)."""
    p = predictions[(predictions["split"] == "in_sample") & (predictions["method"] == "closed_form")]
    rows = []
    for _, r in p.iterrows():
        for comp in ("draft", "verify", "overhead"):
            for src in ("measured", "predicted"):
                col = f"{src}_{comp}_ms"
                if col in r and pd.notna(r[col]):
                    rows.append({"config": _short(r), "component": comp, "source": src, "ms": float(r[col])})
    return pd.DataFrame(rows, columns=["config", "component", "source", "ms"])


# -- claims table ---------------------------------------------------------------------
_VERDICT_COLOURS = {"consistent": "#1a7f37", "needs_alpha": "#9a6700", "not_reachable": "#cf222e"}
_VERDICT_LABELS = {"consistent": "consistent", "needs_alpha": "needs α", "not_reachable": "not reachable"}


def _num(v: object, fmt: str) -> str:
    return "—" if v is None or (isinstance(v, float) and pd.isna(v)) else fmt.format(v)


def claims_html(table: pd.DataFrame) -> str:
    """The claims table (built by :func:`reports.published.published_table`, i.e. ``sim.claims``) as HTML."""
    e = html.escape
    rows = []
    for _, r in table.iterrows():
        kind = r["verdict_kind"]
        status = ("" if r["status"] == "verified" else
                  ' <span class="unverified">not verified here</span>')
        extra = "".join(f'<div class="small">{e(label)}: {e(str(r[col]))}</div>'
                        for label, col in (("would have to be true", "would_have_to_be_true"),
                                           ("ms/token vs roofline", "roofline")) if r[col])
        rows.append(
            f'<tr id="claim-{e(r["claim"])}"><td><b>{e(r["quote"])}</b>{status}'
            f'<div class="small">{e(r["source"])}</div>'
            f'<div class="small">{e(r["verification"])}</div></td>'
            f'<td>{e(r["mapped_to"])}<div class="small">{e(r["assumptions"])}</div></td>'
            f'<td class="n">{r["claimed_speedup"]:.2f}×</td><td class="n">{int(r["gamma"])}</td>'
            f'<td class="n">{r["cost_ratio"]:.3f}</td><td class="n">{r["bound_at_alpha1"]:.2f}×'
            f'<div class="small">{e(r["speedup_by_alpha"]).replace(", ", "<br>")}</div></td>'
            f'<td class="n">{_num(r["alpha_stated"], "{:.3f}")}</td>'
            f'<td class="n">{_num(r["alpha_needed"], "{:.3f}")}</td>'
            f'<td><span class="verdict" style="background:{_VERDICT_COLOURS[kind]}">{_VERDICT_LABELS[kind]}</span> '
            f'{e(r["verdict"])}{extra}</td></tr>')
    counts = table["verdict_kind"].value_counts()
    summary = ", ".join(f"{counts.get(k, 0)} {_VERDICT_LABELS[k]}" for k in _VERDICT_COLOURS)
    return (
        "<p>Each claim mapped to a cost model (a preset pair on a preset device's roofline, or the c its source "
        "states), then the simulator's own closed form at the claim's γ: the bound at α = 1, the α the claim "
        "needs, and a verdict. <i>consistent</i>: reachable at the α the source states, or (none stated) at the "
        "low end of the range typical for such drafts; <i>needs α</i>: only at a higher acceptance; <i>not "
        "reachable</i>: above the bound at any α. γ not stated: the most favourable γ. The same table: "
        f"<code>python -m sim check --claims</code>. {len(table)} claims: {e(summary)}.</p>"
        '<table class="tbl claims"><thead><tr><th>claim and source</th><th>mapped to (assumptions)</th>'
        "<th>claimed</th><th>γ</th><th>c</th><th>bound α=1 (speedup by α)</th><th>α stated</th><th>α needed</th>"
        f"<th>verdict</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


# -- page ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ReportResult:
    """Where the report went."""

    html_path: Path
    png_paths: tuple[Path, ...]
    charts: tuple[str, ...]
    calibration_dir: Path


def _load_calibration(src: Path) -> Path:
    if (src / CAL_JSON).exists():
        return src
    if (src / "run.json").exists():
        if (src / "calibration" / CAL_JSON).exists():
            return src / "calibration"
        # reports reads files only; fitting is calibrate's job (one-way layering, issue #17)
        raise ValueError(f"{str(src)!r} is a run directory without a calibration; run python -m calibrate "
                         f"{src} first, then python -m reports {src / 'calibration'}")
    if not src.exists():
        raise ValueError(f"directory not found: {str(src)!r}")
    raise ValueError(f"{str(src)!r} is neither a calibration directory ({CAL_JSON}) nor a run directory (run.json)")


def _table_html(df: pd.DataFrame, floatfmt: str = "{:.3g}") -> str:
    return df.to_html(index=False, border=0, classes="tbl", na_rep="—",
                      float_format=lambda v: floatfmt.format(v))


def _read_csv_or_empty(path: Path) -> pd.DataFrame:
    """A calibration table, or an empty frame when it is absent or has no columns (nothing was fitted)."""
    try:
        return pd.read_csv(path)
    except (FileNotFoundError, pd.errors.EmptyDataError):
        return pd.DataFrame()


def build_report(src: str | Path, out: str | Path | None = None, png: bool = True) -> ReportResult:
    """Write ``report.html`` (+ PNGs) for a calibration directory (or a run directory holding one) into ``out``.

    Incomplete runs are refused by ``python -m calibrate`` (unless ``--allow-incomplete`` there), which
    wrote the calibration this page reads.
    """
    src = Path(src)
    out = Path(out) if out else (src / "report")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot create output directory {str(out)!r}: {exc.strerror or exc}") from None
    cal_dir = _load_calibration(src)
    doc = json.loads((cal_dir / CAL_JSON).read_text())
    pred = pd.read_csv(cal_dir / "predictions.csv")
    curves = _read_csv_or_empty(cal_dir / "speedup_curves.csv")

    from measure.records import load_run

    runs = {label: load_run(info["path"]) for label, info in doc["runs"].items()}
    cells = pd.concat([r.table("cells").assign(run=l) for l, r in runs.items()], ignore_index=True)
    latency = pd.concat([r.table("token_latency") for r in runs.values()], ignore_index=True)
    sweep = pd.concat([r.table("head_sweep") for r in runs.values()], ignore_index=True)

    built: list[tuple[str, str, alt.TopLevelMixin]] = []
    pvm = pred_vs_meas_frame(pred)
    if len(pvm):  # a run with nothing to predict (e.g. a head sweep: one γ, one draft per cell) has no rows
        built.append(("predicted_vs_measured", "Predicted against measured speedup",
                      charts.predicted_vs_measured_chart(pvm)))
    if len(curves):
        built.append(("speedup_vs_gamma", "Speedup against γ (line: predicted; diamonds: measured; ring: best γ)",
                      charts.speedup_vs_gamma_chart(speedup_gamma_frame(curves, cells))))
    pp_path, fam_path = cal_dir / "acceptance_per_position.csv", cal_dir / "acceptance_families.csv"
    if pp_path.exists() and fam_path.exists():
        built.append(("acceptance_per_position", "Per-position acceptance α_i, 95% Wilson intervals, dashed: chosen model",
                      charts.acceptance_per_position_chart(acceptance_frame(pd.read_csv(pp_path), pd.read_csv(fam_path)))))
    bd = breakdown_frame(pred)
    if len(bd):
        built.append(("round_breakdown", "Round time: draft, verify, overhead (solid: measured, faded: predicted)",
                      charts.round_breakdown_chart(bd)))
    if len(latency):
        built.append(("latency_cdf", "Per-token latency CDF", charts.latency_cdf_chart(charts.latency_cdf(latency))))
    if len(sweep):
        built.append(("pareto", "Pruned draft head: Pareto frontier", charts.pareto_chart(sweep)))

    sections, pngs = [], []
    for name, title, ch in built:
        svg = vlc.vegalite_to_svg(ch.to_json())
        charts.save_chart(ch, out / f"{name}.html")
        if png:
            pngs.append(charts.save_chart(ch, out / f"{name}.png"))
        sections.append(f'<section class="chart" id="{name}"><h2>{html.escape(title)}</h2>{svg}'
                        f'<p><a href="{name}.html">interactive</a>'
                        + (f' · <a href="{name}.png">PNG</a>' if png else "") + "</p></section>")

    mape_rows = []
    for split, table in doc["mape"].items():
        for method, v in table.items():
            share = v.get("share_inside_ci")
            mape_rows.append({"split": split, "method": method, "speedup MAPE %": v["speedup_mape_pct"],
                              "tokens/s MAPE %": v["tokens_per_s_mape_pct"], "cells": v["n_cells"],
                              "inside measured 95% CI": (f"{v['n_inside_ci']}/{v['n_with_ci']} ({100 * share:.0f}%)"
                                                         if share is not None else "n/a")})
    per_cfg = pred[pred["split"] == ("held_out" if (pred["split"] == "held_out").any() else "in_sample")]
    ci_cols = [c for c in ("measured_speedup_lo", "measured_speedup_hi", "inside_ci", "unstable") if c in per_cfg]
    per_cfg = per_cfg[["cell_id", "method", "measured_speedup", *ci_cols[:2], "predicted_speedup", *ci_cols[2:],
                       "ape_speedup_pct", "measured_tokens_per_s", "predicted_tokens_per_s", "ape_tokens_per_s_pct"]]
    cost_params = _read_csv_or_empty(cal_dir / "cost_params.csv")
    claims = claims_html(published_table())
    hw = "; ".join(f"{l}: {html.escape(str((i.get('hardware') or {}).get('device_name') or (i.get('hardware') or {}).get('device')))}"
                   for l, i in doc["runs"].items())
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>specscope report</title>
<style>
body{{font-family:system-ui,sans-serif;margin:24px;max-width:1400px;color:#222}}
.grid{{display:flex;flex-wrap:wrap;gap:18px}} .chart{{border:1px solid #ddd;border-radius:6px;padding:8px}}
.chart h2{{font-size:15px;margin:4px 0 8px}} table.tbl{{border-collapse:collapse;font-size:13px;margin:8px 0 18px}}
table.tbl td,table.tbl th{{padding:3px 8px;border-bottom:1px solid #eee;text-align:left;max-width:340px;vertical-align:top}}
table.claims td{{max-width:420px}} table.claims td:last-child{{min-width:400px}} table.claims td.n{{text-align:right;white-space:nowrap}}
.small{{font-size:11px;color:#555;margin-top:2px}} .unverified{{font-size:11px;color:#cf222e;font-weight:600}}
.verdict{{color:#fff;border-radius:3px;padding:1px 5px;font-size:11px;font-weight:600;white-space:nowrap}}
</style></head><body>
<h1>specscope: prediction against measurement</h1>
<p>Runs: {html.escape(', '.join(doc['runs']))} ({hw}). Hold-out: <b>{html.escape(doc['holdout']['mode'])}</b> —
{html.escape(doc['holdout']['explanation'])}. Calibration: <code>{html.escape(str(cal_dir.resolve()))}</code>.</p>
<h2>Error (MAPE)</h2>{_table_html(pd.DataFrame(mape_rows))}
<div class="grid">{''.join(sections)}</div>
<h2 id="claims">Published results and claims, checked against the simulator</h2>
{claims}
<h2>Per-configuration error</h2>{_table_html(per_cfg)}
<h2>Fitted cost parameters (± standard error)</h2>{_table_html(cost_params)}
</body></html>
"""
    html_path = out / "report.html"
    html_path.write_text(page, encoding="utf-8")
    return ReportResult(html_path, tuple(pngs), tuple(n for n, _, _ in built), cal_dir)
