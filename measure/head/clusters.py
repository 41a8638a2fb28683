"""Offline token clusters for the pruned draft head: spherical k-means of lm_head rows.

The dynamic pruned head (:mod:`measure.head.pruned_head`) scores the draft's last
hidden state against ``C`` centroids and projects only onto the tokens of the
best clusters. This module builds those clusters once per model:

* rows of the output embedding (``lm_head.weight``, ``[V, H]``) are
  L2-normalised and clustered with spherical (cosine) k-means;
* the default backend is a batched torch implementation (matrix products of
  row blocks against all centroids, ``index_add_`` for the centroid update).
  On a 262,144 x 640 head with 3,000 centroids one full assignment pass is
  ~10 s on 2 CPU cores, so the fast path runs most Lloyd iterations on a seeded
  row subsample and finishes with full-data iterations and a final assignment;
* ``backend="sklearn"`` runs scikit-learn's ``MiniBatchKMeans`` on the
  normalised rows and re-normalises its centroids (a well-kept reference);
* results are cached as ``.pt`` files under a cache directory, keyed by a
  SHA-256 of the weight bytes plus every parameter, and reused on later runs.

Every random choice goes through a ``torch.Generator`` seeded from
``ClusterConfig.seed``.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

__all__ = [
    "ClusterConfig",
    "TokenClusters",
    "default_cache_dir",
    "weight_fingerprint",
    "spherical_kmeans",
    "build_clusters",
    "load_or_build_clusters",
]

_VALID_BACKENDS = ("torch", "sklearn")


@dataclass(frozen=True)
class ClusterConfig:
    """Parameters of the offline clustering (all part of the cache key)."""

    n_clusters: int = 3000
    seed: int = 0
    backend: str = "torch"
    init: str = "k-means++"
    n_iter_sample: int = 12
    n_iter_full: int = 2
    sample_rows: int = 65536
    block_rows: int = 16384

    def __post_init__(self) -> None:
        if self.n_clusters < 1:
            raise ValueError(f"n_clusters={self.n_clusters} must be >= 1")
        if self.backend not in _VALID_BACKENDS:
            raise ValueError(f"backend={self.backend!r} not in {_VALID_BACKENDS}")
        if self.init not in ("k-means++", "random"):
            raise ValueError(f"init={self.init!r} not in ('k-means++', 'random')")
        if self.n_iter_sample < 0 or self.n_iter_full < 0:
            raise ValueError(
                f"n_iter_sample={self.n_iter_sample}, n_iter_full={self.n_iter_full} must be >= 0"
            )
        if self.sample_rows < 1 or self.block_rows < 1:
            raise ValueError(
                f"sample_rows={self.sample_rows}, block_rows={self.block_rows} must be >= 1"
            )


@dataclass(frozen=True)
class TokenClusters:
    """Clustered vocabulary in CSR form.

    ``centroids``: ``[C, H]`` float32, unit norm. ``assignments``: ``[V]`` int64
    cluster of every token. ``members``: ``[V]`` int64 token ids sorted by
    cluster; cluster ``c`` owns ``members[offsets[c]:offsets[c+1]]``.
    """

    centroids: torch.Tensor
    assignments: torch.Tensor
    members: torch.Tensor
    offsets: torch.Tensor
    fingerprint: str
    config: ClusterConfig
    build_s: float
    mean_cosine: float

    def __post_init__(self) -> None:
        c, v = self.centroids.shape[0], self.assignments.shape[0]
        if self.offsets.shape[0] != c + 1 or int(self.offsets[-1]) != v:
            raise ValueError(f"offsets of shape {tuple(self.offsets.shape)} do not match C={c}, V={v}")
        if self.members.shape[0] != v:
            raise ValueError(f"members has {self.members.shape[0]} entries, vocabulary has {v}")

    @property
    def n_clusters(self) -> int:
        return int(self.centroids.shape[0])

    @property
    def vocab_size(self) -> int:
        return int(self.assignments.shape[0])

    @property
    def sizes(self) -> torch.Tensor:
        """``[C]`` int64 tokens per cluster."""
        return self.offsets[1:] - self.offsets[:-1]


def default_cache_dir() -> Path:
    """``$SPECSCOPE_CACHE/clusters`` or ``~/.cache/specscope/clusters``."""
    root = os.environ.get("SPECSCOPE_CACHE") or os.path.join(Path.home(), ".cache", "specscope")
    return Path(root) / "clusters"


def weight_fingerprint(weight: torch.Tensor) -> str:
    """SHA-256 (hex, first 24 chars) of the weight's shape, dtype and bytes."""
    w = weight.detach()
    if w.device.type != "cpu":
        w = w.cpu()
    w = w.contiguous()
    h = hashlib.sha256(f"{tuple(w.shape)}|{w.dtype}".encode())
    # view as bytes without a copy (bf16 has no numpy dtype)
    h.update(w.view(torch.uint8).reshape(-1).numpy().data)
    return h.hexdigest()[:24]


def _normalise(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(x.float(), dim=1, eps=1e-12)


def _assign(x: torch.Tensor, centroids: torch.Tensor, block_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Best centroid (cosine) of every row: returns (labels [N] int64, cosine [N] float32)."""
    labels = torch.empty(x.shape[0], dtype=torch.int64, device=x.device)
    best = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    for start in range(0, x.shape[0], block_rows):
        sims = x[start : start + block_rows] @ centroids.T  # [b, C]
        val, idx = sims.max(dim=1)
        labels[start : start + block_rows] = idx
        best[start : start + block_rows] = val
    return labels, best


def _update(
    x: torch.Tensor,
    labels: torch.Tensor,
    best: torch.Tensor,
    n_clusters: int,
    old: torch.Tensor,
) -> torch.Tensor:
    """Spherical centroid update; empty clusters take the worst-served rows."""
    sums = torch.zeros(n_clusters, x.shape[1], dtype=torch.float32, device=x.device)
    sums.index_add_(0, labels, x)
    counts = torch.bincount(labels, minlength=n_clusters)
    empty = torch.nonzero(counts == 0).flatten()
    if empty.numel() > 0:
        worst = torch.argsort(best)[: empty.numel()]
        sums[empty[: worst.numel()]] = x[worst]
        # any still-empty cluster (fewer rows than clusters) keeps its old centroid
        rest = empty[worst.numel() :]
        if rest.numel() > 0:
            sums[rest] = old[rest]
    return _normalise(sums)


def _kmeans_pp(x: torch.Tensor, n_clusters: int, gen: torch.Generator) -> torch.Tensor:
    """k-means++ seeding for cosine distance ``1 - cos``: row indices ``[C]`` of ``x`` (unit rows)."""
    n = x.shape[0]
    first = int(torch.randint(n, (1,), generator=gen))
    chosen = [first]
    dist = (1.0 - x @ x[first]).clamp_(min=0.0)  # [N] distance to the nearest chosen centre
    for _ in range(1, n_clusters):
        w = dist.cpu().double()
        total = float(w.sum())
        if total <= 0:  # every row coincides with a centre: take any row not yet chosen
            rest = torch.ones(n, dtype=torch.bool)
            rest[torch.tensor(chosen)] = False
            nxt = int(torch.nonzero(rest)[0]) if rest.any() else chosen[-1]
        else:
            nxt = int(torch.multinomial(w / total, 1, generator=gen))
        chosen.append(nxt)
        torch.minimum(dist, (1.0 - x @ x[nxt]).clamp_(min=0.0), out=dist)
    return torch.tensor(chosen, dtype=torch.int64, device=x.device)


def spherical_kmeans(
    weight: torch.Tensor,
    n_clusters: int,
    seed: int,
    *,
    init: str = "k-means++",
    n_iter_sample: int = 12,
    n_iter_full: int = 2,
    sample_rows: int = 65536,
    block_rows: int = 16384,
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Spherical k-means of the rows of ``weight`` ``[V, H]``.

    Returns ``(centroids [C, H] unit-norm float32, labels [V] int64, mean cosine
    of rows to their centroid)``. Initialisation: ``C`` distinct rows drawn
    with a generator seeded by ``seed``; ``n_iter_sample`` Lloyd iterations on a
    seeded subsample of ``sample_rows`` rows, then ``n_iter_full`` on all rows.
    ``init="k-means++"`` seeds the centroids by k-means++ (D^2 sampling on
    ``1 - cos``) over that subsample; ``"random"`` picks ``C`` distinct rows.
    """
    v = weight.shape[0]
    if not 1 <= n_clusters <= v:
        raise ValueError(f"n_clusters={n_clusters} must be in [1, {v}] (rows of the head)")
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = _normalise(weight.detach())
    if sample_rows < v:
        sample_idx = torch.randperm(v, generator=gen)[: max(sample_rows, n_clusters)].to(x.device)
        xs = x[sample_idx]
    else:
        xs = x
    if init == "k-means++":
        centroids = xs[_kmeans_pp(xs, n_clusters, gen)].clone()
    elif init == "random":
        centroids = xs[torch.randperm(xs.shape[0], generator=gen)[:n_clusters].to(x.device)].clone()
    else:
        raise ValueError(f"init={init!r} not in ('k-means++', 'random')")
    for _ in range(n_iter_sample):
        labels, best = _assign(xs, centroids, block_rows)
        centroids = _update(xs, labels, best, n_clusters, centroids)
    for _ in range(n_iter_full):
        labels, best = _assign(x, centroids, block_rows)
        centroids = _update(x, labels, best, n_clusters, centroids)
    labels, best = _assign(x, centroids, block_rows)
    return centroids, labels, float(best.mean())


def _sklearn_kmeans(weight: torch.Tensor, cfg: ClusterConfig) -> tuple[torch.Tensor, torch.Tensor, float]:
    from sklearn.cluster import MiniBatchKMeans

    x = _normalise(weight.detach()).cpu()
    km = MiniBatchKMeans(
        n_clusters=cfg.n_clusters,
        random_state=cfg.seed,
        batch_size=max(cfg.block_rows, 3 * cfg.n_clusters),
        n_init=1,
        max_iter=max(1, cfg.n_iter_sample + cfg.n_iter_full),
    )
    km.fit(x.numpy())
    centroids = _normalise(torch.from_numpy(km.cluster_centers_))
    labels, best = _assign(x, centroids, cfg.block_rows)
    return centroids, labels, float(best.mean())


def _to_csr(labels: torch.Tensor, n_clusters: int) -> tuple[torch.Tensor, torch.Tensor]:
    members = torch.argsort(labels, stable=True)
    counts = torch.bincount(labels, minlength=n_clusters)
    offsets = torch.zeros(n_clusters + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(counts.cpu(), dim=0)
    return members.cpu(), offsets


def build_clusters(weight: torch.Tensor, config: ClusterConfig = ClusterConfig()) -> TokenClusters:
    """Cluster ``weight`` ``[V, H]`` (no cache). Runs on the weight's device."""
    if weight.dim() != 2:
        raise ValueError(f"lm_head weight must be 2-D [V, H], got shape {tuple(weight.shape)}")
    v = weight.shape[0]
    if config.n_clusters > v:
        raise ValueError(f"n_clusters={config.n_clusters} exceeds the vocabulary size {v}")
    t0 = time.perf_counter()
    if config.backend == "torch":
        centroids, labels, mean_cos = spherical_kmeans(
            weight,
            config.n_clusters,
            config.seed,
            init=config.init,
            n_iter_sample=config.n_iter_sample,
            n_iter_full=config.n_iter_full,
            sample_rows=config.sample_rows,
            block_rows=config.block_rows,
        )
    else:
        centroids, labels, mean_cos = _sklearn_kmeans(weight, config)
    members, offsets = _to_csr(labels.cpu(), config.n_clusters)
    return TokenClusters(
        centroids=centroids.cpu(),
        assignments=labels.cpu(),
        members=members,
        offsets=offsets,
        fingerprint=weight_fingerprint(weight),
        config=config,
        build_s=time.perf_counter() - t0,
        mean_cosine=mean_cos,
    )


def _cache_path(cache_dir: Path, fingerprint: str, config: ClusterConfig) -> Path:
    key = hashlib.sha256(json.dumps(asdict(config), sort_keys=True).encode()).hexdigest()[:12]
    return cache_dir / f"clusters-{fingerprint}-C{config.n_clusters}-s{config.seed}-{key}.pt"


def load_or_build_clusters(
    weight: torch.Tensor,
    config: ClusterConfig = ClusterConfig(),
    cache_dir: str | Path | None = None,
) -> tuple[TokenClusters, bool]:
    """Clusters for ``weight`` from the on-disk cache, building (and saving) them if absent.

    Returns ``(clusters, from_cache)``. The cache file name carries the weight
    fingerprint and a hash of ``config``; a stale or unreadable file is rebuilt.
    """
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    fp = weight_fingerprint(weight)
    path = _cache_path(cache, fp, config)
    if path.exists():
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
            if blob["fingerprint"] == fp and blob["config"] == asdict(config):
                return (
                    TokenClusters(
                        centroids=blob["centroids"],
                        assignments=blob["assignments"],
                        members=blob["members"],
                        offsets=blob["offsets"],
                        fingerprint=fp,
                        config=config,
                        build_s=float(blob["build_s"]),
                        mean_cosine=float(blob["mean_cosine"]),
                    ),
                    True,
                )
        except Exception:  # unreadable, truncated or foreign file
            pass  # rebuilt below
    clusters = build_clusters(weight, config)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "fingerprint": fp,
            "config": asdict(config),
            "centroids": clusters.centroids,
            "assignments": clusters.assignments,
            "members": clusters.members,
            "offsets": clusters.offsets,
            "build_s": clusters.build_s,
            "mean_cosine": clusters.mean_cosine,
        },
        tmp,
    )
    os.replace(tmp, path)
    return clusters, False
