"""Token trees on the measure side: the ``--tree`` option, tree drafts, verification in one target forward.

* :class:`TreeOption` — what ``--tree`` asks for: ``depth=D,topk=K,budget=N``
  (SGLang's ``speculative_num_steps`` / ``speculative_eagle_topk`` and a verify
  budget of ``N`` draft tokens: SGLang's ``speculative_num_draft_tokens`` is
  ``N + 1``, the root included), or a fixed path list in vLLM/SGLang's format
  (``[[0],[1],[0,0]]``), parsed and validated by :class:`sim.trees.TokenTree`.
  :func:`check_tree_option` refuses, before any model loads, depth or budget
  out of range, ``topk`` above the vocabulary and a draft that cannot branch.
* Tree drafts (:class:`DraftTree`, one per round): a model draft
  (:class:`~measure.drafts.ModelDraft`: ``model:``, ``early:N``, ``layers:``,
  ``int8``, ``bf16``, ``fp16``; on llama.cpp ``model:`` and ``quant:TYPE``)
  drafts level by level, one draft forward per level over the nodes it
  expands, each under a tree mask over the draft's own cache. With ``depth/topk/budget`` it drafts as SGLang's EAGLE: the top
  ``topk`` children of the root, then the top ``topk`` children of each of the
  ``topk`` best nodes of the level above (by cumulative draft log-probability),
  and keeps the ``budget`` best nodes of all of them. With a path list it drafts
  exactly those ranks. Prompt lookup (``ngram:N``) branches over several earlier
  matches: the distinct continuations of the tail's earlier occurrences (the
  longest n-gram first, the most recent first; rank 0 is the chain draft's own
  proposal), merged into a trie. ``ngram:N:first`` (one candidate by
  construction) cannot branch.
* Counterfactual ranks: wherever a draft ranked candidates (a node it expanded,
  the root always), the tree keeps its top :data:`RANKED` candidates
  (:attr:`DraftTree.ranked`), so each position the target decided is recorded
  with the rank its token had there (:attr:`TreeRoundRecord.target_ranks`):
  what a tree of any shape would have accepted at that position.
* :func:`verify_tree` — the target verifies the root (the last emitted token)
  and every node in **one** forward: each token sees the committed context and
  its ancestors (a 4D mask on transformers; on llama.cpp the sequence ids of
  the paths through it), at position ``L − 1 + depth``; greedy acceptance is
  the longest path whose every token is the target's argmax at its parent, and
  only the accepted path stays in the cache (no re-run). The decoder's fast
  paths (:func:`tree_argmax`, :func:`tree_topk`, :func:`last_topk`; defaults
  from the logits in :class:`~measure.seam.TreeDecoder`) are what crosses the
  seam: a llama.cpp worker sends back argmaxes and top-k ids with their
  log-probabilities, not ``[m, V]`` logits.
* :func:`tree_generate` — the loop (greedy only: a tree at temperature > 0 is
  refused until multi-candidate rejection sampling is built), returning the
  chain loop's :class:`~measure.seam.GenerationResult` and one
  :class:`TreeRoundRecord` per round (each node's depth, rank, parent, token,
  accepted or not).

Decoders: the tree forward needs a :class:`~measure.seam.TreeDecoder`, for the
target and for a model draft: the transformers engine's, or the llama.cpp
engine's in a tree run (its contexts made with ``n_seq_max`` =
:func:`tree_sequences` and a unified KV cache, ``EngineOptions.tree_sequences``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from measure.decoding import check_temperature
from measure.drafts import ModelDraft, NGramDraft
from measure.seam import Decoder, Draft, GenerationResult, RoundRecord, TreeDecoder
from measure.timing import Timer
from sim.tree_cli import DEPTH_LIMIT, NODES_LIMIT, NODES_WHY
from sim.trees import TokenTree

#: The keys of ``--tree depth=D,topk=K,budget=N``.
TREE_KEYS = ("depth", "topk", "budget")
#: Draft kinds that branch from the draft model's top-k (``quant:TYPE``: the llama.cpp engine's).
MODEL_KINDS = ("model", "early", "layers", "int8", "bf16", "fp16", "quant")
#: The engines that verify a tree in one forward.
TREE_ENGINES = ("transformers", "llamacpp")
#: The most sequences one llama.cpp context holds (``LLAMA_MAX_SEQ``, its ``src/llama-cparams.h``).
LLAMACPP_MAX_SEQUENCES = 256
#: Candidates kept per ranked node for the counterfactual record (``tree_ranks.csv``): enough for any tree of up
#: to this many children per node to be replayed from the record.
RANKED = 8
_EXAMPLE = "e.g. --tree depth=4,topk=2,budget=8 or --tree '[[0],[1],[0,0]]'"


def beam_nodes(depth: int, topk: int) -> int:
    """Candidates SGLang's draft makes for ``depth`` steps of ``topk``: ``topk`` + (depth − 1)·topk²."""
    return topk + (depth - 1) * topk * topk


@dataclass(frozen=True)
class TreeOption:
    """One ``--tree`` value. ``paths`` is the fixed tree of a path list, None for ``depth/topk/budget`` (the
    tree is chosen per round from the draft's beam); ``depth``, ``topk`` (candidates per expanded node) and
    ``budget`` (draft tokens verified) describe both."""

    depth: int
    topk: int
    budget: int
    paths: TokenTree | None = None

    @property
    def is_chain(self) -> bool:
        """One top-1 candidate per depth: plain speculative decoding of ``depth`` tokens."""
        return self.paths.is_chain if self.paths is not None else (self.topk == 1 and self.budget == self.depth)

    def label(self) -> str:
        """The canonical text: ``depth=4,topk=2,budget=8`` or the JSON path list."""
        if self.paths is not None:
            return str(self.paths.to_lists()).replace(" ", "")
        return f"depth={self.depth},topk={self.topk},budget={self.budget}"


def _beam_fields(t: str) -> dict[str, int]:
    """``depth=D,topk=K[,budget=N]`` → its integers, each checked ≥ 1 (one-line ``ValueError`` naming it)."""
    fields: dict[str, int] = {}
    for part in t.split(","):
        key, sep, val = part.strip().partition("=")
        if key not in TREE_KEYS or not sep:
            raise ValueError(f"--tree {t!r}: {part.strip()!r} is not one of {', '.join(k + '=N' for k in TREE_KEYS)} "
                             f"nor a path list ({_EXAMPLE})")
        if key in fields:
            raise ValueError(f"--tree {t!r}: {key} given twice")
        if not re.fullmatch(r"-?\d+", val.strip()):
            raise ValueError(f"--tree {t!r}: {key}={val.strip()!r} is not an integer")
        fields[key] = int(val)
    for key in ("depth", "topk"):
        if key not in fields:
            raise ValueError(f"--tree {t!r}: needs {key}=N ({_EXAMPLE})")
    for key in TREE_KEYS:
        if key in fields and fields[key] <= 0:
            raise ValueError(f"--tree {t!r}: {key}={fields[key]} must be >= 1")
    return fields


def parse_tree_option(text: str) -> TreeOption:
    """``depth=D,topk=K[,budget=N]`` or a path list → :class:`TreeOption`; one-line ``ValueError`` naming it.

    ``budget`` defaults to every candidate the beam makes (:func:`beam_nodes`), at most ``sim``'s 256 nodes;
    depth and budget have ``python -m sim tree``'s limits (64 and 256).
    """
    t = str(text).strip()
    if t.startswith(("[", "(")):
        try:
            tree = TokenTree.parse(t)
        except ValueError as e:
            raise ValueError(f"--tree {t[:60]!r}: {e}") from None
        return TreeOption(tree.depth, tree.max_rank + 1, tree.n_nodes, tree)
    fields = _beam_fields(t)
    depth, topk = fields["depth"], fields["topk"]
    if depth > DEPTH_LIMIT:
        raise ValueError(f"--tree {t!r}: depth={depth} is above {DEPTH_LIMIT}, the deepest tree sim evaluates; "
                         f"valid: 1..{DEPTH_LIMIT}")
    most = beam_nodes(depth, topk)
    budget = fields.get("budget", min(most, NODES_LIMIT))
    if budget > NODES_LIMIT:
        raise ValueError(f"--tree {t!r}: budget={budget} is above {NODES_LIMIT} draft tokens ({NODES_WHY}); "
                         f"valid: 1..{NODES_LIMIT}")
    if budget > most:
        raise ValueError(f"--tree {t!r}: budget={budget} exceeds the {most} candidates depth={depth},topk={topk} "
                         f"drafts (topk + (depth-1)*topk^2); valid: 1..{most}")
    return TreeOption(depth, topk, budget)


def tree_sequences(option: TreeOption) -> int:
    """The sequences a llama.cpp context needs for ``option``'s rounds: the committed one, and one per path a
    batch adds — the verified tree's leaves (at most its nodes) or the nodes a model draft feeds level by level
    (a path list's inner nodes; a beam's ``topk`` per level below the last)."""
    if option.paths is not None:
        paths = set(option.paths.paths)
        inner = {p[:-1] for p in paths if len(p) > 1}
        return 1 + max(len(paths - inner), len(inner), 1)
    return 1 + max(option.budget, option.topk * (option.depth - 1))


def can_branch(draft_spec: str) -> bool:
    """Whether a draft spec can propose more than one candidate per node (model top-k, multi-match lookup)."""
    kind, _, arg = str(draft_spec).partition(":")
    if kind in MODEL_KINDS:
        return True
    return kind == "ngram" and not arg.endswith(":first")


def check_tree_option(option: TreeOption, *, draft_spec: str, engine: str = "transformers",
                      context_tokens: int | None = None, vocab_size: int | None = None,
                      temperature: float = 0.0) -> None:
    """Refuse, without loading a model, a tree this run cannot measure (one-line ``ValueError`` naming it).

    ``context_tokens``/``vocab_size``: the target's, where known before loading.
    """
    label = option.label()
    if engine not in TREE_ENGINES:
        raise ValueError(f"--tree {label} with --engine {engine}: tree verification is built for the "
                         f"{' and '.join(TREE_ENGINES)} engines; valid: --engine {', '.join(TREE_ENGINES)}")
    if engine == "llamacpp" and tree_sequences(option) > LLAMACPP_MAX_SEQUENCES:
        raise ValueError(f"--tree {label} with --engine llamacpp: a round needs {tree_sequences(option)} sequences "
                         f"(the committed one and one per path), above llama.cpp's {LLAMACPP_MAX_SEQUENCES} "
                         "(LLAMA_MAX_SEQ); valid: fewer leaves (budget) or topk*(depth-1) below 256")
    if temperature > 0:
        raise ValueError(f"--tree {label} at --temperature {temperature:g}: trees are greedy only until "
                         "multi-candidate rejection sampling is built; valid: --temperature 0")
    if not option.is_chain and not can_branch(draft_spec):
        raise ValueError(f"--tree {label} with --draft {draft_spec}: this lookup proposes one candidate (the "
                         "earliest match) and cannot branch; valid: ngram:N (several earlier matches as branches), "
                         "a model draft (model:, early:N, layers:, int8, bf16, fp16; on llama.cpp model:, quant:), "
                         "or a chain (topk=1)")
    if vocab_size is not None and option.topk > vocab_size:
        raise ValueError(f"--tree {label}: topk {option.topk} exceeds the vocabulary of {vocab_size} tokens; "
                         f"valid: 1..{vocab_size}")
    if context_tokens is not None:
        if option.depth >= context_tokens:
            raise ValueError(f"--tree {label}: depth {option.depth} does not fit the target's context of "
                             f"{context_tokens} tokens; valid: 1..{context_tokens - 1}")
        if option.budget + 1 > context_tokens:
            raise ValueError(f"--tree {label}: budget {option.budget} (+ the root) exceeds the target's context "
                             f"of {context_tokens} tokens; valid: 1..{context_tokens - 1}")


# -- draft trees --------------------------------------------------------------------------------
@dataclass(frozen=True)
class DraftTree:
    """One round's drafted tree, breadth-first (a parent before its children): per node its token, its
    parent's index (-1: the root, the last emitted token) and its rank among its parent's candidates.

    ``ranked``: per parent (the root as -1, else a node index) the draft's ranked candidate tokens there, best
    first (up to :data:`RANKED`), where the draft ranked them (a node it expanded); a parent missing from it
    was not ranked (a leaf the draft never scored).
    """

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    ranks: tuple[int, ...]
    ranked: dict[int, tuple[int, ...]] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        assert len(self.tokens) == len(self.parents) == len(self.ranks)
        assert all(-1 <= p < i for i, p in enumerate(self.parents))
        assert all(-1 <= k < len(self.tokens) for k in self.ranked)

    @property
    def n_nodes(self) -> int:
        return len(self.tokens)

    @property
    def depths(self) -> tuple[int, ...]:
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p < 0 else out[p] + 1)
        return tuple(out)

    def paths(self) -> tuple[tuple[int, ...], ...]:
        """Each node's rank path from the root (the :class:`~sim.trees.TokenTree` path)."""
        out: list[tuple[int, ...]] = []
        for p, r in zip(self.parents, self.ranks):
            out.append((out[p] if p >= 0 else ()) + (r,))
        return tuple(out)

    def cut(self, max_depth: int) -> DraftTree:
        """The nodes no deeper than ``max_depth`` (a round near the end of the generation)."""
        keep = [i for i, d in enumerate(self.depths) if d <= max_depth]
        return reindex(self, keep)

    def target_ranks(self, accepted: Sequence[int], target_tokens: Sequence[int]) -> tuple[tuple[int, int, int], ...]:
        """``(depth, rank, candidates)`` of each position the target decided along the accepted path
        (``accepted`` nodes root to leaf, ``target_tokens`` its tokens there: the accepted ones, then the
        bonus), where the draft ranked candidates at the position's parent; rank −1: none of them."""
        out = []
        for d, tok in enumerate(target_tokens, start=1):
            parent = -1 if d == 1 else accepted[d - 2]
            cands = self.ranked.get(parent)
            if cands is not None:
                out.append((d, cands.index(tok) if tok in cands else -1, len(cands)))
        return tuple(out)


def reindex(tree: DraftTree, keep: Sequence[int]) -> DraftTree:
    """The nodes ``keep`` (closed under parents) in breadth-first order, parents and ``ranked`` re-indexed."""
    depths = tree.depths
    order = sorted(keep, key=lambda i: (depths[i], i))
    new = {old: k for k, old in enumerate(order)}
    new[-1] = -1
    return DraftTree(tuple(tree.tokens[i] for i in order),
                     tuple(new[tree.parents[i]] for i in order),
                     tuple(tree.ranks[i] for i in order),
                     {new[k]: v for k, v in tree.ranked.items() if k in new})


def _ancestry(parents: Sequence[int]) -> list[set[int]]:
    """Per node, itself and its ancestors (indices)."""
    out: list[set[int]] = []
    for i, p in enumerate(parents):
        out.append(({i} | out[p]) if p >= 0 else {i})
    return out


def _static_children(tree: TokenTree) -> dict[tuple[int, ...], tuple[int, ...]]:
    """Per node path (root ``()``), the ranks of its children in ``tree``."""
    out: dict[tuple[int, ...], list[int]] = {}
    for p in tree.paths:
        out.setdefault(p[:-1], []).append(p[-1])
    return {k: tuple(sorted(v)) for k, v in out.items()}


class _Growing:
    """A tree being drafted: its nodes so far, their cumulative draft log-probabilities and the ranked
    candidates of the nodes expanded (:class:`ModelTreeDrafter`)."""

    def __init__(self, option: TreeOption) -> None:
        self.option = option
        self.need = _static_children(option.paths) if option.paths is not None else None
        self.toks: list[int] = []
        self.pars: list[int] = []
        self.ranks: list[int] = []
        self.scores: list[float] = []
        self.depths: list[int] = []
        self.ranked: dict[int, tuple[int, ...]] = {}

    def path(self, i: int) -> tuple[int, ...]:
        out: list[int] = []
        while i >= 0:
            out.append(self.ranks[i])
            i = self.pars[i]
        return tuple(reversed(out))

    def wanted(self, parent: int) -> tuple[int, ...]:
        """The ranks of ``parent``'s children this tree drafts."""
        if self.need is None:
            return tuple(range(self.option.topk))
        return self.need.get(() if parent < 0 else self.path(parent), ())

    def add_children(self, parent: int, ids_l: list[int], vals_l: list[float]) -> None:
        """Rank the draft's candidates after ``parent`` (its best ids and their log-probabilities, best first,
        at least :attr:`k` of them), keep the wanted ones."""
        want = self.wanted(parent)
        assert len(ids_l) > max(want, default=-1), (len(ids_l), want)
        self.ranked[parent] = tuple(int(i) for i in ids_l[:RANKED])
        base = self.scores[parent] if parent >= 0 else 0.0
        for r in want:
            self.toks.append(int(ids_l[r]))
            self.pars.append(parent)
            self.ranks.append(r)
            self.scores.append(base + float(vals_l[r]))
            self.depths.append(1 if parent < 0 else self.depths[parent] + 1)

    def k(self, vocab_size: int) -> int:
        """Candidates to rank per expanded node: every rank the tree drafts and the :data:`RANKED` recorded."""
        return min(max(self.option.topk, RANKED), int(vocab_size))

    def to_expand(self, level: int) -> list[int]:
        """The nodes of depth ``level`` whose children are drafted: a path list's parents, or the beam's best."""
        prev = [i for i, d in enumerate(self.depths) if d == level]
        if self.need is not None:
            return [i for i in prev if self.wanted(i)]
        return sorted(prev, key=lambda i: (-self.scores[i], i))[:self.option.topk]

    def tree(self) -> DraftTree:
        """The drafted tree; a beam keeps its ``budget`` best nodes by cumulative log-probability."""
        tree = DraftTree(tuple(self.toks), tuple(self.pars), tuple(self.ranks), dict(self.ranked))
        if self.need is None and self.option.budget < len(self.toks):
            keep = sorted(range(len(self.toks)), key=lambda i: (-self.scores[i], self.depths[i], i))
            return reindex(tree, keep[:self.option.budget])
        return reindex(tree, range(len(self.toks)))


def tree_argmax(dec: TreeDecoder, ids: torch.Tensor, prefix_tokens: int, positions: torch.Tensor,
                visible: torch.Tensor) -> list[int]:
    """:meth:`~measure.seam.TreeDecoder.forward_tree`'s argmax per row, as host ints, by the decoder's
    ``forward_tree_argmax`` (on llama.cpp only ids cross the engine boundary)."""
    return dec.forward_tree_argmax(ids, prefix_tokens, positions, visible).tolist()


def tree_topk(dec: TreeDecoder, ids: torch.Tensor, prefix_tokens: int, positions: torch.Tensor,
              visible: torch.Tensor, k: int) -> tuple[list[list[int]], list[list[float]]]:
    """Per tree row its ``k`` best ids and their log-probabilities, as host lists, by ``forward_tree_topk``."""
    top, logp = dec.forward_tree_topk(ids, prefix_tokens, positions, visible, k)
    return top.tolist(), logp.tolist()


def last_topk(dec: Decoder, ids: torch.Tensor, k: int) -> tuple[list[int], list[float]]:
    """Feed ``ids`` ``[1, n]``; the last row's ``k`` best ids and log-probabilities, as host lists, by the
    decoder's ``forward_topk_logprobs``."""
    top, logp = dec.forward_topk_logprobs(ids, k, last_only=True)
    return top[0].tolist(), logp[0].tolist()


class ModelTreeDrafter:
    """Tree drafts from a :class:`~measure.drafts.ModelDraft` whose decoder is a :class:`~measure.seam.TreeDecoder`."""

    def __init__(self, draft: ModelDraft, option: TreeOption) -> None:
        if not isinstance(draft.decoder, TreeDecoder):
            raise ValueError(f"draft {draft.name!r}: its decoder has no tree forward (a transformers decoder, or "
                             "a llama.cpp one made for a tree run)")
        self.draft, self.option = draft, option
        self.decoder: TreeDecoder = draft.decoder

    def start(self, prompt_ids: torch.Tensor) -> None:
        self.draft.start(prompt_ids)

    @torch.inference_mode()
    def propose(self, tokens: torch.Tensor) -> DraftTree:
        """The tree after ``tokens`` ``[1, L]``; the draft's cache is left holding the ``L`` tokens."""
        dec = self.decoder
        L = int(tokens.shape[1])
        g = _Growing(self.option)
        k = g.k(dec.vocab_size)
        g.add_children(-1, *last_topk(dec, tokens[:, dec.n_cached:], k))  # the root's children
        fed: list[int] = []  # nodes in the draft cache's tree slots, in slot order
        for level in range(1, self.option.depth):
            expand = g.to_expand(level)
            if not expand:
                break
            anc = _ancestry(g.pars)
            slots = fed + expand
            vis = torch.tensor([[j in anc[i] for j in slots] for i in expand], dtype=torch.bool)
            pos = torch.tensor([L - 1 + g.depths[j] for j in slots], dtype=torch.long)
            ids = torch.tensor([[g.toks[i] for i in expand]], dtype=torch.long, device=tokens.device)
            tops, logps = tree_topk(dec, ids, L, pos, vis, k)  # per expanded node: its k best children
            fed = slots
            for i, top, logp in zip(expand, tops, logps):
                g.add_children(i, top, logp)
        dec.rollback(L)
        return g.tree()

    def observe(self, new_tokens: Sequence[int]) -> None:
        del new_tokens  # the draft catches up from the sequence on the next propose


def lookup_candidates(seq: Sequence[int], max_ngram: int, n_branches: int, length: int) -> list[tuple[int, ...]]:
    """Distinct continuations (≤ ``length`` tokens) of earlier occurrences of ``seq``'s tail, at most
    ``n_branches``: for n from ``max_ngram`` down to 1, each earlier occurrence of the last n tokens, the most
    recent first. The first is :class:`~measure.drafts.NGramDraft`'s own proposal (rule ``recent``)."""
    seq = list(seq)
    L = len(seq)
    out: list[tuple[int, ...]] = []
    seen: set[tuple[int, ...]] = set()
    for n in range(min(max_ngram, L - 1), 0, -1):
        tail = seq[L - n:]
        for s in range(L - n - 1, -1, -1):
            if seq[s:s + n] == tail:
                cont = tuple(seq[s + n:s + n + length])
                if cont and cont not in seen:
                    seen.add(cont)
                    out.append(cont)
                    if len(out) >= n_branches:
                        return out
    return out


def trie(conts: Sequence[Sequence[int]], depth: int) -> DraftTree:
    """The continuations ``conts`` merged into a trie (a child's rank: its order of appearance under its parent),
    with every node's children ranked (``ranked``), except at ``depth``, where continuations stop by length."""
    toks: list[int] = []
    pars: list[int] = []
    ranks: list[int] = []
    children: dict[int, dict[int, int]] = {-1: {}}  # node (-1 root) → token → child
    for cont in conts:
        node = -1
        for tok in cont:
            kids = children[node]
            if tok not in kids:
                kids[tok] = len(toks)
                toks.append(tok)
                pars.append(node)
                ranks.append(len(kids) - 1)
                children[len(toks) - 1] = {}
            node = kids[tok]
    tree = DraftTree(tuple(toks), tuple(pars), tuple(ranks))
    depths = tree.depths
    ranked = {k: tuple(v)[:RANKED] for k, v in children.items() if k < 0 or depths[k] < depth}
    return DraftTree(tree.tokens, tree.parents, tree.ranks, ranked)


class LookupTreeDrafter:
    """Multi-candidate prompt lookup: several earlier matches as branches of a trie (module docstring)."""

    def __init__(self, draft: NGramDraft, option: TreeOption) -> None:
        if draft.rule != "recent":
            raise ValueError(f"draft {draft.name!r} proposes one candidate and cannot branch; use ngram:N")
        self.draft, self.option = draft, option
        self.seq: list[int] = []

    def start(self, prompt_ids: torch.Tensor) -> None:
        self.seq = prompt_ids[0].tolist()

    def observe(self, new_tokens: Sequence[int]) -> None:
        self.seq.extend(int(t) for t in new_tokens)

    def propose(self, tokens: torch.Tensor) -> DraftTree:
        """The tree of this round's matches; its ``ranked`` from up to :data:`RANKED` matches (a tree of more
        matches only appends children: a child's rank does not depend on how many matches are drafted)."""
        opt = self.option
        L = int(tokens.shape[1])
        if len(self.seq) != L:  # a caller that does not observe(): read the sequence
            self.seq = tokens[0].tolist()
        n_branches = opt.topk if opt.paths is None else opt.budget
        conts = lookup_candidates(self.seq, self.draft.max_ngram, max(n_branches, RANKED), opt.depth)
        full = trie(conts, opt.depth)
        drafted = trie(conts[:n_branches], opt.depth)
        if opt.paths is not None:
            want = set(opt.paths.paths)
            keep = [i for i, p in enumerate(drafted.paths()) if p in want]
        else:
            keep = list(range(min(opt.budget, drafted.n_nodes)))  # creation order: a parent before its children
        kept = reindex(drafted, keep)
        return DraftTree(kept.tokens, kept.parents, kept.ranks, _ranked_from(kept, full))


def _ranked_from(tree: DraftTree, full: DraftTree) -> dict[int, tuple[int, ...]]:
    """``tree.ranked`` read from ``full``, a trie ``tree`` is part of (same ranks): the root and each node of
    ``tree`` get the candidates ``full`` ranked at the same path."""
    where = {p: i for i, p in enumerate(full.paths())}
    out = {-1: full.ranked[-1]} if -1 in full.ranked else {}
    for i, p in enumerate(tree.paths()):
        j = where[p]
        if j in full.ranked:
            out[i] = full.ranked[j]
    return out


def make_tree_drafter(draft: Draft, option: TreeOption) -> ModelTreeDrafter | LookupTreeDrafter:
    """The tree drafter for a loaded draft: a model draft's top-k, or multi-match prompt lookup."""
    if isinstance(draft, ModelDraft):
        return ModelTreeDrafter(draft, option)
    if isinstance(draft, NGramDraft):
        return LookupTreeDrafter(draft, option)
    raise ValueError(f"draft {draft.name!r} cannot draft a tree; valid: ngram:N or a model draft")


# -- verification ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class TreeVerdict:
    """What the target said of one tree: the accepted nodes (root to leaf), the target's next token after them."""

    accepted: tuple[int, ...]
    bonus: int


def accept_tree(tree: DraftTree, target_argmax: Sequence[int]) -> TreeVerdict:
    """Greedy: from the root, follow the child whose token is the target's argmax at its parent, while one is.

    ``target_argmax[0]`` is the target's choice after the root, ``[1 + i]`` after node ``i``.
    """
    children: dict[int, dict[int, int]] = {}
    for i, (p, t) in enumerate(zip(tree.parents, tree.tokens)):
        children.setdefault(p, {}).setdefault(t, i)
    node, path = -1, list[int]()
    while True:
        nxt = children.get(node, {}).get(int(target_argmax[node + 1]))
        if nxt is None:
            return TreeVerdict(tuple(path), int(target_argmax[node + 1]))
        path.append(nxt)
        node = nxt


def verify_tree(dec: TreeDecoder, tokens: torch.Tensor, tree: DraftTree) -> TreeVerdict:
    """One target forward over the root ``tokens[:, -1]`` and the tree's nodes, greedy acceptance, and the
    accepted path's KV moved into place: the cache then holds ``L + accepted`` positions (every emitted token
    but the bonus). ``dec`` holds the first ``L − 1`` of ``tokens`` ``[1, L]``."""
    L = int(tokens.shape[1])
    assert dec.n_cached == L - 1, (dec.n_cached, L)
    parents = (-1,) + tuple(p + 1 for p in tree.parents)  # index 0: the root
    anc = _ancestry(parents)
    m = len(parents)
    vis = torch.zeros(m, m, dtype=torch.bool)
    for i, a in enumerate(anc):
        vis[i, sorted(a)] = True
    depths = (0,) + tree.depths
    pos = torch.tensor([L - 1 + d for d in depths], dtype=torch.long)
    ids = torch.tensor([[0, *tree.tokens]], dtype=torch.long, device=tokens.device)
    ids[0, 0] = tokens[0, L - 1]
    am = tree_argmax(dec, ids, L - 1, pos, vis)  # [m]: the round's device-to-host transfer
    verdict = accept_tree(tree, am)
    dec.keep_slots(L, [L + i for i in verdict.accepted])
    return verdict


# -- the loop -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class TreeRoundRecord:
    """One tree round: the :class:`~measure.seam.RoundRecord` (``gamma`` = ``drafted`` = nodes); per node in
    breadth-first order its depth, rank, parent (-1: the root), token and whether it was accepted; and
    ``target_ranks``, the counterfactual record (:meth:`DraftTree.target_ranks`)."""

    round: RoundRecord
    depths: tuple[int, ...]
    ranks: tuple[int, ...]
    parents: tuple[int, ...]
    tokens: tuple[int, ...]
    accepted: tuple[bool, ...]
    target_ranks: tuple[tuple[int, int, int], ...] = ()


@dataclass(frozen=True)
class TreeGeneration:
    """A tree generation: the result every loop returns, and the per-node record of each round."""

    result: GenerationResult
    tree_rounds: tuple[TreeRoundRecord, ...]


@dataclass(frozen=True)
class _Round:
    """What one round did, kept until the generation ends (its records are made then, off the clock)."""

    context_tokens: int
    tree: DraftTree
    verdict: TreeVerdict
    marks: tuple[Any, Any, Any, Any]

    def record(self, index: int, timer: Timer) -> TreeRoundRecord:
        m0, m1, m2, m3 = self.marks
        tree, verdict = self.tree, self.verdict
        d_ms, v_ms, tot_ms = timer.elapsed_ms(m0, m1), timer.elapsed_ms(m1, m2), timer.elapsed_ms(m0, m3)
        rr = RoundRecord(round=index, gamma=tree.n_nodes, context_tokens=self.context_tokens, drafted=tree.n_nodes,
                         accepted=len(verdict.accepted), draft_ms=d_ms, verify_ms=v_ms,
                         overhead_ms=max(0.0, tot_ms - d_ms - v_ms))
        acc = set(verdict.accepted)
        said = [tree.tokens[i] for i in verdict.accepted] + [verdict.bonus]
        return TreeRoundRecord(rr, tree.depths, tree.ranks, tree.parents, tree.tokens,
                               tuple(j in acc for j in range(tree.n_nodes)),
                               tree.target_ranks(verdict.accepted, said))


def _checked_decoder(dec: Any, temperature: float) -> TreeDecoder:
    if check_temperature(temperature) > 0:
        raise ValueError(f"temperature {temperature:g}: token trees are greedy only until multi-candidate "
                         "rejection sampling is built; valid: 0")
    if not isinstance(dec, TreeDecoder):
        raise ValueError(f"decoder {type(dec).__name__}: it has no tree forward (a transformers decoder, or a "
                         "llama.cpp one made for a tree run: EngineOptions.tree_sequences)")
    return dec


def tree_generate(dec: TreeDecoder, drafter: Any, input_ids: torch.Tensor, temperature: float = 0.0,
                  max_new_tokens: int = 64, eos_token_ids: Sequence[int] = (),
                  timer: Timer | None = None) -> TreeGeneration:
    """Greedy tree speculation with the target's decoder ``dec`` (reset first) and a tree ``drafter``
    (:func:`make_tree_drafter`).

    The first token comes from the target's prefill, as in the baseline; a
    round drafts a tree (cut to the tokens still wanted), verifies it in one
    target forward, keeps the accepted path and the target's next token.
    """
    dec = _checked_decoder(dec, temperature)
    dev = input_ids.device
    timer = timer or Timer(dev)
    eos = set(eos_token_ids)
    dec.reset()
    S = int(input_ids.shape[1])
    buf = torch.empty(1, S + max_new_tokens + 1, dtype=torch.long, device=dev)  # [1, S + N + 1]
    buf[:, :S] = input_ids
    t0 = timer.now_s()
    first = int(dec.forward_argmax(input_ids, last_only=True))
    buf[0, S] = first
    drafter.start(input_ids)
    drafter.observe([first])
    last = time.perf_counter()
    out, lat = [first], [(last - t0) * 1e3]
    rounds: list[_Round] = []
    L = S + 1
    done = first in eos or max_new_tokens <= 1
    while not done:
        room = max_new_tokens - len(out) - 1
        m0 = timer.mark()
        tree = drafter.propose(buf[:, :L])
        if room < drafter.option.depth:
            tree = tree.cut(room)
        m1 = timer.mark()
        verdict = verify_tree(dec, buf[:, :L], tree)
        m2 = timer.mark()
        new = [tree.tokens[i] for i in verdict.accepted] + [verdict.bonus]
        buf[0, L:L + len(new)] = torch.tensor(new, dtype=torch.long)
        cut = next((i for i, t in enumerate(new) if t in eos), None)
        if cut is not None:
            new, done = new[:cut + 1], True
        new = new[:max_new_tokens - len(out)]
        out.extend(new)
        drafter.observe(new)
        L += len(new)
        done = done or len(out) >= max_new_tokens
        if L - 1 < dec.n_cached:  # tokens dropped at the end (EOS or the budget): the cache follows
            dec.rollback(L - 1)
        m3 = timer.mark()
        now = time.perf_counter()
        lat.extend([(now - last) * 1e3] + [0.0] * (len(new) - 1))
        last = now
        rounds.append(_Round(L - len(new), tree, verdict, (m0, m1, m2, m3)))
    tree_rounds = tuple(r.record(i, timer) for i, r in enumerate(rounds))
    result = GenerationResult(tokens=tuple(out), prompt_tokens=S, wall_s=last - t0, ttft_ms=lat[0],
                              token_latency_ms=tuple(lat), rounds=tuple(t.round for t in tree_rounds))
    return TreeGeneration(result, tree_rounds)


__all__ = [
    "LLAMACPP_MAX_SEQUENCES",
    "RANKED",
    "TREE_ENGINES",
    "TREE_KEYS",
    "DraftTree",
    "LookupTreeDrafter",
    "ModelTreeDrafter",
    "TreeGeneration",
    "TreeOption",
    "TreeRoundRecord",
    "TreeVerdict",
    "accept_tree",
    "beam_nodes",
    "can_branch",
    "check_tree_option",
    "last_topk",
    "lookup_candidates",
    "make_tree_drafter",
    "parse_tree_option",
    "reindex",
    "tree_argmax",
    "tree_generate",
    "tree_sequences",
    "tree_topk",
    "trie",
    "verify_tree",
]
