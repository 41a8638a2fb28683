"""The sim CLI, tested through ``python -m sim`` in a subprocess."""

import json
import subprocess
import sys

import pytest


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sim", *args], capture_output=True, text=True, timeout=120)


def test_default_preset_table():
    r = run("--preset", "llama3-1b-3b")
    assert r.returncode == 0, r.stderr
    assert "llama3-1b-3b" in r.stdout and "<- optimal" in r.stdout and "optimal gamma =" in r.stdout


def test_json_fields():
    r = run("--preset", "llama3-1b-3b", "--format", "json", "--alpha", "0.7")
    doc = json.loads(r.stdout)
    for k in ("preset", "hardware", "mode", "alpha", "cost_ratio", "optimal_gamma", "rows"):
        assert k in doc
    assert doc["alpha"] == 0.7
    row = doc["rows"][0]
    for k in ("gamma", "expected_tokens_per_round", "round_time_ms", "speedup"):
        assert k in row
    assert doc["optimal_gamma"] == max(doc["rows"], key=lambda r: r["speedup"])["gamma"]


def test_cost_ratio_is_pure_leviathan():
    doc = json.loads(run("--cost-ratio", "0.1", "--alpha", "0.8", "--gamma", "4", "--format", "json").stdout)
    a, c, g = 0.8, 0.1, 4
    assert doc["rows"][0]["speedup"] == pytest.approx((1 - a ** (g + 1)) / ((1 - a) * (g * c + 1)))


def test_per_position_and_tau():
    doc = json.loads(run("--cost-ratio", "0.1", "--alpha-per-position", "0.9,0.5", "--format", "json").stdout)
    assert doc["alpha_per_position"] == [0.9, 0.5]
    doc = json.loads(run("--cost-ratio", "0.1", "--tau", "3.0", "--gamma", "4", "--format", "json").stdout)
    assert 0.5 < doc["alpha"] < 0.8 and "not alpha" in doc["note"]


def test_event_and_serve_modes_seeded():
    a = run("--preset", "gpt2-small-large", "--mode", "event", "--gamma-max", "3", "--seed", "5", "--format", "json")
    b = run("--preset", "gpt2-small-large", "--mode", "event", "--gamma-max", "3", "--seed", "5", "--format", "json")
    assert a.returncode == 0 and a.stdout == b.stdout
    s = json.loads(run("--preset", "llama3-1b-8b", "--mode", "serve", "--gamma", "2", "--requests", "40",
                       "--format", "json").stdout)
    assert s["rows"][0]["latency_p99_ms"] >= s["rows"][0]["latency_p50_ms"]


def test_csv_and_out_file(tmp_path):
    out = tmp_path / "x.csv"
    r = run("--preset", "llama3-1b-8b", "--format", "csv", "--usd-per-hour", "2.5", "--out", str(out))
    assert r.returncode == 0
    text = out.read_text()
    assert text.startswith("gamma,") and "usd_per_1m_tokens" in text.splitlines()[0]


def test_list_presets():
    r = run("--list-presets")
    assert r.returncode == 0 and "llama3-8b-70b" in r.stdout and "h200" in r.stdout


# every bad input (one line, exit status 2) is in tests/test_sim_bad_input.py


def test_chart_html(tmp_path):
    out = tmp_path / "c.html"
    r = run("--preset", "llama3-1b-3b", "--chart", str(out))
    assert r.returncode == 0, r.stderr
    html = out.read_text()
    assert "vega" in html and "speedup" in html
