"""The race of a tuned run (``--until-decided``): how the candidates were eliminated, look by look.

Reads only ``run.json`` ``race`` (the schema :mod:`measure.racing` races write, whatever measured them: the chain
sweep's ``python -m measure --until-decided`` and the serving sweep's ``python -m measure serve
--until-decided``): ``rule``, ``stopped_by``, ``decided`` and ``looks`` — each look's ``groups``, each group's
``leader``, ``stop_reason``, ``resolved``, ``eliminated`` (``cell_id``, ``look``, ``ratio``, ``ratio_hi``) and
``comparisons`` (``cell_id``, ``ratio``, ``ratio_lo``, ``ratio_hi``, ``n_units``); and, with a prior,
``race.prior`` (:mod:`measure.prior`).

* :func:`race_frame` — one row per (group, look, candidate): its ratio to the group's leader with the interval.
* :func:`race_chart` — a panel per group: the ratio to the leader at each pass, bars its interval, the marks
  saying live / resolved / eliminated / leader.
* :func:`race_html` — per group, each candidate's outcome (the pass at which it was eliminated or resolved),
  the stopping reason, and the prior's predictions, deferrals, checks and savings.
* :func:`race_sections` — what the race contributes to a page (chain or serving): per raced run, the chart as
  a :class:`reports.builder.Figure` card and the text.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import altair as alt
import pandas as pd

from reports.builder import Figure, table_html

#: How the text draws a table (:func:`reports.builder.table_html` on the page).
Table = Callable[[pd.DataFrame], str]

STATUSES = ("leader", "live", "resolved", "eliminated")


def _bad(what: str) -> ValueError:
    return ValueError(f"run.json race: {what}; the race record is damaged (re-run with the same --out to rewrite it)")


def _looks(race: Mapping[str, Any]) -> list[dict]:
    looks = race.get("looks")
    if not isinstance(looks, list) or not all(isinstance(lk, dict) and isinstance(lk.get("look"), int)
                                              and isinstance(lk.get("groups"), dict) for lk in looks):
        raise _bad("'looks' is not a list of {look, groups}")
    return looks


def short_names(cells: list[str]) -> dict[str, str]:
    """Each candidate's name without the ``|``-separated parts every candidate of its group shares."""
    parts = {c: c.split("|") for c in cells}
    split = [p for p in parts.values() if len(p) > 1]
    common = set.intersection(*(set(p) for p in split)) if len(split) > 1 else set()
    return {c: "|".join(x for x in p if x not in common) or c for c, p in parts.items()}


def _rows(key: str, lk: dict, g: dict) -> list[dict]:
    pass_ = lk["look"] + 1
    gone = {e.get("cell_id") for e in g.get("eliminated") or [] if e.get("look") == lk["look"]}
    resolved = set(g.get("resolved") or [])
    rows = [{"group": key, "pass": pass_, "candidate": g["leader"], "ratio": 1.0, "lo": 1.0, "hi": 1.0,
             "n_units": None, "status": "leader"}]
    for c in g.get("comparisons") or []:
        if not isinstance(c, dict) or not c.get("n_units"):
            continue  # not measured yet (a candidate the prior deferred)
        status = "eliminated" if c.get("cell_id") in gone else "resolved" if c.get("cell_id") in resolved else "live"
        rows.append({"group": key, "pass": pass_, "candidate": c.get("cell_id"), "ratio": c.get("ratio"),
                     "lo": c.get("ratio_lo"), "hi": c.get("ratio_hi"), "n_units": c.get("n_units"), "status": status})
    return rows


def race_frame(race: Mapping[str, Any]) -> pd.DataFrame:
    """Columns ``group, pass, candidate, label, ratio, lo, hi, n_units, status`` (pass = look + 1)."""
    rows: list[dict] = []
    for lk in _looks(race):
        for key, g in lk["groups"].items():
            if not isinstance(g, dict) or not isinstance(g.get("leader"), str):
                raise _bad(f"group {key!r} of look {lk['look']} has no leader")
            rows += _rows(str(key), lk, g)
    df = pd.DataFrame(rows, columns=["group", "pass", "candidate", "ratio", "lo", "hi", "n_units", "status"])
    names: dict[str, str] = {}
    for _, sub in df.groupby("group"):
        names.update(short_names(sorted(set(sub["candidate"]))))
    return df.assign(label=df["candidate"].map(names))


def race_chart(df: pd.DataFrame, regret: float | None = None) -> alt.TopLevelMixin:
    """A panel per group: each candidate's ratio to the leader at each pass (bars: its interval; the leader at 1),
    shaped by status; a dashed line at ``1 + regret``: a challenger whose interval ends below it is resolved."""
    if df.empty:
        raise ValueError("race_chart: no looks to draw")
    panels = []
    color = alt.Color("label:N", title="candidate", legend=alt.Legend(orient="bottom", columns=2, labelLimit=0))
    shape = alt.Shape("status:N", title="at this look", scale=alt.Scale(domain=list(STATUSES)))
    for key, sub in df.groupby("group", sort=False):
        x = alt.X("pass:O", title="pass (look)", axis=alt.Axis(labelAngle=0))
        y = alt.Y("ratio:Q", title="ratio to the leader (×)", scale=alt.Scale(type="log", zero=False))
        bars = alt.Chart(sub.dropna(subset=["lo", "hi"])).mark_rule(strokeWidth=1.5).encode(
            x=x, y=alt.Y("lo:Q", scale=alt.Scale(type="log", zero=False)), y2="hi:Q", color=color, xOffset="label:N")
        points = alt.Chart(sub).mark_point(size=60, filled=True).encode(
            x=x, y=y, color=color, shape=shape, xOffset="label:N",
            tooltip=["label", "pass", "status", alt.Tooltip("ratio:Q", format=".3f"), alt.Tooltip("lo:Q", format=".3f"),
                     alt.Tooltip("hi:Q", format=".3f"), "n_units"])
        layers = [bars, points, alt.Chart(pd.DataFrame({"y": [1.0]})).mark_rule(color="black").encode(y="y:Q")]
        if regret:
            layers.append(alt.Chart(pd.DataFrame({"y": [1.0 + regret]})).mark_rule(
                color="gray", strokeDash=[4, 3]).encode(y="y:Q"))
        panels.append(alt.layer(*layers).properties(width=420, height=220, title=str(key)))
    return alt.vconcat(*panels).resolve_scale(color="independent", shape="shared")


def _outcomes(df: pd.DataFrame, key: str) -> list[dict]:
    """Per candidate of group ``key``: where it ended (eliminated at pass N, resolved since pass N, the leader,
    live) and its last ratio to the leader with the interval."""
    sub = df[df["group"] == key]
    last_pass = int(sub["pass"].max())
    out = []
    for cand, rows in sub.groupby("candidate", sort=False):
        rows = rows.sort_values("pass")
        last = rows.iloc[-1]
        if last["status"] == "eliminated":
            outcome = f"eliminated after pass {int(last['pass'])}"
        elif int(last["pass"]) < last_pass or last["status"] == "resolved":
            streak = rows[rows["status"] == "resolved"]
            since = int(streak["pass"].min()) if len(streak) else int(last["pass"])
            outcome = f"resolved after pass {since}" if last["status"] == "resolved" else \
                f"last compared after pass {int(last['pass'])}"
        else:
            outcome = "leader" if last["status"] == "leader" else "live at the end"
        interval = "" if pd.isna(last["lo"]) or last["status"] == "leader" else \
            f" [{last['lo']:.3f}, {last['hi']:.3f}]"
        out.append({"candidate": last["label"], "outcome": outcome,
                    "ratio to leader": f"{last['ratio']:.3f}{interval}", "units": last["n_units"]})
    return out


def _prior_html(prior: Mapping[str, Any], key: str, names: Mapping[str, str], table: Table) -> str:
    g = (prior.get("groups") or {}).get(key) or {}
    if not g:
        return ""
    pred = g.get("predicted") or {}
    checks = {c.get("cell_id"): c for c in g.get("checks") or [] if isinstance(c, dict)}
    rows = []
    for cand, v in pred.items():
        chk = checks.get(cand) or {}
        verdict = chk.get("verdict") or ("joined the race" if cand in (g.get("joined") or []) else "—")
        if chk.get("ratio") is not None:
            verdict += f" (ratio {chk['ratio']:.3f}, {chk.get('n_units')} units)"
        rows.append({"candidate": names.get(cand, cand), "predicted speedup": f"{v:.3f}",
                     "deferred": "yes" if cand in (g.get("deferred") or []) else "",
                     "check": verdict if cand in (g.get("deferred") or []) else ""})
    saved = g.get("saved") or {}
    line = (f"<p>Prior: {len(g.get('deferred') or [])} deferred; saved {saved.get('units', 0)} units "
            f"(≈ {saved.get('seconds', 0.0):.0f} s) against the race without it.</p>") if saved else ""
    return line + (table(pd.DataFrame(rows)) if rows else "")


def race_html(race: Mapping[str, Any], df: pd.DataFrame, table: Table) -> str:
    """The race section's text: the rule, why it stopped, and per group the outcomes (and the prior's part)."""
    e = html.escape
    rule = race.get("rule") or {}
    head = (f"<p>Rule: family-wise confidence {rule.get('confidence')}, regret {rule.get('regret')}, at most "
            f"{rule.get('max_looks')} looks (<code>measure/racing.py</code>). Stopped by: "
            f"<b>{e(str(race.get('stopped_by')))}</b>.</p>")
    prior = race.get("prior") or {}
    if prior:
        head += (f"<p>Prior: <code>{e(str(prior.get('calibration')))}</code> ({e(str(prior.get('method')))}, "
                 f"uncertainty ±{100 * float(prior.get('uncertainty') or 0):.1f}%): saved "
                 f"{prior.get('saved_units', 0)} units (≈ {float(prior.get('saved_s') or 0):.0f} s). "
                 f"{e(str(prior.get('definition', '')))}</p>")
    looks = _looks(race)
    blocks = []
    for key in dict.fromkeys(k for lk in looks for k in lk["groups"]):
        last = next(lk["groups"][key] for lk in reversed(looks) if key in lk["groups"])
        names = dict(zip(df["candidate"], df["label"]))
        blocks.append(f"<h3>{e(str(key))}</h3><p>Leader: <b>{e(names.get(last['leader'], last['leader']))}</b>; "
                      f"stopping reason: {e(str(last.get('stop_reason') or 'not decided'))}.</p>"
                      + table(pd.DataFrame(_outcomes(df, str(key))))
                      + (_prior_html(prior, str(key), names, table) if prior else ""))
    return head + "".join(blocks)


@dataclass(frozen=True)
class RaceSection:
    """One raced run's part of a page: its chart (a card, titled) and its text (a heading, the rule, the
    outcomes)."""

    figure: Figure
    text: str


def race_sections(metas: Mapping[str, Mapping]) -> list[RaceSection]:
    """Per run whose ``run.json`` has a ``race`` (``--until-decided``, chain or serving sweep): the chart of its
    eliminations over time (named ``race``, ``race_1``, … by the run's place in ``metas``) and its text."""
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
        out.append(RaceSection(Figure(name, race_chart(frame, (race.get("rule") or {}).get("regret")),
                                      f"The race of {label}: each candidate's ratio to its leader at each look"),
                               text))
    return out
