"""benchmarks/reproduce_outputs.py: it re-makes every committed calibration, and its compare mode tells identical
files, timestamps and path fields apart from real differences (the script loaded from its file, benchmarks/ is
no package; nothing is calibrated here)."""

from __future__ import annotations

import json
from pathlib import Path

from measure.runkinds import RUN_KINDS
from tests.support.scripts import load_benchmark

ROOT = Path(__file__).resolve().parents[2]
rep = load_benchmark("reproduce_outputs")


def test_every_committed_calibration_is_re_made() -> None:
    names = {k.calibration_file for k in RUN_KINDS.values()}
    committed = {str(p.parent.relative_to(ROOT / "results")) for n in names for p in (ROOT / "results").rglob(n)
                 if "superseded" not in p.parts}
    assert committed == set(rep.CALIBRATIONS)
    for args in rep.CALIBRATIONS.values():
        assert (ROOT / args[-1] / "run.json").is_file()


def _tree(root: Path, cal: dict, csv: str) -> Path:
    (root / "c").mkdir(parents=True)
    (root / "c" / "calibration.json").write_text(json.dumps(cal))
    (root / "c" / "t.csv").write_text(csv)
    return root


def test_compare_tells_timestamps_and_paths_from_differences(tmp_path: Path, capsys) -> None:
    base = {"created_utc": "2026-11-27T10:00:00Z", "runs": {"r": {"path": "/abs/r", "status": "complete"}},
            "mape": {"trace": 1.5}}
    a = _tree(tmp_path / "a", base, "x\n1\n")
    b = _tree(tmp_path / "b", {**base, "created_utc": "2026-11-27T11:00:00Z"}, "x\n1\n")
    assert rep.compare_trees(a, b) == 0
    assert "timestamps  c/calibration.json" in capsys.readouterr().out
    c = _tree(tmp_path / "c", {**base, "runs": {"r": {"path": "../r", "status": "complete"}}}, "x\n1\n")
    assert rep.compare_trees(a, c) == 0
    out = capsys.readouterr().out
    assert "paths       c/calibration.json" in out and "runs.r.path: '/abs/r' -> '../r'" in out
    d = _tree(tmp_path / "d", {**base, "mape": {"trace": 1.5000000001}}, "x\n2\n")
    (d / "c" / "extra.json").write_text("{}")
    assert rep.compare_trees(a, d) == 1
    out = capsys.readouterr().out
    assert "differs     c/calibration.json" in out and "mape.trace: 1.5 -> 1.5000000001" in out
    assert "differs     c/t.csv" in out and "only in one c/extra.json" in out
    assert "4 files" not in out and "3 files: 2 differs, 1 only in one" in out
