"""The conversions of :mod:`calibrate.ingest.normalise`, checked against hand-computed examples."""

from __future__ import annotations

import pytest

from calibrate.ingest.normalise import (conditional_from_unconditional, counts_from_rates, counts_from_rounds,
                                        iid_alpha_from_rate, iid_alpha_from_tau, normalise, per_pos_from_histogram)
from calibrate.ingest.records import Observation


def test_unconditional_to_conditional_issue_line() -> None:
    # vLLM: 498 drafted tokens at k = 3 -> 166 drafts; rates 0.837, 0.669, 0.524 of 166 drafts
    counts = counts_from_rates([0.837, 0.669, 0.524], 166)
    assert counts == (139, 111, 87)  # 0.837*166 = 138.9, 0.669*166 = 111.05, 0.524*166 = 86.98
    judged, accepted = conditional_from_unconditional(counts, 166)
    assert judged == (166, 139, 111)
    assert accepted == (139, 111, 87)
    # alpha_2 = p_2 / p_1 = 111/139 = 0.7986, alpha_3 = 87/111 = 0.7838 (not 0.669 and 0.524)
    assert [a / n for a, n in zip(accepted, judged)] == pytest.approx([0.8373, 0.7986, 0.7838], abs=1e-4)


def test_unconditional_counts_must_not_grow() -> None:
    with pytest.raises(ValueError, match="position 2"):
        conditional_from_unconditional([50, 60], 100)


def test_histogram_to_counts() -> None:
    # rounds accepting 0, 1, 2, 3 tokens: 6, 9, 12, 23 -> 50 rounds; >=1: 44, >=2: 35, >=3: 23
    assert per_pos_from_histogram([6, 9, 12, 23]) == (50, (44, 35, 23))


def test_rounds_with_variable_draft_lengths() -> None:
    # (drafted, accepted): position 3 is judged only in rounds that drafted 3 and accepted 2
    judged, accepted = counts_from_rounds([(3, 3), (3, 1), (2, 2), (1, 0)])
    assert judged == (4, 3, 1)
    assert accepted == (3, 2, 1)


def test_bonus_token_vllm_mean_acceptance_length() -> None:
    # vLLM: mean acceptance length 1 + 337/166 = 3.030; accepted/drafted 337/498 = 0.6767
    rec = normalise([Observation("vllm", "t", "x", k=3, drafts=166, draft_tokens=498, accepted_tokens=337,
                                 accepted_per_pos=(139, 111, 87))])
    assert rec.mean_tokens_per_round == pytest.approx(3.0301, abs=1e-4)
    assert rec.acceptance_rate == pytest.approx(0.6767, abs=1e-4)


def test_bonus_token_sglang_accept_rate() -> None:
    from calibrate.ingest.sglang import parse_log

    # accept len 2.54 (bonus included), accept rate 0.51 = 2.54 / num_draft_tokens -> 4.98 -> 5 slots, k = 4;
    # accepted per round 1.54, accepted/drafted = 1.54 / 4 = 0.385
    text = ("Decode batch, #running-req: 32, #token: 7352, token usage: 0.01, accept len: 2.54, accept rate: 0.51, "
            "cuda graph: True, gen throughput (token/s): 39.33, #queue-req: 68,\n")
    res = parse_log("x.log", text)
    assert res is not None and res.observations[0].k == 4
    rec = normalise(res.observations)
    assert rec.acceptance_rate == pytest.approx(0.385)
    assert rec.mean_tokens_per_round == pytest.approx(2.54)
    assert any("includes the bonus token" in n for n in rec.notes)


def test_iid_from_tau_and_rate() -> None:
    # alpha 0.7 at k = 4: tau = (1 - 0.7^5) / 0.3 = 2.7731; accepted/drafted = 1.7731 / 4 = 0.44328
    assert iid_alpha_from_tau(2.77310, 4) == pytest.approx(0.7, abs=1e-4)
    assert iid_alpha_from_rate(0.443275, 4) == pytest.approx(0.7, abs=1e-4)
    assert iid_alpha_from_rate(0.6, 1) == pytest.approx(0.6)  # at k = 1 the rate is alpha
    with pytest.raises(ValueError, match="impossible"):
        iid_alpha_from_tau(5.5, 3)


def test_no_draft_count_says_so() -> None:
    rec = normalise([Observation("tgi", "t", "x", drafts=100, accepted_tokens=120)], spec_tokens=2)
    assert rec.acceptance_rate is None
    assert "no draft count: acceptance rate not available" in rec.notes
    assert rec.mean_tokens_per_round == pytest.approx(2.2)
    assert rec.iid_alpha is not None


def test_mixed_engines_refused() -> None:
    with pytest.raises(ValueError, match="different engines"):
        normalise([Observation("vllm", "a", "x", tau=2.0), Observation("tgi", "b", "y", tau=2.0)])


def test_wilson_interval_brackets_alpha() -> None:
    rec = normalise([Observation("vllm", "t", "x", k=2, drafts=100, accepted_per_pos=(80, 60))])
    for p in rec.positions:
        assert p.ci_low < p.alpha < p.ci_high
    assert rec.positions[1].judged == 80 and rec.positions[1].alpha == pytest.approx(0.75)
