"""measure.executors: the same sweep through the local executor and a local Ray cluster.

The Ray cluster is started here (``ray.init(num_cpus=2)``, dashboard off, one
node: this machine) and shared by the tests of this module (the CLI test joins
it by its address); the models are a tiny
random-weight Llama saved to a temporary directory, so every cell takes well
under a second. The tests on the cluster are ``slow`` (starting it and its
workers takes seconds of the 2-core machine); the flag checks run the CLI's
``main`` in this process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cli_inprocess import run_main
from measure import executors, records
from measure.__main__ import main as measure_main
from measure.executors import CellsFailed, ExecutorConfig, run_sweep_distributed
from measure.sweep import SweepConfig, run_sweep

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def faults(tmp_path_factory) -> Path:
    """The fault-injection file the Ray workers read (set before the cluster starts, so they inherit it)."""
    return tmp_path_factory.mktemp("faults") / "faults.json"


@pytest.fixture(scope="module")
def cluster(faults):
    ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'specscope[ray]')")
    os.environ[executors.FAULTS_ENV] = str(faults)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()
    os.environ.pop(executors.FAULTS_ENV, None)


def _config(tiny_llama_dir: str, **kw) -> SweepConfig:
    base = dict(target=tiny_llama_dir, drafts=("ngram:2", "early:1"), gammas=("fixed:1", "fixed:3"),
                temperatures=(0.0,), domains=("code",), prompts_per_domain=1, max_new_tokens=10, warmup=0, repeats=1,
                threads=1,
                cost_contexts=(16,), cost_max_tokens=2, cost_repeats=1, peer=False)
    base.update(kw)
    return SweepConfig(**base)


RAY = ExecutorConfig(kind="ray", cpus_per_cell=1, max_retries=1)


def _tokens(run: records.Run) -> dict:
    g = run.table("generations")
    return {(r.cell_id, r.prompt_id, r.mode, int(r.repeat)): r.tokens for r in g.itertuples()}


@pytest.mark.slow
def test_ray_gives_the_local_cells_and_outputs(cluster, tiny_llama_dir, tmp_path):
    cfg = _config(tiny_llama_dir)
    local = run_sweep(cfg, tmp_path / "local", show_bar=False, quiet=True)
    dist = run_sweep_distributed(cfg, tmp_path / "ray", RAY, show_bar=False, quiet=True)
    assert local.status == dist.status == "complete"
    lc, dc = local.table("cells"), dist.table("cells")
    assert sorted(lc["cell_id"]) == sorted(dc["cell_id"]) and len(dc) == 4
    assert dc["outputs_identical"].all() and lc["outputs_identical"].all()
    assert _tokens(local) == _tokens(dist)  # identical greedy outputs, every mode of every cell
    for name in ("rounds", "traces"):
        assert len(local.table(name)) == len(dist.table(name)) > 0
    assert len(dist.table("cost_target")) == len(local.table("cost_target")) > 0
    assert dc["hardware"].str.contains("1 thread").all()  # the worker's hardware, one core each
    assert dist.meta["fingerprint"]["hardware"]["device"] == "ray cluster"
    assert set(dist.meta["workers"]) == set(dc["hardware"]) and dist.meta["executor"]["kind"] == "ray"
    assert dist.summary["n_cells"] == 4 and dist.meta["failed_cells"] == {}
    # calibration pools the two runs only while their cells come from one machine
    from calibrate.dataset import load_runs

    assert load_runs([local.path, dist.path]).cells["hardware"].nunique() == 1
    f = dist.path / "cells.csv"
    lines = f.read_text().splitlines(keepends=True)
    lines[1] = lines[1].replace("1 thread", "8 threads")
    f.write_text("".join(lines))
    with pytest.raises(ValueError, match="cells measured on 2 different machines"):
        load_runs([local.path, dist.path])
    assert "pooled in one fit" in load_runs([local.path, dist.path], pool_hardware=True).notes[-1]


@pytest.mark.slow
def test_killed_worker_is_retried_then_reported_failed(cluster, tiny_llama_dir, faults, tmp_path):
    cfg = _config(tiny_llama_dir, drafts=("ngram:2",), domains=("docs",))
    once = records.cell_id("ngram:2", "fixed:1", 0, "docs")
    always = records.cell_id("ngram:2", "fixed:3", 0, "docs")
    faults.write_text(json.dumps({once: "once", always: "always"}))
    out = tmp_path / "run"
    try:
        with pytest.raises(CellsFailed) as exc:
            run_sweep_distributed(cfg, out, RAY, show_bar=False, quiet=True)
    finally:
        faults.write_text("{}")
    assert list(exc.value.failed) == [always]  # the once-killed cell was retried; the other ran out of retries
    run = records.load_run(out)
    assert run.status == "failed" and list(run.table("cells")["cell_id"]) == [once]
    assert always in run.meta["failed_cells"] and "died" in run.meta["failed_cells"][always].lower()
    # a resume runs only the failed cell
    wall = run.table("generations")["wall_s"].tolist()
    run2 = run_sweep_distributed(cfg, out, RAY, show_bar=False, quiet=True)
    assert run2.status == "complete" and sorted(run2.table("cells")["cell_id"]) == sorted([once, always])
    assert run2.table("generations").query("cell_id == @once")["wall_s"].tolist() == wall


@pytest.mark.slow
def test_interrupted_driver_resumes_without_rerunning(cluster, tiny_llama_dir, tmp_path):
    cfg = _config(tiny_llama_dir, drafts=("ngram:2",), gammas=("fixed:1", "fixed:2", "fixed:3", "fixed:4"),
                  domains=("conversation",))
    out = tmp_path / "run"
    seen: list[str] = []

    def ctrl_c(row) -> None:
        seen.append(row.cell_id)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep_distributed(cfg, out, RAY, show_bar=False, quiet=True, on_cell=ctrl_c)
    first = records.load_run(out)
    assert first.status == "interrupted" and list(first.table("cells")["cell_id"]) == seen
    before = first.table("generations")
    deadline = time.time() + 30  # the cancelled tasks give their CPUs back
    while cluster.available_resources().get("CPU", 0) < 2 and time.time() < deadline:
        time.sleep(0.2)
    assert cluster.available_resources().get("CPU", 0) == 2
    run = run_sweep_distributed(cfg, out, RAY, show_bar=False, quiet=True)
    assert run.status == "complete" and len(run.table("cells")) == 4
    again = run.table("generations").query("cell_id == @seen[0]")
    assert again["wall_s"].tolist() == before["wall_s"].tolist()  # the finished cell was not re-run
    assert len(run.meta["resumed_utc"]) == 1


@pytest.mark.slow
def test_ray_resume_times_only_the_cost_points_not_on_disk(cluster, tiny_llama_dir, tmp_path):
    """Cost curves cut short on disk (an append interrupted), resumed on Ray: the worker times the missing
    points only; the ones on disk keep their values (before, any row on disk made the worker skip them all)."""
    cfg = _config(tiny_llama_dir, drafts=("ngram:2",), gammas=("fixed:1",), cost_repeats_verified=2)
    out = tmp_path / "run"
    full = run_sweep_distributed(cfg, out, RAY, show_bar=False, quiet=True)
    n_target, n_draft = len(full.table("cost_target")), len(full.table("cost_draft"))
    f = out / "cost_target.csv"
    lines = f.read_text().splitlines()
    f.write_text("\n".join(lines[:3]) + "\n")  # 2 of the target points on disk
    kept = records.load_run(out).table("cost_target")
    run = run_sweep_distributed(cfg, out, RAY, show_bar=False, quiet=True)
    ct = run.table("cost_target")
    assert n_target > 2 and len(ct) == n_target and not ct.duplicated(["n_tokens", "context_tokens", "repeat"]).any()
    assert ct.head(2)["ms"].tolist() == kept["ms"].tolist()
    assert len(run.table("cost_draft")) == n_draft  # every draft point was on disk: none timed again
    assert run.meta["cost_hardware"] in run.meta["workers"]


def test_hardware_label_names_the_machine():
    gpu = {"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "gpu": "NVIDIA H100 80GB HBM3", "cores": 32}
    cpu = {"device": "cpu", "device_name": "AMD EPYC 7B13", "cpu": "AMD EPYC 7B13", "cores": 2, "torch_threads": 1}
    assert records.hardware_label(gpu) == "NVIDIA H100 80GB HBM3"
    assert records.hardware_label(cpu) == "AMD EPYC 7B13, 2 cores, 1 thread"
    assert records.hardware_label({**cpu, "torch_threads": 2}) == "AMD EPYC 7B13, 2 cores, 2 threads"
    assert records.hardware_label(None) == records.hardware_label({}) == "unknown"


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    e = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    e.pop(executors.FAULTS_ENV, None)
    return subprocess.run([sys.executable, "-m", "measure", *args], capture_output=True, text=True, cwd=ROOT,
                          env=e, timeout=240)


@pytest.mark.slow
def test_cli_joins_a_cluster_by_address(cluster, tiny_llama_dir, tmp_path):
    address = cluster.get_runtime_context().gcs_address  # the module's own cluster, as HOST:PORT
    assert address.split(":")[0] == cluster.nodes()[0]["NodeManagerAddress"]  # this machine (its one node)
    out = tmp_path / "run"
    p = _cli("--target", tiny_llama_dir, "--draft", "ngram:2", "--gamma", "1,2", "--domains", "code", "--prompts", "1",
             "--max-new-tokens", "8", "--warmup", "0", "--repeats", "1", "--no-cost", "--no-peer", "--quiet",
             "--no-system-check", "--no-progress", "--executor", "ray", "--ray-address", address,
             "--out", str(out))
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["status"] == "complete" and summary["n_cells"] == 2
    assert summary["all_greedy_outputs_identical"] is True
    assert records.load_run(out).meta["executor"]["ray_address"] == address


JOIN = ("--draft", "ngram:2", "--gamma", "1", "--domains", "code", "--prompts", "1", "--max-new-tokens", "8",
        "--warmup", "0", "--repeats", "1", "--no-cost", "--no-peer", "--quiet", "--no-system-check", "--no-progress",
        "--executor", "ray")


@pytest.mark.slow
def test_cli_address_nobody_answers_is_one_line_and_the_run_resumes(cluster, tiny_llama_dir, tmp_path):
    # issue 32: Ray retried for ever and the run stayed "running"; now one line at once, the run kept to resume
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free again once closed: nothing listens there
    out = tmp_path / "run"
    start = time.monotonic()
    p = _cli("--target", tiny_llama_dir, *JOIN, "--ray-address", f"127.0.0.1:{port}", "--out", str(out))
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert f"--ray-address 127.0.0.1:{port}: nothing answers there" in lines[0]
    assert time.monotonic() - start < 120
    run = records.load_run(out)
    assert run.status == "failed" and "nothing answers there" in run.meta["error"]
    address = cluster.get_runtime_context().gcs_address
    p = _cli("--target", tiny_llama_dir, *JOIN, "--ray-address", address, "--out", str(out))
    assert p.returncode == 0, p.stderr[-3000:]
    assert records.load_run(out).status == "complete" and len(records.load_run(out).table("cells")) == 1


@pytest.mark.slow
def test_join_gives_up_on_an_address_without_ray():
    # something listens but it is not Ray: ray.init would retry for many minutes; the probe stops at its timeout
    pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'specscope[ray]')")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        address = f"127.0.0.1:{s.getsockname()[1]}"
        start = time.monotonic()
        with pytest.raises(ValueError, match=rf"--ray-address {address}: no Ray cluster answered within 3 s"):
            executors.probe_ray_address(address, timeout_s=3)
        assert time.monotonic() - start < 30


@pytest.mark.parametrize("args, msg", [
    (("--executor", "ray", "--cpus-per-cell", "0"), "argument --cpus-per-cell: '0' is out of range"),
    (("--executor", "ray", "--ray-address", "http://x"), "--ray-address 'http://x': expected auto or HOST:PORT"),
    (("--executor", "ray", "--ray-address", "bogus:99999"),
     "--ray-address 'bogus:99999': port 99999 is out of range; valid: a TCP port in 1..65,535"),
    (("--ray-address", "auto"), "--ray-address needs --executor ray"),
    (("--cpus-per-cell", "2"), "--cpus-per-cell needs --executor ray"),
    (("--executor", "dask"), "invalid choice: 'dask'"),
])
def test_cli_bad_executor_flags_are_one_line(tiny_llama_dir, tmp_path, args, msg):
    p = run_main(measure_main, ["--target", tiny_llama_dir, "--out", str(tmp_path / "r"), *args])
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert msg in p.stderr or msg.split(":")[0] in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_cli_without_ray_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray: ImportError, as where it is not installed
    p = run_main(measure_main, ["--target", "no-such-model", "--executor", "ray", "--out", str(tmp_path / "r")])
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip() == ("python -m measure: error: --executor ray: Ray is not installed; install the extra: "
                                "pip install 'specscope[ray]'")
