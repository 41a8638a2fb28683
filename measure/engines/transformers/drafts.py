"""The transformers engine's drafts: model copies, layer subsets and quantised copies of the target, built by spec.

:func:`make_draft` builds every kind of :mod:`measure.drafts`' specs for a
transformers target (:class:`~measure.engines.transformers.models.LoadedModel`):
each model-backed kind is a :class:`~measure.drafts.ModelDraft` over a
:class:`~measure.engines.transformers.decoder.TransformersDecoder` made here with
the engine's options; ``ngram`` is the engine-agnostic :func:`~measure.drafts.ngram_draft`.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, cast

import torch

from measure.drafts import ModelDraft, NGramDraft, check_draft_spec, ngram_draft, parse_layers
from measure.engines.transformers.decoder import TransformersDecoder
from measure.engines.transformers.models import LoadedModel, check_same_vocab, load_model


def _layer_container(model: torch.nn.Module) -> tuple[torch.nn.Module, str, torch.nn.ModuleList]:
    """(parent, attribute, ModuleList) of the decoder layers of an HF causal LM."""
    config: Any = model.config
    n = int(config.get_text_config(decoder=True).num_hidden_layers)
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) == n and name.split(".")[-1] in ("layers", "h"):
            parent_name, _, attr = name.rpartition(".")
            return model.get_submodule(parent_name) if parent_name else model, attr, mod
    raise ValueError(f"cannot find the decoder layers of {type(model).__name__}")


def layer_subset_model(model: torch.nn.Module, keep: list[int]) -> torch.nn.Module:
    """A model running only layers ``keep`` of ``model``, sharing every weight tensor with it.

    Module objects are copied (so swapping the copy's ``lm_head`` leaves the
    target alone); parameters and buffers are the target's own tensors.
    """
    memo = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    sub = copy.deepcopy(model, memo)
    parent, attr, layers = _layer_container(sub)
    new_layers = torch.nn.ModuleList([layers[i] for i in keep])
    for new_idx, layer in enumerate(new_layers):
        for m in layer.modules():
            if hasattr(m, "layer_idx"):
                cast(Any, m).layer_idx = new_idx
    setattr(parent, attr, new_layers)
    config: Any = sub.config
    cfg = config.get_text_config(decoder=True)
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = [cfg.layer_types[i] for i in keep]
    cfg.num_hidden_layers = len(keep)
    return sub


def _cast(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Cast floating parameters/buffers (``nn.Module._apply``: HF blocks ``.to`` on GGUF-loaded models)."""
    return model._apply(lambda t: t.to(dtype) if t.is_floating_point() else t)


def _need_model(target: LoadedModel, kind: str) -> None:
    if target.model is None:
        raise ValueError(f"draft kind {kind!r} needs a model-backed (transformers) target")


def _model_draft(name: str, kind: str, model: torch.nn.Module, options: Any, synthetic: bool, info: dict,
                 loaded: LoadedModel | None = None) -> ModelDraft:
    """A :class:`ModelDraft` over ``model`` with a decoder of the engine's ``options``."""
    return ModelDraft(name, kind, TransformersDecoder(model, options), model=model, synthetic=synthetic, info=info,
                      loaded=loaded)


def _build_model(arg: str, target: LoadedModel, device: str, dtype: str, seed: int, options: Any = None,
                 **_: Any) -> ModelDraft:
    d = load_model(arg, device=device, dtype=dtype, seed=seed)
    check_same_vocab(target, d)
    return _model_draft(f"model:{d.name}", "model", d.model, options, d.synthetic,
                        {"source": d.source, "name": d.name}, loaded=d)


def _build_layers(arg: str, target: LoadedModel, kind: str = "layers", options: Any = None,
                  **_: Any) -> ModelDraft:
    _need_model(target, kind)
    n = int(target.model.config.get_text_config(decoder=True).num_hidden_layers)
    if kind == "early":
        keep = list(range(int(arg)))
        name = f"early:{arg}"
    else:
        keep = parse_layers(arg, n)
        name = f"layers:{arg}"
    return _model_draft(name, kind, layer_subset_model(target.model, keep), options, target.synthetic,
                        {"layers": keep, "of_layers": n})


def _build_int8(arg: str, target: LoadedModel, options: Any = None, **_: Any) -> ModelDraft:
    _need_model(target, "int8")
    if target.device != "cpu":
        raise ValueError("draft 'int8' (dynamic int8 quantisation) runs on CPU only; use bf16/fp16 on CUDA")
    from torch.ao.quantization import quantize_dynamic

    m = _cast(copy.deepcopy(target.model), torch.float32)
    m = quantize_dynamic(m, {torch.nn.Linear}, dtype=torch.qint8)
    return _model_draft("int8", "int8", m.eval(), options, target.synthetic, {"quantization": "dynamic int8 Linear"})


def _build_half(arg: str, target: LoadedModel, kind: str = "bf16", options: Any = None, **_: Any) -> ModelDraft:
    _need_model(target, kind)
    dt = torch.bfloat16 if kind == "bf16" else torch.float16
    m = _cast(copy.deepcopy(target.model), dt).eval()
    return _model_draft(kind, kind, m, options, target.synthetic, {"dtype": str(dt).replace("torch.", "")})


def _build_ngram(arg: str, target: LoadedModel, kind: str = "ngram", **_: Any) -> NGramDraft:
    return ngram_draft(f"{kind}:{arg}" if arg else kind, target.vocab_size, target.eos_token_ids)


Builder = Callable[..., Any]
#: kind (every one of :data:`measure.drafts.DRAFT_KINDS`) → builder(arg, target, *, kind, device, dtype, seed,
#: options) returning a draft.
BUILDERS: dict[str, Builder] = {
    "model": _build_model,
    "early": _build_layers,
    "layers": _build_layers,
    "int8": _build_int8,
    "bf16": _build_half,
    "fp16": _build_half,
    "ngram": _build_ngram,
}


def _n_layers(target: LoadedModel) -> int | None:
    cfg = getattr(target.model, "config", None)
    if cfg is None:
        return None
    return int(cfg.get_text_config(decoder=True).num_hidden_layers)


def make_draft(kind_spec: str, target: LoadedModel, device: str | None = None, dtype: str | None = None,
               seed: int = 0, options: Any = None, **kw: Any) -> Any:
    """Build a draft for ``target`` from ``kind_spec`` (:mod:`measure.drafts` lists the specs).

    ``options`` (:class:`~measure.seam.EngineOptions`): the model
    draft's decoder settings; by default the target's.
    """
    ds = check_draft_spec(kind_spec, _n_layers(target))
    opts = options if options is not None else target.engine_options
    return BUILDERS[ds.kind](ds.arg, target, kind=ds.kind, device=device or target.device,
                                dtype=dtype or target.dtype, seed=seed, options=opts, **kw)
