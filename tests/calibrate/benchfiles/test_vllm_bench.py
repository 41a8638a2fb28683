"""``vllm bench serve`` result files: what is read, and what is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from calibrate.benchfiles import vllm_bench
from calibrate.benchfiles.rows import BenchFileError


def test_a_result_is_one_closed_loop_load_with_requests_in_ms(vllm_result: Callable[..., dict],
                                                              write_json: Callable[[str, object], Path]) -> None:
    f = vllm_bench.read(write_json("r.json", vllm_result(c=2, spec_decode_num_drafts=10,
                                                         spec_decode_draft_tokens=30,
                                                         spec_decode_accepted_tokens=12,
                                                         spec_decode_per_position_acceptance_rates=[0.6, 0.4, 0.2])))
    (ld,) = f.loads
    assert f.tool == "vllm-bench-serve" and f.model == "m" and ld.load.to_str() == "c2"
    r = ld.requests[1]
    assert r.send_s == pytest.approx(0.4) and r.ttft_ms == pytest.approx(110.0) and r.e2e_ms == pytest.approx(410.0)
    assert len(r.itl_ms) == 15 and r.completion_tokens == 16
    assert ld.counts is not None and ld.counts.accepted_per_pos == (6, 4, 2) and ld.counts.source == "file"


def test_appended_results_are_one_load_each(vllm_result: Callable[..., dict],
                                            write_json: Callable[[str, object], Path]) -> None:
    f = vllm_bench.read(write_json("r.jsonl", [vllm_result(c=1), vllm_result(c=4)]))
    assert [ld.load.to_str() for ld in f.loads] == ["c1", "c4"]


def test_a_result_without_save_detailed_is_refused(vllm_result: Callable[..., dict],
                                                   write_json: Callable[[str, object], Path]) -> None:
    res = vllm_result()
    for k in ("start_times", "ttfts", "itls", "latencies", "input_lens", "output_lens", "errors"):
        del res[k]
    with pytest.raises(BenchFileError, match="r.json: no per-request .*--save-detailed"):
        vllm_bench.read(write_json("r.json", res))


def test_a_capped_open_loop_is_refused(vllm_result: Callable[..., dict],
                                       write_json: Callable[[str, object], Path]) -> None:
    with pytest.raises(BenchFileError, match="capped open loop"):
        vllm_bench.read(write_json("r.json", vllm_result(request_rate=4.0, max_concurrency=8)))


def test_an_open_loop_rate_is_read(vllm_result: Callable[..., dict],
                                   write_json: Callable[[str, object], Path]) -> None:
    f = vllm_bench.read(write_json("r.json", vllm_result(request_rate=2.5, max_concurrency=None)))
    assert f.loads[0].load.to_str() == "r2.5"
