"""Searching token trees: Sequoia's optimal tree, and the trees SGLang and vLLM can actually draft.

* :func:`optimal_trees` — Sequoia's dynamic programme (Chen et al. 2024, §3.1):
  under positional acceptance the value of a subtree is its root's acceptance
  times a value that depends only on its shape and its root's depth, so the
  best tree of ``m`` nodes below a node splits into a knapsack over the node's
  ranked children. ``V(d, h, m)``, the best ``1 + Σ relative acceptance`` of an
  ``m``-node subtree whose root is at depth ``d`` with at most ``h`` levels
  below it::

      V(d, 0, 1) = 1
      V(d, h, m) = 1 + max over m_0 + m_1 + … = m − 1 of Σ_r p[d][r] · V(d + 1, h − 1, m_r)
                                              (m_r = 0: no rank-r child)

  E[τ] of the best tree with ``n`` nodes and depth ≤ D is ``V(0, D, n + 1)``.
  One pass gives every budget ≤ ``max_budget`` and every depth limit ≤
  ``max_depth``; rows past the acceptance's last one are all equal, so their
  states depend on ``h`` only. Exact for ``n`` nodes (the budget is spent).
* :func:`sglang_candidates` — SGLang's EAGLE draft (``--speculative-num-steps``,
  ``--speculative-eagle-topk``, ``--speculative-num-draft-tokens``;
  ``python/sglang/srt/speculative/eagle_utils.py``, ``organize_draft_results``):
  the top ``topk`` children of the root, then ``num_steps − 1`` times the top
  ``topk`` children of each of the ``topk`` best nodes of the previous level
  (by cumulative score), and the verify tree is the root plus the best
  ``num_draft_tokens − 1`` of all those candidates. Here a candidate's score is
  its acceptance under the positional model (EAGLE-2 ranks by the draft's
  cumulative confidence, which it reports to track acceptance): the static,
  expected-value version of SGLang's per-round tree.
* :func:`level_uniform_branchings` — the trees stock vLLM's EAGLE proposer
  drafts: it computes one child count per level
  (``child_drafts_per_level = num_drafts_per_level[l] // num_drafts_per_level[l-1]``
  in ``vllm/v1/spec_decode/eagle.py``), so every node of a level gets the same
  number of children.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from sim.trees import PositionalAcceptance, TokenTree

_NEG = -np.inf


def _maxplus_index(size: int) -> tuple[np.ndarray, np.ndarray]:
    """For :func:`_maxplus`: the ``[m, j]`` gather index ``m − j`` (clipped) and where ``j > m``."""
    m = np.arange(size)[:, None]
    j = np.arange(size)[None, :]
    return np.clip(m - j, 0, None), j > m


def _maxplus(h: np.ndarray, b: np.ndarray, index: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``c[m] = max_j h[m − j] + b[j]`` (and the argmax j), j = 0..m: one rank of the children knapsack."""
    gather, beyond = index
    mat = h[gather]
    mat += b
    mat[beyond] = _NEG
    best = mat.argmax(axis=1)
    return mat[np.arange(h.size), best], best.astype(np.int32)


@dataclass
class OptimalTrees:
    """E[τ]-optimal trees for every budget ≤ ``max_budget`` and depth limit ≤ ``max_depth`` (built by :func:`optimal_trees`)."""

    acceptance: PositionalAcceptance
    max_budget: int
    max_depth: int
    _values: dict = field(default_factory=dict, repr=False)   # (row, h) -> V over m = 0..max_budget + 1
    _choices: dict = field(default_factory=dict, repr=False)  # (row, h) -> [ranks, sizes] of child subtree sizes
    _index: tuple = field(default=(), repr=False)

    def __post_init__(self) -> None:
        self._index = _maxplus_index(self.max_budget + 2)

    def _row_key(self, depth: int) -> int:
        """The row index a node at ``depth`` (root 0) uses for its children."""
        return min(depth, self.acceptance.depths - 1)

    def _solve(self, key: int, h: int) -> np.ndarray:
        if (key, h) in self._values:
            return self._values[(key, h)]
        size = self.max_budget + 2
        v = np.full(size, _NEG)
        v[1] = 1.0
        if h > 0:
            child = self._solve(min(key + 1, self.acceptance.depths - 1), h - 1)
            row = self.acceptance.p[key]
            knap = np.full(size, _NEG)
            knap[0] = 0.0
            choices = np.zeros((len(row), size), dtype=np.int32)
            for r, pr in enumerate(row):
                b = np.where(np.isfinite(child), pr * np.where(np.isfinite(child), child, 0.0), _NEG)
                b[0] = 0.0  # no rank-r child
                knap, choices[r] = _maxplus(knap, b, self._index)
            v[1:] = 1.0 + knap[:-1]
            self._choices[(key, h)] = choices
        self._values[(key, h)] = v
        return v

    def _check(self, budget: int, max_depth: int) -> None:
        if not 1 <= budget <= self.max_budget:
            raise ValueError(f"budget {budget} outside 1..{self.max_budget} (what this search was built for)")
        if not 1 <= max_depth <= self.max_depth:
            raise ValueError(f"depth limit {max_depth} outside 1..{self.max_depth} (what this search was built for)")

    def expected_accepted_length(self, budget: int, max_depth: int) -> float:
        """E[τ] of the best tree with exactly ``budget`` nodes and depth ≤ ``max_depth`` (−inf: none exists)."""
        self._check(budget, max_depth)
        return float(self._solve(self._row_key(0), max_depth)[budget + 1])

    def tree(self, budget: int, max_depth: int) -> TokenTree:
        """The best tree with exactly ``budget`` nodes and depth ≤ ``max_depth``; ``ValueError`` if none exists."""
        if not math.isfinite(self.expected_accepted_length(budget, max_depth)):
            ranks = [len(r) for r in self.acceptance.p]
            raise ValueError(f"no tree of {budget} nodes fits depth <= {max_depth} with the ranks the acceptance "
                             f"gives per depth ({ranks}); raise the depth limit or give more ranks")
        paths: list[tuple[int, ...]] = []
        stack: list[tuple[tuple[int, ...], int, int, int]] = [((), 0, max_depth, budget + 1)]
        while stack:
            prefix, depth, h, m = stack.pop()
            if prefix:
                paths.append(prefix)
            if m == 1:
                continue
            choices = self._choices[(self._row_key(depth), h)]
            left = m - 1
            for r in range(choices.shape[0] - 1, -1, -1):
                j = int(choices[r, left])
                if j > 0:
                    stack.append((prefix + (r,), depth + 1, h - 1, j))
                    left -= j
            assert left == 0, "the knapsack's choices must spend the whole budget"
        return TokenTree(tuple(paths))


def optimal_trees(acceptance: PositionalAcceptance, max_budget: int, max_depth: int) -> OptimalTrees:
    """Sequoia's DP for every budget 1..``max_budget`` and depth limit 1..``max_depth`` (solved lazily, cached)."""
    for name, v in (("budget", max_budget), ("depth limit", max_depth)):
        if int(v) != v or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v}")
    return OptimalTrees(acceptance, int(max_budget), int(max_depth))


def optimal_tree(acceptance: PositionalAcceptance, budget: int, max_depth: int) -> TokenTree:
    """The tree of ``budget`` nodes and depth ≤ ``max_depth`` with the highest E[τ]."""
    return optimal_trees(acceptance, budget, max_depth).tree(budget, max_depth)


@dataclass(frozen=True)
class Candidate:
    """A node SGLang's draft proposes, with its score (acceptance under the positional model)."""

    score: float
    path: tuple[int, ...]


def sglang_candidates(acceptance: PositionalAcceptance, num_steps: int, topk: int) -> list[Candidate]:
    """Every node SGLang drafts in ``num_steps`` steps of ``topk``, best first (ties: shallower, then path order).

    The first ``num_draft_tokens − 1`` of the list are its verify tree (a
    child's score never exceeds its parent's, so the prefix is a tree).
    """
    if int(num_steps) != num_steps or num_steps < 1 or int(topk) != topk or topk < 1:
        raise ValueError(f"num_steps and topk must be integers >= 1, got {num_steps}, {topk}")
    cands: list[Candidate] = []
    beams: list[Candidate] = [Candidate(1.0, ())]
    for step in range(1, int(num_steps) + 1):
        row = acceptance.row(step)
        level = [Candidate(b.score * row[r], b.path + (r,)) for b in beams for r in range(min(topk, len(row)))]
        if not level:
            break
        cands.extend(level)
        beams = heapq.nsmallest(int(topk), level, key=_order)
    return sorted(cands, key=_order)


def _order(c: Candidate) -> tuple:
    return (-c.score, len(c.path), c.path)


def sglang_level_scores(acceptance: PositionalAcceptance, num_steps: int, topk: int) -> list[np.ndarray]:
    """The scores of the candidates SGLang drafts at each step 1..``num_steps`` (what :func:`sglang_candidates`
    lists, without the paths): enough to rank every ``num_draft_tokens`` of one (``num_steps``, ``topk``)."""
    levels: list[np.ndarray] = []
    beams = np.ones(1)
    for step in range(1, int(num_steps) + 1):
        row = np.asarray(acceptance.row(step)[:topk])
        level = (beams[:, None] * row[None, :]).ravel()
        levels.append(level)
        beams = np.sort(level)[::-1][:topk]
    return levels


def sglang_tree(acceptance: PositionalAcceptance, num_steps: int, topk: int, num_draft_tokens: int) -> TokenTree:
    """The verify tree of SGLang's three flags under the positional model (``num_draft_tokens`` counts the root)."""
    cands = sglang_candidates(acceptance, num_steps, topk)
    if not 2 <= num_draft_tokens <= len(cands) + 1:
        raise ValueError(f"num_draft_tokens {num_draft_tokens} outside 2..{len(cands) + 1} for num_steps={num_steps}, "
                         f"topk={topk} (the root plus the {len(cands)} drafted candidates)")
    return TokenTree(tuple(c.path for c in cands[: num_draft_tokens - 1]))


def level_uniform_branchings(n_nodes: int, max_depth: int, max_branch: int) -> Iterator[tuple[int, ...]]:
    """Child counts per level (c_1, c_2, …), each in 1..``max_branch``, whose level-uniform tree has ``n_nodes`` nodes.

    That tree has c_1 + c_1·c_2 + … nodes and depth ``len(c)``.
    """

    def grow(prefix: tuple[int, ...], width: int, left: int) -> Iterator[tuple[int, ...]]:
        if left == 0:
            yield prefix
            return
        if len(prefix) == max_depth:
            return
        for c in range(1, max_branch + 1):
            w = width * c
            if w > left:
                break
            yield from grow(prefix + (c,), w, left - w)

    yield from grow((), 1, int(n_nodes))


__all__ = [
    "Candidate", "OptimalTrees", "level_uniform_branchings", "optimal_tree", "optimal_trees",
    "sglang_candidates", "sglang_level_scores", "sglang_tree",
]
