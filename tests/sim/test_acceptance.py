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


# -- drafts that may propose fewer than γ tokens ---------------------------------------------

def test_run_trace_replay_by_hand():
    from sim.acceptance import RunTraceAcceptance

    # position:  0  1  2  3  4  5  6  7  8  9
    proposed = [4, 0, 3, 4, 4, 2, 0, 4, 3, 1]
    run = [2, 0, 3, 1, 0, 2, 0, 2, 0, 0]
    m = RunTraceAcceptance(((np.array(proposed), np.array(run)),), gamma_max=4)
    # γ=2 from t=1: t1 d0 a0 -> t2 d2 a2 -> t5 d2 a2 -> t8 d1 (cap 10-8-1) a0 -> t9 d0 (cap) a0
    starts, d, a = m.replay(2)
    assert starts.tolist() == [1, 2, 5, 8, 9]
    assert d.tolist() == [0, 2, 2, 1, 0]
    assert a.tolist() == [0, 2, 2, 0, 0]
    assert m.expected_tokens(2) == pytest.approx((1 + 3 + 3 + 1 + 1) / 5)
    assert m.drafted_probs(2).tolist() == pytest.approx([2 / 5, 1 / 5, 2 / 5])
    assert m.prefix_accept_probs(2).tolist() == pytest.approx([2 / 5, 2 / 5])
    # γ=4 from t=1: t1 d0 -> t2 d3 a3 -> t6 d0 -> t7 d2 (cap 10-7-1) a2 -> t? 10 stop
    starts, d, a = m.replay(4)
    assert starts.tolist() == [1, 2, 6, 7] and d.tolist() == [0, 3, 0, 2] and a.tolist() == [0, 3, 0, 2]
    with pytest.raises(ValueError, match="gamma=5"):
        m.replay(5)
    back = acceptance_from_dict(m.to_dict())
    assert back.replay(4)[2].tolist() == a.tolist() and back.replay(2)[1].tolist() == [0, 2, 2, 1, 0]
    rng = np.random.default_rng(0)
    draws = [m.sample_round(4, rng) for _ in range(4000)]
    assert np.mean([x for _, x in draws]) == pytest.approx(a.mean(), abs=0.08)


@pytest.mark.parametrize("bad", [
    (([1, 2], [1]),),  # lengths differ
    (([2, 1], [3, 0]),),  # run > proposed
    (([20, 1], [0, 0]),),  # proposed > gamma_max
])
def test_run_trace_rejects_bad_input(bad):
    from sim.acceptance import RunTraceAcceptance

    with pytest.raises(ValueError):
        RunTraceAcceptance(tuple((np.array(p), np.array(r)) for p, r in bad), gamma_max=16)


@given(st.floats(0.0, 1.0), alphas, gammas)
def test_proposal_mixture_expectations(p, a, g):
    from sim.acceptance import ProposalAcceptance, drafted_distribution

    m = ProposalAcceptance(p, IIDAcceptance(a))
    assert m.expected_tokens(g) == pytest.approx(1 - p + p * float(expected_tokens_iid(a, g)))
    probs = drafted_distribution(m, g)
    assert probs.sum() == pytest.approx(1.0) and probs[0] == pytest.approx(1 - p) and probs[g] == pytest.approx(p)
    assert drafted_distribution(IIDAcceptance(a), g).tolist() == [0.0] * g + [1.0]
    assert acceptance_from_dict(m.describe()).expected_tokens(g) == pytest.approx(m.expected_tokens(g))


def test_proposal_mixture_sampling_is_seeded_and_unbiased():
    from sim.acceptance import ProposalAcceptance, sample_round

    m = ProposalAcceptance(0.6, PerPositionAcceptance((0.9, 0.7, 0.5)))
    draw = lambda seed: [sample_round(m, 4, np.random.default_rng(seed)) for _ in range(3)]  # noqa: E731
    assert draw(7) == draw(7)
    rng = np.random.default_rng(1)
    rounds = [sample_round(m, 4, rng) for _ in range(20000)]
    assert np.mean([d == 0 for d, _ in rounds]) == pytest.approx(0.4, abs=0.015)
    assert np.mean([a + 1 for _, a in rounds]) == pytest.approx(m.expected_tokens(4), abs=0.03)


def test_unknown_acceptance_kind_lists_the_valid_ones():
    with pytest.raises(ValueError, match="run_trace"):
        acceptance_from_dict({"kind": "bogus"})
    with pytest.raises(ValueError, match="lacks the field 'inner'"):
        acceptance_from_dict({"kind": "proposal", "p_propose": 0.5})


def test_every_model_has_every_capability_and_round_trips():
    from sim.acceptance import AcceptanceModel, ProposalAcceptance, RunTraceAcceptance, acceptance_from_dict

    models = [IIDAcceptance(0.6), PerPositionAcceptance((0.8, 0.5)),
              TraceAcceptance((np.array([1.0, 0.0, 1.0, 1.0, 0.0, 1.0]),)),
              TraceAcceptance.from_accepted_lengths(3, [3, 1, 0, 2]),
              ProposalAcceptance(0.7, IIDAcceptance(0.5)),
              RunTraceAcceptance(((np.array([0, 2, 2, 1, 0]), np.array([0, 1, 2, 0, 0])),), 2)]
    for m in models:
        assert isinstance(m, AcceptanceModel)
        back = acceptance_from_dict(m.to_dict())
        assert type(back) is type(m) and back.to_dict() == m.to_dict() and back.gamma_max == m.gamma_max
        g = min(2, m.gamma_max or 2)
        assert back.expected_tokens(g) == pytest.approx(m.expected_tokens(g))
        assert m.drafted_probs(g).sum() == pytest.approx(1.0)
        d, a = m.sample_round(g, np.random.default_rng(0))
        assert 0 <= a <= d <= g
    assert models[3].gamma_max == 3 and models[0].gamma_max is None and models[5].gamma_max == 2
