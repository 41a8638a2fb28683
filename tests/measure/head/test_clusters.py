"""Tests of measure.head.clusters: spherical k-means, CSR layout, seeding, the on-disk cache."""

from __future__ import annotations

import pytest
import torch

from measure.head.clusters import (
    ClusterConfig,
    build_clusters,
    load_or_build_clusters,
    spherical_kmeans,
    weight_fingerprint,
)


def _planted(n_centres: int = 8, per: int = 60, dim: int = 16, noise: float = 0.15, seed: int = 0):
    """Rows scattered around ``n_centres`` orthonormal random directions, with random norms."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.linalg.qr(torch.randn(dim, n_centres, generator=g)).Q.T  # [n_centres, dim], orthonormal
    labels = torch.arange(n_centres).repeat_interleave(per)
    x = centres[labels] + noise * torch.randn(len(labels), dim, generator=g)
    x = x * (0.5 + 2 * torch.rand(len(labels), 1, generator=g))  # norms must not matter (cosine)
    perm = torch.randperm(len(labels), generator=g)
    return x[perm], labels[perm]


def test_recovers_planted_directions():
    x, truth = _planted()
    cent, labels, mean_cos = spherical_kmeans(x, 8, seed=0, n_iter_sample=0, n_iter_full=20)
    assert cent.shape == (8, 16)
    torch.testing.assert_close(cent.norm(dim=1), torch.ones(8), rtol=1e-5, atol=1e-5)
    # purity: each found cluster is (almost) one planted direction
    pure = 0
    for c in range(8):
        members = truth[labels == c]
        if members.numel():
            pure += int(torch.bincount(members).max())
    assert pure / len(truth) > 0.95
    assert mean_cos > 0.8  # noise 0.15 per dim in 16 dims: cos ~ 1/sqrt(1 + 0.36)


def test_seeded_and_deterministic():
    x, _ = _planted(seed=1)
    cfg = ClusterConfig(n_clusters=8, seed=3, sample_rows=200, n_iter_sample=5, n_iter_full=1)
    a, b = build_clusters(x, cfg), build_clusters(x, cfg)
    assert torch.equal(a.assignments, b.assignments) and torch.equal(a.centroids, b.centroids)
    c = build_clusters(x, ClusterConfig(n_clusters=8, seed=4, sample_rows=200, n_iter_sample=5, n_iter_full=1))
    assert not torch.equal(a.centroids, c.centroids)


def test_csr_layout_consistent():
    x, _ = _planted(n_centres=5, per=40)
    cl = build_clusters(x, ClusterConfig(n_clusters=12, seed=0, sample_rows=100))
    assert cl.vocab_size == 200 and cl.n_clusters == 12
    assert sorted(cl.members.tolist()) == list(range(200))
    assert torch.equal(cl.sizes, torch.bincount(cl.assignments, minlength=12))
    for c in range(12):
        a, b = int(cl.offsets[c]), int(cl.offsets[c + 1])
        assert torch.all(cl.assignments[cl.members[a:b]] == c)
    # no empty cluster survives the re-seeding of empty clusters
    assert int(cl.sizes.min()) >= 1


def test_sklearn_backend_agrees_on_planted_data():
    x, truth = _planted(seed=2)
    cl = build_clusters(x, ClusterConfig(n_clusters=8, seed=0, backend="sklearn", n_iter_sample=20))
    pure = sum(int(torch.bincount(truth[cl.assignments == c]).max()) for c in range(8)
               if (cl.assignments == c).any())
    assert pure / len(truth) > 0.85  # at most one merged pair (chance level is ~0.2)


def test_cache_round_trip_and_key(tmp_path):
    x, _ = _planted(seed=3)
    cfg = ClusterConfig(n_clusters=6, seed=0, sample_rows=100, n_iter_sample=3, n_iter_full=1)
    a, hit_a = load_or_build_clusters(x, cfg, tmp_path)
    b, hit_b = load_or_build_clusters(x, cfg, tmp_path)
    assert (hit_a, hit_b) == (False, True)
    assert torch.equal(a.assignments, b.assignments) and torch.equal(a.centroids, b.centroids)
    assert b.fingerprint == weight_fingerprint(x)
    # other weights or other parameters: a different cache entry, rebuilt
    y = x.clone()
    y[0, 0] += 1.0
    assert weight_fingerprint(y) != weight_fingerprint(x)
    _, hit_y = load_or_build_clusters(y, cfg, tmp_path)
    _, hit_c = load_or_build_clusters(x, ClusterConfig(n_clusters=7, seed=0, sample_rows=100), tmp_path)
    assert (hit_y, hit_c) == (False, False)
    assert len(list(tmp_path.glob("clusters-*.pt"))) == 3
    # a corrupt file is rebuilt, not fatal
    for f in tmp_path.glob("clusters-*.pt"):
        f.write_bytes(b"not a torch file")
    _, hit = load_or_build_clusters(x, cfg, tmp_path)
    assert hit is False


def test_fingerprint_covers_dtype():
    x = torch.randn(10, 4)
    assert weight_fingerprint(x) != weight_fingerprint(x.to(torch.bfloat16))
    assert weight_fingerprint(x) == weight_fingerprint(x.clone())


def test_bad_parameters():
    with pytest.raises(ValueError, match="n_clusters=0 must be >= 1"):
        ClusterConfig(n_clusters=0)
    with pytest.raises(ValueError, match="backend='scipy'"):
        ClusterConfig(backend="scipy")
    with pytest.raises(ValueError, match="exceeds the vocabulary size 10"):
        build_clusters(torch.randn(10, 4), ClusterConfig(n_clusters=11))
    with pytest.raises(ValueError, match="must be 2-D"):
        build_clusters(torch.randn(10), ClusterConfig(n_clusters=2))
