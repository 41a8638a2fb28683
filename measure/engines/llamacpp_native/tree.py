"""A token tree verified in one ``llama_decode``: the llama.cpp worker's tree context (no torch here).

A tree round feeds the root (the last emitted token) and every drafted node in
**one** ``llama_batch``. Each token sits at position ``context + depth`` and
carries the sequence ids of the root-to-leaf paths through it (the leaves of
the batch below it, one sequence each); before the decode, each such sequence
gets the committed context (``llama_memory_seq_cp`` from sequence 0, or from
the sequence of the cached node the path hangs from), which in a unified KV
cache only adds the id to the context's cells: no key or value is copied.

Why that is the tree mask (read in llama.cpp's ``src/llama-kv-cache.cpp``,
``set_input_kq_mask_impl``, and ``src/llama-batch.cpp``, vendored by
llama-cpp-python 0.3.36): a batch token's cell gets *all* its sequence ids
(``seq_add`` for each), but its row of the KQ mask is built from its **first**
sequence id only (``ubatch->seq_id[i][0]``): a cell ``j`` is visible to token
``i`` iff ``j`` holds that sequence and ``pos(j) ≤ pos(i)`` (causal). Token
``i``'s first sequence ``s`` is a path through ``i``; the cells holding ``s``
are the context, the nodes on that path above ``i`` (its ancestors: every
ancestor carries every path through its descendants, ``s`` included), ``i``
itself, and nodes of the path below ``i``, which have larger positions and
are masked by causality. Siblings and cousins share a position with no node of
``s`` other than the path's own, so no other node is seen: exactly the
ancestors, as on the transformers engine's 4D mask. (llama.cpp's reuse of one
row for later tokens of the same first sequence recomputes the cells near the
batch's positions: a row depends only on ``(seq_id[0], pos)``, so it holds.)
The batch checks pass by construction: a sequence's tokens are one path (its
positions continue its cache, ``context .. context + depth``); the ids a token
carries were all copied from the same cells, so "coupled" sequences have the
same extent; along a path the sets shrink to the path's own id, never empty.

What a tree needs from the context is what llama.cpp's own tree speculation
(``examples/speculative``, ``--n-parallel`` branches) needs, and nothing more:
``n_seq_max`` at least the sequences a round uses, and a unified KV cache
(``kv_unified``: without it a token of several sequences is refused — "you
may need to use the -kvu flag" — and ``seq_cp`` would copy cells between
streams). :class:`~measure.engines.llamacpp_native.runtime.ContextSettings`
sets those two only for a tree run's contexts.

After verification, :meth:`TreeContext.keep` keeps only the accepted path as
``examples/speculative`` does (``seq_rm`` of the path's sequence past the last
accepted node, ``seq_keep`` of it, ``seq_cp`` to sequence 0, ``seq_keep(0)``):
the cache then holds exactly the context and the accepted tokens, in
sequence 0, and the next round starts from there. A model draft uses the same
context level by level: the nodes it expands are one batch per level, each
hanging from a node fed before (its sequence copied up to that node).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from measure.engines.llamacpp_native.runtime import Context, ContextSettings, Model, top_logprobs

#: What a tree forward sends back: every row's logits, its argmax, or its best ids with their log-probabilities.
OUTPUTS = ("logits", "argmax", "topk")


@dataclass(frozen=True)
class Slot:
    """A tree token in the cache: its position, the first sequence it carries (a path through it) and its
    parent (-1: the committed context's last position, else a slot index)."""

    pos: int
    seq: int
    parent: int


class TreeContext(Context):
    """A :class:`~measure.engines.llamacpp_native.runtime.Context` with several sequences in a unified KV cache.

    Sequence 0 holds the committed tokens (``committed`` of them); tree tokens fed by :meth:`tree` follow as
    slots ``committed, committed + 1, …`` (``n_cached`` counts both) until :meth:`keep` or :meth:`rollback`
    leaves sequence 0 alone again. Plain :meth:`forward` / :meth:`argmax` / :meth:`topk` feed sequence 0 and
    need no tree slots pending.
    """

    def __init__(self, ll: Any, model: Model, settings: ContextSettings) -> None:
        super().__init__(ll, model, settings)
        self._n_seq_id = np.ctypeslib.as_array(self._batch.n_seq_id, shape=(self.n_batch,))
        self.committed = 0
        self.slots: list[Slot] = []
        self._next_seq = 1
        self._dirty = 0  # batch entries whose sequence ids a tree forward changed

    # -- the committed sequence ------------------------------------------------------------------
    def _chain_only(self, what: str) -> None:
        if self.slots:
            raise ValueError(f"{what} with {len(self.slots)} tree tokens pending: keep or roll back first")
        if self._dirty:
            for i in range(self._dirty):
                self._n_seq_id[i] = 1
                self._batch.seq_id[i][0] = 0
            self._dirty = 0

    def _decode(self, ids: list[int], out_rows: int) -> np.ndarray:
        self._chain_only("forward")
        out = super()._decode(ids, out_rows)
        self.committed = self.n_cached
        return out

    def reset(self) -> None:
        """Empty the cache (a new sequence)."""
        super().reset()
        self.committed = 0
        self._forget_tree()

    def _forget_tree(self) -> None:
        self.slots = []
        self._next_seq = 1
        self.n_cached = self.committed

    def rollback(self, n_tokens: int) -> None:
        """Keep the first ``n_tokens`` positions: past ``committed``, a path of tree slots (:meth:`keep`)."""
        if n_tokens < 0:
            raise ValueError(f"rollback to {n_tokens} tokens")
        if n_tokens >= self.n_cached:
            return
        if n_tokens > self.committed:
            self.keep(n_tokens, [])
            return
        mem = self._mem
        if self.slots or self._next_seq > 1:
            self._ll.llama_memory_seq_keep(mem, 0)  # every tree cell (never in sequence 0) goes
        if n_tokens < self.committed and not self._ll.llama_memory_seq_rm(mem, 0, int(n_tokens), -1):
            raise RuntimeError(f"llama.cpp could not remove positions {n_tokens}.. from its cache")
        self.committed = int(n_tokens)
        self._forget_tree()

    # -- the tree --------------------------------------------------------------------------------
    def _positions(self, parents: list[int]) -> list[int]:
        """Each new token's position (its parent's + 1); ``ValueError`` for a parent that is not a tree slot,
        the context (-1) or an earlier token of this batch."""
        base, pos = self.n_cached, []
        for i, p in enumerate(parents):
            if p == -1:
                pos.append(self.committed)
            elif self.committed <= p < base:
                pos.append(self.slots[p - self.committed].pos + 1)
            elif base <= p < base + i:
                pos.append(pos[p - base] + 1)
            else:
                raise ValueError(f"tree token {i}: parent slot {p} is neither the context (-1), a cached tree slot "
                                 f"({self.committed}..{base - 1}) nor an earlier token of the batch")
        return pos

    def _sequences(self, parents: list[int], pos: list[int]) -> list[list[int]]:
        """Per new token the sequences it carries: one per leaf of the batch below it, each first given the
        context and the cached nodes its path hangs from (``llama_memory_seq_cp``, shared cells)."""
        base, n = self.n_cached, len(parents)
        inner = {p - base for p in parents if p >= base}
        leaves = [i for i in range(n) if i not in inner]
        if self._next_seq + len(leaves) > self.n_seq_max:
            raise ValueError(f"tree forward: {len(leaves)} new paths need sequences up to "
                             f"{self._next_seq + len(leaves) - 1}, above this context's n_seq_max "
                             f"{self.n_seq_max} (the run's tree_sequences)")
        seqs: list[list[int]] = [[] for _ in range(n)]
        for leaf in leaves:
            s, j = self._next_seq, leaf
            self._next_seq += 1
            while True:
                seqs[j].append(s)
                if parents[j] < base:
                    break
                j = parents[j] - base
            anchor = parents[j]  # the cached slot (or the context: sequence 0) the path hangs from
            src = 0 if anchor < 0 else self.slots[anchor - self.committed].seq
            self._ll.llama_memory_seq_cp(self._mem, src, s, -1, int(pos[j]))  # positions < pos[j]: its path
        return seqs

    def tree(self, ids: list[int], parents: list[int], out: str = "logits", k: int = 0) -> Any:
        """Feed tree tokens ``ids`` in one ``llama_decode``, token ``i`` a child of ``parents[i]`` (-1: the
        committed context; a cached tree slot; or ``n_cached + j`` for an earlier token ``j`` of this batch),
        every row's output coming back as ``out`` (:data:`OUTPUTS`: logits ``[m, V]``, argmax ids, or the ``k``
        best ids and their log-probabilities)."""
        n = len(ids)
        if out not in OUTPUTS:
            raise ValueError(f"tree output {out!r}; valid: {', '.join(OUTPUTS)}")
        if len(parents) != n:
            raise ValueError(f"tree forward of {n} tokens with {len(parents)} parents")
        self._check_room(n)
        pos = self._positions(parents)
        seqs = self._sequences(parents, pos)
        b = self._batch
        self._tok[:n] = ids
        self._pos[:n] = pos
        self._logit_flags[:n] = 1
        for i, ss in enumerate(seqs):
            self._n_seq_id[i] = len(ss)
            for j, s in enumerate(ss):
                b.seq_id[i][j] = s
        self._dirty = max(self._dirty, n)
        base = self.n_cached
        rows = self._run(n, n)
        self.slots += [Slot(p, ss[0], q) for p, ss, q in zip(pos, seqs, parents)]
        assert self.n_cached == base + n == self.committed + len(self.slots)
        if out == "logits":
            return rows.copy()
        if out == "argmax":
            return rows.argmax(-1).tolist()
        return top_logprobs(rows, k)

    def keep(self, start: int, slots: list[int]) -> None:
        """Keep the first ``start`` positions and then the tree slots ``slots``: together one path from the
        committed context (``ValueError`` otherwise), which becomes sequence 0's continuation."""
        c = self.committed
        if start < c:
            if slots:
                raise ValueError(f"keep slots {slots} after {start} < the {c} committed positions")
            self.rollback(start)
            return
        chain = list(range(c, min(start, self.n_cached))) + [int(s) for s in slots]
        for k, s in enumerate(chain):
            if not c <= s < self.n_cached or self.slots[s - c].parent != (chain[k - 1] if k else -1):
                raise ValueError(f"keep {chain}: slot {s} does not continue the path (its parent is not the slot "
                                 "before it)")
        if not chain:
            self.rollback(c)
            return
        last = self.slots[chain[-1] - c]
        ll, mem = self._ll, self._mem
        ll.llama_memory_seq_rm(mem, last.seq, last.pos + 1, -1)  # the path's nodes below the last kept one
        ll.llama_memory_seq_keep(mem, last.seq)  # every other path's cells go
        ll.llama_memory_seq_cp(mem, last.seq, 0, -1, -1)
        ll.llama_memory_seq_keep(mem, 0)
        self.committed = c + len(chain)
        self._forget_tree()

    def cached_positions(self) -> dict[int, list[int]]:
        """Per sequence holding cells, its lowest and highest position (what a test checks after a round)."""
        out = {}
        for s in range(self.n_seq_max):
            hi = int(self._ll.llama_memory_seq_pos_max(self._mem, s))
            if hi >= 0:
                out[s] = [int(self._ll.llama_memory_seq_pos_min(self._mem, s)), hi]
        return out


__all__ = ["OUTPUTS", "Slot", "TreeContext"]
