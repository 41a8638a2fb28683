"""What the llama.cpp worker does with llama-cpp-python: models, contexts, tokens, and the library's own loops.

Runs only in a process without torch (the worker, the check decode): numpy
arrays in and out, llama.cpp left in its default runtime (no thread or
OpenMP setting of ours). Objects:

* :class:`Model` — a ``llama_model`` from a GGUF (weights shared by every
  context made from it);
* :class:`Context` — one ``llama_context`` (a KV-cached sequence, batch size 1):
  ``forward`` feeds ``n`` tokens in **one** ``llama_decode`` with logits for
  every fed position (or the last), ``argmax`` the same with only the greedy
  ids coming back, ``greedy`` a whole greedy generation with the token loop
  run here (one message per generation), ``rollback(m)`` removes positions ``m..`` with
  ``llama_memory_seq_rm``; a full-size sliding-window cache (``swa_full``)
  keeps the rollback exact for SWA models (Gemma-3); ``topk`` the best ``k``
  ids and their log-probabilities per row (a tree draft's candidates);
* a tree context (``sequences > 1``, :mod:`.tree`) — the same with several
  sequences in a unified KV cache, for token trees verified in one decode;
* llama-cpp-python's own loops (plain ``Llama.generate`` and its prompt
  lookup) do not run here: they run in a process of their own, started
  fresh, as a user's (:mod:`.reference`).
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import logging
import sys
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

_LOGGER_NAME = "llama-cpp-python"
#: Tokens whose texts are compared between a draft's and the target's vocabulary.
VOCAB_SAMPLE_TOKENS = 512
#: The most sequences a llama.cpp context holds (``LLAMA_MAX_SEQ``, ``src/llama-cparams.h``).
LLAMA_MAX_SEQ = 256


def top_logprobs(rows: np.ndarray, k: int) -> tuple[list[list[int]], list[list[float]]]:
    """The ``k`` best ids of each row of logits ``[n, V]`` (best first; equal logits: the lower id first) and
    their log-probabilities (log-softmax of the row, in float64 then rounded to float32's precision)."""
    k = min(int(k), rows.shape[1])
    if k < 1:
        raise ValueError(f"top-k of {k} ids")
    x = rows.astype(np.float64)
    part = np.argpartition(-x, k - 1, axis=1)[:, :k]  # [n, k], unordered
    vals = np.take_along_axis(x, part, 1)
    order = np.lexsort((part, -vals), axis=1)
    ids = np.take_along_axis(part, order, 1)
    top = np.take_along_axis(vals, order, 1)
    mx = x.max(1, keepdims=True)
    lse = mx + np.log(np.exp(x - mx).sum(1, keepdims=True))
    return ids.tolist(), (top - lse).astype(np.float32).tolist()


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


@dataclass(frozen=True)
class ContextSettings:
    """The ``llama_context_params`` every context of ours uses (the baseline's, the speculative loop's, the drafts').

    ``n_ctx = n_batch = max_len_tokens`` (a prefill is one batch), ``n_ubatch ≤ 512``, one thread count for
    single-token and batch decodes, flash attention off (``Llama``'s default), a full-size SWA cache.
    ``sequences``: 1 (llama.cpp's own ``n_seq_max`` default, every chain run), or, for a tree run only, what
    llama.cpp's tree speculation (``examples/speculative``) sets: ``n_seq_max = sequences`` and a unified KV
    cache (:mod:`.tree`).
    """

    max_len_tokens: int
    threads: int
    gpu_layers: int = 0
    sequences: int = 1

    def __post_init__(self) -> None:
        if self.max_len_tokens < 2:
            raise ValueError(f"max_len_tokens {self.max_len_tokens}: must be >= 2")
        if not 1 <= self.threads <= 1024:
            raise ValueError(f"threads {self.threads}: must be in 1..1024")
        if not 1 <= self.sequences <= LLAMA_MAX_SEQ:
            raise ValueError(f"sequences {self.sequences}: must be in 1..{LLAMA_MAX_SEQ} (llama.cpp's LLAMA_MAX_SEQ)")


#: ggml's log levels (``enum ggml_log_level`` in the ggml.h of the llama.cpp this runs). llama-cpp-python's
#: ``_logger`` maps an older order (no DEBUG at 1), under which llama.cpp's INFO lines pass as warnings: the
#: loader's 180-line metadata dump went to stderr before a one-line error without ``--quiet`` (issue #43).
GGML_LOG_WARN, GGML_LOG_ERROR, GGML_LOG_CONT = 3, 4, 5
#: llama.cpp's first error line since the last model load began (what a failed load says: a truncated file …)
_ERRORS: list[str] = []


#: Every log callback handed to llama.cpp, kept for the life of the process: llama.cpp holds only the address, and
#: a model or context freed after its :class:`Runtime` (at the end of ``probe decode``) still logs through it.
_CALLBACKS: list[Any] = []


def _log_callback(ll: Any, quiet: bool) -> Any:
    """A llama.cpp log callback writing warnings and errors to stderr (``quiet``: errors only); a continued line
    (``CONT``) follows the level of the line it continues. Keep the object: llama.cpp holds only its address."""
    floor = GGML_LOG_ERROR if quiet else GGML_LOG_WARN
    last = [0]

    @ll.llama_log_callback
    def callback(level: int, text: bytes, _user_data: Any) -> None:
        if level != GGML_LOG_CONT:
            last[0] = level
        if level == GGML_LOG_ERROR and not _ERRORS:
            _ERRORS.append(" ".join(text.decode("utf-8", "replace").split()))
        if last[0] >= floor:
            sys.stderr.write(text.decode("utf-8", "replace"))
            sys.stderr.flush()

    _CALLBACKS.append(callback)  # llama.cpp may log while a model or context is freed after its runtime is gone
    return callback


class Model:
    """A ``llama_model`` loaded from a GGUF (freed when this object is collected)."""

    def __init__(self, ll: Any, path: Path, gpu_layers: int, vocab_only: bool = False) -> None:
        params = ll.llama_model_default_params()
        params.n_gpu_layers = int(gpu_layers)
        params.vocab_only = bool(vocab_only)
        _ERRORS.clear()
        ptr = ll.llama_model_load_from_file(str(path).encode(), params)
        if not ptr:
            why = _ERRORS[0].split(": ", 1)[-1] if _ERRORS else "unsupported architecture or damaged file"
            raise ValueError(f"llama.cpp could not load {path} ({why})")
        self._ll, self.ptr, self.path, self.gpu_layers = ll, ptr, Path(path), int(gpu_layers)
        self.vocab = ll.llama_model_get_vocab(ptr)
        self.n_vocab = int(ll.llama_vocab_n_tokens(self.vocab))

    def token_text(self, i: int) -> bytes:
        return bytes(self._ll.llama_vocab_get_text(self.vocab, int(i)) or b"")

    def describe(self) -> dict:
        """Vocabulary size, end-of-generation ids, llama.cpp's description, parameter and weight counts."""
        ll = self._ll
        buf = ctypes.create_string_buffer(256)
        ll.llama_model_desc(self.ptr, buf, ctypes.sizeof(buf))
        return {"n_vocab": self.n_vocab, "eos": [i for i in range(self.n_vocab) if ll.llama_vocab_is_eog(self.vocab, i)],
                "desc": buf.value.decode("utf-8", "replace"), "params": int(ll.llama_model_n_params(self.ptr)),
                "weight_bytes": int(ll.llama_model_size(self.ptr))}

    def __del__(self) -> None:
        ptr, self.ptr = getattr(self, "ptr", None), None
        if ptr:
            self._ll.llama_model_free(ptr)


class Context:
    """One llama.cpp context over a :class:`Model`: a KV-cached sequence behind forward/argmax/rollback."""

    def __init__(self, ll: Any, model: Model, settings: ContextSettings) -> None:
        self._ll, self.model = ll, model
        self.vocab_size = model.n_vocab
        cp = context_params(ll, settings)
        ctx = ll.llama_init_from_model(model.ptr, cp)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not create a context of {settings.max_len_tokens} tokens")
        self.ctx = ctx
        self.n_ctx = int(ll.llama_n_ctx(ctx))
        self.n_batch = int(cp.n_batch)
        self._mem = ll.llama_get_memory(ctx)
        self.n_seq_max = int(cp.n_seq_max)
        self._batch = ll.llama_batch_init(self.n_batch, 0, self.n_seq_max)
        b = self._batch
        self._tok = np.ctypeslib.as_array(b.token, shape=(self.n_batch,))
        self._pos = np.ctypeslib.as_array(b.pos, shape=(self.n_batch,))
        self._logit_flags = np.ctypeslib.as_array(b.logits, shape=(self.n_batch,))
        np.ctypeslib.as_array(b.n_seq_id, shape=(self.n_batch,))[:] = 1
        for i in range(self.n_batch):
            b.seq_id[i][0] = 0
        self.n_cached = 0

    def reset(self) -> None:
        """Empty the cache (a new sequence)."""
        self._ll.llama_memory_clear(self._mem, True)
        self.n_cached = 0

    def _check_room(self, n: int) -> None:
        if n == 0:
            raise ValueError("forward of 0 tokens")
        if self.n_cached + n > self.n_ctx:
            raise ValueError(f"llama.cpp context full: {self.n_cached} cached + {n} fed > {self.n_ctx} "
                             "(raise max_len_tokens)")
        if n > self.n_batch:
            raise ValueError(f"forward of {n} tokens exceeds the llama.cpp batch of {self.n_batch} (max_len_tokens)")

    def _decode(self, ids: list[int], out_rows: int) -> np.ndarray:
        n = len(ids)
        self._check_room(n)
        self._tok[:n] = ids
        self._pos[:n] = np.arange(self.n_cached, self.n_cached + n)
        self._logit_flags[:n] = 0
        self._logit_flags[n - out_rows:n] = 1
        return self._run(n, out_rows)

    def _run(self, n: int, out_rows: int) -> np.ndarray:
        """``llama_decode`` of the batch's first ``n`` tokens → a view of llama.cpp's logits ``[out_rows, V]``."""
        self._batch.n_tokens = n
        rc = self._ll.llama_decode(self.ctx, self._batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode of {n} tokens at position {self.n_cached} failed (return code {rc})")
        self.n_cached += n
        ptr = self._ll.llama_get_logits(self.ctx)
        return np.ctypeslib.as_array(ptr, shape=(out_rows, self.vocab_size))  # a view of llama.cpp's buffer

    def forward(self, ids: list[int], last_only: bool = False) -> np.ndarray:
        """Feed ``ids`` in one ``llama_decode`` → a float32 copy of the logits ``[n, V]`` (``[1, V]`` if ``last_only``)."""
        return self._decode(ids, 1 if last_only else len(ids)).copy()

    def argmax(self, ids: list[int], last_only: bool = False) -> list[int]:
        """Like :meth:`forward`, but only the greedy token of each row comes back."""
        return self._decode(ids, 1 if last_only else len(ids)).argmax(-1).tolist()

    def topk(self, ids: list[int], k: int, last_only: bool = False) -> tuple[list[list[int]], list[list[float]]]:
        """Like :meth:`forward`, but only each row's ``k`` best ids and their log-probabilities come back
        (:func:`top_logprobs`)."""
        return top_logprobs(self._decode(ids, 1 if last_only else len(ids)), k)

    def greedy(self, ids: list[int], max_new_tokens: int, eos: list[int]) -> dict:
        """Greedy decoding of prompt ``ids`` from an empty cache, the token loop run here — one ``llama_decode``
        and argmax per token, as a user's loop runs in its own process, with no message to the parent between
        tokens — until ``max_new_tokens`` or an id in ``eos``: tokens, wall seconds from the start to the last
        token (the prompt processed inside), milliseconds to each token from the previous one."""
        self.reset()
        stop = {int(t) for t in eos}
        out: list[int] = []
        lat: list[float] = []
        t0 = last = time.perf_counter()
        x = self.argmax(ids, last_only=True)[0]
        while True:
            now = time.perf_counter()
            lat.append((now - last) * 1e3)
            last = now
            out.append(int(x))
            if len(out) >= max_new_tokens or x in stop:
                break
            x = self.argmax([x], last_only=True)[0]
        return {"tokens": out, "wall_s": last - t0, "latency_ms": lat}

    def rollback(self, n_tokens: int) -> None:
        """Keep the first ``n_tokens`` cached positions (``llama_memory_seq_rm`` of the rest)."""
        if n_tokens < 0:
            raise ValueError(f"rollback to {n_tokens} tokens")
        if n_tokens >= self.n_cached:
            return
        if not self._ll.llama_memory_seq_rm(self._mem, 0, int(n_tokens), -1):
            raise RuntimeError(f"llama.cpp could not remove positions {n_tokens}.. from its cache")
        self.n_cached = int(n_tokens)

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


def context_params(ll: Any, s: ContextSettings) -> Any:
    """The ``llama_context_params`` of :class:`ContextSettings`."""
    cp = ll.llama_context_default_params()
    cp.n_ctx = int(s.max_len_tokens)
    cp.n_batch = int(s.max_len_tokens)
    cp.n_ubatch = min(int(s.max_len_tokens), 512)
    cp.n_seq_max = int(s.sequences)
    if s.sequences > 1:  # a tree run's context (.tree): the paths' sequences share the context's cells
        cp.kv_unified = True
    cp.n_threads = cp.n_threads_batch = int(s.threads)
    cp.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cp.swa_full = True
    cp.no_perf = True
    return cp


class Runtime:
    """llama-cpp-python, loaded once per process (see module docstring).

    ``variant``: load only this CPU backend library (the check decode tries
    variants one by one); by default llama.cpp loads its backends itself, from
    the build's ``GGML_BACKEND_DIR``, as any user's ``Llama(...)`` does.
    """

    def __init__(self, variant: Path | None = None, quiet: bool = True) -> None:
        import llama_cpp

        if variant is not None:
            ggml = ctypes.CDLL("libggml.so.0")  # already loaded by libllama: the same library
            ggml.ggml_backend_load.restype = ctypes.c_void_p
            ggml.ggml_backend_load.argtypes = [ctypes.c_char_p]
            if not ggml.ggml_backend_load(str(variant).encode()):
                raise RuntimeError(f"llama.cpp could not load the CPU backend {variant}")
        llama_cpp.llama_backend_init()
        self.ll = llama_cpp
        logging.getLogger(_LOGGER_NAME).setLevel(logging.ERROR if quiet else logging.WARNING)
        self.quiet = quiet
        self._log = _log_callback(llama_cpp, quiet)
        self._install_log()

    def _install_log(self) -> None:
        """llama.cpp's log through :func:`_log_callback` (again after ``Llama`` is first imported: its module
        installs llama-cpp-python's own callback)."""
        self.ll.llama_log_set(self._log, ctypes.c_void_p(0))

    # -- what is loaded ----------------------------------------------------------------------
    def system_info(self) -> str:
        """llama.cpp's own line of the CPU features its loaded backend uses."""
        return self.ll.llama_print_system_info().decode("utf-8", "replace").strip()

    @staticmethod
    def cpu_backend() -> str | None:
        """The CPU backend library this process mapped (``libggml-cpu-haswell.so`` …), from /proc/self/maps."""
        try:
            with open("/proc/self/maps") as f:
                for line in f:
                    name = line.rsplit("/", 1)[-1].strip()
                    if name.startswith("libggml-cpu") and name.endswith(".so"):
                        return name
        except OSError:
            pass
        return None

    def versions(self) -> dict:
        try:
            ver: str | None = importlib.metadata.version("llama-cpp-python")
        except importlib.metadata.PackageNotFoundError:
            ver = getattr(self.ll, "__version__", None)
        return {"llama_cpp_python": ver, "gpu_offload": bool(self.ll.llama_supports_gpu_offload()),
                "system_info": self.system_info(), "cpu_backend": self.cpu_backend(),
                "library": str(Path(self.ll.llama_cpp._lib._name).resolve())}

    # -- models, contexts, tokens ----------------------------------------------------------------
    def load_model(self, path: Path, gpu_layers: int, vocab_only: bool = False) -> Model:
        return Model(self.ll, path, gpu_layers, vocab_only)

    def new_decoder(self, model: Model, max_len_tokens: int, threads: int) -> Context:
        return Context(self.ll, model, ContextSettings(max_len_tokens, threads, model.gpu_layers))

    def tokenize(self, model: Model, text: str, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (self.ll.llama_token * cap)()
        n = self.ll.llama_tokenize(model.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (self.ll.llama_token * cap)()
            n = self.ll.llama_tokenize(model.vocab, data, len(data), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def encode(self, model: Model, text: str, max_prompt_tokens: int) -> list[int]:
        """Token ids of a user message: the GGUF's chat template when it has one (rendered as llama-cpp-python's
        chat completion renders it), else the plain text; the last ``max_prompt_tokens`` kept."""
        tmpl = self.ll.llama_model_chat_template(model.ptr, None)
        if tmpl:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            def tok_text(i: int) -> str:
                return model.token_text(i).decode("utf-8", "replace") if i >= 0 else ""

            fmt = Jinja2ChatFormatter(tmpl.decode("utf-8"), eos_token=tok_text(self.ll.llama_vocab_eos(model.vocab)),
                                      bos_token=tok_text(self.ll.llama_vocab_bos(model.vocab)))
            prompt = fmt(messages=[{"role": "user", "content": text}]).prompt
            ids = self.tokenize(model, prompt, add_special=False, parse_special=True)
        else:
            ids = self.tokenize(model, text, add_special=True, parse_special=False)
        return ids[-max_prompt_tokens:]

    def quantize(self, source: Path, qtype: str, threads: int, root: Path) -> tuple[str, bool]:
        """The ``qtype`` copy of ``source`` cached under ``root`` (:func:`measure.engines.gguf_files.quantized_copy`)."""
        from measure.engines.gguf_files import quantized_copy

        path, made = quantized_copy(source, qtype, threads=threads, root=root)
        return str(path), made

    @staticmethod
    def environment() -> dict:
        """What this process is: its pid, whether torch is in it, the OpenMP wait policy it sees."""
        import sys

        return {"pid": os.getpid(), "torch_loaded": "torch" in sys.modules,
                "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}
