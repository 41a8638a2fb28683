"""Tests of presets: architecture numbers, pairs, hardware roofline curves."""

import itertools

import numpy as np
import pytest

from presets import HARDWARE, MODELS, PAIRS, RooflineForward, get_hardware, get_model, get_pair, make_pair
from sim.cost import RooflineCost

REQUIRED_MODELS = ["gpt2", "distilgpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "Llama-3.2-1B", "Llama-3.2-3B",
                   "Llama-3.1-8B", "Llama-3.1-70B", "TinyLlama-1.1B", "SmolLM2-135M", "SmolLM2-360M",
                   "SmolLM2-1.7B", "Gemma-3-270M"]
REQUIRED_PAIRS = ["gpt2-small-large", "distilgpt2-gpt2-medium", "gpt2-small-xl", "llama3-1b-3b", "llama3-1b-8b",
                  "llama3-8b-70b"]


def test_required_presets_exist():
    assert set(REQUIRED_MODELS) <= set(MODELS)
    assert set(REQUIRED_PAIRS) <= set(PAIRS)
    assert {"h100-sxm", "h200", "a100-80gb", "l4", "t4", "cpu"} <= set(HARDWARE)


@pytest.mark.parametrize("name", list(MODELS))
def test_parameter_count_matches_published(name):
    m = MODELS[name]
    assert abs(m.counted_params() / m.params - 1) < 0.02


def test_pairs_share_vocabulary_and_mismatch_refused():
    for p in PAIRS.values():
        assert p.draft.vocab_size == p.target.vocab_size
        assert 0 <= p.default_alpha <= 1 and p.alpha_source
    with pytest.raises(ValueError, match="shared tokenizer"):
        make_pair("gpt2", "Llama-3.2-3B")


def test_unknown_names_list_valid_ones():
    with pytest.raises(ValueError, match="valid: .*llama3-1b-3b"):
        get_pair("llama3-1b-4b")
    with pytest.raises(ValueError, match="valid: .*h100-sxm"):
        get_hardware("v100")
    with pytest.raises(ValueError, match="valid: .*gpt2-xl"):
        get_model("gpt3")


def _cost(pair: str, hw: str) -> RooflineCost:
    p, h = get_pair(pair), get_hardware(hw)
    return RooflineCost(RooflineForward(p.draft, h), RooflineForward(p.target, h))


def test_presets_give_distinct_curves():
    curves = {}
    for pair, hw in itertools.product(REQUIRED_PAIRS, ["h100-sxm", "a100-80gb", "t4"]):
        c = _cost(pair, hw)
        curves[(pair, hw)] = tuple(round(c.verify_ms(n, 512) + 10 * c.draft_step_ms(512), 9) for n in (1, 4, 16))
    assert len(set(curves.values())) == len(curves)


def test_verify_grows_with_tokens_context_and_batch():
    c = _cost("llama3-1b-8b", "h100-sxm")
    assert c.verify_ms(64, 512) > c.verify_ms(1, 512)
    assert c.verify_ms(4, 32_000) > c.verify_ms(4, 512)
    assert c.verify_ms(4, 512, batch=64) > c.verify_ms(4, 512, batch=1)


def test_roofline_memory_bound_at_batch_one():
    # decoding one token of an 8B model on H100 reads ~16 GB of bf16 weights: ~6 ms at 80% of 3.35 TB/s
    c = _cost("llama3-1b-8b", "h100-sxm")
    weights_ms = MODELS["Llama-3.1-8B"].weight_bytes(2.0) / (3.35e12 * 0.8) * 1e3
    assert np.isclose(c.target_step_ms(0), weights_ms + 0.1 + 0.02 * 32, rtol=0.01)
    assert 0.1 < c.cost_ratio(512) < 0.3


def test_claim_presets_exist_and_device_memory():
    assert {"Llama-2-7B", "Llama-2-13B", "Llama-2-70B", "Vicuna-7B-v1.3", "Vicuna-68M"} <= set(MODELS)
    assert {"llama2-7b-13b", "llama2-7b-70b", "vicuna-68m-7b", "distilgpt2-gpt2-xl"} <= set(PAIRS)
    t4, a100 = get_hardware("t4"), get_hardware("a100-80gb")
    assert t4.memory_bytes == 16e9 and a100.memory_bytes == 80e9 and get_hardware("cpu").memory_bytes is None
    fp16_13b = MODELS["Llama-2-13B"].counted_params() * t4.bytes_per_param
    assert t4.memory_bytes < fp16_13b < a100.memory_bytes  # 26 GB: no T4, fits an A100
    with pytest.raises(ValueError, match="memory_bytes"):
        type(t4)("x", "y", 1e9, 1e12, "float16", 2.0, memory_bytes=0.0)


def test_context_window_is_the_shorter_model_window():
    p = get_pair("gpt2-small-large")
    assert p.context_window_tokens == 1024 and p.shorter_window_model.name == "gpt2"
    mixed = make_pair("SmolLM2-135M", "SmolLM2-1.7B")
    assert mixed.context_window_tokens == 8192
    assert get_pair("llama3-1b-8b").context_window_tokens == 131072
