"""llama-bench output in all four formats gives the same cost model; what it needs is said in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from calibrate.ingest.llamabench import cost_from_rows, parse_rows

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "engines" / "llamabench"


@pytest.mark.parametrize("name", ["bench.md", "bench.csv", "bench.json", "bench.jsonl"])
def test_formats_agree(name: str) -> None:
    fmt, rows, skipped = parse_rows((FIX / name).read_text())
    assert fmt == "llama-bench-" + name.split(".")[1] and skipped == 0
    b = cost_from_rows(name, fmt, rows, 512)
    c = b.cost
    assert b.reference_depth_tokens == 512
    # md has t/s to two decimals, the others avg_ns: agree to 0.1%
    assert c.verify_ms_by_tokens[1] == pytest.approx(6.42, rel=1e-3)  # tg at depth 512
    assert c.verify_ms_by_tokens[4] == pytest.approx(7.09, rel=1e-3)  # pp4 at depth 512
    assert c.draft_step_ms_ref == pytest.approx(1.52, rel=1e-3)
    assert c.target_context_ms_per_token == pytest.approx((6.42 - 6.10) / 512, rel=1e-2)
    assert "maintainers' approximation" in c.metadata["approximation"]


def test_depth_nearest_context() -> None:
    fmt, rows, _ = parse_rows((FIX / "bench.json").read_text())
    assert cost_from_rows("b", fmt, rows, 0).reference_depth_tokens == 0


def test_one_model_is_refused() -> None:
    fmt, rows, _ = parse_rows((FIX / "bench-one-model.md").read_text())
    with pytest.raises(ValueError, match="needs the target and the draft"):
        cost_from_rows("one.md", fmt, rows, 512)


def test_not_llama_bench() -> None:
    assert parse_rows("hello\nworld\n") is None
