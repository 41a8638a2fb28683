"""Hold-out folds: which cells are predicted from models fitted on the others (leave one group out).

``gamma`` (one fold per γ policy), ``domain``, ``k`` (kept-vocabulary K) or
``none``; ``auto`` chooses (:func:`choose_holdout`) and says why in one line.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

#: Hold-out modes that split the cells into folds (``auto`` resolves to one of them).
FOLD_MODES: tuple[str, ...] = ("gamma", "domain", "k", "none")
HOLDOUT_MODES: tuple[str, ...] = ("auto", *FOLD_MODES)


_FOLD_COLUMN = {"gamma": "gamma_policy", "domain": "domain", "k": "head_k"}
_FOLD_NOUN = {"gamma": "γ policies", "domain": "domains", "k": "kept-vocabulary K values"}


def _fold_values(cells: pd.DataFrame, mode: str) -> list:
    values = cells[_FOLD_COLUMN[mode]].dropna().unique()
    return sorted(values, key=lambda v: (str(type(v)), v))


@dataclass(frozen=True)
class HoldoutChoice:
    """The hold-out mode a calibration uses and, when ``auto`` chose it, the one line saying why."""

    mode: str
    requested: str
    note: str

    @property
    def adapted(self) -> bool:
        """True when ``auto`` fell back from the usual leave-one-γ-out (the note then goes into calibration.json)."""
        return self.requested == "auto" and self.mode != "gamma"


def _list(values: list) -> str:
    return ", ".join(str(int(v)) if isinstance(v, float) and v.is_integer() else str(v) for v in values)


def choose_holdout(cells: pd.DataFrame, requested: str = "auto") -> HoldoutChoice:
    """Resolve ``requested`` (``auto`` or a mode of :data:`FOLD_MODES`) against the cells.

    ``auto``: leave one γ policy out when there are two or more; otherwise one
    domain, then one K; else nothing (in-sample only). A mode named explicitly
    that the cells cannot support raises ``ValueError`` naming the modes that
    would work.
    """
    if requested not in HOLDOUT_MODES:
        raise ValueError(f"unknown --holdout {requested!r}; valid: {', '.join(HOLDOUT_MODES)}")
    counts = {m: _fold_values(cells, m) for m in _FOLD_COLUMN}
    possible = [m for m in _FOLD_COLUMN if len(counts[m]) >= 2]
    if requested != "auto":
        if requested != "none" and requested not in possible:
            found = counts[requested]
            fix = " or ".join(f"--holdout {m} ({len(counts[m])} {_FOLD_NOUN[m]})" for m in possible)
            raise ValueError(
                f"--holdout {requested}: need at least 2 distinct {_FOLD_COLUMN[requested]} values to hold one "
                f"out, found {len(found)} ({_list(found) or 'none'}); use {fix + ' or ' if fix else ''}"
                "--holdout none (in-sample only), or leave --holdout out to let calibrate choose")
        return HoldoutChoice(requested, requested, f"hold-out: {requested} (--holdout {requested})")
    if "gamma" in possible:
        return HoldoutChoice("gamma", "auto", f"hold-out: gamma (the default: each of the {len(counts['gamma'])} "
                                              "γ policies predicted from the others)")
    gammas = _list(counts["gamma"]) or "none"
    for mode in ("domain", "k"):
        if mode in possible:
            return HoldoutChoice(mode, "auto", (
                f"hold-out: {mode}, not gamma (the run has one γ policy, {gammas}): each of the "
                f"{len(counts[mode])} {_FOLD_NOUN[mode]} predicted from the others; measure a second γ "
                "(--gamma 2,4) to hold out by γ"))
    return HoldoutChoice("none", "auto", (
        f"hold-out: none (one γ policy, {gammas}, one domain, {_list(counts['domain']) or 'none'}: nothing to hold "
        "out); the errors below are in-sample only; measure a second γ (--gamma 2,4) for a held-out check"))


def holdout_folds(cells: pd.DataFrame, mode: str) -> list[tuple[str, pd.Series]]:
    """Leave-one-group-out folds: (label, boolean mask of the held-out cells); ``mode`` may be ``auto``."""
    mode = choose_holdout(cells, mode).mode
    if mode == "none":
        return []
    col = _FOLD_COLUMN[mode]
    return [(f"{col}={v}", cells[col] == v) for v in _fold_values(cells, mode)]




HOLDOUT_EXPLANATION = {
    "gamma": "leave-one-γ-policy-out: each γ's cells predicted from acceptance, overhead, in-loop scales and "
             "prefill fitted on the other γ's cells; cost_target/cost_draft micro-benchmarks (γ-independent) shared",
    "domain": "leave-one-domain-out: acceptance of the held-out domain pooled from the same draft's other domains; "
              "cost micro-benchmarks (domain-independent) shared",
    "k": "leave-one-K-out: acceptance interpolated in log K between training K's; the held-out K's cost_draft rows "
         "dropped, its draft step from the K-term of the draft fit",
    "none": "no held-out cells; in-sample only",
}
