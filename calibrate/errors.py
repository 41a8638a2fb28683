"""Prediction against measurement: absolute percentage errors, MAPE tables and the share inside the CIs.

:class:`HeldOutError` is the one summary of a quantity's errors over a set of predictions that every
calibrator makes (chains: :func:`mape_table`; trees: :func:`calibrate.trees.error_summary`; serving:
:meth:`calibrate.serve.ServeCalibration.summary`); each writes it under the field names its calibration file
has always used (:meth:`HeldOutError.as_dict`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

import pandas as pd


@dataclass(frozen=True)
class HeldOutError:
    """The error of one quantity's predictions (``speedup``, ``tokens_per_s``, ``e2e_p50_ms``) over ``n_rows``
    rows (cells, groups): the mean and the largest absolute percentage error over the rows that have one (None:
    none has), how many rows had a measured 95% CI and how many predictions fell inside it, and the target the
    MAPE is held to (None: none)."""

    quantity: str
    n_rows: int
    mape_pct: float | None
    max_ape_pct: float | None
    n_with_ci: int
    n_inside_ci: int
    target_pct: float | None = None

    @property
    def share_inside_ci(self) -> float | None:
        """The share of predictions inside the measured CI, of the rows that had one (None: none had)."""
        return self.n_inside_ci / self.n_with_ci if self.n_with_ci else None

    @classmethod
    def of(cls, quantity: str, ape_pct: Iterable[float | None], inside_ci: Iterable[object] = (),
           target_pct: float | None = None) -> "HeldOutError":
        """From each row's APE (None or NaN: no prediction; the row still counts) and each row's ``inside_ci``
        (None or NaN: no measured CI)."""
        ape = pd.Series(list(ape_pct), dtype=float)
        mean, top = ape.mean(), ape.max()  # both skip NaN; NaN when no row has an APE
        inside = [bool(x) for x in inside_ci if x is not None and x == x]
        return cls(quantity, len(ape), None if mean != mean else float(mean), None if top != top else float(top),
                   len(inside), sum(inside), target_pct)

    def as_dict(self, names: Mapping[str, str]) -> dict:
        """``{field name in the file: value}`` for ``names`` (file field → attribute of this error), in order."""
        return {key: getattr(self, attr) for key, attr in names.items()}


#: How a chain calibration's ``mape`` tables name the fields besides the MAPEs (``calibration.json``).
CHAIN_FIELDS = {"n_cells": "n_rows", "n_inside_ci": "n_inside_ci", "n_with_ci": "n_with_ci",
                "share_inside_ci": "share_inside_ci"}


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
        inside = ok["inside_ci"] if "inside_ci" in ok else ()
        speedup = HeldOutError.of("speedup", ok["ape_speedup_pct"], inside)
        tokens = HeldOutError.of("tokens_per_s", ok["ape_tokens_per_s_pct"])
        out[str(m)] = {"speedup_mape_pct": speedup.mape_pct, "tokens_per_s_mape_pct": tokens.mape_pct,
                       **speedup.as_dict(CHAIN_FIELDS)}
    return out


def unstable_table(pred: pd.DataFrame) -> dict:
    """The same numbers as :func:`mape_table` over the unstable cells only (reported apart, never fitted)."""
    if "unstable" not in pred or not pred["unstable"].astype(bool).any():
        return {}
    sub = pred[pred["unstable"].astype(bool)].assign(unstable=False)
    return mape_table(sub)


