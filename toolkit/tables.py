"""Tables read back, checked at the boundary: one ``ValueError`` line naming the file, the line and the fault.

What ``measure`` writes, ``calibrate`` reads, and what ``calibrate`` writes,
``reports`` reads; a file cut short, edited or written twice must stop the
reader in one line rather than poison what it computes (a cell row written
twice moved a held-out MAPE from 4.4% to 21.6%, issue 43) or end in a
traceback. The checks, each naming ``where`` (a file) and the line a row came
from (a frame read from a CSV file keeps its rows' order: row ``i`` is line
``i + 2``):

* :func:`read_csv` — the header holds the required columns and every row has
  the header's number of fields (a torn row, which pandas would fill with
  NaN without a word);
* :func:`check_columns` — required columns present;
* :func:`check_values` — each :class:`Column`'s values are numbers, finite, in
  their range, integers where counted, and present where required;
* :func:`check_unique` — no two rows share a key (a row written twice).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class Column:
    """What every value of column ``name`` must be: a finite number from ``lo`` (``lo_open``: above it) to
    ``hi``, an integer when ``integer``; an empty value is refused when ``required``, else skipped."""

    name: str
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    integer: bool = False
    required: bool = True

    def valid(self) -> str:
        """The valid values, in words (the end of a refusal)."""
        kind = "an integer" if self.integer else "a finite number"
        parts = []
        if self.lo is not None:
            parts.append(f"{'>' if self.lo_open else '>='} {self.lo:g}")
        if self.hi is not None:
            parts.append(f"<= {self.hi:g}")
        return f"{kind} {' and '.join(parts)}".strip()

    def fault(self, value: object) -> str | None:
        """Why ``value`` is not valid here (None: it is)."""
        if value is None or (isinstance(value, str) and not value.strip()) or (
                isinstance(value, float) and math.isnan(value)):
            return "empty" if self.required else None
        try:
            x = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return "not a number"
        if not math.isfinite(x):
            return "not finite"
        if self.integer and x != int(x):
            return "not an integer"
        if self.lo is not None and (x <= self.lo if self.lo_open else x < self.lo):
            return "out of range"
        if self.hi is not None and x > self.hi:
            return "out of range"
        return None


def check_columns(frame: "pd.DataFrame", where: str, required: Sequence[str]) -> None:
    """One line naming ``where`` and the columns of ``required`` that ``frame`` lacks."""
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise ValueError(f"{where}: missing column(s) {', '.join(missing)}")


def check_values(frame: "pd.DataFrame", where: str, columns: Sequence[Column]) -> None:
    """One line naming ``where``, the line, the column and the value of the first value no :class:`Column` of
    ``columns`` allows (a column the frame lacks is left to :func:`check_columns`)."""
    import numpy as np
    import pandas as pd

    for col in columns:
        if col.name not in frame.columns:
            continue
        values = frame[col.name]
        num = pd.to_numeric(values, errors="coerce").astype(float).to_numpy()
        with np.errstate(invalid="ignore"):  # the rows that may be bad, at array speed; each then judged alone
            ok = np.isfinite(num)
            if col.lo is not None:
                ok &= (num > col.lo) if col.lo_open else (num >= col.lo)
            if col.hi is not None:
                ok &= num <= col.hi
            if col.integer:
                ok &= num == np.floor(num)
        for i in np.flatnonzero(~ok):
            v = values.iloc[i]
            v = v.item() if isinstance(v, np.generic) else v  # 9, not np.int64(9)
            why = col.fault(v)
            if why is not None:
                raise ValueError(f"{where}: line {_line(frame.index[i])}, column {col.name}: {v!r} is {why}; valid: "
                                 f"{col.valid()}")


def check_unique(frame: "pd.DataFrame", where: str, key: Sequence[str]) -> None:
    """One line naming ``where`` and the first row whose ``key`` an earlier row has (a row written twice)."""
    if frame.empty or not all(k in frame.columns for k in key):
        return
    dup = frame.duplicated(list(key), keep="first")
    if dup.any():
        i = dup.index[dup.to_numpy().argmax()]
        first = frame.index[(frame.loc[:, list(key)] == frame.loc[i, list(key)]).all(axis=1).to_numpy().argmax()]
        named = ", ".join(f"{k}={frame.at[i, k]}" for k in key)
        raise ValueError(f"{where}: line {_line(i)} repeats the row of line {_line(first)} ({named}): a row written "
                         "twice")


def read_csv(path: str | Path, required: Sequence[str] = (), what: str = "") -> "pd.DataFrame":
    """The CSV file ``path`` as a frame, checked: readable UTF-8 with a header holding ``required``, every row
    with the header's field count. ``what`` (e.g. ``calibration table``) starts a missing file's line. A file
    without a header (empty) reads as a frame without columns: whether that is nothing or a fault, the caller
    says."""
    import pandas as pd

    p = Path(path)
    try:
        with p.open(newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except FileNotFoundError:
        raise ValueError(f"{(what + ' ') if what else ''}{str(p)!r}: no such file") from None
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ValueError(f"{str(p)!r} is not a table this reads ({' '.join(str(exc).split())[:160]})") from None
    if not rows or not any(rows[0]):
        return pd.DataFrame()
    header = rows[0]
    for n, r in enumerate(rows[1:], start=2):
        if len(r) != len(header):
            raise ValueError(f"{str(p)!r}: line {n} has {len(r)} fields, the header has {len(header)} (a torn or "
                             "corrupt row)")
    try:
        frame = pd.read_csv(p) if len(rows) > 1 else pd.DataFrame({c: [] for c in header})
    except (pd.errors.ParserError, ValueError) as exc:
        raise ValueError(f"{str(p)!r} is not a table this reads ({' '.join(str(exc).split())[:160]})") from None
    check_columns(frame, repr(str(p)), required)
    return frame


def _line(index: object) -> str:
    """The file line of a frame row read from a CSV file (row 0: line 2)."""
    return str(int(index) + 2) if isinstance(index, (int,)) or hasattr(index, "__index__") else str(index)


__all__ = ["Column", "check_columns", "check_unique", "check_values", "read_csv"]
