"""The report of a chain sweep (or a head sweep): its sections, from a calibration directory (or a run directory).

:func:`chain_pages` reads files only — a calibration directory written by
``python -m calibrate`` (``calibration.json`` + CSVs) and the run
directories it names — and returns the sections of the page (the answer, what
was measured, every cell, the charts, the error, the races, the fitted costs)
and the published claims' page it links to; :func:`reports.builder.write_report`
draws them: ``report.html`` (charts inline as SVG, so the page renders without
network or JavaScript), one PNG and one interactive HTML per chart. Given a
run directory instead, :func:`build_report` reads the calibration inside it
(``<run>/calibration``, where ``python -m calibrate RUN`` writes by default); a
run directory without one is refused in one line, since fitting is calibrate's job.

The ``*_frame`` functions turn calibration/run tables into the data frames
the pure builders of :mod:`reports.charts` take; :func:`read_table`,
:func:`read_doc` and :func:`judged_columns` are shared with the other kinds'
sections (:mod:`reports.trees`, :mod:`reports.serving`).
"""

from __future__ import annotations

import html
import json
from dataclasses import replace
from pathlib import Path

import altair as alt
import pandas as pd

from reports import charts
from reports.builder import Figure, KindReport, Page, ReportResult, Section, build, number_or_dash, table_html
from reports.published import CLAIMS_LINK, claims_page
from reports.race import race_sections
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
from measure.runkinds import CHAIN, HEAD_SWEEP, RunKind, read_kind
from sim.policies import GammaSpec
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
    fixed = cells[cells["gamma_policy"].map(lambda g: GammaSpec.parse(str(g)).is_fixed).astype(bool)]
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


# -- page ---------------------------------------------------------------------------
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


_CHART_KEYS = {
    "race": "Each point: a candidate's mean ratio to its group's leader after a pass (the leader at 1); bars: the "
            "interval the race judged it by (Bonferroni over looks and pairs); shape: leader, live, resolved or "
            "eliminated at that look; dashed: 1 + regret (an interval ending below it is resolved).",
    "speedup_vs_gamma": "Filled diamonds: measured, with the 95% CI (crosses: flagged unstable); ring: best measured "
                        "γ. Lines: the calibrated prediction, solid over the measured γ, dashed beyond them (an "
                        "extrapolation); open triangle: the predicted best γ.",
}


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
            marks: dict[bool | None, str] = {True: ' <span class="ok">in CI</span>',
                                             False: ' <span class="bad">outside CI</span>'}
            mark = marks.get(p.inside_ci, "")
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
                        f"<td class=\"n\">{number_or_dash(v['speedup_mape_pct'], '{:.2f}')}</td>"
                        f"<td class=\"n\">{number_or_dash(v['tokens_per_s_mape_pct'], '{:.2f}')}</td>"
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


def _title(setups: list[MeasuredSetup]) -> str:
    targets = sorted({st.target.split(" (")[0] for st in setups})
    drafts = sorted({d.split(" (")[0] for st in setups for d in st.drafts})
    hw = sorted({st.hardware for st in setups})
    return f"{', '.join(targets)} with {', '.join(drafts)} on {'; '.join(hw)}"


def _figures(cal_dir: Path, pred: pd.DataFrame, curves: pd.DataFrame, cells: pd.DataFrame,
             latency: pd.DataFrame, sweep: pd.DataFrame) -> list[Figure]:
    """The charts of a chain calibration, each drawn only when there is something to draw (predictions beyond
    the measured γ drawn dashed, the best measured γ ringed apart from the predicted best)."""
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
    return [Figure(name, chart, title, _CHART_KEYS.get(name, "")) for name, title, chart in built]


def chain_pages(cal_dir: Path, checked: tuple[dict, pd.DataFrame, pd.DataFrame]) -> tuple[Page, Page]:
    """The report of a chain (or head-sweep) calibration ``cal_dir`` (read: :func:`read_calibration`), and the
    published claims' page it links to.

    The page opens with the answer: the models, engine and machine measured;
    the best measured speedup with its 95% CI; the held-out prediction error
    and every cell left out of it, with the reason; what to do next. Then
    every cell, the charts (and each raced run's race), the error table, the
    races' text and the fitted costs. The published claims, which are about no
    run, are on their own page. Incomplete runs are refused by ``python -m
    calibrate`` (unless ``--allow-incomplete`` there), which wrote the
    calibration this page reads.
    """
    doc, pred, curves = checked
    from measure.records import load_run

    runs = {label: load_run(info["path"]) for label, info in doc["runs"].items()}
    cells = pd.concat([r.table("cells").assign(run=label) for label, r in runs.items()], ignore_index=True)
    latency = pd.concat([r.table("token_latency") for r in runs.values()], ignore_index=True)
    sweep = pd.concat([r.table("head_sweep") for r in runs.values()], ignore_index=True)

    setups = measured_setups(doc, {label: r.meta for label, r in runs.items()}, cells)
    results = cell_results(cells, pred)
    head = headline(results, doc, predicted_optima(curves, results), cal_dir.resolve())
    races = race_sections({label: r.meta for label, r in runs.items()})
    figures = _figures(cal_dir, pred, curves, cells, latency, sweep) + [
        replace(r.figure, key=_CHART_KEYS.get(r.figure.name, "")) for r in races]
    hold = doc["holdout"]
    note = f" {html.escape(hold['note'])}." if hold.get("note") else ""
    sections = (
        Section((_answer_html(head),)),
        Section((f'<h2 id="measured">What was measured</h2>{_setups_html(setups)}',)),
        Section((f'<h2 id="cells">Every configuration</h2>{_cells_html(results)}',)),
        Section(('<div class="grid">', *figures, "</div>")),
        Section((f"""<h2 id="error">Prediction error (MAPE)</h2>
<p>Hold-out: <b>{html.escape(hold['mode'])}</b>: {html.escape(hold['explanation'])}.{note}
Unstable cells and cells without a prediction are not counted (above: which, and why).</p>
{_mape_html(doc, len(results))}""",)),
        Section(tuple(r.text for r in races)),
        Section(("<details><summary>Fitted cost parameters (± standard error)</summary>"
                 f"{table_html(read_table(cal_dir / 'cost_params.csv'))}</details>",)))
    return (Page(f"specscope report: {_title(setups)}", sections, source=cal_dir, closing=CLAIMS_LINK, sep="\n"),
            claims_page())


def chain_calibration_dir(src: Path) -> Path | None:
    """``src`` if it holds a chain calibration (``calibration.json``), its ``calibration/`` if it is a run holding
    one, else None (neither); a run without its calibration is a one-line ``ValueError``."""
    if not ((src / CAL_JSON).exists() or (src / "run.json").exists()):
        return None
    return _load_calibration(src)


#: The report of a chain sweep or a head sweep: :func:`chain_calibration_dir`, :func:`read_calibration`,
#: :func:`chain_pages`; its folder is ``report/`` in the directory given (a run's, beside ``calibration/``).
REPORT = KindReport((CHAIN, HEAD_SWEEP), chain_calibration_dir, read_calibration, chain_pages,
                    report_in_source=True)


def build_report(src: str | Path, out: str | Path | None = None, png: bool = True) -> ReportResult:
    """Write ``report.html`` (+ PNGs, + ``claims.html``) for a calibration directory (or a run directory holding
    one) into ``out`` (default: ``<src>/report``): :func:`chain_pages`."""
    return build(REPORT, src, out, png)
