"""Tree searches (sim/tree_search.py): Sequoia's DP against brute force, SGLang's and vLLM's tree families."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.trees import PositionalAcceptance, TokenTree, expected_accepted_length
from sim.tree_search import (
    level_uniform_branchings,
    optimal_tree,
    optimal_trees,
    sglang_candidates,
    sglang_level_scores,
    sglang_tree,
)


def all_trees(n: int, max_depth: int, acc: PositionalAcceptance) -> set[frozenset]:
    """Every tree of exactly ``n`` nodes, depth ≤ ``max_depth``, ranks the acceptance gives (by adding leaves)."""
    layer = {frozenset()}
    for _ in range(n):
        grown = set()
        for nodes in layer:
            for parent in [(), *nodes]:
                if len(parent) < max_depth:
                    for r in range(len(acc.row(len(parent) + 1))):
                        child = parent + (r,)
                        if child not in nodes:
                            grown.add(nodes | {child})
        layer = grown
    return layer


@st.composite
def acceptances(draw, depths=3, ranks=3):
    rows = []
    for _ in range(draw(st.integers(1, depths))):
        k = draw(st.integers(1, ranks))
        raw = draw(st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=k + 1, max_size=k + 1))
        total = sum(raw) or 1.0
        rows.append(tuple(x / total for x in raw[:k]))  # the last share is "none of the listed ranks"
    return PositionalAcceptance(tuple(rows))


@settings(max_examples=60, deadline=None)
@given(acceptances(), st.integers(1, 5), st.integers(1, 4))
def test_dp_matches_brute_force_over_all_trees(acc, n, max_depth):
    trees = all_trees(n, max_depth, acc)
    search = optimal_trees(acc, n, max_depth)
    value = search.expected_accepted_length(n, max_depth)
    if not trees:
        assert value == -math.inf
        with pytest.raises(ValueError, match="no tree of"):
            search.tree(n, max_depth)
        return
    best = max(expected_accepted_length(TokenTree(tuple(t)), acc) for t in trees)
    assert math.isclose(value, best, rel_tol=1e-12, abs_tol=1e-12)
    tree = search.tree(n, max_depth)
    assert tree.n_nodes == n and tree.depth <= max_depth
    assert math.isclose(expected_accepted_length(tree, acc), best, rel_tol=1e-12, abs_tol=1e-12)


def test_one_search_answers_every_smaller_budget_and_depth():
    acc = PositionalAcceptance(((0.6, 0.2, 0.1), (0.5, 0.3), (0.7, 0.1, 0.05)))
    search = optimal_trees(acc, 6, 3)
    for n in range(1, 7):
        for d in range(1, 4):
            trees = all_trees(n, d, acc)
            if not trees:  # e.g. 4 nodes at depth 1: the acceptance gives 3 ranks there
                assert search.expected_accepted_length(n, d) == -math.inf
                continue
            best = max(expected_accepted_length(TokenTree(tuple(t)), acc) for t in trees)
            assert math.isclose(search.expected_accepted_length(n, d), best, rel_tol=1e-12)
            assert optimal_tree(acc, n, d).depth <= d
    with pytest.raises(ValueError, match="outside 1..6"):
        search.tree(7, 3)


def test_chain_acceptance_gives_the_chain():
    # one rank per depth: the only trees are chains, and the budget fills the depth
    acc = PositionalAcceptance.from_chain([0.9, 0.8])
    assert optimal_tree(acc, 4, 4) == TokenTree.chain(4)
    assert optimal_trees(acc, 4, 3).expected_accepted_length(4, 3) == -math.inf


def test_sglang_tree_follows_the_beam_and_keeps_the_best_scores():
    acc = PositionalAcceptance(((0.5, 0.3, 0.1), (0.6, 0.2, 0.1), (0.7, 0.2)))
    cands = sglang_candidates(acc, 3, 2)
    # step 1: ranks 0, 1 of the root; steps 2, 3: top 2 children of each of the 2 best nodes of the level above
    assert len(cands) == 2 + 4 + 4
    assert {c.path for c in cands if len(c.path) == 3} == {(0, 0, 0), (0, 0, 1), (1, 0, 0), (1, 0, 1)}
    scores = [c.score for c in cands]
    assert scores == sorted(scores, reverse=True)
    levels = sglang_level_scores(acc, 3, 2)
    assert sorted(np.concatenate(levels)) == pytest.approx(sorted(scores))
    for tokens in range(2, len(cands) + 2):
        tree = sglang_tree(acc, 3, 2, tokens)  # a prefix of the ranked candidates is a tree (constructor checks)
        assert tree.n_nodes == tokens - 1
        assert math.isclose(expected_accepted_length(tree, acc), 1 + sum(scores[: tokens - 1]), rel_tol=1e-12)
    assert sglang_tree(acc, 4, 1, 5) == TokenTree.chain(4)
    with pytest.raises(ValueError, match="num_draft_tokens 12 outside 2..11"):
        sglang_tree(acc, 3, 2, 12)


@pytest.mark.parametrize("n,max_depth,max_branch", [(1, 3, 3), (6, 3, 3), (7, 4, 2), (8, 3, 2)])
def test_level_uniform_branchings_are_exactly_the_uniform_trees(n, max_depth, max_branch):
    found = set(level_uniform_branchings(n, max_depth, max_branch))
    assert all(TokenTree.from_branching(c).n_nodes == n and len(c) <= max_depth and max(c) <= max_branch
               for c in found)
    acc = PositionalAcceptance(((0.2,) * max_branch,))
    uniform = {TokenTree(tuple(t)).branching for t in all_trees(n, max_depth, acc)} - {None}
    assert found == uniform
