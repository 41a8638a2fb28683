"""Pruned draft vocabulary head: dynamic top-K (clustered, low-rank) and static (frequency) subsets.

The draft's ``lm_head`` (``[V, H]``) is replaced by :class:`PrunedLMHead`, which
projects the last hidden state onto ``K`` vocabulary rows only:

* ``variant="clustered"`` — score the hidden state against the offline token
  clusters (:mod:`measure.head.clusters`), take the best clusters until ``K`` tokens
  are covered (the last cluster is cut so exactly ``K`` are kept), gather those
  rows and project onto them. Fully vectorised, fixed shape ``[N, K]``, no host
  synchronisation (``searchsorted`` over the cumulative cluster sizes).
* ``variant="lowrank"`` — rank every token by approximate logits from the
  data-aware low-rank scorer of :mod:`measure.head.lowrank` (``V * r`` multiply-adds)
  and keep the ``K`` best (``topk``); always-keep tokens score ``+inf``.
* ``variant="frequency"`` — a static subset: the ``K`` most frequent tokens of
  a calibration text (FR-Spec / VocabTrim style); its rows are sliced once.
* ``variant="dense"`` — the full head (``K = V``), for the baseline rows.

Always-keep tokens (EOS, optionally the most frequent tokens) are placed first
and count towards ``K``.

``forward`` is a drop-in replacement for ``nn.Linear``: it returns full
vocabulary logits ``[..., V]`` with ``-inf`` outside the kept set, so greedy
argmax and rejection sampling in the common decoding loop work unchanged — the
draft's ``q = softmax(logits)`` is renormalised over, and supported exactly on,
the kept tokens, and verification against the target stays exact.
:meth:`PrunedLMHead.project` is the fast path returning ``(ids, logits)`` of
the kept tokens only, and :meth:`PrunedLMHead.greedy` the argmax token ids.

On CUDA the gather + projection (+ argmax) runs the Triton kernel of
:mod:`measure.head.triton_head` when Triton is installed; the torch code here is the
CPU implementation and the reference the kernel is tested against.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from measure.head.clusters import TokenClusters
from measure.head.lowrank import LowRankScorer

__all__ = [
    "VARIANTS",
    "PrunedLogits",
    "validate_head_k",
    "parse_head_k",
    "token_frequencies",
    "frequency_ranking",
    "ClusterSelector",
    "LowRankSelector",
    "PrunedLMHead",
    "torch_gather_project",
    "lm_head_of",
    "install_lm_head",
    "swapped_lm_head",
]

VARIANTS = ("dense", "clustered", "lowrank", "frequency")
DYNAMIC_VARIANTS = ("clustered", "lowrank")
_BACKENDS = ("auto", "torch", "triton")
# elements of the gathered [rows, K, H] block processed at once by the torch path
_CHUNK_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class PrunedLogits:
    """Kept token ids ``[N, K]`` (int64) and their logits ``[N, K]`` (float32)."""

    ids: torch.Tensor
    logits: torch.Tensor

    def __post_init__(self) -> None:
        if self.ids.shape != self.logits.shape:
            raise ValueError(f"ids {tuple(self.ids.shape)} and logits {tuple(self.logits.shape)} differ")


def validate_head_k(head_k: int, vocab_size: int, n_always_keep: int = 0) -> int:
    """Check ``1 <= n_always_keep <= head_k <= vocab_size``; return ``head_k`` as int."""
    if isinstance(head_k, bool) or not isinstance(head_k, int):
        raise ValueError(f"head_k={head_k!r} must be an integer in [1, {vocab_size}]")
    if head_k < 1:
        raise ValueError(f"head_k={head_k} is < 1; valid range is 1..{vocab_size} (the vocabulary size)")
    if head_k > vocab_size:
        raise ValueError(
            f"head_k={head_k} exceeds the vocabulary size {vocab_size} of this head; "
            f"valid range is 1..{vocab_size} (use 'full' for the dense head)"
        )
    if head_k < n_always_keep:
        raise ValueError(
            f"head_k={head_k} is smaller than the {n_always_keep} always-keep tokens; "
            f"use head_k >= {n_always_keep} or keep fewer tokens"
        )
    return head_k


def parse_head_k(text: str, vocab_size: int) -> int | None:
    """Parse a CLI value: ``'full'`` -> ``None`` (dense head), else an integer in ``1..vocab_size``."""
    t = str(text).strip().lower()
    if t in ("full", "dense", "all"):
        return None
    try:
        k = int(t.replace("_", "").replace(",", ""))
    except ValueError:
        raise ValueError(f"head_k={text!r} is not an integer or 'full'; valid range is 1..{vocab_size}") from None
    return validate_head_k(k, vocab_size)


def token_frequencies(token_ids: Iterable[Sequence[int] | torch.Tensor], vocab_size: int) -> torch.Tensor:
    """Counts ``[V]`` int64 of every token id over the given token sequences."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for seq in token_ids:
        t = torch.as_tensor(seq, dtype=torch.int64).flatten()
        if t.numel() == 0:
            continue
        if int(t.min()) < 0 or int(t.max()) >= vocab_size:
            raise ValueError(f"token id out of range [0, {vocab_size}) in calibration text")
        counts += torch.bincount(t, minlength=vocab_size)
    return counts


def frequency_ranking(counts: torch.Tensor) -> torch.Tensor:
    """Token ids ``[V]`` by descending count; ties broken by ascending id (deterministic)."""
    v = counts.shape[0]
    # stable sort on -count keeps ids ascending within a tie
    return torch.sort(-counts.to(torch.int64), stable=True).indices[:v]


def _unique_keep_order(ids: torch.Tensor) -> torch.Tensor:
    seen: set[int] = set()
    out = []
    for i in ids.tolist():
        if i not in seen:
            seen.add(i)
            out.append(i)
    return torch.tensor(out, dtype=torch.int64)


def torch_gather_project(
    weight: torch.Tensor, ids: torch.Tensor, hidden: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Reference projection: ``logits[n, k] = hidden[n] . weight[ids[n, k]] (+ bias)``.

    ``weight`` ``[V, H]``, ``ids`` ``[N, K]`` int64, ``hidden`` ``[N, H]``;
    returns ``[N, K]`` float32. Computed in the weight's dtype (as ``nn.Linear``),
    in row chunks so the gathered block stays below ~64 MB of elements.
    """
    n, k = ids.shape
    h = weight.shape[1]
    x = hidden.to(weight.dtype)
    out = torch.empty(n, k, dtype=torch.float32, device=weight.device)
    rows = max(1, _CHUNK_ELEMENTS // max(1, k * h))
    for s in range(0, n, rows):
        idx = ids[s : s + rows]
        w = weight.index_select(0, idx.reshape(-1)).view(idx.shape[0], k, h)  # [r, K, H]
        y = torch.bmm(w, x[s : s + rows].unsqueeze(-1)).squeeze(-1)  # [r, K]
        if bias is not None:
            y = y + bias[idx]
        out[s : s + rows] = y.float()
    return out


class _Selector(nn.Module):
    """Common part of the dynamic selectors: the always-keep tokens (validated, placed first)."""

    always_keep: torch.Tensor  # buffers (register_buffer), declared for the type checker

    def _register_always_keep(self, always_keep: torch.Tensor | Sequence[int], vocab_size: int) -> torch.Tensor:
        keep = _unique_keep_order(torch.as_tensor(list(always_keep), dtype=torch.int64))
        if keep.numel() and (int(keep.min()) < 0 or int(keep.max()) >= vocab_size):
            raise ValueError(f"always-keep token ids must be in [0, {vocab_size})")
        self.vocab_size = vocab_size
        self.register_buffer("always_keep", keep, persistent=False)  # [F]
        return keep

    @property
    def n_always_keep(self) -> int:
        return int(self.always_keep.numel())


class ClusterSelector(_Selector):
    """Picks ``K`` token ids per hidden state from the best-scoring token clusters.

    ``scoring``: ``"cosine"`` scores clusters by ``h . c`` with unit centroids;
    ``"mean"`` by ``h . mean(rows)`` (keeps the members' norms); ``"max_norm"`` by
    ``h . c * max |row|`` of the cluster. Always-keep tokens are removed from the
    clusters and placed first.
    """

    score_centroids: torch.Tensor  # buffers (register_buffer), declared for the type checker
    members: torch.Tensor
    offsets: torch.Tensor
    sizes: torch.Tensor

    def __init__(
        self,
        clusters: TokenClusters,
        always_keep: torch.Tensor | Sequence[int] = (),
        weight: torch.Tensor | None = None,
        scoring: str = "cosine",
    ) -> None:
        super().__init__()
        if scoring not in ("cosine", "mean", "max_norm"):
            raise ValueError(f"scoring={scoring!r} not in ('cosine', 'mean', 'max_norm')")
        if scoring != "cosine" and weight is None:
            raise ValueError(f"scoring={scoring!r} needs the head weight")
        keep = self._register_always_keep(always_keep, clusters.vocab_size)
        v = clusters.vocab_size
        forced = torch.zeros(v, dtype=torch.bool)
        forced[keep] = True
        members = clusters.members
        labels_sorted = clusters.assignments[members]
        keep_mask = ~forced[members]
        members_ex = members[keep_mask]
        sizes_ex = torch.bincount(labels_sorted[keep_mask], minlength=clusters.n_clusters)
        offsets_ex = torch.zeros(clusters.n_clusters + 1, dtype=torch.int64)
        offsets_ex[1:] = torch.cumsum(sizes_ex, 0)
        cent = clusters.centroids.float()
        if scoring == "mean" and weight is not None:  # (not None: checked above)
            w = weight.detach().float().cpu()
            sums = torch.zeros_like(cent).index_add_(0, clusters.assignments, w)
            cent = sums / clusters.sizes.clamp(min=1).unsqueeze(1).float()
        elif scoring == "max_norm" and weight is not None:
            norms = weight.detach().float().cpu().norm(dim=1)
            mx = torch.zeros(clusters.n_clusters).scatter_reduce_(0, clusters.assignments, norms, "amax")
            cent = cent * mx.unsqueeze(1)
        self.scoring = scoring
        self.register_buffer("score_centroids", cent.contiguous(), persistent=False)  # [C, H]
        self.register_buffer("members", members_ex, persistent=False)  # [V - F]
        self.register_buffer("offsets", offsets_ex, persistent=False)  # [C + 1]
        self.register_buffer("sizes", sizes_ex, persistent=False)  # [C]

    def select(self, hidden: torch.Tensor, head_k: int) -> torch.Tensor:
        """Token ids ``[N, K]`` (int64) for ``hidden`` ``[N, H]``; distinct within each row."""
        validate_head_k(head_k, self.vocab_size, self.n_always_keep)
        return self.select_unchecked(hidden, head_k)

    def select_unchecked(self, hidden: torch.Tensor, head_k: int) -> torch.Tensor:
        """:meth:`select` without validating ``head_k`` (the head validated it once, at construction)."""
        n = hidden.shape[0]
        m = head_k - self.n_always_keep
        forced = self.always_keep.unsqueeze(0).expand(n, -1)
        if m == 0:
            return forced.contiguous()
        scores = hidden.float() @ self.score_centroids.T  # [N, C]
        order = torch.argsort(scores, dim=1, descending=True)  # [N, C]
        sz = self.sizes[order]  # [N, C] sizes in rank order
        cs = torch.cumsum(sz, dim=1)  # [N, C] tokens covered by ranks <= r
        j = torch.arange(m, device=hidden.device).unsqueeze(0).expand(n, -1).contiguous()  # [N, M]
        rank = torch.searchsorted(cs, j, right=True)  # [N, M] rank of the cluster holding slot j
        start = cs.gather(1, rank) - sz.gather(1, rank)  # [N, M] first slot of that cluster
        cluster = order.gather(1, rank)  # [N, M]
        fill = self.members[self.offsets[cluster] + (j - start)]  # [N, M]
        return torch.cat([forced, fill], dim=1)


class LowRankSelector(_Selector):
    """Picks the ``K`` tokens with the largest approximate logits of a :class:`LowRankScorer`.

    The ``[V, r]`` factors are stored in ``dtype`` (the head's dtype: bf16 halves
    the bytes read per step), the small ``[H, r]`` projection in float32. Always-keep tokens score
    ``+inf`` so ``topk`` always takes them.
    """

    proj: torch.Tensor  # buffers (register_buffer), declared for the type checker
    factors: torch.Tensor

    def __init__(self, scorer: LowRankScorer, always_keep: torch.Tensor | Sequence[int] = (),
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self._register_always_keep(always_keep, scorer.vocab_size)
        self.rank = scorer.rank
        self.register_buffer("proj", scorer.proj.float().contiguous(), persistent=False)  # [H, r] float32
        self.register_buffer("factors", scorer.factors.to(dtype).contiguous(), persistent=False)  # [V, r]

    def select(self, hidden: torch.Tensor, head_k: int) -> torch.Tensor:
        """Token ids ``[N, K]`` (int64) for ``hidden`` ``[N, H]``; distinct within each row, unordered."""
        validate_head_k(head_k, self.vocab_size, self.n_always_keep)
        return self.select_unchecked(hidden, head_k)

    def select_unchecked(self, hidden: torch.Tensor, head_k: int) -> torch.Tensor:
        """:meth:`select` without validating ``head_k`` (the head validated it once, at construction)."""
        z = hidden.float() @ self.proj  # [N, r]
        scores = (z.to(self.factors.dtype) @ self.factors.T).float()  # [N, V]
        if self.n_always_keep:
            scores[:, self.always_keep] = float("inf")
        return torch.topk(scores, head_k, dim=1, sorted=False).indices


class PrunedLMHead(nn.Module):
    """Drop-in ``lm_head`` that projects onto ``head_k`` kept vocabulary rows.

    Build with :meth:`clustered`, :meth:`lowrank`, :meth:`frequency` or :meth:`dense`. The dense
    weight is shared with the original head (no copy), so tied embeddings stay tied.
    """

    # buffers of a frequency head (register_buffer), None for the others
    static_ids: torch.Tensor | None
    static_weight: torch.Tensor | None

    def __init__(
        self,
        weight: torch.Tensor,
        head_k: int,
        variant: str,
        *,
        selector: ClusterSelector | LowRankSelector | None = None,
        static_ids: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"variant={variant!r} not in {VARIANTS}")
        if backend not in _BACKENDS:
            raise ValueError(f"backend={backend!r} not in {_BACKENDS}")
        if weight.dim() != 2:
            raise ValueError(f"lm_head weight must be [V, H], got {tuple(weight.shape)}")
        v = weight.shape[0]
        n_forced = selector.n_always_keep if selector is not None else 0
        self.head_k = validate_head_k(head_k, v, n_forced)
        self.variant = variant
        self.backend = backend
        self.vocab_size = v
        self.weight = weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight, requires_grad=False)
        self.bias = bias
        self.selector = selector
        if variant in DYNAMIC_VARIANTS and selector is None:
            raise ValueError(f"variant={variant!r} needs a selector")
        if variant == "frequency":
            if static_ids is None or static_ids.numel() != head_k:
                raise ValueError(f"variant='frequency' needs {head_k} static ids")
            ids = static_ids.to(torch.int64).to(weight.device)
            self.register_buffer("static_ids", ids, persistent=False)  # [K]
            self.register_buffer(
                "static_weight", weight.detach().index_select(0, ids).contiguous(), persistent=False
            )  # [K, H] sliced once
        else:
            self.static_ids = None
            self.static_weight = None

    # ---- constructors -------------------------------------------------
    @classmethod
    def dense(cls, lm_head: nn.Linear) -> "PrunedLMHead":
        """The full head (``K = V``) behind the same interface (baseline rows)."""
        return cls(lm_head.weight, lm_head.weight.shape[0], "dense", bias=lm_head.bias)

    @classmethod
    def clustered(
        cls,
        lm_head: nn.Linear,
        clusters: TokenClusters,
        head_k: int,
        always_keep: Sequence[int] = (),
        scoring: str = "cosine",
        backend: str = "auto",
    ) -> "PrunedLMHead":
        """Dynamic head: best clusters until ``head_k`` tokens (always-keep first)."""
        v = lm_head.weight.shape[0]
        if clusters.vocab_size != v:
            raise ValueError(f"clusters cover {clusters.vocab_size} tokens, lm_head has {v}")
        validate_head_k(head_k, v, len(set(int(t) for t in always_keep)))
        sel = ClusterSelector(clusters, always_keep, weight=lm_head.weight, scoring=scoring)
        sel = sel.to(lm_head.weight.device)
        return cls(lm_head.weight, head_k, "clustered", selector=sel, bias=lm_head.bias, backend=backend)

    @classmethod
    def lowrank(
        cls,
        lm_head: nn.Linear,
        scorer: LowRankScorer,
        head_k: int,
        always_keep: Sequence[int] = (),
        backend: str = "auto",
    ) -> "PrunedLMHead":
        """Dynamic head: the ``head_k`` tokens with the best low-rank approximate logits."""
        v = lm_head.weight.shape[0]
        if scorer.vocab_size != v or scorer.proj.shape[0] != lm_head.weight.shape[1]:
            raise ValueError(f"low-rank scorer is for a [{scorer.vocab_size}, {scorer.proj.shape[0]}] head, "
                             f"lm_head is {list(lm_head.weight.shape)}")
        validate_head_k(head_k, v, len(set(int(t) for t in always_keep)))
        sel = LowRankSelector(scorer, always_keep, dtype=lm_head.weight.dtype).to(lm_head.weight.device)
        return cls(lm_head.weight, head_k, "lowrank", selector=sel, bias=lm_head.bias, backend=backend)

    @classmethod
    def frequency(
        cls,
        lm_head: nn.Linear,
        counts: torch.Tensor,
        head_k: int,
        always_keep: Sequence[int] = (),
    ) -> "PrunedLMHead":
        """Static head: always-keep tokens, then the most frequent tokens of ``counts`` ``[V]``."""
        v = lm_head.weight.shape[0]
        if counts.shape[0] != v:
            raise ValueError(f"token counts cover {counts.shape[0]} tokens, lm_head has {v}")
        keep = _unique_keep_order(torch.as_tensor(list(always_keep), dtype=torch.int64))
        validate_head_k(head_k, v, keep.numel())
        ranked = frequency_ranking(counts)
        if keep.numel():
            mask = torch.ones(v, dtype=torch.bool)
            mask[keep] = False
            ranked = torch.cat([keep, ranked[mask[ranked]]])
        return cls(lm_head.weight, head_k, "frequency", static_ids=ranked[:head_k], bias=lm_head.bias)

    # ---- computation --------------------------------------------------
    def _use_triton(self, hidden: torch.Tensor) -> bool:
        if self.backend == "torch" or hidden.device.type != "cuda":
            if self.backend == "triton" and hidden.device.type != "cuda":
                raise ValueError("backend='triton' needs CUDA tensors; use backend='auto' or 'torch' on CPU")
            return False
        from measure.head import triton_head

        if not triton_head.triton_available():
            if self.backend == "triton":
                raise ValueError("backend='triton' requested but Triton is not importable")
            return False
        return True

    def select(self, hidden2d: torch.Tensor) -> torch.Tensor:
        """Kept ids ``[N, K]`` for ``hidden2d`` ``[N, H]``."""
        n = hidden2d.shape[0]
        # a dynamic head has its selector, a frequency head its static ids (__init__)
        if self.variant in DYNAMIC_VARIANTS and self.selector is not None:
            return self.selector.select_unchecked(hidden2d, self.head_k)  # head_k validated in __init__
        if self.variant == "frequency" and self.static_ids is not None:
            return self.static_ids.unsqueeze(0).expand(n, -1)
        return torch.arange(self.vocab_size, device=hidden2d.device).unsqueeze(0).expand(n, -1)

    def project(self, hidden: torch.Tensor) -> PrunedLogits:
        """Fast path: kept ids ``[N, K]`` and float32 logits ``[N, K]`` for ``hidden`` ``[..., H]``."""
        h2 = hidden.reshape(-1, hidden.shape[-1])  # [N, H]
        if self.variant == "frequency" and self.static_ids is not None and self.static_weight is not None:
            ids = self.select(h2)
            logits = (h2.to(self.static_weight.dtype) @ self.static_weight.T).float()  # [N, K]
            if self.bias is not None:
                logits = logits + self.bias[self.static_ids].float()
            return PrunedLogits(ids, logits)
        if self.variant == "dense":
            logits = nn.functional.linear(h2.to(self.weight.dtype), self.weight, self.bias).float()
            return PrunedLogits(self.select(h2), logits)
        ids = self.select(h2)
        if self._use_triton(h2):
            from measure.head.triton_head import triton_gather_project

            logits = triton_gather_project(self.weight, ids, h2)
            if self.bias is not None:
                logits = logits + self.bias[ids].float()
        else:
            logits = torch_gather_project(self.weight, ids, h2, self.bias)
        return PrunedLogits(ids, logits)

    def greedy(self, hidden: torch.Tensor) -> torch.Tensor:
        """Argmax token ids ``[N]`` over the kept set (Triton fused argmax on CUDA).

        The greedy decoding loop's fast path: ``K`` logits per row, no
        ``-inf`` scatter over ``V``, no upcast of full-vocabulary logits. For
        many rows (``N * K >= V``: a teacher-forced pass) the masked dense GEMM
        of :meth:`forward` is cheaper, and gives the same ids.
        """
        h2 = hidden.reshape(-1, hidden.shape[-1])
        if self.variant == "dense":
            return nn.functional.linear(h2.to(self.weight.dtype), self.weight, self.bias).argmax(-1)
        if self.variant in DYNAMIC_VARIANTS and h2.shape[0] > 1 and h2.shape[0] * self.head_k >= self.vocab_size:
            return self.forward(h2).argmax(-1)
        if self.variant in DYNAMIC_VARIANTS and self.bias is None and self._use_triton(h2):
            from measure.head.triton_head import triton_gather_project_argmax

            ids = self.select(h2)
            return triton_gather_project_argmax(self.weight, ids, h2)
        pl = self.project(h2)
        return pl.ids.gather(1, pl.logits.argmax(dim=1, keepdim=True)).squeeze(1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary logits ``[..., V]``: kept logits, ``-inf`` elsewhere (dtype of ``hidden``)."""
        lead = hidden.shape[:-1]
        if self.variant == "dense":
            return nn.functional.linear(hidden, self.weight, self.bias)
        h2 = hidden.reshape(-1, hidden.shape[-1])  # [N, H]
        if self.variant in DYNAMIC_VARIANTS and h2.shape[0] * self.head_k >= self.vocab_size:
            # many positions (a prefill, a teacher-forced pass): one dense GEMM is cheaper than
            # N gathers of K rows; the kept sets are the same, so mask the dense logits to them
            ids = self.select(h2)  # [N, K]
            out = nn.functional.linear(h2, self.weight, self.bias)  # [N, V]
            drop = torch.ones_like(out, dtype=torch.bool).scatter_(1, ids, False)
            return out.masked_fill_(drop, float("-inf")).view(*lead, self.vocab_size)
        pl = self.project(h2)
        out = torch.full(
            (pl.ids.shape[0], self.vocab_size), float("-inf"), dtype=hidden.dtype, device=hidden.device
        )  # [N, V]
        out.scatter_(1, pl.ids, pl.logits.to(hidden.dtype))
        return out.view(*lead, self.vocab_size)

    def extra_repr(self) -> str:
        return f"variant={self.variant}, head_k={self.head_k}, vocab_size={self.vocab_size}, backend={self.backend}"


def _softcap_of(model: nn.Module) -> float | None:
    cfg = getattr(model, "config", None)
    for c in (cfg, getattr(cfg, "text_config", None)):
        if c is not None and getattr(c, "final_logit_softcapping", None):
            return float(c.final_logit_softcapping)
    return None


def lm_head_of(model: nn.Module) -> nn.Module:
    """``model.lm_head``, the output embedding; one-line ``ValueError`` when it is not a module."""
    head = getattr(model, "lm_head", None)
    if not isinstance(head, nn.Module):
        raise ValueError(f"{type(model).__name__} has no lm_head module")
    return head


def install_lm_head(model: nn.Module, head: nn.Module) -> nn.Module:
    """Replace ``model.lm_head`` (the output embedding) with ``head``; returns the old module.

    Refuses models that soft-cap their final logits (``tanh`` maps ``-inf`` to a
    finite value, which would give pruned tokens non-zero probability).
    """
    if not hasattr(model, "lm_head"):
        raise ValueError(f"{type(model).__name__} has no lm_head attribute to replace")
    old = lm_head_of(model)
    cap = _softcap_of(model)
    if cap is not None and isinstance(head, PrunedLMHead) and head.variant != "dense":
        raise ValueError(
            f"{type(model).__name__} soft-caps its logits (final_logit_softcapping={cap}); "
            "a pruned head's -inf would become finite — not supported"
        )
    model.lm_head = head
    return old


@contextlib.contextmanager
def swapped_lm_head(model: nn.Module, head: nn.Module) -> Iterator[nn.Module]:
    """Context manager: ``model.lm_head = head`` inside, the original restored on exit."""
    old = install_lm_head(model, head)
    try:
        yield model
    finally:
        model.lm_head = old
