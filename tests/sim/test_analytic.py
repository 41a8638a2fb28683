"""Property tests of the closed-form predictor (Leviathan et al. 2023)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.acceptance import IIDAcceptance, PerPositionAcceptance
from sim.analytic import (
    break_even_alpha,
    cost_per_million_tokens,
    optimal_gamma,
    optimal_gamma_leviathan,
    predict,
    predict_row,
    speedup_leviathan,
    sweep,
)
from sim.cost import LeviathanCost, TabulatedCost

alphas = st.floats(0.0, 1.0, allow_nan=False)
costs = st.floats(0.0, 2.0, allow_nan=False)
gammas = st.integers(1, 24)


@given(alphas, costs, gammas)
def test_general_model_reduces_to_theorem_3_8(a, c, g):
    row = predict_row(IIDAcceptance(a), LeviathanCost(c, target_ms=3.0), g)
    thm = (1 - a ** (g + 1)) / (1 - a) / (g * c + 1) if a < 1 else (g + 1) / (g * c + 1)
    assert np.isclose(row.speedup, thm, rtol=1e-9)


@given(alphas, alphas, costs, gammas)
def test_speedup_monotone_in_alpha(a1, a2, c, g):
    lo, hi = sorted((a1, a2))
    assert speedup_leviathan(lo, c, g) <= speedup_leviathan(hi, c, g) + 1e-12


@given(alphas, costs, costs, gammas)
def test_speedup_non_increasing_in_cost(a, c1, c2, g):
    lo, hi = sorted((c1, c2))
    assert speedup_leviathan(a, hi, g) <= speedup_leviathan(a, lo, g) + 1e-12


@given(costs, gammas)
def test_limits(c, g):
    assert np.isclose(speedup_leviathan(1e-12, c, g), 1 / (g * c + 1))
    assert np.isclose(speedup_leviathan(1.0, c, g), (g + 1) / (g * c + 1))


@given(st.floats(0.01, 0.99), st.floats(0.0, 0.99))
def test_corollary_3_9(a, c):
    # alpha > c  =>  some gamma gives speedup >= (1 + alpha) / (1 + c)
    if a <= c:
        return
    best = max(speedup_leviathan(a, c, g) for g in range(1, 200))
    assert best >= (1 + a) / (1 + c) - 1e-9


@given(alphas, costs)
@settings(max_examples=50)
def test_optimal_gamma_is_argmax(a, c):
    g, s = optimal_gamma_leviathan(a, c, 12)
    rows = predict(IIDAcceptance(a), LeviathanCost(c), range(1, 13))
    assert np.isclose(s, optimal_gamma(rows).speedup)
    assert np.isclose(speedup_leviathan(a, c, g), s)


def test_sweep_shape_and_values():
    s = sweep(np.array([0.5, 0.9]), np.array([0.0, 0.1, 0.5]), np.arange(1, 5))
    assert s.shape == (2, 3, 4)
    assert np.isclose(s[1, 1, 2], speedup_leviathan(0.9, 0.1, 3))


@given(st.floats(0.0, 0.9), gammas)
@settings(max_examples=50)
def test_break_even_alpha(c, g):
    a = break_even_alpha(g, cost_ratio=c)
    if a is None:
        assert (g + 1) / (g * c + 1) < 1
    elif a > 0:
        assert np.isclose(speedup_leviathan(a, c, g), 1.0, atol=1e-9)


def test_break_even_none_when_draft_too_costly():
    assert break_even_alpha(4, cost_ratio=1.5) is None
    assert break_even_alpha(4, cost_ratio=0.0) == 0.0


def test_per_position_used_by_predictor():
    pp = PerPositionAcceptance((0.9, 0.5))
    r = predict_row(pp, LeviathanCost(0.1), 2)
    assert np.isclose(r.expected_tokens_per_round, 1 + 0.9 + 0.45)


def test_tabulated_cost_nonlinear_verify_can_make_spec_slower():
    # CPU-like curve: verifying 2-3 tokens costs more than 4-8 (measured shapes here).
    cost = TabulatedCost({1: 10.0, 2: 19.0, 3: 18.0, 5: 14.0, 9: 15.0}, draft_step_ms_ref=4.0)
    rows = predict(IIDAcceptance(0.5), cost, range(1, 9))
    assert all(r.speedup < 1.0 for r in rows)
    assert np.isclose(rows[3].verify_ms, 14.0)  # gamma=4 verifies 5 tokens
    assert np.isclose(cost.verify_ms(4, 0), 16.0)  # interpolated
    assert np.isclose(cost.verify_ms(11, 0), 15.5)  # extrapolated from the last two points


def test_cost_per_million_tokens():
    assert np.isclose(cost_per_million_tokens(1000.0, 3.6), 1.0)
    with pytest.raises(ValueError, match="tokens per second"):
        cost_per_million_tokens(0.0, 1.0)
