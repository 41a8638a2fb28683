"""Kinds of run — chains, head sweeps, token trees, serving — as small registered records; the one reader of a
run's kind; the one way any kind opens its run directory.

Torch-free, in the run-format layer (``calibrate`` and ``reports`` read it). A :class:`RunKind` says what
a run directory of that kind holds (its tables and their row types, the table whose row marks a unit
finished), what identifies a unit (its identity type), whether a run of it resumes and takes ``--extend``,
and where its calibration and report go (the command that calibrates it, the calibration's file and
folder). :data:`RUN_KINDS` is the registry.

* :func:`kind_of` / :func:`read_kind` are the only readers of a run's kind (``run.json`` ``config.kind``);
  a run whose config names no kind — the chain sweep recorded none before this registry — reads as a chain;
  an unknown name is one line naming the known ones. :meth:`RunKind.stamp` is the only writer.
* :func:`open_run_dir` opens (or resumes) a run directory for every kind: ``--force-new`` sets the old run
  aside while holding its lock (:func:`set_aside`), a run of another kind is refused under the lock, and
  :class:`measure.records.RunWriter` takes the lock, checks the fingerprint (and the kind's ``plan``:
  ``--extend`` of a chain sweep, :mod:`measure.runplan`) and resumes.

Adding a kind of run is one entry here — its tables' row types in :mod:`measure.rows`, its identity in
:mod:`measure.ids` — plus its own loop, and its sections in ``calibrate`` and ``reports``
(``docs/ARCHITECTURE.md``, "Kinds of run").
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from measure.records import RUN_JSON, RunWriter, acquire_run_lock, has_measured_data, utc_now
from measure.ids import CellId, TreeCellId, UnitId
from measure.rows import (CellRow, CostDraftRow, CostTargetRow, GenerationRow, HeadSweepRow, ProfileRow, RequestRow,
                          RoundRow, Row, StepCostRow, TokenLatencyRow, TokenRow, TraceRow, TreeCellRow, TreeNodeRow,
                          TreeRankRow, UnitRow)

#: The ``run.json`` ``config`` key that names a run's kind (read by :func:`kind_of` only, written by
#: :meth:`RunKind.stamp` only).
KIND_KEY = "kind"


@dataclass(frozen=True)
class RunKind:
    """One kind of run: what its run directory holds and where its calibration and report go."""

    name: str  # on disk: run.json config.kind
    title: str  # in words: "tree run"
    command: str  # the command that measures one
    rows: tuple[type[Row], ...]  # the row type of each of its tables (measure.rows), the finishing one first
    identity: type  # what identifies a unit (its cell_id column): measure.ids.CellId, TreeCellId, ...
    resumes: bool  # re-running its command into the same directory resumes it
    extends: bool  # its command takes --extend (add units to a finished run)
    calibrate_command: str  # the command that calibrates it
    calibration_file: str  # the file a calibration of it is recognised by
    calibration_dir: str  # the folder inside the run its calibration goes to by default

    @property
    def tables(self) -> tuple[str, ...]:
        """Its tables' names (``<table>.csv``)."""
        return tuple(r.table for r in self.rows)

    @property
    def finish_table(self) -> str:
        """The table whose row, written last, marks a unit finished."""
        return self.rows[0].table

    def stamp(self, config: Mapping[str, Any]) -> dict:
        """``config`` as ``run.json`` records it for a run of this kind (its kind named)."""
        return {**config, KIND_KEY: self.name}

    def __str__(self) -> str:
        return self.name


_CHAIN_ROWS = (CellRow, GenerationRow, RoundRow, TokenLatencyRow, TraceRow, CostTargetRow, CostDraftRow)

CHAIN = RunKind("chain", "chain sweep", "python -m measure", _CHAIN_ROWS, CellId, resumes=True, extends=True,
                calibrate_command="python -m calibrate", calibration_file="calibration.json",
                calibration_dir="calibration")
HEAD_SWEEP = RunKind("head_sweep", "head sweep", "python -m measure head-sweep",
                     _CHAIN_ROWS + (HeadSweepRow, ProfileRow), CellId, resumes=True, extends=False,
                     calibrate_command="python -m calibrate", calibration_file="calibration.json",
                     calibration_dir="calibration")
TREES = RunKind("trees", "tree run", "python -m measure tree",
                (TreeCellRow, GenerationRow, RoundRow, TreeNodeRow, TreeRankRow, CostTargetRow, CostDraftRow),
                TreeCellId, resumes=True, extends=False, calibrate_command="python -m calibrate trees",
                calibration_file="tree_calibration.json", calibration_dir="calibration")
SERVE = RunKind("serve", "serving run", "python -m measure serve", (UnitRow, RequestRow, TokenRow, StepCostRow),
                UnitId, resumes=True, extends=True, calibrate_command="python -m calibrate serve",
                calibration_file="serve_calibration.json", calibration_dir="calibration-serve")

#: Every kind of run, by its name on disk.
RUN_KINDS: Mapping[str, RunKind] = {k.name: k for k in (CHAIN, HEAD_SWEEP, TREES, SERVE)}


def kind_of(meta: Mapping[str, Any]) -> RunKind:
    """The kind of the run whose ``run.json`` is ``meta``: its ``config.kind``, a chain when it names none (schema 1
    and 2 runs written before the chain sweep recorded its kind); one-line ``ValueError`` for an unknown name, and
    for a schema-3 run that names none (schema 3 records every run's kind: ``measure/FORMAT_HISTORY.md``)."""
    config = meta.get("config")
    name = config.get(KIND_KEY) if isinstance(config, Mapping) else None
    if name is None:
        schema = meta.get("schema_version")
        if isinstance(schema, int) and schema >= 3:
            raise ValueError(f"run.json config names no kind; a schema-{schema} run records it (valid: "
                             f"{', '.join(RUN_KINDS)})")
        return CHAIN
    if not isinstance(name, str) or name not in RUN_KINDS:
        raise ValueError(f"run.json config.kind {name!r} is not a kind of run this specscope knows; valid: "
                         f"{', '.join(RUN_KINDS)}")
    return RUN_KINDS[name]


def read_kind(path: str | os.PathLike) -> RunKind | None:
    """The kind of the run directory ``path`` (:func:`kind_of`); None when it holds no ``run.json`` that parses as
    a JSON object (its other checks are :func:`measure.records.read_meta`'s, when the run is loaded)."""
    try:  # a bare NaN (older writers) reads as null, as read_meta reads it
        meta = json.loads((Path(path) / RUN_JSON).read_text(encoding="utf-8"), parse_constant=lambda _c: None)
    except (OSError, ValueError):
        return None
    return kind_of(meta) if isinstance(meta, dict) else None


def _refuse_other_kind(kind: RunKind, path: Path, meta: Mapping[str, Any]) -> None:
    """A run of another kind in ``path`` is never resumed as one of ``kind`` (a run that recorded no config yet
    — stopped before it wrote one — belongs to no kind)."""
    if not meta.get("config"):
        return
    found = kind_of(meta)
    if found is not kind:
        raise ValueError(f"--out {str(path)!r} holds a {found.title} ({found.command}), not a {kind.title}; choose a "
                         "new directory, or --force-new to set it aside")


def set_aside(path: str | os.PathLike) -> Path | None:
    """``--force-new``: move an existing run directory to ``<path>.replaced-<UTC>`` (nothing is deleted); None when
    there is nothing to move.

    Holds the directory's lock while it renames it: a run another process is writing is refused
    (:class:`measure.records.RunLocked`), never moved away under it.
    """
    path = Path(path)
    if not path.is_dir() or not ((path / RUN_JSON).exists() or has_measured_data(path)):
        return None
    fd = acquire_run_lock(path)
    try:
        dest = path.with_name(f"{path.name}.replaced-{utc_now().replace(':', '')}")
        path.rename(dest)
    finally:
        os.close(fd)
    return dest


Plan = Callable[[Mapping[str, Any] | None], Any]


def open_run_dir(kind: RunKind, path: str | os.PathLike, *, fingerprint: Mapping[str, Any] | None = None,
                 meta: Mapping[str, Any] | None = None, force_new: bool = False, extend: bool = False,
                 plan: Plan | None = None, say: Callable[[str], None] = lambda _m: None) -> RunWriter:
    """Open ``path`` for a run of ``kind``, or resume the run of that kind there; returns its writer, holding the
    directory's lock.

    ``force_new`` (``--force-new``) first sets an existing run aside under its lock (:func:`set_aside`);
    ``extend`` (``--extend``) is refused with it, and for a kind that does not extend. The
    :class:`measure.records.RunWriter` then takes the lock and, under it, refuses a run of another kind, calls
    ``plan`` with the stored ``run.json`` (None: no run yet; a chain sweep's cells and ``--extend``,
    :mod:`measure.runplan`), checks ``fingerprint`` (:class:`measure.records.FingerprintMismatch`, nothing
    written) and resumes. A new run records its kind at once. What opening repaired or set aside is ``say``-d.
    """
    out = Path(path)
    if extend and force_new:
        raise ValueError("--extend adds to the run in --out; --force-new starts a new one there: give one of them")
    if extend and not kind.extends:
        raise ValueError(f"--extend: a {kind.title} cannot be extended; valid for: "
                         f"{', '.join(k.command for k in RUN_KINDS.values() if k.extends)}")
    if force_new:
        moved = set_aside(out)
        if moved is not None:
            say(f"--force-new: the previous run is kept in {moved}")

    def check(stored: Mapping[str, Any] | None) -> Any:
        if stored is not None:
            _refuse_other_kind(kind, out, stored)
        return plan(stored) if plan is not None else None

    if meta is not None and isinstance(meta.get("config"), Mapping):
        meta = {**meta, "config": kind.stamp(meta["config"])}
    writer = RunWriter(out, meta=meta, fingerprint=fingerprint, plan=check, finish_table=kind.finish_table,
                       new_config=kind.stamp({}))
    if not writer.resumed:
        writer.update(config=kind.stamp(writer.meta.get("config") or {}))
    for note in writer.repairs:
        say(note)
    return writer


__all__ = ["CHAIN", "HEAD_SWEEP", "KIND_KEY", "RUN_KINDS", "SERVE", "TREES", "RunKind", "kind_of", "open_run_dir",
           "read_kind", "set_aside"]
