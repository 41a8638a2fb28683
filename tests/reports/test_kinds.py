"""reports.kinds: every kind of run has one report, picked by its calibration's file or the run's kind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from measure.runkinds import RUN_KINDS, TREES
from reports import page, serving, trees
from reports.kinds import REPORTS, find_report


def test_every_kind_of_run_has_one_report() -> None:
    reported = [k for r in REPORTS for k in r.kinds]
    assert sorted(k.name for k in reported) == sorted(RUN_KINDS)


@pytest.mark.parametrize("kind", list(RUN_KINDS.values()), ids=list(RUN_KINDS))
def test_a_calibration_is_recognised_by_its_file(tmp_path: Path, kind) -> None:
    (tmp_path / kind.calibration_file).write_text("{}")
    assert kind in find_report(tmp_path).kinds


def test_the_sections_follow_the_calibrations_kind(tmp_path: Path) -> None:
    for name, report in (("serve_calibration.json", serving.REPORT), ("tree_calibration.json", trees.REPORT),
                         ("calibration.json", page.REPORT)):
        d = tmp_path / name.split(".")[0]
        d.mkdir()
        (d / name).write_text("{}")
        assert find_report(d) is report


def test_a_run_without_its_calibration_names_the_command(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(json.dumps({"config": TREES.stamp({})}))
    with pytest.raises(ValueError, match="is a tree run without a calibration; run python -m calibrate trees"):
        find_report(tmp_path)


def test_neither_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is neither a calibration directory"):
        find_report(tmp_path)
