"""The llama.cpp engine: GGUF models through llama-cpp-python's low-level API, behind the engine seam.

What users run small models with on CPUs and laptops. One loaded model
(:class:`LlamaCppTarget`) hands out any number of :class:`LlamaCppDecoder`
objects, each its own ``llama_context`` (KV cache) over the shared weights:

* ``forward`` feeds ``n`` tokens in **one** ``llama_decode`` batch, with
  logits for every fed position (or only the last), copied out of
  llama.cpp's output buffer into a float32 tensor ``[n, V]``;
* ``rollback(m)`` removes positions ``m..`` with ``llama_memory_seq_rm``
  (llama-cpp-python 0.3.36's name for what older versions called
  ``llama_kv_cache_seq_rm``); the context keeps a full-size sliding-window
  cache (``swa_full``) so a rollback is exact for SWA models (Gemma-3) too.

Model specs (``--target``): ``gguf:FILE``, ``smollm2-135m``, ``gemma3-270m``
(the packaged GGUFs of :data:`measure.models.PACKAGED`). Draft specs:

* ``ngram`` / ``ngram:N`` / ``ngram:N:first`` — :class:`measure.drafts.NGramDraft`
  (engine-agnostic prompt lookup; ``:first`` is the earliest-match rule,
  the one llama-cpp-python's ``LlamaPromptLookupDecoding`` uses);
* ``model:gguf:FILE`` (or ``model:smollm2-135m`` …) — a separate GGUF model
  with its own decoder, refused in one line unless its vocabulary is the
  target's (size and the text of a sample of tokens);
* ``quant:TYPE`` — a copy of the target quantised by llama.cpp's own
  ``llama_model_quantize`` (``q8_0``, ``q4_0``, ``q2_k`` …), cached on disk by
  the source file's SHA-256 (:mod:`measure.engines.gguf_files`).

The peer is llama-cpp-python's own speculative decoding:
``Llama(draft_model=LlamaPromptLookupDecoding(max_ngram_size=N,
num_pred_tokens=γ))`` driven through ``Llama.generate`` with the same
context size, threads and sampling (pure temperature: no top-k/top-p/min-p,
no repetition penalty). Its proposal rule is the earliest earlier match of
the longest n-gram that has one — ``ngram:N:first`` — so it runs as the peer
of ``ngram:N:first`` cells only; for the most-recent-match rule ``ngram:N``
llama-cpp-python has no equivalent and ``peer_generate`` returns None.

Logits are host float32 tensors (llama.cpp hands them back on the host also
when layers are offloaded to a GPU), so ``target.device`` is ``"cpu"`` and
the offload is recorded as ``gpu_layers``. ``llama_cpp`` is imported only by
:func:`make_engine` and what it returns: this module imports (and validates
specs) without it.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import logging
import os
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from measure.engines.base import EngineOptions, PeerResult
from measure.engines.lossless import NEAR_TIE_TOLERANCE
from measure.engines.gguf_files import check_gguf, check_quant_type, file_sha256, quantized_copy

EXTRA_HINT = "pip install 'specscope[llamacpp]' (llama-cpp-python; compiles llama.cpp from source: about 5.5 min on 2 cores)"
#: Draft kinds this engine builds (``ngram`` rules come from :mod:`measure.drafts`).
DRAFT_FORMS = ("ngram", "ngram:N", "ngram:N:first", "model:gguf:FILE", "model:<packaged name>", "quant:TYPE")
#: Tokens whose texts are compared between a draft's and the target's vocabulary.
VOCAB_SAMPLE_TOKENS = 512
_LOGGER_NAME = "llama-cpp-python"


def import_llama_cpp() -> Any:
    """``llama_cpp`` (backend initialised once), or ``ImportError`` naming the extra that installs it.

    llama.cpp's CPU backend runs on its own OpenMP runtime, beside torch's. With both runtimes'
    idle threads spinning on 2 cores, decoding in a sweep ran 10-40x slower and erratic (1-35 tok/s
    against 66 alone); passive waiting between parallel regions, set before the library loads
    (the runtime reads it once), removes that. A user's own setting is kept.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        import llama_cpp
    except ImportError:
        raise ImportError(f"--engine llamacpp needs llama-cpp-python: {EXTRA_HINT}") from None
    if not getattr(import_llama_cpp, "_ready", False):
        llama_cpp.llama_backend_init()
        import_llama_cpp._ready = True  # type: ignore[attr-defined]
    return llama_cpp


def set_quiet(quiet: bool) -> None:
    """llama.cpp's log output: errors only when ``quiet``, else warnings and errors (not the load chatter)."""
    logging.getLogger(_LOGGER_NAME).setLevel(logging.ERROR if quiet else logging.WARNING)


# -- specs ------------------------------------------------------------------------------------
def packaged_models() -> dict:
    """Packaged GGUFs by short name (``measure.models.PACKAGED``)."""
    from measure.models import PACKAGED

    return dict(PACKAGED)


def resolve_model_path(spec: str, flag: str = "--target ") -> Path:
    """The GGUF file a model spec names, checked (exists, GGUF magic); ``ValueError`` in one line otherwise."""
    spec = str(spec)
    packaged = packaged_models()
    if spec in packaged:
        return check_gguf(packaged[spec](), f"{flag}{spec} -> ")
    if spec.startswith("gguf:"):
        return check_gguf(spec[len("gguf:"):], f"{flag}gguf:")
    valid = ", ".join(["gguf:FILE", *packaged])
    raise ValueError(f"{flag.strip()} {spec!r}: unknown model for --engine llamacpp; valid: {valid}")


def parse_draft(spec: str) -> tuple[str, str]:
    """``(kind, arg)`` of a draft spec this engine builds; ``ValueError`` (one line, valid forms) otherwise."""
    spec = str(spec)
    kind, _, arg = spec.partition(":")
    if kind == "ngram":
        return kind, arg
    if kind == "model":
        if not arg:
            raise ValueError(f"--draft {spec!r}: needs a model, e.g. model:gguf:FILE or model:smollm2-135m")
        return kind, arg
    if kind == "quant":
        return kind, check_quant_type(arg)
    raise ValueError(f"--draft {spec!r}: not a draft of --engine llamacpp; valid: {', '.join(DRAFT_FORMS)}")


def check_specs(target_spec: str, draft_specs: tuple[str, ...] | list[str]) -> None:
    """Every file/type check that needs no weights: GGUF paths and magic, quantisation types, draft forms.

    Raises ``ValueError`` (one line) at the first bad value. The vocabulary of a
    ``model:`` draft is checked by :meth:`LlamaCppEngine.check_specs`, which
    reads vocabularies only (no weights).
    """
    resolve_model_path(target_spec)
    for d in draft_specs:
        kind, arg = parse_draft(d)
        if kind == "model":
            resolve_model_path(arg, "--draft model:")
        elif kind == "ngram":
            ngram_draft(d, vocab_size=1)


def ngram_draft(spec: str, vocab_size: int) -> Any:
    """The :class:`measure.drafts.NGramDraft` of an ``ngram`` spec (its parser's one-line ``ValueError`` if bad)."""
    from types import SimpleNamespace

    from measure.drafts import make_draft

    # the ngram builder reads only these from a target
    return make_draft(spec, SimpleNamespace(vocab_size=vocab_size, device="cpu", dtype="float32", model=None))


def vocabulary_mismatch(n_a: int, n_b: int, text_a: Any, text_b: Any,
                        sample: int = VOCAB_SAMPLE_TOKENS) -> str | None:
    """Why two vocabularies differ (size, or the first sampled token whose text differs), None if they agree.

    ``text_a(i)`` / ``text_b(i)`` give token ``i``'s text; ``sample`` evenly spaced ids are compared.
    """
    if n_a != n_b:
        return f"vocabulary size {n_b}, the target has {n_a}"
    for i in sorted({int(x) for x in np.linspace(0, n_a - 1, min(sample, n_a))}):
        if text_a(i) != text_b(i):
            return f"token {i} is {text_b(i)!r}, the target's is {text_a(i)!r}"
    return None


# -- the model -----------------------------------------------------------------------------------
class _Model:
    """A ``llama_model`` loaded from a GGUF (freed when this object is collected)."""

    def __init__(self, ll: Any, path: Path, gpu_layers: int, vocab_only: bool = False) -> None:
        params = ll.llama_model_default_params()
        params.n_gpu_layers = int(gpu_layers)
        params.vocab_only = bool(vocab_only)
        ptr = ll.llama_model_load_from_file(str(path).encode(), params)
        if not ptr:
            raise ValueError(f"llama.cpp could not load {path} (unsupported architecture or damaged file)")
        self._ll, self.ptr, self.path = ll, ptr, path
        self.vocab = ll.llama_model_get_vocab(ptr)
        self.n_vocab = int(ll.llama_vocab_n_tokens(self.vocab))

    def token_text(self, i: int) -> bytes:
        return bytes(self._ll.llama_vocab_get_text(self.vocab, int(i)) or b"")

    def __del__(self) -> None:
        ptr, self.ptr = getattr(self, "ptr", None), None
        if ptr:
            self._ll.llama_model_free(ptr)


class LlamaCppTarget:
    """A GGUF model loaded by llama.cpp: the :class:`~measure.engines.base.TargetModel` of this engine."""

    synthetic = False
    device = "cpu"

    def __init__(self, ll: Any, name: str, source: str, path: Path, options: EngineOptions,
                 gpu_layers: int) -> None:
        self._ll, self.name, self.source, self.path, self.options = ll, name, source, path, options
        self.gpu_layers = int(gpu_layers)
        self.model = _Model(ll, path, self.gpu_layers)
        self.vocab_size = self.model.n_vocab
        self.eos_token_ids = tuple(i for i in range(self.vocab_size)
                                   if ll.llama_vocab_is_eog(self.model.vocab, i))
        buf = ctypes.create_string_buffer(256)
        ll.llama_model_desc(self.model.ptr, buf, ctypes.sizeof(buf))
        self.desc = buf.value.decode("utf-8", "replace")
        self.params = int(ll.llama_model_n_params(self.model.ptr))
        self.weight_bytes = int(ll.llama_model_size(self.model.ptr))
        self.sha256 = file_sha256(path)

    @property
    def dtype(self) -> str:
        """The GGUF's weight type as llama.cpp names it (``Q4_1``, ``Q8_0`` …)."""
        return self.desc.rsplit(" ", 1)[-1]

    @property
    def tokenizer(self) -> None:
        """No transformers tokenizer: :meth:`LlamaCppEngine.encode` tokenises with llama.cpp."""
        return None

    def describe(self) -> dict:
        """The ``run.json`` ``models`` entry."""
        return {"name": self.name, "source": self.source, "synthetic": False, "vocab_size": self.vocab_size,
                "params": self.params, "dtype": self.dtype, "device": self.device, "engine": "llamacpp",
                "gpu_layers": self.gpu_layers, "desc": self.desc, "file_bytes": self.path.stat().st_size,
                "weight_bytes": self.weight_bytes, "sha256": self.sha256}

    def new_decoder(self) -> LlamaCppDecoder:
        """A fresh, empty decoder (its own llama.cpp context and KV cache) over this model's weights."""
        return LlamaCppDecoder(self, self.options)


class LlamaCppDecoder:
    """One llama.cpp context: a KV-cached sequence (batch size 1) behind the :class:`Decoder` protocol.

    ``forward`` returns a float32 copy of llama.cpp's logits (the library
    reuses — and may reallocate — its output buffer on the next decode).
    """

    def __init__(self, target: LlamaCppTarget, options: EngineOptions) -> None:
        ll = target._ll
        self._ll, self.target = ll, target
        self.vocab_size = target.vocab_size
        cp = context_params(ll, options)
        ctx = ll.llama_init_from_model(target.model.ptr, cp)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not create a context of {options.max_len_tokens} tokens")
        self.ctx = ctx
        self.n_ctx = int(ll.llama_n_ctx(ctx))
        self.n_batch = int(cp.n_batch)
        self._mem = ll.llama_get_memory(ctx)
        self._batch = ll.llama_batch_init(self.n_batch, 0, 1)
        b = self._batch
        self._tok = np.ctypeslib.as_array(b.token, shape=(self.n_batch,))
        self._pos = np.ctypeslib.as_array(b.pos, shape=(self.n_batch,))
        self._logit_flags = np.ctypeslib.as_array(b.logits, shape=(self.n_batch,))
        np.ctypeslib.as_array(b.n_seq_id, shape=(self.n_batch,))[:] = 1
        for i in range(self.n_batch):
            b.seq_id[i][0] = 0
        self._n_cached = 0

    @property
    def n_cached(self) -> int:
        """Positions currently in the cache."""
        return self._n_cached

    def reset(self) -> None:
        """Empty the cache (a new sequence)."""
        self._ll.llama_memory_clear(self._mem, True)
        self._n_cached = 0

    def forward(self, input_ids: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Feed ``input_ids`` ``[1, n]`` in one ``llama_decode`` → logits ``[n, V]`` (``[1, V]`` if ``last_only``)."""
        ids = input_ids.reshape(-1).tolist()
        n = len(ids)
        if n == 0:
            raise ValueError("forward of 0 tokens")
        if self._n_cached + n > self.n_ctx:
            raise ValueError(f"llama.cpp context full: {self._n_cached} cached + {n} fed > {self.n_ctx} "
                             f"(raise max_len_tokens)")
        if n > self.n_batch:
            raise ValueError(f"forward of {n} tokens exceeds the llama.cpp batch of {self.n_batch} (max_len_tokens)")
        return self._decode(ids, out_rows=1 if last_only else n)

    def _decode(self, ids: list[int], out_rows: int) -> torch.Tensor:
        n = len(ids)
        self._tok[:n] = ids
        self._pos[:n] = np.arange(self._n_cached, self._n_cached + n)
        self._logit_flags[:n] = 0
        self._logit_flags[n - out_rows:n] = 1
        self._batch.n_tokens = n
        rc = self._ll.llama_decode(self.ctx, self._batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode of {n} tokens at position {self._n_cached} failed (return code {rc})")
        self._n_cached += n
        ptr = self._ll.llama_get_logits(self.ctx)
        view = np.ctypeslib.as_array(ptr, shape=(out_rows, self.vocab_size))
        return torch.from_numpy(view.copy())  # [rows, V]

    def rollback(self, n_tokens: int) -> None:
        """Keep the first ``n_tokens`` cached positions (``llama_memory_seq_rm`` of the rest)."""
        if n_tokens < 0:
            raise ValueError(f"rollback to {n_tokens} tokens")
        if n_tokens >= self._n_cached:
            return
        if not self._ll.llama_memory_seq_rm(self._mem, 0, int(n_tokens), -1):
            raise RuntimeError(f"llama.cpp could not remove positions {n_tokens}.. from its cache")
        self._n_cached = int(n_tokens)

    def __del__(self) -> None:
        ll = getattr(self, "_ll", None)
        if ll is None:
            return
        if getattr(self, "_batch", None) is not None:
            ll.llama_batch_free(self._batch)
            self._batch = None
        ctx, self.ctx = getattr(self, "ctx", None), None
        if ctx:
            ll.llama_free(ctx)


def resolved_threads(options: EngineOptions) -> int:
    """``options.threads``, else every CPU this process may run on."""
    if options.threads:
        return int(options.threads)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def context_params(ll: Any, options: EngineOptions) -> Any:
    """The ``llama_context_params`` every context of this engine uses — our decoders and the peer alike.

    ``n_ctx = n_batch = max_len_tokens`` (a prefill is one batch),
    ``n_ubatch ≤ 512``, the same thread count for single-token and batch
    decodes, flash attention off (``Llama``'s default), a full-size SWA cache
    (exact rollback).
    """
    cp = ll.llama_context_default_params()
    cp.n_ctx = int(options.max_len_tokens)
    cp.n_batch = int(options.max_len_tokens)
    cp.n_ubatch = min(int(options.max_len_tokens), 512)
    cp.n_seq_max = 1
    cp.n_threads = cp.n_threads_batch = resolved_threads(options)
    cp.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cp.swa_full = True
    cp.no_perf = True
    return cp


# -- drafts ---------------------------------------------------------------------------------------
class DecoderDraft:
    """A model draft over any :class:`~measure.engines.base.Decoder` (here a llama.cpp one).

    The draft protocol of :mod:`measure.decoding` — ``start`` / ``propose`` /
    ``rollback`` / ``position_probs`` — on the draft's own KV-cached decoder;
    ``decoder`` is exposed for cost curves. The same logic as
    ``measure.drafts.ModelDraft``; once that runs over a Decoder this class
    is ``ModelDraft(name, kind, decoder=...)``.
    """

    synthetic = False

    def __init__(self, name: str, kind: str, decoder: Any, info: dict) -> None:
        self.name, self.kind, self.decoder = name, kind, decoder
        self.vocab_size = int(decoder.vocab_size)
        self.info = dict(info)

    def describe(self) -> dict:
        """The ``run.json`` ``drafts`` entry."""
        return {"kind": self.kind, "synthetic": False, **self.info}

    def start(self, prompt_ids: torch.Tensor) -> None:
        """New sequence: prefill the draft's cache with the prompt ``[1, S]``."""
        self.decoder.reset()
        self.decoder.forward(prompt_ids, last_only=True)

    def propose(self, tokens: torch.Tensor, gamma: int, temperature: float,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft ``gamma`` tokens after ``tokens`` ``[1, L]`` → tokens ``[γ]``, q ``[γ, V]`` (None if greedy)."""
        inp = tokens[:, self.decoder.n_cached:]  # [1, u], u >= 1 uncached tokens
        out, qs = [], []
        for _ in range(gamma):
            logits = self.decoder.forward(inp, last_only=True)  # [1, V]
            if temperature == 0:
                x = logits.argmax(-1)  # [1]
            else:
                q = torch.softmax(logits / temperature, dim=-1)  # [1, V]
                x = torch.multinomial(q, 1, generator=generator).squeeze(-1)
                qs.append(q)
            out.append(x)
            inp = x[None]  # [1, 1]
        return torch.cat(out).to(tokens.dtype), (torch.cat(qs) if qs else None)

    def rollback(self, n_tokens: int) -> None:
        """Keep the first ``n_tokens`` positions of the draft's cache."""
        self.decoder.rollback(n_tokens)

    def position_probs(self, tokens: torch.Tensor, prompt_tokens: int, temperature: float) -> torch.Tensor:
        """Teacher-forced q at each generated position of ``tokens`` ``[1, L]`` → ``[L − prompt_tokens, V]``.

        One batched forward of ``tokens[:, :-1]``; greedy: one-hot on the draft's argmax.
        """
        self.decoder.reset()
        logits = self.decoder.forward(tokens[:, :-1])[prompt_tokens - 1:]  # [n, V]
        self.decoder.reset()
        if temperature == 0:
            return torch.zeros_like(logits).scatter_(1, logits.argmax(-1, keepdim=True), 1.0)
        return torch.softmax(logits / temperature, dim=-1)


def ngram_rule(draft: Any) -> str:
    """``"first"`` (earliest match, llama-cpp-python's and transformers' rule) or ``"recent"`` (most recent)."""
    rule = getattr(draft, "rule", None)
    if rule is not None:
        return str(rule)
    return "first" if str(getattr(draft, "name", "")).endswith(":first") else "recent"


# -- the engine -------------------------------------------------------------------------------------
class LlamaCppEngine:
    """The llama.cpp :class:`~measure.engines.base.Engine` (see module docstring)."""

    name = "llamacpp"
    near_tie_tolerance = NEAR_TIE_TOLERANCE

    def __init__(self, options: EngineOptions) -> None:
        self._ll = import_llama_cpp()
        self.options = options
        set_quiet(options.quiet)
        self.threads = resolved_threads(options)
        # the loop's own tensor work (argmax, acceptance) is tiny; torch's OpenMP pool, left at its default,
        # spins between ops on the cores llama.cpp's threads need and slowed decoding 10-40x in a sweep
        torch.set_num_threads(1)
        self._peers: dict[tuple[str, int], Any] = {}

    # loading
    def gpu_layers(self, device: str) -> int:
        """Layers to offload: all on ``cuda`` (needs a GPU build of llama-cpp-python), none on ``cpu``."""
        device = str(device)
        if device == "auto":
            return -1 if self._ll.llama_supports_gpu_offload() else 0
        if device.startswith("cuda"):
            if not self._ll.llama_supports_gpu_offload():
                raise ValueError(f"--device {device}: this llama-cpp-python build has no GPU offload; rebuild it "
                                 "with CMAKE_ARGS='-DGGML_CUDA=on' pip install --force-reinstall --no-cache-dir "
                                 "llama-cpp-python, or use --device cpu")
            return -1
        if device == "cpu":
            return 0
        raise ValueError(f"--device {device!r}: unknown; valid: auto, cpu, cuda")

    def _load(self, path: Path, name: str, source: str, device: str) -> LlamaCppTarget:
        return LlamaCppTarget(self._ll, name, source, path, self.options, self.gpu_layers(device))

    def load_target(self, spec: str, *, device: str = "cpu", dtype: str = "float32", seed: int = 0) -> LlamaCppTarget:
        """Load ``gguf:FILE`` or a packaged name; ``dtype`` is the file's own (ignored), ``seed`` unused (no random weights)."""
        path = resolve_model_path(spec)
        name = spec if spec in packaged_models() else path.stem
        return self._load(path, name, f"gguf:{path}", device)

    def check_specs(self, target_spec: str, draft_specs: tuple[str, ...] | list[str]) -> None:
        """:func:`check_specs` plus the vocabulary of every ``model:`` draft (vocabularies only, no weights)."""
        check_specs(target_spec, draft_specs)
        target = None
        for d in draft_specs:
            kind, arg = parse_draft(d)
            if kind != "model":
                continue
            target = target or _Model(self._ll, resolve_model_path(target_spec), 0, vocab_only=True)
            draft = _Model(self._ll, resolve_model_path(arg, "--draft model:"), 0, vocab_only=True)
            _check_vocab(d, target, draft)

    def make_draft(self, spec: str, target: LlamaCppTarget, *, seed: int = 0) -> Any:
        """A draft for ``target`` (see module docstring for the specs)."""
        kind, arg = parse_draft(spec)
        if kind == "ngram":
            return ngram_draft(spec, target.vocab_size)
        device = "cuda" if target.gpu_layers else "cpu"
        if kind == "model":
            path = resolve_model_path(arg, "--draft model:")
            name = arg if arg in packaged_models() else path.stem
            _check_vocab(spec, target.model, _Model(self._ll, path, 0, vocab_only=True))  # before any weights
            loaded = self._load(path, name, f"gguf:{path}", device)
            return DecoderDraft(f"model:{arg}", "model", loaded.new_decoder(),
                                {"source": loaded.source, "name": name, "params": loaded.params,
                                 "dtype": loaded.dtype, "sha256": loaded.sha256})
        qpath, made = quantized_copy(target.path, arg, threads=self.threads)
        loaded = self._load(qpath, f"{target.name}-{arg}", f"gguf:{qpath}", device)
        return DecoderDraft(f"quant:{arg}", "quant", loaded.new_decoder(),
                            {"source": loaded.source, "of": target.name, "quant_type": arg, "params": loaded.params,
                             "dtype": loaded.dtype, "sha256": loaded.sha256, "quantised_now": made})

    # tokens
    def tokenize(self, target: LlamaCppTarget, text: str, add_special: bool, parse_special: bool) -> list[int]:
        """llama.cpp's tokenisation of ``text`` with ``target``'s vocabulary."""
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (self._ll.llama_token * cap)()
        n = self._ll.llama_tokenize(target.model.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (self._ll.llama_token * cap)()
            n = self._ll.llama_tokenize(target.model.vocab, data, len(data), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def encode(self, target: LlamaCppTarget, text: str, max_prompt_tokens: int) -> torch.Tensor:
        """Token ids ``[1, S]`` of a user message: the GGUF's chat template when it has one (as
        llama-cpp-python's chat completion renders it), else the plain text; the last ``max_prompt_tokens`` kept."""
        tmpl = self._ll.llama_model_chat_template(target.model.ptr, None)
        if tmpl:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            def tok_text(i: int) -> str:
                return target.model.token_text(i).decode("utf-8", "replace") if i >= 0 else ""

            fmt = Jinja2ChatFormatter(tmpl.decode("utf-8"), eos_token=tok_text(self._ll.llama_vocab_eos(target.model.vocab)),
                                      bos_token=tok_text(self._ll.llama_vocab_bos(target.model.vocab)))
            prompt = fmt(messages=[{"role": "user", "content": text}]).prompt
            ids = self.tokenize(target, prompt, add_special=False, parse_special=True)
        else:
            ids = self.tokenize(target, text, add_special=True, parse_special=False)
        return torch.tensor([ids[-max_prompt_tokens:]], dtype=torch.long)

    def versions(self) -> Mapping[str, str | None]:
        """llama-cpp-python's version, the thread count and llama.cpp's CPU feature line, for ``run.json``."""
        try:
            ver = importlib.metadata.version("llama-cpp-python")
        except importlib.metadata.PackageNotFoundError:
            ver = getattr(self._ll, "__version__", None)
        info = self._ll.llama_print_system_info().decode("utf-8", "replace").strip()
        return {"llama_cpp_python": ver, "llamacpp_threads": str(self.threads),
                "llamacpp_gpu_offload": str(bool(self._ll.llama_supports_gpu_offload())),
                "llamacpp_system_info": info}

    # the peer
    def _peer_llama(self, target: LlamaCppTarget) -> Any:
        key = (str(target.path), target.gpu_layers)
        if key not in self._peers:
            from llama_cpp import Llama
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            o = self.options
            llm = Llama(model_path=str(target.path), n_gpu_layers=target.gpu_layers, n_ctx=o.max_len_tokens,
                        n_batch=o.max_len_tokens, n_ubatch=min(o.max_len_tokens, 512), n_threads=self.threads,
                        n_threads_batch=self.threads, flash_attn=False, swa_full=True, no_perf=True,
                        draft_model=LlamaPromptLookupDecoding(), verbose=False)
            set_quiet(o.quiet)  # Llama(verbose=False) set the library's log level; put ours back
            self._peers[key] = llm
        return self._peers[key]

    def peer_generate(self, target: LlamaCppTarget, draft: Any, input_ids: torch.Tensor, gamma: int,
                      temperature: float, max_new_tokens: int, seed: int) -> PeerResult | None:
        """llama-cpp-python's own prompt lookup (``Llama.generate`` + ``LlamaPromptLookupDecoding``).

        Only for ``ngram:N:first`` drafts (the library's rule, see module
        docstring); None for other drafts. Pure temperature sampling (top-k,
        top-p, min-p, typical and repetition penalty off), seeded by ``seed``.
        ``drafted``/``accepted``/``rounds`` are counted from the proposals the
        library asked for and the tokens it then emitted.
        """
        from measure.drafts import NGramDraft

        if not isinstance(draft, NGramDraft) or ngram_rule(draft) != "first" or gamma < 1:
            return None
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        calls: list[tuple[int, list[int]]] = []

        class CountingLookup(LlamaPromptLookupDecoding):
            def __call__(self, ids: Any, /, **kw: Any) -> Any:
                out = super().__call__(ids, **kw)
                calls.append((int(ids.shape[0]), out.tolist()))
                return out

        llm = self._peer_llama(target)
        llm.draft_model = CountingLookup(max_ngram_size=int(draft.max_ngram), num_pred_tokens=int(gamma))
        llm.set_seed(int(seed))
        llm.reset()
        prompt = input_ids.reshape(-1).tolist()
        eos = set(target.eos_token_ids)
        out: list[int] = []
        t0 = time.perf_counter()
        for tok in llm.generate(prompt, temp=float(temperature), top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0,
                                repeat_penalty=1.0, reset=True):
            out.append(int(tok))
            if len(out) >= max_new_tokens or tok in eos:
                break
        wall_s = time.perf_counter() - t0
        accepted = 0
        for seq_len, proposal in calls:
            emitted = out[seq_len - len(prompt):seq_len - len(prompt) + len(proposal)]
            accepted += next((i for i, (a, b) in enumerate(zip(proposal, emitted)) if a != b),
                             min(len(proposal), len(emitted)))
        return PeerResult(tokens=tuple(out), wall_s=wall_s, drafted=sum(len(p) for _, p in calls),
                          accepted=accepted, rounds=len(calls))


def _check_vocab(spec: str, target: _Model, draft: _Model) -> None:
    why = vocabulary_mismatch(target.n_vocab, draft.n_vocab, target.token_text, draft.token_text)
    if why:
        raise ValueError(f"--draft {spec}: {draft.path.name} has another vocabulary than the target "
                         f"{target.path.name} ({why}); draft and target must share a tokenizer")


def make_engine(options: EngineOptions) -> LlamaCppEngine:
    """The llama.cpp engine (``ImportError`` naming ``specscope[llamacpp]`` when llama-cpp-python is missing)."""
    return LlamaCppEngine(options)
