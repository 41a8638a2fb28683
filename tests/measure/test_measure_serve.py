"""python -m measure serve against a stand-in llama-server on loopback: runs, resumes, faults, bad input."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from measure.records import load_run
from measure.serve.client import LoadResult, RequestResult
from measure.serve.runner import step_cost_rows
from measure.serve.units import LoadSpec, ServeConfig, UnitId, log_interval, summarise

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "tests" / "support" / "fake_llama_server.py"


@pytest.fixture()
def fake_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An executable that runs the stand-in server, as $SPECSCOPE_LLAMA_SERVER."""
    exe = tmp_path / "llama-server"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
    exe.chmod(0o755)
    monkeypatch.setenv("SPECSCOPE_LLAMA_SERVER", str(exe))
    monkeypatch.setenv("FAKE_PID_FILE", str(tmp_path / "pids"))
    return exe


@pytest.fixture()
def model(tmp_path: Path) -> str:
    p = tmp_path / "m.gguf"
    p.write_bytes(b"GGUF fake")
    return f"gguf:{p}"


def _run(argv: list[str]) -> int:
    from measure.serve.cli import main

    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code or 0)


BASE = ["--domains", "code", "--prompts", "1", "--requests", "3", "--max-new-tokens", "6", "--repeats", "2"]


def _pids_dead(tmp_path: Path) -> bool:
    pids = [int(x) for x in (tmp_path / "pids").read_text().split()] if (tmp_path / "pids").exists() else []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        return False
    return bool(pids)


@pytest.mark.slow
def test_a_small_run_is_complete_with_ttft_and_acceptance(fake_bin, model, tmp_path, capsys):
    out = tmp_path / "run"
    assert _run(["--target", model, "--draft", "ngram:3", "--gamma", "2", "--concurrency", "1,2",
                 "--out", str(out), *BASE]) == 0
    run = load_run(out)
    assert run.status == "complete" and run.meta["config"]["kind"] == "serve"
    units = run.table("serve_units")
    assert len(units) == 2 * 2 * 2  # configurations x loads x repeats
    assert set(units["config"]) == {"off", "ngram:3:k2"}
    spec = units[units["config"] == "ngram:3:k2"]
    assert (spec["drafts"] > 0).all() and (spec["accepted_tokens"] > 0).all()
    assert (units[units["config"] == "off"]["draft_tokens"] == 0).all()
    assert units["other_cpu_share"].notna().all() and (units["other_cpu_share"] >= 0).all()
    reqs = run.table("serve_requests")
    assert len(reqs) == 8 * 3 and (reqs["ttft_ms"] > 0).all() and (reqs["completion_tokens"] == 6).all()
    assert (reqs["e2e_ms"] >= reqs["ttft_ms"]).all()
    toks = run.table("serve_tokens")
    assert len(toks) == 8 * 3 * 6 and toks["gap_ms"].dropna().ge(0).all()
    assert len(list((out / "metrics").glob("*.after.prom"))) == 8
    assert len(list((out / "logs").glob("server-block*.log"))) == 4  # one server per configuration and repeat
    blocks = units.sort_values("block")
    assert blocks.groupby("repeat")["config"].first().tolist() == ["off", "ngram:3:k2"]  # alternating
    text = capsys.readouterr().out
    assert "ngram:3:k2" in text and "load generator: used" in text
    summary = json.loads(text.strip().splitlines()[-1])
    g = next(g for g in summary["groups"] if g["config"] == "ngram:3:k2" and g["load"] == "c1")
    thr = g["metrics"]["throughput_tokens_per_s"]
    assert 0 < thr["lo"] <= thr["value"] <= thr["hi"]
    assert g["throughput_speedup"]["value"] > 0
    assert _pids_dead(tmp_path)  # every server stopped


@pytest.mark.slow
def test_a_dead_server_interrupts_the_run_and_the_same_command_resumes(fake_bin, model, tmp_path, monkeypatch,
                                                                        capsys):
    out = tmp_path / "run"
    argv = ["--target", model, "--gamma", "2", "--concurrency", "1,2", "--out", str(out), *BASE]
    monkeypatch.setenv("FAKE_DIE_AFTER", "5")  # each server: warm-up + a unit of 3 requests, then dies mid-unit
    assert _run(argv) == 1
    err = capsys.readouterr().err
    assert "interrupted: llama-server exited" in err and "resumes" in err
    run = load_run(out)
    assert run.status == "interrupted"
    assert len(run.table("serve_units")) == 1
    assert len(run.table("serve_requests")) == 3  # the unit in flight left no rows
    monkeypatch.delenv("FAKE_DIE_AFTER")
    assert _run(argv) == 0
    run = load_run(out)
    assert run.status == "complete" and len(run.table("serve_units")) == 8
    assert len(run.table("serve_requests")) == 8 * 3
    assert _pids_dead(tmp_path)


@pytest.mark.slow
def test_until_decided_races_the_configurations_per_load_and_resumes_identically(fake_bin, model, tmp_path,
                                                                                  monkeypatch, capsys):
    monkeypatch.setenv("FAKE_STEP_MS", "4")  # off: 1 token a 4 ms step; k: 3 tokens a step of 4 + 2 ms a draft token
    monkeypatch.setenv("FAKE_DRAFT_MS", "2")
    monkeypatch.setenv("FAKE_ACCEPT", "2")
    out = tmp_path / "run"
    argv = ["--target", model, "--draft", "ngram:2", "--gamma", "2,8", "--concurrency", "1", "--out", str(out),
            "--domains", "code", "--prompts", "1", "--requests", "2", "--max-new-tokens", "32", "--repeats", "5",
            "--until-decided", "--regret", "0.1", "--confidence", "0.8"]
    assert _run(argv) == 0
    run = load_run(out)
    race = run.meta["race"]
    assert run.meta["config"]["race"] == {"regret": 0.1, "confidence": 0.8, "time_budget_s": None}
    assert race["stopped_by"] in ("decided", "out of repeats") and race["decided"].get("c1") in (None, "ngram:2:k2")
    units = run.table("serve_units")
    assert set(units["repeat"]) == set(range(len(race["looks"])))
    text = capsys.readouterr().out
    assert "race (--until-decided: regret 10% at confidence 80%): stopped by " in text and "\n  c1: " in text
    assert json.loads(text.strip().splitlines()[-1])["race"] == {k: race[k] for k in ("stopped_by", "decided")}
    assert _run(argv) == 0  # the same command again: the looks from the same units, nothing more measured
    again = load_run(out)
    assert again.meta["race"]["looks"] == race["looks"] and len(again.table("serve_units")) == len(units)
    assert _pids_dead(tmp_path)


@pytest.mark.slow
def test_changing_the_units_of_a_run_needs_extend(fake_bin, model, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["--target", model, "--gamma", "2", "--slots", "2", "--out", str(out), *BASE]
    assert _run(args + ["--concurrency", "1"]) == 0
    assert _run(args + ["--concurrency", "1,2"]) == 2
    assert "--extend" in capsys.readouterr().err
    assert _run(args + ["--concurrency", "1,2", "--extend"]) == 0
    run = load_run(out)
    assert len(run.table("serve_units")) == 8 and run.meta.get("extended_utc")


@pytest.mark.slow
def test_force_new_never_moves_a_run_another_process_is_writing(fake_bin, model, tmp_path, capsys):
    """--force-new sets the run aside under its lock (it used to rename the directory without it, from under a
    serving run another process was writing)."""
    from measure import records
    from measure.runkinds import SERVE, open_run_dir

    out = tmp_path / "run"
    open_run_dir(SERVE, out).close()
    before = (out / "run.json").read_text()
    fd = records.acquire_run_lock(out)  # the writer of that run, as another process holds it
    try:
        args = ["--target", model, "--gamma", "2", "--concurrency", "1", "--force-new", "--out", str(out), *BASE]
        assert _run(args) == 2
    finally:
        os.close(fd)
    err = capsys.readouterr().err
    assert "is writing this run" in err.strip().splitlines()[-1] and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("run")) == ["run"]
    assert (out / "run.json").read_text() == before


@pytest.mark.slow
def test_port_taken_takes_another(fake_bin, tmp_path, monkeypatch):
    from measure.serve import server as srv_mod

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    taken = busy.getsockname()[1]
    ports = iter([taken, srv_mod.free_port()])
    monkeypatch.setattr(srv_mod, "free_port", lambda: next(ports))
    spec = srv_mod.ServerSpec(fake_bin, tmp_path / "m.gguf", ServeConfig("off"), 2, 1, 512)
    log = tmp_path / "server.log"
    with srv_mod.LlamaServer(spec, log) as s:
        assert s.port != taken and s.alive()
    assert "couldn't bind" in log.read_text()
    busy.close()


def test_an_interrupt_while_the_server_starts_leaves_no_server(fake_bin, tmp_path, monkeypatch):
    """Ctrl-C landing between the fork and ``self.proc = ...`` (a loaded machine widens that window) must not
    orphan the server: the interrupt is held until the handle is kept, then stops it."""
    from measure.serve import server as srv_mod

    started: list[subprocess.Popen] = []
    real_popen = subprocess.Popen

    def popen_then_ctrl_c(*args, **kwargs):
        started.append(real_popen(*args, **kwargs))
        signal.raise_signal(signal.SIGINT)  # arrives before Popen has returned
        time.sleep(0.05)  # the handler runs here unless it is held back
        return started[-1]

    monkeypatch.setattr(srv_mod.subprocess, "Popen", popen_then_ctrl_c)
    spec = srv_mod.ServerSpec(fake_bin, tmp_path / "m.gguf", ServeConfig("off"), 2, 1, 512)
    try:
        with pytest.raises(KeyboardInterrupt):
            with srv_mod.LlamaServer(spec, tmp_path / "server.log"):
                pass
        assert started and started[0].poll() is not None, "the server outlived the interrupt"
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture()
def url_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The stand-in started by hand on a free port, as a deployment --url points at."""
    from measure.serve.server import free_port

    def start(port: int = 0, **env: str) -> tuple[str, subprocess.Popen]:
        port = port or free_port()
        proc = subprocess.Popen([sys.executable, str(FAKE), "--port", str(port), "--spec-type", "ngram-simple",
                                 "--spec-ngram-simple-size-m", "3"], env={**os.environ, **env},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(proc)
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        return f"http://127.0.0.1:{port}", proc

    procs: list[subprocess.Popen] = []
    yield start
    for p in procs:
        p.kill()
        p.wait()


@pytest.mark.slow
def test_url_measures_a_running_server_and_its_acceptance(url_server, tmp_path, capsys):
    url, _ = url_server()
    out = tmp_path / "run"
    assert _run(["--url", url, "--concurrency", "2", "--out", str(out), *BASE]) == 0
    units = load_run(out).table("serve_units")
    assert len(units) == 2 and units["metrics"].all() and (units["accepted_tokens"] > 0).all()
    assert set(units["config"]) == {"url"}  # measured as it runs: not called 'off'
    assert "python -m calibrate ingest" in capsys.readouterr().err
    scrapes = sorted((out / "metrics").glob("*.prom"))
    p = subprocess.run([sys.executable, "-m", "calibrate", "ingest", str(scrapes[1]), str(scrapes[0]), "--spec-tokens",
                        "3", "--preset", "llama3-1b-8b"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "llamacpp" in p.stdout, p.stderr  # acceptance through the ingest parsers


def test_url_without_metrics_measures_latency_and_says_acceptance_is_unavailable(url_server, tmp_path, capsys):
    url, _ = url_server(FAKE_NO_METRICS="1")
    out = tmp_path / "run"
    assert _run(["--url", url, "--concurrency", "1", "--out", str(out), *BASE]) == 0
    assert "acceptance is unavailable" in capsys.readouterr().err
    units = load_run(out).table("serve_units")
    assert not units["metrics"].any() and units["draft_tokens"].isna().all() and (units["e2e_p50_ms"] > 0).all()


@pytest.mark.parametrize("env,message", [({"FAKE_NOT_OPENAI": "1"}, "not an OpenAI-compatible server")])
def test_url_that_is_not_openai_is_refused(url_server, tmp_path, capsys, env, message):
    url, _ = url_server(**env)
    assert _run(["--url", url, "--concurrency", "1", "--out", str(tmp_path / "r"), *BASE]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("argv,message", [
    (["--concurrency", "0"], "--concurrency 0 is out of range (valid: 1..1024)"),
    (["--rate", "0"], "--rate 0 is out of range"),
    (["--rate", "nan"], "--rate nan is out of range"),
    (["--rate", "-2"], "--rate -2 is out of range"),
    ([], "no load: give --concurrency"),
    (["--concurrency", "1", "--draft", "eagle"], "--draft 'eagle'"),
    (["--concurrency", "1", "--gamma", "0"], "--gamma 0 is out of range (valid: 1..64)"),
    (["--concurrency", "1", "--gamma", "2,,4"], "empty item"),
    (["--concurrency", "1", "--target", "gguf:/no/such/model.gguf"], "model file missing"),
    (["--concurrency", "1", "--target", "gpt2"], "llama-server needs a GGUF file"),
    (["--concurrency", "1", "--url", "http://127.0.0.1:9", "--gamma", "4"], "--gamma applies to a llama-server"),
    (["--concurrency", "1", "--step-cost-gamma", "2"], "apply with --step-cost only"),
    (["--concurrency", "1", "--step-cost-requests", "2"], "apply with --step-cost only"),
    (["--concurrency", "1", "--step-cost", "--step-cost-repeats", "4"], "--step-cost-repeats 4 is out of range"),
    (["--concurrency", "1", "--url", "http://127.0.0.1:9", "--llama-server", "/x"], "--llama-server applies"),
    (["--concurrency", "1", "--extend", "--force-new"], "--extend adds units to the run in --out; --force-new"),
    (["--concurrency", "1", "--regret", "0.05"], "--regret applies with --until-decided only"),
    (["--concurrency", "1", "--time-budget", "60"], "--time-budget applies with --until-decided only"),
    (["--concurrency", "1", "--until-decided", "--url", "http://127.0.0.1:9"], "--url is not raced"),
    (["--concurrency", "1", "--until-decided", "--step-cost"], "--step-cost is not raced"),
    (["--concurrency", "1", "--until-decided", "--regret", "1.5"], "--regret"),
    (["--concurrency", "1", "--until-decided", "--confidence", "0.2"], "--confidence"),
    (["--concurrency", "1", "--until-decided", "--time-budget", "0"], "--time-budget"),
])
def test_bad_input_is_one_line_before_anything_starts(fake_bin, tmp_path, capsys, argv, message):
    assert _run(argv + ["--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "r").exists() and not (tmp_path / "pids").exists()


def test_missing_binary_says_how_to_get_one(tmp_path, monkeypatch, capsys):
    from measure.engines.llamacpp_native import build

    monkeypatch.delenv("SPECSCOPE_LLAMA_SERVER", raising=False)
    monkeypatch.setattr(build, "installed_build", lambda: None)  # no project build here
    assert _run(["--concurrency", "1", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert "llama-server not found" in err and "python -m measure build-llamacpp" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "r").exists()
    assert _run(["--concurrency", "1", "--llama-server", str(tmp_path / "nope"), "--out", str(tmp_path / "r")]) == 2
    assert "--llama-server=" in capsys.readouterr().err


@pytest.mark.slow
def test_the_projects_build_is_found_checked_and_recorded(fake_bin, model, tmp_path, monkeypatch):
    from measure.engines.llamacpp_native import build, probe

    monkeypatch.delenv("SPECSCOPE_LLAMA_SERVER")
    checked_with = []
    monkeypatch.setattr(build, "tool_path", lambda name: fake_bin)
    monkeypatch.setattr(probe, "check_installed", lambda m: checked_with.append(m) or
                        {"build": {"key": "0.3.36-portable-test"}, "selection": {"variant": "libggml-cpu-x64.so"}})
    out = tmp_path / "run"
    assert _run(["--target", model, "--gamma", "2", "--concurrency", "1", "--out", str(out), *BASE]) == 0
    server = load_run(out).meta["server"]
    assert server["binary"] == str(fake_bin) and server["found_by"] == "build"
    assert server["build"]["key"] == "0.3.36-portable-test"
    assert server["cpu_backend"]["variant"] == "libggml-cpu-x64.so"
    assert checked_with == [Path(model[5:])]  # the run's own model decoded before the server starts


@pytest.mark.slow
def test_the_flag_overrides_the_environment_and_is_not_checked(fake_bin, model, tmp_path, monkeypatch):
    from measure.engines.llamacpp_native import probe

    monkeypatch.setenv("SPECSCOPE_LLAMA_SERVER", str(tmp_path / "not-this-one"))
    monkeypatch.setattr(probe, "check_installed", lambda m: pytest.fail("an override is run as it is"))
    out = tmp_path / "run"
    assert _run(["--target", model, "--gamma", "2", "--concurrency", "1", "--llama-server", str(fake_bin),
                 "--out", str(out), *BASE]) == 0
    server = load_run(out).meta["server"]
    assert server["found_by"] == "flag" and server["build"] is None


@pytest.mark.slow
def test_step_cost_units_have_their_own_requests_and_repeats(fake_bin, model, tmp_path):
    out = tmp_path / "run"
    assert _run(["--target", model, "--gamma", "2", "--concurrency", "1", "--step-cost", "--step-cost-gamma", "2",
                 "--step-cost-concurrency", "1,2", "--step-cost-prompt-tokens", "32", "--step-cost-requests", "2",
                 "--step-cost-repeats", "1", "--slots", "2", "--out", str(out), *BASE]) == 0
    run = load_run(out)
    units = run.table("serve_units")
    synth = units[units["synthetic"].astype(bool)]
    assert len(synth) == 2 * 2 and set(synth["repeat"]) == {0}  # (off, k2) x (c1, c2), one repeat
    assert (synth["n_requests"] == 2).all() and (units[~units["synthetic"].astype(bool)]["n_requests"] == 3).all()
    assert run.meta["config"]["step_cost"]["requests"] == 2 and run.meta["config"]["step_cost"]["repeats"] == 1


def test_url_that_does_not_answer(tmp_path, capsys):
    from measure.serve.server import free_port

    assert _run(["--url", f"http://127.0.0.1:{free_port()}", "--concurrency", "1", "--out", str(tmp_path / "r")]) == 2
    assert "does not answer" in capsys.readouterr().err


@pytest.mark.slow
def test_ctrl_c_closes_the_run_interrupted_and_stops_the_server(fake_bin, model, tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "FAKE_STEP_MS": "40", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "measure", "serve", "--target", model, "--gamma", "2",
                             "--concurrency", "1", "--out", str(out), *BASE], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and not (out / "serve_units.csv").exists():
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert load_run(out).status == "interrupted"
    assert _pids_dead(tmp_path)


# -- a misbehaving server (issue #43): a unit is finished only when every request of its load finished --------
URL_BASE = ["--domains", "code", "--prompts", "1", "--requests", "4", "--max-new-tokens", "6", "--repeats", "1"]


def _url_run(url: str, out: Path, *extra: str) -> int:
    return _run(["--url", url, "--concurrency", "2", "--out", str(out), *URL_BASE, *extra])


def _result(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


def test_failed_requests_keep_a_unit_unfinished_and_the_run_failed(url_server, tmp_path, capsys):
    url, _ = url_server(FAKE_HTTP500_EVERY="2")
    out = tmp_path / "run"
    assert _run(["--url", url, "--concurrency", "1,2", "--out", str(out), *URL_BASE]) == 1
    cap = capsys.readouterr()
    run = load_run(out)
    assert run.status == "failed" and len(run.table("serve_units")) == 0  # no half-load unit kept as finished
    result = _result(cap.out)
    assert result["status"] == "failed" and [f["n_failed"] for f in result["failed_units"]] == [2, 2]
    assert "failed units: 2 (requests failed: 4 of 8)" in cap.out and "HTTP 500" in cap.out
    assert "failed: no unit finished" in cap.err and "Traceback" not in cap.err
    assert set(run.meta["failed_units"]) == {f["unit"] for f in result["failed_units"]}


@pytest.mark.parametrize("env,reason", [
    ({"FAKE_PLAIN_JSON": "1"}, "HTTP 200 without an event stream (content-type application/json"),
    ({"FAKE_NON_OBJECT_CHUNK": "1"}, "a stream chunk is not a JSON object ([1, 2])"),
])
def test_a_server_that_does_not_stream_fails_the_run(url_server, tmp_path, capsys, env, reason):
    url, _ = url_server(**env)
    out = tmp_path / "run"
    assert _url_run(url, out) == 1
    cap = capsys.readouterr()
    assert load_run(out).status == "failed" and reason in cap.err and "Traceback" not in cap.err
    assert _result(cap.out)["failed_units"][0]["n_failed"] == 4


def test_a_run_that_failed_before_measuring_does_not_block_the_next_command(url_server, tmp_path, capsys):
    bad, _ = url_server(FAKE_PLAIN_JSON="1")
    out = tmp_path / "run"
    assert _url_run(bad, out) == 1 and load_run(out).status == "failed"
    good, _ = url_server()
    assert _url_run(good, out) == 0  # another --url into the same --out: no --force-new needed
    assert "failed before it measured anything" in capsys.readouterr().err
    assert load_run(out).status == "complete" and len(list(out.glob("run.failed-*.json"))) == 1


def test_a_stalled_stream_fails_its_request_after_the_stall_timeout(url_server, tmp_path, capsys):
    url, _ = url_server(FAKE_STALL_AFTER="2")
    t0 = time.monotonic()
    assert _url_run(url, tmp_path / "run", "--stall-timeout", "1") == 1
    assert time.monotonic() - t0 < 20  # not the 600 s request timeout
    assert "the stream stalled: no chunk for 1 s after 3 token(s)" in capsys.readouterr().err  # 1 + a round of 2


@pytest.mark.parametrize("usage", ["1000000000", "-50", '"many"', "null"])
def test_tokens_are_counted_from_the_stream_and_the_servers_usage_checked(url_server, tmp_path, capsys, usage):
    url, _ = url_server(FAKE_USAGE=usage)
    out = tmp_path / "run"
    assert _url_run(url, out) == 0
    err = capsys.readouterr().err
    notes = [ln for ln in err.splitlines() if "usage.completion_tokens disagrees" in ln]
    assert len(notes) == (0 if usage == "null" else 1)  # one line per unit: the streamed count is used
    assert all(f"(e.g. {json.loads(usage)} for 6 streamed); the streamed count is used" in n for n in notes)
    run = load_run(out)
    units, reqs = run.table("serve_units"), run.table("serve_requests")
    assert (reqs["completion_tokens"] == 6).all() and (units["completion_tokens"] == 4 * 6).all()
    assert units["throughput_tokens_per_s"].between(1, 1e6).all()


def test_a_unit_with_failed_requests_is_measured_again_on_resume(url_server, tmp_path, capsys):
    from measure.serve.server import free_port

    port = free_port()
    url, proc = url_server(port=port, FAKE_DIE_AFTER="8")  # per repeat: a warm-up and 4 requests; dies after
    # 2 requests of repeat 1 (its unit half measured: it used to be kept as finished, the run complete)
    out = tmp_path / "run"
    argv = ["--url", url, "--concurrency", "2", "--out", str(out), *URL_BASE[:-1], "2"]
    assert _run(argv) == 1
    assert "interrupted:" in capsys.readouterr().err
    run = load_run(out)
    assert run.status == "interrupted" and list(run.table("serve_units")["repeat"]) == [0]
    proc.wait(timeout=10)
    url_server(port=port)
    assert _run(argv) == 0
    run = load_run(out)
    assert run.status == "complete" and sorted(run.table("serve_units")["repeat"]) == [0, 1]
    assert len(run.table("serve_requests")) == 2 * 4 and not run.meta.get("failed_units")


@pytest.mark.slow
def test_the_server_is_stopped_when_our_process_is_killed(fake_bin, tmp_path):
    code = ("import sys, time; from pathlib import Path; from measure.serve.server import LlamaServer, ServerSpec;"
            "from measure.serve.units import ServeConfig;"
            f"s = LlamaServer(ServerSpec(Path({str(fake_bin)!r}), Path('m.gguf'), ServeConfig('off'), 1, 1, 256),"
            f" Path({str(tmp_path / 'log')!r})).__enter__(); print('up', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    proc.kill()  # SIGKILL: no handler, no finally
    proc.wait()
    deadline = time.time() + 10
    while time.time() < deadline and not _pids_dead(tmp_path):
        time.sleep(0.1)
    assert _pids_dead(tmp_path), "llama-server outlived the process that started it"


# -- bad input a server would only fail on later (issue #43) ---------------------------------------------------
def test_a_target_that_is_not_a_gguf_is_refused_before_a_server_starts(fake_bin, tmp_path, capsys):
    bad = tmp_path / "weights.bin"
    bad.write_bytes(b"PK\x03\x04 not a model")
    assert _run(["--target", f"gguf:{bad}", "--concurrency", "1", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a GGUF file" in err[0] and str(bad) in err[0]
    assert not (tmp_path / "pids").exists() and not (tmp_path / "r").exists()


@pytest.mark.parametrize("argv", [["--concurrency", "1024"],
                                  ["--concurrency", "1", "--slots", "256", "--max-new-tokens", "8192"]])
def test_a_kv_cache_beyond_the_machines_memory_is_refused_in_one_line(fake_bin, tmp_path, capsys, monkeypatch,
                                                                       argv):
    from measure import system
    from tests.support.gguf_headers import llama_header

    model = tmp_path / "m.gguf"
    model.write_bytes(llama_header(layers=30, heads=9, kv_heads=3, width=576))  # SmolLM2-135M's sizes
    monkeypatch.setattr(system, "available_memory_bytes", lambda: 8 * 2**30)
    assert _run(["--target", f"gguf:{model}", *argv, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "KV cache needs" in err[0] and "8.0 GiB available" in err[0], err
    assert "22.5 KiB a token" in err[0] and not (tmp_path / "pids").exists()
    monkeypatch.setattr(system, "available_memory_bytes", lambda: 64 * 2**40)  # a machine it fits: no refusal
    from measure.serve.cli import kv_cache_bytes

    assert kv_cache_bytes(model, 1024 * 512) is not None


@pytest.mark.slow
def test_the_slot_context_the_server_runs_is_recorded_not_the_one_asked(fake_bin, model, tmp_path, capsys):
    out = tmp_path / "run"
    assert _run(["--target", model, "--gamma", "2", "--concurrency", "1", "--ctx-per-slot", "64", "--out", str(out),
                 *BASE[:-1], "1"]) == 0
    cfg = load_run(out).meta["config"]
    assert cfg["ctx_per_slot"] == 256 and cfg["ctx_per_slot_asked"] == 64 and cfg["ctx_per_slot_source"] == "server"
    assert "llama-server runs 256 tokens of context a slot, not the 64 asked" in capsys.readouterr().err


def test_a_server_that_cannot_load_its_model_is_said_by_its_first_error(tmp_path):
    from measure.serve.server import _log_reason

    log = tmp_path / "server.log"
    log.write_text("# llama-server -m cut.gguf\n0.00.10 I main: loading model\n"
                   "0.00.10 E llama_model_load: error loading model: tensor 'token_embd.weight' data is not within "
                   "the file bounds, model is corrupted or incomplete\n0.00.10 E llama_model_load_from_file_impl: "
                   "failed to load model\n0.00.19 E srv  llama_server: exiting due to model loading error\n")
    assert _log_reason(log).startswith("llama_model_load: error loading model: tensor 'token_embd.weight' data")
    log.write_text("main: server is listening\ncouldn't bind HTTP server socket\n")
    assert _log_reason(log) == "couldn't bind HTTP server socket"


# -- the pieces -------------------------------------------------------------------------------------------
def test_identities_round_trip():
    for text in ("off", "url", "ngram:3:k4", "synth:k8:p512", "synth:off:p32"):
        assert ServeConfig.parse(text).to_str() == text
    for text in ("c4", "r2.5"):
        assert LoadSpec.parse(text).to_str() == text
    uid = UnitId(ServeConfig("ngram", 4, 3), 4, LoadSpec(rate_per_s=2.5), 1)
    assert UnitId.parse(uid.to_str()) == uid
    assert "--spec-ngram-simple-size-m" in ServeConfig("ngram", 4, 3).server_args(4)
    assert "--spec-synth-rates" in ServeConfig("synth", 2, 0, 64).server_args(4)
    for bad in ("ngram:3", "k4", "synth:k4"):
        with pytest.raises(ValueError, match="configuration"):
            ServeConfig.parse(bad)
    with pytest.raises(ValueError, match="load"):
        LoadSpec.parse("x3")


def test_log_interval_stays_positive():
    est = log_interval([1.0, 9.0, 0.5])
    assert 0 < est.lo < est.value < est.hi
    assert log_interval([3.0]).lo is None
    assert log_interval([]).value is None


def test_step_cost_rows_from_lockstep_tokens():
    # two slots, k = 2, every step 10 ms (synthetic acceptance: one token per slot per step), 20 tokens each
    t0 = 100.0
    res = []
    for i in range(2):
        r = RequestResult(i, "synth/p64", "synthetic", sent_s=t0, tokens=20, prompt_tokens=64)
        r.event_s = [t0 + 0.05 + 0.010 * j + 1e-5 * i for j in range(20)]
        res.append(r)
    load = LoadResult(res, t0, 1.0, 0.01, np.array([]))
    rows = step_cost_rows("u", ServeConfig("synth", 2, 0, 64), load, 20)
    steps = [r for r in rows if r.prompt_tokens is None]
    assert steps and all(r.seqs == 2 and r.tokens_per_seq == 3 for r in steps)
    assert all(r.step_ms == pytest.approx(10.0, abs=0.05) for r in steps)
    assert sum(r.n_steps for r in steps) == 20 - 1 - 3  # no first token, no capped drafts at the end
    ttft = [r for r in rows if r.prompt_tokens is not None]
    assert ttft[0].prompt_tokens == 128 and ttft[0].ttft_ms == pytest.approx(50.0, abs=0.1)


def test_summary_pairs_the_speedup_by_repeat():
    import pandas as pd

    rows = []
    for rep, (base, spec) in enumerate(((100.0, 120.0), (80.0, 96.0), (90.0, 108.0))):
        for cfg, thr in (("off", base), ("ngram:3:k4", spec)):
            rows.append({"config": cfg, "slots": 2, "load": "c2", "repeat": rep, "synthetic": False,
                         "throughput_tokens_per_s": thr, "draft_tokens": 10 if cfg != "off" else 0,
                         "accepted_tokens": 5 if cfg != "off" else 0, "drafts": 4 if cfg != "off" else 0,
                         **{m: 10.0 for m in ("ttft_p50_ms", "tpot_p50_ms", "tpot_p95_ms", "tpot_p99_ms",
                                              "itl_p50_ms", "itl_p95_ms", "itl_p99_ms", "e2e_p50_ms",
                                              "e2e_p95_ms", "e2e_p99_ms")}})
    groups = summarise(pd.DataFrame(rows))
    spec = next(g for g in groups if g.config == "ngram:3:k4")
    assert spec.throughput_speedup.value == pytest.approx(1.2)
    assert spec.throughput_speedup.hi - spec.throughput_speedup.lo < 1e-9  # the same ratio every repeat
    assert spec.acceptance_rate == pytest.approx(0.5)


def test_a_k_below_the_lookup_ngram_is_said_before_the_run(capsys):
    from measure.serve.cli import build_parser, plan_from_args

    args = build_parser().parse_args(["--draft", "ngram:3", "--gamma", "2,4", "--concurrency", "1",
                                      "--domains", "code", "--prompts", "1"])
    plan, _ = plan_from_args(args)
    err = capsys.readouterr().err
    assert "never drafts when k < n" in err and "ngram:3 with k = 2 " in err
    plan_from_args(build_parser().parse_args(["--draft", "ngram:2", "--gamma", "2,4", "--concurrency", "1",
                                              "--domains", "code", "--prompts", "1"]))
    assert "never drafts" not in capsys.readouterr().err
