"""calibrate ingest --mode serve states its limits: the crossover in one line, k = 0 as off, memory, one number."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[3]
GOOD = ("SpecDecoding metrics: Mean acceptance length: 3.03, Accepted throughput: 3.87 tokens/s, Drafted throughput: "
        "5.72 tokens/s, Accepted: 337 tokens, Drafted: 498 tokens, Per-position acceptance rate: 0.837, 0.669, "
        "0.524, Avg Draft acceptance rate: 67.7%")
POOR = ("SpecDecoding metrics: Mean acceptance length: 1.73, Accepted throughput: 0.3 tokens/s, Drafted throughput: "
        "3.0 tokens/s, Accepted: 219 tokens, Drafted: 900 tokens, Per-position acceptance rate: 0.450, 0.200, 0.080, "
        "Avg Draft acceptance rate: 24.3%")


def _ingest(tmp_path: Path, line: str, *args: str) -> tuple[str, dict]:
    log = tmp_path / "vllm.log"
    log.write_text(line + "\n")
    p = subprocess.run([sys.executable, "-m", "calibrate", "ingest", str(log), "--preset", "llama3-1b-8b",
                        "--hardware", "h100-sxm", "--mode", "serve", *args, "--out", str(tmp_path / "out")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return p.stdout, json.loads((tmp_path / "out" / "ingest.json").read_text())


def test_off_rows_say_off_and_the_crossover_is_one_line(tmp_path):
    out, doc = _ingest(tmp_path, POOR, "--max-batch", "512", "--arrival-rates", "1", "--requests", "20",
                       "--new-tokens", "64", "--gamma-max", "3")
    rows = doc["by_batch"]
    assert rows[0]["best_k"] > 0 and rows[-1]["best_k"] == 0
    off = next(r for r in rows if r["best_k"] == 0)
    assert off["speedup"] == 1.0 and off["best_speedup_if_on"] < 1.0  # never "k = 0 ... 0.890x"
    assert re.search(rf"\n\s+{off['batch']}\s+off\s+1\.000x\s+\(off: best k = \d would be 0\.\d+x\)", out)
    cb = doc["batch_crossover"]["batch"]
    assert 1 < cb <= off["batch"] and f"speculation stops paying at batch {cb} (closed form)" in out
    assert len([ln for ln in out.splitlines() if ln.startswith("speculation stops paying at batch")]) == 1


def test_batches_are_limited_by_the_gpu_memory(tmp_path):
    out, doc = _ingest(tmp_path, GOOD, "--max-batch", "1024", "--arrival-rates", "1", "--requests", "30",
                       "--context-tokens", "4096")
    mem = doc["memory"]
    assert mem["hardware"] == "h100-sxm" and 64 < mem["max_batch"] < 128
    assert max(r["batch"] for r in doc["by_batch"]) <= mem["max_batch"]
    assert f"batch {mem['max_batch'] + 1} and above do not fit" in out
    assert doc["batch_crossover"] == {"batch": None, "limit": mem["max_batch"]}
    assert "memory binds before speculation stops paying" in out


def test_one_number_per_arrival_rate(tmp_path):
    out, doc = _ingest(tmp_path, GOOD, "--max-batch", "32", "--arrival-rates", "2,400", "--requests", "80",
                       "--new-tokens", "64")
    light, heavy = doc["serving"]
    assert light["speedup_basis"] == "p50 latency" and heavy["speedup_basis"] == "capacity"
    table = out[out.index("by arrival rate"):]
    head = table.splitlines()[1].split()
    assert head == ["req/s", "mean", "batch", "best", "k", "speedup"]  # one speedup column, labelled rows
    assert "(capacity: overloaded)" in table.splitlines()[3]


def _guide_example() -> tuple[list[str], str]:
    text = (ROOT / "docs" / "guides" / "serving.md").read_text()
    m = re.search(r"<!-- ingest-serve-example -->\n```console\n\$ (?P<cmd>[^\n]+)\n(?P<out>.*?)```", text, re.S)
    assert m, "docs/guides/serving.md holds the ingest serve example"
    return m.group("cmd").split(), m.group("out")


@pytest.mark.slow
def test_the_guide_shows_what_the_command_prints(tmp_path):
    cmd, shown = _guide_example()
    assert cmd[:4] == ["python", "-m", "calibrate", "ingest"]
    log = tmp_path / "vllm.log"
    log.write_text(GOOD + "\n")
    args = [str(log) if a == "vllm.log" else a for a in cmd[4:]]
    p = subprocess.run([sys.executable, "-m", "calibrate", "ingest", *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    printed = p.stdout[p.stdout.index("by batch size"):]
    printed = "\n".join(ln for ln in printed.splitlines() if not ln.startswith("{")) + "\n"
    assert printed == shown
