"""``python -m measure``: a tiny run, the run directory, errors, resume.

The flag checks, the refusals and the resume run the CLI's ``main`` in this process
(:func:`cli_inprocess.run_main`: exit status, stdout, stderr as a finished process would give them);
the tests of the process itself (its first run, Ctrl-C, the same one-line error from ``python -m
measure``) spawn one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli_inprocess import run_main
from measure import records
from measure.__main__ import main as measure_main
from measure.rows import RoundRow

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "measure", *args], capture_output=True, text=True, cwd=ROOT,
                       env=env, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(p.stderr[-3000:])
    return p


def _main(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """What ``_run(*args)`` gives, from ``python -m measure``'s ``main`` in this process."""
    p = run_main(measure_main, args)
    if check and p.returncode != 0:
        raise AssertionError(p.stderr[-3000:])
    return p


NO_COST = ("--prompts", "1", "--max-new-tokens", "12", "--quiet", "--warmup", "0", "--repeats", "2",
           "--no-system-check", "--no-progress", "--no-cost")
BASE = (*NO_COST[:-1], "--cost-contexts", "16", "--cost-max-tokens", "3")


@pytest.mark.slow
def test_cli_run_writes_run_directory(tiny_llama_dir, tmp_path):
    out = tmp_path / "run"
    p = _run("--target", tiny_llama_dir, "--draft", "ngram:2,early:2", "--gamma", "2,heuristic:2", "--temperature",
             "0,0.8", "--domains", "code,docs", "--out", str(out), *BASE)
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["run_dir"] == str(out) and summary["status"] == "complete"
    assert summary["all_greedy_outputs_identical"] is True
    for d in ("ngram:2", "early:2"):
        e = summary["drafts"][d]
        assert e["n_cells"] == 8 and e["geomean_speedup"] > 0 and "best_cell" in e and "n_unstable" in e
    assert "NaN" not in p.stdout
    assert "speedup [95% CI]" in p.stdout  # the table, printed as cells finish
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


def test_cli_resume_skips_finished_cells(tiny_llama_dir, tmp_path):
    out = tmp_path / "run"
    args = ("--target", tiny_llama_dir, "--draft", "ngram:2", "--gamma", "1,3", "--domains", "code", "--out", str(out),
            "--no-peer", *BASE)
    _main(*args)
    first = records.load_run(out)
    keep = records.cell_id("ngram:2", "fixed:1", 0, "code")
    gen_before = first.table("generations")
    gen_before = gen_before[gen_before.cell_id == keep]
    # an interrupted run: its second cell's rows on disk without its cells.csv row, and a stray row
    cells_csv = out / "cells.csv"
    lines = cells_csv.read_text().splitlines(keepends=True)
    cells_csv.write_text("".join(ln for ln in lines if "fixed:3" not in ln))
    w = records.RunWriter(out)
    bad = records.cell_id("ngram:2", "fixed:3", 0, "code")
    w.append("rounds", [RoundRow(bad, "x", 0, 3, 1, 3, 0, 1.0, 1.0, 0.0, repeat=0)])
    w.close("interrupted")
    p = _main(*args)
    run = records.load_run(out)
    assert run.status == "complete" and len(run.meta["resumed_utc"]) == 2
    cells = run.table("cells")
    assert sorted(cells["gamma"]) == [1, 3]
    gens = run.table("generations")
    old = gens[gens.cell_id == keep]
    assert len(old) == len(gen_before)  # the finished cell was not re-run
    assert old["wall_s"].tolist() == gen_before["wall_s"].tolist()
    rounds = run.table("rounds")
    assert "x" not in set(rounds["prompt_id"])  # unfinished rows were dropped
    assert len(run.table("cost_target")) == len(first.table("cost_target"))  # not re-timed
    assert json.loads(p.stdout.strip().splitlines()[-1])["n_cells"] == 2
    # another γ on the same --out: refused in one line naming --extend, before any model loads ...
    more = [a if a != "1,3" else "1,3,4" for a in args]
    p = _main(*more, check=False)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "--extend" in p.stderr
    assert "adds γ fixed:4" in p.stderr and "loading" not in p.stderr
    assert records.load_run(out).meta == run.meta  # nothing written
    # ... and added, recorded as an extension, with --extend
    p = _main(*more, "--extend")
    assert "--extend: adding γ fixed:4 to the run (its 2 finished cells are kept" in p.stderr
    ext = records.load_run(out)
    assert ext.status == "complete" and sorted(ext.table("cells")["gamma"]) == [1, 3, 4]
    assert ext.meta["config"] == run.meta["config"] and ext.meta["command"] == run.meta["command"]
    (e,) = ext.meta["extensions"]
    assert e["added"] == {"gammas": ["fixed:4"]} and e["status"] == "complete" and "--extend" in e["command"]
    assert e["config"]["gammas"] == ["fixed:1", "fixed:3", "fixed:4"]
    p = _main(*more, "--extend", "--force-new", check=False)
    assert p.returncode == 2 and "give one of them" in p.stderr


NO_MODEL = "specscope-tests/no-such-model"  # a hub id never cached: any attempt to load it fails differently


@pytest.mark.parametrize("args, msg", [
    (("--gamma", "0"), "--gamma 0: must be an integer in 1..64"),
    (("--gamma", "1000000000"), "--gamma 1000000000: must be an integer in 1..64"),
    (("--gamma", "1,,2"), "--gamma '1,,2': empty item"),
    (("--temperature", "-0.5"), "--temperature -0.5: must be a finite number >= 0"),
    (("--temperature", "inf"), "--temperature inf: must be a finite number >= 0"),
    (("--temperature", "nan"), "--temperature nan: must be a finite number >= 0"),
    # draft-spec messages name the value (their wording is measure.drafts.parse_draft_spec's once it exists)
    (("--draft", "magic"), "'magic'"),
    (("--draft", ""), "--draft '': empty value"),
    (("--draft", "ngram:0"), "'ngram:0'"),
    (("--draft", "ngram:abc"), "'ngram:abc'"),
    (("--draft", "model:"), "'model:'"),
    (("--draft", "early:abc"), "'early:abc'"),
    (("--draft", "layers:5-2"), "'layers:5-2'"),
    (("--draft", "ngram:2,,int8"), "--draft 'ngram:2,,int8': empty item"),
    (("--domains", "math"), "--domains 'math': unknown domain"),
    (("--domains", "code,,docs"), "--domains 'code,,docs': empty item"),
    (("--device", "tpu"), "unknown device 'tpu'"),
    (("--pair", "nope"), "--pair 'nope': unknown pair"),
    (("--pair", "gpt2-small-large", "--draft", "int8"), "do not combine it with --target/--draft"),
    (("--repeats", "0"), "argument --repeats: '0' is out of range; valid: an integer in 1..1,000"),
    (("--repeats", "abc"), "argument --repeats: 'abc' is not an integer"),
    (("--cv-threshold", "-0.1"), "argument --cv-threshold: '-0.1' is out of range"),
    (("--cv-threshold", "abc"), "argument --cv-threshold: 'abc' is not a number"),
    (("--drift-threshold", "nan"), "argument --drift-threshold: 'nan' is not a finite number"),
    (("--until-stable", "-1"), "argument --until-stable: '-1' is out of range; valid: an integer in 0..100"),
    (("--interleave", "pass"), "argument --interleave: invalid choice: 'pass'"),
    (("--max-new-tokens", "0"), "argument --max-new-tokens: '0' is out of range"),
    (("--max-new-tokens", "1e12"), "argument --max-new-tokens: '1e12' is not an integer"),
    (("--prompts", "-3"), "argument --prompts: '-3' is out of range"),
    (("--cost-contexts", "16,,32"), "--cost-contexts '16,,32': empty item"),
    (("--threads", "0"), "argument --threads: '0' is out of range"),
    (("--engine", "vllm"), "argument --engine: invalid choice: 'vllm'"),
    (("--prompts-file", "/nonexistent/p.jsonl"), "--prompts-file '/nonexistent/p.jsonl': no such file"),
    (("--bogus",), "unknown option '--bogus'"),
    # issue 32: flags the engine or --no-cost would ignore are refused, as sim refuses them
    (("--no-cost",), "--cost-contexts would be ignored: --no-cost skips the cost curves; drop it"),
    (("--engine", "llamacpp", "--compile"), "--compile would be ignored: --engine llamacpp has no such setting"),
    (("--engine", "llamacpp", "--cache", "dynamic"), "--cache would be ignored"),
    (("--cache", "paged"), "argument --cache: unknown cache 'paged'; valid: static, dynamic"),
])
def test_cli_bad_input_is_one_line_before_any_model_loads(tmp_path, args, msg):
    out = tmp_path / "r"
    target = () if args[0] == "--pair" and len(args) == 2 else ("--target", NO_MODEL)
    p = _main(*target, "--out", str(out), *BASE, *args, check=False)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and msg in lines[0] and "usage:" not in p.stderr, p.stderr[-2000:]
    assert not out.exists()  # no run directory, let alone one marked failed


@pytest.mark.parametrize("args", [("--repeats", "0"), ("--gamma", "0")])
@pytest.mark.slow
def test_python_m_measure_prints_what_its_main_prints(tmp_path, args):
    """The tests above call ``main`` in this process; ``python -m measure`` gives the same status and line."""
    argv = ("--target", NO_MODEL, "--out", str(tmp_path / "r"), *BASE, *args)
    proc, inproc = _run(*argv, check=False), _main(*argv, check=False)
    assert proc.returncode == inproc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert (proc.stdout, proc.stderr) == (inproc.stdout, inproc.stderr)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("args, msg", [
    # a bad --target was found only when it loaded: the run directory was made (and closed failed) first
    (("--target", "/nonexistent/specscope-model"), "--target /nonexistent/specscope-model: no such directory"),
    (("--target", "./no-such-dir"), "--target ./no-such-dir: no such directory"),
    (("--target", "gguf:{text}"), "--target gguf:{text}: not a GGUF file"),
    (("--target", "gguf:/nonexistent/m.gguf"), "--target gguf:/nonexistent/m.gguf: no such file"),
    (("--target", "synthetic:nope"), "--target synthetic:nope: unknown synthetic model 'nope'; valid: synthetic:"),
    (("--target", "nosuchthing"), "--target nosuchthing: unknown model; valid: smollm2-135m"),
    (("--target", NO_MODEL, "--draft", "model:/nonexistent/d"), "--draft model:/nonexistent/d: no such directory"),
])
def test_cli_bad_model_spec_is_one_line_before_the_run_directory(tmp_path, args, msg):
    text = tmp_path / "notes.gguf"
    text.write_text("not a model")
    out = tmp_path / "r"
    p = _main(*(a.replace("{text}", str(text)) for a in args), "--out", str(out), *BASE, check=False)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert msg.replace("{text}", str(text)) in lines[0], lines[0]
    assert not out.exists()


def test_cli_out_is_a_file_and_unknown_subcommand(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    p = _main("--target", NO_MODEL, "--out", str(f), *BASE, check=False)
    assert p.returncode == 2 and "is a file, not a directory" in p.stderr and len(p.stderr.splitlines()) == 1
    p = _main("head-swep", check=False)
    assert p.returncode == 2 and "valid: head-sweep, head-recall" in p.stderr and len(p.stderr.splitlines()) == 1


@pytest.mark.slow
def test_cli_files_that_are_not_what_they_claim_are_one_line(tmp_path):
    # issue 32: 4,096 NUL bytes were measured as a prompt; a 4-byte .gguf ended in struct.error
    nul = tmp_path / "nul.txt"
    nul.write_bytes(b"\x00" * 4096)
    p = _main("--target", NO_MODEL, "--prompts-file", str(nul), "--out", str(tmp_path / "r"), *BASE, check=False)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert f"--prompts-file {str(nul)!r}: not a text file (a NUL byte at character 0)" in lines[0]
    assert not (tmp_path / "r").exists()
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")
    p = _run("--target", f"gguf:{gguf}", "--draft", "ngram:2", "--gamma", "2", "--domains", "code", "--no-peer",
             "--out", str(tmp_path / "g"), *NO_COST, check=False)
    errors = [ln for ln in p.stderr.strip().splitlines() if "error" in ln.lower()]  # after the "loading" progress line
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert len(errors) == 1 and errors[0] == p.stderr.strip().splitlines()[-1], p.stderr[-2000:]
    assert f"python -m measure: error: GGUF file {str(gguf)!r} cannot be read by transformers' GGUF reader (struct." \
           "error: " in errors[0]


@pytest.mark.parametrize("args, msg", [
    # issue 32: --max-prompt-tokens 9000 beyond the model's context was accepted (tiny_llama_dir has 512 positions)
    (("--max-prompt-tokens", "9000"), "--max-prompt-tokens 9000 + --max-new-tokens 12 + γ 2 = 9014 positions, more "
                                      "than the 512 the target ({tiny}) was trained for; valid: --max-prompt-tokens "
                                      "up to 498"),
    (("--max-new-tokens", "600"), "valid: --max-new-tokens up to 254"),
    (("--cost-contexts", "16,510"), "--cost-contexts 510 + --cost-max-tokens 3 = 513 positions, more than the 512 "
                                    "the target ({tiny}) was trained for; valid: contexts up to 509, or --no-cost"),
])
def test_cli_longer_than_the_model_was_trained_for_is_one_line(tiny_llama_dir, tmp_path, args, msg):
    out = tmp_path / "r"
    args = tuple(a.replace("{tiny}", tiny_llama_dir) for a in args)
    p = _main("--target", tiny_llama_dir, "--gamma", "2", "--out", str(out), *BASE, *args, check=False)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert msg.replace("{tiny}", tiny_llama_dir) in lines[0], lines[0]
    assert not out.exists()  # refused before any weights load, no run directory


def test_a_draft_model_with_a_shorter_context_is_named(tmp_path):
    # the target (smollm2-135m, 8,192 positions from its GGUF header) fits; the draft's 512 do not
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    short = tmp_path / "short"
    with torch.random.fork_rng():
        AutoModelForCausalLM.from_config(LlamaConfig(vocab_size=49152, hidden_size=16, intermediate_size=32,
                                                     num_hidden_layers=1, num_attention_heads=2,
                                                     num_key_value_heads=1, head_dim=8,
                                                     max_position_embeddings=512)).save_pretrained(short)
    p = _main("--target", "smollm2-135m", "--draft", f"model:{short}", "--gamma", "2", "--max-prompt-tokens", "1000",
             "--out", str(tmp_path / "r"), *BASE, check=False)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr[-2000:]
    assert f"more than the 512 the draft model:{short} ({short}) was trained for; valid: --max-prompt-tokens up " \
           "to 498" in p.stderr


@pytest.mark.parametrize("sub, args, msg", [
    ("head-sweep", ("--ks", "abc"), "--ks 'abc': each K must be an integer"),
    ("head-sweep", ("--ks", "0"), "--ks '0'"),
    ("head-sweep", ("--ks", "-5"), "--ks '-5'"),
    ("head-sweep", ("--ks", "1e9"), "--ks '1e9'"),
    ("head-sweep", ("--ks", "1000,,full"), "--ks '1000,,full': empty item"),
    ("head-sweep", ("--draft", "ngram:3"), "--draft 'ngram:3': has no lm_head to prune"),
    ("head-sweep", ("--repeats", "0"), "argument --repeats: '0' is out of range"),
    ("head-recall", ("--ks", "-1"), "--ks -1: each K must be in 1.."),
    ("head-recall", ("--ranks", "0"), "--ranks 0: each rank must be in 1..65536"),
    ("head-recall", ("--max-tokens", "0"), "argument --max-tokens: '0' is out of range"),
])
def test_subcommand_bad_input_is_one_line_before_loading(tmp_path, sub, args, msg):
    out = tmp_path / "r"
    flag = "--model" if sub == "head-recall" else "--target"
    p = _main(sub, flag, NO_MODEL, "--out", str(out), *args, check=False)
    assert p.returncode == 2, p.stderr[-2000:]
    assert len(p.stderr.strip().splitlines()) == 1 and msg in p.stderr, p.stderr[-2000:]
    assert not (out / "run.json").exists()


def test_subcommand_out_is_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    for sub, flag in (("head-sweep", "--target"), ("head-recall", "--model")):
        p = _main(sub, flag, NO_MODEL, "--out", str(f), check=False)
        assert p.returncode == 2 and "is a file, not a directory" in p.stderr, p.stderr


def test_cli_prompts_file_and_fingerprint_refusal(tiny_llama_dir, tmp_path):
    pf = tmp_path / "mine.jsonl"
    pf.write_text('{"prompt": "def add(a, b):", "domain": "mycode"}\n{"prompt": "Say hi.", "domain": "chat"}\n')
    out = tmp_path / "r"
    _main("--target", tiny_llama_dir, "--draft", "ngram:2", "--gamma", "2", "--prompts-file", str(pf), "--out",
          str(out), "--no-peer", *NO_COST)
    run = records.load_run(out)
    assert set(run.table("cells")["domain"]) == {"mycode", "chat"}
    sel = run.meta["prompt_selection"]
    assert sel["format"] == "jsonl" and len(sel["sha256"]) == 64
    p = _main("--target", tiny_llama_dir, "--draft", "ngram:2", "--gamma", "2", "--prompts-file", str(pf), "--out",
             str(out), "--no-peer", *NO_COST, "--max-new-tokens", "8", check=False)
    assert p.returncode == 2 and "refusing to resume" in p.stderr and "max_new_tokens 12 -> 8" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    # issue 32: resuming a run measured without the peer, now with it (or the reverse), was accepted
    p = _main("--target", tiny_llama_dir, "--draft", "ngram:2", "--gamma", "2", "--prompts-file", str(pf), "--out",
             str(out), *NO_COST, check=False)
    assert p.returncode == 2 and "refusing to resume" in p.stderr and "(peer false -> true)" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_ctrl_c_twice_is_one_line_and_no_traceback(tiny_llama_dir, tmp_path):
    # issue 32: a second Ctrl-C landed in Python's shutdown: "Exception ignored in atexit callback" and a
    # KeyboardInterrupt traceback from torch's library finalizers. Here Ctrl-C once while cells are measured,
    # then again every 20 ms until the process is gone, so some land in every stage of the shutdown.
    import signal
    import time

    out = tmp_path / "r"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    p = subprocess.Popen([sys.executable, "-m", "measure", "--target", tiny_llama_dir, "--draft", "ngram:2", "--gamma",
                          "2,4", "--domains", "code,docs", "--prompts", "2", "--max-new-tokens", "200", "--repeats",
                          "5", "--warmup", "0", "--no-cost", "--no-peer", "--no-system-check", "--no-progress",
                          "--quiet", "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env, cwd=ROOT)
    deadline = time.monotonic() + 120
    while not (out / "visits.partial.jsonl").exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # the first visit is staged: the sweep is measuring
    assert p.poll() is None, p.communicate()[1][-2000:]
    p.send_signal(signal.SIGINT)
    while p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
        p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=10)
    assert p.returncode == 130, (p.returncode, err[-2000:])
    assert "Traceback" not in err and "Exception ignored" not in err, err[-2000:]
    assert f"interrupted: finished cells are kept in {out}" in err.strip().splitlines()[-1]


def test_cli_unwritable_out_and_mismatched_vocab(tiny_llama_dir, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    p = _main("--target", tiny_llama_dir, "--out", str(f / "sub"), *BASE, check=False)
    assert p.returncode == 2 and "not writable" in p.stderr and "Traceback" not in p.stderr

    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    other = tmp_path / "other"
    with torch.random.fork_rng():
        AutoModelForCausalLM.from_config(LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32,
                                                     num_hidden_layers=1, num_attention_heads=2,
                                                     num_key_value_heads=1, head_dim=8)).save_pretrained(other)
    p = _main("--target", tiny_llama_dir, "--draft", f"model:{other}", "--out", str(tmp_path / "r2"), *BASE,
              check=False)
    assert p.returncode != 0 and "must share a tokenizer" in p.stderr and "Traceback" not in p.stderr


def test_the_table_says_why_a_cell_has_no_interval():
    """A cell of one (prompt, repeat) pair: its tokens/s and speedup have no interval, and the row says so."""
    import io

    from dataclasses import replace

    from measure.cli import TablePrinter
    from measure.rows import CellRow

    buf = io.StringIO()
    row = CellRow(cell_id="x", draft="ngram:3", gamma_policy="fixed:4", gamma=4, temperature=0.0, domain="code",
                  head_k=None, n_prompts=1, new_tokens=24, tokens_per_s_baseline=17.59,
                  tokens_per_s_speculative=20.1, tokens_per_s_peer=None, speedup=1.143, acceptance_rate=None,
                  mean_accepted_per_round=None, n_rounds=None, outputs_identical=True, synthetic=False, repeats=1)
    TablePrinter(buf).row(row)
    TablePrinter(buf).row(replace(row, repeats=3, speedup_lo=None))
    lines = buf.getvalue().splitlines()
    assert "17.59 (n=1, no CI)" in lines[1] and "1.143 (n=1, no CI)" in lines[1]
    assert "1.143 (noisy, no CI)" in lines[3]


def test_the_parser_loads_no_torch_nor_scipy():
    """``python -m measure --help`` and a flag's one-line error need the parser only: neither torch nor scipy is
    imported for it (they took ~2 s of every such call)."""
    code = ("import sys; from measure.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('torch', 'scipy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
