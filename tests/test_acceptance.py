"""Tests of sim.acceptance: closed forms, per-position and trace models, tau -> alpha."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.acceptance import (
    IIDAcceptance,
    PerPositionAcceptance,
    TraceAcceptance,
    acceptance_from_dict,
    expected_tokens_iid,
    implied_alpha_from_tau,
)

alphas = st.floats(0.0, 1.0, allow_nan=False)
gammas = st.integers(1, 32)


@given(alphas, gammas)
def test_expected_tokens_bounds(a, g):
    e = float(expected_tokens_iid(a, g))
    assert 1.0 - 1e-12 <= e <= g + 1 + 1e-12


def test_expected_tokens_limits_and_geometric_sum():
    assert expected_tokens_iid(1.0, 7) == 8.0
    assert expected_tokens_iid(0.0, 7) == 1.0
    for a in (0.3, 0.8, 0.999999):
        assert np.isclose(expected_tokens_iid(a, 5), sum(a**j for j in range(6)))


@given(alphas, gammas)
def test_per_position_constant_equals_iid(a, g):
    pp = PerPositionAcceptance((a,) * 3)  # extended with its last value beyond 3
    assert np.isclose(pp.expected_tokens(g), IIDAcceptance(a).expected_tokens(g))


def test_per_position_formula():
    pp = PerPositionAcceptance((0.9, 0.5, 0.2))
    assert np.isclose(pp.expected_tokens(3), 1 + 0.9 + 0.9 * 0.5 + 0.9 * 0.5 * 0.2)


def test_sampling_matches_expectation():
    rng = np.random.default_rng(0)
    for model in (IIDAcceptance(0.7), PerPositionAcceptance((0.9, 0.6, 0.4))):
        draws = [model.sample_accepted(4, rng) for _ in range(40_000)]
        assert abs(np.mean(draws) + 1 - model.expected_tokens(4)) < 0.03


def test_trace_replay_is_exact_for_flags():
    # 1 1 0 | 1 1 1 ... : at gamma=2 the rounds accept 2, then 0 (window [0,1]) ...
    flags = np.array([1, 1, 0, 1, 1, 1, 1, 0, 0, 1])
    t = TraceAcceptance((flags,))
    # gamma=2 replay: t=0 window [1,1] acc 2 -> t=3; [1,1] acc 2 -> t=6; [1,0] acc 1 -> t=8; [0,1] acc 0 -> t=9; stop
    assert np.isclose(t.expected_tokens(2), np.mean([3, 3, 2, 1]))
    assert np.isclose(t.mean_alpha(), 0.7)


def test_trace_from_accepted_lengths_roundtrip():
    t = TraceAcceptance.from_accepted_lengths(4, [4, 4, 0, 2, 1])
    assert np.isclose(t.expected_tokens(4), np.mean([5, 5, 1, 3, 2]))
    with pytest.raises(ValueError, match="gamma=4"):
        t.expected_tokens(5)


@given(st.floats(0.01, 0.99), st.integers(1, 12))
@settings(max_examples=50)
def test_implied_alpha_inverts_tau(a, g):
    tau = float(expected_tokens_iid(a, g))
    assert np.isclose(implied_alpha_from_tau(tau, g), a, atol=1e-6)


def test_accepted_over_drafted_is_not_alpha():
    tau = float(expected_tokens_iid(0.8, 4))
    assert (tau - 1) / 4 < 0.8 - 0.1


@pytest.mark.parametrize("bad", [-0.1, 1.1, float("nan")])
def test_bad_alpha(bad):
    with pytest.raises(ValueError, match="alpha"):
        IIDAcceptance(bad)


def test_bad_inputs():
    with pytest.raises(ValueError, match="gamma"):
        IIDAcceptance(0.5).expected_tokens(0)
    with pytest.raises(ValueError, match="tau"):
        implied_alpha_from_tau(9.0, 4)
    with pytest.raises(ValueError, match="unknown acceptance"):
        acceptance_from_dict({"kind": "nope"})


def test_dict_roundtrip():
    for m in (IIDAcceptance(0.4), PerPositionAcceptance((0.9, 0.8))):
        assert acceptance_from_dict(m.describe()) == m
