"""``python -m measure`` through a subprocess: a tiny run, the run directory, errors, resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from measure import records

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "measure", *args], capture_output=True, text=True, cwd=ROOT,
                       env=env, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(p.stderr[-3000:])
    return p


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    path = tmp_path_factory.mktemp("tiny_llama")
    cfg = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    return str(path)


BASE = ("--prompts", "1", "--max-new-tokens", "12", "--cost-contexts", "16", "--cost-max-tokens", "3",
        "--quiet", "--warmup", "0")


def test_cli_run_writes_run_directory(tiny_dir, tmp_path):
    out = tmp_path / "run"
    p = _run("--target", tiny_dir, "--draft", "ngram:2,early:2", "--gamma", "2,heuristic:2", "--temperature",
             "0,0.8", "--domains", "code,docs", "--out", str(out), *BASE)
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["run_dir"] == str(out) and summary["status"] == "complete"
    assert summary["all_greedy_outputs_identical"] is True
    for k in ("tokens_per_s_baseline", "tokens_per_s_speculative", "speedup", "acceptance_rate",
              "mean_accepted_per_round", "outputs_identical"):
        assert k in summary
    assert f"run directory: {out}" in p.stdout
    run = records.load_run(out)
    assert run.status == "complete" and run.meta["models"]["target"]["synthetic"] is False
    cells = run.table("cells")
    assert len(cells) == 2 * 2 * 2 * 2
    assert cells[cells.temperature == 0]["outputs_identical"].all()
    gens = run.table("generations")
    assert set(gens["mode"]) == {"baseline", "speculative", "peer"}
    assert len(run.table("rounds")) > 0 and len(run.table("token_latency")) > 0
    assert sorted(run.table("cost_target")["n_tokens"].unique()) == [1, 2, 3]
    assert set(run.table("cost_draft")["draft"]) == {"ngram:2", "early:2"}
    traces = run.table("traces")
    assert set(traces["temperature"]) == {0.0, 0.8} and traces["value"].between(0, 1).all()
    assert "draft=ngram:2|gamma=fixed:2|temp=0|domain=code" in set(cells["cell_id"])


def test_cli_resume_skips_finished_cells(tiny_dir, tmp_path):
    out = tmp_path / "run"
    _run("--target", tiny_dir, "--draft", "ngram:2", "--gamma", "1", "--domains", "code", "--out", str(out),
         "--no-peer", *BASE)
    first = records.load_run(out)
    gen_before = first.table("generations")
    # an interrupted second cell: rows on disk, no cells.csv row, status interrupted
    w = records.RunWriter(out)
    bad = records.cell_id("ngram:2", "fixed:3", 0, "code")
    w.append("rounds", [{"cell_id": bad, "prompt_id": "x", "round": 0, "gamma": 3, "context_tokens": 1,
                         "drafted": 3, "accepted": 0, "draft_ms": 1.0, "verify_ms": 1.0, "overhead_ms": 0.0}])
    w.close("interrupted")
    p = _run("--target", tiny_dir, "--draft", "ngram:2", "--gamma", "1,3", "--domains", "code", "--out", str(out),
             "--no-peer", *BASE)
    run = records.load_run(out)
    assert run.status == "complete" and len(run.meta["resumed_utc"]) == 2
    cells = run.table("cells")
    assert sorted(cells["gamma"]) == [1, 3]
    gens = run.table("generations")
    old = gens[gens.cell_id == first.table("cells")["cell_id"][0]]
    assert len(old) == len(gen_before)  # the finished cell was not re-run
    assert old["wall_s"].tolist() == gen_before["wall_s"].tolist()
    rounds = run.table("rounds")
    assert "x" not in set(rounds["prompt_id"])  # unfinished rows were dropped
    assert len(run.table("cost_target")) == len(first.table("cost_target"))  # not re-timed
    assert json.loads(p.stdout.strip().splitlines()[-1])["n_cells"] == 2


@pytest.mark.parametrize("args, msg", [
    (("--target", "no-such-model"), "unknown model 'no-such-model'"),
    (("--gamma", "0"), "--gamma 0: must be an integer >= 1"),
    (("--temperature", "-0.5"), "--temperature -0.5: must be >= 0"),
    (("--draft", "magic"), "unknown draft kind 'magic'"),
    (("--domains", "math"), "unknown domain 'math'"),
    (("--device", "tpu"), "unknown device 'tpu'"),
    (("--pair", "nope"), "--pair 'nope': unknown pair"),
])
def test_cli_bad_input_is_one_line(tiny_dir, tmp_path, args, msg):
    full = ("--target", tiny_dir, "--out", str(tmp_path / "r"), *BASE, *args)
    p = _run(*full, check=False)
    assert p.returncode != 0
    assert msg in p.stderr and "Traceback" not in p.stderr, p.stderr[-2000:]


def test_cli_unwritable_out_and_mismatched_vocab(tiny_dir, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    p = _run("--target", tiny_dir, "--out", str(f / "sub"), *BASE, check=False)
    assert p.returncode != 0 and "not writable" in p.stderr and "Traceback" not in p.stderr

    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    other = tmp_path / "other"
    with torch.random.fork_rng():
        AutoModelForCausalLM.from_config(LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32,
                                                     num_hidden_layers=1, num_attention_heads=2,
                                                     num_key_value_heads=1, head_dim=8)).save_pretrained(other)
    p = _run("--target", tiny_dir, "--draft", f"model:{other}", "--out", str(tmp_path / "r2"), *BASE, check=False)
    assert p.returncode != 0 and "must share a tokenizer" in p.stderr and "Traceback" not in p.stderr
