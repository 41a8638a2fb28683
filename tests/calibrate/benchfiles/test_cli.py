"""The committed benchmark files through ``python -m calibrate serve`` to a calibration, advice and a report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibrate.serve_cli import main

CONFIGS = {"guidellm": ("guidellm/off", "guidellm/k2", "guidellm/k4"),
           "vllm_bench": ("vllm_bench/off.json", "vllm_bench/k2.json", "vllm_bench/k4.json"),
           "inference_perf": ("inference_perf/off", "inference_perf/k2", "inference_perf/k4")}


@pytest.mark.slow
@pytest.mark.parametrize("tool", sorted(CONFIGS))
def test_fixture_files_reach_a_calibration_and_advice(tool: str, fixtures: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    off, k2, k4 = (str(fixtures / p) for p in CONFIGS[tool])
    out = tmp_path / "cal"
    rc = main(["--off", off, "--spec", f"k=2:{k2}", "--spec", f"k=4:{k4}", "--slots", "8", "--lookup-n", "2",
               "--seeds", "2", "--advice-draws", "2", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "held-out MAPE throughput_tokens_per_s" in text and "best k per concurrency" in text
    doc = json.loads((out / "serve_calibration.json").read_text())
    assert set(doc["acceptance"]) == {"2", "4"} and doc["summary"]["throughput_tokens_per_s"]["n"] > 0
    # no deployment named: the free linear step cost, as before --hardware existed
    assert doc["step_cost"]["kind"] == "linear_step" and "cost source:" not in text and "deployment:" not in text
    run = json.loads((out / "run" / "run.json").read_text())
    assert {f["tool"] for fs in run["sources"].values() for f in fs} == {tool.replace("_", "-").replace(
        "vllm-bench", "vllm-bench-serve")}
    assert (out / "advice.json").is_file() and (out / "run" / "serve_units.csv").is_file()


@pytest.mark.slow
def test_the_guidellm_calibration_makes_a_report_page(fixtures: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from reports.serving import build_serving_report

    out = tmp_path / "cal"
    off, k2, k4 = (str(fixtures / p) for p in CONFIGS["guidellm"])
    assert main(["--off", off, "--spec", f"k=2:{k2}", "--spec", f"k=4:{k4}", "--slots", "8", "--seeds", "1",
                 "--advice-draws", "2", "--out", str(out)]) == 0
    res = build_serving_report(out, png=False)
    html = res.html_path.read_text()
    assert "guidellm" in html and "held-out" in html


def test_a_manifest_names_the_configurations_relative_to_itself(fixtures: Path, tmp_path: Path) -> None:
    import argparse

    from calibrate.benchfiles.cli import configs_of
    from calibrate.benchfiles.dataset import load_benchfiles

    m = tmp_path / "manifest.json"
    base = fixtures / "vllm_bench"
    m.write_text(json.dumps({"off": str(base / "off.json"), "spec": {"2": str(base / "k2.json")}, "slots": 8,
                             "lookup_n": 2}))
    args = argparse.Namespace(manifest=str(m), off=[], spec=[f"k=4:{base / 'k4.json'}"], slots=None, lookup_n=None)
    configs, slots, lookup = configs_of(args)
    assert [c.k for c in configs] == [0, 2, 4] and slots == 8 and lookup == 2
    data = load_benchfiles(configs, slots, lookup)
    assert data.slots == 8 and sorted(set(data.units["config"])) == ["ngram:2:k2", "ngram:2:k4", "off"]
    assert data.meta["sources"]["k=4"][0]["tool"] == "vllm-bench-serve"
