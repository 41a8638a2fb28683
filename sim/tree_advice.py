"""Does branching pay? The best chain against the best tree per verify budget, and the engines' settings.

For an acceptance (:class:`~sim.trees.PositionalAcceptance`) and a cost model:

* :func:`budget_rows` — per budget n = 1..N (draft tokens verified, the root
  aside): the chain of n tokens, and the best n-node tree of depth ≤ the limit.
  "Best" is by predicted speedup among Sequoia's E[τ]-optimal trees for each
  depth limit 1..D (a deeper tree costs another draft forward: for the cost
  models whose draft cost depends on the number of levels only, Leviathan's
  and a tabulated one, this is the exact optimum; under the roofline a wide
  level costs a little more than a narrow one and the pick can be off by that).
* :func:`sglang_advice` — the best ``--speculative-num-steps``,
  ``--speculative-eagle-topk``, ``--speculative-num-draft-tokens`` (SGLang
  counts the root in the last one), its tree under the positional model
  (:func:`sim.tree_search.sglang_candidates`) and its round cost
  (:func:`sim.trees.sglang_round_cost`: draft forwards over 1, then ``topk``
  beams per step; the draft's extend pass over ``num_steps + 1`` positions).
* :func:`vllm_advice` — the best level-uniform tree (what vLLM's EAGLE
  proposer drafts), as ``num_speculative_tokens`` and ``speculative_token_tree``.
* :func:`branching_answer` — all of it, and the answer in one sentence: a
  tree *pays* when its speedup beats the best chain's by at least
  :data:`PAYS_MARGIN`, less than the closed form's own measured error on chains.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from sim.cost import CostModel, draft_forward_ms
from sim.engine_overheads import for_shape
from sim.tree_search import optimal_trees, sglang_level_scores, sglang_tree
from sim.trees import (PositionalAcceptance, TokenTree, TreePrediction, predict_tree, sglang_branches,
                       sglang_draft_widths, verify_extend_ms)

PAYS_MARGIN = 0.03
"""A tree pays when it beats the best chain by ≥ 3%: below that the gain is inside the closed form's measured
held-out speedup error on chains (the closed form's held-out MAPE on the default job's runs: results/2026-11-24-readme-evidence.md)."""


@dataclass(frozen=True)
class BudgetRow:
    """One verify budget: the chain of that many tokens (None past the depth limit) and the best tree."""

    budget: int
    chain: TreePrediction | None
    tree: TreePrediction

    def as_dict(self) -> dict:
        return {"budget": self.budget, "chain": None if self.chain is None else self.chain.as_dict(),
                "tree": self.tree.as_dict()}


@dataclass(frozen=True)
class EngineAdvice:
    """An engine's settings for the best tree it can draft, with the prediction for it."""

    engine: str
    flags: dict
    command: str
    prediction: TreePrediction

    def as_dict(self) -> dict:
        return {"engine": self.engine, "flags": self.flags, "command": self.command,
                "prediction": self.prediction.as_dict()}


@dataclass(frozen=True)
class BranchingAnswer:
    """Best chain, best tree, per-budget rows and the engines' advice."""

    rows: tuple[BudgetRow, ...]
    best_chain: TreePrediction
    best_tree: TreePrediction
    sglang: EngineAdvice
    vllm: EngineAdvice

    @property
    def gain(self) -> float:
        """Best tree's speedup / best chain's − 1."""
        return self.best_tree.speedup / self.best_chain.speedup - 1.0

    @property
    def verdict(self) -> str:
        """``pays``, ``marginal`` (a tree is better by less than :data:`PAYS_MARGIN`) or ``does not pay``."""
        if TokenTree(self.best_tree.paths).is_chain or self.gain <= 0:
            return "does not pay"
        return "pays" if self.gain >= PAYS_MARGIN else "marginal"

    def sentence(self) -> str:
        """The answer in one line."""
        t, c = self.best_tree, self.best_chain
        tree = f"the best tree ({t.n_nodes} nodes, depth {t.depth}) {t.speedup:.3f}x"
        chain = f"the best chain (gamma = {c.n_nodes}) {c.speedup:.3f}x"
        if self.verdict == "pays":
            return f"branching pays: {tree} against {chain}, +{100 * self.gain:.1f}%"
        if self.verdict == "marginal":
            return (f"branching barely pays: {tree} against {chain}, +{100 * self.gain:.1f}%, less than the "
                    f"{100 * PAYS_MARGIN:.0f}% the closed form can resolve; a chain is as good")
        return f"branching does not pay: {chain} is the best tree too"

    def as_dict(self) -> dict:
        return {"verdict": self.verdict, "answer": self.sentence(), "gain": self.gain,
                "best_chain": self.best_chain.as_dict(), "best_tree": self.best_tree.as_dict(),
                "sglang": self.sglang.as_dict(), "vllm": self.vllm.as_dict(),
                "rows": [r.as_dict() for r in self.rows]}


def _best(preds: list[TreePrediction]) -> TreePrediction:
    """Highest speedup; ties go to fewer nodes, then the shallower tree."""
    return max(preds, key=lambda p: (p.speedup, -p.n_nodes, -p.depth))


def budget_rows(acceptance: PositionalAcceptance, cost: CostModel, max_budget: int, max_depth: int,
                context_tokens: float = 0.0, batch: int = 1) -> list[BudgetRow]:
    """Per budget 1..``max_budget``: the chain (while it fits ``max_depth``) and the best tree (module docstring)."""
    search = optimal_trees(acceptance, max_budget, max_depth)
    rows = []
    for n in range(1, max_budget + 1):
        preds, last = [], -math.inf
        for d in range(1, min(n, max_depth) + 1):
            value = search.expected_accepted_length(n, d)
            if value > last + 1e-12:  # a deeper limit that buys nothing would only cost another draft forward
                preds.append(predict_tree(search.tree(n, d), acceptance, cost, context_tokens, batch))
                last = value
        if not preds:
            raise ValueError(f"no tree of {n} nodes fits depth <= {max_depth} with the ranks the acceptance gives")
        chain = predict_tree(TokenTree.chain(n), acceptance, cost, context_tokens, batch) if n <= max_depth else None
        rows.append(BudgetRow(n, chain, _best(preds)))
    return rows


def _sglang_command(steps: int, topk: int, tokens: int) -> str:
    return (f"--speculative-num-steps {steps} --speculative-eagle-topk {topk} "
            f"--speculative-num-draft-tokens {tokens}")


def sglang_advice(acceptance: PositionalAcceptance, cost: CostModel, max_budget: int, max_depth: int,
                  context_tokens: float = 0.0, batch: int = 1) -> EngineAdvice:
    """The best SGLang flags with ``num_steps`` ≤ ``max_depth`` and ``num_draft_tokens − 1`` ≤ ``max_budget``."""
    base = cost.target_step_ms(context_tokens, batch)
    verify = {steps: np.array([verify_extend_ms(cost, n + 1, steps + 1, context_tokens, batch)
                               for n in range(1, max_budget + 1)]) for steps in range(1, max_depth + 1)}
    overhead = {tree: np.array([for_shape(cost, tree).round_overhead_ms(n) for n in range(1, max_budget + 1)])
                for tree in (False, True)}  # a chain's round and a tree's pay their own (sglang_branches)
    best: tuple[tuple, int, int, int] | None = None
    for topk in range(1, max(len(r) for r in acceptance.p) + 1):
        levels = sglang_level_scores(acceptance, max_depth, topk)
        for steps in range(1, max_depth + 1):
            draft = sum(draft_forward_ms(cost, w, context_tokens, batch) for w in sglang_draft_widths(steps, topk))
            if topk == 1:  # a chain: SGLang sets num_draft_tokens = num_steps + 1 itself
                if steps > max_budget:
                    break
                ns = np.array([steps])
                tau = np.array([1.0 + float(np.sum(np.concatenate(levels[:steps])))])
            else:
                scores = np.sort(np.concatenate(levels[:steps]))[::-1][:max_budget]
                ns = np.arange(1, scores.size + 1)
                tau = 1.0 + np.cumsum(scores)
            branches = np.array([sglang_branches(steps, topk, int(n) + 1) for n in ns])
            extra = np.where(branches, overhead[True][ns - 1], overhead[False][ns - 1])
            speedup = tau * base / (draft + verify[steps][ns - 1] + extra)
            i = int(np.argmax(speedup))
            key = (float(speedup[i]), -(int(ns[i]) + 1), -steps, -topk)
            if best is None or key > best[0]:
                best = (key, steps, topk, int(ns[i]) + 1)
    assert best is not None
    _, steps, topk, tokens = best
    tree = sglang_tree(acceptance, steps, topk, tokens)
    pred = predict_tree(tree, acceptance, cost, context_tokens, batch, sglang_draft_widths(steps, topk), steps + 1)
    flags = {"speculative_num_steps": steps, "speculative_eagle_topk": topk, "speculative_num_draft_tokens": tokens}
    return EngineAdvice("sglang", flags, _sglang_command(steps, topk, tokens), pred)


def vllm_advice(acceptance: PositionalAcceptance, cost: CostModel, max_budget: int, max_depth: int,
                context_tokens: float = 0.0, batch: int = 1) -> EngineAdvice:
    """The best level-uniform tree of ≤ ``max_budget`` nodes and depth ≤ ``max_depth``, as vLLM settings.

    A level-uniform tree's depth-l nodes carry Π_{i≤l} Σ_{r<c_i} p[i][r] in
    all (every path through the top c_i at each level), so E[τ] and the round
    cost accumulate level by level over the child counts (c_1, c_2, …).
    """
    base = cost.target_step_ms(context_tokens, batch)
    forward = {w: draft_forward_ms(cost, w, context_tokens, batch) for w in range(1, max_budget + 1)}
    verify = {tree: [0.0] + [cost.verify_ms(n + 1, context_tokens, batch) + for_shape(cost, tree).round_overhead_ms(n)
                             for n in range(1, max_budget + 1)] for tree in (False, True)}
    best: list = [None]

    def grow(branching: tuple[int, ...], width: int, nodes: int, mass: float, tau: float, draft: float) -> None:
        if nodes:
            key = (tau * base / (draft + verify[nodes > len(branching)][nodes]), -nodes, -len(branching))
            if best[0] is None or key > best[0][0]:
                best[0] = (key, branching)
        if len(branching) == max_depth:
            return
        row = acceptance.row(len(branching) + 1)
        for c in range(1, len(row) + 1):
            if nodes + width * c > max_budget:
                break
            level_mass = mass * math.fsum(row[:c])
            grow(branching + (c,), width * c, nodes + width * c, level_mass, tau + level_mass, draft + forward[width])

    grow((), 1, 0, 1.0, 1.0, 0.0)
    tree = TokenTree.from_branching(best[0][1])
    pred = predict_tree(tree, acceptance, cost, context_tokens, batch)
    flags = {"num_speculative_tokens": tree.n_nodes, "speculative_token_tree": tree.vllm_string()}
    return EngineAdvice("vllm", flags, f"--speculative-config '{json.dumps(flags)}'", pred)


def branching_answer(acceptance: PositionalAcceptance, cost: CostModel, max_budget: int, max_depth: int,
                     context_tokens: float = 0.0, batch: int = 1) -> BranchingAnswer:
    """Chains against trees for budgets 1..``max_budget`` (depth ≤ ``max_depth``), and the engines' settings."""
    rows = budget_rows(acceptance, cost, max_budget, max_depth, context_tokens, batch)
    chains = [r.chain for r in rows if r.chain is not None]
    return BranchingAnswer(
        rows=tuple(rows), best_chain=_best(chains), best_tree=_best([r.tree for r in rows]),
        sglang=sglang_advice(acceptance, cost, max_budget, max_depth, context_tokens, batch),
        vllm=vllm_advice(acceptance, cost, max_budget, max_depth, context_tokens, batch))


__all__ = ["PAYS_MARGIN", "BranchingAnswer", "BudgetRow", "EngineAdvice", "branching_answer", "budget_rows",
           "sglang_advice", "vllm_advice"]
