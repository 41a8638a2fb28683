"""The sequential race (measure/racing.py): its stated error rate holds on simulated races with known answers,
naive repeated 95% looks break it, clear losers go early, and bad rules are refused."""

from __future__ import annotations

import math

import numpy as np
import pytest

from measure.racing import RaceRule, look, simulate_race


class _NaiveRule(RaceRule):
    """Every look at an unadjusted 95% interval: what the rule's Bonferroni split exists to prevent."""

    def alpha_per_interval(self, n_candidates: int) -> float:
        return 0.05


def _wrong_decision_rate(true_speedups: tuple[float, ...], rule: RaceRule, runs: int = 300) -> tuple[float, float]:
    """Share of seeded races that stop *decided* on a candidate whose true regret exceeds the threshold, and the
    share that decide at all."""
    means = [math.log(s) for s in true_speedups]
    best = max(means)
    wrong = decided = 0
    for seed in range(runs):
        state, _ = simulate_race(means, 0.08, rule, 3, np.random.default_rng(seed))
        if state.decided:
            decided += 1
            wrong += means[int(state.leader[1:])] < best - rule.log_regret
    return wrong / runs, decided / runs


@pytest.mark.slow
@pytest.mark.parametrize("speedups", [(1.0, 1.05, 1.10, 1.13), (1.0, 1.0, 1.03, 1.035, 1.06)])
def test_the_stated_error_rate_holds_and_naive_looks_break_it(speedups: tuple[float, ...]) -> None:
    rule = RaceRule(confidence=0.95, regret=0.02, max_looks=20)
    wrong, _ = _wrong_decision_rate(speedups, rule)
    assert wrong <= 1 - rule.confidence
    naive_wrong, naive_decided = _wrong_decision_rate(speedups, _NaiveRule(confidence=0.95, regret=0.02, max_looks=20))
    assert naive_wrong > 1 - rule.confidence, "the problem must be hard enough to show what the correction buys"
    assert naive_decided > 0.5


def test_a_clear_loser_is_eliminated_early_and_a_clear_winner_decided() -> None:
    rule = RaceRule(confidence=0.95, regret=0.05, max_looks=10)
    state, measured = simulate_race([math.log(0.7), math.log(1.0), math.log(1.3)], 0.05, rule, 3,
                                    np.random.default_rng(0))
    assert state.stop_reason() == "decided"
    assert state.leader == "c2"
    assert {e.candidate for e in state.eliminated} == {"c0", "c1"}
    assert all(e.evidence.hi is not None and e.evidence.hi < 0 for e in state.eliminated)
    assert measured < 3 * 3 * 10, "a decided race measures less than the fixed design of every look"


def test_only_the_leader_and_unresolved_challengers_are_measured_next() -> None:
    rule = RaceRule(confidence=0.9, regret=0.05, max_looks=5, min_units=3)
    lead = [0.30, 0.34, 0.28, 0.33, 0.31, 0.29]
    samples = {
        "lead": dict(enumerate(lead)),
        # the same mean as the leader, a wide spread: may beat it by more than 5%, unresolved
        "close": {u: x + d for u, (x, d) in enumerate(zip(lead, [0.08, -0.09, 0.07, -0.06, 0.05, -0.05]))},
        # 1% below the leader, a narrow spread: cannot beat it by 5%, resolved but not eliminated
        "tied": {u: x + d for u, (x, d) in enumerate(zip(lead, [-0.005, -0.015, 0.0, -0.02, -0.01, -0.01]))},
        "loser": {u: x - 0.3 for u, x in enumerate(lead)},
    }
    state = look(samples, rule, 0)
    assert state.leader == "lead"
    assert [e.candidate for e in state.eliminated] == ["loser"]
    assert "tied" in state.resolved and "close" not in state.resolved
    assert state.next_candidates() == ("lead", "close")
    assert state.stop_reason() is None


def test_an_eliminated_candidate_stays_out_at_the_next_look() -> None:
    rule = RaceRule(max_looks=3)
    samples = {"a": {u: 1.0 + 0.01 * u for u in range(5)}, "b": {u: 0.0 + 0.01 * u for u in range(5)}}
    first = look(samples, rule, 0)
    assert [e.candidate for e in first.eliminated] == ["b"]
    second = look(samples, rule, 1, first)
    assert second.alive == ("a",) and second.decided


@pytest.mark.parametrize("kwargs, words", [
    ({"confidence": 1.0}, "confidence"), ({"regret": 0.0}, "regret"), ({"max_looks": 0}, "max_looks"),
    ({"min_units": 1}, "min_units"),
])
def test_a_bad_rule_is_one_line(kwargs: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        RaceRule(**kwargs)


def test_a_look_outside_the_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="outside"):
        look({"a": {0: 1.0}}, RaceRule(max_looks=2), 2)
