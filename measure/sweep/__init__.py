"""The measurement sweep: cells of (draft [× head K], γ policy, temperature, domain) into one run directory.

Modules, each importing only those above it in this list:

* :mod:`~measure.sweep.config` — :class:`SweepConfig` (validated on construction), the prompts it selects,
  the engine settings it needs;
* :mod:`~measure.sweep.identity` — the environment and the run's fingerprint;
* :mod:`~measure.sweep.session` — :func:`open_session`, the one way to open a sweep's models (the local
  driver, a Ray worker and the head sweep use it);
* :mod:`~measure.sweep.cost` — the cost curves;
* :mod:`~measure.sweep.cells` — every cell measured by the same code (interleaving, repeats, statistics,
  noise flags, records);
* :mod:`~measure.sweep.summary` — the run's summary;
* :mod:`~measure.sweep.driver` — :func:`run_sweep`, the local driver, and :func:`open_run`.

The names below are this package's public API (``from measure.sweep import run_sweep``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Each public name and the module that defines it: imported when first used (PEP 562), so that reading a constant
#: (``python -m measure``'s parser: its limits and choices) does not load torch with the cells.
_EXPORTS = {name: module for module, names in {
    "cells": ("CellContext", "CellPlan", "Visit", "measure_cells", "rotation", "run_cell"),
    "config": ("INTERLEAVE", "LIBRARY_RATIO_TARGET", "MAX_GAMMA", "MAX_NEW_TOKENS", "MAX_PROMPT_TOKENS", "MAX_REPEATS",
               "MODES", "SweepConfig", "engine_options", "select_prompts"),
    "cost": ("CostCurves", "CostPoint", "cost_curves_for", "cost_points_done", "prompt_lengths", "record_cost",
             "screen_cost"),
    "driver": ("OpenedRun", "PendingCell", "open_run", "pending_cells", "run_sweep"),
    "identity": ("environment", "fingerprint", "source_state", "target_fingerprint"),
    "session": ("Session", "open_session", "prompts_meta", "silenced"),
    "summary": ("cell_estimate", "summarize", "summary_lines", "unstable_message"),
}.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'measure.sweep' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"measure.sweep.{module}"), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from measure.sweep.cells import CellContext, CellPlan, Visit, measure_cells, rotation, run_cell
    from measure.sweep.config import (INTERLEAVE, LIBRARY_RATIO_TARGET, MAX_GAMMA, MAX_NEW_TOKENS, MAX_PROMPT_TOKENS,
                                      MAX_REPEATS, MODES, SweepConfig, engine_options, select_prompts)
    from measure.sweep.cost import (CostCurves, CostPoint, cost_curves_for, cost_points_done, prompt_lengths,
                                    record_cost, screen_cost)
    from measure.sweep.driver import OpenedRun, PendingCell, open_run, pending_cells, run_sweep
    from measure.sweep.identity import environment, fingerprint, source_state, target_fingerprint
    from measure.sweep.session import Session, open_session, prompts_meta, silenced
    from measure.sweep.summary import cell_estimate, summarize, summary_lines, unstable_message

__all__ = [
    "INTERLEAVE", "LIBRARY_RATIO_TARGET", "MAX_GAMMA", "MAX_NEW_TOKENS", "MAX_PROMPT_TOKENS", "MAX_REPEATS", "MODES",
    "CellContext", "CellPlan", "CostCurves", "CostPoint", "OpenedRun", "PendingCell", "Session", "SweepConfig",
    "Visit", "cell_estimate", "cost_curves_for", "cost_points_done", "engine_options", "environment", "fingerprint",
    "measure_cells", "open_run", "open_session", "pending_cells", "prompt_lengths", "prompts_meta", "record_cost",
    "rotation", "run_cell", "run_sweep", "screen_cost", "select_prompts", "silenced", "source_state", "summarize", "summary_lines",
    "target_fingerprint", "unstable_message",
]
