"""Published and circulating speedup claims, each held against what the simulator says is possible.

The claims, their sources and the verdict logic live in :mod:`sim.claims`
(``python -m sim check --claims`` prints the same table); this module only
turns :func:`sim.claims.check_claims` into the data frame the report page
shows, so the page and the command can never disagree.
"""

from __future__ import annotations

import pandas as pd

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
