"""Tests of measure.head.profiling: module classification and the profiler split."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from measure.head.clusters import ClusterConfig, build_clusters
from measure.head.profiling import COMPONENTS, classify_modules, component_ranges, profile_step
from measure.head.pruned_head import PrunedLMHead, swapped_lm_head


def _llama(vocab: int = 512, layers: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval().requires_grad_(False)


def _gpt2(vocab: int = 512):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=vocab, n_positions=256, n_embd=32, n_layer=3, n_head=4)
    return GPT2LMHeadModel(cfg).eval().requires_grad_(False)


@pytest.mark.parametrize("build,layers", [(_llama, 2), (_gpt2, 3)])
def test_classify_finds_outermost_modules(build, layers):
    m = build()
    g = classify_modules(m)
    assert g["lm_head"] == [m.lm_head]
    assert len(g["attention"]) == layers and len(g["mlp"]) == layers
    # outermost only: no classified module is inside another one
    all_mods = g["attention"] + g["mlp"]
    for a in all_mods:
        for b in all_mods:
            if a is not b:
                assert all(sub is not b for sub in a.modules())


def test_hooks_are_removed_after_use():
    m = _llama()
    before = sum(len(x._forward_hooks) + len(x._forward_pre_hooks) for x in m.modules())
    with component_ranges(m):
        during = sum(len(x._forward_hooks) + len(x._forward_pre_hooks) for x in m.modules())
    after = sum(len(x._forward_hooks) + len(x._forward_pre_hooks) for x in m.modules())
    assert during == before + 2 * (1 + 2 + 2)
    assert after == before


@pytest.mark.parametrize("role,n_tokens", [("draft", 1), ("target", 5)])
def test_profile_step_rows(role, n_tokens):
    m = _llama(vocab=4096)
    rows = profile_step(m, "tiny-llama", role, context_tokens=16, n_tokens=n_tokens, repeats=3, warmup=1)
    assert [r.component for r in rows] == list(COMPONENTS)
    assert all(r.role == role and r.model == "tiny-llama" and r.vocab_size == 4096 for r in rows)
    assert all(r.ms >= 0 and 0 <= r.share <= 1 for r in rows)
    for comp in ("lm_head", "attention", "mlp"):
        assert next(r for r in rows if r.component == comp).ms > 0
    assert abs(sum(r.share for r in rows) - 1.0) < 1e-6
    step = rows[0].step_ms
    assert sum(r.ms for r in rows) == pytest.approx(step, rel=1e-6)


def test_profile_works_with_pruned_head():
    m = _llama(vocab=4096)
    cl = build_clusters(m.lm_head.weight, ClusterConfig(n_clusters=32, seed=0, sample_rows=2048))
    with swapped_lm_head(m, PrunedLMHead.clustered(m.lm_head, cl, 256)):
        rows = profile_step(m, "tiny-llama+pruned", "draft", context_tokens=8, repeats=2, warmup=1, head_k=256)
    assert rows[0].head_k == 256
    assert next(r for r in rows if r.component == "lm_head").ms > 0


def test_bad_arguments():
    m = _llama()
    with pytest.raises(ValueError, match="role='verify'"):
        profile_step(m, "x", "verify")
    with pytest.raises(ValueError, match="need context_tokens >= 1"):
        profile_step(m, "x", "draft", context_tokens=0)
    with pytest.raises(ValueError, match="no output embedding"):
        classify_modules(nn.Sequential(nn.Linear(2, 2)))
