"""Every JSON file calibrate writes is checked before it is written (issue #45): finite, physical models only.

Before :mod:`calibrate.written`, the one-prompt run's calibration wrote a bare ``NaN`` into its cost-model
file (a standard error nobody could estimate), which ``python -m sim`` then refused to read, and nothing
stopped an unphysical model from being written.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from calibrate.written import CalibrationFiles, check_models, write_calibration, write_checked
from sim.cost import TabulatedCost, load_cost_model
from toolkit.jsonio import loads


def _model(**over) -> dict:
    d = TabulatedCost({1: 50.0, 4: 100.0}, draft_step_ms_ref=0.03, reference_context_tokens=160.0,
                      metadata={"source": "calibrate", "stderr": {"draft_step_ms": math.nan}}).describe()
    return {**d, **over}


def test_nan_is_written_as_null_and_the_model_reads_back(tmp_path: Path):
    path = tmp_path / "cost_model-d.json"
    write_checked(path, _model())
    text = path.read_text()
    assert "NaN" not in text
    assert loads(text)["metadata"]["stderr"]["draft_step_ms"] is None
    assert isinstance(load_cost_model(path), TabulatedCost)


def test_an_impossible_model_deep_in_a_document_is_not_written(tmp_path: Path):
    path = tmp_path / "calibration.json"
    doc = {"cost_models": {"cost_model-d": {"run": "r", "cost_model": _model(target_context_ms_per_token=-0.2)}}}
    with pytest.raises(ValueError) as exc:
        write_checked(path, doc)
    msg = str(exc.value)
    assert msg.startswith(f"refusing to write {path}: the cost model at /cost_models/cost_model-d/cost_model: ")
    assert "field 'target_context_ms_per_token' is -0.2" in msg and "\n" not in msg
    assert not path.exists()


def test_a_nan_in_a_model_field_is_refused_not_written_as_null():
    with pytest.raises(ValueError, match="field 'draft_step_ms_ref' must be a finite number, got None"):
        check_models({"cost_model": _model(draft_step_ms_ref=math.nan)}, "cost_model.json")


def test_acceptance_models_are_checked_too():
    with pytest.raises(ValueError, match="refusing to write acceptance.json: the acceptance model: "):
        check_models({"kind": "iid", "alpha": 1.5}, "acceptance.json")
    assert check_models({"kind": "iid", "alpha": 0.5, "note": math.inf}, "a.json") == {
        "kind": "iid", "alpha": 0.5, "note": None}


def test_documents_without_models_are_written_as_strict_json(tmp_path: Path):
    path = tmp_path / "summary.json"
    write_checked(path, {"mape": {"closed_form": math.nan}, "rows": [{"kind": "serve", "x": 1}]})
    assert json.loads(path.read_text()) == {"mape": {"closed_form": None}, "rows": [{"kind": "serve", "x": 1}]}


def test_a_calibration_with_a_refused_model_writes_nothing(tmp_path: Path):
    out = tmp_path / "cal"
    files = CalibrationFiles({"advice.json": {"ok": 1}, "cost_model-tree.json": _model(draft_step_ms_ref=-1.0)},
                             {"rows.csv": [{"a": 1}]})
    with pytest.raises(ValueError) as exc:
        write_calibration(out, files)
    msg = str(exc.value)
    assert msg.startswith(f"refusing to write {out / 'cost_model-tree.json'}: ") and "'draft_step_ms_ref'" in msg
    assert not out.exists()  # checked whole before anything is written, not even the directory


def test_a_calibration_is_written_whole(tmp_path: Path):
    import pandas as pd

    files = CalibrationFiles({"cal.json": {"x": math.nan}, "trace.json": {"a": [1, 2]}},
                             {"frame.csv": pd.DataFrame({"a": [1.5, None]}), "rows.csv": [{"a": 1}, {"b": None}]},
                             compact=frozenset({"trace.json"}))
    write_calibration(tmp_path / "cal", files)
    d = tmp_path / "cal"
    assert json.loads((d / "cal.json").read_text()) == {"x": None}
    assert (d / "trace.json").read_text().count("\n") <= 1  # on one line
    assert (d / "frame.csv").read_text() == "a\n1.5\n\"\"\n" and (d / "rows.csv").read_text() == "a,b\n1,\n,\n"
