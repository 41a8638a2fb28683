"""Test helpers: an offline tracker environment, and reading back what was logged with each library's own tools.

* W&B: an offline run is a ``.wandb`` transaction log (``WANDB_DIR/wandb/offline-run-*``).
  ``wandb.Api`` cannot read it (it talks to a server) and the Python datastore
  reader of older releases is gone; W&B's own CLI reads it:
  ``wandb leet inspect --summary --json RUN_DIR`` prints the run's config and
  summary (the last value of every metric) as one JSON object, and
  ``wandb leet inspect --json RUN_DIR`` every record (artifacts included), one
  JSON object a line. That is what ``wandb sync`` would upload, read by the
  same Go core (``wandb-core``) that wrote it, so it is the robust choice.
  Tables and images are files of the run (``files/media/...``) that the
  summary points to.
* MLflow: ``MlflowClient(tracking_uri)`` on the file store (``search_runs``,
  ``get_run``, ``list_artifacts``, ``load_table``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator
from unittest import mock

import pytest


def offline_env(tmp: Path) -> dict[str, str]:
    """Environment for W&B offline mode and an MLflow file store, everything under ``tmp``."""
    return {
        "WANDB_MODE": "offline", "WANDB_DIR": str(tmp / "wb"), "WANDB_PROJECT": "specscope-test",
        "WANDB_DATA_DIR": str(tmp / "wb-data"), "WANDB_CACHE_DIR": str(tmp / "wb-cache"),
        "WANDB_CONFIG_DIR": str(tmp / "wb-config"),
        "MLFLOW_TRACKING_URI": (tmp / "mlruns").as_uri(), "MLFLOW_ALLOW_FILE_STORE": "true",
        "MLFLOW_EXPERIMENT_NAME": "specscope-test",
    }


def use_offline_env(monkeypatch: pytest.MonkeyPatch, tmp: Path) -> dict[str, str]:
    """Set :func:`offline_env` for this test (and make W&B forget the settings of an earlier test)."""
    env = offline_env(tmp)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    (tmp / "wb").mkdir(parents=True, exist_ok=True)
    if "wandb" in sys.modules:
        sys.modules["wandb"].teardown()
    return env


def wandb_run_dirs(env: dict[str, str]) -> list[Path]:
    """The offline W&B runs written under ``WANDB_DIR``, oldest first."""
    return sorted((Path(env["WANDB_DIR"]) / "wandb").glob("offline-run-*"))


def _wandb_cli(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", *args], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def wandb_inspect(run_dir: Path) -> dict[str, Any]:
    """``wandb leet inspect --summary --json``: the run's state, config and summary (last value per key)."""
    return json.loads(_wandb_cli("--summary", "--json", str(run_dir)))


def wandb_records(run_dir: Path) -> list[dict[str, Any]]:
    """``wandb leet inspect --json``: every record of the run's transaction log."""
    return [json.loads(line) for line in _wandb_cli("--json", str(run_dir)).splitlines() if line.strip()]


def wandb_artifacts(run_dir: Path) -> dict[str, dict[str, Any]]:
    """The run's logged artifacts by name: their type and the paths in their manifest."""
    out = {}
    for rec in wandb_records(run_dir):
        if rec.get("type") == "artifact":
            art = rec["artifact"]
            out[art["name"]] = {"type": art["type"],
                                "paths": sorted(c["path"] for c in art["manifest"]["contents"])}
    return out


def wandb_table(run_dir: Path, summary_value: dict[str, Any]):
    """A logged ``wandb.Table`` (its summary entry points to the file) as a DataFrame."""
    import pandas as pd

    doc = json.loads((run_dir / "files" / summary_value["path"]).read_text())
    return pd.DataFrame(doc["data"], columns=doc["columns"])


@contextlib.contextmanager
def _mlflow(env: dict[str, str]) -> Iterator[Any]:
    """An ``MlflowClient`` on ``env``'s file store (MLflow 3 opens one only with MLFLOW_ALLOW_FILE_STORE set)."""
    from mlflow import MlflowClient

    with mock.patch.dict(os.environ, {"MLFLOW_ALLOW_FILE_STORE": "true"}):
        yield MlflowClient(env["MLFLOW_TRACKING_URI"])


def mlflow_runs(env: dict[str, str]) -> list[Any]:
    """Every run of the test experiment, via ``MlflowClient`` on the file store (oldest first)."""
    with _mlflow(env) as client:
        exp = client.get_experiment_by_name(env["MLFLOW_EXPERIMENT_NAME"])
        if exp is None:
            return []
        return sorted(client.search_runs([exp.experiment_id]), key=lambda r: r.info.start_time)


def mlflow_artifacts(env: dict[str, str], run_id: str, path: str | None = None) -> list[str]:
    """Artifact paths of a run (one level, under ``path``)."""
    with _mlflow(env) as client:
        return [a.path for a in client.list_artifacts(run_id, path)]


def mlflow_table(env: dict[str, str], run: Any, name: str):
    """A table logged as ``tables/<name>.json``, via ``MlflowClient.load_table``."""
    with _mlflow(env) as client:
        return client.load_table(run.info.experiment_id, f"tables/{name}.json", run_ids=[run.info.run_id])
