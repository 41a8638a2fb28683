"""Local model directories the step-cost tests price: a user's own ``config.json``, never a hub download."""

from __future__ import annotations

import json
from pathlib import Path

LLAMA_LIKE = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 16, "hidden_size": 2048,
              "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 8192,
              "vocab_size": 128256, "tie_word_embeddings": True, "max_position_embeddings": 131072,
              "model_type": "llama", "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5, "hidden_act": "silu"}
# Qwen3-30B-A3B's expert shape (the MoE tables are measured per expert shape), fewer layers
MOE_LIKE = {**LLAMA_LIKE, "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 128, "num_experts_per_tok": 8,
            "moe_intermediate_size": 768, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
            "model_type": "qwen3_moe"}


def write_model_dir(path: Path, config: dict) -> Path:
    """``path`` as a model directory holding ``config`` as its config.json."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path
