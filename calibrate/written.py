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

:func:`write_calibration` is every kind's one writer of a calibration
(:class:`CalibrationFiles`: its documents and tables by file name), every
document checked before any file is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from sim.acceptance import ACCEPTANCE_KINDS, acceptance_from_dict
from sim.cost import cost_model_from_dict
from toolkit.files import write_dict_rows
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


@dataclass(frozen=True)
class CalibrationFiles:
    """Every file of one calibration, by name: JSON documents (each checked, :func:`check_models`; those named
    in ``compact`` on one line) and tables (a DataFrame, written without its index, or rows of dicts,
    :func:`toolkit.files.write_dict_rows`)."""

    documents: Mapping[str, Any]
    tables: Mapping[str, Any] = field(default_factory=dict)
    compact: frozenset[str] = frozenset()


def write_calibration(out: Path, files: CalibrationFiles) -> None:
    """Write a calibration's files into ``out`` (made if missing): every kind's one writer.

    Every document is checked before anything is written: a model ``python -m sim`` would refuse is a one-line
    ``ValueError`` naming the file, where in it the model is, and the field, and nothing is written."""
    checked = {name: check_models(doc, str(out / name)) for name, doc in files.documents.items()}
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot create output directory {str(out)!r}: {exc.strerror or exc}") from None
    for name, doc in checked.items():
        write_json(out / name, doc, indent=None if name in files.compact else 2)
    for name, table in files.tables.items():
        if isinstance(table, list):
            write_dict_rows(out / name, table)
        else:
            table.to_csv(out / name, index=False)


__all__ = ["COST_KINDS", "CalibrationFiles", "check_models", "write_calibration", "write_checked"]
