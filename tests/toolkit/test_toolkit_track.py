"""toolkit.track: the W&B and MLflow adapters, read back with each library's own tools (tests/support/trackers.py).

The libraries run for real, offline (W&B offline mode, an MLflow file store
under tmp). Every failure a user can meet (library missing, not logged in,
server unreachable, a file store MLflow refuses, an error while logging)
must cost exactly one warning line and leave nothing half-open.
"""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit import track
from toolkit.track import TRACKERS, flatten, metric_name, start_tracker

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("wandb")
pytest.importorskip("mlflow")

from tests.support.trackers import (  # noqa: E402
    mlflow_artifacts,
    mlflow_runs,
    mlflow_table,
    offline_env,
    use_offline_env,
    wandb_artifacts,
    wandb_inspect,
    wandb_run_dirs,
    wandb_table,
)

CELL = "draft=ngram:3|gamma=fixed:4|temp=0|domain=code"


def test_metric_name_is_accepted_by_both_trackers() -> None:
    assert metric_name("speedup", CELL) == "speedup/draft-ngram:3/gamma-fixed:4/temp-0/domain-code"
    assert metric_name("alpha_1_lo", "draft=model:hf:A/B (x)") == "alpha_1_lo/draft-model:hf:A/B _x_"
    from mlflow.utils.validation import _validate_metric_name

    _validate_metric_name(metric_name("speedup", "draft=a,b|gamma=fixed:2|k=1e3"))  # MLflow's own check
    with pytest.raises(ValueError, match="non-empty"):
        metric_name("speedup", "")


def test_flatten_gives_dotted_text_params() -> None:
    flat = flatten({"config": {"gammas": ["fixed:2", "fixed:4"], "seed": 0, "prompts": {"sha": "ab"}},
                    "empty": {}, "none": None, "flag": True})
    assert flat == {"config.gammas": '["fixed:2","fixed:4"]', "config.seed": "0", "config.prompts.sha": "ab",
                    "empty": "{}", "none": "null", "flag": "true"}


def _log_everything(kind: str, tmp_path: Path) -> track.Tracker:
    data = tmp_path / "rundir"
    (data / "sub").mkdir(parents=True)
    (data / "run.json").write_text('{"a": 1}')
    (data / "sub" / "cells.csv").write_text("cell_id,speedup\nx,1.1\n")
    (data / ".specscope.lock").write_text("123\n")  # a writer's lock: left out by name
    with start_tracker(kind, run_name="unit run", job_type="measure", prog="unit", tags=("measure",)) as t:
        assert t.active
        t.log_params({"config": {"gammas": ["fixed:2"], "seed": 7}, "fingerprint": {"target": "smollm2-135m"},
                      "long": "x" * 7000})
        t.log_metrics({metric_name("speedup", CELL): 1.25, metric_name("speedup_lo", CELL): 1.1,
                       metric_name("speedup_hi", CELL): 1.4, metric_name("unstable", CELL): True,
                       "missing": None, "nan": math.nan, "text": "n/a"})
        t.log_table("cells", ["cell_id", "speedup", "note"], [[CELL, 1.25, None], ["other", math.nan, "x"]])
        t.log_files(data, "measure-run-rundir", "run-directory", exclude=(".specscope.lock",))
    return t


@pytest.mark.parametrize("kind", TRACKERS)
@pytest.mark.slow
def test_a_run_is_logged_and_read_back(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture) -> None:
    env = use_offline_env(monkeypatch, tmp_path)
    t = _log_everything(kind, tmp_path)
    assert t.failed is None and t.tracked is not None and t.tracked.tracker == kind
    assert capsys.readouterr().err == ""  # the libraries' own chatter is silenced
    speedup = metric_name("speedup", CELL)
    if kind == "wandb":
        (run_dir,) = wandb_run_dirs(env)
        assert t.tracked.offline and t.tracked.location == str(run_dir)
        assert "wandb sync" in t.tracked.describe()
        doc = wandb_inspect(run_dir)
        assert doc["state"] == "finished" and doc["project"] == "specscope-test" and doc["name"] == "unit run"
        assert doc["config"]["config"] == {"gammas": ["fixed:2"], "seed": 7}
        assert doc["config"]["fingerprint"]["target"] == "smollm2-135m"
        s = doc["summary"]
        assert s[speedup] == 1.25 and s[metric_name("speedup_hi", CELL)] == 1.4
        assert s[metric_name("unstable", CELL)] == 1 and not {"missing", "nan", "text"} & set(s)
        cells = wandb_table(run_dir, s["cells"])
        arts = wandb_artifacts(run_dir)
        assert arts["measure-run-rundir"] == {"type": "run-directory", "paths": ["run.json", "sub/cells.csv"]}
    else:
        (run,) = mlflow_runs(env)
        assert run.info.status == "FINISHED" and run.info.run_name == "unit run"
        assert t.tracked.run_id == run.info.run_id and t.tracked.location == env["MLFLOW_TRACKING_URI"]
        p, m = run.data.params, run.data.metrics
        assert p["config.gammas"] == '["fixed:2"]' and p["config.seed"] == "7"
        assert p["fingerprint.target"] == "smollm2-135m"
        assert len(p["long"]) == 6000 and p["long"].endswith("…")  # MLflow's limit: cut, not refused
        assert m[speedup] == 1.25 and m[metric_name("speedup_lo", CELL)] == 1.1 and m[metric_name("unstable", CELL)] == 1
        assert not {"missing", "nan", "text"} & set(m)
        assert run.data.tags["specscope.job_type"] == "measure"
        cells = mlflow_table(env, run, "cells")
        assert sorted(mlflow_artifacts(env, run.info.run_id, "measure-run-rundir")) == [
            "measure-run-rundir/run.json", "measure-run-rundir/sub"]
        assert mlflow_artifacts(env, run.info.run_id, "measure-run-rundir/sub") == ["measure-run-rundir/sub/cells.csv"]
    assert list(cells["cell_id"]) == [CELL, "other"] and cells["speedup"].iloc[0] == 1.25
    assert cells["speedup"].isna().iloc[1]  # NaN travels as a missing value


def test_metric_names_that_would_collide_in_a_file_store_are_refused() -> None:
    t = track.Tracker("mlflow", "unit")
    with pytest.raises(ValueError, match="'n_cells' is also the folder"):
        t.log_metrics({"n_cells": 6, "n_cells/draft-int8": 3})


def _one_run(env: dict[str, str], kind: str, body: str = "t.log_metrics({'a': 1})") -> subprocess.CompletedProcess:
    code = ("from toolkit.track import start_tracker\n"
            f"with start_tracker({kind!r}, run_name='r', job_type='measure', prog='python -m measure') as t:\n"
            f"    {body}\n"
            "print('tracked' if t.tracked else 'not tracked')\n")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def _env(tmp_path: Path, **changes: str | None) -> dict[str, str]:
    env = {**os.environ, **offline_env(tmp_path)}
    env.pop("WANDB_API_KEY", None)
    env["NETRC"] = str(tmp_path / "no-netrc")
    for k, v in changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("kind, changes, reason", [
    ("wandb", {"WANDB_MODE": None}, "not logged in to W&B"),
    ("wandb", {"WANDB_MODE": "online", "WANDB_API_KEY": "x" * 40, "WANDB_BASE_URL": "http://127.0.0.1:{port}"},
     "cannot reach http://127.0.0.1:{port}"),
    ("mlflow", {"MLFLOW_TRACKING_URI": "http://127.0.0.1:{port}"}, "cannot reach http://127.0.0.1:{port}"),
    ("mlflow", {"MLFLOW_ALLOW_FILE_STORE": None}, "only with MLFLOW_ALLOW_FILE_STORE=true"),
])
@pytest.mark.slow
def test_a_tracker_that_cannot_start_costs_one_warning_line(kind: str, changes: dict, reason: str,
                                                             tmp_path: Path) -> None:
    port = _free_port()
    changes = {k: v.format(port=port) if v else v for k, v in changes.items()}
    proc = _one_run(_env(tmp_path, **changes), kind)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"python -m measure: warning: --track {kind}: ")
    assert reason.format(port=port) in lines[0] and "not tracked" in lines[0]
    assert proc.stdout.strip() == "not tracked"


def test_a_missing_library_costs_one_warning_line(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setitem(track._LIBRARIES, "wandb", ("wandb_not_installed_here", "wandb"))
    assert "wandb_not_installed_here is not installed" in track.missing_library("wandb")
    with start_tracker("wandb", run_name="r", job_type="measure", prog="unit") as t:
        t.log_params({"a": 1})
        t.log_metrics({"a": 1.0})
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["unit: warning: --track wandb: wandb_not_installed_here is not installed (pip install "
                   "'specscope[track]', or pip install wandb); not tracked (the results on disk are complete)"]
    assert t.tracked is None and not t.active


@pytest.mark.parametrize("kind", TRACKERS)
def test_an_error_while_logging_costs_one_warning_line(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture) -> None:
    env = use_offline_env(monkeypatch, tmp_path)
    with start_tracker(kind, run_name="r", job_type="measure", prog="unit") as t:
        t.log_metrics({"a": 1.0})
        t.log_files(tmp_path / "nothing-here", "x")  # a tracker failure: one line
        t.log_metrics({"b": 2.0})  # a no-op from now on
        raise RuntimeError("the caller's own bug")  # swallowed too: still the one line
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nothing-here" in err[0] and err[0].startswith(f"unit: warning: --track {kind}:")
    assert t.tracked is None
    if kind == "mlflow":
        (run,) = mlflow_runs(env)
        assert run.info.status == "FAILED" and set(run.data.metrics) == {"a"}
    else:
        (run_dir,) = wandb_run_dirs(env)
        doc = wandb_inspect(run_dir)
        assert doc["exit_code"] == 1 and "b" not in doc["summary"]


def test_unknown_tracker_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown tracker 'neptune'; valid: wandb, mlflow"):
        start_tracker("neptune", run_name="r", job_type="measure", prog="unit")


def test_nothing_imports_a_tracker_library_until_asked() -> None:
    code = ("import sys, toolkit.track, measure.tracking, calibrate.tracking, measure.cli, calibrate.__main__, "
            "calibrate.chain_cli, calibrate.ingest.cli, specscope.cli\n"
            "print(sorted(m for m in ('wandb', 'mlflow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_mlflow_default_store_is_its_sqlite_file(tmp_path: Path) -> None:
    """No MLFLOW_TRACKING_URI: MLflow's own default, ``sqlite:///mlflow.db`` in the working directory."""
    pytest.importorskip("sqlalchemy")
    env = _env(tmp_path, MLFLOW_TRACKING_URI=None, MLFLOW_ALLOW_FILE_STORE=None, PYTHONPATH=str(ROOT))
    code = ("from toolkit.track import start_tracker\n"
            "with start_tracker('mlflow', run_name='r', job_type='measure', prog='p') as t:\n"
            "    t.log_metrics({'speedup/draft-int8': 1.5})\n"
            "print(t.tracked.location)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    db = tmp_path / "mlflow.db"
    assert proc.stdout.strip() == f"sqlite:///{db}"
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{db}")
    (run,) = client.search_runs([client.get_experiment_by_name("specscope-test").experiment_id])
    assert run.data.metrics == {"speedup/draft-int8": 1.5}
