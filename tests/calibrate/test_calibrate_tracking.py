"""calibrate.tracking: a calibration and an ingest answer logged to W&B (offline) and MLflow (file store), read back.

The calibration is of the committed default job (``results/cpu-make-run-fresh3``,
held out by γ), made once for the module; what the trackers hold is checked
against its own files: the cells' measured speedups with their CIs, each
method's prediction and error, the MAPE and share inside the CIs, the report's
charts as images and the calibration directory as an artifact.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("wandb")
pytest.importorskip("mlflow")

from calibrate.tracking import calibration_metrics, ingest_metrics, track_calibration, track_ingest  # noqa: E402
from toolkit.track import TRACKERS, metric_name  # noqa: E402
from tests.support.cli_inprocess import run_module  # noqa: E402
from tests.support.trackers import (  # noqa: E402
    mlflow_artifacts,
    mlflow_runs,
    mlflow_table,
    use_offline_env,
    wandb_artifacts,
    wandb_inspect,
    wandb_run_dirs,
    wandb_table,
)

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "results" / "cpu-make-run-fresh3"
VLLM = ROOT / "tests" / "fixtures" / "engines" / "vllm" / "metrics-after.prom"


@pytest.fixture(scope="module")
def cal_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``python -m calibrate RUN``'s directory, from its main in this process (the process itself is run with
    ``--track`` in tests/project/test_track_cli.py)."""
    out = tmp_path_factory.mktemp("cal") / "calibration"
    p = run_module("calibrate", [RUN, "--out", out])
    assert p.returncode == 0, p.stderr
    return out


@pytest.mark.slow
def test_calibration_metrics_hold_the_mape_and_every_cell(cal_dir: Path) -> None:
    doc = json.loads((cal_dir / "calibration.json").read_text())
    pred = pd.read_csv(cal_dir / "predictions.csv")
    m = calibration_metrics(doc, pred)
    for method, v in doc["mape"]["held_out"].items():
        assert m[metric_name("speedup_mape_pct", "held_out", method)] == pytest.approx(v["speedup_mape_pct"])
        assert m[metric_name("share_inside_ci", "held_out", method)] == pytest.approx(v["share_inside_ci"])
    held = pred[pred["split"] == "held_out"]
    for r in held.to_dict("records"):
        assert m[metric_name("speedup", r["cell_id"])] == pytest.approx(r["measured_speedup"])
        assert m[metric_name("speedup_lo", r["cell_id"])] == pytest.approx(r["measured_speedup_lo"])
        assert m[metric_name("predicted_speedup", r["method"], r["cell_id"])] == pytest.approx(r["predicted_speedup"])
        assert m[metric_name("inside_ci", r["method"], r["cell_id"])] == float(r["inside_ci"])
    group = "draft=ngram:3|temp=0|domain=code"
    assert 0 < m[metric_name("alpha_1_lo", group)] < m[metric_name("alpha_1", group)] < m[metric_name("alpha_1_hi", group)]
    assert metric_name("alpha_1", "draft=ngram:3|cells=all") in m


@pytest.mark.parametrize("kind", TRACKERS)
@pytest.mark.slow
def test_a_calibration_is_logged_and_read_back(kind: str, cal_dir: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    env = use_offline_env(monkeypatch, tmp_path)
    tracked = track_calibration(kind, cal_dir, {"holdout": "gamma", "seed": 0}, "python -m calibrate")
    assert tracked is not None
    cells = pd.read_csv(RUN / "cells.csv")
    charts = sorted(p.stem for p in (cal_dir / "report").glob("*.png"))
    label = cal_dir.parent.name  # the default <run>/calibration is named after its run, not "calibration"
    assert label != "calibration"
    assert "predicted_vs_measured" in charts  # the report was drawn for the tracker
    if kind == "wandb":
        (run_dir,) = wandb_run_dirs(env)
        doc = wandb_inspect(run_dir)
        values, config = doc["summary"], doc["config"]
        assert config["calibrate"] == {"holdout": "gamma", "seed": 0} and config["holdout"] == "gamma"
        assert config["runs"]["cpu-make-run-fresh3"]["fingerprint"]["target"] == "smollm2-135m"
        assert {f"charts/{c}" for c in charts} <= set(values)
        assert values["charts/predicted_vs_measured"]["_type"] == "image-file"
        pred = wandb_table(run_dir, values["predictions"])
        art = wandb_artifacts(run_dir)[f"calibration-{label}"]
        assert {"calibration.json", "predictions.csv", "report/report.html"} <= set(art["paths"])
    else:
        (run,) = mlflow_runs(env)
        values, params = run.data.metrics, run.data.params
        assert params["calibrate.holdout"] == "gamma" and params["holdout"] == "gamma"
        assert params["runs.cpu-make-run-fresh3.fingerprint.target"] == "smollm2-135m"
        assert {f"charts/{c}.png" for c in charts} <= set(mlflow_artifacts(env, run.info.run_id, "charts"))
        assert "report/report.html" in mlflow_artifacts(env, run.info.run_id, "report")
        pred = mlflow_table(env, run, "predictions")
        assert run.info.run_name == f"calibrate {label}"
        files = mlflow_artifacts(env, run.info.run_id, f"calibration-{label}")
        assert f"calibration-{label}/calibration.json" in files
    mape = json.loads((cal_dir / "calibration.json").read_text())["mape"]
    for method, v in mape["held_out"].items():
        assert values[metric_name("speedup_mape_pct", "held_out", method)] == pytest.approx(v["speedup_mape_pct"])
        assert values[metric_name("n_inside_ci", "held_out", method)] == v["n_inside_ci"]
    for r in cells.to_dict("records"):  # the cells' speedups and their CIs, as measured
        for key in ("speedup", "speedup_lo", "speedup_hi"):
            assert values[metric_name(key, r["cell_id"])] == pytest.approx(r[key])
    assert len(pred) == len(pd.read_csv(cal_dir / "predictions.csv"))


def test_ingest_metrics_and_tracking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "ingest"
    p = run_module("calibrate", ["ingest", VLLM, "--preset", "llama3-1b-8b", "--mode", "serve", "--requests", "20",
                                 "--arrival-rates", "1,8", "--max-batch", "4", "--out", out])  # in this process
    assert p.returncode == 0, p.stderr
    doc = json.loads((out / "ingest.json").read_text())
    m = ingest_metrics(doc)
    first = doc["acceptance"]["alpha_per_position"][0]
    assert m["alpha_1"] == pytest.approx(first["alpha"]) and m["alpha_1_lo"] == pytest.approx(first["ci95_low"])
    assert m["optimal_k"] == doc["optimal_k"] and m["engine_k"] == 3
    assert m[metric_name("speedup", "k=4")] == pytest.approx(doc["predictions"][3]["speedup"])
    assert metric_name("speedup", "rate=8") in m and metric_name("best_k", "rate=8") in m and metric_name("best_k_by_batch", "batch=4") in m
    env = use_offline_env(monkeypatch, tmp_path)
    tracked = track_ingest("mlflow", doc, {"mode": "serve"}, "python -m calibrate ingest", out_dir=out)
    (run,) = mlflow_runs(env)
    assert tracked is not None and run.data.params["engine"] == "vllm"
    assert run.data.metrics[metric_name("speedup", "k=4")] == pytest.approx(doc["predictions"][3]["speedup"])
    assert len(mlflow_table(env, run, "predictions")) == doc["gamma_max"]
    assert "ingest-ingest/ingest.json" in mlflow_artifacts(env, run.info.run_id, "ingest-ingest")


@pytest.mark.slow
def test_a_calibration_whose_runs_moved_is_logged_without_charts(cal_dir: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture) -> None:
    import shutil

    moved = tmp_path / "moved-cal"
    shutil.copytree(cal_dir, moved, ignore=shutil.ignore_patterns("report"))
    doc = json.loads((moved / "calibration.json").read_text())
    for info in doc["runs"].values():
        info["path"] = str(tmp_path / "gone")  # the report reads the runs: it cannot be drawn
    (moved / "calibration.json").write_text(json.dumps(doc))
    env = use_offline_env(monkeypatch, tmp_path)
    tracked = track_calibration("mlflow", moved, {"holdout": "gamma"}, "python -m calibrate")
    err = capsys.readouterr().err.strip().splitlines()
    assert tracked is not None and len(err) == 2 and err[1] == tracked.describe()
    assert err[0].startswith("python -m calibrate: warning: --track: the report's charts are left out: ")
    (run,) = mlflow_runs(env)
    assert run.data.params["runs.cpu-make-run-fresh3.path"] == str(tmp_path / "gone")
    assert metric_name("speedup_mape_pct", "held_out", "trace") in run.data.metrics
    assert mlflow_artifacts(env, run.info.run_id, "charts") == []
