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
from typing import Mapping

import altair as alt
import pandas as pd

from reports import charts
from reports.published import published_table
from reports.summary import (
    METHOD_NAMES,
    CellResult,
    Headline,
    MeasuredSetup,
    cell_label,
    cell_results,
    headline,
    measured_setups,
    predicted_optima,
)
from measure.records import RUN_JSON
from measure.runkinds import RunKind, read_kind
from toolkit.files import resolve_from
from toolkit.jsonio import read_json
from toolkit.tables import Column, check_values, read_csv

CAL_JSON = "calibration.json"
#: The columns of ``predictions.csv`` the page reads (calibrate/outputs.py writes them).
PREDICTION_COLUMNS = ("run", "cell_id", "draft", "domain", "gamma_policy", "method", "measured_speedup",
                      "predicted_speedup", "split")
#: A speedup the page draws is a finite number above 0 (a prediction may be missing: its cell says why).
SPEEDUP = Column("measured_speedup", lo=0.0, lo_open=True)
PREDICTION_VALUES = (SPEEDUP, Column("predicted_speedup", lo=0.0, lo_open=True, required=False),
                     Column("measured_speedup_lo", required=False), Column("measured_speedup_hi", required=False))
CURVE_VALUES = (Column("gamma", lo=1, integer=True), Column("predicted_speedup", lo=0.0, lo_open=True,
                                                            required=False))
_AGAIN = "re-run python -m calibrate to write it again"


# -- frames -----------------------------------------------------------------------
def _short(row: pd.Series) -> str:
    return cell_label(row["draft"], row["domain"], row["gamma_policy"], row.get("head_k"), row.get("temperature"))


def pred_vs_meas_frame(predictions: pd.DataFrame) -> pd.DataFrame:
    """Held-out rows when present (else in-sample): ``measured, predicted, method, label, held_out``."""
    p = predictions.dropna(subset=["predicted_speedup"])
    held = p[p["split"] == "held_out"]
    use = held if len(held) else p[p["split"] == "in_sample"]
    return pd.DataFrame({
        "measured": use["measured_speedup"].to_numpy(float),
        "predicted": use["predicted_speedup"].to_numpy(float),
        "method": use["method"].map(lambda m: METHOD_NAMES.get(m, m)).to_numpy(),
        "label": use.apply(_short, axis=1).to_numpy() if len(use) else [],
        "held_out": (use["split"] == "held_out").to_numpy(),
        **({"measured_lo": use["measured_speedup_lo"].to_numpy(float),
            "measured_hi": use["measured_speedup_hi"].to_numpy(float)}
           if {"measured_speedup_lo", "measured_speedup_hi"} <= set(use.columns) else {}),
    })


def speedup_gamma_frame(curves: pd.DataFrame, cells: pd.DataFrame) -> pd.DataFrame:
    """Predicted closed-form curve per series + measured fixed-γ cells; ``optimal`` marks, per series, the best
    measured γ (on its measured row; stable cells when there are any) and the predicted best γ (on its predicted
    row), which the chart draws differently."""
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
        "unstable": fixed["unstable"].map(lambda v: v is True or str(v).lower() == "true")
        if "unstable" in fixed else False,
        **({"speedup_lo": pd.to_numeric(fixed["speedup_lo"], errors="coerce"),
            "speedup_hi": pd.to_numeric(fixed["speedup_hi"], errors="coerce")}
           if {"speedup_lo", "speedup_hi"} <= set(fixed.columns) else {}),
    })
    for _, sub in meas.groupby("series"):
        pool = sub[~sub["unstable"]] if (~sub["unstable"]).any() else sub
        meas.loc[pool["speedup"].idxmax(), "optimal"] = True
    out = pd.concat([pred, meas], ignore_index=True)
    out["unstable"] = out["unstable"].fillna(False).astype(bool)
    out["series"] = out["series"].str.replace("/", " · ", regex=False)
    return out


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
    short = group_labels(list(out["series"].unique()))
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
    out["series"] = out["series"].map(short)
    return out[["series", "position", "n", "accepted", "alpha", "ci_low", "ci_high", "fit"]]


def group_labels(groups: list[str]) -> dict[str, str]:
    """Acceptance-group ids (``draft=ngram:3|temp=0|domain=code``) to legend labels that keep what tells them
    apart: ``ngram:3 · code``. A part equal in every group is dropped, except the draft and the domain."""
    parsed = {g: dict(p.split("=", 1) for p in g.split("|") if "=" in p) for g in groups}
    keys = [k for k in dict.fromkeys(k for d in parsed.values() for k in d)]
    varying = {k for k in keys if len({d.get(k) for d in parsed.values()}) > 1}
    keep = [k for k in keys if k in ("draft", "domain") or k in varying]
    out = {}
    for g, d in parsed.items():
        parts = [d[k] if k in ("draft", "domain") else f"{k} {d[k]}" for k in keep if k in d]
        out[g] = " · ".join(parts) or g
    return out


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
    """Where the report went (``claims_path``: the page of published claims, linked from the report)."""

    html_path: Path
    png_paths: tuple[Path, ...]
    charts: tuple[str, ...]
    calibration_dir: Path
    claims_path: Path | None = None


def _load_calibration(src: Path) -> Path:
    if (src / CAL_JSON).exists():
        return src
    if (src / "run.json").exists():
        if (src / "calibration" / CAL_JSON).exists():
            return src / "calibration"
        # reports reads files only; fitting is calibrate's job (one-way layering)
        raise ValueError(f"{str(src)!r} is a run directory without a calibration; run python -m calibrate "
                         f"{src} first, then python -m reports {src / 'calibration'}")
    if not src.exists():
        raise ValueError(f"directory not found: {str(src)!r}")
    raise ValueError(f"{str(src)!r} is neither a calibration directory ({CAL_JSON}) nor a run directory (run.json)")


def run_calibration_dir(src: str | Path, kind: RunKind) -> Path | None:
    """``src`` if it holds a calibration of a run of ``kind`` (its ``calibration_file``), its ``calibration_dir/``
    if it is a run of that kind holding one, else None (not such a directory); such a run without its
    calibration is a one-line ``ValueError`` naming the command that calibrates it."""
    src = Path(src)
    if (src / kind.calibration_file).is_file():
        return src
    try:
        found = read_kind(src)
    except ValueError:  # a kind this specscope does not know: not this one
        return None
    if found is not kind:
        return None
    if (src / kind.calibration_dir / kind.calibration_file).is_file():
        return src / kind.calibration_dir
    raise ValueError(f"{str(src)!r} is a {kind.title} without a calibration; run {kind.calibrate_command} {src} "
                     f"first, then python -m reports {src / kind.calibration_dir}")


def make_out_dir(out: Path) -> Path:
    """Create the report's output directory ``out``; one-line ``ValueError`` when it cannot be made."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot create output directory {str(out)!r}: {exc.strerror or exc}") from None
    return out


def table_html(df: pd.DataFrame, floatfmt: str = "{:.3g}") -> str:
    """``df`` as the page's HTML table (no index; floats as ``floatfmt``; missing values as a dash)."""
    return df.to_html(index=False, border=0, classes="tbl", na_rep="—",
                      float_format=lambda v: floatfmt.format(v))


def judged_columns(df: pd.DataFrame, value: str, lo: str, hi: str, fmt: str) -> pd.DataFrame:
    """``df`` with the columns a judged-prediction table shows: ``measured [95% CI]`` (``value [lo, hi]`` as
    ``fmt``, the value alone where the CI is missing) and ``inside CI`` (yes / no / a dash) from ``inside_ci``."""
    out = df.copy()
    out["measured [95% CI]"] = [f"{fmt.format(m)} [{fmt.format(a)}, {fmt.format(b)}]" if pd.notna(a)
                                else fmt.format(m) for m, a, b in zip(out[value], out[lo], out[hi])]
    out["inside CI"] = out["inside_ci"].map({True: "yes", False: "no"}).fillna("—")
    return out


def read_table(path: Path, required: tuple[str, ...] | None = None, values: tuple[Column, ...] = (),
               again: str = _AGAIN) -> pd.DataFrame:
    """A calibration table, or an empty frame when it has no columns (nothing was fitted) or, unless
    ``required`` names its columns, is absent. A table that cannot be parsed, has a torn row (pandas alone fills
    it with NaN), lacks a required column or holds a value ``values`` refuse (an ``inf`` speedup) is one
    ``ValueError`` line naming the file, ending with ``again`` (a damaged calibration was a pandas traceback, or
    drawn)."""
    if not path.is_file():
        if required is None:
            return pd.DataFrame()
        raise ValueError(f"calibration directory {str(path.parent)!r} has no {path.name}; {again}")
    try:
        df = read_csv(path)
    except ValueError as exc:
        raise ValueError(f"{exc}; {again}") from None
    if not len(df.columns):
        return df
    missing = [c for c in required or () if c not in df.columns]
    if missing:
        raise ValueError(f"{str(path)!r} has no column {', '.join(missing)}; {again}")
    try:
        check_values(df, repr(str(path)), values)
    except ValueError as exc:
        raise ValueError(f"{exc}; {again}") from None
    return df


def read_doc(path: Path, what: str, keys: dict[str, type | tuple[type, ...]], again: str = _AGAIN) -> dict:
    """The JSON object of ``path`` (``what``: e.g. ``advice file``), with each of ``keys`` present and of its
    type; else one ``ValueError`` line naming the file and the key, ending with ``again``."""
    if not path.is_file():
        raise ValueError(f"calibration directory {str(path.parent)!r} has no {path.name}; {again}")
    doc = read_json(path, what)
    name = f"{what} {str(path)!r}"
    if not isinstance(doc, dict):
        raise ValueError(f"{name} holds a JSON {type(doc).__name__}, not an object; {again}")
    for key, typ in keys.items():
        if not isinstance(doc.get(key), typ):
            kind = " or ".join(t.__name__ for t in (typ if isinstance(typ, tuple) else (typ,)))
            found = "no" if key not in doc else f"a {type(doc[key]).__name__} as"
            raise ValueError(f"{name} has {found} {key!r} ({kind} expected); {again}")
    return doc


def read_calibration(cal_dir: Path) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """``calibration.json``, ``predictions.csv`` and ``speedup_curves.csv`` of ``cal_dir``, checked: what
    ``python -m calibrate`` did not write whole (cut short, edited, its runs moved) is one ``ValueError`` line
    naming the file, never a traceback half-way through the page."""
    doc = read_json(cal_dir / CAL_JSON, "calibration file")
    name = f"calibration file {str(cal_dir / CAL_JSON)!r}"
    if not isinstance(doc, dict):
        raise ValueError(f"{name} holds a JSON {type(doc).__name__}, not an object; {_AGAIN}")
    runs = doc.get("runs")
    if not (isinstance(runs, dict) and runs and all(isinstance(i, dict) and isinstance(i.get("path"), str)
                                                     for i in runs.values())):
        raise ValueError(f"{name} names no runs (an object of run labels, each with its path); {_AGAIN}")
    for key in ("mape", "holdout"):
        if not isinstance(doc.get(key), dict):
            raise ValueError(f"{name} has no {key!r} object; {_AGAIN}")
    for label, info in runs.items():
        info["path"] = str(resolve_from(cal_dir, info["path"], RUN_JSON))  # from cal_dir (older: absolute)
        if not (Path(info["path"]) / "run.json").is_file():
            raise ValueError(f"{name} names run {label!r} at {info['path']!r}, which holds no run.json (moved or "
                             "deleted?)")
    files = doc.get("files") or {}
    for kind, named in (files.items() if isinstance(files, dict) else ()):
        for f in (named.values() if isinstance(named, dict) else ()):
            if isinstance(f, str) and not (cal_dir / f).is_file():  # the page's next step names them
                raise ValueError(f"{name} names {kind.replace('_', ' ').removesuffix('s')} file {f!r}, which is not in "
                                 f"{str(cal_dir)!r} (deleted?); {_AGAIN}")
    pred = read_table(cal_dir / "predictions.csv", required=PREDICTION_COLUMNS, values=PREDICTION_VALUES)
    return doc, pred, read_table(cal_dir / "speedup_curves.csv", values=CURVE_VALUES)


_CSS = """
body{font-family:system-ui,sans-serif;margin:20px 24px;max-width:1352px;color:#222;line-height:1.4}
h1{font-size:24px;margin:0 0 10px} h2{font-size:19px;margin:22px 0 8px}
.answer{border:2px solid #1a7f37;border-radius:8px;padding:10px 16px;background:#f6fbf7;margin:10px 0 16px}
.answer p{margin:6px 0} .answer .big{font-size:19px;font-weight:600} .answer ol{margin:6px 0 4px 20px;padding:0}
.answer li{margin:3px 0} .caveat{color:#9a6700} code{font-size:12px;overflow-wrap:anywhere}
.grid{display:flex;flex-wrap:wrap;gap:16px} .chart{border:1px solid #ddd;border-radius:6px;padding:8px;
  max-width:100%;overflow-x:auto} .chart h2{font-size:15px;margin:4px 0 8px}
table.tbl{border-collapse:collapse;font-size:13px;margin:8px 0 16px;max-width:100%}
table.tbl td,table.tbl th{padding:3px 8px;border-bottom:1px solid #eee;text-align:left;vertical-align:top;
  overflow-wrap:anywhere} table.tbl th{overflow-wrap:normal} table.tbl td.n{text-align:right;white-space:nowrap}
table.setup th{width:120px;color:#555;font-weight:600}
table.claims td{max-width:420px} table.claims td:last-child{min-width:360px}
table.claims td.n{text-align:right;white-space:nowrap}
.small{font-size:11px;color:#555;margin-top:2px} .unverified{font-size:11px;color:#cf222e;font-weight:600}
.verdict{color:#fff;border-radius:3px;padding:1px 5px;font-size:11px;font-weight:600;white-space:nowrap}
td.label{white-space:nowrap} .key{font-size:12px;color:#555;margin:-4px 0 6px;max-width:560px}
.flag{color:#9a6700;font-weight:600} .ok{color:#1a7f37} .bad{color:#cf222e} details{margin:10px 0}
"""


_CHART_KEYS = {
    "race": "Each point: a candidate's mean ratio to its group's leader after a pass (the leader at 1); bars: the "
            "interval the race judged it by (Bonferroni over looks and pairs); shape: leader, live, resolved or "
            "eliminated at that look; dashed: 1 + regret (an interval ending below it is resolved).",
    "speedup_vs_gamma": "Filled diamonds: measured, with the 95% CI (crosses: flagged unstable); ring: best measured "
                        "γ. Lines: the calibrated prediction, solid over the measured γ, dashed beyond them (an "
                        "extrapolation); open triangle: the predicted best γ.",
}


def page_html(title: str, body: str) -> str:
    """A whole page: ``body`` under the report's style sheet."""
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{_CSS}</style></head><body>\n{body}\n</body></html>\n")


def _setups_html(setups: list[MeasuredSetup]) -> str:
    e = html.escape
    blocks = []
    for st in setups:
        rows = [("target", st.target), ("draft" + ("s" if len(st.drafts) > 1 else ""), "; ".join(st.drafts)),
                ("engine", st.engine), ("hardware", st.hardware), ("measured", st.workload),
                ("run", f"{st.label} ({st.status})")]
        body = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in rows)
        if st.command:
            body += f"<tr><th>command</th><td><code>{e(st.command)}</code></td></tr>"
        blocks.append(f'<table class="tbl setup">{body}</table>')
    return "".join(blocks)


def _answer_html(h: Headline) -> str:
    e = html.escape
    left = ""
    if h.left_out:
        left = (f"<p>Left out of the error ({len(h.left_out)}): " + "; ".join(e(x) for x in h.left_out) + ".</p>")
    steps = "".join(f"<li>{e(x.text)}" + (f" <code>{e(x.command)}</code>" if x.command else "") + "</li>"
                    for x in h.next_steps)
    caveat = f'<p class="caveat">{e(h.caveat)}</p>' if h.caveat else ""
    return (f'<section class="answer" id="answer"><p class="big">{e(h.answer)}</p>{caveat}<p>{e(h.error)}</p>{left}'
            f"<p><b>What to do next</b></p><ol>{steps}</ol></section>")


def _cells_html(results: list[CellResult]) -> str:
    """One row per cell: measured speedup with its CI, status, each method's prediction and error."""
    e = html.escape
    methods = [m for m in METHOD_NAMES if any(m in r.predictions for r in results)]
    split = next((r.split for r in results if r.split), "")
    head = "".join(f"<th>{e(METHOD_NAMES[m])}</th>" for m in methods)
    rows = []
    for r in results:
        status = (f'<span class="flag">{e(r.left_out)}</span>' if r.left_out else
                  '<span class="ok">in the error</span>')
        cells = []
        for m in methods:
            p = r.predictions.get(m)
            if p is None or p.speedup is None:
                cells.append('<td class="n">—</td>')
                continue
            mark = {True: ' <span class="ok">in CI</span>', False: ' <span class="bad">outside CI</span>'}.get(
                p.inside_ci, "")
            err = f" ({p.error_pct:.1f}%)" if p.error_pct is not None else ""
            cells.append(f'<td class="n">{p.speedup:.2f}×{err}{mark}</td>')
        rows.append(f"<tr><td class=\"label\">{e(r.label)}</td><td class=\"n\">{e(r.ci_text())}</td>"
                    f"<td class=\"label\">{e(r.against_one_short())}</td>"
                    f"<td>{status}</td>{''.join(cells)}</tr>")
    what = {"held_out": "held-out predictions (each cell predicted from models fitted without its fold)",
            "in_sample": "in-sample predictions (nothing was held out)"}.get(split, "no predictions")
    return (f"<p>Every measured cell ({len(results)}), with {what}; error = |predicted − measured| / measured.</p>"
            f'<table class="tbl cells"><thead><tr><th>configuration</th><th>measured speedup [95% CI]</th>'
            f"<th>against 1×</th><th>status</th>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")


def _mape_html(doc: dict, n_total: int) -> str:
    e = html.escape
    rows = []
    for split, table in doc["mape"].items():
        for method, v in table.items():
            share = v.get("share_inside_ci")
            rows.append(f"<tr><td>{e(split.replace('_', '-'))}</td><td>{e(METHOD_NAMES.get(method, method))}</td>"
                        f"<td class=\"n\">{_num(v['speedup_mape_pct'], '{:.2f}')}</td>"
                        f"<td class=\"n\">{_num(v['tokens_per_s_mape_pct'], '{:.2f}')}</td>"
                        f"<td class=\"n\">{v['n_cells']} of {n_total}</td><td class=\"n\">"
                        + (f"{v['n_inside_ci']}/{v['n_with_ci']} ({100 * share:.0f}%)" if share is not None else "n/a")
                        + "</td></tr>")
    unstable = doc.get("unstable_held_out") or {}
    apart = ""
    if unstable:
        apart = ("<p>The unstable cells, reported apart (not in the MAPE): speedup error "
                 + ", ".join(f"{v['speedup_mape_pct']:.1f}% ({e(METHOD_NAMES.get(m, m))})" for m, v in unstable.items()
                             if v.get("speedup_mape_pct") is not None) + ".</p>")
    return ('<table class="tbl"><thead><tr><th>split</th><th>method</th><th>speedup MAPE %</th>'
            "<th>tokens/s MAPE %</th><th>cells counted</th><th>inside measured 95% CI</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>{apart}")


def claims_page(table: pd.DataFrame) -> str:
    """The published-claims page: the table of :func:`claims_html` with its own heading (not about any run)."""
    return page_html("Published speculative-decoding claims, checked against the simulator",
                 "<h1>Published speculative-decoding claims, checked against the simulator</h1>"
                 + claims_html(table))


def _title(setups: list[MeasuredSetup]) -> str:
    targets = sorted({st.target.split(" (")[0] for st in setups})
    drafts = sorted({d.split(" (")[0] for st in setups for d in st.drafts})
    hw = sorted({st.hardware for st in setups})
    return f"{', '.join(targets)} with {', '.join(drafts)} on {'; '.join(hw)}"


def race_sections(metas: Mapping[str, Mapping]) -> list[tuple[str, str, alt.TopLevelMixin, str]]:
    """Per run whose ``run.json`` has a ``race`` (``--until-decided``, chain or serving sweep): the chart of its
    eliminations over time (name, title, chart) and the section's HTML (:mod:`reports.race`)."""
    from reports.race import race_chart, race_frame, race_html

    out = []
    for i, (label, meta) in enumerate(metas.items()):
        race = meta.get("race")
        if not isinstance(race, dict):
            continue
        frame = race_frame(race)
        if frame.empty:
            continue
        name = "race" if i == 0 else f"race_{i}"
        text = (f'<h2 id="{name}-text">The race of {html.escape(label)}: eliminations over time</h2>'
                + race_html(race, frame, table_html))
        out.append((name, f"The race of {label}: each candidate's ratio to its leader at each look",
                    race_chart(frame, (race.get("rule") or {}).get("regret")), text))
    return out


# long: one page, assembled top to bottom in the order the reader needs it
def build_report(src: str | Path, out: str | Path | None = None, png: bool = True) -> ReportResult:
    """Write ``report.html`` (+ PNGs, + ``claims.html``) for a calibration directory (or a run directory holding
    one) into ``out``.

    The page opens with the answer: the models, engine and machine measured;
    the best measured speedup with its 95% CI; the held-out prediction error
    and every cell left out of it, with the reason; what to do next. Then
    every cell, the charts (predictions beyond the measured γ drawn dashed,
    the best measured γ ringed apart from the predicted best), the error
    table and the fitted costs. The published claims, which are about no run,
    are on their own page. Incomplete runs are refused by ``python -m
    calibrate`` (unless ``--allow-incomplete`` there), which wrote the
    calibration this page reads.
    """
    src = Path(src)
    out = Path(out) if out else (src / "report")
    cal_dir = _load_calibration(src)
    doc, pred, curves = read_calibration(cal_dir)  # checked whole before anything is drawn
    make_out_dir(out)

    from measure.records import load_run

    runs = {label: load_run(info["path"]) for label, info in doc["runs"].items()}
    cells = pd.concat([r.table("cells").assign(run=label) for label, r in runs.items()], ignore_index=True)
    latency = pd.concat([r.table("token_latency") for r in runs.values()], ignore_index=True)
    sweep = pd.concat([r.table("head_sweep") for r in runs.values()], ignore_index=True)

    setups = measured_setups(doc, {label: r.meta for label, r in runs.items()}, cells)
    results = cell_results(cells, pred)
    head = headline(results, doc, predicted_optima(curves, results), cal_dir.resolve())

    built: list[tuple[str, str, alt.TopLevelMixin]] = []
    if len(curves):
        built.append(("speedup_vs_gamma", "Speedup against γ", charts.speedup_vs_gamma_chart(
            speedup_gamma_frame(curves, cells))))
    pvm = pred_vs_meas_frame(pred)
    if len(pvm):  # a run with nothing to predict (e.g. a head sweep: one γ, one draft per cell) has no rows
        built.append(("predicted_vs_measured", "Predicted against measured speedup",
                      charts.predicted_vs_measured_chart(pvm)))
    pp_path, fam_path = cal_dir / "acceptance_per_position.csv", cal_dir / "acceptance_families.csv"
    if pp_path.exists() and fam_path.exists():
        built.append(("acceptance_per_position", "Per-position acceptance α_i, 95% Wilson intervals, dashed: chosen model",
                      charts.acceptance_per_position_chart(acceptance_frame(read_table(pp_path), read_table(fam_path)))))
    bd = breakdown_frame(pred)
    if len(bd):
        built.append(("round_breakdown", "Round time: draft, verify, overhead (each configuration: measured, "
                      "predicted)", charts.round_breakdown_chart(bd)))
    if len(latency):
        built.append(("latency_cdf", "Per-token latency CDF", charts.latency_cdf_chart(charts.latency_cdf(latency))))
    if len(sweep):
        built.append(("pareto", "Pruned draft head: Pareto frontier", charts.pareto_chart(sweep)))
    races = race_sections({label: r.meta for label, r in runs.items()})
    built += [(name, title, chart) for name, title, chart, _ in races]

    sections, pngs = [], []
    for name, title, ch in built:
        svg = charts.chart_svg(ch, f"{name}.html")
        charts.save_chart(ch, out / f"{name}.html")
        if png:
            pngs.append(charts.save_chart(ch, out / f"{name}.png"))
        key = f'<p class="key">{html.escape(_CHART_KEYS[name])}</p>' if name in _CHART_KEYS else ""
        sections.append(f'<section class="chart" id="{name}"><h2>{html.escape(title)}</h2>{key}{svg}'
                        f'<p><a href="{name}.html">interactive</a>'
                        + (f' · <a href="{name}.png">PNG</a>' if png else "") + "</p></section>")

    claims_path = out / "claims.html"
    claims_path.write_text(claims_page(published_table()), encoding="utf-8")
    cost_params = read_table(cal_dir / "cost_params.csv")
    hold = doc["holdout"]
    note = f" {html.escape(hold['note'])}." if hold.get("note") else ""
    body = f"""<h1>specscope report: {html.escape(_title(setups))}</h1>
{_answer_html(head)}
<h2 id="measured">What was measured</h2>{_setups_html(setups)}
<h2 id="cells">Every configuration</h2>{_cells_html(results)}
<div class="grid">{''.join(sections)}</div>
<h2 id="error">Prediction error (MAPE)</h2>
<p>Hold-out: <b>{html.escape(hold['mode'])}</b>: {html.escape(hold['explanation'])}.{note}
Unstable cells and cells without a prediction are not counted (above: which, and why).</p>
{_mape_html(doc, len(results))}
{''.join(text for _, _, _, text in races)}
<details><summary>Fitted cost parameters (± standard error)</summary>{table_html(cost_params)}</details>
<p>Calibration: <code>{html.escape(str(cal_dir.resolve()))}</code>. Published speedup claims, checked against
the same simulator: <a href="claims.html">claims.html</a> (also <code>python -m sim check --claims</code>).</p>"""
    html_path = out / "report.html"
    html_path.write_text(page_html(f"specscope report: {_title(setups)}", body), encoding="utf-8")
    return ReportResult(html_path, tuple(pngs), tuple(n for n, _, _ in built), cal_dir, claims_path)
