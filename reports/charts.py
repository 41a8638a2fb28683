"""Pure Altair chart builders: a pandas DataFrame in, an Altair chart out.

Every builder validates the columns it needs (``ValueError`` naming the
missing ones) and never reads or writes files; :func:`save_chart` is the one
function here that touches the disk. Tests inspect ``chart.to_dict()``
(encoded fields and data), not pixels.

Builders:

* :func:`speedup_vs_alpha_chart` — closed-form speedup against α, one line per γ.
* :func:`speedup_vs_gamma_chart` — speedup against γ: predicted curve (dashed
  beyond the measured γ), measured points with CIs, the best measured and the
  best predicted γ marked differently.
* :func:`predicted_vs_measured_chart` — predicted against measured speedup,
  the y = x line and ±band error bands.
* :func:`acceptance_per_position_chart` — α_i with confidence intervals.
* :func:`round_breakdown_chart` — draft / verify / overhead ms per round as stacked bars.
* :func:`latency_cdf_chart` — empirical CDF of per-token latency.
* :func:`pareto_chart` — pruned-head K sweep: end-to-end tokens/s against
  acceptance, the Pareto frontier drawn as a line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Literal

import altair as alt
import numpy as np
import pandas as pd

#: Altair's ``save`` format for each suffix :func:`save_chart` can write
_SAVE_FORMATS: dict[str, Literal["html", "png", "svg", "json"]] = {
    ".html": "html", ".png": "png", ".svg": "svg", ".json": "json"}
#: Suffixes :func:`save_chart` can write.
CHART_SUFFIXES: tuple[str, ...] = tuple(_SAVE_FORMATS)

_WIDTH = 420
_HEIGHT = 300
_BREAKDOWN_PANELS_PER_ROW = 8


def _require(df: pd.DataFrame, columns: Iterable[str], chart: str) -> None:
    if not isinstance(df, pd.DataFrame):
        raise ValueError(f"{chart}: expected a pandas DataFrame, got {type(df).__name__}")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(
            f"{chart}: missing columns {missing}; got {list(df.columns)}"
        )
    if df.empty:
        raise ValueError(f"{chart}: no rows to plot")


def speedup_vs_alpha_chart(df: pd.DataFrame, title: str = "Speedup against acceptance rate α") -> alt.Chart:
    """Lines of ``speedup`` against ``alpha``, one per ``gamma`` (columns ``alpha, gamma, speedup``)."""
    _require(df, ("alpha", "gamma", "speedup"), "speedup_vs_alpha_chart")
    data = df[["alpha", "gamma", "speedup"]].copy()
    data["gamma"] = data["gamma"].astype(int)
    lines = (
        alt.Chart(data)
        .mark_line()
        .encode(
            x=alt.X("alpha:Q", title="acceptance rate α", scale=alt.Scale(domain=[0, 1])),
            y=alt.Y("speedup:Q", title="speedup (×)"),
            color=alt.Color("gamma:O", title="γ", scale=alt.Scale(scheme="viridis")),
            tooltip=["alpha:Q", "gamma:O", alt.Tooltip("speedup:Q", format=".3f")],
        )
    )
    one = alt.Chart(pd.DataFrame({"speedup": [1.0]})).mark_rule(strokeDash=[4, 4], color="gray").encode(
        y="speedup:Q"
    )
    return (lines + one).properties(title=title, width=_WIDTH, height=_HEIGHT)


#: Marker legend of :func:`speedup_vs_gamma_chart`: what each kind of point is.
MARKERS: tuple[str, ...] = ("measured (95% CI)", "measured, flagged unstable", "best measured γ", "predicted best γ")
_MARKER_SHAPES = ("diamond", "cross", "circle", "triangle-up")
#: Line legend of :func:`speedup_vs_gamma_chart`: predictions inside and outside the measured γ.
PREDICTION_LINES: tuple[str, ...] = ("predicted, within measured γ", "predicted beyond measured γ (extrapolated)")


def _prediction_segments(pred: pd.DataFrame, meas: pd.DataFrame) -> pd.DataFrame:
    """Predicted rows split into line segments: within each series' measured γ range (solid) and beyond it
    (dashed); a boundary point is in both segments so the line stays continuous. No measurements: one kind."""
    out = []
    has_series = "series" in pred.columns
    groups = pred.groupby("series", sort=False) if has_series else [(None, pred)]
    for key, sub in groups:
        sub = sub.sort_values("gamma")
        m = meas[meas["series"] == key] if has_series and len(meas) else meas
        if not len(m):
            out.append(sub.assign(prediction=PREDICTION_LINES[0], segment=f"{key}|in"))
            continue
        lo, hi = int(m["gamma"].min()), int(m["gamma"].max())
        g = sub["gamma"]
        out.append(sub[(g >= lo) & (g <= hi)].assign(prediction=PREDICTION_LINES[0], segment=f"{key}|in"))
        out.append(sub[g <= lo].assign(prediction=PREDICTION_LINES[1], segment=f"{key}|below"))
        out.append(sub[g >= hi].assign(prediction=PREDICTION_LINES[1], segment=f"{key}|above"))
    segs = pd.concat(out, ignore_index=True)
    # a segment of one point draws nothing: drop those (the boundary point is in the neighbouring segment)
    return segs[segs.groupby("segment")["gamma"].transform("size") > 1]


# long: a docstring of the encodings; the body is one Altair layer per mark, a list, not logic
def speedup_vs_gamma_chart(df: pd.DataFrame, title: str = "Speedup against γ") -> alt.LayerChart:
    """Speedup against ``gamma``: predicted lines, measured points, and the best γ of each, kept apart.

    Optional ``source`` ∈ {predicted, measured}: predicted rows are drawn as a
    line, solid within the γ range measured for that ``series`` and dashed
    beyond it (an extrapolation); measured rows as diamonds, with their 95% CI
    (``speedup_lo``/``speedup_hi``) as bars, crosses where the optional boolean
    ``unstable`` is set. Optional boolean ``optimal``
    marks the best γ: on a measured row a ring ("best measured γ"), on a
    predicted row an open triangle ("predicted best γ"), so a prediction never
    looks like a measurement. Optional ``series`` (e.g. draft/domain) colours.
    """
    _require(df, ("gamma", "speedup"), "speedup_vs_gamma_chart")
    data = df.copy()
    data["gamma"] = data["gamma"].astype(int)
    if "source" not in data.columns:
        data["source"] = "predicted"
    bad = sorted(set(data["source"]) - {"predicted", "measured"})
    if bad:
        raise ValueError(f"speedup_vs_gamma_chart: unknown source values {bad}; valid: predicted, measured")
    has_series = "series" in data.columns
    legend = alt.Legend(orient="bottom", direction="vertical", labelLimit=0, titleLimit=0)
    color = alt.Color("series:N", title="series", legend=legend) if has_series else alt.value("#1f77b4")
    tooltip = ["gamma:O", alt.Tooltip("speedup:Q", format=".3f"), "source:N"] + (["series:N"] if has_series else [])
    x = alt.X("gamma:Q", title="γ (draft tokens per round)", axis=alt.Axis(tickMinStep=1))
    y = alt.Y("speedup:Q", title="speedup (×)")
    shape = alt.Shape("marker:N", title="points", scale=alt.Scale(domain=list(MARKERS), range=list(_MARKER_SHAPES)),
                      legend=alt.Legend(orient="bottom", direction="vertical", labelLimit=0))
    layers = []
    pred = data[data["source"] == "predicted"]
    meas = data[data["source"] == "measured"]
    if len(pred):
        segs = _prediction_segments(pred, meas)
        dash = alt.StrokeDash("prediction:N", title="lines", scale=alt.Scale(domain=list(PREDICTION_LINES),
                                                                         range=[[1, 0], [5, 4]]),
                              legend=alt.Legend(orient="bottom", direction="vertical", labelLimit=0,
                                                symbolStrokeColor="#555"))
        layers.append(alt.Chart(segs).mark_line().encode(x=x, y=y, color=color, strokeDash=dash, detail="segment:N",
                                                         tooltip=tooltip))
    if len(meas):
        if {"speedup_lo", "speedup_hi"} <= set(meas.columns):  # measured 95% CIs as error bars
            bars = meas.dropna(subset=["speedup_lo", "speedup_hi"])
            if len(bars):
                layers.append(alt.Chart(bars).mark_rule(strokeWidth=1.5).encode(
                    x=x, y=alt.Y("speedup_lo:Q", title="speedup (×)"), y2="speedup_hi:Q", color=color))
        flagged = meas["unstable"].astype(bool) if "unstable" in meas.columns else pd.Series(False, meas.index)
        marked = meas.assign(marker=[MARKERS[1] if f else MARKERS[0] for f in flagged])
        layers.append(alt.Chart(marked).mark_point(size=90, filled=True, opacity=1).encode(
            x=x, y=y, color=color, shape=shape, tooltip=tooltip))
    if "optimal" in data.columns and data["optimal"].astype(bool).any():
        opt = data[data["optimal"].astype(bool)]
        best_meas = opt[opt["source"] == "measured"].assign(marker=MARKERS[2])
        best_pred = opt[opt["source"] == "predicted"].assign(marker=MARKERS[3])
        if len(best_meas):
            layers.append(alt.Chart(best_meas).mark_point(size=320, strokeWidth=2, color="crimson", filled=False)
                          .encode(x=x, y=y, shape=shape, tooltip=tooltip))
        if len(best_pred):
            layers.append(alt.Chart(best_pred).mark_point(size=140, strokeWidth=2, filled=False, color="#444")
                          .encode(x=x, y=y, shape=shape, tooltip=tooltip))
    one = alt.Chart(pd.DataFrame({"speedup": [1.0]})).mark_rule(strokeDash=[2, 2], color="gray").encode(
        y="speedup:Q"
    )
    layers.append(one)
    # alt.LayerChart, not alt.layer: alt.layer turns into a FacetChart only for layers with facet encodings (none here)
    return alt.LayerChart(layer=layers).properties(title=title, width=_WIDTH, height=_HEIGHT)


def predicted_vs_measured_chart(
    df: pd.DataFrame, band: float = 0.05, title: str = "Predicted against measured speedup"
) -> alt.Chart:
    """Scatter of ``predicted`` against ``measured`` with y = x and a ±``band`` relative band.

    Columns ``measured, predicted``; optional ``label`` (tooltip), ``method``
    (colour, e.g. closed_form / event_sim / trace), ``held_out`` (bool, shape) and
    ``measured_lo``/``measured_hi`` (the measured 95% CI, drawn as horizontal error bars).
    """
    _require(df, ("measured", "predicted"), "predicted_vs_measured_chart")
    if not 0 < band < 1:
        raise ValueError(f"predicted_vs_measured_chart: band must be in (0, 1), got {band}")
    data = df.copy()
    if "held_out" in data.columns:
        data["held_out"] = data["held_out"].map(lambda v: "held out" if bool(v) else "fitted")
    has_ci = {"measured_lo", "measured_hi"} <= set(data.columns)
    lo_vals = [data["measured"].min(), data["predicted"].min()] + ([data["measured_lo"].min()] if has_ci else [])
    hi_vals = [data["measured"].max(), data["predicted"].max()] + ([data["measured_hi"].max()] if has_ci else [])
    lo = float(np.nanmin(lo_vals)) * 0.9
    hi = float(np.nanmax(hi_vals)) * 1.1
    grid = np.linspace(lo, hi, 50)
    diag = pd.DataFrame({"measured": grid, "predicted": grid, "lo": grid * (1 - band), "hi": grid * (1 + band)})
    scale = alt.Scale(domain=[lo, hi], zero=False)
    x = alt.X("measured:Q", title="measured speedup (×)", scale=scale)
    band_layer = alt.Chart(diag).mark_area(opacity=0.15, color="gray").encode(
        x=x, y=alt.Y("lo:Q", scale=scale), y2="hi:Q"
    )
    line = alt.Chart(diag).mark_line(color="black", strokeDash=[5, 3]).encode(
        x=x, y=alt.Y("predicted:Q", scale=scale)
    )
    enc: dict = {
        "x": x,
        "y": alt.Y("predicted:Q", title="predicted speedup (×)", scale=scale),
        "tooltip": [c for c in ("label", "method", "measured", "predicted", "held_out") if c in data.columns],
    }
    if "method" in data.columns:
        enc["color"] = alt.Color("method:N", title="prediction")
    if "held_out" in data.columns:
        enc["shape"] = alt.Shape("held_out:N", title="configuration")
    pts = alt.Chart(data).mark_point(size=70, filled=True).encode(**enc)
    layers = band_layer + line
    if has_ci:
        bars = data.dropna(subset=["measured_lo", "measured_hi"])
        if len(bars):
            bar_enc: dict = {"x": alt.X("measured_lo:Q", scale=scale, title="measured speedup (×)"),
                             "x2": "measured_hi:Q", "y": alt.Y("predicted:Q", scale=scale)}
            if "method" in data.columns:
                bar_enc["color"] = alt.Color("method:N", title="prediction")
            layers = layers + alt.Chart(bars).mark_rule(strokeWidth=1.5, opacity=0.7).encode(**bar_enc)
    return (layers + pts).properties(
        title=f"{title} (band ±{band:.0%}{'; bars: measured 95% CI' if has_ci else ''})", width=_WIDTH,
        height=_HEIGHT
    )


def acceptance_per_position_chart(
    df: pd.DataFrame, title: str = "Per-position acceptance α_i (95% CI)"
) -> alt.LayerChart:
    """α_i against position with error bars (columns ``position, alpha, ci_low, ci_high``; optional ``series``)."""
    _require(df, ("position", "alpha", "ci_low", "ci_high"), "acceptance_per_position_chart")
    data = df.dropna(subset=["alpha"]).copy()
    if data.empty:
        raise ValueError("acceptance_per_position_chart: every alpha is NaN")
    has_series = "series" in data.columns
    color = (alt.Color("series:N", title="series", legend=alt.Legend(orient="bottom", direction="vertical",
                                                                     labelLimit=0, titleLimit=0))
             if has_series else alt.value("#1f77b4"))
    x = alt.X("position:O", title="draft position i", axis=alt.Axis(labelAngle=0))
    pts = alt.Chart(data).mark_point(filled=True, size=60).encode(
        x=x,
        y=alt.Y("alpha:Q", title="α_i = P(accept i | accepted 1..i−1)", scale=alt.Scale(domain=[0, 1])),
        color=color,
        tooltip=[c for c in ("series", "position", "alpha", "ci_low", "ci_high", "n") if c in data.columns],
    )
    bars = alt.Chart(data).mark_rule().encode(x=x, y="ci_low:Q", y2="ci_high:Q", color=color)
    layers = [bars, pts]
    if "fit" in data.columns:
        layers.append(
            alt.Chart(data.dropna(subset=["fit"])).mark_line(strokeDash=[4, 3]).encode(
                x=x, y="fit:Q", color=color
            )
        )
    chart = alt.LayerChart(layer=layers)  # no facet encodings: what alt.layer would build
    if has_series:
        chart = chart.encode(xOffset="series:N")
    return chart.properties(title=title, width=_WIDTH, height=_HEIGHT)


def round_breakdown_chart(df: pd.DataFrame, title: str = "Round time breakdown (mean per round)") -> alt.TopLevelMixin:
    """Stacked bars of ``ms`` per ``component`` (draft / verify / overhead) for each ``config``.

    Optional ``source`` (measured / predicted): each configuration becomes a
    small panel of two bars, each named under it, so the one legend (the
    components' colours) is all the colour there is.
    """
    _require(df, ("config", "component", "ms"), "round_breakdown_chart")
    data = df.copy()
    order = ["draft", "verify", "overhead"]
    bad = sorted(set(data["component"]) - set(order))
    if bad:
        raise ValueError(f"round_breakdown_chart: unknown components {bad}; valid: {', '.join(order)}")
    data["order"] = data["component"].map({c: i for i, c in enumerate(order)})
    color = alt.Color("component:N", scale=alt.Scale(domain=order), title="component",
                      legend=alt.Legend(orient="bottom", direction="horizontal"))
    tooltip = [c for c in ("config", "source", "component", "ms") if c in data.columns]
    y = alt.Y("sum(ms):Q", title="ms per round", stack="zero")
    if "source" not in data.columns:
        enc = {"x": alt.X("config:N", title="configuration", axis=alt.Axis(labelAngle=-30, labelLimit=0)),
               "y": y, "color": color, "order": alt.Order("order:Q"), "tooltip": tooltip}
        return alt.Chart(data).mark_bar().encode(**enc).properties(title=title, width=_WIDTH, height=_HEIGHT)
    n = max(data["config"].nunique(), 1)
    per_row = min(n, _BREAKDOWN_PANELS_PER_ROW)  # wrap into rows: the chart never grows wider than ~620 px
    panel = max(44, min(120, (_WIDTH + 120) // per_row))
    height = _HEIGHT if n <= per_row else 150
    bars = alt.Chart(data).mark_bar().encode(
        x=alt.X("source:N", title=None, sort=["measured", "predicted"], axis=alt.Axis(labelAngle=-45)),
        y=y, color=color, order=alt.Order("order:Q"), tooltip=tooltip,
    ).properties(width=panel, height=height)
    # each configuration's name over its panel, one line per part ("ngram:3 · code · γ 2" on three lines)
    return bars.facet(facet=alt.Facet("config:N", title=None, header=alt.Header(
        labelAngle=0, labelOrient="top", labelExpr="split(datum.label, ' · ')", labelFontSize=10)),
        columns=per_row).properties(title=title)


def latency_cdf(latencies_ms: pd.DataFrame, group: str = "mode", max_points: int = 400) -> pd.DataFrame:
    """Empirical CDF rows (``latency_ms, cdf, <group>``) from raw per-token latencies.

    Groups with more than ``max_points`` latencies are reduced to that many
    evenly spaced points of the CDF (the step function keeps its shape; the
    page stays small).
    """
    _require(latencies_ms, ("latency_ms", group), "latency_cdf")
    if max_points < 2:
        raise ValueError(f"latency_cdf: max_points must be >= 2, got {max_points}")
    out = []
    for key, sub in latencies_ms.groupby(group, sort=True):
        v = np.sort(sub["latency_ms"].to_numpy(dtype=float))
        cdf = np.arange(1, v.size + 1) / v.size
        if v.size > max_points:
            idx = np.unique(np.linspace(0, v.size - 1, max_points).round().astype(int))
            v, cdf = v[idx], cdf[idx]
        out.append(pd.DataFrame({"latency_ms": v, "cdf": cdf, group: key}))
    return pd.concat(out, ignore_index=True)


#: Tick values the latency axis may use (ms): a 1-3-10 ladder, so labels on the symlog axis never crowd.
_LATENCY_TICKS_MS = (0, 1, 3, 10, 30, 100, 300, 1000, 3000, 10000, 30000, 100000)


def latency_cdf_chart(df: pd.DataFrame, title: str = "Per-token latency CDF") -> alt.Chart:
    """Step lines of ``cdf`` against ``latency_ms``, one per ``mode`` (see :func:`latency_cdf`).

    The x axis is symlog (tokens of one round arrive together, at ~0 ms); its
    ticks are the 1-3-10 ladder within the data, never closer than a third of
    a decade, and overlapping labels are dropped.
    """
    _require(df, ("latency_ms", "cdf", "mode"), "latency_cdf_chart")
    top = float(df["latency_ms"].max())
    ticks = [t for t in _LATENCY_TICKS_MS if t <= top * 1.5] or [0]
    return (
        alt.Chart(df)
        .mark_line(interpolate="step-after")
        .encode(
            x=alt.X("latency_ms:Q", title="time since previous token (ms)", scale=alt.Scale(type="symlog"),
                    axis=alt.Axis(values=ticks, labelOverlap="greedy", labelFlush=True)),
            y=alt.Y("cdf:Q", title="fraction of tokens", scale=alt.Scale(domain=[0, 1])),
            color=alt.Color("mode:N", title="mode", legend=alt.Legend(orient="bottom", direction="horizontal")),
            tooltip=["mode:N", "latency_ms:Q", "cdf:Q"],
        )
        .properties(title=title, width=_WIDTH, height=_HEIGHT)
    )


def pareto_frontier(df: pd.DataFrame, x: str = "acceptance_rate", y: str = "tokens_per_s") -> pd.Series:
    """Boolean mask of rows no other row beats: none has higher-or-equal ``x`` and ``y`` and is higher in one."""
    _require(df, (x, y), "pareto_frontier")
    a = df[x].to_numpy(dtype=float)
    b = df[y].to_numpy(dtype=float)
    mask = np.ones(len(df), dtype=bool)
    for i in range(len(df)):
        dominated = (a >= a[i]) & (b >= b[i]) & ((a > a[i]) | (b > b[i]))
        mask[i] = not dominated.any()
    return pd.Series(mask, index=df.index, name="on_frontier")


def pareto_chart(df: pd.DataFrame, title: str = "Pruned draft head: tokens/s against acceptance") -> alt.Chart:
    """End-to-end ``tokens_per_s`` against ``acceptance_rate``, one point per ``variant`` and ``head_k``,
    with the Pareto frontier (column ``on_frontier`` or computed; both higher is better) as a line."""
    _require(df, ("variant", "head_k", "tokens_per_s", "acceptance_rate"), "pareto_chart")
    data = df.copy()
    if "on_frontier" not in data.columns:
        data["on_frontier"] = pareto_frontier(data)
    x = alt.X("acceptance_rate:Q", title="acceptance rate (draft vs target, held-out text)",
              scale=alt.Scale(zero=False))
    y = alt.Y("tokens_per_s:Q", title="speculative tokens/s", scale=alt.Scale(zero=False))
    tooltip = [c for c in ("variant", "head_k", "draft_step_ms", "acceptance_rate", "speedup", "tokens_per_s")
               if c in data.columns]
    pts = alt.Chart(data).mark_point(filled=True).encode(
        x=x, y=y, color=alt.Color("variant:N", title="head variant"),
        size=alt.Size("head_k:Q", title="kept vocabulary K"), tooltip=tooltip,
    )
    front = data[data["on_frontier"].astype(bool)].sort_values("acceptance_rate")
    line = alt.Chart(front).mark_line(color="black", strokeDash=[4, 2]).encode(x=x, y=y)
    return (line + pts).properties(title=title, width=_WIDTH, height=_HEIGHT)


def chart_svg(chart: alt.TopLevelMixin, interactive: str | None = None) -> str:
    """``chart`` as inline SVG (vl-convert). Without ``vl-convert-python`` (84 MiB installed: the GPU check's device
    image goes without it, docs/guides/gpu.md) a one-line note instead, linking the interactive chart
    ``interactive`` (an HTML file beside the page) when given: the page is still written."""
    try:
        import vl_convert as vlc
    except ImportError:
        link = f' <a href="{interactive}">interactive chart</a>' if interactive else ""
        return f"<p class='note'>chart not drawn inline: vl-convert-python is not installed.{link}</p>"
    return vlc.vegalite_to_svg(chart.to_json())


def save_chart(chart: alt.TopLevelMixin, path: str | Path) -> Path:
    """Write ``chart`` to ``path``; the suffix picks the format (.html, .png, .svg, .json).

    PNG and SVG go through vl-convert. Parent directories are created.
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in CHART_SUFFIXES:
        raise ValueError(
            f"cannot save a chart as {suffix or '(no suffix)'!r} ({p}); valid suffixes: {', '.join(CHART_SUFFIXES)}"
        )
    p.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".png":
        chart.save(str(p), format="png", scale_factor=2.0)
    else:
        chart.save(str(p), format=_SAVE_FORMATS[suffix])
    return p


__all__ = [
    "CHART_SUFFIXES",
    "chart_svg",
    "MARKERS",
    "PREDICTION_LINES",
    "acceptance_per_position_chart",
    "latency_cdf",
    "latency_cdf_chart",
    "pareto_chart",
    "pareto_frontier",
    "predicted_vs_measured_chart",
    "round_breakdown_chart",
    "save_chart",
    "speedup_vs_alpha_chart",
    "speedup_vs_gamma_chart",
]
