"""Tests of the SimPy event simulator: determinism, convergence to the closed form, serving."""

import math

import numpy as np
import pytest

from presets import RooflineForward, get_hardware, get_pair
from sim.acceptance import IIDAcceptance, PerPositionAcceptance, ProposalAcceptance
from sim.analytic import predict_row
from sim.cost import LeviathanCost, RooflineCost, TabulatedCost
from sim.events import simulate_request, simulate_serving
from sim.policies import TreePolicy
from sim.trees import PositionalAcceptance, TokenTree, predict_tree


def test_deterministic_for_seed():
    a, c = IIDAcceptance(0.7), LeviathanCost(0.2)
    r1 = simulate_request(a, c, "fixed:4", 2000, seed=3)
    r2 = simulate_request(a, c, "fixed:4", 2000, seed=3)
    r3 = simulate_request(a, c, "fixed:4", 2000, seed=4)
    assert r1 == r2
    assert r1 != r3


@pytest.mark.parametrize("alpha,c,gamma", [(0.8, 0.1, 4), (0.5, 0.3, 2), (0.95, 0.05, 8)])
def test_converges_to_closed_form(alpha, c, gamma):
    # 200k tokens -> tens of thousands of rounds; the mean speedup is within 1%.
    acc, cost = IIDAcceptance(alpha), LeviathanCost(c)
    sim = simulate_request(acc, cost, f"fixed:{gamma}", 200_000, seed=0)
    closed = predict_row(acc, cost, gamma).speedup
    assert sim.rounds > 20_000
    assert abs(sim.speedup / closed - 1) < 0.01


def test_per_position_converges():
    acc, cost = PerPositionAcceptance((0.9, 0.7, 0.5, 0.3)), LeviathanCost(0.1)
    sim = simulate_request(acc, cost, "fixed:4", 100_000, seed=1)
    assert abs(sim.speedup / predict_row(acc, cost, 4).speedup - 1) < 0.01


def test_adaptive_policies_run_and_differ():
    acc, cost = IIDAcceptance(0.9), LeviathanCost(0.05)
    fixed = simulate_request(acc, cost, "fixed:2", 20_000, seed=0)
    heur = simulate_request(acc, cost, "heuristic:2", 20_000, seed=0)
    thr = simulate_request(acc, cost, "threshold:2", 20_000, seed=0)
    # with high acceptance and a cheap draft, growing gamma pays
    assert heur.speedup > fixed.speedup
    assert thr.speedup > fixed.speedup


def test_context_grows_cost():
    hw = get_hardware("a100-80gb")
    p = get_pair("llama3-1b-8b")
    cost = RooflineCost(RooflineForward(p.draft, hw), RooflineForward(p.target, hw))
    short = simulate_request(IIDAcceptance(0.7), cost, "fixed:3", 500, context_tokens=0, seed=0)
    long = simulate_request(IIDAcceptance(0.7), cost, "fixed:3", 500, context_tokens=100_000, seed=0)
    assert long.time_ms > short.time_ms


def test_serving_same_arrivals_and_seeded():
    hw = get_hardware("h100-sxm")
    p = get_pair("llama3-1b-8b")
    cost = RooflineCost(RooflineForward(p.draft, hw), RooflineForward(p.target, hw))
    r1 = simulate_serving(IIDAcceptance(0.75), cost, "fixed:3", n_requests=60, arrival_rate_per_s=10, n_tokens=64)
    r2 = simulate_serving(IIDAcceptance(0.75), cost, "fixed:3", n_requests=60, arrival_rate_per_s=10, n_tokens=64)
    assert r1 == r2
    assert r1.speculative.requests == r1.baseline.requests == 60
    assert r1.baseline.tokens == 60 * 64
    assert r1.speculative.latency_p50_ms <= r1.speculative.latency_p95_ms <= r1.speculative.latency_p99_ms
    assert r1.latency_speedup_p50 > 1.0


def test_bad_inputs():
    with pytest.raises(ValueError, match="n_tokens"):
        simulate_request(IIDAcceptance(0.5), LeviathanCost(0.1), "fixed:2", 0)
    with pytest.raises(ValueError, match="unknown gamma policy"):
        simulate_request(IIDAcceptance(0.5), LeviathanCost(0.1), "greedy:2", 10)
    with pytest.raises(ValueError, match="arrival rate"):
        simulate_serving(IIDAcceptance(0.5), LeviathanCost(0.1), "fixed:2", arrival_rate_per_s=0)


def test_lookup_draft_that_proposes_nothing_converges_and_is_charged_a_one_token_verify():
    """A round that drafts nothing costs verify(1) only; closed form and event sim agree on the mixture."""
    from sim.acceptance import ProposalAcceptance
    from sim.cost import TabulatedCost

    cost = TabulatedCost(verify_ms_by_tokens={1: 50.0, 2: 90.0, 3: 100.0, 4: 70.0, 5: 65.0}, draft_step_ms_ref=0.05,
                         round_overhead_ms_base=0.4)
    acc = ProposalAcceptance(0.45, IIDAcceptance(0.8))
    row = predict_row(acc, cost, 4)
    expected_rt = 0.55 * (50.0 + 0.4) + 0.45 * (4 * 0.05 + 65.0 + 0.4)
    assert row.round_time_ms == pytest.approx(expected_rt)
    sim = simulate_request(acc, cost, "fixed:4", 100_000, seed=2)
    assert abs(sim.speedup / row.speedup - 1) < 0.01
    assert sim.drafted < 4 * sim.rounds  # rounds without a proposal drafted nothing


# -- serving capacity and overload -------------------------------------------------------------
def _llama_1b_8b_cost() -> RooflineCost:
    hw, p = get_hardware("h100-sxm"), get_pair("llama3-1b-8b")
    return RooflineCost(RooflineForward(p.draft, hw), RooflineForward(p.target, hw))


@pytest.mark.parametrize("acceptance,policy", [
    (IIDAcceptance(0.75), "fixed:4"),                             # closed form
    (ProposalAcceptance(0.5, IIDAcceptance(0.8)), "fixed:3"),     # closed form, longest proposal of the batch
    (IIDAcceptance(0.75), "heuristic:2"),                         # saturated simulation
])
def test_capacity_is_what_an_overloaded_queue_delivers(acceptance, policy):
    # far above both capacities, each side's batch is always full: its simulated throughput is its capacity
    cost = _llama_1b_8b_cost()
    r = simulate_serving(acceptance, cost, policy, n_requests=1500, arrival_rate_per_s=500, n_tokens=128,
                         max_batch=16, seed=1)
    assert r.overloaded and r.latency_speedup_p50 is None
    for stats, cap in ((r.speculative, r.speculative_capacity), (r.baseline, r.baseline_capacity)):
        assert stats.mean_batch > 15.5
        assert stats.throughput_tokens_per_s == pytest.approx(cap.tokens_per_s, rel=0.03)
        assert cap.requests_per_s == pytest.approx(cap.tokens_per_s / cap.tokens_per_request)
    assert r.speculative_capacity.method == ("closed form" if policy.startswith("fixed") else "saturated simulation")
    assert r.baseline_capacity.tokens_per_request == 128


def test_capacity_is_the_rate_where_latency_stops_being_bounded():
    # below the baseline's capacity its latency settles; above it, it grows with the number of requests
    cost, acc = _llama_1b_8b_cost(), IIDAcceptance(0.75)
    cap = simulate_serving(acc, cost, "fixed:4", n_requests=10, n_tokens=256).baseline_capacity.requests_per_s

    def base_p50(rate: float, n: int) -> float:
        return simulate_serving(acc, cost, "fixed:4", n_requests=n, arrival_rate_per_s=rate, n_tokens=256,
                                seed=2).baseline.latency_p50_ms

    below, above = 0.8 * cap, 1.2 * cap
    assert base_p50(below, 2000) < 1.3 * base_p50(below, 500)
    assert base_p50(above, 2000) > 2.0 * base_p50(above, 500)
    stable = simulate_serving(acc, cost, "fixed:4", n_requests=300, arrival_rate_per_s=below, n_tokens=256)
    assert not stable.overloaded and stable.latency_speedup_p50 > 1.0
    assert stable.as_dict()["baseline_capacity"]["requests_per_s"] == pytest.approx(cap)


def test_issue_example_reports_capacities_not_an_unbounded_ratio():
    # python -m sim --preset llama3-1b-8b --mode serve --arrival-rate 20 --gamma 4: once "10.7x" (2,000 requests)
    # and "88x" (20,000); the baseline saturates below 20 requests/s, so no latency ratio is a speedup
    cost, acc = _llama_1b_8b_cost(), IIDAcceptance(0.75)
    runs = [simulate_serving(acc, cost, "fixed:4", n_requests=n, arrival_rate_per_s=20, n_tokens=256)
            for n in (500, 2000)]
    for r in runs:
        assert r.overloaded and r.baseline_utilization > 1.0 > r.speculative_utilization
        assert r.latency_speedup_p50 is None and r.capacity_speedup > 1.0
    assert runs[0].baseline_capacity == runs[1].baseline_capacity  # capacity does not depend on how long we ran
    assert runs[1].baseline.latency_p50_ms > 2 * runs[0].baseline.latency_p50_ms  # the raw latency does


# --- token trees (a TreePolicy next to the gamma policies) ------------------------------------------------

TREE_ACC = PositionalAcceptance(((0.6, 0.2, 0.1), (0.5, 0.3), (0.7, 0.1, 0.05)))


@pytest.mark.parametrize("paths,cost", [
    ("[[0],[1],[0,0]]", LeviathanCost(0.1)),
    ("[[0],[1],[2],[0,0],[0,1],[1,0],[0,0,0],[0,0,1]]", LeviathanCost(0.05)),
    ("[[0],[1],[0,0],[1,0],[0,0,0],[1,0,0]]", TabulatedCost({1: 10.0, 4: 11.0, 8: 14.0}, 1.0,
                                                              overhead_per_draft_token_ms=0.1)),
])
def test_tree_rounds_match_the_closed_form_within_sampling_error(paths, cost):
    tree = TokenTree.parse(paths)
    sim = simulate_request(TREE_ACC, cost, TreePolicy(tree), 30_000, seed=2)
    closed = predict_tree(tree, TREE_ACC, cost)
    probs = np.asarray(closed.accepted_length_probs)
    taus = np.arange(1, probs.size + 1)
    sd = math.sqrt(float(probs @ (taus - closed.expected_accepted_length) ** 2))
    # the last round may overshoot n_tokens by < depth + 1 tokens: tokens / rounds is the mean tau up to that
    assert abs(sim.tokens_per_round - closed.expected_accepted_length) < 4 * sd / math.sqrt(sim.rounds) + 1e-3
    assert sim.drafted == sim.rounds * tree.n_nodes
    # a static tree's rounds all cost the same: the speedup is off only by the mean tau's sampling error
    assert abs(sim.speedup / closed.speedup - 1) < 4 * sd / math.sqrt(sim.rounds) / closed.expected_accepted_length
    assert sim.time_ms == pytest.approx(sim.rounds * closed.round_time_ms, rel=1e-9)


def test_tree_rounds_are_seeded_and_a_chain_tree_converges_like_fixed_gamma():
    tree, cost = TokenTree.chain(4), LeviathanCost(0.1)
    acc = IIDAcceptance(0.8)  # a chain model runs as its one-rank positional model
    a = simulate_request(acc, cost, TreePolicy(tree), 30_000, seed=7)
    assert a == simulate_request(acc, cost, TreePolicy(tree), 30_000, seed=7)
    assert a != simulate_request(acc, cost, TreePolicy(tree), 30_000, seed=8)
    closed = predict_row(acc, cost, 4)
    probs = np.diff(np.concatenate([[0.0], 1 - acc.prefix_accept_probs(4), [1.0]]))  # P(tau = 1..5)
    sd = math.sqrt(float(probs @ (np.arange(1, 6) - closed.expected_tokens_per_round) ** 2))
    bound = 4 * sd / math.sqrt(a.rounds) / closed.expected_tokens_per_round  # seed 7 draws a mean 3 sd low
    assert abs(a.speedup / closed.speedup - 1) < bound
    with pytest.raises(ValueError, match="needs a TreePolicy"):
        simulate_request(TREE_ACC, cost, "fixed:4", 100)
    with pytest.raises(ValueError, match="rank-1 acceptance at depth 1"):
        simulate_request(acc, cost, TreePolicy(TokenTree.parse("[[0],[1]]")), 100)
