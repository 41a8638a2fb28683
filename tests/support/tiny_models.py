"""Tiny random-weight models saved to disk, and a prompt for them: the tests of decoding, engines and trees
load these instead of a real model (a forward pass takes microseconds; greedy choices are not near-ties)."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def save_tiny(path, family: str, vocab: int = 96, seed: int = 0) -> str:
    """Save a 4-layer ``family`` ("llama", "gpt2" or "gemma3") model with ``vocab`` tokens, weights from
    ``seed``, to ``path``; return the path (a ``--target`` / ``load_model`` argument)."""
    from transformers import AutoModelForCausalLM, Gemma3TextConfig, GPT2Config, LlamaConfig

    cfg = {
        "llama": lambda: LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                     max_position_embeddings=512),
        "gpt2": lambda: GPT2Config(vocab_size=vocab, n_embd=32, n_layer=4, n_head=4, n_positions=512,
                                   bos_token_id=0, eos_token_id=0),
        "gemma3": lambda: Gemma3TextConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                                           num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                           head_dim=8, max_position_embeddings=512, sliding_window=6),
    }[family]()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg)
        with torch.no_grad():  # sharpen the random head so greedy choices are not near-ties
            model.get_output_embeddings().weight.mul_(8.0)
    model.save_pretrained(path)
    return str(path)


def without_eos(path: str) -> str:
    """The saved tiny model at ``path`` without an EOS token (a run's generations then run to
    ``--max-new-tokens``); returns ``path``."""
    for name in ("config.json", "generation_config.json"):
        f = Path(path) / name
        if f.exists():
            d = json.loads(f.read_text())
            d["eos_token_id"] = None
            f.write_text(json.dumps(d))
    return path


def tiny_prompt(vocab: int, n: int = 12, seed: int = 1) -> torch.Tensor:
    """``n`` token ids below ``vocab`` (shape ``(1, n)``), seeded, whose second half repeats the first."""
    base = torch.randint(0, vocab, (1, n // 2), generator=torch.Generator().manual_seed(seed))
    return torch.cat([base, base], dim=1)  # repeated half: gives prompt lookup something to find
