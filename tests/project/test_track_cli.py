"""``--track wandb|mlflow`` on the CLIs, end to end: real runs logged offline, read back with each library's tools.

The issue's test: a ``measure`` run and a ``calibrate`` run logged with
``--track wandb`` (offline) and ``--track mlflow`` (file store) can be read
back and hold the cells' speedups and CIs. The measure runs are real runs
of the CLI (one prompt, 8 tokens; slow: a process each, and wandb's service)
on a tiny random-weight Llama saved here, since what is tested is the logging,
not the model; the calibrations are of the committed default job. A tracker
that cannot work costs one warning line and leaves the command's results and
exit status as they were (checked through the CLIs' ``main`` in this process
where a process of the same CLI is run by the tests above).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("wandb")
pytest.importorskip("mlflow")

from toolkit.track import metric_name  # noqa: E402
from tests.support.cli_inprocess import run_main, run_module  # noqa: E402
from tests.support.trackers import mlflow_runs, offline_env, wandb_artifacts, wandb_inspect, wandb_run_dirs  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "results" / "cpu-make-run-fresh3"
VLLM = ROOT / "tests" / "fixtures" / "engines" / "vllm" / "metrics-after.prom"
SMALL = ("--prompts", "1", "--max-new-tokens", "8", "--gamma", "2", "--domains", "code", "--repeats", "1",
         "--no-cost", "--no-traces", "--no-peer", "--no-system-check", "--quiet", "--no-progress")


def _env(tmp: Path, **changes: str) -> dict[str, str]:
    env = {**os.environ, **offline_env(tmp), **changes}
    env.pop("WANDB_API_KEY", None)
    (tmp / "wb").mkdir(parents=True, exist_ok=True)
    return env


def _run(args: list[str], env: dict[str, str], timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _logged(kind: str, env: dict[str, str]) -> tuple[dict, dict]:
    """(metrics, params) of the one tracker run logged under ``env``, read back with the library's own tools."""
    if kind == "wandb":
        (run_dir,) = wandb_run_dirs(env)
        doc = wandb_inspect(run_dir)
        assert doc["state"] == "finished"
        return doc["summary"], doc["config"]
    (run,) = mlflow_runs(env)
    assert run.info.status == "FINISHED"
    return run.data.metrics, run.data.params


def _assert_cells(metrics: dict, cells: pd.DataFrame) -> None:
    """The tracker holds every cell's speedup and its CI, as on disk."""
    assert len(cells)
    for r in cells.to_dict("records"):
        for key in ("speedup", "speedup_lo", "speedup_hi"):
            if pd.notna(r[key]):
                assert metrics[metric_name(key, r["cell_id"])] == pytest.approx(r[key])
            else:  # one (prompt, repeat) pair has no interval: nothing logged rather than NaN
                assert metric_name(key, r["cell_id"]) not in metrics


@pytest.mark.slow
@pytest.mark.parametrize("kind, entry", [("wandb", ["-m", "measure"]), ("mlflow", ["-m", "specscope", "measure"])])
def test_a_real_measure_run_is_tracked(kind: str, entry: list[str], tiny_llama_dir: str, tmp_path: Path) -> None:
    env = _env(tmp_path)
    out = tmp_path / "run"
    proc = _run([*entry, "--target", tiny_llama_dir, *SMALL, "--out", str(out), "--track", kind], env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["run_dir"] == str(out)  # still the last line
    assert f"tracked: {kind}" in proc.stderr and "warning" not in proc.stderr
    metrics, params = _logged(kind, env)
    cells = pd.read_csv(out / "cells.csv")
    _assert_cells(metrics, cells)
    assert metrics[metric_name("tokens_per_s_baseline", cells["cell_id"][0])] > 0
    run_json = json.loads((out / "run.json").read_text())
    if kind == "wandb":
        assert params["fingerprint"]["target"] == run_json["fingerprint"]["target"]
        paths = wandb_artifacts(wandb_run_dirs(env)[0])["measure-run-run"]["paths"]
        assert "run.json" in paths and "cells.csv" in paths
        assert (out / ".specscope.lock").exists() and ".specscope.lock" not in paths  # the writer's lock: not data
    else:
        assert params["fingerprint.target"] == run_json["fingerprint"]["target"]
        assert params["run_id"] == run_json["run_id"]


@pytest.mark.slow
def test_a_tracker_that_fails_after_a_real_measurement_costs_one_line(tiny_llama_dir: str, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # the server is found unreachable when the tracker opens, after the sweep: the run stands as without --track.
    # measure's main in this process (a real measurement all the same): the tests above run --track in a process
    port = _free_port()
    for key, value in _env(tmp_path, MLFLOW_TRACKING_URI=f"http://127.0.0.1:{port}").items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "run"
    proc = run_module("measure", ["--target", tiny_llama_dir, *SMALL, "--out", str(out), "--track", "mlflow"])
    assert proc.returncode == 0, proc.stderr
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last["run_dir"] == str(out) and last["status"] == "complete"
    assert json.loads((out / "run.json").read_text())["status"] == "complete"
    assert len(pd.read_csv(out / "cells.csv")) == 1
    warnings = [line for line in proc.stderr.splitlines() if "--track" in line]
    assert warnings == [f"python -m measure: warning: --track mlflow: cannot reach http://127.0.0.1:{port} "
                        "(Connection refused); not tracked (the results on disk are complete)"]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("kind", ["wandb", "mlflow"])
@pytest.mark.slow
def test_a_calibration_is_tracked(kind: str, tmp_path: Path) -> None:
    env = _env(tmp_path)
    cal = tmp_path / "cal"
    proc = _run(["-m", "calibrate", str(RUN), "--out", str(cal), "--track", kind], env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["n_cells"] == 6
    assert f"tracked: {kind}" in proc.stderr
    metrics, params = _logged(kind, env)
    _assert_cells(metrics, pd.read_csv(RUN / "cells.csv"))
    mape = json.loads((cal / "calibration.json").read_text())["mape"]["held_out"]
    for method, v in mape.items():
        assert metrics[metric_name("speedup_mape_pct", "held_out", method)] == pytest.approx(v["speedup_mape_pct"])
        assert metrics[metric_name("share_inside_ci", "held_out", method)] == pytest.approx(v["share_inside_ci"])
    asked = params["calibrate"]["holdout"] if kind == "wandb" else params["calibrate.holdout"]
    used = json.loads((cal / "calibration.json").read_text())["holdout"]["mode"]
    assert (asked, params["holdout"]) == ("auto", used) and used == "gamma"  # the default, and what it chose
    assert (cal / "report" / "predicted_vs_measured.png").exists()


@pytest.mark.slow
def test_ingest_is_tracked(tmp_path: Path) -> None:
    env = _env(tmp_path)
    proc = _run(["-m", "calibrate", "ingest", str(VLLM), "--preset", "llama3-1b-8b", "--track", "wandb"], env)
    assert proc.returncode == 0, proc.stderr
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    metrics, params = _logged("wandb", env)
    assert metrics["alpha_1"] == pytest.approx(last["alpha_per_position"][0])
    assert metrics["optimal_k"] == last["optimal_k"] and params["engine"] == "vllm"
    assert metrics[metric_name("speedup", f"k={last['optimal_k']}")] == pytest.approx(last["optimal_speedup"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_failing_tracker_costs_one_line_and_never_the_result(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["calibrate", "ingest", str(VLLM), "--preset", "llama3-1b-8b"]
    ref = _run(["-m", *args], _env(tmp_path))
    port = _free_port()
    down = _run(["-m", *args, "--track", "mlflow"], _env(tmp_path, MLFLOW_TRACKING_URI=f"http://127.0.0.1:{port}"))
    assert down.returncode == 0 and down.stdout == ref.stdout
    assert down.stderr.strip().splitlines() == [
        f"python -m calibrate ingest: warning: --track mlflow: cannot reach http://127.0.0.1:{port} (Connection "
        "refused); not tracked (the results on disk are complete)"]
    # not installed (import wandb: ImportError): said once, before the work; the ingest CLI's main in this process
    for key, value in _env(tmp_path).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setitem(sys.modules, "wandb", None)
    from calibrate.ingest.cli import main

    missing = run_main(main, [*args[2:], "--track", "wandb"])
    assert missing.returncode == 0 and missing.stdout == ref.stdout
    assert missing.stderr.strip().splitlines() == [
        "python -m calibrate ingest: warning: --track wandb: wandb is not installed (pip install "
        "'specscope[track]', or pip install wandb); not tracked (the results on disk are complete)"]


@pytest.mark.parametrize("args", [["-m", "measure"], ["-m", "calibrate", str(RUN)],
                                  ["-m", "calibrate", "ingest", str(VLLM)]])
def test_an_unknown_tracker_is_one_line_exit_2(args: list[str], tmp_path: Path) -> None:
    proc = _run([*args, "--track", "neptune"], _env(tmp_path))
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert "--track" in line and "neptune" in line and "wandb" in line and "mlflow" in line
