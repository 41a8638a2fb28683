"""Tests of measure.decoding and measure.drafts on tiny random models saved to disk and loaded back."""

from __future__ import annotations

import pytest
import torch

from measure.decoding import accept_tokens, acceptance_trace, autoregressive_generate, proposal_runs, speculative_generate
from measure.drafts import NGramDraft
from measure.engines.transformers.decoder import crop_cache, forward_logits, new_cache
from measure.drafts import parse_layers
from measure.engines.transformers.drafts import make_draft
from measure.engines.transformers.models import load_model
from sim.policies import make_policy
from tests.support.tiny_models import save_tiny as _save_tiny, tiny_prompt as _prompt


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    return {fam: load_model(_save_tiny(tmp_path_factory.mktemp(fam), fam)) for fam in ("llama", "gpt2", "gemma3")}


DRAFTS = ["early:2", "layers:0,3", "int8", "bf16", "ngram:2", "ngram:3"]


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3"])
@pytest.mark.parametrize("draft_spec", DRAFTS)
def test_greedy_speculative_equals_baseline(tiny_models, family, draft_spec):
    target = tiny_models[family]
    ids = _prompt(target.vocab_size)
    base = autoregressive_generate(target.new_decoder(), ids, 0.0, 24)
    assert base.new_tokens == 24
    draft = make_draft(draft_spec, target)
    pols = ("fixed:1", "fixed:4", "heuristic:2", "threshold:3") if family == "llama" else ("fixed:3", "heuristic:2")
    for pol in pols:
        spec = speculative_generate(target.new_decoder(), draft, ids, make_policy(pol), 0.0, 24)
        assert spec.tokens == base.tokens, (pol, spec.tokens, base.tokens)
        assert sum(r.accepted for r in spec.rounds) + len(spec.rounds) + 1 == 24
        for r in spec.rounds:
            assert 0 <= r.accepted <= r.drafted <= r.gamma and r.draft_ms >= 0 and r.verify_ms > 0


def test_bf16_draft_accepts_and_layer_draft_shares_weights(tiny_models):
    target = tiny_models["llama"]
    ids = _prompt(target.vocab_size)
    spec = speculative_generate(target.new_decoder(), make_draft("bf16", target), ids, make_policy("fixed:4"), 0.0, 30)
    assert spec.accepted / spec.drafted > 0.5  # a near-copy of the target must mostly agree
    d = make_draft("early:2", target)
    assert d.model.model.embed_tokens.weight is target.model.model.embed_tokens.weight
    assert d.model.lm_head is not target.model.lm_head  # swappable without touching the target
    assert len(d.model.model.layers) == 2 and len(target.model.model.layers) == 4


def test_swapped_lm_head_with_masked_logits_still_lossless(tiny_models):
    """A pruned head returning -inf outside a kept subset (what the pruned-head draft does)."""
    target = tiny_models["llama"]
    draft = make_draft("early:3", target)
    head = draft.model.lm_head
    keep = torch.zeros(target.vocab_size, dtype=torch.bool)
    keep[: target.vocab_size // 2] = True

    class Masked(torch.nn.Module):
        def forward(self, h):
            return head(h).masked_fill(~keep, float("-inf"))

    draft.model.lm_head = Masked()
    ids = _prompt(target.vocab_size)
    base = autoregressive_generate(target.new_decoder(), ids, 0.0, 20)
    for temp in (0.0, 1.0):
        g = torch.Generator().manual_seed(0)
        spec = speculative_generate(target.new_decoder(), draft, ids, make_policy("fixed:3"), temp, 20, g)
        assert spec.new_tokens == 20
        if temp == 0:
            assert spec.tokens == base.tokens


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3"])
def test_kv_rollback_equals_recomputation(tiny_models, family):
    model = tiny_models[family].model
    ids = torch.randint(0, 96, (1, 20), generator=torch.Generator().manual_seed(3))  # [1, 20]
    cache = new_cache()
    forward_logits(model, ids[:, :10], cache)
    forward_logits(model, torch.randint(0, 96, (1, 6)), cache)  # 6 "draft" tokens, then reject 4
    crop_cache(cache, 12)
    assert cache.get_seq_length() == 12
    forward_logits(model, ids[:, 10:12], None)  # (no-op on the cache)
    # the 2 kept "drafts" were random: recompute with the same ones by rebuilding
    cache2 = new_cache()
    forward_logits(model, ids[:, :10], cache2)
    drafts = torch.randint(0, 96, (1, 6), generator=torch.Generator().manual_seed(4))
    forward_logits(model, drafts, cache2)
    crop_cache(cache2, 12)
    seq = torch.cat([ids[:, :10], drafts[:, :2], ids[:, 12:16]], dim=1)  # [1, 16]
    got = forward_logits(model, ids[:, 12:16], cache2)  # [1, 4, V]
    want = forward_logits(model, seq, None)[:, 12:]  # full recomputation without a cache
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_accept_tokens_greedy_rules():
    V = 5
    logits = torch.full((4, V), -10.0)
    for i, t in enumerate([1, 2, 3, 4]):
        logits[i, t] = 10.0  # target argmax per position: 1, 2, 3, 4
    assert accept_tokens(logits, torch.tensor([1, 2, 3]), None, 0.0, None) == (3, 4)  # all + bonus
    assert accept_tokens(logits, torch.tensor([1, 0, 3]), None, 0.0, None) == (1, 2)  # correction
    assert accept_tokens(logits[:1], torch.tensor([], dtype=torch.long), None, 0.0, None) == (0, 1)


def test_rejection_sampling_output_distribution_equals_target():
    """Chi-square: the token emitted at a draft position is distributed as the target's p."""
    from scipy.stats import chisquare

    V, N = 6, 5000
    g = torch.Generator().manual_seed(0)
    p_logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, 0.3], [0.0] * 6])  # [2, V]: position 1 + bonus
    q = torch.softmax(torch.tensor([[0.0, 2.0, 0.0, 1.5, 0.0, -2.0]]), -1)  # [1, V], far from p
    counts = torch.zeros(V)
    for _ in range(N):
        x = torch.multinomial(q[0], 1, generator=g)  # draft draws from q
        n, nxt = accept_tokens(p_logits, x, q, 1.0, g)
        counts[int(x) if n == 1 else nxt] += 1
    p = torch.softmax(p_logits[0], -1)
    stat, pval = chisquare(counts.numpy(), (p * N).numpy())
    assert pval > 1e-3, (counts / N, p)
    # and it is not q's distribution
    assert chisquare(counts.numpy(), (q[0] * N).numpy())[1] < 1e-6


@pytest.mark.slow
def test_speculative_sampling_matches_target_marginal(tmp_path):
    """End to end on a vocabulary of 8: the 2nd generated token's law equals the target's marginal."""
    from scipy.stats import chisquare

    target = load_model(_save_tiny(tmp_path / "t8", "llama", vocab=8, seed=5))
    target.model.get_output_embeddings().weight.data.mul_(0.05)  # soften back to a spread-out law
    draft = make_draft("early:1", target)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        p1 = torch.softmax(forward_logits(target.model, ids, None)[0, -1], -1)  # [V]
        seqs = torch.cat([ids.repeat(8, 1), torch.arange(8)[:, None]], dim=1)  # [8, 5]
        p2 = torch.softmax(target.model(seqs).logits[:, -1].float(), -1)  # [8, V]
    marginal = (p1[:, None] * p2).sum(0)  # P(t2) = Σ_t1 p(t1) p(t2 | t1)
    N = 700
    counts = torch.zeros(8)
    for s in range(N):
        out = speculative_generate(target.new_decoder(), draft, ids, make_policy("fixed:2"), 1.0, 3,
                                   torch.Generator().manual_seed(s))
        counts[out.tokens[1]] += 1
    assert chisquare(counts.numpy(), (marginal * N).numpy())[1] > 1e-3


def test_acceptance_trace_predicts_greedy_rounds(tiny_models):
    target = tiny_models["llama"]
    ids = _prompt(target.vocab_size)
    base = autoregressive_generate(target.new_decoder(), ids, 0.0, 24)
    draft = make_draft("early:2", target)
    full = torch.cat([ids, torch.tensor([base.tokens])], dim=1)
    flags = acceptance_trace(target.new_decoder(), draft, full, ids.shape[1], 0.0)
    assert len(flags) == 24 and set(flags) <= {0.0, 1.0}
    spec = speculative_generate(target.new_decoder(), draft, ids, make_policy("fixed:3"), 0.0, 24)
    pos = 1  # token 0 comes from the prefill; round r starts at generated position `pos`
    for r in spec.rounds:
        run = 0
        while run < r.drafted and flags[pos + run] == 1.0:
            run += 1
        assert r.accepted == run
        pos += r.accepted + 1
    sampled = acceptance_trace(target.new_decoder(), draft, full, ids.shape[1], 1.0)
    assert all(0.0 <= v <= 1.0 + 1e-6 for v in sampled)


@pytest.mark.parametrize("draft_spec", ["ngram:2", "ngram:3", "early:2", "bf16"])
def test_proposal_runs_replay_the_real_greedy_loop_round_by_round(tiny_models, draft_spec):
    """sim.acceptance.RunTraceAcceptance on measure's proposal runs = the loop's own rounds, at every γ."""
    import numpy as np

    from sim.acceptance import RunTraceAcceptance

    target = tiny_models["llama"]
    ids = _prompt(target.vocab_size, n=16, seed=3)
    n_new = 40
    base = autoregressive_generate(target.new_decoder(), ids, 0.0, n_new)
    draft = make_draft(draft_spec, target)
    full = torch.cat([ids, torch.tensor([base.tokens])], dim=1)
    flags = acceptance_trace(target.new_decoder(), draft, full, ids.shape[1], 0.0)
    proposed, runs = proposal_runs(draft, full, ids.shape[1], flags, gamma_max=8)
    assert len(proposed) == len(runs) == base.new_tokens
    assert all(0 <= r <= k <= 8 for k, r in zip(proposed, runs))
    trace = RunTraceAcceptance(((np.array(proposed), np.array(runs)),), gamma_max=8)
    seen_short = False
    for g in (1, 2, 3, 5, 8):
        spec = speculative_generate(target.new_decoder(), draft, ids, make_policy(f"fixed:{g}"), 0.0, n_new)
        assert spec.tokens == base.tokens
        starts, drafted, accepted = trace.replay(g)
        assert [r.drafted for r in spec.rounds] == drafted.tolist(), g
        assert [r.accepted for r in spec.rounds] == accepted.tolist(), g
        assert [r.context_tokens - ids.shape[1] for r in spec.rounds] == starts.tolist()
        seen_short |= any(r.drafted < min(g, n_new - 1 - (r.context_tokens - ids.shape[1])) for r in spec.rounds)
    if draft_spec.startswith("ngram"):
        assert seen_short  # the lookup drafted fewer than γ somewhere: the case flag replay got wrong


def test_ngram_lookup():
    d = NGramDraft("ngram:2", 2)
    assert d.lookup([5, 6, 7, 8, 5, 6], 3) == [7, 8, 5]
    assert d.lookup([1, 2, 3], 4) == []
    assert d.lookup([9, 1, 2, 9, 3, 9], 2) == [3, 9]  # most recent earlier occurrence of [9]


def test_draft_errors(tiny_models):
    t = tiny_models["llama"]
    with pytest.raises(ValueError, match="unknown draft kind 'nope'.*valid: model:<spec>"):
        make_draft("nope", t)
    with pytest.raises(ValueError, match="1 <= N < 4"):
        make_draft("early:4", t)
    with pytest.raises(ValueError, match="0..3"):
        parse_layers("0-9", 4)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        autoregressive_generate(t.new_decoder(), _prompt(96), -1.0, 4)


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3"])
def test_last_only_projects_one_position_and_matches_full_logits(tiny_models, family):
    from measure.engines.transformers.decoder import forward_logits, new_cache

    m = tiny_models[family].model
    ids = _prompt(96, 12, seed=4)
    seen: list[tuple[int, ...]] = []
    strides: list[tuple[int, ...]] = []

    def hook(_m, a):
        seen.append(tuple(a[0].shape))
        strides.append(tuple(a[0].stride()))

    h = m.get_output_embeddings().register_forward_pre_hook(hook)
    try:
        full = forward_logits(m, ids, None)
        last = forward_logits(m, ids, new_cache(), last_only=True)
    finally:
        h.remove()
    assert last.shape == (1, 1, 96) and seen[-1][1] == 1  # the head saw one position
    # ... as a fresh [1, 1, H] tensor, not a strided view of [1, S, H]: CPU bf16 F.linear is ~40x slower on the view
    hdim = seen[-1][2]
    assert strides[-1] == (hdim, hdim, 1)
    torch.testing.assert_close(last, full[:, -1:], rtol=1e-4, atol=1e-4)


def test_last_only_falls_back_for_models_without_logits_to_keep():
    from types import SimpleNamespace

    from measure.engines.transformers.decoder import forward_logits

    class Plain(torch.nn.Module):
        def forward(self, input_ids, past_key_values=None, use_cache=False):
            return SimpleNamespace(logits=torch.arange(input_ids.shape[1] * 3, dtype=torch.float32).view(1, -1, 3))

    out = forward_logits(Plain(), torch.zeros(1, 4, dtype=torch.long), None, last_only=True)
    assert out.tolist() == [[[9.0, 10.0, 11.0]]]


def test_a_decoder_that_runs_its_own_greedy_loop_is_asked_once_per_generation():
    """The llama.cpp decoder lives in another process: greedy decoding runs its token loop there (one call, no
    message per token); sampling still goes token by token through ``forward``."""
    from measure.seam import GenerationResult

    class Fused:
        vocab_size, n_cached = 4, 0
        calls: list = []

        def greedy_generate(self, input_ids, max_new_tokens, eos_token_ids=()):
            self.calls.append((input_ids.shape[1], max_new_tokens, tuple(eos_token_ids)))
            return GenerationResult((3, 2), int(input_ids.shape[1]), 0.5, 100.0, (100.0, 400.0))

        def reset(self):
            self.n_cached = 0

        def forward(self, input_ids, last_only=False):
            self.n_cached += input_ids.shape[1]
            return torch.tensor([[0.0, 0.0, 0.0, 9.0]])

        def rollback(self, n_tokens):
            self.n_cached = min(self.n_cached, n_tokens)

    dec = Fused()
    ids = torch.tensor([[1, 2, 3]])
    r = autoregressive_generate(dec, ids, 0.0, 2, None, (2,))
    assert r.tokens == (3, 2) and r.wall_s == 0.5 and dec.calls == [(3, 2, (2,))]
    hot = autoregressive_generate(dec, ids, 1.0, 2, torch.Generator().manual_seed(0), (2,))
    assert hot.tokens == (3, 3) and len(dec.calls) == 1  # sampled: token by token, the fused loop not asked
