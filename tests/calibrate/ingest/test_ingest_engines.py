"""Every engine's real-format fixture ingests, old and new variants, with the numbers its fields imply."""

from __future__ import annotations

from pathlib import Path

import pytest

from calibrate.ingest.detect import ingest_files

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "engines"


def ingest(*names: str, engine: str = "auto", spec_tokens: int | None = None):
    return ingest_files([str(FIX / n) for n in names], engine, spec_tokens)


def test_vllm_log_current_format_sums_intervals_and_skips_a_cut_line() -> None:
    rec = ingest("vllm/specdecode-v1.log").record
    assert rec.engine == "vllm" and rec.formats == ("vllm-log-v1",)
    assert rec.observations == 3 and rec.skipped_lines == 1
    # 212 + 240 + 95 drafts; per-position counts summed over the three lines
    assert rec.drafts == 547 and rec.accepted_tokens == 444 + 483 + 189 and rec.draft_tokens == 636 + 720 + 285
    assert [p.judged for p in rec.positions] == [547, 459, 369]
    assert rec.alphas == pytest.approx([459 / 547, 369 / 459, 288 / 369])


def test_vllm_log_2025_format_five_positions() -> None:
    rec = ingest("vllm/specdecode-v1-2025.log").record
    assert rec.formats == ("vllm-log-v1-2025",) and rec.k == 5 and rec.drafts == 120 + 88


def test_vllm_log_earliest_format_needs_k() -> None:
    rec = ingest("vllm/specdecode-v1-early.log").record
    assert rec.iid_alpha is None and any("pass --spec-tokens" in n for n in rec.notes)
    assert rec.acceptance_rate == pytest.approx(2137 / 3000)
    rec = ingest("vllm/specdecode-v1-early.log", spec_tokens=4).record
    assert rec.drafts == 750 and rec.iid_alpha is not None


def test_vllm_v0_uses_emitted_tokens() -> None:
    rec = ingest("vllm/speculative-v0.log").record
    # drafts = 53716 / 4 = 13429; accepted prefix = emitted - drafts = 34244 - 13429 = 20815
    assert rec.drafts == 13429 and rec.accepted_tokens == 20815
    assert rec.mean_tokens_per_round == pytest.approx(34244 / 13429)
    assert any("after the first rejection" in n for n in rec.notes)


def test_vllm_two_scrapes_use_deltas_over_engines() -> None:
    rec = ingest("vllm/metrics-before.prom", "vllm/metrics-after.prom").record
    assert rec.drafts == 1900  # (6000 - 5000) + (5700 - 4800)
    assert [p.accepted for p in rec.positions] == [830 + 740, 660 + 590, 520 + 465]


def test_vllm_requests_detailed_and_summary() -> None:
    rec = ingest("vllm/requests.jsonl").record
    assert set(rec.formats) == {"vllm-request-detailed", "vllm-request-summary"}
    assert rec.skipped_lines == 1  # the cut last line
    assert rec.drafts == 16 and rec.draft_tokens == 29 + 18
    # the detailed request has one 2-token draft: position 3 is judged in 9 rounds, not 10
    assert rec.positions[2].judged == 9


@pytest.mark.parametrize("name", ["sglang/meta_info.jsonl", "sglang/meta_info-new.jsonl"])
def test_sglang_meta_info_old_and_new_names(name: str) -> None:
    rec = ingest(name).record
    assert rec.drafts == 100 and rec.accepted_tokens == 217 and rec.k == 3
    assert [p.accepted for p in rec.positions] == [90, 74, 53]
    assert rec.formats == (("sglang-meta-info-new",) if "new" in name else ("sglang-meta-info",))


def test_sglang_logs_and_gauges() -> None:
    rec = ingest("sglang/decode.log").record
    assert rec.observations == 3 and rec.skipped_lines == 1 and rec.k == 3
    assert rec.mean_tokens_per_round == pytest.approx((2.62 + 2.71 + 2.55) / 3)
    old = ingest("sglang/decode-old.log", spec_tokens=3).record
    assert old.formats == ("sglang-log-old",) and old.iid_alpha is not None
    gauge = ingest("sglang/metrics.prom").record
    assert gauge.mean_tokens_per_round == pytest.approx(2.71)
    assert any("last logging window" in n for n in gauge.notes)


def test_llamacpp_end_of_run() -> None:
    rec = ingest("llamacpp/speculative-simple.txt").record
    # rounds = n_predict - n_accept = 673 - 526 = 147; tau = 673 / 147
    assert rec.drafts == 147 and rec.k == 5
    assert rec.mean_tokens_per_round == pytest.approx(673 / 147)
    assert rec.acceptance_rate == pytest.approx(526 / 730)


def test_llamacpp_server_outputs() -> None:
    t = ingest("llamacpp/server-timings.json").record
    assert t.acceptance_rate == pytest.approx(515 / 604) and t.mean_tokens_per_round is None
    old = ingest("llamacpp/server.log").record
    assert old.observations == 2 and old.skipped_lines == 1 and old.accepted_tokens == 515 + 432
    new = ingest("llamacpp/server-new.log").record  # statistics lines win over the duplicate acceptance lines
    assert new.drafts == 87 + 80 and [p.accepted for p in new.positions] == [70 + 66, 55 + 52, 42 + 40]
    m = ingest("llamacpp/metrics.prom").record
    assert m.alphas == pytest.approx([521 / 640, 411 / 521, 316 / 411])


def test_llamacpp_statistics_line_without_a_draft_count_is_skipped(tmp_path: Path) -> None:
    """A ``statistics`` line whose ``#gen drafts`` is not a number is a cut line, skipped and counted (it crashed)."""
    good = (FIX / "llamacpp" / "server-new.log").read_text().splitlines()[5]
    cut = good.replace("#gen drafts =     87", "#gen drafts = n/a")
    assert cut != good
    log = tmp_path / "server.log"
    log.write_text(good + "\n" + cut + "\n")
    rec = ingest_files([str(log)], "auto", None).record
    assert rec.observations == 1 and rec.skipped_lines == 1 and rec.drafts == 87


def test_tgi_histogram_and_summary() -> None:
    rec = ingest("tgi/metrics.prom").record
    # buckets 0..3 -> steps 1240-40 (prefill), 612, 459, 729
    assert rec.k == 3 and rec.drafts == 3000
    assert [p.accepted for p in rec.positions] == [612 + 459 + 729, 459 + 729, 729]
    s = ingest("tgi/metrics-summary.prom", spec_tokens=2).record
    assert s.mean_tokens_per_round == pytest.approx(1 + 1386 / 1200)


def test_engine_flag_restricts_formats() -> None:
    with pytest.raises(ValueError, match="not in any known format"):
        ingest("vllm/specdecode-v1.log", engine="sglang")


def test_tgi_two_scrapes_delta(tmp_path: Path) -> None:
    from tests.support.engine_writers import tgi_scrape

    before, after = tmp_path / "b.prom", tmp_path / "a.prom"
    before.write_text(tgi_scrape([50, 30], 100, requests=5))
    after.write_text(tgi_scrape([50 + 400, 30 + 300], 100 + 500, requests=5 + 20))
    rec = ingest_files([str(before), str(after)]).record
    assert rec.formats == ("tgi-prometheus-histogram-delta",)
    assert rec.drafts == 500 and [p.accepted for p in rec.positions] == [400, 300]


def test_scrapes_that_did_not_move(tmp_path: Path) -> None:
    same = FIX / "vllm" / "metrics-after.prom"
    with pytest.raises(ValueError, match="counters did not move"):
        ingest_files([str(same), str(same)])


def test_vllm_adaptive_depth_line() -> None:
    rec = ingest("vllm/specdecode-adaptive.log").record
    # no per-position rates: drafts = accepted / (mean length - 1) = 310 / 1.87 = 165.8 -> 166; k = the depth
    assert rec.formats == ("vllm-log-adaptive",) and rec.k == 3 and rec.drafts == 166
    assert rec.iid_alpha is not None and not rec.positions
    assert any("adaptive depth" in n for n in rec.notes)
