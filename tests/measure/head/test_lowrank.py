"""Tests of measure.head.lowrank and the ``lowrank`` variant of measure.head.pruned_head."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from measure.head.lowrank import (HiddenMoment, accumulate_moment, fit_lowrank, load_or_collect_moment,
                             model_fingerprint)
from measure.head.pruned_head import LowRankSelector, PrunedLMHead

V, H = 1500, 24


def _weight(seed: int = 0) -> torch.Tensor:
    return torch.randn(V, H, generator=torch.Generator().manual_seed(seed))


def _anisotropic_hidden(n: int, seed: int) -> torch.Tensor:
    """Hidden states with a few dominant directions, as language models have."""
    g = torch.Generator().manual_seed(seed)
    scales = torch.logspace(1.5, -1.0, H)
    rot = torch.linalg.qr(torch.randn(H, H, generator=torch.Generator().manual_seed(99)))[0]
    return (torch.randn(n, H, generator=g) * scales) @ rot.T


def test_accumulate_moment_is_mean_outer_product():
    a, b = torch.randn(3, 5, H), torch.randn(7, H)
    m = accumulate_moment([a, b])
    x = torch.cat([a.reshape(-1, H), b]).double()
    assert m.n == 22
    torch.testing.assert_close(m.moment, x.T @ x / 22)


def test_full_rank_scorer_reproduces_exact_logits():
    w = _weight()
    h = _anisotropic_hidden(400, 1)
    sc = fit_lowrank(w, accumulate_moment([h]), H)
    assert sc.rank == H and sc.vocab_size == V
    assert sc.logit_energy == pytest.approx(1.0, abs=1e-9)
    x = _anisotropic_hidden(16, 2)
    torch.testing.assert_close(sc.scores(x), x @ w.T, rtol=1e-3, atol=1e-3)


def test_energy_grows_with_rank_and_whitening_beats_plain_svd_on_held_out_states():
    w = _weight()
    fit_h, test_h = _anisotropic_hidden(4000, 3), _anisotropic_hidden(2000, 4)
    moment = accumulate_moment([fit_h])
    energies = [fit_lowrank(w, moment, r).logit_energy for r in (1, 4, 8, 16, H)]
    assert energies == sorted(energies) and 0 < energies[0] < 1
    exact = test_h @ w.T
    whitened = fit_lowrank(w, moment, 6)
    plain = fit_lowrank(w, HiddenMoment(torch.eye(H, dtype=torch.float64), 1), 6)  # SVD of W alone
    err_w = (whitened.scores(test_h) - exact).pow(2).mean()
    err_p = (plain.scores(test_h) - exact).pow(2).mean()
    assert err_w < 0.5 * err_p
    # and so it keeps the true argmax among its top 50 more often
    top = exact.argmax(1, keepdim=True)

    def recall(sc):
        return (torch.topk(sc.scores(test_h), 50, dim=1).indices == top).any(1).float().mean()

    assert recall(whitened) > recall(plain)


def test_bad_rank_and_shape_errors_are_one_line():
    w = _weight()
    m = accumulate_moment([torch.randn(10, H)])
    for r in (0, H + 1, 2.5, True):
        with pytest.raises(ValueError, match=r"rank=.* must be an integer in 1\.\.24"):
            fit_lowrank(w, m, r)
    with pytest.raises(ValueError, match="hidden size is 24"):
        fit_lowrank(w, accumulate_moment([torch.randn(4, H + 1)]), 2)
    with pytest.raises(ValueError, match="no hidden states"):
        accumulate_moment([])
    lin = nn.Linear(H + 1, V, bias=False)
    with pytest.raises(ValueError, match="low-rank scorer is for a"):
        PrunedLMHead.lowrank(lin, fit_lowrank(w, m, 4), 10)


def _head() -> nn.Linear:
    lin = nn.Linear(H, V, bias=False).requires_grad_(False)
    lin.weight.copy_(_weight())
    return lin


def test_lowrank_head_full_k_is_dense_and_exact_rank_keeps_exact_top_k():
    lin = _head()
    h = _anisotropic_hidden(300, 5)
    x = _anisotropic_hidden(6, 6)
    exact = fit_lowrank(lin.weight, accumulate_moment([h]), H)
    full = PrunedLMHead.lowrank(lin, exact, V, always_keep=[3])
    torch.testing.assert_close(full(x), lin(x), rtol=1e-5, atol=1e-5)
    assert torch.equal(full.greedy(x), lin(x).argmax(-1))
    # exact scores: the kept set is the true top-K (plus the always-keep token)
    k = 40
    p = PrunedLMHead.lowrank(lin, exact, k)
    ids = p.project(x).ids
    true_top = torch.topk(lin(x), k, dim=1).indices
    assert all(set(a) == set(b) for a, b in zip(ids.tolist(), true_top.tolist()))
    assert torch.equal(p.greedy(x), lin(x).argmax(-1))


@pytest.mark.parametrize("k", [1, 2, 77, V])
def test_lowrank_selector_k_distinct_ids_with_always_keep_first_priority(k):
    lin = _head()
    sc = fit_lowrank(lin.weight, accumulate_moment([_anisotropic_hidden(200, 7)]), 4)
    keep = [1400, 7] if k >= 2 else [1400]
    sel = LowRankSelector(sc, keep)
    ids = sel.select(_anisotropic_hidden(5, 8), k)
    assert ids.shape == (5, k)
    for row in ids.tolist():
        assert len(set(row)) == k and set(keep) <= set(row)
    with pytest.raises(ValueError, match="smaller than the 2 always-keep"):
        PrunedLMHead.lowrank(lin, sc, 1, always_keep=[1, 2])
    with pytest.raises(ValueError, match="exceeds the vocabulary size"):
        PrunedLMHead.lowrank(lin, sc, V + 1)


def test_lowrank_bf16_factors_follow_the_head_dtype():
    lin = _head().to(torch.bfloat16)
    sc = fit_lowrank(lin.weight.float(), accumulate_moment([_anisotropic_hidden(200, 9)]), 8)
    p = PrunedLMHead.lowrank(lin, sc, 100)
    assert p.selector.factors.dtype == torch.bfloat16 and p.selector.proj.dtype == torch.float32
    out = p(_anisotropic_hidden(2, 10).bfloat16())
    assert out.dtype == torch.bfloat16 and int(torch.isfinite(out).sum()) == 200


def test_moment_cache_round_trip_and_corrupt_file(tmp_path):
    calls = []

    def collect():
        calls.append(1)
        return accumulate_moment([torch.arange(2 * H, dtype=torch.float32).reshape(2, H)])

    a, cached_a = load_or_collect_moment("fp0", "texts=4", collect, tmp_path)
    b, cached_b = load_or_collect_moment("fp0", "texts=4", collect, tmp_path)
    assert (cached_a, cached_b, len(calls)) == (False, True, 1)
    torch.testing.assert_close(a.moment, b.moment)
    assert b.n == 2
    _, cached_c = load_or_collect_moment("fp0", "texts=8", collect, tmp_path)  # other text: other key
    assert not cached_c and len(calls) == 2
    for f in tmp_path.glob("moment-*.pt"):
        f.write_bytes(b"not a torch file")
    _, cached_d = load_or_collect_moment("fp0", "texts=4", collect, tmp_path)
    assert not cached_d and len(calls) == 3


def test_model_fingerprint_sees_every_parameter():
    a = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    b = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    b.load_state_dict(a.state_dict())
    assert model_fingerprint(a) == model_fingerprint(b)
    with torch.no_grad():
        b[1].weight[0] += 1e-3  # a body parameter, not the head
    assert model_fingerprint(a) != model_fingerprint(b)


def test_recall_table_counts_kept_argmax_per_domain_with_wilson_interval():
    from measure.head.head_recall import recall_table

    lin = _head()
    hidden = _anisotropic_hidden(120, 11)
    doms = ["code"] * 80 + ["conversation"] * 40
    exact = fit_lowrank(lin.weight, accumulate_moment([_anisotropic_hidden(500, 12)]), H)
    argmax = lin(hidden).argmax(-1)
    # a static subset that holds the argmax of exactly the first 30 positions
    counts = torch.zeros(V, dtype=torch.int64)
    first = argmax[:30].unique()
    counts[first] = 1000
    heads = {("lowrank-exact", 5): PrunedLMHead.lowrank(lin, exact, 5),
             ("frequency", int(first.numel())): PrunedLMHead.frequency(lin, counts, int(first.numel()))}
    t = recall_table(heads, lin, hidden, doms, chunk=16)
    row = t.set_index(["selector", "domain"])
    assert row.loc[("lowrank-exact", "all"), "recall"] == 1.0
    assert row.loc[("lowrank-exact", "code"), "positions"] == 80
    expected = float(torch.isin(argmax, first).float().mean())
    assert row.loc[("frequency", "all"), "recall"] == pytest.approx(expected)
    assert expected >= 30 / 120
    for _, r in t.iterrows():
        assert r.ci95_low <= r.recall <= r.ci95_high


def test_head_recall_cli_rejects_unknown_domain_in_one_line(capsys):
    from measure.__main__ import main

    assert main(["head-recall", "--domains", "poetry", "--out", "unused"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("python -m measure head-recall: error: --domains 'poetry': unknown domain; "
                   "valid: code, conversation, docs")


def test_head_recall_cli_rejects_non_integer_k_in_one_line(capsys):
    from measure.__main__ import main

    assert main(["head-recall", "--ks", "3k", "--out", "unused"]) == 2
    assert capsys.readouterr().err.strip() == ("python -m measure head-recall: error: --ks value '3k' is not an "
                                               "integer (comma-separated integers expected)")
