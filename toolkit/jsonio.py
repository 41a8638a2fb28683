"""Strict JSON in and out: bounded nesting, no bare ``NaN``/``Infinity``, one-line errors naming the source.

* :func:`loads` parses a document whose brackets nest at most
  :data:`MAX_DEPTH` deep (:class:`JSONTooDeep` otherwise, before the parser
  recurses), and refuses the non-standard constants ``NaN``, ``Infinity`` and
  ``-Infinity`` unless ``constants=True`` (an engine's output may hold them in
  a field nobody reads; whoever reads a field then checks it is finite);
* :func:`read_json` reads a user's JSON file (:func:`toolkit.files.read_text`,
  then :func:`loads`) with every problem as one ``ValueError`` line;
* :func:`clean_json` and :func:`strict_dumps` write: every NaN/±inf becomes
  ``null``, numpy scalars plain numbers, so what is written is standard JSON.
"""

from __future__ import annotations

import json
import math
import re
from itertools import accumulate
from pathlib import Path
from typing import Any, Mapping

from toolkit.files import read_text

#: Deepest bracket nesting :func:`loads` reads: far above any file specscope reads (under 10 levels),
#: far below the depth at which the parser runs out of stack (Python's recursion limit, 1,000).
MAX_DEPTH = 100
# A JSON string, escapes included; an unterminated one runs to the end of the text (the closing quote is
# optional), so every match attempt succeeds and the scan stays linear (with a required closing quote, one
# quote then many escaped quotes made every quote start a scan to the end: quadratic).
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = [0] * 256  # +1 for an opening bracket, -1 for a closing one
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1


class JSONTooDeep(ValueError):
    """A JSON document nested deeper than the reader allows (refused, never skipped)."""


def nests_deeper(text: str, limit: int = MAX_DEPTH) -> bool:
    """Whether the brackets of JSON ``text`` (outside strings) nest more than ``limit`` deep."""
    if text.count("[") + text.count("{") <= limit:  # too few brackets to nest that deep
        return False
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text)).encode()
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0) > limit


def loads(text: str, what: str = "JSON", *, constants: bool = False, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` with nesting bounded by ``max_depth`` and, unless ``constants``, no NaN/Infinity.

    Raises ``json.JSONDecodeError`` for text that is not JSON, :class:`JSONTooDeep`
    and ``ValueError`` (naming ``what``) for the two limits.
    """
    if nests_deeper(text, max_depth):
        raise JSONTooDeep(f"{what} nests deeper than {max_depth} levels: not a document this reads")

    def no_constants(name: str) -> float:
        raise ValueError(f"{what} holds {name}, which is not JSON; write null or a number")

    return json.loads(text) if constants else json.loads(text, parse_constant=no_constants)


def read_json(path: str | Path, what: str) -> Any:
    """The parsed content of JSON file ``path``; ``what`` ("cost model file") starts every error."""
    text = read_text(path, what)
    name = f"{what} {str(Path(path))!r}"
    try:
        return loads(text, name)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None


def clean_json(obj: Any) -> Any:
    """``obj`` with every NaN/±inf float replaced by None (recursively), for strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {str(k): clean_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean_json(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item) and not isinstance(obj, (str, bytes)):
        try:
            return clean_json(obj.item())  # numpy scalars
        except (TypeError, ValueError):
            pass
    return obj


def strict_dumps(obj: Any, **kw: Any) -> str:
    """``json.dumps`` that writes ``null`` for NaN/inf and refuses to write a bare ``NaN``."""
    return json.dumps(clean_json(obj), allow_nan=False, default=str, **kw)


def write_json(path: str | Path, obj: Any, indent: int | None = 2) -> None:
    """``obj`` written to ``path`` as strict JSON (:func:`strict_dumps`), with a final newline."""
    Path(path).write_text(strict_dumps(obj, indent=indent) + "\n")
