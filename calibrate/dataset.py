"""The runs a calibration reads: every run directory's tables stacked, keyed by cell, checked on load.

:func:`load_runs` validates each run (complete, not damaged, one machine) and
stacks ``cells``, ``rounds``, ``generations`` and ``traces`` with a ``run``
column and a cell ``key`` (``<run>/<cell_id>``); :func:`rows_of` selects a keyed
table's rows by cell.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from calibrate.checks import CHAIN_TABLES, check_finished_count, check_tables
from measure.records import Run, damaged_cells, hardware_label, load_run


def as_float(v: Any) -> float:  # Any: a table cell of any dtype, checked at run time
    """``v`` as a float; NaN for what is not a number (an empty CSV field, None)."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return float("nan")
    return x



def k_key(v: Any) -> float | None:  # Any: a ``head_k`` cell (number, None or NaN)
    """A kept-vocabulary K as a float key; None for a full head (None, NaN)."""
    return None if v is None or (isinstance(v, float) and math.isnan(v)) or pd.isna(v) else float(v)


@dataclass(frozen=True)
class Dataset:
    """Every run's tables stacked, with a ``run`` column naming the run directory."""

    runs: dict[str, Run]
    cells: pd.DataFrame
    rounds: pd.DataFrame
    generations: pd.DataFrame
    traces: pd.DataFrame
    notes: tuple[str, ...] = ()


# long: a long docstring of the refusals; the body checks each run in turn, one refusal per check
def load_runs(paths: list[str | Path], allow_incomplete: bool = False, pool_hardware: bool = False,
              exclude_damaged: bool = False) -> Dataset:
    """Load run directories (validated by :func:`measure.records.load_run`).

    One-line ``ValueError`` for a missing directory, a bad file, or a run
    that is not ``complete`` (running, interrupted, failed — a dead writer
    reads as interrupted) unless ``allow_incomplete``; for a run with a
    finished cell whose rows are incomplete or written twice
    (:func:`measure.records.damaged_cells`, the check a resume makes) unless
    ``exclude_damaged``, which leaves those cells out and names them; for a
    value no writer writes (:data:`calibrate.checks.CHAIN_TABLES`: a speedup of
    ``inf``, a baseline of 0 tok/s) or a complete run with fewer or more finished
    cells than its ``run.json`` recorded (:func:`calibrate.checks.check_finished_count`). The
    same run given twice (same directory, or a copy with the same
    ``run_id``) is counted once, with a note in ``Dataset.notes``.
    """
    if not paths:
        raise ValueError("give at least one run directory")
    runs: dict[str, Run] = {}
    seen: dict[str, str] = {}
    notes: list[str] = []
    excluded: dict[str, set[str]] = {}
    for p in paths:
        p = Path(p)
        run = load_run(p)
        ident = f"{p.resolve()}"
        if ident in seen or run.run_id in seen:
            notes.append(f"{p} given twice (same run as {seen.get(ident) or seen.get(run.run_id)}): counted once")
            continue
        status = run.status
        if status != "complete":
            why = f" ({run.status_note})" if run.status_note else ""
            if not allow_incomplete:
                raise ValueError(f"{p}: run is {status}{why}, not complete; finish it (re-run measure with the same "
                                 "--out) or pass --allow-incomplete")
            notes.append(f"{p}: run is {status}{why}; used as is (--allow-incomplete)")
        if run.extension_status[1]:  # an unfinished extension: the run's cells are complete, some added ones missing
            notes.append(f"{p}: {run.extension_status[1]}; its finished cells are used")
        if not (p / "generations.csv").exists():
            raise ValueError(f"{p}: no generations.csv (a run written before measure recorded every generation); "
                             "calibrate needs it for prompt lengths and prefill times: re-measure with python -m measure")
        damage = damaged_cells(p, run.meta.get("config"))
        if damage:
            named = "; ".join(f"{d.cell_id}: {d.reason}" for d in damage[:3]) + (" ..." if len(damage) > 3 else "")
            if not exclude_damaged or any(d.cell_id == "*" for d in damage):
                raise ValueError(f"{p}: {len(damage)} finished cell(s) have damaged rows ({named}); re-run measure "
                                 "with the same --out to re-measure them" +
                                 ("" if any(d.cell_id == "*" for d in damage) else ", or pass --exclude-damaged"))
            notes.append(f"{p}: left out {len(damage)} damaged cell(s) (--exclude-damaged): {named}")
        check_tables(p, {t: run.table(t) for t in CHAIN_TABLES}, CHAIN_TABLES)
        check_finished_count(p, run.meta, run.table("cells")["cell_id"], "cells")
        label = p.resolve().name or "run"
        base, i = label, 2
        while label in runs:
            label = f"{base}-{i}"
            i += 1
        runs[label] = run
        excluded[label] = {d.cell_id for d in damage}
        seen[ident] = seen[run.run_id] = str(p)

    def stack(name: str) -> pd.DataFrame:
        frames = [r.table(name).assign(run=label) for label, r in runs.items()]
        frames = [f[~f["cell_id"].isin(excluded[label])] if excluded[label] else f
                  for f, label in zip(frames, runs)]
        frames = [f for f in frames if len(f)]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    cells = stack("cells")
    if cells.empty:
        raise ValueError(f"no finished cells (cells.csv) in {', '.join(str(p) for p in paths)}")
    cells["head_k"] = cells["head_k"].map(k_key)
    cells["temperature"] = cells["temperature"].astype(float)
    cells["unstable"] = cells["unstable"].map(lambda v: v is True) if "unstable" in cells else False
    notes += _check_hardware(cells, runs, pool_hardware)
    return Dataset(runs, with_key(cells), with_key(stack("rounds")), with_key(stack("generations")),
                   with_key(stack("traces")), tuple(notes))


def with_key(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with its rows' cell ``key`` (``<run>/<cell_id>``, unique across runs), computed once on load."""
    if table.empty:
        return table
    return table.assign(key=table["run"] + "/" + table["cell_id"].astype(str))


def rows_of(table: pd.DataFrame, keys) -> pd.DataFrame:
    """The rows of a keyed table (:func:`with_key`) that belong to the cells ``keys``, in table order."""
    return table if table.empty else table[table["key"].isin(set(keys))]


def _check_hardware(cells: pd.DataFrame, runs: dict[str, Run], pool: bool) -> list[str]:
    """Fill ``cells["hardware"]`` (a cell's own, else its run's) and refuse cells from several machines.

    Timings from different hardware do not belong in one fit (a Ray sweep's
    cells may come from different nodes): one-line ``ValueError`` listing the
    machines, unless ``pool`` (``--pool-hardware``), which is noted instead.
    """
    run_hw = {label: hardware_label(r.meta.get("hardware")) for label, r in runs.items()}
    own = cells["hardware"] if "hardware" in cells else pd.Series([None] * len(cells), index=cells.index)
    cells["hardware"] = [h if isinstance(h, str) and h else run_hw[r] for h, r in zip(own, cells["run"])]
    counts = cells["hardware"].value_counts()
    if len(counts) < 2:
        return []
    listing = "; ".join(f"{hw} ({n} cells)" for hw, n in counts.items())
    if not pool:
        raise ValueError(f"cells measured on {len(counts)} different machines ({listing}): calibrate the cells of one "
                         "machine at a time, or pass --pool-hardware to fit them together anyway")
    return [f"cells of {len(counts)} different machines pooled in one fit (--pool-hardware): {listing}"]


