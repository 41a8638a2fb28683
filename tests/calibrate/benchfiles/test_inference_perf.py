"""inference-perf report directories (``tests/fixtures/benchfiles/inference_perf``, laid out as its writer does)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from calibrate.benchfiles import inference_perf
from calibrate.benchfiles.detect import read_path
from calibrate.benchfiles.rows import BenchFileError


def test_stages_are_loads_cut_from_the_requests_in_start_order(fixtures: Path) -> None:
    (f,) = read_path(fixtures / "inference_perf" / "k2")
    assert f.tool == "inference-perf" and f.model == "SmolLM2-135M-Instruct"
    assert [ld.load.to_str() for ld in f.loads] == ["c1", "c2", "c4", "c8"]
    for ld in f.loads:
        assert len(ld.requests) == 8 and ld.requests[0].send_s == 0.0
        assert all(r.ok and r.itl_ms and r.completion_tokens for r in ld.requests)
        assert ld.counts is not None and ld.counts.source == "scrape"  # the scrapes beside the directory


def test_stage_counts_that_do_not_add_up_are_refused(fixtures: Path, tmp_path: Path) -> None:
    d = tmp_path / "k2"
    shutil.copytree(fixtures / "inference_perf" / "k2", d)
    s = json.loads((d / "stage_0_lifecycle_metrics.json").read_text())
    s["load_summary"]["count"] += 1
    (d / "stage_0_lifecycle_metrics.json").write_text(json.dumps(s))
    with pytest.raises(BenchFileError, match="count 33 requests, the per-request file 32"):
        inference_perf.read(d)
