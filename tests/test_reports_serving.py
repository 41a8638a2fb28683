"""reports.serving: the latency-against-load chart and section from calibrate serve's files (reads, fits nothing)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from reports.serving import latency_vs_load_chart, section_html

ROOT = Path(__file__).resolve().parents[1]


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


def test_section_and_cli(tmp_path):
    d = _files(tmp_path / "cal")
    body = section_html(d)
    assert "held-out MAPE 2.00%" in body and "cliff: k = 4" in body and "<td>off</td>" in body
    out = tmp_path / "s.html"
    p = subprocess.run([sys.executable, "-m", "reports.serving", str(d), "--out", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and out.is_file(), p.stderr
    p = subprocess.run([sys.executable, "-m", "reports.serving", str(tmp_path), "--out", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "holds no serve_predictions.csv" in p.stderr


def test_missing_columns_are_named():
    with pytest.raises(ValueError, match="missing columns"):
        latency_vs_load_chart(pd.DataFrame({"config": ["off"]}), pd.DataFrame({"config": ["off"]}))
