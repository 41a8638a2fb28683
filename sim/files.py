"""The JSON files the simulator is handed (cost and acceptance models): their ``schema_version``.

The files are read by :func:`toolkit.jsonio.read_json` (every problem a
one-line ``ValueError`` naming the file: not found, a directory, unreadable,
not UTF-8 text, not JSON with line and column, a non-standard constant
``NaN``/``Infinity``, nested too deep); here the version is checked: a
``schema_version`` newer than this code knows is refused.
"""

from __future__ import annotations

from typing import Any, Mapping


def check_schema_version(d: Mapping[str, Any], known: int, what: str) -> None:
    """Refuse a ``schema_version`` that is not an integer in 1..``known`` (absent means 1)."""
    v = d.get("schema_version", 1)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{what}: schema_version {v!r} is not a positive integer")
    if v > known:
        raise ValueError(f"{what}: schema_version {v} is newer than this code reads (up to {known}); "
                         "update specscope")
