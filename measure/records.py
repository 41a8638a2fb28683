"""The run directory: the one torch-free module that writes and reads it.

Format: ``docs/RUN_FORMAT.md``. ``measure`` writes through :class:`RunWriter`;
``calibrate`` and ``reports`` read through :func:`load_run`. Imports no torch.

Writing::

    w = RunWriter("runs/x", meta={"command": ..., "models": ..., "config": ...})
    if not w.is_finished(cid):
        w.append("rounds", [{...}, ...])        # rows of the cell, as they come
        w.finish_cell({... cells.csv row ...})    # last: marks the cell finished
    w.update(summary={...})                      # atomic rewrite of run.json
    w.close("complete")                          # or "interrupted" / "failed"

Reading::

    run = load_run("runs/x")
    run.meta["summary"]["speedup"]; run.table("cells")  # pandas DataFrame

Resume: opening a :class:`RunWriter` on a directory that already holds a
``run.json`` keeps the rows of finished cells (``cell_id`` in ``cells.csv``)
and drops the rows of unfinished ones, so a re-run skips exactly the finished
cells and redoes the rest.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as _dt
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

SCHEMA_VERSION = 1
RUN_JSON = "run.json"
STATUSES = ("running", "complete", "interrupted", "failed")

#: Columns of every table, in order (``docs/RUN_FORMAT.md``).
TABLE_COLUMNS: dict[str, tuple[str, ...]] = {
    "cells": (
        "cell_id", "draft", "gamma_policy", "gamma", "temperature", "domain", "head_k",
        "n_prompts", "new_tokens", "tokens_per_s_baseline", "tokens_per_s_speculative",
        "tokens_per_s_peer", "speedup", "acceptance_rate", "mean_accepted_per_round",
        "n_rounds", "outputs_identical", "synthetic",
    ),
    "generations": (
        "cell_id", "prompt_id", "domain", "mode", "prompt_tokens", "new_tokens", "wall_s",
        "tokens_per_s", "ttft_ms", "peak_mem_bytes", "outputs_identical",
    ),
    "rounds": (
        "cell_id", "prompt_id", "round", "gamma", "context_tokens", "drafted", "accepted",
        "draft_ms", "verify_ms", "overhead_ms",
    ),
    "token_latency": ("cell_id", "prompt_id", "mode", "token_index", "latency_ms"),
    "traces": ("cell_id", "draft", "temperature", "domain", "prompt_id", "position", "value", "proposed", "accept_run"),
    "cost_target": ("n_tokens", "context_tokens", "repeat", "ms"),
    "cost_draft": ("draft", "head_k", "context_tokens", "repeat", "ms"),
    "profile": ("model", "role", "component", "ms", "share"),
    "head_sweep": (
        "variant", "head_k", "head_ms", "draft_step_ms", "acceptance_rate", "tokens_per_s",
        "speedup", "head_fast_ms", "tokens_per_s_baseline", "e2e_acceptance_rate",
        "mean_accepted_per_round", "kept_recall", "n_eval_tokens", "outputs_identical", "model",
        "draft", "vocab_size", "gamma", "synthetic",
    ),
}


def cell_id(draft: str, gamma_policy: str, temperature: float, domain: str,
            head_k: int | None = None) -> str:
    """Stable id of a cell, e.g. ``draft=int8|gamma=fixed:4|temp=0|domain=code``."""
    temp = f"{float(temperature):g}"
    cid = f"draft={draft}|gamma={gamma_policy}|temp={temp}|domain={domain}"
    if head_k is not None:
        cid += f"|head_k={int(head_k)}"
    return cid


def utc_now() -> str:
    """Current UTC time as ``YYYY-MM-DDTHH:MM:SSZ``."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


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


def _check_table(table: str) -> tuple[str, ...]:
    if table not in TABLE_COLUMNS:
        raise ValueError(f"unknown table {table!r}; valid: {', '.join(TABLE_COLUMNS)}")
    return TABLE_COLUMNS[table]


def _fmt(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    return v


class RunWriter:
    """Writes one run directory; resumes it if ``run.json`` is already there.

    ``meta`` holds the top-level ``run.json`` fields the caller knows
    (``command``, ``hardware``, ``versions``, ``models``, ``config``,
    ``git_commit``); ``schema_version``, ``created_utc``, ``status`` and
    ``summary`` are managed here. On resume the stored ``created_utc`` and
    ``summary`` are kept and ``resumed_utc`` is appended to.
    """

    def __init__(self, path: str | os.PathLike, meta: Mapping[str, Any] | None = None,
                 resume: bool = True) -> None:
        self.path = Path(path)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            probe = self.path / ".write_probe"
            probe.write_text("")
            probe.unlink()
        except OSError as e:
            raise ValueError(f"output directory {str(self.path)!r} is not writable: {e.strerror or e}") from None
        existing = self.path / RUN_JSON
        self.resumed = existing.exists()
        if self.resumed and not resume:
            raise ValueError(f"{existing} exists; pass resume=True or choose another directory")
        if self.resumed:
            self.meta = json.loads(existing.read_text(encoding="utf-8"))
            if self.meta.get("schema_version") != SCHEMA_VERSION:
                raise ValueError(f"{existing}: schema_version {self.meta.get('schema_version')!r}, "
                                 f"expected {SCHEMA_VERSION}")
            self.meta.setdefault("resumed_utc", []).append(utc_now())
            self._finished = self._read_finished()
            self._drop_unfinished_rows()
        else:
            self.meta = {"schema_version": SCHEMA_VERSION, "created_utc": utc_now(), "summary": {}}
            self._finished = set()
        for k, v in (meta or {}).items():
            if k in ("schema_version", "created_utc", "summary", "status") and self.resumed:
                continue
            self.meta[k] = v
        self.meta["status"] = "running"
        self._write_meta()

    # -- cells ---------------------------------------------------------------------
    @property
    def finished_cells(self) -> frozenset[str]:
        """``cell_id`` of every finished cell (its ``cells.csv`` row is written)."""
        return frozenset(self._finished)

    def is_finished(self, cid: str) -> bool:
        return cid in self._finished

    def finish_cell(self, row: Mapping[str, Any]) -> None:
        """Append the ``cells.csv`` row (last write of a cell) and rewrite ``run.json``."""
        self.append("cells", [row])
        self._finished.add(str(row["cell_id"]))
        self._write_meta()

    # -- tables --------------------------------------------------------------------
    def append(self, table: str, rows: Iterable[Mapping[str, Any]]) -> int:
        """Append rows (dicts with exactly the table's columns) to ``<table>.csv``."""
        cols = _check_table(table)
        rows = list(rows)
        for r in rows:
            if set(r) != set(cols):
                missing = sorted(set(cols) - set(r))
                extra = sorted(set(r) - set(cols))
                raise ValueError(f"{table}.csv row: missing columns {missing}, unknown columns {extra}")
        if not rows:
            return 0
        f_path = self.path / f"{table}.csv"
        new = not f_path.exists() or f_path.stat().st_size == 0
        with f_path.open("a", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            if new:
                w.writerow(cols)
            for r in rows:
                w.writerow([_fmt(r[c]) for c in cols])
            f.flush()
        return len(rows)

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
        self.meta.update(fields)
        self._write_meta()

    def close(self, status: str = "complete") -> None:
        self.update(status=status, finished_utc=utc_now())

    @contextlib.contextmanager
    def recording(self) -> Iterator["RunWriter"]:
        """Close the run ``complete`` on a normal exit, ``interrupted`` on Ctrl-C and
        ``failed`` (with the error in ``run.json``) on any other exception, which is re-raised."""
        try:
            yield self
        except KeyboardInterrupt:
            self.close("interrupted")
            raise
        except BaseException as e:
            self.update(error=f"{type(e).__name__}: {e}")
            self.close("failed")
            raise
        self.close("complete")

    def _write_meta(self) -> None:
        self.meta["n_finished_cells"] = len(self._finished)
        _atomic_write_text(self.path / RUN_JSON, json.dumps(self.meta, indent=2, default=str) + "\n")

    # -- resume --------------------------------------------------------------------
    def _read_finished(self) -> set[str]:
        f_path = self.path / "cells.csv"
        if not f_path.exists():
            return set()
        with f_path.open(newline="", encoding="utf-8") as f:
            return {r["cell_id"] for r in csv.DictReader(f) if r.get("cell_id")}

    def _drop_unfinished_rows(self) -> None:
        for table, cols in TABLE_COLUMNS.items():
            if "cell_id" not in cols or table == "cells":
                continue
            f_path = self.path / f"{table}.csv"
            if not f_path.exists():
                continue
            with f_path.open(newline="", encoding="utf-8") as f:
                rows = list(csv.reader(f))
            if not rows:
                continue
            header, body = rows[0], rows[1:]
            i = header.index("cell_id")
            kept = [r for r in body if len(r) == len(header) and r[i] in self._finished]
            if len(kept) == len(body):
                continue
            fd, tmp = tempfile.mkstemp(dir=self.path, prefix=f".{table}.", suffix=".tmp")
            with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
                w = csv.writer(f)
                w.writerow(header)
                w.writerows(kept)
            os.replace(tmp, f_path)


@dataclass(frozen=True)
class Run:
    """A run directory read back: ``meta`` is ``run.json``; tables load lazily."""

    path: Path
    meta: dict
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def summary(self) -> dict:
        return self.meta.get("summary", {})

    @property
    def status(self) -> str:
        return self.meta.get("status", "")

    def table(self, name: str):
        """``<name>.csv`` as a pandas DataFrame (empty with the right columns if absent)."""
        import pandas as pd

        cols = _check_table(name)
        if name not in self._cache:
            f_path = self.path / f"{name}.csv"
            if f_path.exists() and f_path.stat().st_size > 0:
                df = pd.read_csv(f_path)
                for c in df.columns:
                    if df[c].dtype == object and set(df[c].dropna().unique()) <= {"true", "false"}:
                        df[c] = df[c].map({"true": True, "false": False})
            else:
                df = pd.DataFrame({c: [] for c in cols})
            self._cache[name] = df
        return self._cache[name]

    def tables(self) -> dict:
        """Every table present on disk, by name."""
        return {n: self.table(n) for n in TABLE_COLUMNS if (self.path / f"{n}.csv").exists()}


def load_run(path: str | os.PathLike) -> Run:
    """Read a run directory written by :class:`RunWriter`."""
    p = Path(path)
    f_path = p / RUN_JSON
    if not f_path.exists():
        raise ValueError(f"{str(p)!r} is not a run directory (no {RUN_JSON})")
    meta = json.loads(f_path.read_text(encoding="utf-8"))
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"{f_path}: schema_version {meta.get('schema_version')!r}, expected {SCHEMA_VERSION}")
    return Run(path=p, meta=meta)


RunReader = load_run


#: How far ahead ``traces.csv`` ``proposed``/``accept_run`` look: replay is exact for any γ up to this.
TRACE_GAMMA_MAX = 16


def drafted_counts(rounds) -> "Any":
    """Tokens each ``rounds`` row drafted: ``drafted``, or ``gamma`` for records that lack it (int array)."""
    col = "drafted" if "drafted" in rounds.columns else "gamma"
    return rounds[col].to_numpy(int)


def per_position_acceptance(rounds) -> "Any":
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
