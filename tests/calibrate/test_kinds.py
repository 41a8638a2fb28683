"""calibrate.kinds: every kind of run has its calibrator, and ``python -m calibrate RUN_DIR...`` picks it by the
runs' kind (run directories here are a ``run.json`` only: the dispatch reads nothing else)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibrate.kinds import CALIBRATORS, CHAINS, SUBCOMMANDS, calibrator_for
from measure.runkinds import RUN_KINDS, SERVE, TREES


def _run(path: Path, kind: str | None) -> str:
    path.mkdir(parents=True)
    config = {} if kind is None else {"kind": kind}
    (path / "run.json").write_text(json.dumps({"config": config}), encoding="utf-8")
    return str(path)


def test_every_kind_of_run_has_a_calibrator_named_as_the_registry_names_it() -> None:
    assert set(RUN_KINDS.values()) == set(CALIBRATORS)
    for kind, calibrator in CALIBRATORS.items():
        assert calibrator.prog == kind.calibrate_command, kind.name


def test_a_subcommand_names_its_calibrator() -> None:
    assert SUBCOMMANDS == {"trees": CALIBRATORS[TREES], "serve": CALIBRATORS[SERVE]}
    assert calibrator_for(["trees", "r", "--max-depth", "3"]) == (CALIBRATORS[TREES], ["r", "--max-depth", "3"])


def test_the_runs_kind_picks_the_calibrator(tmp_path: Path) -> None:
    tree = _run(tmp_path / "t", "trees")
    serve = _run(tmp_path / "s", "serve")
    assert calibrator_for(["--allow-incomplete", tree]) == (CALIBRATORS[TREES], ["--allow-incomplete", tree])
    assert calibrator_for([serve, "--holdout-k", "4"])[0] is CALIBRATORS[SERVE]
    # a chain sweep (one that names no kind) and a head sweep: one calibration fits them together
    both = [_run(tmp_path / "c", None), _run(tmp_path / "h", "head_sweep"), "--out", str(tmp_path / "cal")]
    assert calibrator_for(both) == (CHAINS, both)
    assert calibrator_for(["/no/such/run"])[0] is CHAINS  # its own parser says what is wrong
    assert calibrator_for([])[0] is CHAINS


def test_runs_of_kinds_two_calibrators_fit_are_one_line(tmp_path: Path) -> None:
    chain, tree = _run(tmp_path / "c", None), _run(tmp_path / "t", "trees")
    with pytest.raises(ValueError) as e:
        calibrator_for([chain, tree])
    msg = str(e.value)
    assert f"{chain} (chain sweep)" in msg and f"{tree} (tree run)" in msg and "python -m calibrate trees" in msg


def test_the_command_line_refuses_mixed_kinds_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from calibrate.__main__ import main

    with pytest.raises(SystemExit) as e:
        main([_run(tmp_path / "s", "serve"), _run(tmp_path / "t", "trees")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m calibrate: error: the run directories are of different kinds")
    assert err.count("\n") == 1 and "serving run" in err and "tree run" in err


def test_an_unknown_kind_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from calibrate.__main__ import main

    with pytest.raises(SystemExit) as e:
        main([_run(tmp_path / "x", "beams")])
    assert e.value.code == 2
    assert "'beams' is not a kind of run" in capsys.readouterr().err
