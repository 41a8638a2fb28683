"""``python -m calibrate ingest`` in a subprocess: the issue's done-when line, the files sim reads, bad input."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
FIX = Path(__file__).resolve().parents[2] / "fixtures" / "engines"
ISSUE_LINE = ("SpecDecoding metrics: Mean acceptance length: 3.03, Accepted throughput: 3.87 tokens/s, Drafted "
              "throughput: 5.72 tokens/s, Accepted: 337 tokens, Drafted: 498 tokens, Per-position acceptance rate: "
              "0.837, 0.669, 0.524, Avg Draft acceptance rate: 67.7%\n")


def run(*args: str, module: str = "calibrate") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", module] + (["ingest"] if module == "calibrate" else []) + list(args)
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


def test_issue_line_with_preset(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(ISSUE_LINE)
    out = tmp_path / "out"
    r = run(str(log), "--hardware", "h100-sxm", "--preset", "llama3-1b-8b", "--explain", "--out", str(out))
    assert r.returncode == 0, r.stderr
    text = r.stdout
    for s in ("139/166", "111/139", "87/111", "0.837", "0.799", "0.784", "conversion table", "(unconditional)",
              "optimal k = ", "break-even alpha", "costs: assumed: roofline", "acceptance: measured by vllm"):
        assert s in text, s
    last = json.loads(text.strip().splitlines()[-1])
    assert last["alpha_per_position"] == pytest.approx([139 / 166, 111 / 139, 87 / 111])
    assert len(last["speedup_by_k"]) == 8
    assert last["optimal_k"] == 1 + max(range(8), key=lambda i: last["speedup_by_k"][i])
    # the written acceptance file is the one python -m sim reads, and gives the same speedups
    s = run("--acceptance", str(out / "acceptance.json"), "--preset", "llama3-1b-8b", "--hardware", "h100-sxm",
            "--gamma-max", "8", "--format", "json", module="sim")
    assert s.returncode == 0, s.stderr
    assert [row["speedup"] for row in json.loads(s.stdout)["rows"]] == pytest.approx(last["speedup_by_k"])
    assert json.loads((out / "ingest.json").read_text())["optimal_k"] == last["optimal_k"]


def test_llama_bench_cost_file_read_by_sim(tmp_path: Path) -> None:
    out = tmp_path / "o"
    r = run(str(FIX / "llamacpp" / "server-new.log"), str(FIX / "llamabench" / "bench.json"), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "maintainers' approximation" in r.stdout and "costs: measured by llama-bench" in r.stdout
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert last["cost_measured"] is True
    s = run("--acceptance", str(out / "acceptance.json"), "--cost-model", str(out / "cost_model.json"),
            "--gamma-max", "8", "--context-tokens", "512", "--format", "json", module="sim")
    assert s.returncode == 0, s.stderr
    assert [row["speedup"] for row in json.loads(s.stdout)["rows"]] == pytest.approx(last["speedup_by_k"])


def test_serve_mode(tmp_path: Path) -> None:
    r = run(str(FIX / "vllm" / "metrics-before.prom"), str(FIX / "vllm" / "metrics-after.prom"),
            "--preset", "llama3-1b-8b", "--mode", "serve", "--arrival-rates", "2,200", "--requests", "20",
            "--new-tokens", "32", "--gamma-max", "3", "--max-batch", "8")
    assert r.returncode == 0, r.stderr
    assert "by batch size" in r.stdout and "by arrival rate" in r.stdout


def test_truncated_lines_are_counted() -> None:
    r = run(str(FIX / "sglang" / "decode.log"), "--preset", "llama3-1b-8b")
    assert r.returncode == 0, r.stderr
    assert "1 partial or truncated line(s) skipped" in r.stdout
    assert "SGLang accept rate includes the bonus token" in r.stdout


BAD = [
    (["pyproject.toml", "--preset", "llama3-1b-8b"], "pyproject.toml: not in any known format (tried:"),
    ([str(FIX / "vllm" / "metrics-nospec.prom")], "no spec-decode counters in"),
    ([str(FIX / "vllm" / "metrics-after.prom"), str(FIX / "vllm" / "metrics-before.prom")], "counters went down"),
    ([str(FIX / "vllm" / "metrics-before.prom"), str(FIX / "vllm" / "metrics-other-server.prom")],
     "come from different servers"),
    (["no/such/file.log"], "file not found: no/such/file.log"),
    ([str(FIX / "vllm" / "specdecode-v1.log"), "--engine", "foo"], "unknown --engine 'foo'"),
    ([str(FIX / "vllm" / "specdecode-v1.log")], "no cost model"),
    ([str(FIX / "vllm" / "specdecode-v1.log"), "--preset", "nope"], "unknown preset 'nope'"),
    ([str(FIX / "vllm" / "specdecode-v1.log"), "--gamma-max", "x"], "argument --gamma-max: 'x' is not an integer"),
    ([str(FIX / "vllm" / "specdecode-v1.log"), "--gamma-max", "0", "--preset", "llama3-1b-8b"],
     "argument --gamma-max: '0' is out of range; valid: an integer in 1..64"),
    ([str(FIX / "sglang" / "decode-old.log"), "--preset", "llama3-1b-8b"], "pass --spec-tokens K"),
    ([str(FIX / "llamabench" / "bench.md")], "no acceptance figures among the files"),
    ([str(FIX / "llamacpp" / "server-no-draft-count.log"), "--preset", "llama3-1b-8b"],
     "no complete spec-decode figures in"),
    ([str(FIX / "vllm" / "specdecode-v1.log"), str(FIX / "llamabench" / "bench-one-model.md")], "has 1 model(s)"),
]


@pytest.mark.parametrize("args,message", BAD, ids=[m for _, m in BAD])
def test_bad_input_one_line(args: list[str], message: str) -> None:
    r = run(*args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert message in lines[0]
    assert lines[0].startswith("python -m calibrate ingest: error: ")


@pytest.mark.parametrize("overhead", [[], ["--engine-overhead", "none"]], ids=["fitted", "none"])
def test_the_reproduce_line_gives_the_same_speedups_on_the_seam(tmp_path: Path, model_dir: Path,
                                                                 overhead: list[str]) -> None:
    """A model of the user's own on a GPU: ingest prices it as python -m sim does, the engine's fitted overhead
    included (or left out with ``--engine-overhead none``, passed on), so its reproduce line prints the same."""
    log = tmp_path / "vllm.log"
    log.write_text(ISSUE_LINE)
    out = tmp_path / "out"
    r = run(str(log), "--target", str(model_dir), "--draft", "eagle3", "--hardware", "h100-sxm", "--cost-source",
            "roofline", *overhead, "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert ("engine overhead: " in r.stdout) == (not overhead)
    last = json.loads(r.stdout.strip().splitlines()[-1])
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("reproduce: python -m sim "))
    s = run(*shlex.split(line)[4:], "--format", "json", module="sim")
    assert s.returncode == 0, s.stderr
    assert [row["speedup"] for row in json.loads(s.stdout)["rows"]] == pytest.approx(last["speedup_by_k"])
