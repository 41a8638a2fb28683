"""``python -m sim tree`` through a subprocess (its bad inputs are in tests/sim/test_sim_bad_input.py)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sim", "tree", *args], capture_output=True, text=True, timeout=120)


def js(*args: str) -> dict:
    r = run(*args, "--format", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def pfile(tmp_path_factory) -> str:
    f = tmp_path_factory.mktemp("tree") / "p.json"
    f.write_text(json.dumps({"p": [[0.6, 0.2, 0.1], [0.5, 0.3], [0.7, 0.1, 0.05]]}))
    return str(f)


def test_paths_json_has_the_issue_fields(pfile):
    doc = js("--paths", "[[0],[1],[0,0]]", "--acceptance", pfile, "--cost-ratio", "0.05")
    assert doc["expected_accepted_length"] == pytest.approx(2.1)
    assert [x["probability"] for x in doc["tau_distribution"]] == pytest.approx([0.2, 0.5, 0.3])
    # Leviathan: 2 draft levels at c = 0.05, one verify = one target step
    assert doc["speedup"] == pytest.approx(2.1 / (1 + 2 * 0.05))
    assert doc["paths"] == [[0], [1], [0, 0]] and doc["verify_tokens"] == 4 and doc["rank_law"] is None
    assert doc["vllm_speculative_token_tree"] == "[(0,), (1,), (0, 0)]" and doc["level_uniform"] is False
    assert doc["notes"] == []  # every rank from the file: no rank law to warn about


def test_text_output(pfile):
    r = run("--paths", "[(0,), (1,), (0, 0)]", "--acceptance", pfile, "--cost-ratio", "0.05")
    assert r.returncode == 0, r.stderr
    assert "expected_accepted_length: 2.1000" in r.stdout and "P(tau=3) 0.300" in r.stdout
    assert "predicted speedup: 1.909x" in r.stdout and "not level-uniform" in r.stdout


def test_a_chain_tree_is_the_chain_command():
    chain = js("--paths", "[[0],[0,0],[0,0,0],[0,0,0,0]]", "--alpha", "0.7", "--preset", "llama3-1b-8b")
    r = subprocess.run([sys.executable, "-m", "sim", "--alpha", "0.7", "--preset", "llama3-1b-8b", "--gamma", "4",
                        "--format", "json"], capture_output=True, text=True, timeout=120)
    row = json.loads(r.stdout)["rows"][0]
    assert chain["speedup"] == pytest.approx(row["speedup"], rel=1e-12)
    assert chain["expected_accepted_length"] == pytest.approx(row["expected_tokens_per_round"], rel=1e-12)


def test_budget_prints_the_optimal_tree_and_preset_numbers_say_where_they_come_from():
    doc = js("--budget", "8", "--max-depth", "3", "--preset", "llama3-8b-70b", "--hardware", "h100-sxm", "--tp", "4", "--cost-source", "roofline")
    assert doc["optimal"]["budget"] == 8 and doc["n_nodes"] == 8 and doc["depth"] <= 3
    assert doc["rank_law"] == "power" and "preset llama3-8b-70b: alpha = 0.8" in doc["acceptance_source"]
    assert "Medusa" in doc["acceptance_source"] and doc["hardware"] == "h100-sxm"
    assert "-6% to +8%" in doc["notes"][0] and "results/2026-11-24-tree-rank-law.md" in doc["notes"][0]
    geo = js("--budget", "8", "--max-depth", "3", "--preset", "llama3-8b-70b", "--rank-law", "geometric", "--tp", "4", "--cost-source", "roofline")
    assert geo["expected_accepted_length"] > doc["expected_accepted_length"]  # the optimistic law
    none = js("--budget", "3", "--preset", "llama3-8b-70b", "--rank-law", "none", "--tp", "4", "--cost-source", "roofline")
    assert none["paths"] == [[0], [0, 0], [0, 0, 0]]  # top-1 only: chains are all there is


def test_advise_answers_and_gives_engine_settings():
    args = ("--budget", "12", "--max-depth", "5", "--advise", "--preset", "llama3-8b-70b", "--hardware", "h100-sxm", "--tp", "4", "--cost-source", "roofline")
    doc = js(*args)
    assert doc["verdict"] in ("pays", "marginal", "does not pay") and doc["answer"].startswith("branching")
    assert [r["budget"] for r in doc["rows"]] == list(range(1, 13))
    assert doc["rows"][5]["chain"] is None and doc["rows"][4]["chain"]["n_nodes"] == 5
    sg, vl = doc["sglang"]["flags"], doc["vllm"]["flags"]
    assert set(sg) == {"speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"}
    assert sg["speculative_num_steps"] <= 5 and sg["speculative_num_draft_tokens"] <= 13
    assert vl["num_speculative_tokens"] == len(ast.literal_eval(vl["speculative_token_tree"]))
    r = run(*args)
    assert r.returncode == 0 and doc["answer"] in r.stdout and "SGLang: --speculative-num-steps" in r.stdout
    assert "vLLM:   --speculative-config" in r.stdout and "chain tau" in r.stdout


def test_batch_changes_the_answer_on_a_gpu():
    # at batch 1 the 8B target is memory-bound and a wide tree verifies almost free; at batch 256 it is not
    one = js("--budget", "16", "--advise", "--preset", "llama3-1b-8b", "--hardware", "h100-sxm")
    big = js("--budget", "16", "--advise", "--preset", "llama3-1b-8b", "--hardware", "h100-sxm", "--batch", "256")
    assert one["verdict"] == "pays" and big["verdict"] != "pays"
    assert big["best_tree"]["n_nodes"] < one["best_tree"]["n_nodes"]


def test_event_mode_is_seeded(pfile):
    a = run("--paths", "[[0],[1],[0,0]]", "--acceptance", pfile, "--cost-ratio", "0.1", "--mode", "event",
            "--seed", "3", "--new-tokens", "2000", "--format", "json")
    b = run("--paths", "[[0],[1],[0,0]]", "--acceptance", pfile, "--cost-ratio", "0.1", "--mode", "event",
            "--seed", "3", "--new-tokens", "2000", "--format", "json")
    assert a.returncode == 0 and a.stdout == b.stdout
    ev = json.loads(a.stdout)["event"]
    assert ev["new_tokens"] >= 2000 and ev["seed"] == 3 and abs(ev["mean_accepted_length"] - 2.1) < 0.1


def test_ingest_acceptance_file_is_the_chain_case(tmp_path):
    f = tmp_path / "acceptance.json"
    f.write_text(json.dumps({"kind": "per_position", "alphas": [0.837, 0.799, 0.783]}))  # vLLM's 0.837, 0.669, 0.524
    doc = js("--paths", "[[0],[0,0],[0,0,0]]", "--acceptance", str(f), "--cost-ratio", "0.1", "--rank-law", "none")
    assert doc["expected_accepted_length"] == pytest.approx(1 + 0.837 + 0.837 * 0.799 + 0.837 * 0.799 * 0.783)


def test_draft_head_presets_advise_and_say_their_alpha_is_from_a_tree():
    doc = js("--budget", "12", "--max-depth", "8", "--advise", "--preset", "eagle3-llama3.1-8b", "--hardware", "h100-sxm")
    assert "EAGLE-3" in doc["acceptance_source"] and doc["sglang"]["flags"]["speculative_num_steps"] <= 8
    assert any("measured with tree drafts" in n for n in doc["notes"])
    assert any("power rank law" in n for n in doc["notes"])
    plain = js("--budget", "4", "--preset", "llama3-1b-8b")
    assert not any("tree drafts" in n for n in plain["notes"])


def test_gpu_flags_price_the_tree_through_the_seam():
    r = run("--budget", "4", "--preset", "eagle3-llama3.1-8b", "--hardware", "b200", "--cost-source", "roofline")
    assert r.returncode == 0, r.stderr
    assert "cost source: target roofline (asked: --cost-source roofline)" in r.stdout
    bad = run("--budget", "4", "--preset", "eagle3-llama3.1-8b", "--hardware", "h200", "--dtype", "nvfp4")
    assert bad.returncode == 2 and "--dtype nvfp4 needs FP4 tensor cores" in bad.stderr
