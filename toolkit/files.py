"""Reading a user's file as text, checked at the boundary: one ``ValueError`` line naming the file and the problem.

:func:`read_text` is the one reader for files a person hands a CLI (prompts,
cost and acceptance models): the path must name an existing file, within a
size limit when one is given, holding UTF-8 text — no NUL byte or other
control character than whitespace, so a binary file (4,096 NUL bytes are valid
UTF-8) is refused rather than read as one long prompt.

A file that names another (a calibration naming its runs) names it by a path relative to its own folder
(:func:`path_from`), read back with :func:`resolve_from` (the absolute or working-directory paths older files
hold still read): the two can move together.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

#: C0 control characters other than tab, newline, vertical tab, form feed and carriage return.
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f]")


def read_text(path: str | Path, what: str, max_bytes: int | None = None) -> str:
    """The UTF-8 text of file ``path``; ``what`` (``--prompts-file``, ``cost model file``) starts every error."""
    if not str(path).strip():
        raise ValueError(f"{what}: empty file name")
    p = Path(path)
    name = repr(str(p))
    if p.is_dir():
        raise ValueError(f"{what} {name} is a directory; give a file")
    try:
        size = p.stat().st_size
        if max_bytes is not None and size > max_bytes:
            raise ValueError(f"{what} {name}: {size:,} bytes, over the {max_bytes:,} byte limit")
        data = p.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{what} {name}: no such file") from None
    except OSError as exc:
        raise ValueError(f"{what} {name} cannot be read: {exc.strerror or exc}") from None
    if not data:
        raise ValueError(f"{what} {name}: the file is empty")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{what} {name}: not UTF-8 text (byte {exc.start})") from None
    bad = _CONTROL.search(text)
    if bad:
        char = "a NUL byte" if bad.group() == "\x00" else f"control character U+{ord(bad.group()):04X}"
        raise ValueError(f"{what} {name}: not a text file ({char} at character {bad.start()})")
    return text


def write_dict_rows(path: str | Path, rows: list[dict]) -> None:
    """``rows`` (dicts) as a CSV file: every key any row has, in first-seen order, as the header; None as empty."""
    import csv

    keys = list(dict.fromkeys(k for r in rows for k in r))
    with Path(path).open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: "" if r.get(k) is None else r[k] for k in keys})


def path_from(folder: str | Path, target: str | Path) -> str:
    """``target`` as a path relative to ``folder`` (the folder of the file that records it), for
    :func:`resolve_from` to read back: ``".."`` for a run holding its calibration in ``RUN/calibration``."""
    return os.path.relpath(Path(target).resolve(), Path(folder).resolve())


def resolve_from(folder: str | Path, recorded: str | Path, holds: str | None = None) -> Path:
    """The path a file in ``folder`` recorded (:func:`path_from`): relative to ``folder``, normalised
    (``results/run/calibration/..`` is ``results/run``; absolute where that would end in ``..``, which names no
    directory); an absolute one as it is. ``holds``: a file the target holds (``run.json``); where the path
    relative to ``folder`` has none and the path as recorded does, the recorded one (older files recorded paths
    relative to the working directory they were written from)."""
    path = Path(os.path.normpath(Path(folder) / recorded))
    path = path.resolve() if path.name in ("", "..") else path
    if holds is not None and not (path / holds).exists() and (Path(recorded) / holds).exists():
        return Path(recorded)
    return path
