"""Small text helpers shared by the engine parsers: ``Name: value`` fields, numbers, JSON lines, line scans.

JSON is read by :func:`toolkit.jsonio.loads`: nesting bounded (a document
deeper than :data:`toolkit.jsonio.MAX_DEPTH` is refused in one line, not a
RecursionError), ``NaN``/``Infinity`` read as floats so that :func:`count`
and the records refuse them by field name where a figure is used.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Callable, Iterable, Iterator, TypeVar

from calibrate.ingest.records import ImpossibleFigure, Observation, ParseResult
from toolkit.jsonio import JSONTooDeep, loads

T = TypeVar("T")

# A comma ends a field only when a "Name:" follows, so lists such as "0.837, 0.669" stay whole.
_FIELD_SPLIT = re.compile(r",\s*(?=[#A-Za-z][^:,]*:)")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def split_fields(text: str) -> dict[str, str]:
    """``"A: 1, B c: 2.5%, D: 0.1, 0.2"`` → ``{"a": "1", "b c": "2.5%", "d": "0.1, 0.2"}`` (keys lower-case)."""
    out: dict[str, str] = {}
    for part in _FIELD_SPLIT.split(text.strip().rstrip(",").rstrip(".")):
        if ":" not in part:
            continue
        key, value = part.split(":", 1)
        out[key.strip().lower()] = value.strip()
    return out


def number(text: str | None) -> float | None:
    """The first number in ``text`` (``"337 tokens"`` → 337.0), None when there is none."""
    if text is None:
        return None
    m = _NUMBER.search(text)
    return float(m.group(0)) if m else None


def numbers(text: str) -> list[float]:
    """Every number in ``text`` in order."""
    return [float(x) for x in _NUMBER.findall(text)]


def percent(text: str | None) -> float | None:
    """``"67.7%"`` → 0.677; a bare fraction is returned as is."""
    v = number(text)
    if v is None or text is None:
        return None
    return v / 100.0 if "%" in text else v


def count(source: str, obj: dict, key: str) -> int | None:
    """``obj[key]`` as a count: None when absent or null; an :class:`ImpossibleFigure` naming ``key`` when it is
    NaN, infinite, negative or fractional; ``TypeError``/``ValueError`` (the caller skips) when it is no number."""
    v = obj.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise TypeError(f"{key}: {v!r} is not a number")
    x = float(v)  # "12" -> 12.0; "abc" -> ValueError
    if not math.isfinite(x) or x < 0 or not x.is_integer():
        raise ImpossibleFigure(f"{source}: {key} is {v!r}: a count must be a finite whole number >= 0")
    return int(x)


def counts(source: str, key: str, values: Any) -> list[int]:
    """Every item of list ``values`` (the field ``key``) as a count (:func:`count`)."""
    if not isinstance(values, list):
        raise TypeError(f"{key}: {values!r} is not a list")
    out = []
    for v in values:
        c = count(source, {key: v}, key)
        if c is None:
            raise TypeError(f"{key}: null in {values!r}")
        out.append(c)
    return out


def json_objects(text: str, path: str = "JSON") -> Iterator[tuple[int, Any | None]]:
    """(line number, parsed object or None if unreadable) for a JSON document or JSON lines of file ``path``.

    A whole-file JSON array yields its items (line 0); otherwise every
    non-blank line is parsed, an SSE ``data:`` prefix stripped. A document
    nested too deep is refused (:class:`toolkit.jsonio.JSONTooDeep`), never skipped.
    """
    stripped = text.strip()
    deep: JSONTooDeep | None = None  # the whole text too deep: JSON lines (one truncated leaves brackets open)?
    if stripped.startswith(("[", "{")):
        try:
            doc = loads(stripped, path, constants=True)
        except json.JSONDecodeError:
            doc = None
        except JSONTooDeep as exc:
            doc, deep = None, exc
        if isinstance(doc, list):
            for item in doc:
                yield 0, item
            return
        if doc is not None:
            yield 0, doc
            return
    parsed = 0
    for i, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if line.startswith("data:"):
            line = line[5:].strip()
        if not line or line == "[DONE]":
            continue
        try:
            obj = loads(line, f"{path}:{i}", constants=True)
        except json.JSONDecodeError:
            yield i, None
            continue
        parsed += 1
        yield i, obj
    if deep is not None and not parsed:
        raise deep


def find_key(obj: Any, key: str, depth: int = 0) -> Any | None:
    """The value of the first ``key`` found in nested dicts/lists (depth-first, at most 6 levels)."""
    if depth > 6:
        return None
    children: Iterable[Any]
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        children = obj.values()
    elif isinstance(obj, list):
        children = obj
    else:
        return None
    for v in children:
        found = find_key(v, key, depth + 1)
        if found is not None:
            return found
    return None


def _result(engine: str, default_fmt: str, obs: list[Observation], skipped: int) -> ParseResult:
    return ParseResult(engine, "/".join(sorted({o.fmt for o in obs})) or default_fmt, tuple(obs), skipped)


def scan_lines(engine: str, default_fmt: str, path: str, text: str, match: Callable[[str], T | None],
               convert: Callable[[str, T], Observation | None]) -> ParseResult | None:
    """Every line ``match`` recognises is converted (``path:line`` as source); None when no line matched.

    A recognised line that ``convert`` cannot read (truncated, inconsistent) counts as skipped.
    """
    obs: list[Observation] = []
    seen = skipped = 0
    for i, line in enumerate(text.splitlines(), start=1):
        m = match(line)
        if m is None:
            continue
        seen += 1
        o = convert(f"{path}:{i}", m)
        if o is None:
            skipped += 1
        else:
            obs.append(o)
    return _result(engine, default_fmt, obs, skipped) if seen else None


def scan_json(engine: str, default_fmt: str, path: str, text: str, extract: Callable[[Any], list[T]],
              convert: Callable[[str, T], Observation | None]) -> ParseResult | None:
    """Every item ``extract`` finds in the JSON objects of ``text`` is converted; None when none was found.

    Unreadable JSON lines and items ``convert`` cannot read count as skipped.
    """
    obs: list[Observation] = []
    seen = skipped = 0
    for line, obj in json_objects(text, path):
        if obj is None:
            skipped += 1
            continue
        for item in extract(obj):
            seen += 1
            o = convert(f"{path}:{line}" if line else path, item)
            if o is None:
                skipped += 1
            else:
                obs.append(o)
    return _result(engine, default_fmt, obs, skipped) if seen else None
