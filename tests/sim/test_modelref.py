"""Any model by name: presets, shipped hub ids (and their instruct spellings), local directories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim import kernels
from sim.modelref import head_config, resolve_model

needs_kernels = pytest.mark.skipif(kernels.kernels_unavailable() is not None, reason="the costs extra is absent")


def test_a_preset_and_its_hub_id() -> None:
    assert resolve_model("Llama-3.2-1B").arch.n_layers == 16
    if kernels.kernels_unavailable() is not None:
        assert resolve_model("meta-llama/Llama-3.2-1B").origin.startswith("preset Llama-3.2-1B")


@needs_kernels
def test_an_instruct_id_resolves_to_its_shipped_base_config() -> None:
    ref = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    assert ref.kernel_path == "meta-llama/Meta-Llama-3.1-8B" and "same architecture" in ref.origin
    assert resolve_model("deepseek-ai/DeepSeek-R1").arch.kind == "moe+mla"


def test_a_local_directory(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 256,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000}))
    ref = resolve_model(str(tmp_path))
    assert ref.arch.head_dim == 64 and ref.kernel_path == str(tmp_path.resolve())
    head = head_config(ref, "eagle3", 300)
    assert head["num_hidden_layers"] == 1 and head["vocab_size"] == 300


@pytest.mark.parametrize("text,needle", [("nobody/nothing", "unknown model; valid: a preset"),
                                         (".", "has no config.json")])
def test_unknown_names_are_one_line(text: str, needle: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=needle):
        resolve_model(text)
