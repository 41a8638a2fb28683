"""Token trees: tree-shaped speculation under positional acceptance (Sequoia), closed forms and a prediction.

A draft may propose a *tree* of tokens instead of a chain: the target verifies
all of its nodes in one forward (a tree attention mask) and keeps the longest
path whose every token it accepts, plus its own next token (the bonus).

* :class:`TokenTree` — a tree as vLLM and SGLang write it: a list of paths,
  each the ranks of the draft's candidates from the root (``[[0], [1], [0, 0]]``:
  the draft's top two candidates for the next token, and the top candidate
  after the first of them). Validated on construction.
* :class:`PositionalAcceptance` — Sequoia's positional acceptance (Chen et al.
  2024, "Sequoia: Scalable and Robust Speculative Decoding", §3.1), with a row
  per depth: ``p[d][r]`` is the probability that, its parent accepted, the
  ``r``-th ranked candidate at depth ``d + 1`` is the accepted child. The
  target accepts at most one child of a node, so a row's entries are mutually
  exclusive and Σ_r p[d][r] ≤ 1. Depths past the last row reuse it (as
  :class:`~sim.acceptance.PerPositionAcceptance` reuses its last α). A chain's
  conditional α_i is the one-rank special case ``p = [[α_1], [α_2], …]``.
* The closed forms: a node is accepted with the product of ``p`` along its path
  (:func:`node_acceptance`); τ, the tokens a round produces (bonus included),
  has ``P(τ ≥ k + 1) = Σ over depth-k nodes of their acceptance`` (at most one
  node per depth is accepted), hence ``E[τ] = 1 + Σ over nodes``
  (:func:`expected_accepted_length`, :func:`accepted_length_distribution`).
* :func:`predict_tree` — the speedup under a :class:`~sim.cost.CostModel`.

Cost of a tree round (the assumption, in ms): a model draft proposes a tree
level by level, one draft forward per level over that level's parents
(the nodes of depth ``l − 1`` that have children; the root for level 1), each
parent's children being its top-k candidates; the target verifies the ``n``
nodes plus the root, ``n + 1`` tokens, in one forward; the per-round overhead
is charged for ``n`` drafted tokens::

    t_round = Σ_l draft_forward_ms(w_{l-1}) + verify_ms(n + 1) + round_overhead_ms(n)

where a cost model that prices the draft's extend pass apart (the step-cost
seam) charges it over the accepted path at most (``depth + 1`` positions), not
over the ``n + 1`` verified ones (:func:`verify_extend_ms`).
:func:`sglang_round_cost` is the round SGLang's EAGLE worker runs for its
three flags (``num_steps``, ``topk``, ``num_draft_tokens``), priced without
choosing the tree: what ``python -m sim validate`` charges a published tree.

A forward over ``w`` draft tokens costs the draft's roofline forward over ``w``
tokens under :class:`~sim.cost.RooflineCost`, and one draft step under the
cost models that have no multi-token draft time (Leviathan's, a fitted
tabulated one; see :func:`sim.cost.draft_forward_ms`). A chain of γ nodes is
γ one-token levels: exactly today's chain round (``sim.analytic.predict_row``).
"""

from __future__ import annotations

import ast
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from sim.acceptance import AcceptanceModel, IIDAcceptance, PerPositionAcceptance, acceptance_from_dict
from sim.analytic import PredictionRow, timing_fields
from sim.cost import CostModel, draft_forward_ms
from sim.engine_overheads import for_shape
from sim.files import check_schema_version
from toolkit.jsonio import JSONTooDeep, loads, read_json

Path_ = tuple[int, ...]
SUM_TOLERANCE = 1e-9
"""Σ_r p[d][r] may exceed 1 by this much (rounding in a file written with a few decimals is not)."""


def _show(path: Sequence[int]) -> str:
    """A path as the JSON the user wrote: ``[0, 1]``."""
    return json.dumps(list(path))


@dataclass(frozen=True)
class TokenTree:
    """A draft tree: one path of candidate ranks per node, breadth-first (``(len, path)``, vLLM's order).

    Every node's parent is a node too (the root, the last accepted token, is
    implicit); ranks are integers ≥ 0; no node twice. Any violation is a
    one-line ``ValueError`` naming the path.
    """

    paths: tuple[Path_, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.paths, (list, tuple)) or not self.paths:
            raise ValueError(f"a token tree is a non-empty list of paths, e.g. [[0], [1], [0, 0]]; got {self.paths!r}")
        checked: list[Path_] = []
        for i, p in enumerate(self.paths):
            if not isinstance(p, (list, tuple)) or not p:
                raise ValueError(f"path #{i + 1} {p!r} is not a non-empty list of ranks (integers >= 0)")
            for r in p:
                if isinstance(r, bool) or not isinstance(r, (int, np.integer)):
                    raise ValueError(f"path {list(p)!r} has rank {r!r}; ranks are integers >= 0")
                if r < 0:
                    raise ValueError(f"path {_show(p)} has the negative rank {int(r)}; ranks are integers >= 0")
            checked.append(tuple(int(r) for r in p))
        seen: set[Path_] = set()
        for p in checked:
            if p in seen:
                raise ValueError(f"path {_show(p)} appears twice; each node is listed once")
            seen.add(p)
        depths = {len(p) for p in checked}
        for p in sorted(checked, key=lambda q: (len(q), q)):
            if len(p) > 1 and p[:-1] not in seen:
                missing = next((d for d in range(1, len(p)) if d not in depths), None)
                if missing is not None:
                    raise ValueError(f"path {_show(p)} skips depth {missing}: the tree has no node at depth "
                                     f"{missing}, so {_show(p[:-1])} (its parent) is missing")
                raise ValueError(f"path {_show(p)} has no parent: {_show(p[:-1])} is not in the tree (not a tree; "
                                 "every node's parent must be listed)")
        object.__setattr__(self, "paths", tuple(sorted(checked, key=lambda q: (len(q), q))))

    @classmethod
    def parse(cls, value: str | Sequence[Sequence[int]]) -> "TokenTree":
        """A tree from a path list, or its text: JSON (``[[0],[1],[0,0]]``) or vLLM's tuples (``[(0,), (1,)]``)."""
        if isinstance(value, str):
            text = value.strip()
            try:
                value = loads(text, "the path list")
            except JSONTooDeep:
                raise ValueError(f"{text[:20]!r}... nests lists too deeply; a path list is two levels deep, "
                                 "e.g. [[0],[1],[0,0]]") from None
            except json.JSONDecodeError:
                try:
                    value = ast.literal_eval(text)
                except (ValueError, SyntaxError, MemoryError, RecursionError):
                    raise ValueError(f"{text[:60]!r} is not a path list; write JSON such as [[0],[1],[0,0]] "
                                     "(or vLLM's [(0,), (1,), (0, 0)])") from None
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"a token tree is a list of paths such as [[0],[1],[0,0]]; got {value!r}")
        return cls(tuple(value))

    @classmethod
    def chain(cls, n_nodes: int) -> "TokenTree":
        """The chain of ``n_nodes`` top-1 candidates: γ = ``n_nodes`` speculative decoding."""
        if int(n_nodes) != n_nodes or n_nodes < 1:
            raise ValueError(f"a chain needs an integer number of nodes >= 1, got {n_nodes}")
        return cls(tuple((0,) * d for d in range(1, int(n_nodes) + 1)))

    @classmethod
    def from_branching(cls, branching: Sequence[int]) -> "TokenTree":
        """Every node of depth ``l − 1`` gets the top ``branching[l-1]`` candidates as children (level-uniform)."""
        if not branching or any(int(c) != c or c < 1 for c in branching):
            raise ValueError(f"branching must be a non-empty list of integers >= 1, got {list(branching)!r}")
        level: list[Path_] = [()]
        paths: list[Path_] = []
        for c in branching:
            level = [p + (r,) for p in level for r in range(int(c))]
            paths.extend(level)
        return cls(tuple(paths))

    @property
    def n_nodes(self) -> int:
        """Draft tokens in the tree (the target verifies these plus the root)."""
        return len(self.paths)

    @property
    def depth(self) -> int:
        """Length of the longest path: the most draft tokens one round can accept."""
        return len(self.paths[-1])

    @property
    def level_sizes(self) -> tuple[int, ...]:
        """Nodes per depth 1..depth."""
        sizes = [0] * self.depth
        for p in self.paths:
            sizes[len(p) - 1] += 1
        return tuple(sizes)

    @property
    def frontier_widths(self) -> tuple[int, ...]:
        """Per level 1..depth, how many nodes of the level above have children (the draft forwards over these)."""
        parents: list[set[tuple[int, ...]]] = [set() for _ in range(self.depth)]
        for p in self.paths:
            parents[len(p) - 1].add(p[:-1])
        return tuple(len(s) for s in parents)

    @property
    def max_rank(self) -> int:
        """The largest rank in the tree: the draft needs its top ``max_rank + 1`` candidates."""
        return max(max(p) for p in self.paths)

    @property
    def is_chain(self) -> bool:
        """One node per depth, each the top-1 candidate."""
        return self.paths == TokenTree.chain(self.n_nodes).paths

    @property
    def branching(self) -> tuple[int, ...] | None:
        """Children per node at each level when every node of a level has the same top-k children (the trees
        :meth:`from_branching` builds, and the only ones vLLM's EAGLE proposer drafts); else None."""
        sizes = self.level_sizes
        counts = tuple(b // a for a, b in zip((1, *sizes[:-1]), sizes))
        if any(c < 1 for c in counts) or TokenTree.from_branching(counts).paths != self.paths:
            return None
        return counts

    def to_lists(self) -> list[list[int]]:
        """The JSON path list (``[[0], [1], [0, 0]]``)."""
        return [list(p) for p in self.paths]

    def vllm_string(self) -> str:
        """vLLM's ``speculative_token_tree`` value: ``str`` of the breadth-first list of tuples."""
        return str(list(self.paths))


def _check_prob(where: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0.0 <= v <= 1.0:
        raise ValueError(f"{where} is {v!r}; each p must be a number in [0, 1]")
    return float(v)


@dataclass(frozen=True)
class PositionalAcceptance:
    """Sequoia's positional acceptance, per depth: ``p[d][r]`` for the rank-``r`` child at depth ``d + 1``.

    ``source`` says where the numbers come from (a file, a preset's α and a
    rank law, a calibration); it travels into every output.
    """

    p: tuple[tuple[float, ...], ...]
    source: str = ""

    def __post_init__(self) -> None:
        rows = self.p
        if not isinstance(rows, (list, tuple)) or not rows:
            raise ValueError("p must be a non-empty list of rows, one per depth: [[p_1_rank0, p_1_rank1, ...], ...]")
        out = []
        for d, row in enumerate(rows, start=1):
            if not isinstance(row, (list, tuple)) or not row:
                raise ValueError(f"p row for depth {d} is {row!r}; each row is a non-empty list of probabilities")
            vals = tuple(_check_prob(f"p[depth {d}][rank {r}]", v) for r, v in enumerate(row))
            total = math.fsum(vals)
            if total > 1.0 + SUM_TOLERANCE:
                raise ValueError(f"p row for depth {d} sums to {total:.6g} > 1: the ranked candidates of one node are "
                                 "exclusive (the target accepts at most one), so sum_r p[d][r] <= 1")
            out.append(vals)
        object.__setattr__(self, "p", tuple(out))

    @classmethod
    def from_chain(cls, alphas: Sequence[float], source: str = "") -> "PositionalAcceptance":
        """The one-rank-per-depth model of a chain's conditional per-position α_1, α_2, …"""
        return cls(tuple((float(a),) for a in alphas), source)

    @classmethod
    def from_model(cls, model: AcceptanceModel, source: str = "") -> "PositionalAcceptance":
        """A chain acceptance model (``iid`` or ``per_position``) as its one-rank positional model."""
        if isinstance(model, IIDAcceptance):
            return cls.from_chain([model.alpha], source)
        if isinstance(model, PerPositionAcceptance):
            return cls.from_chain(model.alphas, source)
        kind = model.describe().get("kind")
        raise ValueError(f"acceptance of kind {kind!r} has no per-depth acceptance for a tree; give "
                         "{\"p\": [[...], ...]}, an 'iid' or a 'per_position' model")

    @property
    def depths(self) -> int:
        """Rows given; deeper levels reuse the last."""
        return len(self.p)

    @property
    def is_chain(self) -> bool:
        """One rank per depth: the top-1 acceptance of a chain, nothing about other ranks."""
        return all(len(row) == 1 for row in self.p)

    def row(self, depth: int) -> tuple[float, ...]:
        """p for the children at ``depth`` (1-based); past the last row, the last row."""
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        return self.p[min(depth, len(self.p)) - 1]

    def prob(self, depth: int, rank: int) -> float:
        """P(the rank-``rank`` candidate at ``depth`` is the accepted child | its parent accepted)."""
        row = self.row(depth)
        if rank >= len(row):
            raise ValueError(f"the acceptance gives ranks 0..{len(row) - 1} at depth {depth}, not rank {rank}")
        return row[rank]

    def check_covers(self, tree: TokenTree) -> None:
        """``ValueError`` naming the first path whose rank the model does not give."""
        for path in tree.paths:
            d, r = len(path), path[-1]
            row = self.row(d)
            if r >= len(row):
                given = "rank 0 only" if len(row) == 1 else f"ranks 0..{len(row) - 1}"
                raise ValueError(f"path {_show(path)} needs the rank-{r} acceptance at depth {d}, but the acceptance "
                                 f"gives {given} there ({self.source or 'no source'}); give p for that rank, or a "
                                 "rank law to derive it from the top-1 rate")

    def chain(self) -> PerPositionAcceptance:
        """The top-1 (rank 0) rates as a chain acceptance model."""
        return PerPositionAcceptance(tuple(row[0] for row in self.p))

    def describe(self) -> dict:
        return {"kind": "positional", "p": [list(r) for r in self.p], "source": self.source}

    def to_dict(self) -> dict:
        """What :func:`positional_from_dict` reads back."""
        return {**self.describe(), "schema_version": POSITIONAL_SCHEMA_VERSION}


POSITIONAL_SCHEMA_VERSION = 1


def positional_from_dict(d: Any, source: str = "") -> PositionalAcceptance:
    """``{"p": [[...], ...]}`` (``kind`` ``positional`` optional), or a chain model (``iid``/``per_position``).

    The chain kinds are what ``calibrate`` and ``calibrate ingest`` write (an
    engine's per-position rates become conditional α_i there): they give the
    one-rank positional model. Every problem is a one-line ``ValueError``.
    """
    if not isinstance(d, dict):
        raise ValueError(f"must be a JSON object such as {{\"p\": [[0.8, 0.1], [0.7]]}}, got {type(d).__name__}")
    check_schema_version(d, POSITIONAL_SCHEMA_VERSION, "positional acceptance")
    kind = d.get("kind", "positional" if "p" in d else None)
    if kind == "positional":
        if "p" not in d:
            raise ValueError("lacks the field 'p' (one list of rank probabilities per depth)")
        unknown = sorted(set(d) - {"kind", "p", "source", "schema_version"})
        if unknown:
            raise ValueError(f"unknown field {unknown[0]!r}; valid: kind, p, source, schema_version")
        return PositionalAcceptance(d["p"], str(d.get("source") or source))
    if kind in ("iid", "per_position"):
        return PositionalAcceptance.from_model(acceptance_from_dict(d), source)
    if kind is None:
        raise ValueError("lacks the field 'p' (one list of rank probabilities per depth), e.g. {\"p\": [[0.8, 0.1]]}")
    raise ValueError(f"acceptance of kind {kind!r} has no per-depth rank acceptance for a tree; valid: "
                     "'positional' ({\"p\": ...}), 'iid', 'per_position'")


def load_positional(path: str | Path) -> PositionalAcceptance:
    """Read an acceptance file for trees; any problem is one line naming the file."""
    d = read_json(path, "acceptance file")
    try:
        return positional_from_dict(d, source=f"file {str(path)!r}")
    except ValueError as exc:
        raise ValueError(f"acceptance file {str(path)!r}: {exc}") from None


def node_acceptance(tree: TokenTree, acceptance: PositionalAcceptance) -> np.ndarray:
    """P(node accepted) per path of ``tree.paths``: the product of ``p`` along the path, shape ``[n_nodes]``."""
    acceptance.check_covers(tree)
    f: dict[Path_, float] = {(): 1.0}
    out = np.empty(tree.n_nodes)
    for i, path in enumerate(tree.paths):  # breadth-first: a parent comes before its children
        f[path] = f[path[:-1]] * acceptance.row(len(path))[path[-1]]
        out[i] = f[path]
    return out


def expected_accepted_length(tree: TokenTree, acceptance: PositionalAcceptance) -> float:
    """E[τ]: tokens per round, the bonus token included = 1 + Σ over nodes of their acceptance."""
    return float(1.0 + math.fsum(node_acceptance(tree, acceptance)))


def accepted_length_distribution(tree: TokenTree, acceptance: PositionalAcceptance) -> np.ndarray:
    """P(τ = k) for k = 1..depth + 1, shape ``[depth + 1]``.

    P(τ ≥ k + 1) is the chance that some depth-``k`` node is accepted: a sum
    over that depth's nodes, since at most one node per depth is.
    """
    f = node_acceptance(tree, acceptance)
    at_least = np.zeros(tree.depth + 2)
    at_least[0] = 1.0
    for path, v in zip(tree.paths, f):
        at_least[len(path)] += v
    return np.clip(at_least[:-1] - at_least[1:], 0.0, 1.0)


class TreeSampler:
    """Draws τ for rounds of one tree, the way positional acceptance generates them.

    At each depth the target's token is the draft's rank-``r`` candidate with
    probability ``p[d][r]`` (or none of the listed ones); the round goes on
    while that candidate is a child in the tree of the node accepted so far.
    """

    def __init__(self, tree: TokenTree, acceptance: PositionalAcceptance) -> None:
        acceptance.check_covers(tree)
        self.tree = tree
        self._nodes = set(tree.paths)
        self._cum = [np.cumsum(acceptance.row(d)) for d in range(1, tree.depth + 1)]

    def sample(self, rng: np.random.Generator) -> int:
        """τ of one round (1 = no draft token accepted, only the target's own)."""
        node: Path_ = ()
        u = rng.random(self.tree.depth)
        for d in range(self.tree.depth):
            rank = int(np.searchsorted(self._cum[d], u[d], side="right"))
            child = node + (rank,)
            if rank >= self._cum[d].size or child not in self._nodes:
                break
            node = child
        return len(node) + 1


@dataclass(frozen=True)
class TreeRoundCost:
    """Wall time of one tree round, in ms."""

    draft_ms: float
    verify_ms: float
    overhead_ms: float


def verify_extend_ms(cost: CostModel, n_tokens: int, extend_tokens: int, context_tokens: float,
                     batch: int = 1) -> float:
    """The verification of ``n_tokens`` per sequence, with the draft's extend pass over ``extend_tokens``
    positions where the cost model prices that pass apart (``verify_extend_ms`` method: the step-cost seam's
    :class:`sim.stepcost.StepCost`); the others have no extend pass and charge ``verify_ms(n_tokens)``."""
    split = getattr(cost, "verify_extend_ms", None)
    if split is None:
        return cost.verify_ms(n_tokens, context_tokens, batch)
    return float(split(n_tokens, extend_tokens, context_tokens, batch))


def tree_round_cost(tree: TokenTree, cost: CostModel, context_tokens: float = 0.0, batch: int = 1,
                    draft_widths: Sequence[int] | None = None, extend_tokens: int | None = None) -> TreeRoundCost:
    """Draft (one forward per level over its parents), verify (n + 1 tokens), overhead (n drafted tokens).

    ``draft_widths``: the parents each draft forward runs over, when the engine
    drafts more than the tree keeps (SGLang drafts ``topk`` beams for
    ``num_steps`` levels, then keeps the best ``num_draft_tokens − 1`` nodes);
    the tree's own :attr:`TokenTree.frontier_widths` by default.
    ``extend_tokens``: the positions the draft's extend pass reads after the
    verification (the accepted path at most: ``depth + 1`` by default; SGLang
    pads it to ``num_steps + 1``), where the cost model prices that pass.
    """
    widths = tree.frontier_widths if draft_widths is None else tuple(draft_widths)
    cost = for_shape(cost, not tree.is_chain or max(widths, default=1) > 1)  # a tree's round, or a chain's
    draft = math.fsum(draft_forward_ms(cost, w, context_tokens, batch) for w in widths)
    extend = tree.depth + 1 if extend_tokens is None else int(extend_tokens)
    return TreeRoundCost(draft, verify_extend_ms(cost, tree.n_nodes + 1, extend, context_tokens, batch),
                         cost.round_overhead_ms(tree.n_nodes))


def sglang_draft_widths(num_steps: int, topk: int) -> tuple[int, ...]:
    """The tokens per sequence of each draft forward of SGLang's EAGLE round: 1, then ``topk`` per later step.

    ``EAGLEWorker.draft_forward`` (``python/sglang/srt/speculative/eagle_worker.py``) runs
    ``num_steps − 1`` forwards over ``topk`` tokens per sequence ("we get 1 token from draft prefill and (#spec
    steps − 1) tokens here"); the first step's candidates come from the draft's extend pass after the previous
    verification (``forward_draft_extend_after_decode``, ``num_tokens_per_req = num_steps + 1``), priced as one
    one-token step plus that pass's extra width (:func:`verify_extend_ms`)."""
    return (1, *[int(topk)] * (int(num_steps) - 1))


def sglang_branches(num_steps: int, topk: int, num_draft_tokens: int) -> bool:
    """Whether SGLang's EAGLE round with these flags drafts or keeps a tree (more than one token at some level):
    its round pays a tree round's engine overhead (:func:`sim.engine_overheads.for_shape`), as
    :func:`tree_round_cost` decides for the same round."""
    return topk > 1 and (num_steps > 1 or num_draft_tokens > 2)


def sglang_round_cost(cost: CostModel, num_steps: int, topk: int, num_draft_tokens: int,
                      context_tokens: float = 0.0, batch: int = 1) -> TreeRoundCost:
    """One round of SGLang's EAGLE worker with its three flags, whatever tree it keeps: the draft forwards of
    :func:`sglang_draft_widths`, the target's verification of ``num_draft_tokens`` per sequence (the root
    included) with the draft's extend pass over ``num_steps + 1`` positions, and the cost model's round overhead
    for ``num_draft_tokens − 1`` drafted tokens. A chain (``topk`` 1, ``num_draft_tokens = num_steps + 1``) is
    exactly the chain round of :func:`sim.cost.round_time_ms`."""
    if min(num_steps, topk) < 1 or num_draft_tokens < 2:
        raise ValueError(f"SGLang's tree flags need num_steps >= 1, topk >= 1, num_draft_tokens >= 2; got "
                         f"{num_steps}, {topk}, {num_draft_tokens}")
    cost = for_shape(cost, sglang_branches(num_steps, topk, num_draft_tokens))
    draft = math.fsum(draft_forward_ms(cost, w, context_tokens, batch) for w in sglang_draft_widths(num_steps, topk))
    verify = verify_extend_ms(cost, num_draft_tokens, num_steps + 1, context_tokens, batch)
    return TreeRoundCost(draft, verify, cost.round_overhead_ms(num_draft_tokens - 1))


@dataclass(frozen=True)
class TreePrediction(PredictionRow):
    """The closed-form prediction for one tree: a :class:`~sim.analytic.PredictionRow` whose round drafts the
    tree's ``gamma`` = ``n_nodes`` tokens, with the tree and the distribution of τ."""

    paths: tuple[Path_, ...]
    depth: int
    accepted_length_probs: tuple[float, ...]  # P(τ = 1..depth + 1)

    @property
    def n_nodes(self) -> int:
        return self.gamma

    @property
    def expected_accepted_length(self) -> float:
        """E[τ], the bonus token included (= ``expected_tokens_per_round``)."""
        return self.expected_tokens_per_round

    def as_dict(self) -> dict:
        d = asdict(self)
        d = {"paths": [list(p) for p in self.paths], "n_nodes": d.pop("gamma"), "depth": d.pop("depth"),
             "expected_accepted_length": d.pop("expected_tokens_per_round"), **d}
        d["accepted_length_probs"] = list(self.accepted_length_probs)
        return d


def predict_tree(tree: TokenTree, acceptance: PositionalAcceptance, cost: CostModel, context_tokens: float = 0.0,
                 batch: int = 1, draft_widths: Sequence[int] | None = None,
                 extend_tokens: int | None = None) -> TreePrediction:
    """Speedup of ``tree`` over autoregressive decoding: E[τ] × target step / round time (renewal-reward).

    ``batch``: every sequence of an iteration-level batch drafts and verifies
    the same tree; the speedup is per sequence at that batch (the cost models
    charge the batched forwards).
    """
    probs = accepted_length_distribution(tree, acceptance)
    tau = expected_accepted_length(tree, acceptance)
    assert math.isclose(tau, float(np.arange(1, probs.size + 1) @ probs), rel_tol=1e-9, abs_tol=1e-12)
    rc = tree_round_cost(tree, cost, context_tokens, batch, draft_widths, extend_tokens)
    return TreePrediction(
        gamma=tree.n_nodes, paths=tree.paths, depth=tree.depth, accepted_length_probs=tuple(float(x) for x in probs),
        **timing_fields(tau, rc.draft_ms, rc.verify_ms, rc.overhead_ms, cost.target_step_ms(context_tokens, batch)))


__all__ = [
    "PositionalAcceptance", "TokenTree", "TreePrediction", "TreeRoundCost", "TreeSampler",
    "accepted_length_distribution", "expected_accepted_length", "load_positional", "node_acceptance",
    "positional_from_dict", "predict_tree", "sglang_branches", "sglang_draft_widths", "sglang_round_cost",
    "tree_round_cost",
    "verify_extend_ms",
]
