"""Tests of reports: chart builders (encoded fields and data), frames, published table, CLI (the page in a
browser: ``tests/reports/test_report_screenshot.py``)."""

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
from reports.page import acceptance_frame, breakdown_frame, pred_vs_meas_frame, speedup_gamma_frame
from reports.published import claims_html, published_table
from sim.analytic import speedup_leviathan
from sim.claims import CLAIMS, check_claims
from tests.support import damage
from tests.support.cli_inprocess import run_module
from tests.support.fixtures_runs import make_run

ROOT = Path(__file__).resolve().parents[2]


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


def _layer_of(chart, mark: str, marker: str | None = None) -> pd.DataFrame:
    """Data of the first layer with ``mark`` (and, for points, the legend ``marker`` its rows carry)."""
    for i, layer in enumerate(chart.layer):
        d = layer.to_dict()
        if d["mark"]["type"] != mark:
            continue
        data = _data(chart, i)
        if marker is None or ("marker" in data and marker in set(data["marker"])):
            return data
    raise AssertionError(f"no {mark} layer with {marker!r}")


def test_speedup_vs_gamma_keeps_predictions_beyond_the_measured_gamma_apart():
    pred = pd.DataFrame({"series": "a", "gamma": range(1, 11), "source": "predicted",
                         "speedup": [1.0, 1.2, 1.3, 1.35, 1.4, 1.42, 1.45, 1.5, 1.48, 1.46],
                         "optimal": [g == 8 for g in range(1, 11)]})
    meas = pd.DataFrame({"series": "a", "gamma": [2, 3, 4], "source": "measured", "speedup": [1.25, 1.28, 1.3],
                         "speedup_lo": [1.1, 1.2, 1.2], "speedup_hi": [1.4, 1.4, 1.4], "optimal": [False, False, True],
                         "unstable": [False, True, False]})
    ch = charts.speedup_vs_gamma_chart(pd.concat([pred, meas], ignore_index=True))
    lines = _layer_of(ch, "line")
    within = lines[lines["prediction"] == charts.PREDICTION_LINES[0]]
    beyond = lines[lines["prediction"] == charts.PREDICTION_LINES[1]]
    assert sorted(within["gamma"]) == [2, 3, 4]  # solid over the measured γ only
    assert sorted(beyond["gamma"]) == [1, 2, 4, 5, 6, 7, 8, 9, 10]  # dashed beyond, joined at the edges
    dash = ch.layer[0].to_dict()["encoding"]["strokeDash"]
    assert dash["field"] == "prediction" and dash["scale"]["range"][0] != dash["scale"]["range"][1]
    points = _layer_of(ch, "point", charts.MARKERS[0])
    assert dict(zip(points["gamma"], points["marker"])) == {2: charts.MARKERS[0], 3: charts.MARKERS[1],
                                                            4: charts.MARKERS[0]}  # unstable: a cross
    ring = _layer_of(ch, "point", charts.MARKERS[2])
    assert list(ring["gamma"]) == [4] and set(ring["source"]) == {"measured"}  # the ring sits on a measurement
    tri = _layer_of(ch, "point", charts.MARKERS[3])
    assert list(tri["gamma"]) == [8] and set(tri["source"]) == {"predicted"}  # the predicted best: its own mark
    legend = ch.layer[3].to_dict()["encoding"]["shape"]["scale"]
    assert legend["domain"] == list(charts.MARKERS) and len(set(legend["range"])) == len(charts.MARKERS)
    with pytest.raises(ValueError, match="unknown source values \\['guessed'\\]"):
        charts.speedup_vs_gamma_chart(pred.assign(source="guessed"))
    only_pred = charts.speedup_vs_gamma_chart(pred[["gamma", "speedup"]])  # sim's charts: nothing measured
    assert [layer["mark"]["type"] for layer in _layers(only_pred)] == ["line", "rule"]
    assert set(_data(only_pred, 0)["prediction"]) == {charts.PREDICTION_LINES[0]}


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


def test_round_breakdown_names_measured_and_predicted_bars_and_has_one_colour_legend():
    df = pd.DataFrame([{"config": f"d · code · γ {g}", "component": c, "source": s, "ms": 1.0}
                       for g in range(1, 13) for c in ("draft", "verify", "overhead") for s in ("measured", "predicted")])
    d = charts.round_breakdown_chart(df).to_dict()
    enc = d["spec"]["encoding"]
    # the colour legend is the only legend: no opacity (or other) channel whose legend has no colours of its bars
    assert set(enc) - {"x", "y", "color", "order", "tooltip"} == set()
    assert enc["x"]["field"] == "source" and enc["color"]["field"] == "component"
    assert d["facet"]["field"] == "config" and d["columns"] == 8  # wrapped: 12 configurations, two rows


def test_latency_axis_ticks_are_a_sparse_ladder():
    df = charts.latency_cdf(pd.DataFrame({"latency_ms": [0.0, 40, 45, 50, 60, 120, 350], "mode": "speculative"}))
    axis = charts.latency_cdf_chart(df).to_dict()["encoding"]["x"]["axis"]
    assert axis["values"] == [0, 1, 3, 10, 30, 100, 300] and axis["labelOverlap"] == "greedy"


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


def test_chart_svg_inline_or_a_note_without_vl_convert(monkeypatch):
    ch = charts.speedup_vs_gamma_chart(pd.DataFrame({"gamma": [1, 2], "speedup": [1.1, 1.3]}))
    assert "<svg" in charts.chart_svg(ch)
    monkeypatch.setitem(sys.modules, "vl_convert", None)  # as on the GPU check's device image
    note = charts.chart_svg(ch, "speedup.html")
    assert "vl-convert-python is not installed" in note and 'href="speedup.html"' in note


# -- frames from a calibration ------------------------------------------------------
@pytest.mark.slow
def test_frames_from_calibration(cal_dir):
    pred = pd.read_csv(cal_dir / "predictions.csv")
    pvm = pred_vs_meas_frame(pred)
    assert pvm["held_out"].all() and len(pvm) == 3 * 12  # 12 cells × 3 methods, all held out
    cells = pd.read_csv(cal_dir.parent / "run" / "cells.csv")
    sg = speedup_gamma_frame(pd.read_csv(cal_dir / "speedup_curves.csv"), cells)
    assert sg[sg["source"] == "predicted"].groupby("series")["optimal"].sum().eq(1).all()
    assert len(sg[sg["source"] == "measured"]) == len(cells)
    # per series one best measured γ, on a measured row (the ring never sits on a prediction)
    assert sg[sg["source"] == "measured"].groupby("series")["optimal"].sum().eq(1).all()
    acc = acceptance_frame(pd.read_csv(cal_dir / "acceptance_per_position.csv"),
                           pd.read_csv(cal_dir / "acceptance_families.csv"))
    assert ((acc["ci_low"] <= acc["alpha"]) & (acc["alpha"] <= acc["ci_high"])).all()
    assert acc["fit"].between(0, 1).all() and set(acc["series"]) == {"small · code", "small · chat", "tiny · code",
                                                                     "tiny · chat"}
    bd = breakdown_frame(pred)
    assert set(bd["component"]) == {"draft", "verify", "overhead"}
    assert set(bd["source"]) == {"measured", "predicted"}


@pytest.mark.slow
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


@pytest.mark.slow
def test_cli_report_from_calibration_dir(cal_dir, tmp_path):
    r = run_module("reports", [cal_dir, "--out", tmp_path / "rep", "--no-png"])  # its process: the test below
    assert r.returncode == 0, r.stderr
    last = json.loads(r.stdout.strip().splitlines()[-1])
    page = Path(last["report"]).read_text()
    assert set(last["charts"]) == {"predicted_vs_measured", "speedup_vs_gamma", "acceptance_per_position",
                                   "round_breakdown", "latency_cdf"}
    assert page.count("<svg") == 5 and "MAPE" in page
    # the answer first, the published claims on their own page
    assert page.index('id="answer"') < page.index('id="measured"') < page.index("<svg")
    assert "Published results" not in page and '<a href="claims.html">' in page
    claims = (tmp_path / "rep" / "claims.html").read_text()
    assert claims.count('<tr id="claim-') == len(CLAIMS) and "issue #" not in claims


@pytest.mark.slow
def test_cli_report_from_run_dir_needs_its_calibration(tmp_path):
    # reports reads files only: an uncalibrated run is refused in one line that names the command to run
    make_run(tmp_path / "run", seed=5, gammas=(2,), drafts=("tiny",), domains=("code",), prompts_per_domain=2,
             max_new_tokens=48, head_ks=(), with_head_sweep=True)
    r = _cli(str(tmp_path / "run"), "--out", str(tmp_path / "rep"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "python -m calibrate" in r.stderr and "Traceback" not in r.stderr
    c = run_module("calibrate", [tmp_path / "run", "--holdout", "none"])  # its process: tests/calibrate
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


def _damage_json(d: Path) -> None:
    (d / "calibration.json").write_text((d / "calibration.json").read_text()[:200])


def _set_runs(d: Path, runs: object) -> None:
    doc = json.loads((d / "calibration.json").read_text())
    doc["runs"] = runs
    (d / "calibration.json").write_text(json.dumps(doc))


def _drop_column(d: Path) -> None:
    pred = pd.read_csv(d / "predictions.csv")
    pred.drop(columns=["predicted_speedup"]).to_csv(d / "predictions.csv", index=False)


@pytest.mark.parametrize("damage, needle", [
    (_damage_json, "calibration.json' is not valid JSON: "),
    (lambda d: (d / "calibration.json").write_text("[" * 5000), "nests deeper than 100 levels"),
    (lambda d: (d / "calibration.json").write_text("[1, 2]"), "holds a JSON list, not an object"),
    (lambda d: (d / "calibration.json").write_bytes(b"\x00" * 64), "not a text file"),
    (lambda d: _set_runs(d, {}), "names no runs"),
    (lambda d: _set_runs(d, {"a": {"path": "/nonexistent/run"}}), "names run 'a' at '/nonexistent/run', which "
                                                                   "holds no run.json (moved or deleted?)"),
    (lambda d: (d / "predictions.csv").unlink(), "has no predictions.csv; re-run python -m calibrate"),
    (lambda d: (d / "predictions.csv").write_bytes(b'a,"b\n' + bytes(range(128, 256))), "predictions.csv' is not "
                                                                                       "a table this reads"),
    (_drop_column, "predictions.csv' has no column predicted_speedup"),
    # issue 43: drawn from before (a torn row read as NaN, inf plotted), or a KeyError part-way through the page
    (lambda d: damage.tear_row(d / "predictions.csv"), "predictions.csv': line 3 has 3 fields"),
    (lambda d: damage.set_value(d / "predictions.csv", "predicted_speedup", "inf"),
     "predictions.csv': line 2, column predicted_speedup: inf is not finite"),
    (lambda d: damage.set_value(d / "predictions.csv", "measured_speedup", "-inf"), "column measured_speedup"),
    (lambda d: damage.drop_column(d / "predictions.csv", "measured_speedup"), "has no column measured_speedup"),
    (lambda d: damage.tear_row(d / "speedup_curves.csv", 5), "speedup_curves.csv': line 6 has 3 fields"),
    (lambda d: damage.set_value(d / "speedup_curves.csv", "predicted_speedup", "inf"), "speedup_curves.csv': line 2"),
    # the page's next step named a cost model that was gone
    (lambda d: next(d.glob("cost_model-*.json")).unlink(), "names cost model file 'cost_model-"),
])
def test_a_damaged_calibration_is_one_line(cal_dir, tmp_path, capsys, damage, needle):
    # issue 32, bad inputs to reports: a calibration cut short, edited, or whose run moved was a traceback
    # (RecursionError, KeyError, FileNotFoundError from pandas) part-way through the page
    from reports.__main__ import main

    shutil.copytree(cal_dir.parent, tmp_path / "base")  # the run with its calibration (named from there: ../run)
    d = tmp_path / "base" / "cal"
    damage(d)
    assert main([str(d), "--out", str(tmp_path / "rep"), "--no-png"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m reports: error: ") and needle in err[0], err
    assert not (tmp_path / "rep").exists()  # nothing drawn


def test_calibration_tables_with_nothing_fitted_read_as_empty(tmp_path):
    # a head-sweep run (one γ, one draft per cell) calibrates to an empty cost_params.csv: the page must still build
    from reports.page import read_table

    (tmp_path / "empty.csv").write_text("\n")
    (tmp_path / "one.csv").write_text("a,b\n1,2\n")
    assert read_table(tmp_path / "empty.csv").empty
    assert read_table(tmp_path / "missing.csv").empty
    assert read_table(tmp_path / "one.csv").to_dict("records") == [{"a": 1, "b": 2}]


@pytest.mark.slow
def test_a_run_moved_with_its_calibration_still_reports(cal_dir, tmp_path):
    """calibration.json names its run relative to itself: the two moved together still make the page."""
    from reports.page import build_report

    doc = json.loads((cal_dir / "calibration.json").read_text())
    assert [info["path"] for info in doc["runs"].values()] == ["../run"]
    shutil.copytree(cal_dir.parent, tmp_path / "a", ignore=shutil.ignore_patterns("report"))
    (tmp_path / "a").rename(tmp_path / "b")  # the copy moved: nothing at the old place any more
    res = build_report(tmp_path / "b" / "cal", tmp_path / "rep", png=False)
    assert res.html_path.is_file() and "MAPE" in res.html_path.read_text()


def test_an_older_calibration_naming_its_run_absolutely_still_reads(cal_dir, tmp_path):
    from reports.page import read_calibration

    shutil.copytree(cal_dir, tmp_path / "cal")
    doc = json.loads((cal_dir / "calibration.json").read_text())
    for info in doc["runs"].values():
        info["path"] = str((cal_dir / info["path"]).resolve())
    (tmp_path / "cal" / "calibration.json").write_text(json.dumps(doc))
    read, _, _ = read_calibration(tmp_path / "cal")
    assert [Path(i["path"]) for i in read["runs"].values()] == [(cal_dir.parent / "run").resolve()]
