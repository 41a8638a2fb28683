"""Published and circulating speedup claims, each held against what the simulator says is possible.

The claims, their sources and the verdict logic live in :mod:`sim.claims`
(``python -m sim check --claims`` prints the same table); this module only
turns :func:`sim.claims.check_claims` into the data frame the report shows
(:func:`published_table`), and that into what the published claims contribute
to a report: their own page (:func:`claims_page`, about no run) and the line
linking it (:data:`CLAIMS_LINK`), so the page and the command can never disagree.
"""

from __future__ import annotations

import html

import pandas as pd

from reports.builder import Page, Section, number_or_dash
from sim.claims import CLAIMS, Claim, check_claims

COLUMNS = (
    "claim", "source", "quote", "status", "mapped_to", "assumptions", "claimed_speedup", "gamma", "cost_ratio",
    "bound_at_alpha1", "speedup_by_alpha", "alpha_stated", "alpha_needed", "verdict_kind", "verdict_short", "verdict",
    "would_have_to_be_true",
    "roofline", "verification",
)


def published_table(claims: tuple[Claim, ...] = CLAIMS) -> pd.DataFrame:
    """One row per claim: source, mapping, bound at α = 1, α needed, verdict (see :mod:`sim.claims`)."""
    rows = [c.row() for c in check_claims(claims)]
    return pd.DataFrame(rows, columns=list(COLUMNS))


_VERDICT_COLOURS = {"consistent": "#1a7f37", "needs_alpha": "#9a6700", "not_reachable": "#cf222e"}
_VERDICT_LABELS = {"consistent": "consistent", "needs_alpha": "needs α", "not_reachable": "not reachable"}


def claims_html(table: pd.DataFrame) -> str:
    """The claims table (built by :func:`published_table`, i.e. ``sim.claims``) as HTML."""
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
            f'<td class="n">{number_or_dash(r["alpha_stated"], "{:.3f}")}</td>'
            f'<td class="n">{number_or_dash(r["alpha_needed"], "{:.3f}")}</td>'
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


CLAIMS_TITLE = "Published speculative-decoding claims, checked against the simulator"
#: The report's closing line goes on with this: where the claims page is (after the calibration it names).
CLAIMS_LINK = (' Published speedup claims, checked against\nthe same simulator: <a href="claims.html">claims.html</a> '
               "(also <code>python -m sim check --claims</code>).")


def claims_page(table: pd.DataFrame | None = None) -> Page:
    """The published-claims page (``claims.html``): the table of :func:`claims_html` (default: every claim's
    :func:`published_table`) under its own heading."""
    rows = published_table() if table is None else table
    return Page(CLAIMS_TITLE, (Section((claims_html(rows),)),), file="claims.html")
