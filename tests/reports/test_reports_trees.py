"""The token-tree report: speedup against verify budget, chains and trees, measured with CIs beside predicted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from reports.trees import measured_frame, speedup_vs_budget_chart, tree_calibration_dir
from tests.support import damage

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


def test_a_tree_run_moved_with_its_calibration_still_reports(tmp_path):
    """tree_calibration.json names its run relative to itself (``..`` in ``RUN/calibration``): the two moved
    together still make the page, titled by the run's name."""
    from reports.trees import build_trees_report

    shutil.copytree(RUN, tmp_path / "a" / "trees", ignore=shutil.ignore_patterns("report"))
    cal = tmp_path / "a" / "trees" / "calibration" / "tree_calibration.json"
    cal.write_text(json.dumps({**json.loads(cal.read_text()), "run": ".."}))  # as calibrate trees now writes it
    (tmp_path / "a").rename(tmp_path / "b")
    res = build_trees_report(tmp_path / "b" / "trees", tmp_path / "rep", png=False)
    page = res.html_path.read_text()
    assert "Speedup against verify budget" in page and "int8 draft, trees" in page


@pytest.mark.parametrize("hurt,needle", [
    (lambda d: damage.tear_row(d / "tree_predictions.csv"), "tree_predictions.csv': line 3 has 3 fields"),
    (lambda d: damage.set_value(d / "tree_predictions.csv", "measured_speedup", "inf"), "column measured_speedup: inf"),
    (lambda d: damage.drop_column(d / "tree_predictions.csv", "ape_speedup_pct"), "has no column ape_speedup_pct"),
    (lambda d: damage.cut_in_half(d / "tree_curves.csv"), "tree_curves.csv'"),
    (lambda d: damage.write(d / "tree_curves.csv", damage.rows(d / "tree_curves.csv")[:5]),
     "tree_curves.csv' holds the best tree at 2 of the 6 budgets"),
    (lambda d: (d / "advice.json").unlink(), "has no advice.json; re-run python -m calibrate trees"),
    (lambda d: (d / "tree_calibration.json").write_text("{}"), "tree_calibration.json' has no 'run'"),
])
def test_a_damaged_tree_calibration_is_one_line_and_draws_nothing(tmp_path, hurt, needle):
    """Issue 43: each drew a page from what was left (no answer, half the curves) or ended in a KeyError."""
    from tests.support.cli_inprocess import run_module

    d = tmp_path / "cal"
    shutil.copytree(RUN / "calibration", d, ignore=shutil.ignore_patterns("report"))
    hurt(d)
    r = run_module("reports", [str(d), "--out", str(tmp_path / "rep"), "--no-png"])
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1 and err[0].startswith("python -m reports: error: "), r.stderr
    assert needle in err[0] and "calibrate trees to write it again" in err[0]
    assert not (tmp_path / "rep").exists()
