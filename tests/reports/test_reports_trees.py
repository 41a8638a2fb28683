"""The token-tree report: speedup against verify budget, chains and trees, measured with CIs beside predicted."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from reports.trees import measured_frame, speedup_vs_budget_chart, tree_calibration_dir

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "results" / "cpu-trees-smollm2-int8"


def _frames() -> tuple[pd.DataFrame, pd.DataFrame]:
    pred = pd.DataFrame([
        {"split": "held_out", "kind": "chain", "shape": "gamma=2", "loop": "chain", "n_nodes": 2,
         "measured_speedup": 0.8, "measured_speedup_lo": 0.75, "measured_speedup_hi": 0.85, "predicted_speedup": 0.82},
        {"split": "held_out", "kind": "tree", "shape": "[[0],[1],[0,0]]", "loop": "tree", "n_nodes": 3,
         "measured_speedup": 0.9, "measured_speedup_lo": 0.86, "measured_speedup_hi": 0.94, "predicted_speedup": 0.88},
        {"split": "in_sample", "kind": "tree", "shape": "[[0],[1],[0,0]]", "loop": "tree", "n_nodes": 3,
         "measured_speedup": 0.9, "measured_speedup_lo": 0.86, "measured_speedup_hi": 0.94, "predicted_speedup": 0.9},
    ])
    curves = pd.DataFrame([{"budget": b, "series": s, "predicted_speedup": 0.7 + 0.05 * b, "paths": "[[0]]"}
                           for b in (1, 2, 3) for s in ("best tree", "chain (tree loop)")])
    return pred, curves


def test_the_chart_has_measured_cis_held_out_predictions_and_curves():
    pred, curves = _frames()
    spec = speedup_vs_budget_chart(pred, curves).to_dict()
    layers = spec["layer"]
    marks = [lay["mark"]["type"] if isinstance(lay["mark"], dict) else lay["mark"] for lay in layers]
    assert marks == ["line", "rule", "point", "point"]  # predicted lines, CI bars, measured, held-out predicted
    assert layers[1]["encoding"]["y"]["field"] == "measured_speedup_lo"
    assert layers[1]["encoding"]["y2"]["field"] == "measured_speedup_hi"
    assert layers[3]["encoding"]["y"]["field"] == "predicted_speedup"
    held = measured_frame(pred)
    assert list(held["budget"]) == [2, 3]  # held-out rows only, at their verify budget


def test_bad_tables_are_one_line():
    pred, curves = _frames()
    with pytest.raises(ValueError, match="missing columns"):
        speedup_vs_budget_chart(pred.drop(columns=["n_nodes"]), curves)
    with pytest.raises(ValueError, match="no held-out rows"):
        speedup_vs_budget_chart(pred[pred["split"] == "in_sample"], curves)
    with pytest.raises(ValueError, match="no rows to plot"):
        speedup_vs_budget_chart(pred, curves.iloc[:0])


def test_a_tree_run_without_its_calibration_is_refused(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"config": {"kind": "trees"}}))
    with pytest.raises(ValueError, match="tree run without a calibration"):
        tree_calibration_dir(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps({"config": {"kind": "serve"}}))
    assert tree_calibration_dir(tmp_path) is None


def test_report_page_of_the_committed_tree_calibration(tmp_path, capsys):
    """python -m reports on the committed tree run (its calibration/) writes the page with the chart in it."""
    from reports.__main__ import main

    assert (RUN / "calibration" / "tree_calibration.json").is_file()
    assert main([str(RUN), "--out", str(tmp_path / "rep"), "--no-png"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc["charts"] == ["speedup_vs_budget"]
    page = (tmp_path / "rep" / "report.html").read_text()
    assert "<svg" in page and "Speedup against verify budget" in page and "Does branching pay here?" in page
    assert (tmp_path / "rep" / "speedup_vs_budget.html").is_file()
