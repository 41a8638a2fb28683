"""Tests of measure.engines.transformers: static-cache roll-back, compiled steps, the engine and its peer."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from measure.decoding import autoregressive_generate, speculative_generate
from measure.engines.transformers.drafts import make_draft
from measure.engines import make_engine
from measure.seam import Decoder, Engine, EngineOptions, PeerResult, TargetModel
from measure.engines.transformers import TransformersDecoder, peer_generate
from measure.engines.transformers.models import load_model
from sim.policies import make_policy
from tests.support.tiny_models import save_tiny as _save_tiny, tiny_prompt as _prompt


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return {fam: load_model(_save_tiny(tmp_path_factory.mktemp(fam), fam)) for fam in ("llama", "gpt2", "gemma3")}


@pytest.mark.parametrize("cache", ["static", "dynamic"])
@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3"])
def test_rollback_equals_recomputation(tiny, family, cache):
    """Prefill, feed 6 drafts, keep 2, continue: logits equal a cache-free recomputation (gemma3: window 6 < 16)."""
    model = tiny[family].model
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 96, (1, 20), generator=g)  # [1, 20]
    drafts = torch.randint(0, 96, (1, 6), generator=g)
    dec = TransformersDecoder(model, EngineOptions(cache=cache, max_len_tokens=24))
    assert isinstance(dec, Decoder)
    dec.forward(ids[:, :10], last_only=True)
    dec.forward(drafts)
    dec.rollback(12)
    assert dec.n_cached == 12
    got = dec.forward(ids[:, 12:18])  # [6, V]
    seq = torch.cat([ids[:, :10], drafts[:, :2], ids[:, 12:18]], dim=1)  # [1, 18]
    with torch.inference_mode():
        want = model(seq).logits[0, 12:].float()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    # roll back to the prompt and take another branch: still exact
    dec.rollback(10)
    again = dec.forward(ids[:, 10:14])
    with torch.inference_mode():
        want2 = model(ids[:, :14]).logits[0, 10:].float()
    torch.testing.assert_close(again, want2, atol=1e-4, rtol=1e-4)
    top = dec.forward_argmax(ids[:, 14:16])  # the greedy fast path: the same argmax, on the device
    dec.rollback(14)
    assert torch.equal(top, dec.forward(ids[:, 14:16]).argmax(-1))


def test_static_rollback_moves_the_position_only(tiny):
    dec = TransformersDecoder(tiny["llama"].model, EngineOptions(max_len_tokens=32))
    dec.forward(_prompt(96, 12))
    keys = [layer.keys for layer in dec.cache.layers]
    dec.rollback(5)
    assert [layer.keys for layer in dec.cache.layers] == keys  # same tensors: nothing cropped, nothing copied
    assert all(int(layer.cumulative_length) == 5 for layer in dec.cache.layers) and dec.n_cached == 5
    dec.reset()
    assert dec.n_cached == 0


def test_static_cache_grows_past_its_size_and_stays_exact(tiny):
    model = tiny["llama"].model
    dec = TransformersDecoder(model, EngineOptions(max_len_tokens=8))
    ids = torch.randint(0, 96, (1, 30), generator=torch.Generator().manual_seed(5))
    dec.forward(ids[:, :6])
    got = dec.forward(ids[:, 6:30])  # needs 30 > 8 positions
    assert dec.capacity_tokens >= 30
    with torch.inference_mode():
        torch.testing.assert_close(got, model(ids).logits[0, 6:].float(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("cache", ["static", "dynamic"])
@pytest.mark.parametrize("draft_spec", ["early:2", "bf16", "int8", "ngram:2", "ngram:2:first"])
def test_every_draft_kind_lossless_with_both_caches(tiny, cache, draft_spec):
    base = tiny["gemma3"]  # the sliding-window family: the static cache must honour the window
    target = dataclasses.replace(base, engine_options=EngineOptions(cache=cache, max_len_tokens=64))
    ids = _prompt(target.vocab_size, 14, seed=2)
    ref = autoregressive_generate(base.new_decoder(), ids, 0.0, 28)
    assert autoregressive_generate(target.new_decoder(), ids, 0.0, 28).tokens == ref.tokens
    draft = make_draft(draft_spec, target)
    assert getattr(draft, "decoder", None) is None or draft.decoder.cache_kind == cache
    for pol in ("fixed:3", "heuristic:2"):
        spec = speculative_generate(target.new_decoder(), draft, ids, make_policy(pol), 0.0, 28)
        assert spec.tokens == ref.tokens, (pol, cache)


@pytest.mark.slow
def test_compiled_steps_are_lossless_and_compile_time_is_kept_apart(tmp_path):
    """One small compile test (inductor on 2 cores is slow): baseline, a model draft and a lookup draft."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=8, max_position_embeddings=128)
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        m.lm_head.weight.mul_(8.0)
    m.save_pretrained(tmp_path)
    eager = load_model(str(tmp_path))
    target = dataclasses.replace(eager, engine_options=EngineOptions(compile=True, max_len_tokens=64))
    ids = _prompt(64, 12, seed=1)
    ref = autoregressive_generate(eager.new_decoder(), ids, 0.0, 20).tokens
    dec = target.new_decoder()  # the caller's decoder, reused by every generation below
    assert autoregressive_generate(dec, ids, 0.0, 20).tokens == ref
    assert dec.compile and dec.compile_s > 0
    for spec in ("early:1", "ngram:2:first"):
        draft = make_draft(spec, target)
        for _ in range(2):  # the second run reuses the compiled steps
            assert speculative_generate(dec, draft, ids, make_policy("fixed:3"), 0.0, 20).tokens == ref, spec
    first = dec.compile_s
    speculative_generate(dec, make_draft("ngram:2", target), ids, make_policy("fixed:3"), 0.0, 20)
    assert dec.compile_s == first  # nothing compiled again
    with pytest.raises(ValueError, match="--compile needs --cache static"):
        TransformersDecoder(m, EngineOptions(cache="dynamic", compile=True))


def test_engine_seam_and_like_for_like_peer(tiny):
    engine = make_engine("transformers", EngineOptions(max_len_tokens=64))
    assert isinstance(engine, Engine) and engine.name == "transformers"
    assert engine.versions()["cache"] == "static"
    target = dataclasses.replace(tiny["llama"], engine_options=engine.options)
    assert isinstance(target, TargetModel) and isinstance(target.new_decoder(), Decoder)
    ids = _prompt(96, 16, seed=3)
    ref = autoregressive_generate(target.new_decoder(), ids, 0.0, 24)
    for spec in ("ngram:2:first", "early:2"):
        draft = engine.make_draft(spec, target, seed=1)
        peer = engine.peer_generate(target, draft, ids, 3, 0.0, 24, 0)
        assert isinstance(peer, PeerResult) and peer.wall_s > 0
        assert peer.tokens == ref.tokens, spec
    assert peer_generate(dataclasses.replace(target, model=None), draft, ids, 3, 0.0, 4, 0) is None
    with pytest.raises(ValueError, match="--engine 'nope'"):
        make_engine("nope", EngineOptions())


def test_encode_and_load_target_through_the_engine(tiny, tmp_path):
    engine = make_engine("transformers", EngineOptions(cache="dynamic"))
    t = engine.load_target(str(_save_tiny(tmp_path, "llama")), device="cpu", dtype="float32", seed=0)
    assert t.engine_options.cache == "dynamic" and t.new_decoder().cache_kind == "dynamic"
    ids = engine.encode(t, "hello world", 4)
    assert ids.shape == (1, 4) and ids.dtype == torch.long
