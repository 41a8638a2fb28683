"""Analysis of run records shared by ``measure`` (the live table, traces) and ``calibrate`` (the fits).

:mod:`measure.records` only reads and writes the run directory; what is
computed *from* its tables lives here. Torch-free; needs numpy and pandas.

* :data:`TRACE_GAMMA_MAX` — how far ahead ``traces.csv`` ``proposed``/``accept_run`` look;
* :func:`drafted_counts` — tokens each ``rounds`` row drafted;
* :func:`per_position_acceptance` — α_i with its counts from ``rounds``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

__all__ = ["TRACE_GAMMA_MAX", "drafted_counts", "per_position_acceptance"]

#: How far ahead ``traces.csv`` ``proposed``/``accept_run`` look: replay is exact for any γ up to this.
TRACE_GAMMA_MAX = 16


def drafted_counts(rounds: pd.DataFrame) -> np.ndarray:
    """Tokens each ``rounds`` row drafted: ``drafted``, or ``gamma`` for records that lack it (int array)."""
    col = "drafted" if "drafted" in rounds.columns else "gamma"
    return rounds[col].to_numpy(int)


def per_position_acceptance(rounds: pd.DataFrame) -> pd.DataFrame:
    """α_i with counts from a ``rounds`` DataFrame (columns ``drafted`` or ``gamma``, ``accepted``).

    α_i = #(accepted ≥ i) / #(accepted ≥ i−1 and drafted ≥ i): a position the
    draft did not propose (a lookup draft may propose fewer than γ tokens, or
    none) was never judged. Records without ``drafted`` use ``gamma``. Returns a
    DataFrame with columns ``position`` (1-based), ``n`` (rounds that reached
    position i), ``accepted`` and ``alpha``.
    """
    import pandas as pd

    out = []
    if len(rounds):
        gam = drafted_counts(rounds)
        g_max = int(gam.max())
        acc = rounds["accepted"].to_numpy(int)
        for i in range(1, g_max + 1):
            reached = (acc >= i - 1) & (gam >= i)
            n = int(reached.sum())
            a = int((reached & (acc >= i)).sum())
            out.append({"position": i, "n": n, "accepted": a, "alpha": a / n if n else float("nan")})
    return pd.DataFrame(out, columns=["position", "n", "accepted", "alpha"])
