"""Calibrate the simulator against run directories and validate it on held-out cells.

Pipeline (:func:`calibrate`):

1. Load every run directory (``measure.records.load_run``) and stack their
   cells; a cell is keyed by ``run`` + ``cell_id``.
2. Split the cells into folds by the ``holdout`` mode — leave one group out:

   * ``gamma``: one fold per γ policy (e.g. ``fixed:4``); a fold's cells are
     predicted from models fitted on every *other* γ's cells only.
   * ``domain``: one fold per domain (acceptance of the held-out domain comes
     from the same draft's rounds in the other domains).
   * ``k``: one fold per kept-vocabulary K of pruned heads (acceptance
     interpolated in log K between the neighbouring training K; draft step
     time from the K-term of the draft fit on the other K's timings).
   * ``none``: no fold; only in-sample numbers.
   * ``auto`` (the default): ``gamma`` when the cells have two or more γ
     policies; otherwise ``domain`` (two or more domains), then ``k`` (two
     or more kept-vocabulary K), else ``none``; :func:`choose_holdout` says
     in one line what it chose and why. A mode named explicitly that the
     cells cannot support is refused in one line naming the modes they can.

   **What is held out and what is not:** acceptance (rounds and traces),
   per-round overhead, the in-loop scale factors and the prefill (TTFT) fit
   come from training cells only (acceptance from every training cell, the
   timing fits from the stable ones only). The micro-benchmark tables
   ``cost_target.csv`` / ``cost_draft.csv`` are measured once per run,
   independently of γ and domain, so they are shared by every fold (for
   ``k`` the held-out K's ``cost_draft`` rows are dropped).
3. For each cell predict speedup and tokens/s three ways: closed form with
   the BIC-chosen acceptance model (``closed_form``), closed form replaying
   the recorded traces (``trace``), and the SimPy event simulator with the
   chosen model (``event_sim``, seeded).
4. Report per-cell absolute percentage errors and MAPE, in-sample (models
   fitted on every cell) and held-out.
5. The all-cell fit is what is written for ``python -m sim``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from calibrate.checks import curve_jumps
from calibrate.dataset import Dataset, load_runs
from calibrate.errors import add_errors, mape_table, unstable_table
from calibrate.fit_acceptance import AcceptanceFit
from calibrate.folds import HOLDOUT_MODES, HoldoutChoice, choose_holdout, holdout_folds
from calibrate.groups import AcceptanceGroup, group_traces, pooled_acceptance
from calibrate.prediction import Calibrator, FoldModels
from sim.acceptance import RunTraceAcceptance

CALIBRATION_SCHEMA_VERSION = 1
#: γ values of the predicted speedup curves.
CURVE_GAMMAS = range(1, 11)


@dataclass(frozen=True)
class CalibrationResult:
    """Everything a calibration produced (written to disk by :func:`write_outputs`)."""

    data: Dataset
    holdout: str  # the mode used (never "auto")
    models: FoldModels  # fitted on every cell
    in_sample: pd.DataFrame
    held_out: pd.DataFrame  # empty for holdout "none"
    mape_in_sample: dict
    mape_held_out: dict
    folds: tuple[dict, ...]
    curves: pd.DataFrame  # predicted speedup against γ per series (all-cell models)
    unstable_held_out: dict = field(default_factory=dict)  # mape_table of the unstable cells, reported apart
    unstable_cells: tuple[str, ...] = ()
    #: per draft, the acceptance fit on all of its cells' rounds (what ``acceptance-<draft>.json`` holds)
    pooled_acceptance: dict[str, AcceptanceFit] = field(default_factory=dict)
    #: per acceptance group, its greedy proposal-run trace (exact replay in ``python -m sim``), where recorded
    group_traces: dict[AcceptanceGroup, RunTraceAcceptance] = field(default_factory=dict)
    #: what ``--holdout`` resolved to, and the one line saying so
    holdout_choice: HoldoutChoice | None = None



def calibrate(paths: list[str | Path], holdout: str = "auto", seed: int = 0,
              allow_incomplete: bool = False, pool_hardware: bool = False,
              exclude_damaged: bool = False) -> CalibrationResult:
    """Fit on the run directories and validate on held-out cells (see module docstring).

    Unstable cells (``cells.csv`` ``unstable``) stay in the cost fit with the
    weight of their variance (the in-loop scales combine cells by inverse
    variance, :func:`calibrate.fit_cost.cell_weighted_ratio`), are left out
    of the prefill fit, and are predicted like the others, but their errors
    are reported apart (``CalibrationResult.unstable_held_out``), never in the
    MAPE. Their acceptance (rounds, traces) is kept in the fits: which tokens
    were accepted does not depend on how fast the machine was. ``holdout``
    ``auto`` is resolved by :func:`choose_holdout`.
    """
    if holdout not in HOLDOUT_MODES:
        raise ValueError(f"unknown --holdout {holdout!r}; valid: {', '.join(HOLDOUT_MODES)}")
    data = load_runs(paths, allow_incomplete=allow_incomplete, pool_hardware=pool_hardware,
                     exclude_damaged=exclude_damaged)
    choice = choose_holdout(data.cells, holdout)
    holdout = choice.mode
    folds = holdout_folds(data.cells, holdout)
    cal = Calibrator(data, seed=seed)
    flagged = data.cells["unstable"].astype(bool)
    stable = ~flagged  # the cells the timing fits use
    if not stable.any():  # a busy machine touches every interleaved cell: fit on all of them, and say so
        stable = flagged
        data = replace(data, notes=data.notes + (
            "every cell is flagged unstable: the prefill fit uses all of them and is as noisy as they are; "
            "re-measure on a quiet machine (measure --until-stable N or more --repeats)",))
    all_models = cal.fit(data.cells[stable], "all", acceptance_train=data.cells, cost_train=data.cells)
    in_sample = add_errors(cal.predict(data.cells, all_models, data.cells))
    held = []
    fold_info = []
    for label, mask in folds:
        train_all, test = data.cells[~mask], data.cells[mask]
        train = train_all[stable[~mask]]
        prefill_train = train if len(train) else train_all
        drop_k = float(test["head_k"].iloc[0]) if holdout == "k" else None
        models = cal.fit(prefill_train, label, drop_k=drop_k, acceptance_train=train_all, cost_train=train_all)
        held.append(cal.predict(test, models, train_all))
        fold_notes = list(models.notes) + ([] if len(train) else [
            "no stable training cell in this fold: the prefill fit uses the unstable ones"])
        fold_info.append({"fold": label, "train_cells": list(prefill_train["key"]),
                          "cost_train_cells": list(train_all["key"]),
                          "acceptance_train_cells": list(train_all["key"]), "test_cells": list(test["key"]),
                          "notes": fold_notes})
    held_out = add_errors(pd.concat(held, ignore_index=True)) if held else pd.DataFrame()
    curves = cal.curves(data.cells, all_models, CURVE_GAMMAS)
    data = replace(data, notes=data.notes + tuple(dict.fromkeys(cal.notes)) + tuple(curve_jumps(curves)))
    return CalibrationResult(data, holdout, all_models, in_sample, held_out, mape_table(in_sample),
                             mape_table(held_out) if len(held_out) else {}, tuple(fold_info), curves,
                             unstable_table(held_out) if len(held_out) else unstable_table(in_sample),
                             tuple(data.cells.loc[flagged, "key"]), pooled_acceptance(data), group_traces(data),
                             choice)
