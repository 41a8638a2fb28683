"""Token trees (sim/trees.py): validation, positional acceptance, closed forms against the chain and an enumeration."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from presets import RooflineForward, get_hardware, get_pair
from sim.acceptance import IIDAcceptance, PerPositionAcceptance, expected_tokens_iid
from sim.analytic import predict_row
from sim.cost import LeviathanCost, RooflineCost, TabulatedCost, draft_forward_ms, pair_roofline_cost, round_time_ms
from sim.trees import (
    PositionalAcceptance,
    TokenTree,
    TreeSampler,
    accepted_length_distribution,
    expected_accepted_length,
    load_positional,
    node_acceptance,
    positional_from_dict,
    predict_tree,
    sglang_draft_widths,
    sglang_round_cost,
    tree_round_cost,
)

EXAMPLE = PositionalAcceptance(((0.6, 0.2, 0.1), (0.5, 0.3), (0.7, 0.1, 0.05)))


# --- TokenTree ---------------------------------------------------------------------------------------------

def test_tree_parses_json_and_vllm_tuples_into_breadth_first_order():
    a = TokenTree.parse("[[0,0],[1],[0]]")
    b = TokenTree.parse("[(0,), (1,), (0, 0)]")
    assert a == b and a.paths == ((0,), (1,), (0, 0))
    assert a.n_nodes == 3 and a.depth == 2 and a.level_sizes == (2, 1) and a.max_rank == 1
    assert a.vllm_string() == "[(0,), (1,), (0, 0)]" and a.to_lists() == [[0], [1], [0, 0]]
    assert a.frontier_widths == (1, 1)  # the root, then (0,) alone has children


def test_frontier_widths_count_parents_with_children():
    t = TokenTree.parse("[[0],[1],[2],[0,0],[0,1],[2,0],[2,0,0]]")
    assert t.level_sizes == (3, 3, 1) and t.frontier_widths == (1, 2, 1)


def test_chain_and_branching_constructors():
    assert TokenTree.chain(3).paths == ((0,), (0, 0), (0, 0, 0)) and TokenTree.chain(3).is_chain
    t = TokenTree.from_branching((2, 1, 3))
    assert t.level_sizes == (2, 2, 6) and t.branching == (2, 1, 3) and not t.is_chain
    assert TokenTree.parse("[[0],[1],[0,0]]").branching is None  # (1,) has no child: not level-uniform


@pytest.mark.parametrize("paths,needles", [
    ("[]", ["non-empty list of paths"]),
    ("[[0],[]]", ["path #2", "non-empty list of ranks"]),
    ("[[0],[0,0],[0,0]]", ["path [0, 0] appears twice"]),
    ("[[0],[0,-1]]", ["path [0, -1]", "negative rank -1"]),
    ("[[0],[0,0,0]]", ["path [0, 0, 0] skips depth 2", "[0, 0]"]),
    ("[[0],[0,0],[1,0]]", ["path [1, 0] has no parent", "[1] is not in the tree", "not a tree"]),
    ("[[0],[0.5]]", ["path [0.5]", "rank 0.5"]),
    ("[[0],[true]]", ["rank True"]),
    ("[0, 1]", ["path #1 0", "non-empty list of ranks"]),
    ("{\"a\": 1}", ["list of paths"]),
    ("[[0], [1]", ["not a path list", "[[0],[1],[0,0]]"]),
])
def test_bad_trees_are_one_line_errors_naming_the_path(paths, needles):
    with pytest.raises(ValueError) as e:
        TokenTree.parse(paths)
    msg = str(e.value)
    assert "\n" not in msg
    for n in needles:
        assert n in msg, (n, msg)


# --- PositionalAcceptance -------------------------------------------------------------------------------

@pytest.mark.parametrize("p,needles", [
    ([], ["non-empty list of rows"]),
    ([[0.5], []], ["depth 2", "non-empty list"]),
    ([[0.7, 0.4]], ["depth 1 sums to 1.1", "<= 1"]),
    ([[0.5, -0.1]], ["p[depth 1][rank 1]", "-0.1", "[0, 1]"]),
    ([[float("nan")]], ["p[depth 1][rank 0]", "nan"]),
    ([["x"]], ["'x'"]),
])
def test_bad_acceptance_is_refused(p, needles):
    with pytest.raises(ValueError) as e:
        PositionalAcceptance(p)
    for n in needles:
        assert n in str(e.value), (n, str(e.value))


def test_rows_past_the_last_repeat_and_missing_ranks_are_named():
    acc = PositionalAcceptance(((0.8, 0.1), (0.6,)))
    assert acc.row(1) == (0.8, 0.1) and acc.row(2) == acc.row(7) == (0.6,)
    with pytest.raises(ValueError, match=r"path \[0, 1\] needs the rank-1 acceptance at depth 2.*rank 0 only"):
        node_acceptance(TokenTree.parse("[[0],[0,0],[0,1]]"), acc)


def test_file_formats(tmp_path):
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"p": [[0.6, 0.2], [0.5]]}))
    assert load_positional(f).p == ((0.6, 0.2), (0.5,))
    f.write_text(json.dumps({"kind": "per_position", "alphas": [0.8, 0.6]}))  # what calibrate (ingest) writes
    acc = load_positional(f)
    assert acc.p == ((0.8,), (0.6,)) and acc.is_chain and acc.chain() == PerPositionAcceptance((0.8, 0.6))
    f.write_text(json.dumps({"kind": "iid", "alpha": 0.7}))
    assert load_positional(f).p == ((0.7,),)
    assert positional_from_dict(EXAMPLE.to_dict()) == EXAMPLE  # round trip (source aside: both empty)
    for doc, needle in [({"kind": "trace", "values": [[1, 0]]}, "kind 'trace' has no per-depth"),
                        ({"p": [[0.5]], "alphas": [1]}, "unknown field 'alphas'"),
                        ({"q": 1}, "lacks the field 'p'"),
                        ({"p": [[0.9, 0.2]]}, "sums to 1.1"),
                        ({"p": [[0.5]], "schema_version": 7}, "schema_version 7")]:
        f.write_text(json.dumps(doc))
        with pytest.raises(ValueError, match=needle) as e:
            load_positional(f)
        assert str(f) in str(e.value)
    with pytest.raises(ValueError, match="no such file"):
        load_positional(tmp_path / "missing.json")


# --- closed forms ----------------------------------------------------------------------------------------

def test_worked_example():
    # E[tau] = 1 + p(0) + p(1) + p(0) p(0,0) = 1 + 0.6 + 0.2 + 0.6 * 0.5
    t = TokenTree.parse("[[0],[1],[0,0]]")
    assert np.allclose(node_acceptance(t, EXAMPLE), [0.6, 0.2, 0.3])
    assert expected_accepted_length(t, EXAMPLE) == pytest.approx(2.1, abs=1e-15)
    # P(tau=1) = 1 - 0.8; P(tau=3) = 0.3 (the only depth-2 node); P(tau=2) the rest
    assert np.allclose(accepted_length_distribution(t, EXAMPLE), [0.2, 0.5, 0.3])


alpha_lists = st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(alpha_lists, st.integers(1, 16))
def test_chain_reproduces_the_per_position_closed_form(alphas, gamma):
    acc, tree = PositionalAcceptance.from_chain(alphas), TokenTree.chain(gamma)
    chain = PerPositionAcceptance(tuple(alphas))
    assert math.isclose(expected_accepted_length(tree, acc), chain.expected_tokens(gamma), rel_tol=1e-12)
    # P(tau >= j + 1) = P(first j accepted), the chain's prefix probabilities
    at_least = np.cumsum(accepted_length_distribution(tree, acc)[::-1])[::-1][1:]
    assert np.allclose(at_least, chain.prefix_accept_probs(gamma), rtol=1e-12, atol=1e-15)


@settings(max_examples=200, deadline=None)
@given(st.floats(0.0, 1.0, allow_nan=False), st.integers(1, 24))
def test_chain_reproduces_leviathan_iid(alpha, gamma):
    acc = PositionalAcceptance.from_model(IIDAcceptance(alpha))
    assert math.isclose(expected_accepted_length(TokenTree.chain(gamma), acc),
                        float(expected_tokens_iid(alpha, gamma)), rel_tol=1e-12)


def _costs():
    pair, hw = get_pair("llama3-1b-8b"), get_hardware("a100-80gb")
    return [LeviathanCost(0.07, target_ms=2.0),
            TabulatedCost({1: 20.0, 2: 21.0, 5: 24.0, 9: 30.0}, 2.5, round_overhead_ms_base=0.3,
                          overhead_per_draft_token_ms=0.05, reference_context_tokens=256.0,
                          target_context_ms_per_token=0.004, draft_context_ms_per_token=0.001),
            RooflineCost(RooflineForward(pair.draft, hw), RooflineForward(pair.target, hw), overhead_ms=0.1)]


@settings(max_examples=100, deadline=None)
@given(alpha_lists, st.integers(1, 12), st.sampled_from([0, 1, 2]), st.floats(0.0, 4096.0), st.integers(1, 8))
def test_chain_speedup_equals_predict_row(alphas, gamma, which, ctx, batch):
    cost = _costs()[which]
    acc = PositionalAcceptance.from_chain(alphas)
    tree = predict_tree(TokenTree.chain(gamma), acc, cost, ctx, batch)
    row = predict_row(PerPositionAcceptance(tuple(alphas)), cost, gamma, ctx, batch)
    for a, b in [(tree.speedup, row.speedup), (tree.round_time_ms, row.round_time_ms), (tree.draft_ms, row.draft_ms),
                 (tree.verify_ms, row.verify_ms), (tree.overhead_ms, row.overhead_ms)]:
        assert math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15)


def _enumerate_tau(tree: TokenTree, acc: PositionalAcceptance) -> np.ndarray:
    """P(tau = k) by enumerating every outcome of every depth: which ranked candidate (or none) is the target's.

    Independent of the closed form: the target's token at depth d is candidate r with p[d][r], whatever
    happened above; the round accepts the longest prefix of that outcome sequence that is a path of the tree.
    """
    nodes = set(tree.paths)
    per_depth = []
    for d in range(1, tree.depth + 1):
        row = acc.row(d)
        per_depth.append([(r, q) for r, q in enumerate(row)] + [(None, 1.0 - sum(row))])
    out = np.zeros(tree.depth + 1)
    for outcome in itertools.product(*per_depth):
        prob = math.prod(q for _, q in outcome)
        path: tuple[int, ...] = ()
        for r, _ in outcome:
            if r is None or path + (r,) not in nodes:
                break
            path += (r,)
        out[len(path)] += prob
    return out


@pytest.mark.parametrize("paths", [
    "[[0]]", "[[0],[1]]", "[[0],[1],[0,0]]", "[[0],[1],[2],[0,0],[1,0],[0,0,0]]", "[[1],[1,1],[1,1,2]]",
    "[[0],[2],[0,1],[2,0],[2,1],[0,1,0],[2,1,2]]", "[[0],[0,0],[0,0,0],[0,0,0,0]]",
])
def test_small_trees_match_exhaustive_enumeration(paths):
    tree = TokenTree.parse(paths)
    rng = np.random.default_rng(len(paths))
    for _ in range(5):
        rows = []
        for _d in range(4):
            raw = rng.dirichlet(np.ones(4))[:3] * rng.uniform(0.5, 1.0)  # 3 ranks, sum < 1
            rows.append(tuple(raw))
        acc = PositionalAcceptance(tuple(rows))
        enum = _enumerate_tau(tree, acc)
        closed = accepted_length_distribution(tree, acc)
        assert np.allclose(closed, enum, rtol=1e-12, atol=1e-15)
        assert math.isclose(expected_accepted_length(tree, acc), float(np.arange(1, enum.size + 1) @ enum),
                            rel_tol=1e-12)


def test_sampler_matches_the_distribution():
    tree = TokenTree.parse("[[0],[1],[2],[0,0],[1,0],[0,0,0]]")
    sampler = TreeSampler(tree, EXAMPLE)
    rng = np.random.default_rng(5)
    draws = np.array([sampler.sample(rng) for _ in range(40_000)])
    freq = np.bincount(draws, minlength=tree.depth + 2)[1:] / draws.size
    p = accepted_length_distribution(tree, EXAMPLE)
    se = np.sqrt(p * (1 - p) / draws.size)
    assert np.all(np.abs(freq - p) < 5 * se + 1e-12), (freq, p)


def test_round_cost_counts_levels_and_parents():
    pair, hw = get_pair("llama3-1b-8b"), get_hardware("h100-sxm")
    cost = RooflineCost(RooflineForward(pair.draft, hw), RooflineForward(pair.target, hw))
    tree = TokenTree.from_branching((4, 2))  # 4 + 8 nodes: forwards over 1 then 4 tokens, verify 13
    rc = tree_round_cost(tree, cost, 512.0)
    assert rc.draft_ms == pytest.approx(cost.draft.forward_ms(1, 512.0) + cost.draft.forward_ms(4, 512.0))
    assert rc.verify_ms == cost.verify_ms(13, 512.0)
    assert draft_forward_ms(LeviathanCost(0.1), 7, 0.0) == LeviathanCost(0.1).draft_step_ms(0.0)
    # SGLang drafts topk beams at every step even where the kept tree is narrower
    wide = tree_round_cost(tree, cost, 512.0, draft_widths=(1, 4, 4))
    assert wide.draft_ms > rc.draft_ms


def test_medusa_heads_cost_one_pass_whatever_the_level_width():
    # Medusa's heads read the target's last hidden state only; EAGLE's head runs over the level's tokens
    medusa, eagle = get_pair("medusa-vicuna-7b"), get_pair("eagle-vicuna-7b")
    hw = get_hardware("a100-80gb")
    m = pair_roofline_cost(medusa, hw)
    e = pair_roofline_cost(eagle, hw)
    assert draft_forward_ms(m, 64, 512.0, 64) == draft_forward_ms(m, 1, 512.0, 64)
    assert draft_forward_ms(e, 64, 512.0, 64) > draft_forward_ms(e, 1, 512.0, 64)


def test_sglang_round_drafts_one_then_topk_and_extends_over_the_steps(known_cost):
    cost = known_cost
    assert sglang_draft_widths(4, 3) == (1, 3, 3, 3)
    rc = sglang_round_cost(cost, 4, 3, 16, 512.0, batch=2)
    assert rc.draft_ms == pytest.approx(1.2 + 3 * 1.6)
    assert rc.verify_ms == pytest.approx(10.0 + 0.5 * 16 * 2 + 0.2 * 5 * 2)  # extend over steps + 1, not 16
    chain = sglang_round_cost(cost, 3, 1, 4, 512.0)
    assert chain.draft_ms + chain.verify_ms == pytest.approx(round_time_ms(cost, 3, 512.0))
    with pytest.raises(ValueError, match="num_draft_tokens >= 2"):
        sglang_round_cost(cost, 3, 2, 1)
    # a generic tree extends over its depth + 1 where the cost model prices the extend apart
    rc_tree = tree_round_cost(TokenTree.from_branching((4, 2)), cost, 512.0)
    assert rc_tree.verify_ms == pytest.approx(10.0 + 0.5 * 13 + 0.2 * 3)
