"""reports.serving: the latency-against-load chart and section from calibrate serve's files (reads, fits nothing)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from reports.serving import build_serving_report, latency_vs_load_chart, section_html
from tests.support import damage
from tests.support.cli_inprocess import run_module

ROOT = Path(__file__).resolve().parents[2]


def _files(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    pred = []
    for cfg in ("off", "ngram:3:k4"):
        for load in ("c1", "c4", "r2"):
            for m, v in (("e2e_p50_ms", 500.0), ("e2e_p95_ms", 700.0), ("throughput_tokens_per_s", 120.0)):
                pred.append({"config": cfg, "load": load, "k": 4 if cfg != "off" else 0,
                             "split": "held-out" if load != "c1" else "train", "metric": m, "measured": v,
                             "measured_lo": v * 0.9, "measured_hi": v * 1.1, "predicted": v * 1.02,
                             "ape_pct": 2.0, "inside_ci": True, "repeats": 3})
    pd.DataFrame(pred).to_csv(d / "serve_predictions.csv", index=False)
    curves = [{"config": cfg, "load": ld, "predicted_e2e_p50_ms": 480 + 10 * i, "predicted_e2e_p95_ms": 690 + i,
               "predicted_throughput_tokens_per_s": 100 + i, "predicted_ttft_p50_ms": 20.0,
               "predicted_tpot_p50_ms": 8.0}
              for cfg in ("off", "ngram:3:k4") for i, ld in enumerate(("c1", "c2", "c3", "c4", "r1", "r2", "r3"))]
    pd.DataFrame(curves).to_csv(d / "serve_curves.csv", index=False)
    summary = {"throughput_tokens_per_s": {"n": 4, "mape_pct": 2.0, "target_pct": 5.0, "n_inside_ci": 4,
                                           "n_with_ci": 4}, "share_inside_ci": 1.0}
    (d / "serve_calibration.json").write_text(json.dumps({"split": {"test_k": [4], "test_loads": ["c4", "r2"]},
                                                          "summary": summary}))
    (d / "advice.json").write_text(json.dumps({"rows": [
        {"concurrency": 1, "best_k": 4, "speedup": 1.3, "speedup_lo": 1.2, "speedup_hi": 1.4,
         "speedup_by_k": {"0": 1.0, "4": 1.3}, "cliff": None},
        {"concurrency": 2, "best_k": 0, "speedup": 1.0, "speedup_lo": 1.0, "speedup_hi": 1.0,
         "speedup_by_k": {"0": 1.0, "4": 0.9}, "cliff": "k = 4 (the row above) would lose 10% of throughput here"}],
        "vllm": {"method": "ngram"}, "trtllm": {"max_concurrency": 1}, "llama_server": "-np 2", "sglang": "x"}))
    return d


def test_chart_has_measured_points_with_cis_and_predicted_lines(tmp_path):
    d = _files(tmp_path / "cal")
    spec = latency_vs_load_chart(pd.read_csv(d / "serve_predictions.csv"), pd.read_csv(d / "serve_curves.csv")).to_dict()
    text = json.dumps(spec)
    assert text.count('"mark": {"type": "line"') + text.count('"mark": "line"') >= 6  # 3 metrics x 2 load kinds
    assert "measured_lo" in text and "predicted" in text and "split" in text


def test_a_group_without_an_interval_still_draws(tmp_path):
    # a benchmark file run once per load has no p95 interval: inside_ci is empty there (an object column with
    # NaN), which reached the chart's JSON as a bare NaN and Vega-Lite refused the page
    d = _files(tmp_path / "cal")
    pred = pd.read_csv(d / "serve_predictions.csv")
    p95 = pred["metric"] == "e2e_p95_ms"
    pred.loc[p95, ["measured_lo", "measured_hi"]] = float("nan")
    pred["inside_ci"] = pred["inside_ci"].astype(object)
    pred.loc[p95, "inside_ci"] = float("nan")
    spec = latency_vs_load_chart(pred, pd.read_csv(d / "serve_curves.csv")).to_json()
    json.loads(spec, parse_constant=lambda c: pytest.fail(f"{c} in the chart's JSON"))


def test_section_is_self_contained(tmp_path):
    d = _files(tmp_path / "cal")
    body = section_html(d)
    assert "held-out MAPE 2.00%" in body and "cliff: k = 4" in body and "<td>off</td>" in body
    assert "<svg" in body and "<script" not in body  # no network needed to read it


def _serving_run(tmp_path: Path, cal: Path) -> Path:
    from measure.serve.units import LoadSpec
    from sim.acceptance import PerPositionAcceptance, ProposalAcceptance
    from tests.support.serve_runs import make_serve_run

    run = make_serve_run(tmp_path / "run", {4: ProposalAcceptance(0.5, PerPositionAcceptance((0.8, 0.7)))},
                         [LoadSpec(concurrency=1)], repeats=2, n_requests=3, new_tokens=8)
    meta = json.loads((run / "run.json").read_text())
    meta["summary"] = {"groups": [
        {"config": "ngram:3:k4", "load": "c1", "throughput_speedup": {"value": 1.21, "lo": 1.1, "hi": 1.3}},
        {"config": "ngram:3:k4", "load": "c4", "throughput_speedup": {"value": 0.92, "lo": 0.85, "hi": 1.01}}]}
    meta["models"] = {"target": {"name": "smollm2-135m", "source": "gguf:/m.gguf"}}
    (run / "run.json").write_text(json.dumps(meta))
    units = pd.read_csv(run / "serve_units.csv")
    units.loc[units.index[:2], "other_cpu_share"] = 0.4  # two units shared the CPU
    units.to_csv(run / "serve_units.csv", index=False)
    doc = json.loads((cal / "serve_calibration.json").read_text())
    doc["run"] = str(run)
    doc["regret"] = [{"concurrency": 1, "advised_k": 4, "measured_best_k": 4, "regret": 0.0},
                     {"concurrency": 2, "advised_k": 0, "measured_best_k": 4, "regret": 0.04, "regret_lo": -0.02,
                      "regret_hi": 0.1, "within_noise": True}]
    (cal / "serve_calibration.json").write_text(json.dumps(doc))
    return run


def test_the_page_opens_with_the_answer(tmp_path):
    d = _files(tmp_path / "cal")
    _serving_run(tmp_path, d)
    res = build_serving_report(d, tmp_path / "rep", png=False)
    page = res.html_path.read_text()
    answer = page[page.index('class="answer"'):page.index("What was measured")]
    assert "Speculation pays up to concurrency 1 and costs throughput from 2 on." in answer
    assert "k = 4, 1.300x [1.200, 1.400]" in answer  # the advised row, with its interval
    assert "c1: ngram:3:k4 1.210x [1.100, 1.300]; c4: ngram:3:k4 0.920x [0.850, 1.010]" in answer  # measured
    assert "throughput <span class='ok'>2.0%</span> (target 5%)" in answer
    assert "largest regret 4.0% [95% CI -2.0, 10.0] at concurrency 2" in answer and "within the noise" in answer
    assert "2 of " in answer and "shared the CPU with other processes" in answer
    assert "<code>-np 2</code>" in answer
    assert "smollm2-135m" in page and "<svg" in page and "<script" not in page
    assert (tmp_path / "rep" / "serving.html").is_file()


@pytest.mark.slow
def test_a_raced_serving_run_keeps_its_title_and_shows_its_race(tmp_path, race_record):
    """The race's chart title once replaced the page's own title and heading (a loop variable shadowed it)."""
    d = _files(tmp_path / "cal")
    run = _serving_run(tmp_path, d)
    meta = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**meta, "race": race_record}))
    res = build_serving_report(d, tmp_path / "rep", png=False)
    page = res.html_path.read_text()
    assert "<title>specscope serving report: smollm2-135m" in page and "<h1>specscope serving report: " in page
    assert res.charts == ("serving", "race") and (tmp_path / "rep" / "race.html").is_file()
    groups, card, text = (page.index("id='groups'"), page.index('<section class="chart" id="race">'),
                          page.index('id="race-text"'))
    assert groups < card < text


@pytest.mark.slow
def test_a_serving_run_moved_with_its_calibration_still_reports(tmp_path):
    """serve_calibration.json names its run relative to itself: moved together, the page still reads the run."""
    d = _files(tmp_path / "a" / "cal")
    _serving_run(tmp_path / "a", d)
    doc = json.loads((d / "serve_calibration.json").read_text())
    (d / "serve_calibration.json").write_text(json.dumps({**doc, "run": "../run"}))  # as calibrate serve writes it
    (tmp_path / "a").rename(tmp_path / "b")
    page = build_serving_report(tmp_path / "b" / "cal", tmp_path / "rep", png=False).html_path.read_text()
    assert "smollm2-135m" in page and "is not readable here" not in page
    assert f"{tmp_path / 'b' / 'run'} (" in page  # the run row names where the run is now


@pytest.mark.slow
def test_reports_cli_takes_a_serving_calibration_or_its_run(tmp_path):
    d = _files(tmp_path / "cal")
    run = _serving_run(tmp_path, d)
    # reports' main in this process (its ``python -m reports`` process: tests/reports/test_reports.py); the
    # ``python -m reports.serving`` entry point below in a process of its own
    p = run_module("reports", [d, "--no-png"])
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1])["charts"] == ["serving"]
    assert (d / "report" / "report.html").is_file()
    p = run_module("reports", [run, "--no-png"])
    assert p.returncode == 2 and "serving run without a calibration" in p.stderr
    assert "python -m calibrate serve" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    p = subprocess.run([sys.executable, "-m", "reports.serving", str(tmp_path), "--no-png"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "is not a serving calibration" in p.stderr


def test_missing_columns_are_named():
    with pytest.raises(ValueError, match="missing columns"):
        latency_vs_load_chart(pd.DataFrame({"config": ["off"]}), pd.DataFrame({"config": ["off"]}))


@pytest.mark.parametrize("hurt,needle", [
    (lambda d: damage.tear_row(d / "serve_predictions.csv"), "serve_predictions.csv': line 3 has 3 fields"),
    (lambda d: damage.set_value(d / "serve_predictions.csv", "predicted", "inf"),
     "serve_predictions.csv': line 2, column predicted: inf is not finite"),
    (lambda d: damage.drop_column(d / "serve_predictions.csv", "ape_pct"), "has no column ape_pct"),
    (lambda d: damage.write(d / "serve_curves.csv", damage.rows(d / "serve_curves.csv")[:8]),
     "serve_curves.csv' has no predicted curve for 3 measured group(s)"),
    (lambda d: damage.cut_in_half(d / "serve_curves.csv"), "serve_curves.csv'"),
    (lambda d: (d / "advice.json").unlink(), "has no advice.json; re-run python -m calibrate serve"),
    (lambda d: (d / "advice.json").write_text("{}"), "advice.json' has no 'rows'"),
    (lambda d: (d / "serve_calibration.json").write_text("{}"), "serve_calibration.json' has no 'split'"),
])
def test_a_damaged_serving_calibration_is_one_line_and_draws_nothing(tmp_path, hurt, needle):
    """Issue 43: each drew a page (half the curves, no answer) or ended in a KeyError part-way through it."""
    d = _files(tmp_path / "cal")
    hurt(d)
    r = run_module("reports", [str(d), "--out", str(tmp_path / "rep"), "--no-png"])
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1 and err[0].startswith("python -m reports: error: "), r.stderr
    assert needle in err[0] and "calibrate serve to write it again" in err[0]
    assert not (tmp_path / "rep").exists()
