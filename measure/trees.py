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
  ``int8``, ``bf16``, ``fp16``) drafts level by level, one draft forward per
  level over the nodes it expands, each under a tree mask over the draft's own
  cache. With ``depth/topk/budget`` it drafts as SGLang's EAGLE: the top
  ``topk`` children of the root, then the top ``topk`` children of each of the
  ``topk`` best nodes of the level above (by cumulative draft log-probability),
  and keeps the ``budget`` best nodes of all of them. With a path list it drafts
  exactly those ranks. Prompt lookup (``ngram:N``) branches over several earlier
  matches: the distinct continuations of the tail's earlier occurrences (the
  longest n-gram first, the most recent first; rank 0 is the chain draft's own
  proposal), merged into a trie. ``ngram:N:first`` (one candidate by
  construction) cannot branch.
* :func:`verify_tree` — the target verifies the root (the last emitted token)
  and every node in **one** forward: each token sees the committed context and
  its ancestors (a 4D mask), at position ``L − 1 + depth``; greedy acceptance is
  the longest path whose every token is the target's argmax at its parent, and
  the accepted path's KV entries are moved into place (no re-run).
* :func:`tree_generate` — the loop (greedy only: a tree at temperature > 0 is
  refused until multi-candidate rejection sampling is built), returning the
  chain loop's :class:`~measure.decoding.GenerationResult` and one
  :class:`TreeRoundRecord` per round (each node's depth, rank, parent, token,
  accepted or not).

Decoders: the tree forward needs a decoder with ``forward_tree`` and
``keep_slots`` (:class:`~measure.engines.transformers.TransformersDecoder`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from measure.decoding import (
    GenerationResult,
    RoundRecord,
    check_temperature,
    decoder_argmax,
    loop_decoder,
)
from measure.timing import Timer
from sim.tree_cli import DEPTH_LIMIT, NODES_LIMIT, NODES_WHY
from sim.trees import TokenTree

#: The keys of ``--tree depth=D,topk=K,budget=N``.
TREE_KEYS = ("depth", "topk", "budget")
#: Draft kinds that branch from the draft model's top-k (transformers engine).
MODEL_KINDS = ("model", "early", "layers", "int8", "bf16", "fp16")
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
    if engine != "transformers":
        raise ValueError(f"--tree {label} with --engine {engine}: tree verification is built for the "
                         "transformers engine only; valid: --engine transformers")
    if temperature > 0:
        raise ValueError(f"--tree {label} at --temperature {temperature:g}: trees are greedy only until "
                         "multi-candidate rejection sampling is built; valid: --temperature 0")
    if not option.is_chain and not can_branch(draft_spec):
        raise ValueError(f"--tree {label} with --draft {draft_spec}: this lookup proposes one candidate (the "
                         "earliest match) and cannot branch; valid: ngram:N (several earlier matches as branches), "
                         "a model draft (model:, early:N, layers:, int8, bf16, fp16), or a chain (topk=1)")
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


def vocab_tokens(spec: str) -> int | None:
    """The vocabulary size of model ``spec`` without loading weights, where its config says (a local directory,
    a cached hub id, a synthetic preset); None otherwise (a GGUF: checked once the target is loaded)."""
    from measure.models import _is_transformers_spec, preset_models

    spec = str(spec)
    if spec.startswith("synthetic:"):
        model = preset_models().get(spec[len("synthetic:"):])
        return int(model.vocab_size) if model is not None else None
    if spec.startswith("gguf:") or not _is_transformers_spec(spec):
        return None
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(spec, local_files_only=True)
    except (OSError, ValueError, KeyError):
        return None
    n = getattr(cfg.get_text_config(), "vocab_size", None)
    return int(n) if isinstance(n, int) and n > 0 else None


# -- draft trees --------------------------------------------------------------------------------
@dataclass(frozen=True)
class DraftTree:
    """One round's drafted tree, breadth-first (a parent before its children): per node its token, its
    parent's index (-1: the root, the last emitted token) and its rank among its parent's candidates."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    ranks: tuple[int, ...]

    def __post_init__(self) -> None:
        assert len(self.tokens) == len(self.parents) == len(self.ranks)
        assert all(-1 <= p < i for i, p in enumerate(self.parents))

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
        return _reindex(self, keep)


def _reindex(tree: DraftTree, keep: Sequence[int]) -> DraftTree:
    """The nodes ``keep`` (closed under parents) in breadth-first order, parents re-indexed."""
    depths = tree.depths
    order = sorted(keep, key=lambda i: (depths[i], i))
    new = {old: k for k, old in enumerate(order)}
    return DraftTree(tuple(tree.tokens[i] for i in order),
                     tuple(new[tree.parents[i]] if tree.parents[i] >= 0 else -1 for i in order),
                     tuple(tree.ranks[i] for i in order))


def _ancestry(parents: Sequence[int]) -> list[set[int]]:
    """Per node, itself and its ancestors (indices)."""
    out: list[set[int]] = []
    for i, p in enumerate(parents):
        out.append(({i} | out[p]) if p >= 0 else {i})
    return out


class ModelTreeDrafter:
    """Tree drafts from a :class:`~measure.drafts.ModelDraft` (its decoder needs ``forward_tree``)."""

    def __init__(self, draft: Any, option: TreeOption) -> None:
        if not hasattr(draft.decoder, "forward_tree"):
            raise ValueError(f"draft {draft.name!r}: its decoder has no tree forward (transformers engine only)")
        self.draft, self.option = draft, option

    def start(self, prompt_ids: torch.Tensor) -> None:
        self.draft.start(prompt_ids)

    @torch.inference_mode()
    def propose(self, tokens: torch.Tensor) -> DraftTree:
        """The tree after ``tokens`` ``[1, L]``; the draft's cache is left holding the ``L`` tokens."""
        opt, dec = self.option, self.draft.decoder
        L = int(tokens.shape[1])
        logits = dec.forward(tokens[:, dec.n_cached:], last_only=True)  # [1, V]: the root's children
        toks: list[int] = []
        pars: list[int] = []
        ranks: list[int] = []
        scores: list[float] = []
        depths: list[int] = []
        rank_path: dict[tuple[int, ...], int] = {}
        need = _static_children(opt.paths) if opt.paths is not None else None

        def add_children(parent: int, row: torch.Tensor, base: float) -> None:
            path = () if parent < 0 else _path(parent)
            want = (need.get(path, ()) if need is not None else range(opt.topk))
            if not want:
                return
            logp = torch.log_softmax(row.float(), -1)
            vals, ids = torch.topk(logp, max(want) + 1)
            for r in want:
                toks.append(int(ids[r]))
                pars.append(parent)
                ranks.append(r)
                scores.append(base + float(vals[r]))
                depths.append(1 if parent < 0 else depths[parent] + 1)
                rank_path[path + (r,)] = len(toks) - 1

        def _path(i: int) -> tuple[int, ...]:
            out: list[int] = []
            while i >= 0:
                out.append(ranks[i])
                i = pars[i]
            return tuple(reversed(out))

        add_children(-1, logits[0], 0.0)
        fed: list[int] = []  # nodes in the draft cache's tree slots, in slot order
        for level in range(2, opt.depth + 1):
            prev = [i for i, d in enumerate(depths) if d == level - 1]
            if need is not None:
                expand = [i for i in prev if need.get(_path(i))]
            else:
                expand = sorted(prev, key=lambda i: (-scores[i], i))[:opt.topk]
            if not expand:
                break
            anc = _ancestry(pars)
            slots = fed + expand
            vis = torch.tensor([[j in anc[i] for j in slots] for i in expand], dtype=torch.bool)
            pos = torch.tensor([L - 1 + depths[j] for j in slots], dtype=torch.long)
            ids = torch.tensor([[toks[i] for i in expand]], dtype=torch.long, device=tokens.device)
            rows = dec.forward_tree(ids, L, pos, vis)  # [w, V]
            fed = slots
            for i, row in zip(expand, rows):
                add_children(i, row, scores[i])
        dec.rollback(L)
        tree = DraftTree(tuple(toks), tuple(pars), tuple(ranks))
        if need is None and opt.budget < len(toks):  # the budget best by cumulative log-probability
            keep = sorted(range(len(toks)), key=lambda i: (-scores[i], depths[i], i))[:opt.budget]
            return _reindex(tree, keep)
        return _reindex(tree, range(len(toks)))

    def observe(self, new_tokens: Sequence[int]) -> None:
        del new_tokens  # the draft catches up from the sequence on the next propose


def _static_children(tree: TokenTree) -> dict[tuple[int, ...], tuple[int, ...]]:
    """Per node path (root ``()``), the ranks of its children in ``tree``."""
    out: dict[tuple[int, ...], list[int]] = {}
    for p in tree.paths:
        out.setdefault(p[:-1], []).append(p[-1])
    return {k: tuple(sorted(v)) for k, v in out.items()}


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


class LookupTreeDrafter:
    """Multi-candidate prompt lookup: several earlier matches as branches of a trie (module docstring)."""

    def __init__(self, draft: Any, option: TreeOption) -> None:
        if getattr(draft, "rule", "recent") != "recent":
            raise ValueError(f"draft {draft.name!r} proposes one candidate and cannot branch; use ngram:N")
        self.draft, self.option = draft, option
        self.seq: list[int] = []

    def start(self, prompt_ids: torch.Tensor) -> None:
        self.seq = prompt_ids[0].tolist()

    def observe(self, new_tokens: Sequence[int]) -> None:
        self.seq.extend(int(t) for t in new_tokens)

    def propose(self, tokens: torch.Tensor) -> DraftTree:
        opt = self.option
        L = int(tokens.shape[1])
        if len(self.seq) != L:  # a caller that does not observe(): read the sequence
            self.seq = tokens[0].tolist()
        n_branches = opt.topk if opt.paths is None else opt.budget
        conts = lookup_candidates(self.seq, self.draft.max_ngram, n_branches, opt.depth)
        toks: list[int] = []
        pars: list[int] = []
        ranks: list[int] = []
        children: dict[int, dict[int, int]] = {}  # node (-1 root) → token → child
        for cont in conts:
            node = -1
            for tok in cont:
                kids = children.setdefault(node, {})
                if tok not in kids:
                    kids[tok] = len(toks)
                    toks.append(tok)
                    pars.append(node)
                    ranks.append(len(kids) - 1)
                node = kids[tok]
        tree = DraftTree(tuple(toks), tuple(pars), tuple(ranks))
        if opt.paths is not None:
            want = set(opt.paths.paths)
            keep = [i for i, p in enumerate(tree.paths()) if p in want]
        else:
            keep = list(range(min(opt.budget, len(toks))))  # creation order: a parent before its children
        return _reindex(tree, keep)


def make_tree_drafter(draft: Any, option: TreeOption) -> Any:
    """The tree drafter for a loaded draft: a model draft's top-k, or multi-match prompt lookup."""
    if getattr(draft, "decoder", None) is not None:
        return ModelTreeDrafter(draft, option)
    if getattr(draft, "kind", None) == "ngram":
        return LookupTreeDrafter(draft, option)
    raise ValueError(f"draft {getattr(draft, 'name', draft)!r} cannot draft a tree; valid: ngram:N or a model draft")


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


def verify_tree(dec: Any, tokens: torch.Tensor, tree: DraftTree) -> TreeVerdict:
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
    am = dec.forward_tree(ids, L - 1, pos, vis).argmax(-1).tolist()  # [m]: the round's device-to-host transfer
    verdict = accept_tree(tree, am)
    dec.keep_slots(L, [L + i for i in verdict.accepted])
    return verdict


# -- the loop -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class TreeRoundRecord:
    """One tree round: the :class:`~measure.decoding.RoundRecord` (``gamma`` = ``drafted`` = nodes) and, per
    node in breadth-first order, its depth, rank, parent (-1: the root), token and whether it was accepted."""

    round: RoundRecord
    depths: tuple[int, ...]
    ranks: tuple[int, ...]
    parents: tuple[int, ...]
    tokens: tuple[int, ...]
    accepted: tuple[bool, ...]


@dataclass(frozen=True)
class TreeGeneration:
    """A tree generation: the result every loop returns, and the per-node record of each round."""

    result: GenerationResult
    tree_rounds: tuple[TreeRoundRecord, ...]


def tree_generate(target: Any, drafter: Any, input_ids: torch.Tensor, temperature: float = 0.0,
                  max_new_tokens: int = 64, eos_token_ids: Sequence[int] = (),
                  timer: Timer | None = None) -> TreeGeneration:
    """Greedy tree speculation of ``target`` with a tree ``drafter`` (:func:`make_tree_drafter`).

    The first token comes from the target's prefill, as in the baseline; a
    round drafts a tree (cut to the tokens still wanted), verifies it in one
    target forward, keeps the accepted path and the target's next token.
    """
    if check_temperature(temperature) > 0:
        raise ValueError(f"temperature {temperature:g}: token trees are greedy only until multi-candidate "
                         "rejection sampling is built; valid: 0")
    dev = input_ids.device
    timer = timer or Timer(dev)
    eos = set(eos_token_ids)
    dec = loop_decoder(target)
    if not hasattr(dec, "forward_tree"):
        raise ValueError(f"target {getattr(target, 'name', '')!r}: its decoder has no tree forward "
                         "(transformers engine only)")
    dec.reset()
    S = int(input_ids.shape[1])
    buf = torch.empty(1, S + max_new_tokens + 1, dtype=torch.long, device=dev)
    buf[:, :S] = input_ids
    t0 = timer.now_s()
    first = int(decoder_argmax(dec, input_ids, last_only=True))
    buf[0, S] = first
    drafter.start(input_ids)
    drafter.observe([first])
    last = time.perf_counter()
    out, lat = [first], [(last - t0) * 1e3]
    raw: list[tuple] = []
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
        n = len(verdict.accepted)
        buf[0, L:L + n + 1] = torch.tensor(new, dtype=torch.long)
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
        raw.append((L - len(new), tree, verdict, (m0, m1, m2, m3)))
    tree_rounds = []
    for i, (ctx, tree, verdict, (m0, m1, m2, m3)) in enumerate(raw):
        d_ms, v_ms, tot_ms = timer.elapsed_ms(m0, m1), timer.elapsed_ms(m1, m2), timer.elapsed_ms(m0, m3)
        rr = RoundRecord(round=i, gamma=tree.n_nodes, context_tokens=ctx, drafted=tree.n_nodes,
                         accepted=len(verdict.accepted), draft_ms=d_ms, verify_ms=v_ms,
                         overhead_ms=max(0.0, tot_ms - d_ms - v_ms))
        acc = set(verdict.accepted)
        tree_rounds.append(TreeRoundRecord(rr, tree.depths, tree.ranks, tree.parents, tree.tokens,
                                           tuple(j in acc for j in range(tree.n_nodes))))
    result = GenerationResult(tokens=tuple(out), prompt_tokens=S, wall_s=last - t0, ttft_ms=lat[0],
                              token_latency_ms=tuple(lat), rounds=tuple(t.round for t in tree_rounds))
    return TreeGeneration(result, tuple(tree_rounds))


__all__ = [
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
    "lookup_candidates",
    "make_tree_drafter",
    "parse_tree_option",
    "tree_generate",
    "verify_tree",
    "vocab_tokens",
]
