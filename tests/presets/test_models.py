"""One model description (presets/models.py): a preset or any config.json; parameter counts, MoE expert reads,
MLA's KV cache."""

from __future__ import annotations

import pytest

from presets.models import MODELS, ModelSpec

DEEPSEEK_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 61, "hidden_size": 7168,
               "num_attention_heads": 128, "num_key_value_heads": 128, "intermediate_size": 18432,
               "vocab_size": 129280, "max_position_embeddings": 163840, "n_routed_experts": 256,
               "num_experts_per_tok": 8, "moe_intermediate_size": 2048, "n_shared_experts": 1,
               "first_k_dense_replace": 3, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
               "qk_nope_head_dim": 128, "v_head_dim": 128}


def test_deepseek_v3_counts_671b_and_37b_active() -> None:
    a = ModelSpec.from_config(DEEPSEEK_V3, "DeepSeek-V3")
    assert a.kind == "moe+mla"
    assert a.params == pytest.approx(671e9, rel=0.01)
    assert a.active_params(1) == pytest.approx(37e9, rel=0.03)
    assert a.kv_bytes_per_token(1.0) == 61 * (512 + 64)  # the latent and the rope key, per layer


def test_more_tokens_read_more_experts_up_to_all() -> None:
    a = ModelSpec.from_config(DEEPSEEK_V3, "DeepSeek-V3")
    touched = [a.experts_touched(t) for t in (1, 4, 32, 10_000)]
    assert touched[0] == pytest.approx(8) and touched == sorted(touched) and touched[-1] == pytest.approx(256)


@pytest.mark.parametrize("name", [n for n, m in MODELS.items() if m.family == "llama"])
def test_a_preset_written_as_config_json_reads_back_the_same(name: str) -> None:
    """The kernel tables get a preset as a config.json; read back, it is the same description and the same price."""
    m = MODELS[name]
    back = ModelSpec.from_config(m.to_config(), m.name, m.hub_id)
    assert back.counted_params() == m.counted_params() and back.architecture == m.architecture
    assert back.forward_flops(4, 512.0, 2) == m.forward_flops(4, 512.0, 2)
    assert back.forward_bytes(4, 512.0, 2, 2.0) == m.forward_bytes(4, 512.0, 2, 2.0)
    assert back.published_params is None and back.params == back.counted_params()


def test_norms_count_in_every_layer_dense_or_moe() -> None:
    moe = ModelSpec.from_config(DEEPSEEK_V3, "DeepSeek-V3")
    assert moe.norm_params == 2 * 7168 and moe.layer_params == (
        moe.attention_params + moe.norm_params + 7168 * 256 + 3 * 7168 * 2048 + 8 * moe.expert_params)


def test_a_config_without_layers_is_one_line() -> None:
    with pytest.raises(ValueError, match="lacks 'num_hidden_layers'"):
        ModelSpec.from_config({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
                                  "num_attention_heads": 4, "vocab_size": 10}, "x")


def test_an_eagle_head_of_an_moe_mla_target_is_a_dense_llama_layer() -> None:
    dense = ModelSpec.from_config(DEEPSEEK_V3, "DeepSeek-V3").as_dense_layer()
    assert dense.kind == "dense" and dense.architecture == "LlamaForCausalLM"
    assert (dense.n_heads, dense.n_kv_heads, dense.head_dim) == (56, 8, 128)
    assert dense.layer_params == dense.attention_params + 3 * 7168 * 18432 + 2 * 7168
