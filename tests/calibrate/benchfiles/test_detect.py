"""Telling the tools' files apart, and the /metrics scrapes beside them."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from calibrate.benchfiles.detect import read_path
from calibrate.benchfiles.rows import BenchFileError

SCRAPE = """# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total {d}
llamacpp:spec_decode_num_draft_tokens_total {t}
llamacpp:spec_decode_num_accepted_tokens_total {a}
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="0"}} {p0}
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="1"}} {p1}
"""


def _scrapes(tmp: Path, stem: str, before: tuple[int, ...], after: tuple[int, ...]) -> None:
    for name, v in (("before", before), ("after", after)):
        (tmp / f"{stem}.{name}.prom").write_text(SCRAPE.format(d=v[0], t=v[1], a=v[2], p0=v[3], p1=v[4]))


def test_scrapes_beside_a_file_give_its_load_the_counter_deltas(
        tmp_path: Path, vllm_result: Callable[..., dict], write_json: Callable[[str, object], Path]) -> None:
    p = write_json("c2.json", vllm_result(c=2))
    _scrapes(tmp_path, "c2", (10, 20, 8, 6, 2), (30, 60, 28, 16, 12))
    (f,) = read_path(p)
    c = f.loads[0].counts
    assert c is not None and (c.drafts, c.draft_tokens, c.accepted_tokens, c.accepted_per_pos, c.source) == \
        (20, 40, 20, (10, 10), "scrape")


def test_counters_that_go_backwards_are_one_line_naming_the_file(
        tmp_path: Path, vllm_result: Callable[..., dict], write_json: Callable[[str, object], Path]) -> None:
    p = write_json("c2.json", vllm_result(c=2))
    _scrapes(tmp_path, "c2", (30, 60, 28, 16, 12), (10, 20, 8, 6, 2))
    with pytest.raises(BenchFileError, match=r"c2\.after\.prom: counters went down"):
        read_path(p)


def test_a_scrape_without_its_pair_is_refused(
        tmp_path: Path, vllm_result: Callable[..., dict], write_json: Callable[[str, object], Path]) -> None:
    p = write_json("c2.json", vllm_result(c=2))
    (tmp_path / "c2.before.prom").write_text(SCRAPE.format(d=1, t=1, a=1, p0=1, p1=0))
    with pytest.raises(BenchFileError, match="without its pair"):
        read_path(p)


def test_a_truncated_file_is_one_line_naming_it(tmp_path: Path, vllm_result: Callable[..., dict],
                                                write_json: Callable[[str, object], Path]) -> None:
    p = write_json("c2.json", vllm_result(c=2))
    p.write_text(p.read_text()[:200])
    with pytest.raises(BenchFileError, match=r"c2\.json: not valid JSON: .*truncated"):
        read_path(p)


def test_a_file_of_an_unknown_tool_is_refused(write_json: Callable[[str, object], Path]) -> None:
    with pytest.raises(BenchFileError, match=r"x\.json: not a file of a known benchmark tool .*GuideLLM"):
        read_path(write_json("x.json", {"results": [1, 2], "tool": "genai-perf"}))


def test_a_guidellm_report_of_another_schema_version_is_refused(write_json: Callable[[str, object], Path]) -> None:
    doc = {"metadata": {"version": 3, "guidellm_version": "0.9.0"}, "benchmarks": []}
    with pytest.raises(BenchFileError, match="GuideLLM report schema version 3 .*reads version 2"):
        read_path(write_json("g.json", doc))


def test_a_directory_without_benchmark_files_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("nothing")
    with pytest.raises(BenchFileError, match="holds no benchmark files"):
        read_path(tmp_path)
