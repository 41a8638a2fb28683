"""GuideLLM 0.8.1 reports, as GuideLLM itself wrote them against llama-server (``tests/fixtures/benchfiles``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibrate.benchfiles import guidellm
from calibrate.benchfiles.detect import read_path
from calibrate.benchfiles.rows import BenchFileError


def test_every_fixture_report_is_one_concurrent_load_with_its_scrapes(fixtures: Path) -> None:
    files = read_path(fixtures / "guidellm" / "k4")
    assert {f.tool for f in files} == {"guidellm"} and {f.tool_version for f in files} == {"0.8.1"}
    loads = sorted(ld.load.concurrency for f in files for ld in f.loads)
    assert loads == [1, 1, 1, 2, 2, 2, 4, 4, 4, 8, 8, 8]
    for f in files:
        (ld,) = f.loads
        assert f.command and f.command.startswith("guidellm run --backend") and "max_requests" in f.command
        assert len(ld.ok_requests) == 8 and all(r.completion_tokens == 64 for r in ld.ok_requests)
        assert all(0 < (r.ttft_ms or 0) < (r.e2e_ms or 0) for r in ld.ok_requests)
        assert ld.counts is not None and ld.counts.source == "scrape" and ld.counts.drafts > 0


def test_speculation_off_scrapes_count_no_drafts(fixtures: Path) -> None:
    for f in read_path(fixtures / "guidellm" / "off"):
        c = f.loads[0].counts
        assert c is None or c.draft_tokens == 0


def test_a_sampled_report_is_refused(fixtures: Path, tmp_path: Path) -> None:
    src = sorted((fixtures / "guidellm" / "off").glob("*.json"))[0]
    doc = json.loads(src.read_text())
    doc["benchmarks"][0]["config"]["sample_size"] = 4
    p = tmp_path / "sampled.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(BenchFileError, match="sampled.json: benchmark 0 kept a sample of 4 requests"):
        guidellm.read(p, doc)
