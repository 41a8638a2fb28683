"""Any model by name: a preset, a Hugging Face id, or a local directory holding a ``config.json``.

:func:`resolve_model` looks, in order, at

1. a local directory with a ``config.json`` (a user's own fine-tune; the tests write one);
2. a preset of :mod:`presets.models` by exact name (``Llama-3.1-8B``);
3. a Hugging Face id among the configs aiconfigurator-core ships (its
   ``model_configs`` folder, read without importing the package), also under
   the spelling the shipped file uses: ``meta-llama/Llama-3.1-8B-Instruct`` is
   the shipped ``meta-llama/Meta-Llama-3.1-8B`` (an instruction-tuned model has
   its base model's architecture; the output says which config was used);
4. a preset by its hub id.

Nothing is downloaded: an id found nowhere is one line naming it and the valid
kinds of name, with examples.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from presets.models import MODELS, ModelSpec
from sim import kernels
from toolkit.jsonio import read_json

# aiconfigurator-core's model families (sdk/common.py ARCHITECTURE_TO_MODEL_FAMILY, 0.12.0): a config of another
# architecture is priced by the roofline only.
KERNEL_ARCHITECTURES = frozenset({
    "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MiMoForCausalLM", "DeepSeekForCausalLM",
    "DeepseekV3ForCausalLM", "MixtralForCausalLM", "GptOssForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM",
    "Llama4ForConditionalGeneration", "NemotronForCausalLM", "DeciLMForCausalLM",
})


@dataclass(frozen=True)
class ModelRef:
    """A resolved model: its architecture, its raw config, where both came from, and the path the kernel tables
    compile (a shipped hub id or a local directory; ``None``: an architecture the tables do not model)."""

    name: str
    arch: ModelSpec
    config: dict = field(repr=False)
    origin: str
    kernel_path: str | None

    def kernel_model_path(self) -> str | None:
        """The path to compile: a shipped id as is; a preset or a derived config written to a local directory."""
        if self.kernel_path is not None:
            return self.kernel_path
        if self.arch.architecture not in KERNEL_ARCHITECTURES:
            return None
        return kernels.config_dir(self.config)


def _aliases(hub_id: str) -> list[str]:
    """Spellings of ``hub_id`` the shipped configs may use (same architecture): base model for an instruct or chat
    fine-tune, Meta's ``Meta-Llama-3.1`` prefix, Llama 3.3 70B = Llama 3.1 70B's shape."""
    names = [hub_id]
    base = re.sub(r"-(Instruct|Chat|chat|hf|it|IT)(-\d+)?$", "", hub_id)
    names.append(base)
    names.append(hub_id + "-Instruct")  # a base model's shape is its instruct model's
    for n in list(names):
        names.append(re.sub(r"meta-llama/(Llama-3\.[13])-", "meta-llama/Meta-Llama-3.1-", n))
    return list(dict.fromkeys(names))


def _from_dir(path: Path) -> ModelRef:
    cfg = read_json(path / "config.json", "model config")
    if not isinstance(cfg, dict):
        raise ValueError(f"{path / 'config.json'} is not a JSON object")
    try:
        arch = ModelSpec.from_config(cfg, path.name)
    except ValueError as exc:
        raise ValueError(f"model directory {str(path)!r}: {exc}") from None
    usable = arch.architecture in KERNEL_ARCHITECTURES
    return ModelRef(path.name, arch, cfg, f"local directory {path}", str(path.resolve()) if usable else None)


def _from_preset(name: str, how: str) -> ModelRef:
    m = MODELS[name]
    return ModelRef(m.name, m, m.to_config(), how, None)


def resolve_model(text: str, flag: str = "--target") -> ModelRef:
    """The model ``text`` names; unknown is one ``ValueError`` line naming the value and the valid kinds."""
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"{flag} {text!r}: the directory has no config.json; valid: a directory holding a "
                             "Hugging Face config.json, a preset name, or a shipped Hugging Face id")
        return _from_dir(path)
    if text in MODELS:
        return _from_preset(text, f"preset {text}")
    for alias in _aliases(text):
        cfg = kernels.shipped_config(alias)
        if cfg is not None:
            via = "" if alias == text else f" (as {alias}: same architecture)"
            return ModelRef(text.split("/")[-1], ModelSpec.from_config(cfg, text.split("/")[-1], alias), cfg,
                            f"aiconfigurator-core's shipped config{via}",
                            alias if cfg.get("architectures", ["?"])[0] in KERNEL_ARCHITECTURES else None)
    by_hub = {m.hub_id.lower(): m.name for m in MODELS.values()}
    for alias in _aliases(text):
        if alias.lower() in by_hub:
            return _from_preset(by_hub[alias.lower()], f"preset {by_hub[alias.lower()]} (hub id {text})")
    shipped = kernels.shipped_ids()
    where = (f"a Hugging Face id shipped with aiconfigurator-core ({len(shipped)}, e.g. "
             f"{', '.join(s for s in shipped if 'Llama-3.1-8B' in s or 'DeepSeek-R1' in s or s.endswith('30B-A3B'))})"
             if shipped else f"a Hugging Face id of a shipped config (needs {kernels.PACKAGE_PIN}, not installed)")
    raise ValueError(f"{flag} {text!r}: unknown model; valid: a preset ({', '.join(MODELS)}), {where}, or a local "
                     "directory holding a config.json")


def head_config(target: ModelRef, kind: str, draft_vocab: int) -> dict[str, Any]:
    """The config of one draft-head layer of the target's shape (EAGLE, EAGLE-3, MTP): the target's config with one
    layer (an MoE layer where the target has experts: DeepSeek's MTP module is one), no MTP modules of its own,
    and EAGLE-3's draft vocabulary. An EAGLE / EAGLE-3 head of an MoE or MLA target is a dense Llama layer of its
    hidden size (as the released heads are)."""
    if kind in ("eagle", "eagle3") and (target.arch.is_moe or target.arch.is_mla
                                        or target.arch.architecture not in KERNEL_ARCHITECTURES):
        return target.arch.as_dense_layer().to_config(n_layers=1, vocab_size=draft_vocab if kind == "eagle3" else None)
    cfg = dict(target.config)
    for key in ("text_config", "llm_config"):
        if isinstance(cfg.get(key), dict):
            cfg = {**cfg[key], "architectures": cfg.get("architectures")}
    cfg.update(num_hidden_layers=1, num_nextn_predict_layers=0)
    if "first_k_dense_replace" in cfg:
        cfg["first_k_dense_replace"] = 0
    if kind == "eagle3":
        cfg["vocab_size"] = draft_vocab
    return cfg
