"""Damage done to a copy of a committed run or calibration, as a crash, a second writer or an editor would do it.

Each function rewrites one CSV table of a directory in place (the tests copy
``results/`` to ``tmp_path`` first); the tests of :mod:`calibrate.checks` and of
the reports' reading checks share them.
"""

from __future__ import annotations

import csv
from pathlib import Path


def rows(path: Path) -> list[list[str]]:
    """The CSV file's rows, header first."""
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def write(path: Path, table: list[list[str]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        csv.writer(f, lineterminator="\n").writerows(table)


def set_value(path: Path, column: str, value: str, row: int = 1) -> None:
    """Row ``row`` (1: the first data row) of ``column`` set to ``value``."""
    t = rows(path)
    t[row][t[0].index(column)] = value
    write(path, t)


def duplicate_row(path: Path, row: int = 1) -> None:
    """Row ``row`` written a second time at the end (a second writer, a resume that wrote it again)."""
    t = rows(path)
    write(path, [*t, t[row]])


def drop_last_row(path: Path) -> None:
    t = rows(path)
    write(path, t[:-1])


def drop_column(path: Path, column: str) -> None:
    t = rows(path)
    j = t[0].index(column)
    write(path, [r[:j] + r[j + 1:] for r in t])


def tear_row(path: Path, row: int = 2) -> None:
    """Row ``row`` cut after its third field (a write cut short and then appended to)."""
    t = rows(path)
    t[row] = t[row][:3]
    write(path, t)


def cut_in_half(path: Path) -> None:
    """The file's first half of its bytes only (a copy or a write that stopped half-way)."""
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
