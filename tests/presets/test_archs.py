"""Any model's architecture from its config.json: parameter counts, MoE expert reads, MLA's KV cache."""

from __future__ import annotations

import pytest

from presets.archs import Architecture
from presets.models import MODELS

DEEPSEEK_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 61, "hidden_size": 7168,
               "num_attention_heads": 128, "num_key_value_heads": 128, "intermediate_size": 18432,
               "vocab_size": 129280, "max_position_embeddings": 163840, "n_routed_experts": 256,
               "num_experts_per_tok": 8, "moe_intermediate_size": 2048, "n_shared_experts": 1,
               "first_k_dense_replace": 3, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
               "qk_nope_head_dim": 128, "v_head_dim": 128}


def test_deepseek_v3_counts_671b_and_37b_active() -> None:
    a = Architecture.from_config(DEEPSEEK_V3, "DeepSeek-V3")
    assert a.kind == "moe+mla"
    assert a.params == pytest.approx(671e9, rel=0.01)
    assert a.active_params(1) == pytest.approx(37e9, rel=0.03)
    assert a.kv_bytes_per_token(1.0) == 61 * (512 + 64)  # the latent and the rope key, per layer


def test_more_tokens_read_more_experts_up_to_all() -> None:
    a = Architecture.from_config(DEEPSEEK_V3, "DeepSeek-V3")
    touched = [a.experts_touched(t) for t in (1, 4, 32, 10_000)]
    assert touched[0] == pytest.approx(8) and touched == sorted(touched) and touched[-1] == pytest.approx(256)


@pytest.mark.parametrize("name", list(MODELS))
def test_presets_count_as_their_model_spec(name: str) -> None:
    m = MODELS[name]
    assert Architecture.from_model_spec(m).params == pytest.approx(m.counted_params(), rel=1e-3)


def test_a_config_without_layers_is_one_line() -> None:
    with pytest.raises(ValueError, match="lacks 'num_hidden_layers'"):
        Architecture.from_config({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
                                  "num_attention_heads": 4, "vocab_size": 10}, "x")


def test_an_eagle_head_of_an_moe_mla_target_is_a_dense_llama_layer() -> None:
    dense = Architecture.from_config(DEEPSEEK_V3, "DeepSeek-V3").as_dense_layer()
    assert dense.kind == "dense" and dense.architecture == "LlamaForCausalLM"
    assert (dense.n_heads, dense.n_kv_heads, dense.head_dim) == (56, 8, 128)
    assert dense.layer_params == dense.attention_params + 3 * 7168 * 18432
