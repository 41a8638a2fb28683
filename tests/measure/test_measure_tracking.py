"""measure.tracking: a committed run directory logged to W&B (offline) and MLflow (file store), read back.

The test is about the logging, not the measuring, so it logs
``results/cpu-make-run-fresh3`` (the default job, 6 cells) and checks what
the trackers hold against the run's own files: every cell's speedup with its
CI, tokens/s, acceptance, the unstable flag, α_i with its Wilson interval,
the config and fingerprint as parameters, the run directory as an artifact.
The real ``python -m measure --track`` runs are in tests/project/test_track_cli.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("wandb")
pytest.importorskip("mlflow")

from measure.analysis import per_position_acceptance  # noqa: E402
from measure.records import TABLE_COLUMNS, load_run  # noqa: E402
from measure.tracking import CELL_IDENTITY, CELL_METRICS, acceptance_rows, cell_metrics, track_run  # noqa: E402
from toolkit.track import TRACKERS, metric_name  # noqa: E402
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

RUN = Path(__file__).resolve().parents[2] / "results" / "cpu-make-run-fresh3"


def test_acceptance_rows_match_the_rounds_and_hold_a_wilson_interval() -> None:
    run = load_run(RUN)
    rows = acceptance_rows(run.table("rounds"))
    cells = set(run.table("cells")["cell_id"])
    assert {r["cell_id"] for r in rows} == cells
    for cid in cells:
        mine = [r for r in rows if r["cell_id"] == cid]
        ref = per_position_acceptance(run.table("rounds").query("cell_id == @cid"))
        assert [r["alpha"] for r in mine] == pytest.approx(list(ref["alpha"]), nan_ok=True)
        for r in mine:
            if r["n"]:
                assert r["alpha_lo"] < r["alpha"] < r["alpha_hi"] or r["alpha"] in (0.0, 1.0)
                assert 0.0 <= r["alpha_lo"] <= r["alpha_hi"] <= 1.0


def test_cell_metrics_name_every_cell_and_leave_out_what_is_missing() -> None:
    run = load_run(RUN)
    m = cell_metrics(run.table("cells"), acceptance_rows(run.table("rounds")), run.summary)
    for r in run.table("cells").to_dict("records"):
        cell = r["cell_id"]
        for key in ("speedup", "speedup_lo", "speedup_hi", "tokens_per_s_baseline", "acceptance_rate"):
            assert m[metric_name(key, cell)] == pytest.approx(r[key])
        assert m[metric_name("unstable", cell)] == float(bool(r["unstable"]))
        assert metric_name("alpha_1", cell) in m and metric_name("alpha_1_hi", cell) in m
        # peer_acceptance_rate is empty in this run's cells.csv: no NaN metric for it
        assert (metric_name("peer_acceptance_rate", cell) in m) == (not math.isnan(r["peer_acceptance_rate"]))
    draft = run.summary["drafts"]["ngram:3"]
    assert m[metric_name("geomean_speedup", "draft=ngram:3")] == pytest.approx(draft["geomean_speedup"])
    assert m["n_cells"] == 6


def test_every_cells_column_is_a_metric_or_says_which_cell() -> None:
    # a column added to the run format must be sorted into one of the two, or it is silently never tracked
    assert not set(CELL_METRICS) & set(CELL_IDENTITY)
    assert set(CELL_METRICS) | set(CELL_IDENTITY) == set(TABLE_COLUMNS["cells"])


def test_the_engines_own_decoding_is_logged_where_it_was_run() -> None:
    # fresh3 predates the library mode; its cells with the library columns filled in, as a run with it writes them
    run = load_run(RUN)
    cells = run.table("cells").copy()
    cells["tokens_per_s_library"], cells["tokens_per_s_library_lo"], cells["tokens_per_s_library_hi"] = 50.0, 48.0, 52.0
    cells["baseline_vs_library"], cells["baseline_vs_library_lo"], cells["baseline_vs_library_hi"] = 0.97, 0.9, 1.04
    summary = {**run.summary, "baseline_vs_library": {"geomean": 0.97, "lo": 0.93, "hi": 1.01, "n_cells": 6}}
    m = cell_metrics(cells, [], summary)
    cell = cells["cell_id"][0]
    assert m[metric_name("tokens_per_s_library_hi", cell)] == 52.0
    assert m[metric_name("baseline_vs_library_lo", cell)] == 0.9
    assert (m["geomean_baseline_vs_library"], m["geomean_baseline_vs_library_lo"],
            m["geomean_baseline_vs_library_hi"]) == (0.97, 0.93, 1.01)
    without = cell_metrics(run.table("cells"), [], run.summary)  # not run: nothing logged, not NaN
    assert not [k for k in without if "library" in k]


@pytest.mark.parametrize("kind", TRACKERS)
@pytest.mark.slow
def test_a_run_directory_is_logged_and_read_back(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture) -> None:
    env = use_offline_env(monkeypatch, tmp_path)
    tracked = track_run(kind, RUN, "python -m measure")
    err = capsys.readouterr().err.strip().splitlines()
    assert tracked is not None and err == [tracked.describe()]
    run = load_run(RUN)
    cells = run.table("cells")
    if kind == "wandb":
        (run_dir,) = wandb_run_dirs(env)
        doc = wandb_inspect(run_dir)
        values, config = doc["summary"], doc["config"]
        assert config["config"]["gammas"] == run.meta["config"]["gammas"]
        assert config["fingerprint"]["target"] == run.meta["fingerprint"]["target"]
        assert config["run_id"] == run.meta["run_id"] and config["command"] == run.meta["command"]
        logged_cells = wandb_table(run_dir, values["cells"])
        pp = wandb_table(run_dir, values["acceptance_per_position"])
        art = wandb_artifacts(run_dir)["measure-run-cpu-make-run-fresh3"]
        assert art["type"] == "run-directory" and {"run.json", "cells.csv", "rounds.csv"} <= set(art["paths"])
    else:
        (mrun,) = mlflow_runs(env)
        values, params = mrun.data.metrics, mrun.data.params
        assert json.loads(params["config.gammas"]) == run.meta["config"]["gammas"]
        assert params["fingerprint.target"] == run.meta["fingerprint"]["target"]
        assert params["run_id"] == run.meta["run_id"]
        logged_cells = mlflow_table(env, mrun, "cells")
        pp = mlflow_table(env, mrun, "acceptance_per_position")
        files = mlflow_artifacts(env, mrun.info.run_id, "measure-run-cpu-make-run-fresh3")
        assert {f"measure-run-cpu-make-run-fresh3/{n}" for n in ("run.json", "cells.csv", "rounds.csv")} <= set(files)
    for r in cells.to_dict("records"):  # every cell's speedup and its CI, as measured
        for key in ("speedup", "speedup_lo", "speedup_hi", "tokens_per_s_speculative", "mean_accepted_per_round"):
            assert values[metric_name(key, r["cell_id"])] == pytest.approx(r[key])
        assert values[metric_name("unstable", r["cell_id"])] == float(bool(r["unstable"]))
    assert sorted(logged_cells["cell_id"]) == sorted(cells["cell_id"])
    assert list(logged_cells.columns) == list(cells.columns)
    assert set(pp["cell_id"]) == set(cells["cell_id"]) and {"alpha", "alpha_lo", "alpha_hi"} <= set(pp.columns)
