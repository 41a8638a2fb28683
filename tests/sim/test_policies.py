"""Tests of the gamma policies."""

import pytest

from sim.policies import FixedGamma, HeuristicGamma, ThresholdGamma, make_policy


def test_fixed():
    p = make_policy("fixed:3")
    assert p.gamma == 3 and p.update(3, 0) == 3 and p.update(3, 3) == 3


def test_heuristic_matches_transformers_schedule():
    p = make_policy("heuristic:4")
    assert p.update(4, 4) == 6  # all accepted: +2
    assert p.update(6, 2) == 5  # otherwise: -1
    for _ in range(10):
        p.update(p.gamma, 0)
    assert p.gamma == 1
    p.reset()
    assert p.gamma == 4


def test_threshold():
    p = ThresholdGamma(4, low=0.3, high=0.7, window=2, gamma_max=5)
    assert p.update(4, 4) == 5
    assert p.update(5, 5) == 5  # capped
    assert p.update(5, 0) == 5  # rolling rate 0.5: between low and high, unchanged
    assert p.update(5, 0) == 4  # rolling rate 0.0: below low


def test_make_policy_forms_and_errors():
    assert isinstance(make_policy(2), FixedGamma)
    assert isinstance(make_policy("5"), FixedGamma)
    assert isinstance(make_policy("heuristic"), HeuristicGamma)
    with pytest.raises(ValueError, match="valid: fixed, heuristic, threshold"):
        make_policy("adaptive:3")
    with pytest.raises(ValueError, match="gamma"):
        make_policy("fixed:0")
    with pytest.raises(ValueError, match="not an integer"):
        make_policy("fixed:x")


def test_gamma_spec_round_trips_and_builds_fresh_policies():
    from sim.policies import GammaSpec

    for text in ("fixed:4", "heuristic:2", "threshold:7"):
        spec = GammaSpec.parse(text)
        assert spec.to_str() == text and GammaSpec.parse(spec.to_str()) == spec
        assert make_policy(spec).spec() == text
    assert GammaSpec.parse("4") == GammaSpec.parse(4) == GammaSpec("fixed", 4)
    assert GammaSpec.parse("fixed:3").is_fixed and not GammaSpec.parse("heuristic:3").is_fixed
    a, b = GammaSpec("heuristic", 2).policy(), GammaSpec("heuristic", 2).policy()
    a.update(2, 2)
    assert a is not b and b.gamma == 2
    with pytest.raises(ValueError, match="unknown gamma policy"):
        GammaSpec("adaptive", 3)
