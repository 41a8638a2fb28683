"""Reading the JSON files the simulator is handed (cost and acceptance models), validated at the boundary.

Every problem is a one-line ``ValueError`` that names the file: not found, a
directory, unreadable, not UTF-8, not JSON (with line and column), a
non-standard constant (``NaN``/``Infinity``), nesting too deep to parse, the wrong top-level type, or a
``schema_version`` newer than this code knows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping


def read_json(path: str | Path, what: str) -> Any:
    """The parsed content of JSON file ``path``; ``what`` ("cost model file") starts every error."""
    p = Path(path)
    if not str(path).strip():
        raise ValueError(f"{what}: empty file name")
    if p.is_dir():
        raise ValueError(f"{what} {str(p)!r} is a directory; give a JSON file")

    def no_constants(name: str) -> float:
        raise ValueError(f"{what} {str(p)!r} holds {name}, which is not JSON; write null or a number")

    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"{what} not found: {str(p)!r}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{what} {str(p)!r} is not UTF-8 text") from None
    except OSError as exc:
        raise ValueError(f"{what} {str(p)!r} cannot be read: {exc.strerror or exc}") from None
    try:
        return json.loads(text, parse_constant=no_constants)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} {str(p)!r} is not valid JSON: {exc.msg} at line {exc.lineno} "
                         f"column {exc.colno}") from None
    except RecursionError:
        raise ValueError(f"{what} {str(p)!r} nests JSON arrays or objects too deeply to read") from None


def check_schema_version(d: Mapping[str, Any], known: int, what: str) -> None:
    """Refuse a ``schema_version`` that is not an integer in 1..``known`` (absent means 1)."""
    v = d.get("schema_version", 1)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{what}: schema_version {v!r} is not a positive integer")
    if v > known:
        raise ValueError(f"{what}: schema_version {v} is newer than this code reads (up to {known}); "
                         "update specscope")
