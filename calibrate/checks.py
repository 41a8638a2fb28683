"""Checks of what a calibration reads and of what it predicts, each refusal one line naming the file and the fault.

**What a run holds** (:func:`check_tables`, :func:`check_finished_count`).
Before anything is fitted, every table a calibration reads is held to what its
writer could have written (:mod:`toolkit.tables`): no row written twice (a
duplicated cell row moved a held-out MAPE from 4.4% to 21.6%, issue 43), every
value a finite number in its range (a speedup of ``inf``, a baseline of 0 tok/s,
a rank beyond the ranks the draft recorded, a depth below 1), every finished
cell with its rows in the other tables, and — for a complete run — as many
finished cells as ``run.json`` recorded when the run closed (a ``cells.csv``
that lost its last row was calibrated on the rest). The rules of a table are
written once here, per table (:data:`CHAIN_TABLES`, :data:`TREE_TABLES`), and
used for chain runs (:mod:`calibrate.dataset`) and tree runs
(:mod:`calibrate.trees`) alike.

**What a calibration predicts: a speedup curve cannot jump.** From γ to γ + 1 a round gains one draft step
and one more verified token. A round of γ ≥ 1 already holds at least one
draft step and one verified token, so — when a forward of more tokens takes
no less time — the round's time grows by at most its own time, and never
shrinks; its expected tokens never fall (a longer draft loses no accepted
token) and grow by at most one, no more than it had. So the predicted
speedup can at most halve and at most double from one γ to the next. A curve
that does more (issue #28: 1.62× at γ = 4, 0.07× at γ = 5, from one cost point
timed while the machine was busy) rests on a cost table no physical forward
has; :func:`curve_jumps` names it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import pandas as pd

from measure.records import extension_status
from toolkit.tables import Column, check_unique, check_values

#: The most a predicted speedup may change by (either way) from γ to γ + 1 (module docstring).
MAX_STEP = 2.0


def curve_jumps(curves: pd.DataFrame, max_step: float = MAX_STEP) -> list[str]:
    """One note per predicted speedup curve (``Calibrator.curves``: run, series, method, gamma,
    predicted_speedup) whose speedup changes by more than ``max_step`` times between neighbouring γ."""
    notes: list[str] = []
    if curves.empty:
        return notes
    for (run, series, method), sub in curves.groupby(["run", "series", "method"], sort=True):
        sub = sub.sort_values("gamma")
        g, v = sub["gamma"].to_numpy(), sub["predicted_speedup"].to_numpy(float)
        for i in range(1, len(v)):
            if g[i] != g[i - 1] + 1 or not (v[i] > 0 and v[i - 1] > 0):
                continue
            step = v[i] / v[i - 1]
            if step > max_step or step < 1 / max_step:
                notes.append(
                    f"{run}: the predicted speedup curve of {series} ({method}) jumps from {v[i - 1]:.2f}x at "
                    f"γ = {g[i - 1]} to {v[i]:.2f}x at γ = {g[i]}: no cost model allows that (one more draft "
                    f"token can at most halve or double a speedup); look at its cost table near {g[i] + 1} tokens "
                    "(cost_target.csv) for a point timed while the machine was busy")
                break
    return notes


# -- what a run holds ------------------------------------------------------------------------------------------
#: Ranks the counterfactual record keeps per ranked node (``measure.trees.loop.RANKED``; ``tree_ranks.csv``).
MAX_RANKS = 8


@dataclass(frozen=True)
class TableRules:
    """How the rows of one table must look: the ``key`` no two rows share (empty: not checked) and each
    column's values."""

    key: tuple[str, ...]
    columns: tuple[Column, ...]


def _count(name: str, lo: int = 0, hi: int | None = None, required: bool = True) -> Column:
    return Column(name, lo=lo, hi=hi, integer=True, required=required)


def _positive(name: str, required: bool = True) -> Column:
    return Column(name, lo=0.0, lo_open=True, required=required)


def _nonnegative(name: str, required: bool = True) -> Column:
    return Column(name, lo=0.0, required=required)


_GENERATION_VALUES = (_count("prompt_tokens", 1), _count("new_tokens", 1), _positive("wall_s"),
                      _positive("tokens_per_s"), _nonnegative("ttft_ms", required=False))
_ROUND_VALUES = (_count("gamma"), _count("context_tokens", 1), _count("drafted"), _count("accepted"),
                 _nonnegative("draft_ms"), _nonnegative("verify_ms"), _nonnegative("overhead_ms"))
_CELL_VALUES = (_count("n_prompts", 1), _positive("tokens_per_s_baseline"), _positive("tokens_per_s_speculative"),
                _positive("speedup"), Column("speedup_lo", required=False), Column("speedup_hi", required=False),
                _nonnegative("mean_accepted_per_round", required=False), _count("n_rounds", required=False))
_COST_VALUES = (_count("n_tokens", 1), _nonnegative("context_tokens"), _positive("ms"))

#: A chain run's tables (``python -m measure``): values only — rows written twice or missing are
#: :func:`measure.records.damaged_cells`' (the check a resume makes), and a schema-1 run has no repeat to key on.
CHAIN_TABLES: dict[str, TableRules] = {
    "cells": TableRules((), (*_CELL_VALUES, Column("acceptance_rate", lo=0.0, hi=1.0, required=False),
                             _positive("tokens_per_s_peer", required=False))),
    "generations": TableRules((), _GENERATION_VALUES),
    "rounds": TableRules((), _ROUND_VALUES),
}
#: A tree run's tables (``python -m measure tree``, docs/RUN_FORMAT.md "Tree runs").
TREE_TABLES: dict[str, TableRules] = {
    "tree_cells": TableRules(("cell_id",), (*_CELL_VALUES, _count("depth", 1), _count("topk", 1), _count("budget", 1),
                                            _count("repeats", 1))),
    "generations": TableRules(("cell_id", "prompt_id", "repeat", "mode"), _GENERATION_VALUES),
    "rounds": TableRules(("cell_id", "prompt_id", "repeat", "round"), _ROUND_VALUES),
    "tree_nodes": TableRules(("cell_id", "prompt_id", "repeat", "round", "node"),
                             (_count("node"), _count("parent", -1), _count("depth", 1), _count("rank"),
                              _count("accepted", 0, 1))),
    "tree_ranks": TableRules(("cell_id", "prompt_id", "repeat", "round", "depth"),
                             (_count("depth", 1), _count("rank", -1, MAX_RANKS - 1), _count("candidates", 0, MAX_RANKS))),
    "cost_target": TableRules((), _COST_VALUES),
    "cost_draft": TableRules((), (_nonnegative("context_tokens"), _positive("ms"))),
}


def check_tables(path: Path, tables: Mapping[str, pd.DataFrame], rules: Mapping[str, TableRules]) -> None:
    """Every table of ``tables`` (read from ``path/<name>.csv``, rows in file order) held to its ``rules``: one
    ``ValueError`` line naming the file, the line and the fault (:mod:`toolkit.tables`)."""
    for name, frame in tables.items():
        rule = rules.get(name)
        if rule is None or frame.empty:
            continue
        where = str(path / f"{name}.csv")
        check_values(frame, where, rule.columns)
        if rule.key:
            check_unique(frame, where, rule.key)


def check_finished_count(path: Path, meta: Mapping[str, object], cell_ids: pd.Series, table: str) -> None:
    """A complete run holds as many finished cells (distinct ``cell_ids`` of ``table``) as ``run.json``'s
    ``n_finished_cells`` recorded when it closed; else one line naming both counts (a row lost or added since)."""
    recorded = meta.get("n_finished_cells")
    if meta.get("status") != "complete" or not isinstance(recorded, int) or isinstance(recorded, bool) \
            or extension_status(meta)[1]:  # an unfinished extension may have closed between a row and run.json
        return
    have = int(cell_ids.nunique())
    if have != recorded:
        raise ValueError(f"{path / f'{table}.csv'}: {have} finished cell(s), but run.json recorded {recorded} when "
                         f"the run closed (n_finished_cells): the table {'lost' if have < recorded else 'gained'} "
                         "rows since; restore it, or measure the run again")


def check_tree_run(path: Path, meta: Mapping[str, object], tables: Mapping[str, pd.DataFrame]) -> None:
    """A tree run's tables (``tree_cells`` and the tables of :data:`TREE_TABLES`) before anything is fitted:
    the files calibrate needs, each table's rules, every rank within what the draft ranked and every depth within
    its cell's, every finished cell with all its generations and rounds, and the count ``run.json`` recorded."""
    cells = tables["tree_cells"]
    needed = ["generations", "rounds"] + (["tree_nodes", "tree_ranks"] if (cells["loop"] == "tree").any() else [])
    for name in needed:
        if tables[name].empty:
            raise ValueError(f"{path / f'{name}.csv'}: {'missing' if not (path / f'{name}.csv').is_file() else 'no rows'}"
                             f"; calibrate trees needs it for the {len(cells)} finished cell(s) of tree_cells.csv: "
                             "measure the run again")
    check_tables(path, tables, TREE_TABLES)
    check_finished_count(path, meta, cells["cell_id"], "tree_cells")
    _check_ranks(path, tables["tree_ranks"], dict(zip(cells["cell_id"], cells["depth"])))
    _check_cell_rows(path, cells, tables["generations"], tables["rounds"])


def _check_ranks(path: Path, ranks: pd.DataFrame, depth_of: Mapping[str, float]) -> None:
    """Each rank below the number of candidates ranked there (or −1: none of them), each depth within its
    cell's tree and the bonus position after it, each cell one of ``tree_cells.csv``'s."""
    if ranks.empty:
        return
    where = path / "tree_ranks.csv"
    bad = (ranks["rank"] >= ranks["candidates"]) & (ranks["rank"] != -1)
    if bad.any():
        i = bad.index[bad.to_numpy().argmax()]
        raise ValueError(f"{where}: line {i + 2}: rank {ranks.at[i, 'rank']} of {ranks.at[i, 'candidates']} "
                         "candidates ranked there; valid: -1 (none of them) to candidates - 1")
    cell_depth = ranks["cell_id"].map(depth_of)
    if cell_depth.isna().any():
        i = cell_depth.index[cell_depth.isna().to_numpy().argmax()]
        raise ValueError(f"{where}: line {i + 2}: cell {ranks.at[i, 'cell_id']!r} is not a finished cell of "
                         "tree_cells.csv")
    deep = ranks["depth"] > cell_depth + 1
    if deep.any():
        i = deep.index[deep.to_numpy().argmax()]
        raise ValueError(f"{where}: line {i + 2}: depth {ranks.at[i, 'depth']} beyond its cell's tree (depth "
                         f"{cell_depth[i]:g}, then the bonus position)")


def _check_cell_rows(path: Path, cells: pd.DataFrame, gens: pd.DataFrame, rounds: pd.DataFrame) -> None:
    """Each finished cell has its ``n_prompts × repeats`` generations of each mode (baseline, speculative) and
    its ``n_rounds`` rounds."""
    n_gens = gens.groupby("cell_id").size()
    n_rounds = rounds.groupby("cell_id").size()
    for c in cells.itertuples():
        want = int(c.n_prompts) * int(c.repeats) * 2
        if int(n_gens.get(c.cell_id, 0)) != want:
            raise ValueError(f"{path / 'generations.csv'}: {int(n_gens.get(c.cell_id, 0))} of the {want} generations "
                             f"of finished cell {c.cell_id!r} (tree_cells.csv: {int(c.n_prompts)} prompts x "
                             f"{int(c.repeats)} repeats x baseline and speculative)")
        if pd.notna(c.n_rounds) and int(n_rounds.get(c.cell_id, 0)) != int(c.n_rounds):
            raise ValueError(f"{path / 'rounds.csv'}: {int(n_rounds.get(c.cell_id, 0))} of the {int(c.n_rounds)} "
                             f"rounds of finished cell {c.cell_id!r} (tree_cells.csv n_rounds)")
