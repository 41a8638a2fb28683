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


@pytest.mark.slow
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


# every bad input (one line, exit status 2) is in tests/sim/test_sim_bad_input.py


def test_chart_html(tmp_path):
    out = tmp_path / "c.html"
    r = run("--preset", "llama3-1b-3b", "--chart", str(out))
    assert r.returncode == 0, r.stderr
    html = out.read_text()
    assert "vega" in html and "speedup" in html


@pytest.mark.slow
def test_chart_keeps_sim_free_of_plotting(tmp_path):
    # --chart works, but the sim process itself never imports reports or a plotting/dataframe library
    out = tmp_path / "c.svg"
    code = ("import sys; from sim.cli import main; rc = main(['--preset', 'llama3-1b-3b', '--chart', %r, "
            "'--format', 'json']); bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('reports', 'altair', 'pandas', 'vl_convert', 'calibrate', 'measure', 'torch')); "
            "print('BAD', bad, file=sys.stderr); sys.exit(rc)" % str(out))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "BAD []" in r.stderr
    assert out.read_text().startswith("<svg") and json.loads(r.stdout)["chart"] == str(out)


def test_serve_overload_is_said_in_words_with_capacities():
    # the example: the baseline saturates below 20 requests/s, so no latency ratio is reported
    r = run("--preset", "llama3-1b-8b", "--mode", "serve", "--arrival-rate", "20", "--gamma", "4")
    assert r.returncode == 0, r.stderr
    assert "OVERLOADED: 20 requests/s arrive, more than the autoregressive side" in r.stdout
    assert "capacity (highest sustainable arrival rate" in r.stdout and "x lower" not in r.stdout
    doc = json.loads(run("--preset", "llama3-1b-8b", "--mode", "serve", "--arrival-rate", "20", "--gamma", "4",
                         "--format", "json").stdout)
    row = doc["rows"][0]
    assert row["speedup"] is None and row["overloaded"] and doc["optimal_by"] == "capacity"
    assert row["baseline_capacity_requests_per_s"] < 20 < row["capacity_requests_per_s"]
    assert row["baseline_capacity_tokens_per_s"] == pytest.approx(row["baseline_capacity_requests_per_s"] * 256)
    assert row["capacity_speedup"] == pytest.approx(row["capacity_requests_per_s"]
                                                    / row["baseline_capacity_requests_per_s"])


def test_serve_below_capacity_reports_the_latency_ratio():
    doc = json.loads(run("--preset", "llama3-1b-8b", "--mode", "serve", "--arrival-rate", "5", "--gamma", "4",
                         "--format", "json").stdout)
    row = doc["rows"][0]
    assert not row["overloaded"] and row["speedup"] > 1.0 and doc["optimal_by"] == "speedup"
    assert row["utilization"] < 1.0 and row["baseline_utilization"] < 1.0
    table = run("--preset", "llama3-1b-8b", "--mode", "serve", "--arrival-rate", "5", "--gamma", "4").stdout
    assert "OVERLOADED" not in table and "p50 request latency" in table and "cap req/s" in table


def test_fitted_files_load_with_and_without_schema_version(tmp_path):
    from sim.cost import TabulatedCost

    cost = tmp_path / "cost.json"
    TabulatedCost({1: 20.0, 5: 24.0}, 2.0).save(cost)
    acc = tmp_path / "acc.json"
    acc.write_text(json.dumps({"kind": "per_position", "alphas": [0.8, 0.6]}))  # no schema_version: version 1
    doc = json.loads(run("--cost-model", str(cost), "--acceptance", str(acc), "--gamma", "4",
                         "--format", "json").stdout)
    assert doc["cost_model"]["schema_version"] == 1 and doc["alpha_per_position"] == [0.8, 0.6]
    assert doc["rows"][0]["speedup"] > 0
