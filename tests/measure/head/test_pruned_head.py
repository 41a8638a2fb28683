"""Tests of measure.head.pruned_head (and the Triton kernel on CUDA, marked gpu)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from measure.head.clusters import ClusterConfig, build_clusters
from measure.head.pruned_head import (
    ClusterSelector,
    PrunedLMHead,
    frequency_ranking,
    install_lm_head,
    parse_head_k,
    swapped_lm_head,
    token_frequencies,
    torch_gather_project,
    validate_head_k,
)

V, H, C = 2000, 32, 40


@pytest.fixture(scope="module")
def head() -> nn.Linear:
    g = torch.Generator().manual_seed(0)
    lin = nn.Linear(H, V, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(V, H, generator=g))
    return lin.requires_grad_(False)


@pytest.fixture(scope="module")
def clusters(head):
    return build_clusters(head.weight, ClusterConfig(n_clusters=C, seed=0, sample_rows=1000, block_rows=512))


@pytest.fixture(scope="module")
def hidden() -> torch.Tensor:
    return torch.randn(5, H, generator=torch.Generator().manual_seed(1))


def _counts(seed: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 50, (V,), generator=g)


# ---- K = V is the dense head ------------------------------------------------------
@pytest.mark.parametrize("variant", ["clustered", "frequency", "dense"])
def test_full_k_equals_dense(head, clusters, hidden, variant):
    if variant == "clustered":
        p = PrunedLMHead.clustered(head, clusters, V, always_keep=[5, 9])
    elif variant == "frequency":
        p = PrunedLMHead.frequency(head, _counts(), V, always_keep=[5])
    else:
        p = PrunedLMHead.dense(head)
    ref = head(hidden)
    out = p(hidden)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(out.argmax(-1), ref.argmax(-1))
    assert torch.equal(p.greedy(hidden), ref.argmax(-1))
    # the fast path covers the whole vocabulary once
    ids = p.project(hidden).ids
    assert all(sorted(r) == list(range(V)) for r in ids.tolist())


def test_full_k_equals_dense_3d_and_prefill_path(head, clusters):
    x = torch.randn(1, 7, H, generator=torch.Generator().manual_seed(3))  # [B, S, H]
    p = PrunedLMHead.clustered(head, clusters, V)
    torch.testing.assert_close(p(x), head(x), rtol=1e-5, atol=1e-5)


# ---- kept set ---------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 2, 37, 500, 1999])
def test_kept_set_exactly_k_distinct_with_always_keep(head, clusters, hidden, k):
    keep = [11, 3] if k >= 2 else [11]
    p = PrunedLMHead.clustered(head, clusters, k, always_keep=keep)
    pl = p.project(hidden)
    assert pl.ids.shape == (hidden.shape[0], k)
    for row in pl.ids.tolist():
        assert len(set(row)) == k
        assert row[: len(keep)] == keep
    out = p(hidden)
    finite = torch.isfinite(out)
    assert finite.sum(1).tolist() == [k] * hidden.shape[0]
    # finite entries are exactly the kept ids, with the dense head's values there
    for n in range(hidden.shape[0]):
        assert set(torch.nonzero(finite[n]).flatten().tolist()) == set(pl.ids[n].tolist())
        ref = head(hidden[n])
        torch.testing.assert_close(out[n][pl.ids[n]], ref[pl.ids[n]], rtol=1e-5, atol=1e-5)
    assert torch.equal(p.greedy(hidden), out.argmax(-1))


def test_selector_takes_best_clusters_in_order(head, clusters, hidden):
    """Reference: walk clusters by descending centroid score, members in CSR order."""
    k = 300
    sel = ClusterSelector(clusters, always_keep=[])
    got = sel.select(hidden, k)
    scores = hidden @ clusters.centroids.T
    for n in range(hidden.shape[0]):
        want: list[int] = []
        for c in torch.argsort(scores[n], descending=True).tolist():
            a, b = int(clusters.offsets[c]), int(clusters.offsets[c + 1])
            want.extend(clusters.members[a:b].tolist())
            if len(want) >= k:
                break
        assert got[n].tolist() == want[:k]


@pytest.mark.parametrize("scoring", ["cosine", "mean", "max_norm"])
def test_scoring_variants_valid_and_recall_grows_with_k(head, clusters, hidden, scoring):
    recalls = []
    for k in (100, 400, 1600):
        p = PrunedLMHead.clustered(head, clusters, k, scoring=scoring)
        ids = p.project(hidden).ids
        top = head(hidden).argmax(-1)
        recalls.append(float((ids == top[:, None]).any(1).float().mean()))
    assert recalls == sorted(recalls)


def test_prefill_path_equals_row_path(head, clusters):
    """N*K >= V switches to dense-GEMM-then-mask; it must equal the per-row gather path."""
    x = torch.randn(12, H, generator=torch.Generator().manual_seed(4))
    p = PrunedLMHead.clustered(head, clusters, 400)
    many = p(x)  # 12 * 400 >= 2000: masked dense path
    for n in range(x.shape[0]):
        one = p(x[n : n + 1])  # 400 < 2000: gather path
        torch.testing.assert_close(many[n : n + 1], one, rtol=1e-5, atol=1e-5)


# ---- frequency baseline -----------------------------------------------------------
def test_frequency_ranking_and_static_head(head, hidden):
    seqs = [[4, 4, 4, 7, 7, 1], torch.tensor([7, 9, 9, 9, 9])]
    counts = token_frequencies(seqs, V)
    assert counts[9] == 4 and counts[4] == 3 and counts[7] == 3 and counts[1] == 1
    rank = frequency_ranking(counts)
    assert rank[:5].tolist() == [9, 4, 7, 1, 0]  # ties (4, 7) and zeros by ascending id
    p = PrunedLMHead.frequency(head, counts, 3, always_keep=[1])
    assert p.static_ids.tolist() == [1, 9, 4]
    out = p(hidden)
    assert torch.isfinite(out).sum(1).tolist() == [3] * hidden.shape[0]
    torch.testing.assert_close(out[:, [1, 9, 4]], head(hidden)[:, [1, 9, 4]], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="out of range"):
        token_frequencies([[V]], V)


# ---- errors -------------------------------------------------------------------------
def test_bad_k_values_raise_clear_errors(head, clusters):
    with pytest.raises(ValueError, match=r"head_k=0 is < 1; valid range is 1\.\.2000"):
        PrunedLMHead.clustered(head, clusters, 0)
    with pytest.raises(ValueError, match=r"head_k=-5 is < 1"):
        validate_head_k(-5, V)
    with pytest.raises(ValueError, match=r"head_k=2001 exceeds the vocabulary size 2000"):
        PrunedLMHead.clustered(head, clusters, V + 1)
    with pytest.raises(ValueError, match=r"head_k=2001 exceeds"):
        PrunedLMHead.frequency(head, _counts(), V + 1)
    with pytest.raises(ValueError, match="smaller than the 3 always-keep"):
        PrunedLMHead.clustered(head, clusters, 2, always_keep=[1, 2, 3])
    with pytest.raises(ValueError, match="must be an integer"):
        validate_head_k(True, V)
    with pytest.raises(ValueError, match="must be an integer"):
        validate_head_k(3.0, V)  # type: ignore[arg-type]
    assert parse_head_k("full", V) is None
    assert parse_head_k("1_000", V) == 1000
    with pytest.raises(ValueError, match="not an integer or 'full'"):
        parse_head_k("lots", V)
    with pytest.raises(ValueError, match="exceeds the vocabulary"):
        parse_head_k("3000", V)
    with pytest.raises(ValueError, match="backend='triton' needs CUDA"):
        PrunedLMHead.clustered(head, clusters, 10, backend="triton").project(torch.zeros(1, H))


def test_install_refuses_softcapped_logits(head, clusters):
    class Capped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = type("Cfg", (), {"final_logit_softcapping": 30.0})()
            self.lm_head = head

    with pytest.raises(ValueError, match="soft-caps its logits"):
        install_lm_head(Capped(), PrunedLMHead.clustered(head, clusters, 10))


# ---- sampling stays exact -----------------------------------------------------------
def test_rejection_sampling_with_pruned_q_recovers_target_distribution():
    """Output law of one verified draft token: q's support is the kept set, result is exactly p."""
    from measure.decoding import accept_tokens

    v, h = 40, 8
    g = torch.Generator().manual_seed(5)
    w_draft = torch.randn(v, h, generator=g)
    lin = nn.Linear(h, v, bias=False).requires_grad_(False)
    lin.weight.copy_(w_draft)
    counts = torch.arange(v, 0, -1)
    pruned = PrunedLMHead.frequency(lin, counts, 6)  # keeps tokens 0..5
    x = torch.randn(1, h, generator=g)
    q = torch.softmax(pruned(x)[0], -1)  # [V]
    assert torch.count_nonzero(q) == 6 and torch.all(q[6:] == 0)
    p_logits = torch.randn(2, v, generator=g)  # target at the drafted position and the bonus
    p = torch.softmax(p_logits[0], -1)
    # analytic law: q(x) min(1, p/q) + (1 - sum min(p, q)) * norm(max(p - q, 0))
    resid = torch.clamp(p - q, min=0)
    law = torch.minimum(p, q) + (1 - torch.minimum(p, q).sum()) * resid / resid.sum()
    torch.testing.assert_close(law, p, rtol=1e-5, atol=1e-6)
    # Monte Carlo through the measure loop's own verifier
    n_draws = 6000
    gen = torch.Generator().manual_seed(6)
    hits = torch.zeros(v)
    for _ in range(n_draws):
        d = torch.multinomial(q, 1, generator=gen)  # [1]
        n, nxt = accept_tokens(p_logits, d, q[None], 1.0, gen)
        hits[int(d[0]) if n == 1 else nxt] += 1
    tv = 0.5 * float((hits / n_draws - p).abs().sum())
    assert tv < 0.04, tv


def _tiny_llama(vocab: int = 300, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval().requires_grad_(False)


@pytest.mark.parametrize("variant", ["clustered", "lowrank"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_speculative_loop_with_pruned_draft_is_exact(temperature, variant):
    """Greedy: identical tokens to the target. K = V self-draft: every draft token accepted."""
    import copy

    from measure.decoding import autoregressive_generate, speculative_generate
    from measure.drafts import ModelDraft
    from measure.engines.transformers.decoder import TransformersDecoder
    from sim.policies import FixedGamma

    target = _tiny_llama()
    draft_model = copy.deepcopy(target)
    from measure.head.lowrank import accumulate_moment, fit_lowrank

    w = draft_model.lm_head.weight
    cl = build_clusters(w, ClusterConfig(n_clusters=12, seed=0))
    scorer = fit_lowrank(w, accumulate_moment([torch.randn(64, w.shape[1], generator=torch.Generator().manual_seed(3))]),
                         4)
    prompt = torch.randint(0, 300, (1, 10), generator=torch.Generator().manual_seed(7))
    for k in (20, 300):
        head = (PrunedLMHead.clustered(draft_model.lm_head, cl, k) if variant == "clustered"
                else PrunedLMHead.lowrank(draft_model.lm_head, scorer, k))
        with swapped_lm_head(draft_model, head):
            draft = ModelDraft("pruned", "pruned", TransformersDecoder(draft_model), draft_model, True)
            gen = torch.Generator().manual_seed(8)
            res = speculative_generate(TransformersDecoder(target), draft, prompt, FixedGamma(3), temperature=temperature,
                                       max_new_tokens=24, generator=gen)
        assert len(res.tokens) == 24
        if temperature == 0:
            base = autoregressive_generate(TransformersDecoder(target), prompt, 0.0, 24)
            assert res.tokens == base.tokens
        if k == 300:
            assert res.accepted == res.drafted  # full head on a copy of the target
        else:
            # every drafted token lies in that step's kept set: fine by construction; at least
            # the loop ran rounds and the head was restored afterwards
            assert res.drafted > 0
    assert isinstance(draft_model.lm_head, nn.Linear)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_loop_takes_the_pruned_heads_fast_path(temperature, monkeypatch):
    """Greedy: the draft step goes through greedy() (K logits), never the -inf forward over V; sampling: a
    K-sized distribution (SparseProbs) reaches the acceptance test; head_k is not validated per step."""
    import copy

    import measure.head.pruned_head as ph
    from measure.decoding import autoregressive_generate, speculative_generate
    from measure.seam import SparseProbs
    from measure.drafts import ModelDraft
    from measure.engines.transformers.decoder import TransformersDecoder
    from measure.head.lowrank import accumulate_moment, fit_lowrank
    from sim.policies import FixedGamma

    target = _tiny_llama()
    draft_model = copy.deepcopy(target)
    w = draft_model.lm_head.weight
    scorer = fit_lowrank(w, accumulate_moment([torch.randn(64, w.shape[1], generator=torch.Generator().manual_seed(3))]),
                         4)
    head = PrunedLMHead.lowrank(draft_model.lm_head, scorer, 40)
    calls = {"forward": 0, "greedy": 0, "validate": 0}
    orig_fwd, orig_greedy, orig_val = PrunedLMHead.forward, PrunedLMHead.greedy, ph.validate_head_k

    def count(name, fn):
        def wrapped(*a, **kw):
            calls[name] += 1
            return fn(*a, **kw)
        return wrapped

    monkeypatch.setattr(PrunedLMHead, "forward", count("forward", orig_fwd))
    monkeypatch.setattr(PrunedLMHead, "greedy", count("greedy", orig_greedy))
    monkeypatch.setattr(ph, "validate_head_k", count("validate", orig_val))
    seen_q = []
    import measure.decoding as dec_mod

    orig_accept = dec_mod.accept_tokens

    def spy(p, d, q, t, g):
        seen_q.append(q)
        return orig_accept(p, d, q, t, g)

    monkeypatch.setattr(dec_mod, "accept_tokens", spy)
    prompt = torch.randint(0, 300, (1, 10), generator=torch.Generator().manual_seed(7))
    with swapped_lm_head(draft_model, head):
        draft = ModelDraft("pruned", "pruned", TransformersDecoder(draft_model), draft_model, True)
        res = speculative_generate(TransformersDecoder(target), draft, prompt, FixedGamma(3), temperature, 24,
                                   torch.Generator().manual_seed(1))
    assert res.drafted > 0 and calls["validate"] == 0
    if temperature == 0:
        assert calls["forward"] == 0 and calls["greedy"] >= res.drafted
        assert res.tokens == autoregressive_generate(TransformersDecoder(target), prompt, 0.0, 24).tokens
    else:
        assert calls["forward"] == 0 and seen_q and all(isinstance(q, SparseProbs) for q in seen_q if q is not None)
        assert all(q.ids.shape[1] == 40 for q in seen_q if q is not None)


# ---- the Triton kernel (GPU only) -------------------------------------------------------
gpu = pytest.mark.gpu


def _needs_triton() -> None:
    from measure.head.triton_head import triton_available

    if not triton_available():
        pytest.skip("needs CUDA and Triton")


def test_triton_unavailable_on_cpu_is_clean():
    from measure.head.triton_head import triton_available

    if torch.cuda.is_available():
        pytest.skip("CPU-only check")
    assert triton_available() is False
    with pytest.raises(ValueError, match="needs CUDA"):
        from measure.head.triton_head import triton_gather_project

        triton_gather_project(torch.zeros(4, 2), torch.zeros(1, 2, dtype=torch.int64), torch.zeros(1, 2))


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1, 3000, 640), (3, 1000, 576), (2, 77, 100), (1, 1, 64)])
def test_triton_kernel_matches_torch_reference(dtype, shape):
    _needs_triton()
    from measure.head.triton_head import triton_gather_project, triton_gather_project_argmax

    n, k, h = shape
    v = 50_000
    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(v, h, device="cuda", generator=g).to(dtype)
    x = torch.randn(n, h, device="cuda", generator=g).to(dtype)
    ids = torch.stack([torch.randperm(v, device="cuda", generator=g)[:k] for _ in range(n)])
    got = triton_gather_project(w, ids, x)
    ref32 = torch_gather_project(w.float(), ids, x.float())  # float32 reference
    tol = {torch.float32: 1e-4, torch.bfloat16: 1e-3, torch.float16: 1e-3}[dtype]
    torch.testing.assert_close(got, ref32, rtol=tol, atol=tol * h ** 0.5)
    ref = torch_gather_project(w, ids, x)  # same dtype as the CPU path
    torch.testing.assert_close(got, ref, rtol=2e-2, atol=2e-2 * h ** 0.5)
    am = triton_gather_project_argmax(w, ids, x)
    assert torch.equal(am, ids.gather(1, got.argmax(1, keepdim=True)).squeeze(1))


@gpu
def test_pruned_head_on_cuda_triton_equals_torch_backend(head, clusters):
    _needs_triton()
    lin = nn.Linear(H, V, bias=False).cuda().requires_grad_(False)
    lin.weight.copy_(head.weight)
    x = torch.randn(4, H, device="cuda", generator=torch.Generator(device="cuda").manual_seed(2))
    a = PrunedLMHead.clustered(lin, clusters, 300, backend="triton")
    b = PrunedLMHead.clustered(lin, clusters, 300, backend="torch")
    torch.testing.assert_close(a(x), b(x), rtol=1e-4, atol=1e-4)
    assert torch.equal(a.greedy(x), b.greedy(x))
    full = PrunedLMHead.clustered(lin, clusters, V, backend="triton")
    torch.testing.assert_close(full(x[:1]), lin(x[:1]), rtol=1e-4, atol=1e-4)


@gpu
def test_lowrank_head_on_cuda_triton_equals_torch_backend(head):
    _needs_triton()
    from measure.head.lowrank import accumulate_moment, fit_lowrank

    lin = nn.Linear(H, V, bias=False).cuda().requires_grad_(False)
    lin.weight.copy_(head.weight)
    scorer = fit_lowrank(head.weight, accumulate_moment([torch.randn(256, H, generator=torch.Generator().manual_seed(4))]),
                         8)
    x = torch.randn(4, H, device="cuda", generator=torch.Generator(device="cuda").manual_seed(3))
    a = PrunedLMHead.lowrank(lin, scorer, 300, always_keep=[7], backend="triton")
    b = PrunedLMHead.lowrank(lin, scorer, 300, always_keep=[7], backend="torch")
    assert torch.equal(a.select(x), b.select(x))
    torch.testing.assert_close(a(x), b(x), rtol=1e-4, atol=1e-4)
    assert torch.equal(a.greedy(x), b.greedy(x))


@gpu
def test_triton_argmax_tie_rule_and_strided_weight_on_cuda():
    # the same cases as the interpreter test (tests/measure/head/test_triton_interpret.py), on the real GPU code
    _needs_triton()
    from measure.head.triton_head import triton_gather_project, triton_gather_project_argmax

    g = torch.Generator(device="cuda").manual_seed(1)
    w = torch.randn(500, 200, device="cuda", generator=g)[:, :100]  # row stride 200 != H
    x = torch.randn(3, 100, device="cuda", generator=g).abs()
    ids = torch.stack([torch.randperm(500, device="cuda", generator=g)[:70] for _ in range(3)])
    torch.testing.assert_close(triton_gather_project(w, ids, x), torch_gather_project(w, ids, x), rtol=1e-4, atol=1e-3)
    w = w.clone()
    for row in range(3):
        for p in (40, 3, 69):  # equal maxima in blocks 1, 0 and 2: the first position wins
            w[ids[row, p]] = 10.0
    assert torch.equal(triton_gather_project_argmax(w, ids, x), ids[:, 3])
    assert torch.equal(triton_gather_project_argmax(w, ids, torch.zeros_like(x)), ids[:, 0])
