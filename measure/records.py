"""The run directory: the one torch-free module that writes and reads it.

Format: ``docs/RUN_FORMAT.md`` (schema 3; schema-1 and -2 runs still load, and a schema-2 run resumes;
``measure/FORMAT_HISTORY.md`` says what each version changed and how older runs are read). ``measure``
writes through :class:`RunWriter`; ``calibrate`` and ``reports`` read through
:func:`load_run`. Imports no torch.

Writing::

    w = RunWriter("runs/x", meta={...}, fingerprint={...})
    if not w.is_finished(cid):
        w.append("rounds", [RoundRow(...), ...])  # typed rows of the cell (measure.rows), as they come
        w.finish_cell(CellRow.make(...))          # last: marks the cell finished
    w.update(summary={...})                      # atomic rewrite of run.json
    w.close("complete")                          # or "interrupted" / "failed"

Reading::

    run = load_run("runs/x")                     # validated: one-line ValueError naming file/row/column
    run.summary; run.status; run.table("cells")  # pandas DataFrame
    run.rows(CellRow)                            # the same as typed rows (measure.rows.CellRow)

Crash safety: every append is one ``write`` of whole lines on an ``O_APPEND``
descriptor; ``run.json`` is rewritten atomically (temp file + rename) with
strict JSON (``null``, never ``NaN``) and carries the writer's ``pid``,
``host`` and a ``heartbeat_utc``, so a reader recognises a run whose process
died as ``interrupted``. SIGTERM is handled like Ctrl-C (:meth:`RunWriter.recording`).

One writer: a :class:`RunWriter` holds an OS lock (``flock`` on
``.specscope.lock``) from before it reads anything until it closes; a second
writer (or ``--force-new``) on a locked directory is refused in one line
naming the holder's pid (:class:`RunLocked`).

Resume: opening a :class:`RunWriter` on a directory that already holds a
``run.json`` compares the stored ``fingerprint`` with the new one (refused in
one line naming the fields that differ), drops a torn last line of every
table, checks every finished cell's rows against what a finished cell must
have (:func:`damaged_cells`: generations, rounds, latencies and traces by
count; its ``cells.csv`` row once) and treats a damaged cell as unfinished —
the tables as they were are first copied to ``damaged-<UTC>/`` with the
reasons, so nothing measured is deleted — then keeps the rows of finished
cells and drops the rows of unfinished ones. A directory with measured data
but no ``run.json`` is refused, not started over.

Extensions: a writer opened with a ``plan`` check (:mod:`measure.runplan`)
that decides to add cells to a complete run (``--extend``) appends an entry
to ``run.json`` ``extensions`` and writes the extension's ``status``,
``pid``, heartbeat, command and config there (:data:`EXTENSION_FIELDS`): the
run's own stay as they were, so an interrupted extension leaves the run
``complete`` and reads ``interrupted`` in its entry (:func:`extension_status`). A sweep that interleaves its cells
stages every finished (prompt, repeat) visit of a cell not finished yet in
``visits.partial.jsonl`` (:meth:`RunWriter.stage`), so an interruption loses
at most the visit that was running; a resume reads them back
(:meth:`RunWriter.staged`) and measures only the missing visits.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as _dt
import fcntl
import io
import json
import math
import os
import shutil
import signal
import socket
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Protocol, TypeVar

from measure.ids import CellId, cell_id  # noqa: F401 — the run format's identities, named here too
from measure.rows import ROW_TYPES, R, Row
from toolkit.jsonio import clean_json, strict_dumps  # noqa: F401 — the run format writes strict JSON

if TYPE_CHECKING:
    import pandas as pd

#: Schema this code writes; :data:`READABLE_SCHEMAS` it reads, :data:`RESUMABLE_SCHEMAS` it resumes
#: (``measure/FORMAT_HISTORY.md``: what each version changed, how older runs are read).
SCHEMA_VERSION = 3
READABLE_SCHEMAS = (1, 2, 3)
#: A schema-2 run resumes as it is: it stays schema 2, and its tables keep the columns they were written with
#: (:meth:`RunWriter.append` refuses rows a table's header lacks columns for).
RESUMABLE_SCHEMAS = (2, 3)
RUN_JSON = "run.json"
#: Finished visits of cells not finished yet (a sweep interleaves its cells; :meth:`RunWriter.stage`).
STAGED_VISITS = "visits.partial.jsonl"
#: Staged lines that failed validation, kept with the reason (never pooled, never deleted).
QUARANTINE = "visits.quarantine.jsonl"
#: Held (``flock``) by the one process writing the run, for as long as it writes.
LOCK_FILE = ".specscope.lock"
#: Where a resume moves what it will not trust (copies of the tables as they were, and why).
DAMAGED_PREFIX = "damaged-"
STATUSES = ("running", "complete", "interrupted", "failed")
#: A ``running`` run whose heartbeat is older than this (and whose pid cannot be checked) is interrupted.
STALE_HEARTBEAT_S = 900.0
#: ``run.json`` fields an extension of a run records in its own ``extensions`` entry (the run's stay as they were).
EXTENSION_FIELDS = ("status", "finished_utc", "error", "interruption", "command", "config", "git_commit", "git_dirty",
                    "system_check")

#: Columns of every table, in order (``docs/RUN_FORMAT.md``), schema 3: the fields of its row type
#: (:mod:`measure.rows`).
TABLE_COLUMNS: dict[str, tuple[str, ...]] = {table: row.columns() for table, row in ROW_TYPES.items()}
#: Columns a schema-1 table has (the schema-2 additions are filled with empty values on read).
_SCHEMA1_EXTRA: dict[str, tuple[str, ...]] = {
    "cells": TABLE_COLUMNS["cells"][18:],
    "generations": ("repeat", "order", "drafted", "accepted", "n_rounds", "tokens",
                    "lossless", "divergence_position", "divergence_margin"),
    "rounds": ("repeat",),
    "token_latency": ("repeat",),
}
#: Columns added while the schema stayed 2: a schema-1 or -2 run written before them still loads (the column
#: reads as empty); schema 3 requires them.
_LATER_COLUMNS: dict[str, tuple[str, ...]] = {
    "cells": ("hardware", "n_near_tie", "n_lossless_failures", "tokens_per_s_library", "tokens_per_s_library_lo",
              "tokens_per_s_library_hi", "baseline_vs_library", "baseline_vs_library_lo", "baseline_vs_library_hi"),
    "generations": ("lossless", "divergence_position", "divergence_margin"),
    "serve_units": ("other_cpu_share", "steal_share"),
}
#: Columns read as text and as true/false (the others must parse as numbers), from the row types' fields.
_BOOL_COLUMNS = {c for row in ROW_TYPES.values() for c, (base, _) in row.column_types().items() if base == "bool"}
_TEXT_COLUMNS = _BOOL_COLUMNS | {c for row in ROW_TYPES.values() for c, (base, _) in row.column_types().items()
                                 if base in ("str", "tuple[int, ...]")}


def hardware_label(hardware: Mapping[str, Any] | None) -> str:
    """A short name of the machine that measured a cell, from a ``run.json``-style hardware dict.

    GPU: its name (``NVIDIA H100 80GB HBM3``); CPU: the CPU model, its cores and
    the torch threads used (``AMD EPYC 7B13, 2 cores, 1 thread``), since the
    thread count changes CPU timings as much as the chip does. ``unknown`` if
    nothing is recorded. Calibration refuses to pool cells of different labels
    unless told to.
    """
    hw = dict(hardware or {})
    if hw.get("gpu"):
        return str(hw["gpu"])
    name = hw.get("device_name") or hw.get("cpu")
    if not name:
        return "unknown"
    parts = [str(name)]
    if hw.get("cores"):
        parts.append(f"{int(hw['cores'])} cores")
    if hw.get("torch_threads"):
        n = int(hw["torch_threads"])
        parts.append(f"{n} thread{'s' if n != 1 else ''}")
    return ", ".join(parts)


def utc_now() -> str:
    """Current UTC time as ``YYYY-MM-DDTHH:MM:SSZ``."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_utc(text: Any) -> float | None:
    try:
        return _dt.datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=_dt.timezone.utc).timestamp()
    except ValueError:
        return None


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _append_bytes(path: Path, data: bytes) -> None:
    """Append ``data`` with one ``write`` on an ``O_APPEND`` descriptor (loop only on a short write)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
    finally:
        os.close(fd)


def _check_table(table: str) -> tuple[str, ...]:
    if table not in TABLE_COLUMNS:
        raise ValueError(f"unknown table {table!r}; valid: {', '.join(TABLE_COLUMNS)}")
    return TABLE_COLUMNS[table]


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this host."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OSError, ValueError, TypeError):
        return False
    return True


def extension_status(meta: Mapping[str, Any]) -> tuple[str, str]:
    """``(status, note)`` of a run's last extension (``("", "")`` without one; the note only when it is not
    complete): the run's own status stays its own (its cells were complete and still are)."""
    exts = meta.get("extensions") or []
    if not exts:
        return "", ""
    st, why = effective_status(exts[-1])
    if st == "complete":
        return st, ""
    added = "; ".join(f"{k} {', '.join(map(str, v))}" for k, v in (exts[-1].get("added") or {}).items())
    return st, (f"its extension {len(exts)} (adding {added}) is {st}{f' ({why})' if why else ''}: the cells it added "
                f"that did not finish are not in the run (re-run {exts[-1].get('command')!r} to finish them)")


def effective_status(meta: Mapping[str, Any]) -> tuple[str, str]:
    """``(status, note)``: a ``running`` run whose writer is gone reads as ``interrupted``.

    Same host: the recorded ``pid`` is checked. Another host (or no pid): a
    heartbeat older than :data:`STALE_HEARTBEAT_S` counts as gone.
    """
    status = str(meta.get("status", ""))
    if status != "running":
        return status, ""
    pid, host = meta.get("pid"), meta.get("host")
    if pid is not None and host == socket.gethostname():
        if int(pid) == os.getpid() or pid_alive(int(pid)):
            return status, ""
        return "interrupted", f"its process (pid {pid}) is gone"
    beat = _parse_utc(meta.get("heartbeat_utc") or meta.get("created_utc"))
    now = _dt.datetime.now(_dt.timezone.utc).timestamp()
    if beat is None or now - beat > STALE_HEARTBEAT_S:
        return "interrupted", f"no heartbeat for over {STALE_HEARTBEAT_S / 60:.0f} min"
    return status, ""


class FingerprintMismatch(ValueError):
    """A resume whose setup differs from the run it would append to (nothing was written)."""


def fingerprint_diff(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> list[str]:
    """``["max_new_tokens 64 -> 32", ...]``: leaf fields that differ between two fingerprints."""
    out: list[str] = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        name = f"{prefix}{k}"
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += fingerprint_diff(a, b, name + ".")
        elif clean_json(a) != clean_json(b):
            def short(v: Any) -> str:
                t = json.dumps(clean_json(v), default=str)
                return t if len(t) <= 40 else t[:37] + "..."
            out.append(f"{name} {short(a)} -> {short(b)}")
    return out


class RunInterrupted(RuntimeError):
    """Something outside the measuring code ended the run — an engine's child process died of a native crash —
    while a visit was in flight: the run is closed ``interrupted`` (finished visits kept, resumable), the
    message recorded in ``run.json`` ``interruption``."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: the run is closed ``interrupted`` and finished cells kept."""


class RunLocked(ValueError):
    """Another process holds the run directory's lock (it is writing that run)."""


def acquire_run_lock(path: Path) -> int:
    """Take the run directory's lock (``flock``, exclusive, not waiting) and write our pid into the lock file;
    :class:`RunLocked` naming the holder when another process has it. Returns the descriptor (close it to
    release)."""
    f_path = path / LOCK_FILE
    fd = os.open(f_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise RunLocked(f"{path}: another specscope process (pid {holder}) is writing this run; wait for it to "
                        "finish, or choose another --out") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def has_measured_data(path: Path) -> bool:
    """Whether ``path`` holds staged visits or a non-empty table (data a run measured)."""
    if (path / STAGED_VISITS).is_file() and (path / STAGED_VISITS).stat().st_size > 0:
        return True
    return any((path / f"{t}.csv").is_file() and (path / f"{t}.csv").stat().st_size > 0 for t in TABLE_COLUMNS)


@dataclass(frozen=True)
class CellDamage:
    """A finished cell whose rows on disk are not what a finished cell has."""

    cell_id: str
    reason: str


def _raw_table(path: Path, table: str) -> tuple[list[str], list[list[str]], int]:
    """(header, rows with the header's field count, other rows) of ``<table>.csv`` as written.

    A last line without its newline is a write cut short (the visit or cell in
    flight, never finished): it is left out, not counted as unreadable.
    """
    f_path = path / f"{table}.csv"
    if not f_path.is_file():
        return [], [], 0
    with f_path.open(newline="", encoding="utf-8", errors="replace") as f:
        lines = [line.replace("\0", "") for line in f]
    if lines and not lines[-1].endswith("\n") and len(lines) > 1:
        lines.pop()
    rows = list(csv.reader(lines))
    if not rows:
        return [], [], 0
    header = rows[0]
    good = [r for r in rows[1:] if len(r) == len(header)]
    return header, good, len(rows) - 1 - len(good)


def _int(text: Any) -> int | None:
    try:
        v = float(text)
    except (TypeError, ValueError):
        return None
    return int(v) if math.isfinite(v) and v == int(v) else None


# long: a long docstring of what a finished cell must have; the body counts each table's rows once, then checks each
#   cell
def damaged_cells(path: str | os.PathLike, config: Mapping[str, Any] | None = None) -> list[CellDamage]:
    """The finished cells (rows of ``cells.csv``) whose rows in the other tables are not complete.

    A finished cell of a sweep has ``n_prompts × repeats`` visits, each with a
    generation of every mode it ran (baseline, speculative; the peer and the
    library baseline when its row has their tokens/s), ``n_rounds`` rounds,
    one latency per new token of its baseline and speculative generations, and
    (``config["traces"]``, default on) one trace value per new token of its
    repeat-0 baseline per prompt. Checks need the fields a row has (rows of
    older runs without them are not checked on those counts). A ``cells.csv``
    that cannot be read makes every cell of the other tables suspect: each is
    named. Reads the CSV text (no pandas), so a writer can run it before trusting anything.
    """
    path = Path(path)
    cfg = dict(config or {})
    header, cells, torn = _raw_table(path, "cells")
    written = (path / "cells.csv").is_file() and (path / "cells.csv").stat().st_size > 0
    if written and "cell_id" not in header:
        gh, gens, _ = _raw_table(path, "generations")
        ids = sorted({r[gh.index("cell_id")] for r in gens}) if "cell_id" in gh else []
        return [CellDamage(c, "cells.csv cannot be read (no header)") for c in ids] or \
            [CellDamage("*", "cells.csv cannot be read (no header)")]
    if not header:
        return []
    col = {c: i for i, c in enumerate(header)}
    by_cell: dict[str, list[list[str]]] = {}
    for r in cells:
        by_cell.setdefault(r[col["cell_id"]], []).append(r)
    tables = {t: _raw_table(path, t) for t in ("generations", "rounds", "token_latency", "traces")}
    counts: dict[str, dict[str, int]] = {t: {} for t in tables}
    base_tokens: dict[str, int] = {}
    lat_tokens: dict[str, int] = {}
    trace_tokens: dict[str, int] = {}
    for t, (h, rows, _) in tables.items():
        if "cell_id" not in h:
            continue
        ci = h.index("cell_id")
        for r in rows:
            counts[t][r[ci]] = counts[t].get(r[ci], 0) + 1
    gh, grows, _ = tables["generations"]
    if {"cell_id", "mode", "new_tokens"} <= set(gh):
        gi = {c: i for i, c in enumerate(gh)}
        for r in grows:
            n = _int(r[gi["new_tokens"]]) or 0
            if r[gi["mode"]] in ("baseline", "speculative"):
                lat_tokens[r[gi["cell_id"]]] = lat_tokens.get(r[gi["cell_id"]], 0) + n
            if r[gi["mode"]] == "baseline" and "repeat" in gi and _int(r[gi["repeat"]]) == 0:
                trace_tokens[r[gi["cell_id"]]] = trace_tokens.get(r[gi["cell_id"]], 0) + n
        base_tokens = lat_tokens
    out: list[CellDamage] = []
    for cid, rows in by_cell.items():
        row = rows[0]

        def field(name: str) -> str:
            return row[col[name]] if name in col else ""

        problems = []
        if len(rows) > 1:
            problems.append(f"its cells.csv row is written {len(rows)} times")
        n_prompts, repeats = _int(field("n_prompts")), _int(field("repeats"))
        if n_prompts and repeats:
            modes = 2 + (field("tokens_per_s_peer") != "") + (field("tokens_per_s_library") != "")
            want, have = n_prompts * repeats * modes, counts["generations"].get(cid, 0)
            # a race's time budget (--until-decided) may stop a cell inside its last pass: whole visits, the
            # earlier passes complete
            cut = cfg.get("until_decided") and have % modes == 0 and n_prompts * (repeats - 1) * modes < have < want
            if have != want and not cut:
                problems.append(f"{have} of its {want} generations")
        n_rounds = _int(field("n_rounds"))
        if n_rounds is not None and counts["rounds"].get(cid, 0) != n_rounds:
            problems.append(f"{counts['rounds'].get(cid, 0)} of its {n_rounds} rounds")
        if tables["token_latency"][0] and cid in base_tokens and \
                counts["token_latency"].get(cid, 0) != base_tokens[cid]:
            problems.append(f"{counts['token_latency'].get(cid, 0)} of its {base_tokens[cid]} token latencies")
        if cfg.get("traces", True) and tables["traces"][0] and cid in trace_tokens and \
                counts["traces"].get(cid, 0) != trace_tokens[cid]:
            problems.append(f"{counts['traces'].get(cid, 0)} of its {trace_tokens[cid]} trace values")
        if problems:
            out.append(CellDamage(cid, "; ".join(problems)))
    if torn:
        out.append(CellDamage("*", f"cells.csv has {torn} unreadable row(s)"))
    return out


#: The summary row a :class:`CellWriter` finishes a cell with (contravariant: a writer of any row, such as
#: :class:`RunWriter`, serves every kind).
R_contra = TypeVar("R_contra", bound=Row, contravariant=True)


class CellWriter(Protocol[R_contra]):
    """Where a run's cells (units) write their rows, their summary row of type ``R_contra`` last: a run directory
    (:class:`RunWriter`, a :class:`CellWriter` of every row type), or a Ray worker's memory
    (:class:`measure.executors.RowCollector`, a ``CellWriter[CellRow]`` that stages nothing).

    Annotate what a function needs: ``CellWriter[CellRow]`` where a chain cell is finished,
    ``CellWriter[TreeCellRow]`` for a tree cell, ``CellWriter[R]`` (:data:`measure.rows.R`) where any kind's row
    is, ``CellWriter[Any]`` where no cell is finished (staging, appending)."""

    meta: dict[str, Any]
    #: what opening the run repaired or set aside (and staged visits quarantined since), in words
    repairs: list[str]

    def append(self, table: str, rows: Iterable[Row]) -> int: ...

    def finish_cell(self, row: R_contra) -> None: ...

    def update(self, **fields: Any) -> None: ...

    def stage(self, record: Mapping[str, Any]) -> None: ...

    def staged(self) -> list[dict[str, Any]]: ...

    def quarantine(self, record: Any, reason: str) -> None: ...

    def clear_staged(self) -> None: ...


class RunWriter:
    """Writes one run directory; resumes it if ``run.json`` is already there.

    ``meta`` holds the top-level ``run.json`` fields the caller knows
    (``command``, ``hardware``, ``versions``, ``models``, ``config``,
    ``git_commit``); ``schema_version``, ``created_utc``, ``status``,
    ``summary``, ``pid``/``host``/``heartbeat_utc`` are managed here.
    ``fingerprint``: what changes a result; a resume with a different one
    raises :class:`FingerprintMismatch` before anything is written.
    ``finish_table``: the table whose rows mark a unit finished (``cells``; a kind of run names its own:
    :attr:`measure.runkinds.RunKind.finish_table`, opened by :func:`measure.runkinds.open_run_dir`).
    """

    #: The table whose row, written last, marks a unit finished (``finish_table=`` names another).
    finish_table = "cells"

    def __init__(self, path: str | os.PathLike, meta: Mapping[str, Any] | None = None,
                 resume: bool = True, fingerprint: Mapping[str, Any] | None = None,
                 plan: Callable[[Mapping[str, Any] | None], Any] | None = None, finish_table: str | None = None,
                 new_config: Mapping[str, Any] | None = None) -> None:
        self.path = Path(path)
        #: A new run's ``config`` from its first write (``measure.runkinds.open_run_dir``: the kind, so that no
        #: ``run.json`` of schema 3 is ever on disk without it).
        self._new_config = dict(new_config or {})
        if finish_table is not None:
            _check_table(finish_table)
            self.finish_table = finish_table
        #: What ``plan`` (``measure.runplan.PlanRequest.opener``) decided when the run already existed, else None.
        self.opening: Any = None
        #: Index in ``run.json`` ``extensions`` of the extension this writer writes (None: the run itself).
        self._ext_index: int | None = None
        #: What opening the run repaired or set aside, in words (a sweep prints them).
        self.repairs: list[str] = []
        if self.path.exists() and not self.path.is_dir():
            raise ValueError(f"--out {str(self.path)!r} is a file, not a directory; choose a directory path")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"output directory {str(self.path)!r} is not writable (cannot be made: "
                             f"{e.strerror or e})") from None
        try:
            self._lock_fd: int | None = acquire_run_lock(self.path)
        except OSError as e:
            raise ValueError(f"output directory {str(self.path)!r} is not writable: {e.strerror or e}") from None
        try:
            self._open(meta, resume, fingerprint, plan)
        except BaseException:
            self.release()
            raise

    # long: opening a run in order (probe, resume checks: schema, plan, fingerprint, extension; repairs; or a new
    #   run), each step relying on the one before
    def _open(self, meta: Mapping[str, Any] | None, resume: bool, fingerprint: Mapping[str, Any] | None,
              plan: Callable[[Mapping[str, Any] | None], Any] | None = None) -> None:
        try:
            probe = self.path / f".write_probe.{os.getpid()}.{uuid.uuid4().hex[:8]}"
            probe.write_text("")
            probe.unlink()
        except OSError as e:
            raise ValueError(f"output directory {str(self.path)!r} is not writable: {e.strerror or e}") from None
        existing = self.path / RUN_JSON
        self.resumed = existing.exists() and not self._set_aside_empty_failure(existing)
        if self.resumed and not resume:
            raise ValueError(f"{existing} exists; pass resume=True or choose another directory")
        if self.resumed:
            self.meta = read_meta(existing)
            if self.meta.get("schema_version") not in RESUMABLE_SCHEMAS:
                raise ValueError(f"{existing}: written with schema_version {self.meta.get('schema_version')}; "
                                 f"resuming needs schema {' or '.join(map(str, RESUMABLE_SCHEMAS))} (use --force-new "
                                 "or a new --out)")
            st, _ = effective_status(self.meta)
            self._on_disk = json.loads(json.dumps(self.meta))  # as found: restored if the target turns out different
            refused = None
            try:
                self.opening = plan(self.meta) if plan is not None else None  # refuses other cells in one line
            except FingerprintMismatch as e:
                refused = e
            check = self.opening.fingerprint if self.opening is not None else fingerprint
            if refused is not None and check is not None:  # a different setup is said first: --extend cannot help
                check = {k: v for k, v in check.items() if k != "prompts"}
            if check is not None and "fingerprint" in self.meta:
                self.check_fingerprint(check)
            if refused is not None:
                raise refused
            if self.opening is not None and self.opening.extension is not None:
                exts = self.meta.setdefault("extensions", [])
                exts.append({**self.opening.extension, "started_utc": utc_now()})
                self._ext_index = len(exts) - 1
            elif self.opening is not None and self.opening.resume_extension:
                self._ext_index = len(self.meta["extensions"]) - 1
                self._extension.setdefault("resumed_utc", []).append(utc_now())
            else:
                self.meta.setdefault("resumed_utc", []).append(utc_now())
            self._repair_staged_tail()
            self._finished = self._read_finished()
            self._set_aside_damaged()  # copies the tables as found, before anything below rewrites them
            self._drop_torn_lines()
            self._drop_unfinished_rows()
        elif has_measured_data(self.path):
            raise ValueError(f"{self.path}: holds measured data (tables or staged visits) but no {RUN_JSON}: not "
                             "resuming it and not starting a new run over it; move that data away, or choose "
                             "another --out")
        else:
            if plan is not None:
                plan(None)  # ``--extend`` of a directory with no run: refused in one line
            self.meta = {"schema_version": SCHEMA_VERSION, "run_id": uuid.uuid4().hex, "created_utc": utc_now(),
                         "summary": {}, "config": dict(self._new_config)}
            self._finished = set()
            self.clear_staged()  # a new run: visits left by some other run are not its own
        for k, v in (meta or {}).items():
            if k in ("schema_version", "created_utc", "summary", "status", "run_id") and self.resumed:
                continue
            self.meta[k] = v
        if fingerprint is not None:
            self.meta["fingerprint"] = {**self.meta.get("fingerprint", {}), **dict(fingerprint)}
        (self._extension if self._ext_index is not None else self.meta).update(
            status="running", pid=os.getpid(), host=socket.gethostname())
        self._write_meta()

    def _set_aside_empty_failure(self, existing: Path) -> bool:
        """A run that failed before it measured anything (a bad model file, a draft checked only once the target
        loaded) holds nothing to resume: its ``run.json`` is kept beside as ``run.failed-<UTC>.json`` and a new
        run starts, so the corrected command needs no ``--force-new``. Whether it was set aside."""
        try:
            meta = read_meta(existing)
        except ValueError:
            return False
        if meta.get("status") != "failed" or meta.get("extensions") or has_measured_data(self.path):
            return False
        kept = existing.with_name(f"run.failed-{utc_now().replace(':', '')}.json")
        existing.rename(kept)
        why = " ".join(str(meta.get("error") or "no error recorded").split())[:160]
        self.repairs.append(f"{self.path}: the run there failed before it measured anything ({why}); its run.json "
                            f"is kept as {kept.name} and a new run starts")
        return True

    @property
    def _extension(self) -> dict:
        assert self._ext_index is not None
        return self.meta["extensions"][self._ext_index]

    @property
    def extending(self) -> bool:
        """Whether this writer writes an extension of the run (``run.json`` ``extensions``), not the run itself."""
        return self._ext_index is not None

    # -- identity ------------------------------------------------------------------
    def check_fingerprint(self, fingerprint: Mapping[str, Any]) -> None:
        """Refuse (one line, nothing written) if ``fingerprint`` differs from the stored one on shared fields;
        else record the new fields."""
        old = self.meta.get("fingerprint", {})
        shared_old = {k: old[k] for k in fingerprint if k in old}
        shared_new = {k: fingerprint[k] for k in shared_old}
        diff = fingerprint_diff(shared_old, shared_new)
        if diff:
            raise FingerprintMismatch(
                f"{self.path}: refusing to resume a run measured differently ({'; '.join(diff)}); "
                "use --force-new or a new --out")
        if hasattr(self, "_finished"):
            self.meta["fingerprint"] = {**old, **dict(fingerprint)}

    # -- cells ---------------------------------------------------------------------
    @property
    def finished_cells(self) -> frozenset[str]:
        """``cell_id`` of every finished cell (its ``cells.csv`` row is written)."""
        return frozenset(self._finished)

    def is_finished(self, cid: str) -> bool:
        return cid in self._finished

    def finish_cell(self, row: Row) -> None:
        """Append the row that marks a unit finished (``cells.csv``; ``finish_table``: ``serve_units`` for a
        serving run), the last write of a cell, and rewrite ``run.json``."""
        self.append(self.finish_table, [row])
        self._finished.add(str(getattr(row, "cell_id")))
        self._write_meta()

    # -- tables --------------------------------------------------------------------
    def append(self, table: str, rows: Iterable[Row]) -> int:
        """Append rows of ``table``'s row type (:data:`measure.rows.ROW_TYPES`) to ``<table>.csv`` in one
        line-atomic write (:meth:`measure.rows.Row.to_csv`)."""
        cols = _check_table(table)
        rows = list(rows)
        kind = ROW_TYPES[table]
        for r in rows:
            if type(r) is not kind:
                raise ValueError(f"{table}.csv takes {kind.__name__} rows (measure.rows), got {type(r).__name__}")
        if not rows:
            return 0
        f_path = self.path / f"{table}.csv"
        new = not f_path.exists() or f_path.stat().st_size == 0
        if not new and table in _LATER_COLUMNS:  # a resumed run written before a later column
            with f_path.open(newline="", encoding="utf-8") as f:
                header = next(csv.reader([f.readline()]), [])
            if tuple(header) != cols:
                raise ValueError(f"{f_path}: written without column(s) "
                                 f"{', '.join(c for c in cols if c not in header)}; resume it with the specscope "
                                 "that wrote it, or use --force-new or a new --out")
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        if new:
            w.writerow(cols)
        for r in rows:
            w.writerow(r.to_csv())
        _append_bytes(f_path, buf.getvalue().encode("utf-8"))
        return len(rows)

    # -- staged visits (cells measured interleaved) ----------------------------------
    def stage(self, record: Mapping[str, Any]) -> None:
        """Append one finished visit of an unfinished cell (a JSON object with its ``cell_id``) to
        ``visits.partial.jsonl`` in one line-atomic write."""
        if "cell_id" not in record:
            raise ValueError("a staged visit needs its cell_id")
        _append_bytes(self.path / STAGED_VISITS, (strict_dumps(record) + "\n").encode("utf-8"))

    def staged(self) -> list[dict]:
        """The staged visits of cells not finished yet, in the order written. A line that is not a JSON object
        with a ``cell_id`` is quarantined (:meth:`quarantine`), never returned."""
        f_path = self.path / STAGED_VISITS
        if not f_path.exists():
            return []
        out = []
        for line in f_path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                self.quarantine(line, "not a JSON line")
                continue
            if not isinstance(rec, dict) or not isinstance(rec.get("cell_id"), str):
                self.quarantine(line, "not a visit record (no cell_id)")
                continue
            if rec["cell_id"] not in self._finished:
                out.append(rec)
        return out

    def quarantine(self, record: Any, reason: str) -> None:
        """Keep a staged visit that failed validation in ``visits.quarantine.jsonl`` with the reason (it is
        never pooled), and say so in :attr:`repairs`."""
        text = record if isinstance(record, str) else strict_dumps(record)
        _append_bytes(self.path / QUARANTINE, (strict_dumps({"reason": reason, "line": text}) + "\n").encode())
        cid = record.get("cell_id") if isinstance(record, dict) else None
        self.repairs.append(f"a staged visit{f' of {cid}' if cid else ''} failed validation ({reason}); kept in "
                            f"{self.path / QUARANTINE}, not used")

    def clear_staged(self) -> None:
        """Remove ``visits.partial.jsonl`` (every cell it served is finished)."""
        with contextlib.suppress(FileNotFoundError):
            (self.path / STAGED_VISITS).unlink()

    def has_rows(self, table: str) -> bool:
        """Whether ``<table>.csv`` holds at least one data row."""
        _check_table(table)
        f_path = self.path / f"{table}.csv"
        if not f_path.exists():
            return False
        with f_path.open(encoding="utf-8") as f:
            return sum(1 for _ in zip(range(2), f)) >= 2

    # -- run.json ------------------------------------------------------------------
    def update(self, **fields: Any) -> None:
        """Set top-level ``run.json`` fields (e.g. ``summary=...``) and rewrite it atomically."""
        if "status" in fields and fields["status"] not in STATUSES:
            raise ValueError(f"unknown status {fields['status']!r}; valid: {', '.join(STATUSES)}")
        if self._ext_index is not None:  # an extension's own fields go to its entry; the run's stay as they were
            self._extension.update({k: fields.pop(k) for k in EXTENSION_FIELDS if k in fields})
        self.meta.update(fields)
        self._write_meta()

    def close(self, status: str = "complete") -> None:
        """Record the final status and release the run's lock."""
        try:
            self.update(status=status, finished_utc=utc_now())
        finally:
            self.release()

    def release(self) -> None:
        """Release the run directory's lock (the process exiting releases it too)."""
        fd, self._lock_fd = getattr(self, "_lock_fd", None), None
        if fd is not None:
            os.close(fd)

    @contextlib.contextmanager
    def recording(self) -> Iterator["RunWriter"]:
        """Close the run ``complete`` on a normal exit, ``interrupted`` on Ctrl-C, SIGTERM or a
        :class:`RunInterrupted` (a native crash in an engine's process) and ``failed`` (with the error in ``run.json``) on any other exception, which is re-raised.
        A :class:`FingerprintMismatch` restores ``run.json`` as it was before this writer opened it."""
        before = {k: v for k, v in self.meta.items()}
        prev = None
        with contextlib.suppress(ValueError):  # not the main thread: no handler

            def _term(_sig: int, _frame: Any) -> None:
                raise Terminated("SIGTERM")

            prev = signal.signal(signal.SIGTERM, _term)
        try:
            yield self
        except FingerprintMismatch:
            if self._ext_index is not None:
                self.meta, self._ext_index = self._on_disk, None
            else:
                self.meta = before
                self.meta["status"] = self._previous_status
            self._write_meta()
            self.release()
            raise
        except OSError as e:  # the run directory itself failed (full or read-only disk): one line, resumable
            where = f" ({e.filename})" if e.filename else ""
            msg = f"cannot write the run directory {self.path}{where}: {e.strerror or e}"
            with contextlib.suppress(OSError):
                self.update(interruption=msg)
            with contextlib.suppress(OSError):
                self.close("interrupted")
            self.release()
            raise RunInterrupted(f"{msg}; finished visits are kept: free the space or fix the permission, then "
                                 "re-run with the same --out to resume") from None
        except KeyboardInterrupt:
            self.close("interrupted")
            raise
        except RunInterrupted as e:
            self.update(interruption=str(e))
            self.close("interrupted")
            raise
        except BaseException as e:
            self.update(error=f"{type(e).__name__}: {e}")
            self.close("failed")
            raise
        finally:
            if prev is not None:
                signal.signal(signal.SIGTERM, prev)
        self.close("complete")

    def _write_meta(self) -> None:
        self.meta["n_finished_cells"] = len(getattr(self, "_finished", ()))
        self.meta["heartbeat_utc"] = utc_now()
        if self._ext_index is not None:
            self._extension["heartbeat_utc"] = self.meta["heartbeat_utc"]
        _atomic_write_text(self.path / RUN_JSON, strict_dumps(self.meta, indent=2) + "\n")

    # -- resume --------------------------------------------------------------------
    @property
    def _previous_status(self) -> str:
        return getattr(self, "_prev_status", "interrupted")

    def _drop_torn_lines(self) -> None:
        """Drop an incomplete last line (no newline, or the wrong number of fields) of every table."""
        self._prev_status = effective_status(self.meta)[0] or "interrupted"
        for table, cols in TABLE_COLUMNS.items():
            f_path = self.path / f"{table}.csv"
            if not f_path.exists() or f_path.stat().st_size == 0:
                continue
            data = f_path.read_bytes()
            first = next(csv.reader([data[:max(data.find(b"\n"), 0)].decode("utf-8", "replace")]), [])
            if not first or first[0] != cols[0]:  # no readable header: damage, set aside whole, never cut here
                continue
            keep = len(data)
            if not data.endswith(b"\n"):
                keep = data.rfind(b"\n") + 1
            else:
                last_start = data.rfind(b"\n", 0, len(data) - 1) + 1
                if last_start > 0:
                    last = data[last_start:].decode("utf-8", "replace")
                    fields = next(csv.reader([last]), [])
                    header = next(csv.reader([data[:data.find(b"\n")].decode("utf-8", "replace")]), [])
                    if len(fields) != len(header):
                        keep = last_start
            if keep < len(data):
                with f_path.open("r+b") as f:
                    f.truncate(keep)

    def _repair_staged_tail(self) -> None:
        """Cut a torn last line of ``visits.partial.jsonl`` (a write cut short) and say so; the visit it held is
        measured again."""
        f_path = self.path / STAGED_VISITS
        if not f_path.is_file():
            return
        data = f_path.read_bytes()
        if data and not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1
            with f_path.open("r+b") as f:
                f.truncate(keep)
            self.repairs.append(f"{f_path.name}: cut a torn last line of {len(data) - keep} bytes (a write cut "
                                "short); that visit is measured again")

    def _read_finished(self) -> set[str]:
        header, rows, _ = _raw_table(self.path, self.finish_table)
        if "cell_id" not in header:
            return set()
        i = header.index("cell_id")
        return {r[i] for r in rows if r[i]}

    def _set_aside_damaged(self) -> None:
        """Finished cells whose rows are incomplete become unfinished (measured again); the tables as they were
        are copied to ``damaged-<UTC>/`` first, with ``damage.json`` saying which cells and why."""
        damage = damaged_cells(self.path, self.meta.get("config"))
        if not damage:
            return
        aside = self.path / f"{DAMAGED_PREFIX}{utc_now().replace(':', '')}"
        aside.mkdir(exist_ok=True)
        for t in TABLE_COLUMNS:
            if (self.path / f"{t}.csv").is_file():
                shutil.copy2(self.path / f"{t}.csv", aside / f"{t}.csv")
        (aside / "damage.json").write_text(strict_dumps([{"cell_id": d.cell_id, "reason": d.reason}
                                                         for d in damage], indent=1) + "\n")
        bad = {d.cell_id for d in damage}
        self._finished = set() if "*" in bad else self._finished - bad  # "*": cells.csv itself is damaged
        names = "; ".join(f"{d.cell_id}: {d.reason}" for d in damage[:3]) + (" ..." if len(damage) > 3 else "")
        self.repairs.append(f"{len(damage)} finished cell(s) have damaged or missing rows ({names}); measuring "
                            f"them again; the tables as they were are kept in {aside}")

    def _drop_unfinished_rows(self) -> None:
        """Rewrite each table with the rows of finished cells only (a table whose header is damaged restarts
        empty: :meth:`_set_aside_damaged` kept a copy)."""
        for table, cols in TABLE_COLUMNS.items():
            if "cell_id" not in cols:
                continue
            f_path = self.path / f"{table}.csv"
            if not f_path.exists() or f_path.stat().st_size == 0:
                continue
            header, body, torn = _raw_table(self.path, table)
            bad_header = "cell_id" not in header
            if bad_header:
                header, body = list(cols), []
            i = header.index("cell_id")
            seen: set[str] = set()
            kept = []
            for r in body:
                if r[i] not in self._finished:
                    continue
                if table == self.finish_table:  # finished twice (a crash between two writes): keep the first
                    if r[i] in seen:
                        continue
                    seen.add(r[i])
                kept.append(r)
            if len(kept) == len(body) and not torn and not bad_header:
                continue
            fd, tmp = tempfile.mkstemp(dir=self.path, prefix=f".{table}.", suffix=".tmp")
            with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
                w = csv.writer(f, lineterminator="\n")
                w.writerow(header)
                w.writerows(kept)
            os.replace(tmp, f_path)


def read_meta(f_path: Path) -> dict[str, Any]:
    """``run.json`` parsed and checked (one-line ``ValueError`` naming the file)."""
    try:
        text = f_path.read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"{f_path}: cannot read: {e.strerror or e}") from None
    try:
        meta = json.loads(text, parse_constant=lambda c: None)  # a bare NaN (older writers) reads as null
    except json.JSONDecodeError as e:
        raise ValueError(f"{f_path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{f_path}: expected a JSON object, got {type(meta).__name__}")
    ver = meta.get("schema_version")
    if not isinstance(ver, int) or isinstance(ver, bool):
        raise ValueError(f"{f_path}: schema_version {ver!r} is not an integer; readable: "
                         f"{', '.join(map(str, READABLE_SCHEMAS))}")
    if ver > max(READABLE_SCHEMAS):
        raise ValueError(f"{f_path}: schema_version {ver} is newer than this specscope reads "
                         f"(up to {max(READABLE_SCHEMAS)}); upgrade specscope")
    if ver not in READABLE_SCHEMAS:
        raise ValueError(f"{f_path}: schema_version {ver} unknown; readable: {', '.join(map(str, READABLE_SCHEMAS))}")
    for key, typ in (("status", str), ("config", dict), ("summary", dict), ("models", dict)):
        if key in meta and meta[key] is not None and not isinstance(meta[key], typ):
            raise ValueError(f"{f_path}: key {key!r} should be a JSON {'string' if typ is str else 'object'}, "
                             f"got {type(meta[key]).__name__}")
    for key in ("status", "config"):
        if key not in meta:
            raise ValueError(f"{f_path}: missing key {key!r} (not a complete run.json)")
    if meta["status"] not in STATUSES:
        raise ValueError(f"{f_path}: status {meta['status']!r} unknown; valid: {', '.join(STATUSES)}")
    return meta


def _read_table(f_path: Path, name: str, schema: int) -> pd.DataFrame:
    """Read and validate one CSV table: header columns, field counts per row, numeric columns."""
    import pandas as pd

    cols = TABLE_COLUMNS[name]
    with f_path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if not rows:
        return pd.DataFrame({c: [] for c in cols})
    header = rows[0]
    required = [c for c in cols if (schema >= 2 or c not in _SCHEMA1_EXTRA.get(name, ()))
                and (schema >= 3 or c not in _LATER_COLUMNS.get(name, ()))]
    missing = [c for c in required if c not in header]
    if missing:
        raise ValueError(f"{f_path}: missing column(s) {', '.join(missing)}")
    for i, r in enumerate(rows[1:], start=2):
        if len(r) != len(header):
            raise ValueError(f"{f_path}: line {i} has {len(r)} fields, the header has {len(header)} "
                             "(a torn or corrupt row)")
    df = pd.DataFrame(rows[1:], columns=header)
    for c in df.columns:
        if c in _BOOL_COLUMNS:
            bad = ~df[c].isin(["true", "false", "True", "False", ""])
            if bad.any():
                j = int(bad.to_numpy().argmax())
                raise ValueError(f"{f_path}: line {j + 2}, column {c}: {df[c].iloc[j]!r} is not true/false")
            df[c] = df[c].map({"true": True, "True": True, "false": False, "False": False, "": None})
        elif c not in _TEXT_COLUMNS and c in cols:
            num = pd.to_numeric(df[c].replace("", None), errors="coerce")
            bad = num.isna() & (df[c] != "")
            if bad.any():
                j = int(bad.to_numpy().argmax())
                raise ValueError(f"{f_path}: line {j + 2}, column {c}: {df[c].iloc[j]!r} is not a number")
            df[c] = num
        else:
            df[c] = df[c].replace("", None)
    for c in cols:
        if c not in df.columns:
            df[c] = None
    return df


@dataclass(frozen=True)
class Run:
    """A run directory read back: ``meta`` is ``run.json``; tables load lazily (validated)."""

    path: Path
    meta: dict[str, Any]
    _cache: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False, compare=False)

    @property
    def summary(self) -> dict[str, Any]:
        return self.meta.get("summary") or {}

    @property
    def schema_version(self) -> int:
        return int(self.meta.get("schema_version", 1))

    @property
    def status(self) -> str:
        """The stored status, except ``interrupted`` for a ``running`` run whose writer is gone."""
        return effective_status(self.meta)[0]

    @property
    def status_note(self) -> str:
        return effective_status(self.meta)[1]

    @property
    def extension_status(self) -> tuple[str, str]:
        """``(status, note)`` of the run's last extension (:func:`extension_status`)."""
        return extension_status(self.meta)

    @property
    def run_id(self) -> str:
        """A stable identity: ``run_id`` (schema 2) or ``created_utc`` + command (schema 1)."""
        return str(self.meta.get("run_id") or f"{self.meta.get('created_utc')}|{self.meta.get('command')}")

    def table(self, name: str) -> pd.DataFrame:
        """``<name>.csv`` as a pandas DataFrame (empty with the right columns if absent).

        Raises a one-line ``ValueError`` naming the file, line and column for a
        torn row, a missing column or a value of the wrong type.
        """
        import pandas as pd

        cols = _check_table(name)
        if name not in self._cache:
            f_path = self.path / f"{name}.csv"
            if f_path.exists() and f_path.stat().st_size > 0:
                df = _read_table(f_path, name, self.schema_version)
            else:
                df = pd.DataFrame({c: [] for c in cols})
            self._cache[name] = df
        return self._cache[name]

    def rows(self, kind: type[R]) -> list[R]:
        """The table of row type ``kind`` (``<kind.table>.csv``) as typed rows (:meth:`measure.rows.Row.from_csv`),
        checked as :meth:`table` checks it; a column an older run lacks reads as empty."""
        name = kind.table
        self.table(name)  # one-line ValueError for a torn row, a missing column or a value of the wrong type
        f_path = self.path / f"{name}.csv"
        if not f_path.exists() or f_path.stat().st_size == 0:
            return []
        with f_path.open(newline="", encoding="utf-8") as f:
            return [kind.from_csv(r) for r in csv.DictReader(f)]

    def tables(self) -> dict[str, pd.DataFrame]:
        """Every table present on disk, by name."""
        return {n: self.table(n) for n in TABLE_COLUMNS if (self.path / f"{n}.csv").exists()}


def load_run(path: str | os.PathLike) -> Run:
    """Read a run directory written by :class:`RunWriter` (schema 1, 2 or 3); one-line ``ValueError`` if bad."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"run directory not found: {str(p)!r}")
    f_path = p / RUN_JSON
    if not f_path.exists():
        raise ValueError(f"{str(p)!r} is not a run directory (no {RUN_JSON})")
    return Run(path=p, meta=read_meta(f_path))

