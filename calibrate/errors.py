"""Prediction against measurement: absolute percentage errors, MAPE tables and the share inside the CIs."""

from __future__ import annotations

import pandas as pd


def add_errors(pred: pd.DataFrame) -> pd.DataFrame:
    """Absolute percentage errors of speedup and tokens/s (in %)."""
    p = pred.copy()
    p["ape_speedup_pct"] = 100 * (p["predicted_speedup"] - p["measured_speedup"]).abs() / p["measured_speedup"]
    p["ape_tokens_per_s_pct"] = (100 * (p["predicted_tokens_per_s"] - p["measured_tokens_per_s"]).abs()
                                 / p["measured_tokens_per_s"])
    if "measured_speedup_lo" in p:
        lo, hi, pr = p["measured_speedup_lo"], p["measured_speedup_hi"], p["predicted_speedup"]
        known = lo.notna() & hi.notna() & pr.notna()
        p["inside_ci"] = ((pr >= lo) & (pr <= hi)).where(known, None)
    else:
        p["inside_ci"] = None
    return p


def mape_table(pred: pd.DataFrame) -> dict:
    """{method: {speedup_mape_pct, tokens_per_s_mape_pct, n_cells, n_inside_ci, n_with_ci, share_inside_ci}}.

    Over stable cells only (NaN predictions skipped); unstable cells are in :func:`unstable_table`.
    """
    out = {}
    if "unstable" in pred:
        pred = pred[~pred["unstable"].astype(bool)]
    for m, sub in pred.groupby("method"):
        ok = sub.dropna(subset=["ape_speedup_pct"])
        ci = ok[ok["inside_ci"].notna()] if "inside_ci" in ok else ok.iloc[0:0]
        n_in = int(ci["inside_ci"].astype(bool).sum()) if len(ci) else 0
        out[str(m)] = {
            "speedup_mape_pct": float(ok["ape_speedup_pct"].mean()) if len(ok) else None,
            "tokens_per_s_mape_pct": float(ok["ape_tokens_per_s_pct"].mean()) if len(ok) else None,
            "n_cells": int(len(ok)),
            "n_inside_ci": n_in, "n_with_ci": int(len(ci)),
            "share_inside_ci": n_in / len(ci) if len(ci) else None,
        }
    return out


def unstable_table(pred: pd.DataFrame) -> dict:
    """The same numbers as :func:`mape_table` over the unstable cells only (reported apart, never fitted)."""
    if "unstable" not in pred or not pred["unstable"].astype(bool).any():
        return {}
    sub = pred[pred["unstable"].astype(bool)].assign(unstable=False)
    return mape_table(sub)


