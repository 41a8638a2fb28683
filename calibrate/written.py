"""Every JSON file ``calibrate`` writes passes here: checked, then written as strict JSON.

One place for every writer (``python -m calibrate``, ``calibrate serve``,
``calibrate trees``, ``calibrate ingest``): :func:`write_checked` walks the
document and reads every model in it back with the reader ``python -m sim``
uses — a cost model (``kind`` ``tabulated`` or ``leviathan``) with
:func:`sim.cost.cost_model_from_dict`, which checks its numbers are finite
and in their physical ranges (:func:`sim.cost.check_physical`), an
acceptance model with :func:`sim.acceptance.acceptance_from_dict`. A model
that reader would refuse is not written: the write is refused in one line
naming the file, where in it the model is, and the field. Everything else
is written as :func:`toolkit.jsonio.write_json` writes it: a NaN or an
infinity (a standard error nobody could estimate, a prediction that could
not be made) becomes ``null``, so no file holds a bare ``NaN``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from sim.acceptance import ACCEPTANCE_KINDS, acceptance_from_dict
from sim.cost import cost_model_from_dict
from toolkit.cli import fail
from toolkit.jsonio import clean_json, write_json

#: The cost-model kinds ``python -m sim --cost-model`` reads.
COST_KINDS = ("tabulated", "leviathan")


def _models(obj: Any, where: str) -> list[tuple[str, Mapping[str, Any]]]:
    """Every (location, dict) in ``obj`` whose ``kind`` is a model ``python -m sim`` reads."""
    found: list[tuple[str, Mapping[str, Any]]] = []
    if isinstance(obj, Mapping):
        if obj.get("kind") in COST_KINDS or obj.get("kind") in ACCEPTANCE_KINDS:
            found.append((where, obj))
        for k, v in obj.items():
            found += _models(v, f"{where}/{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            found += _models(v, f"{where}/{i}")
    return found


def check_models(obj: Any, what: str) -> Any:
    """``obj`` as strict JSON values (NaN/inf → None) after every model in it reads back; else a one-line
    ``ValueError`` starting with ``what`` (the file) and naming the model's place and field."""
    clean = clean_json(obj)
    for where, model in _models(clean, ""):
        kind = "cost" if model.get("kind") in COST_KINDS else "acceptance"
        try:
            (cost_model_from_dict if kind == "cost" else acceptance_from_dict)(model)
        except ValueError as exc:
            at = f" at {where}" if where else ""
            raise ValueError(f"refusing to write {what}: the {kind} model{at}: {exc}") from None
    return clean


def write_checked(path: str | Path, obj: Any, indent: int | None = 2) -> None:
    """Write ``obj`` to ``path`` as strict JSON once :func:`check_models` passes it."""
    write_json(path, check_models(obj, str(path)), indent=indent)


def write_all_or_fail(prog: str, out: Path, docs: Mapping[str, Any]) -> None:
    """Write each ``{file name: document}`` into ``out`` (:func:`write_checked`); a refused model is one
    ``PROG: error:`` line and exit status 2 (:func:`toolkit.cli.fail`), not a traceback."""
    try:
        for name, doc in docs.items():
            write_checked(out / name, doc)
    except ValueError as exc:
        fail(prog, exc)


__all__ = ["COST_KINDS", "check_models", "write_all_or_fail", "write_checked"]
