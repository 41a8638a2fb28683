"""Does branching pay (sim/tree_advice.py): budget rows, SGLang and vLLM advice, each against brute force."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from presets import RooflineForward, get_hardware, get_pair
from sim.cost import LeviathanCost, RooflineCost, TabulatedCost
from sim.rank_law import RankLaw
from sim.tree_advice import PAYS_MARGIN, BranchingAnswer, branching_answer, budget_rows, sglang_advice, vllm_advice
from sim.tree_search import level_uniform_branchings, sglang_candidates, sglang_tree
from sim.trees import PositionalAcceptance, TokenTree, predict_tree

ACC = PositionalAcceptance(((0.6, 0.2, 0.1), (0.5, 0.3), (0.7, 0.1, 0.05)))
LEVIATHAN = LeviathanCost(0.1)
# verify cost grows 40% per extra token: nodes are dear, so the best use of one is the deepest likely one
STEEP = TabulatedCost({1: 10.0, 2: 14.0, 3: 18.0, 8: 38.0}, 0.1)


def _all_trees(n, max_depth, acc):
    layer = {frozenset()}
    for _ in range(n):
        layer = {nodes | {p + (r,)} for nodes in layer for p in [(), *nodes] if len(p) < max_depth
                 for r in range(len(acc.row(len(p) + 1))) if p + (r,) not in nodes}
    return [TokenTree(tuple(t)) for t in layer]


@pytest.mark.parametrize("cost", [LEVIATHAN, STEEP], ids=["leviathan", "steep-verify"])
def test_budget_rows_pick_the_fastest_tree_of_each_budget(cost):
    # the draft cost depends on the number of levels only here: the pick must be the brute-force optimum
    rows = budget_rows(ACC, cost, 5, 3)
    for row in rows:
        best = max(predict_tree(t, ACC, cost).speedup for t in _all_trees(row.budget, 3, ACC))
        assert math.isclose(row.tree.speedup, best, rel_tol=1e-12)
        if row.budget <= 3:
            assert row.chain is not None and TokenTree(row.chain.paths) == TokenTree.chain(row.budget)
        else:
            assert row.chain is None  # a chain of 4 is deeper than the limit


def test_branching_pays_with_free_verify_and_not_with_steep_verify():
    rich = RankLaw().extend(PositionalAcceptance.from_chain([0.7]))
    yes = branching_answer(rich, LEVIATHAN, 12, 6)
    assert yes.verdict == "pays" and yes.gain >= PAYS_MARGIN and not TokenTree(yes.best_tree.paths).is_chain
    assert yes.sentence().startswith("branching pays: the best tree")
    no = branching_answer(rich, STEEP, 12, 6)
    assert no.verdict == "does not pay" and TokenTree(no.best_tree.paths).is_chain
    assert no.sentence().startswith("branching does not pay")
    marginal = replace(yes, best_tree=replace(yes.best_tree, speedup=yes.best_chain.speedup * 1.01))
    assert isinstance(marginal, BranchingAnswer) and marginal.verdict == "marginal"
    assert "barely pays" in marginal.sentence() and "+1.0%" in marginal.sentence()


@pytest.mark.parametrize("batch", [1, 32])
def test_sglang_advice_is_the_best_of_its_flag_grid(batch):
    pair, hw = get_pair("llama3-1b-8b"), get_hardware("h100-sxm")
    cost = RooflineCost(RooflineForward(pair.draft, hw), RooflineForward(pair.target, hw))
    acc = RankLaw().extend(PositionalAcceptance.from_chain([0.75]))
    adv = sglang_advice(acc, cost, 10, 4, 512.0, batch)
    best = 0.0
    for steps in range(1, 5):
        for topk in range(1, 11):
            n_cands = len(sglang_candidates(acc, steps, topk))
            for tokens in ([steps + 1] if topk == 1 else range(2, min(n_cands, 10) + 2)):
                if tokens - 1 > 10:
                    continue
                tree = sglang_tree(acc, steps, topk, tokens)
                best = max(best, predict_tree(tree, acc, cost, 512.0, batch, (1, *[topk] * (steps - 1))).speedup)
    assert math.isclose(adv.prediction.speedup, best, rel_tol=1e-12)
    f = adv.flags
    assert adv.command == (f"--speculative-num-steps {f['speculative_num_steps']} --speculative-eagle-topk "
                           f"{f['speculative_eagle_topk']} --speculative-num-draft-tokens "
                           f"{f['speculative_num_draft_tokens']}")
    assert adv.prediction.n_nodes == f["speculative_num_draft_tokens"] - 1
    if f["speculative_eagle_topk"] == 1:
        assert f["speculative_num_draft_tokens"] == f["speculative_num_steps"] + 1


def test_vllm_advice_is_the_best_level_uniform_tree():
    acc = RankLaw().extend(PositionalAcceptance.from_chain([0.8, 0.7]))
    adv = vllm_advice(acc, LEVIATHAN, 12, 4)
    best = max(predict_tree(TokenTree.from_branching(c), acc, LEVIATHAN).speedup
               for n in range(1, 13) for c in level_uniform_branchings(n, 4, 10))
    assert math.isclose(adv.prediction.speedup, best, rel_tol=1e-12)
    tree = TokenTree(adv.prediction.paths)
    assert tree.branching is not None
    assert adv.flags == {"num_speculative_tokens": tree.n_nodes, "speculative_token_tree": tree.vllm_string()}
    assert adv.command.startswith("--speculative-config '{\"num_speculative_tokens\": ")
