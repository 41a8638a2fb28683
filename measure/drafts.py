"""Draft kinds for speculative decoding, built from a target by a kind spec.

``make_draft(kind_spec, target)`` with ``kind_spec`` one of:

* ``model:<model spec>`` — a separate model (any :func:`measure.models.load_model`
  spec); it must share the target's vocabulary.
* ``early:N`` — early exit: the target's first N layers, sharing its
  embeddings, final norm and head.
* ``layers:0-5,20-29`` — any layer subset of the target (skipped layers), same sharing.
* ``int8`` — a dynamic-int8 copy of the target's Linear layers (CPU).
* ``bf16`` / ``fp16`` — a half-precision copy of the target.
* ``ngram`` / ``ngram:N`` — model-free prompt lookup: continue the most recent
  earlier occurrence of the last n ≤ N tokens (N = 3 by default).

Model-backed drafts (:class:`ModelDraft`) work with any HF causal LM, and
``draft.model.lm_head`` may be swapped for any module returning full-vocab
logits (e.g. −inf outside a kept subset). Other kinds can be added with
:func:`register_draft`.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from measure.decoding import crop_cache, forward_logits, new_cache, pick, probs_from_logits
from measure.models import LoadedModel, check_same_vocab, load_model


class ModelDraft:
    """A draft backed by a causal LM with its own KV cache."""

    def __init__(self, name: str, kind: str, model: Any, synthetic: bool, info: dict | None = None,
                 loaded: LoadedModel | None = None) -> None:
        self.name, self.kind, self.model, self.synthetic = name, kind, model, synthetic
        self.info = dict(info or {})
        self.loaded = loaded
        self.cache: Any = None
        self.cached_tokens = 0

    def describe(self) -> dict:
        params = int(sum(p.numel() for p in {id(p): p for p in self.model.parameters()}.values()))
        return {"kind": self.kind, "synthetic": self.synthetic, "params": params, **self.info}

    def start(self, prompt_ids: torch.Tensor) -> None:
        """New sequence: prefill the draft cache with the prompt ``[1, S]``."""
        self.cache = new_cache()
        forward_logits(self.model, prompt_ids, self.cache, last_only=True)
        self.cached_tokens = int(prompt_ids.shape[1])

    def propose(self, tokens: torch.Tensor, gamma: int, temperature: float,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft ``gamma`` tokens after ``tokens`` ``[1, L]`` → tokens ``[γ]``, q ``[γ, V]`` (None if greedy)."""
        inp = tokens[:, self.cached_tokens:]  # [1, u], u >= 1 uncached tokens
        out, qs = [], []
        for _ in range(gamma):
            logits = forward_logits(self.model, inp, self.cache, last_only=True)[:, -1]  # [1, V]
            self.cached_tokens += int(inp.shape[1])
            if temperature == 0:
                x = logits.argmax(-1)  # [1]
            else:
                q = probs_from_logits(logits, temperature)  # [1, V]
                x = torch.multinomial(q, 1, generator=generator).squeeze(-1)
                qs.append(q)
            out.append(x)
            inp = x[None]  # [1, 1]
        d_tok = torch.cat(out)  # [γ]
        return d_tok, (torch.cat(qs) if qs else None)

    def rollback(self, n_tokens: int) -> None:
        """Keep the first ``n_tokens`` positions of the draft cache."""
        if self.cached_tokens > n_tokens:
            crop_cache(self.cache, n_tokens)
            self.cached_tokens = n_tokens

    @torch.inference_mode()
    def position_probs(self, tokens: torch.Tensor, prompt_tokens: int, temperature: float) -> torch.Tensor:
        """Teacher-forced q at each generated position of ``tokens`` ``[1, L]`` → ``[L − prompt_tokens, V]``.

        Greedy: one-hot on the draft's argmax.
        """
        logits = forward_logits(self.model, tokens[:, :-1], None)[0, prompt_tokens - 1:]  # [n, V]
        if temperature == 0:
            return torch.zeros_like(logits).scatter_(1, logits.argmax(-1, keepdim=True), 1.0)
        return probs_from_logits(logits, temperature)


class NGramDraft:
    """Model-free prompt-lookup draft (Saxena 2023; transformers' ``prompt_lookup_num_tokens``).

    Finds the most recent earlier occurrence of the last n tokens (n from
    ``max_ngram`` down to 1) and proposes the tokens that followed it. It may
    propose fewer than γ tokens, or none. Deterministic: q is one-hot.
    """

    kind = "ngram"
    synthetic = False
    model = None
    vocab_size: int | None = None

    def __init__(self, name: str, max_ngram: int = 3) -> None:
        if max_ngram < 1:
            raise ValueError(f"ngram size must be >= 1, got {max_ngram}")
        self.name, self.max_ngram = name, int(max_ngram)

    def describe(self) -> dict:
        return {"kind": self.kind, "synthetic": False, "max_ngram": self.max_ngram, "params": 0}

    def start(self, prompt_ids: torch.Tensor) -> None:
        pass

    def lookup(self, seq: list[int], gamma: int) -> list[int]:
        """Continuation proposed after ``seq`` (at most ``gamma`` tokens, possibly empty)."""
        L = len(seq)
        for n in range(min(self.max_ngram, L - 1), 0, -1):
            tail = seq[L - n:]
            for s in range(L - n - 1, -1, -1):  # most recent earlier occurrence first
                if seq[s:s + n] == tail:
                    return seq[s + n:s + n + gamma]
        return []

    def propose(self, tokens: torch.Tensor, gamma: int, temperature: float,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        cont = self.lookup(tokens[0].tolist(), gamma)
        return torch.tensor(cont, dtype=tokens.dtype, device=tokens.device), None  # [k], q one-hot

    def rollback(self, n_tokens: int) -> None:
        pass

    def position_probs(self, tokens: torch.Tensor, prompt_tokens: int, temperature: float,
                       vocab_size: int | None = None) -> torch.Tensor:
        """One-hot on the first looked-up token at each generated position (zero row if none)."""
        seq = tokens[0].tolist()
        n = len(seq) - prompt_tokens
        v = vocab_size or self.vocab_size
        q = torch.zeros(n, v, device=tokens.device)
        for i in range(n):
            cont = self.lookup(seq[:prompt_tokens + i], 1)
            if cont:
                q[i, cont[0]] = 1.0
        return q


# -- builders ------------------------------------------------------------------------------
def _layer_container(model: torch.nn.Module) -> tuple[torch.nn.Module, str, torch.nn.ModuleList]:
    """(parent, attribute, ModuleList) of the decoder layers of an HF causal LM."""
    n = int(model.config.get_text_config(decoder=True).num_hidden_layers)
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) == n and name.split(".")[-1] in ("layers", "h"):
            parent_name, _, attr = name.rpartition(".")
            return model.get_submodule(parent_name) if parent_name else model, attr, mod
    raise ValueError(f"cannot find the decoder layers of {type(model).__name__}")


def parse_layers(text: str, n_layers: int) -> list[int]:
    """``"0-5,20-29"`` → sorted unique layer indices, each in ``[0, n_layers)``."""
    out: set[int] = set()
    for part in filter(None, text.split(",")):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m:
            raise ValueError(f"bad layer list {text!r}; expected e.g. '0-5,20-29'")
        a, b = int(m.group(1)), int(m.group(2) or m.group(1))
        out.update(range(a, b + 1))
    if not out or min(out) < 0 or max(out) >= n_layers:
        raise ValueError(f"layer list {text!r} must name layers in 0..{n_layers - 1}")
    return sorted(out)


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
                m.layer_idx = new_idx
    setattr(parent, attr, new_layers)
    cfg = sub.config.get_text_config(decoder=True)
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = [cfg.layer_types[i] for i in keep]
    cfg.num_hidden_layers = len(keep)
    return sub


def _cast(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Cast floating parameters/buffers (``nn.Module._apply``: HF blocks ``.to`` on GGUF-loaded models)."""
    return model._apply(lambda t: t.to(dtype) if t.is_floating_point() else t)


def _need_model(target: LoadedModel, kind: str) -> None:
    if target.model is None:
        raise ValueError(f"draft kind {kind!r} needs a model-backed target")


def _build_model(arg: str, target: LoadedModel, device: str, dtype: str, seed: int, **_: Any) -> ModelDraft:
    if not arg:
        raise ValueError("draft 'model:<spec>' needs a model spec, e.g. model:smollm2-135m")
    d = load_model(arg, device=device, dtype=dtype, seed=seed)
    check_same_vocab(target, d)
    return ModelDraft(f"model:{d.name}", "model", d.model, d.synthetic, {"source": d.source, "name": d.name},
                      loaded=d)


def _build_layers(arg: str, target: LoadedModel, kind: str = "layers", **_: Any) -> ModelDraft:
    _need_model(target, kind)
    n = int(target.model.config.get_text_config(decoder=True).num_hidden_layers)
    if kind == "early":
        if not arg.isdigit() or not 1 <= int(arg) < n:
            raise ValueError(f"draft 'early:N' needs 1 <= N < {n} (target layers), got {arg!r}")
        keep = list(range(int(arg)))
        name = f"early:{arg}"
    else:
        keep = parse_layers(arg, n)
        name = f"layers:{arg}"
    return ModelDraft(name, kind, layer_subset_model(target.model, keep), target.synthetic,
                      {"layers": keep, "of_layers": n})


def _build_int8(arg: str, target: LoadedModel, **_: Any) -> ModelDraft:
    _need_model(target, "int8")
    if target.device != "cpu":
        raise ValueError("draft 'int8' (dynamic int8 quantisation) runs on CPU only; use bf16/fp16 on CUDA")
    from torch.ao.quantization import quantize_dynamic

    m = _cast(copy.deepcopy(target.model), torch.float32)
    m = quantize_dynamic(m, {torch.nn.Linear}, dtype=torch.qint8)
    return ModelDraft("int8", "int8", m.eval(), target.synthetic, {"quantization": "dynamic int8 Linear"})


def _build_half(arg: str, target: LoadedModel, kind: str = "bf16", **_: Any) -> ModelDraft:
    _need_model(target, kind)
    dt = torch.bfloat16 if kind == "bf16" else torch.float16
    m = _cast(copy.deepcopy(target.model), dt).eval()
    return ModelDraft(kind, kind, m, target.synthetic, {"dtype": str(dt).replace("torch.", "")})


def _build_ngram(arg: str, target: LoadedModel, **_: Any) -> NGramDraft:
    if arg and not arg.isdigit():
        raise ValueError(f"draft 'ngram:N' needs an integer N >= 1, got {arg!r}")
    n = int(arg) if arg else 3
    d = NGramDraft(f"ngram:{n}", n)
    d.vocab_size = target.vocab_size
    return d


Builder = Callable[..., Any]
#: kind → builder(arg, target, *, kind, device, dtype, seed) returning a draft.
DRAFT_KINDS: dict[str, Builder] = {
    "model": _build_model,
    "early": _build_layers,
    "layers": _build_layers,
    "int8": _build_int8,
    "bf16": _build_half,
    "fp16": _build_half,
    "ngram": _build_ngram,
}


def register_draft(kind: str, builder: Builder) -> None:
    """Add a draft kind: ``builder(arg, target, *, kind, device, dtype, seed, **kw)``."""
    DRAFT_KINDS[kind] = builder


def draft_kind(kind_spec: str) -> str:
    """The kind part of ``kind_spec`` (``"early:8"`` → ``"early"``), validated."""
    kind = str(kind_spec).partition(":")[0]
    if kind not in DRAFT_KINDS:
        raise ValueError(f"unknown draft kind {kind_spec!r}; valid: " + ", ".join(
            f"{k}:<spec>" if k == "model" else f"{k}:N" if k in ("early", "ngram") else
            f"{k}:<a-b,c>" if k == "layers" else k for k in DRAFT_KINDS))
    return kind


def make_draft(kind_spec: str, target: LoadedModel, device: str | None = None, dtype: str | None = None,
               seed: int = 0, **kw: Any) -> Any:
    """Build a draft for ``target`` from ``kind_spec`` (see module docstring)."""
    kind = draft_kind(kind_spec)
    arg = str(kind_spec).partition(":")[2]
    return DRAFT_KINDS[kind](arg, target, kind=kind, device=device or target.device,
                             dtype=dtype or target.dtype, seed=seed, **kw)
