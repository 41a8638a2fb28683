"""Tests of reports: chart builders (encoded fields and data), frames, published table, CLI, screenshot."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibrate.calibration import calibrate
from calibrate.outputs import write_outputs
from reports import charts
from reports.page import acceptance_frame, breakdown_frame, claims_html, pred_vs_meas_frame, speedup_gamma_frame
from reports.published import published_table
from sim.analytic import speedup_leviathan
from sim.claims import CLAIMS, check_claims
from tests.fixtures_runs import make_run

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cal_dir(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("rep")
    make_run(base / "run", seed=21, gammas=(1, 3, 5), prompts_per_domain=2, max_new_tokens=64)
    write_outputs(calibrate([base / "run"], holdout="gamma"), base / "cal")
    return base / "cal"


def _data(chart, i: int) -> pd.DataFrame:
    """Data of layer ``i`` (Altair hoists data shared by layers to the top level)."""
    d = chart.layer[i].data
    return d if isinstance(d, pd.DataFrame) else chart.data


def _layers(chart) -> list[dict]:
    d = chart.to_dict()
    return d["layer"] if "layer" in d else [d]


# -- builders ---------------------------------------------------------------------------
def test_speedup_vs_alpha_one_line_per_gamma():
    alphas = np.linspace(0, 1, 11)
    df = pd.DataFrame([{"alpha": a, "gamma": g, "speedup": float(speedup_leviathan(a, 0.1, g))}
                       for g in range(1, 9) for a in alphas])
    ch = charts.speedup_vs_alpha_chart(df)
    line = _layers(ch)[0]
    assert line["mark"]["type"] == "line"
    assert line["encoding"]["x"]["field"] == "alpha"
    assert line["encoding"]["y"]["field"] == "speedup"
    assert line["encoding"]["color"]["field"] == "gamma"
    assert sorted(_data(ch, 0)["gamma"].unique()) == list(range(1, 9))
    with pytest.raises(ValueError, match=r"missing columns \['gamma'\]"):
        charts.speedup_vs_alpha_chart(df.drop(columns="gamma"))


def test_speedup_vs_gamma_predicted_line_measured_points_optimal_ring():
    df = pd.DataFrame({"gamma": [1, 2, 3, 1, 3], "speedup": [1.2, 1.5, 1.4, 1.1, 1.3],
                       "source": ["predicted"] * 3 + ["measured"] * 2,
                       "optimal": [False, True, False, False, False]})
    layers = _layers(charts.speedup_vs_gamma_chart(df))
    marks = [l["mark"]["type"] for l in layers]
    assert marks[:3] == ["line", "point", "point"] and marks[-1] == "rule"
    ch = charts.speedup_vs_gamma_chart(df)
    assert list(_data(ch, 2)["gamma"]) == [2]  # the ring sits on the optimal γ only
    assert list(_data(ch, 1)["source"].unique()) == ["measured"]
    with pytest.raises(ValueError, match="unknown source values \\['guessed'\\]"):
        charts.speedup_vs_gamma_chart(df.assign(source="guessed"))
    only_pred = charts.speedup_vs_gamma_chart(df[["gamma", "speedup"]])
    assert [l["mark"]["type"] for l in _layers(only_pred)] == ["line", "rule"]


def test_predicted_vs_measured_has_identity_line_and_band():
    df = pd.DataFrame({"measured": [1.0, 1.5, 2.0], "predicted": [1.05, 1.4, 2.1], "method": "closed_form",
                       "held_out": [True, True, False]})
    ch = charts.predicted_vs_measured_chart(df, band=0.1)
    b = _data(ch, 0)
    assert np.allclose(b["lo"], b["measured"] * 0.9) and np.allclose(b["hi"], b["measured"] * 1.1)
    line = _data(ch, 1)
    assert np.allclose(line["predicted"], line["measured"])
    assert ch.layer[1].to_dict()["mark"]["type"] == "line"
    enc = ch.layer[2].to_dict()["encoding"]
    assert enc["shape"]["field"] == "held_out" and enc["color"]["field"] == "method"
    assert set(_data(ch, 2)["held_out"]) == {"held out", "fitted"}
    with pytest.raises(ValueError, match="band must be in"):
        charts.predicted_vs_measured_chart(df, band=1.5)


def test_round_breakdown_stacks_known_components():
    df = pd.DataFrame({"config": ["a"] * 3, "component": ["draft", "verify", "overhead"], "ms": [1, 2, 0.5]})
    d = charts.round_breakdown_chart(df).to_dict()
    assert d["mark"]["type"] == "bar"
    assert d["encoding"]["y"]["stack"] == "zero"
    assert d["encoding"]["color"]["scale"]["domain"] == ["draft", "verify", "overhead"]
    with pytest.raises(ValueError, match="unknown components \\['sampling'\\]"):
        charts.round_breakdown_chart(df.assign(component="sampling"))


def test_latency_cdf_monotone_and_reduced():
    rng = np.random.default_rng(0)
    lat = pd.DataFrame({"latency_ms": rng.exponential(10, 3000), "mode": ["baseline", "speculative"] * 1500})
    cdf = charts.latency_cdf(lat, max_points=100)
    for _, sub in cdf.groupby("mode"):
        assert len(sub) <= 100
        assert np.all(np.diff(sub["latency_ms"]) >= 0) and np.all(np.diff(sub["cdf"]) > 0)
        assert sub["cdf"].iloc[-1] == pytest.approx(1.0)
    assert charts.latency_cdf_chart(cdf).to_dict()["mark"]["interpolate"] == "step-after"


def test_pareto_frontier_and_chart():
    df = pd.DataFrame({"variant": ["dense"] * 4, "head_k": [1, 2, 3, 4],
                       "tokens_per_s": [9.0, 8.0, 7.5, 7.0], "acceptance_rate": [0.5, 0.7, 0.6, 0.8]})
    # K=3 is beaten by K=2 on both axes; the others each win on one
    assert list(charts.pareto_frontier(df)) == [True, True, False, True]
    ch = charts.pareto_chart(df)
    assert list(_data(ch, 0)["head_k"]) == [1, 2, 4]
    enc = ch.to_dict()["layer"][1]["encoding"]
    assert enc["x"]["field"] == "acceptance_rate" and enc["y"]["field"] == "tokens_per_s"


def test_save_chart_suffixes(tmp_path):
    ch = charts.speedup_vs_gamma_chart(pd.DataFrame({"gamma": [1, 2], "speedup": [1.1, 1.3]}))
    with pytest.raises(ValueError, match=r"'\.pdf'.*valid suffixes: \.html, \.png, \.svg, \.json"):
        charts.save_chart(ch, tmp_path / "x.pdf")
    assert "vega" in charts.save_chart(ch, tmp_path / "x.html").read_text().lower()
    png = charts.save_chart(ch, tmp_path / "sub" / "x.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- frames from a calibration ------------------------------------------------------
def test_frames_from_calibration(cal_dir):
    pred = pd.read_csv(cal_dir / "predictions.csv")
    pvm = pred_vs_meas_frame(pred)
    assert pvm["held_out"].all() and len(pvm) == 3 * 12  # 12 cells × 3 methods, all held out
    cells = pd.read_csv(cal_dir.parent / "run" / "cells.csv")
    sg = speedup_gamma_frame(pd.read_csv(cal_dir / "speedup_curves.csv"), cells)
    assert sg[sg["source"] == "predicted"].groupby("series")["optimal"].sum().eq(1).all()
    assert len(sg[sg["source"] == "measured"]) == len(cells)
    acc = acceptance_frame(pd.read_csv(cal_dir / "acceptance_per_position.csv"),
                           pd.read_csv(cal_dir / "acceptance_families.csv"))
    assert ((acc["ci_low"] <= acc["alpha"]) & (acc["alpha"] <= acc["ci_high"])).all()
    assert acc["fit"].between(0, 1).all() and acc["series"].str.contains("domain=").all()
    bd = breakdown_frame(pred)
    assert set(bd["component"]) == {"draft", "verify", "overhead"}
    assert set(bd["source"]) == {"measured", "predicted"}


def test_published_table_is_the_check_command_table():
    t = published_table()
    assert len(t) == len(CLAIMS) and t["source"].str.len().gt(0).all()
    for (_, row), check in zip(t.iterrows(), check_claims()):
        assert row["claim"] == check.claim.claim_id and row["verdict"] == check.verdict.verdict
    lev = t[t["claim"] == "leviathan-ende-t5-small-t0"].iloc[0]
    assert lev["status"] == "verified" and lev["claimed_speedup"] == 3.4 and lev["cost_ratio"] == 0.02
    html_table = claims_html(t)
    assert html_table.count("<tr id=\"claim-") == len(t) and "not verified here" in html_table


# -- CLI + page ---------------------------------------------------------------------
def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "reports", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_cli_report_from_calibration_dir(cal_dir, tmp_path):
    r = _cli(str(cal_dir), "--out", str(tmp_path / "rep"), "--no-png")
    assert r.returncode == 0, r.stderr
    last = json.loads(r.stdout.strip().splitlines()[-1])
    page = Path(last["report"]).read_text()
    assert set(last["charts"]) == {"predicted_vs_measured", "speedup_vs_gamma", "acceptance_per_position",
                                   "round_breakdown", "latency_cdf"}
    assert page.count("<svg") == 5 and "Published results" in page and "MAPE" in page


def test_cli_report_from_run_dir_needs_its_calibration(tmp_path):
    # reports reads files only: an uncalibrated run is refused in one line that names the command to run
    make_run(tmp_path / "run", seed=5, gammas=(2,), drafts=("tiny",), domains=("code",), prompts_per_domain=2,
             max_new_tokens=48, head_ks=(), with_head_sweep=True)
    r = _cli(str(tmp_path / "run"), "--out", str(tmp_path / "rep"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "python -m calibrate" in r.stderr and "Traceback" not in r.stderr
    c = subprocess.run([sys.executable, "-m", "calibrate", str(tmp_path / "run"), "--holdout", "none"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert c.returncode == 0, c.stderr
    r = _cli(str(tmp_path / "run"), "--out", str(tmp_path / "rep"))  # finds RUN_DIR/calibration
    assert r.returncode == 0, r.stderr
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert "pareto" in last["charts"]
    assert Path(last["calibration"]) == (tmp_path / "run" / "calibration").resolve()
    assert all(Path(p).read_bytes()[:4] == b"\x89PNG" for p in last["pngs"])


def test_cli_bad_dir_is_one_line_error(tmp_path):
    for target, needle in ((tmp_path / "nope", "directory not found"),
                           (tmp_path, "neither a calibration directory")):
        r = _cli(str(target), "--out", str(tmp_path / "o"))
        assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (apt-get install -y chromium)")
def test_report_renders_in_headless_chromium(cal_dir, tmp_path):
    r = _cli(str(cal_dir), "--out", str(tmp_path / "rep"), "--no-png")
    assert r.returncode == 0, r.stderr
    import re

    report = tmp_path / "rep" / "report.html"
    # the same page with every chart replaced by an empty box of its size: same layout, no chart pixels
    def blank_box(m: re.Match) -> str:
        w = re.search(r'width="([0-9.]+)"', m.group(0)).group(1)
        h = re.search(r'height="([0-9.]+)"', m.group(0)).group(1)
        return f'<div style="width:{w}px;height:{h}px"></div>'

    no_charts = tmp_path / "rep" / "no_charts.html"
    no_charts.write_text(re.sub(r"<svg.*?</svg>", blank_box, report.read_text(), flags=re.S))
    sizes = {}
    for name, page in (("report", report), ("no_charts", no_charts)):
        shot = tmp_path / f"{name}.png"
        subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--window-size=1400,2400", f"--screenshot={shot}", page.resolve().as_uri()],
                       capture_output=True, timeout=60, check=False)
        assert shot.exists(), f"no screenshot of {name}"
        sizes[name] = shot.stat().st_size
    # the rendered charts add far more pixels than the text and tables around them
    assert sizes["report"] > 1.5 * sizes["no_charts"], sizes


def test_calibration_tables_with_nothing_fitted_read_as_empty(tmp_path):
    # a head-sweep run (one γ, one draft per cell) calibrates to an empty cost_params.csv: the page must still build
    from reports.page import _read_csv_or_empty

    (tmp_path / "empty.csv").write_text("\n")
    (tmp_path / "one.csv").write_text("a,b\n1,2\n")
    assert _read_csv_or_empty(tmp_path / "empty.csv").empty
    assert _read_csv_or_empty(tmp_path / "missing.csv").empty
    assert _read_csv_or_empty(tmp_path / "one.csv").to_dict("records") == [{"a": 1, "b": 2}]
