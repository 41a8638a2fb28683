"""One HF causal LM's KV-cached sequence: a static KV cache with O(1) roll-back, optional ``torch.compile``d steps.

:class:`TransformersDecoder` is the :class:`~measure.seam.Decoder` of the transformers engine:

* ``cache="static"`` (default): one preallocated ``[1, kv_heads, max_len, head_dim]``
  key and value tensor per layer (transformers' ``StaticLayer``), sized
  ``options.max_len_tokens`` (prompt + new tokens + γ_max + 1, as gpt-fast).
  Roll-back moves the position (one in-place ``fill_`` per layer); the stale
  entries past it are never attended to (causal mask) and are overwritten by
  the next forward. Every layer is a full-length static layer — a
  sliding-window layer's window is applied by the model's mask, not by a
  ring buffer — so any roll-back is exact. A sequence that outgrows the cache
  reallocates it at twice the size (never inside a counted step when the
  cache is sized for the run).
* ``cache="dynamic"``: transformers' ``DynamicCache`` (``crop`` + ``cat``), kept
  so the two can be compared.
* ``compile=True``: ``torch.compile`` of the one-token and the k-token
  forward over the static cache (``reduce-overhead``, i.e. CUDA graphs, on
  GPU; inductor's ``default`` on CPU). Compilation happens on the first call
  of each shape; :attr:`TransformersDecoder.compile_s` accumulates the time
  of those first calls so a caller can report it apart from counted numbers.

Besides the seam's ``forward`` (float32 logits), the decoder has the greedy
fast path the loops use: :meth:`TransformersDecoder.forward_argmax` returns
token ids on the device — the argmax is taken in the model's dtype (no
float32 copy of full-vocabulary logits) and, when the model's ``lm_head`` is
a :class:`~measure.seam.KeptVocabularyHead` (the pruned draft head), through
the head's own ``greedy`` (ids-and-logits over ``K`` rows, no ``-inf`` scatter
over ``V``); :meth:`TransformersDecoder.forward_topk` gives that head's
``K``-sized logits for sampling.

The bare-model helpers at the end (:func:`forward_logits`, :func:`new_cache`,
:func:`crop_cache`) serve callers that time a model outside a decoder (the
profiler split, the head sweep's draft-step timing).
"""

from __future__ import annotations

import functools
import inspect
import time
from typing import Any

import torch

from measure.seam import EngineOptions, KeptVocabularyHead, TreeDecoder

#: the widest compiled step (tokens verified at once); wider forwards run eager
COMPILED_MAX_TOKENS = 64
#: ``torch.compile`` mode per device type.
COMPILE_MODES = {"cpu": "default", "cuda": "reduce-overhead"}


def _softcap(model: Any) -> float | None:
    cfg = getattr(model, "config", None)
    for c in (cfg, getattr(cfg, "text_config", None)):
        if c is not None and getattr(c, "final_logit_softcapping", None):
            return float(c.final_logit_softcapping)
    return None


@functools.lru_cache(maxsize=None)
def takes_logits_to_keep(cls: Any) -> bool:
    """Whether the model class ``cls`` (any HF model class)'s ``forward`` has transformers' ``logits_to_keep``."""
    try:
        return "logits_to_keep" in inspect.signature(cls.forward).parameters
    except (TypeError, ValueError):
        return False


class TransformersDecoder(TreeDecoder):
    """One HF causal LM's KV-cached sequence (batch 1); see the module docstring.

    Of the seam's fast paths it declares ``forward_argmax`` (the argmax in the model's dtype, a pruned head's
    ``greedy``) and ``forward_topk`` (a pruned head's kept logits); the top-k and tree paths are the seam's
    defaults from its logits, which stay on the device in this process anyway.

    ``model``: the ``nn.Module`` (eval mode, on its device). Its ``lm_head`` may
    be swapped at any time (the pruned-head sweep does): the head is looked up
    on every call.
    """

    def __init__(self, model: Any, options: EngineOptions | None = None) -> None:
        opts = options or EngineOptions()
        self.model = model
        self.options = opts
        self.cache_kind = opts.cache
        self.device = next(model.parameters()).device
        head = model.get_output_embeddings()
        w = getattr(head, "weight", None)
        w = w() if callable(w) else w  # a dynamic-int8 Linear's weight is a method
        self.vocab_size = int(w.shape[0]) if w is not None else int(model.config.vocab_size)
        self._n = 0
        self._capacity = int(opts.max_len_tokens)
        self._keep = takes_logits_to_keep(model.__class__)
        self._keep_idx: dict[int, torch.Tensor] = {}  # n → tensor([n - 1]) on the device, built once per n
        self._softcap = _softcap(model)
        self.compile = bool(opts.compile)
        if self.compile and self.cache_kind != "static":
            raise ValueError("--compile needs --cache static (a DynamicCache changes shape every step)")
        self.compile_s = 0.0
        self._compiled: dict[tuple[str, bool], Any] = {}
        self._inbuf: torch.Tensor | None = None  # static input ids of the compiled steps
        self._head: Any = None  # the lm_head last seen, and whether it keeps part of the vocabulary
        self._head_kept = False
        self.cache = self._new_cache()

    # -- cache -----------------------------------------------------------------------------
    def _n_layers(self) -> int:
        return int(self.model.config.get_text_config(decoder=True).num_hidden_layers)

    def _new_cache(self) -> Any:
        from transformers import Cache, DynamicCache
        from transformers.cache_utils import StaticLayer

        if self.cache_kind == "dynamic":
            return DynamicCache()
        return Cache(layers=[StaticLayer(max_cache_len=self._capacity) for _ in range(self._n_layers())])

    def _grow(self, need: int) -> None:
        """Reallocate the static cache to hold ``need`` positions (doubling), keeping what is cached."""
        cap = self._capacity
        while cap < need:
            cap *= 2
        for layer in self.cache.layers:
            layer.max_cache_len = cap
            if layer.is_initialized:
                for attr in ("keys", "values"):
                    old = getattr(layer, attr)
                    new = old.new_zeros(old.shape[0], old.shape[1], cap, old.shape[3])
                    new[:, :, :self._n] = old[:, :, :self._n]
                    setattr(layer, attr, new)
        self._capacity = cap
        self._compiled.clear()  # new static addresses: compiled steps are rebuilt

    @property
    def n_cached(self) -> int:
        return self._n

    @property
    def capacity_tokens(self) -> int:
        """Positions the cache holds without growing (static cache; unbounded for dynamic)."""
        return self._capacity

    def reset(self) -> None:
        self.rollback(0)

    def rollback(self, n_tokens: int) -> None:
        """Keep the first ``n_tokens`` positions: static cache O(1) (move the position), dynamic ``crop``."""
        n = int(n_tokens)
        if n < 0:
            raise ValueError(f"rollback to {n_tokens} tokens: must be >= 0")
        if n >= self._n:
            return
        if self.cache_kind == "static":
            self._rollback_positions(n)
        elif n == 0:
            self.cache = self._new_cache()
        else:
            self.cache.crop(n - self._n)  # transformers 5: a negative count removes that many tokens
        self._n = n

    def _rollback_positions(self, n: int) -> None:
        with torch.inference_mode():
            for layer in self.cache.layers:
                if layer.is_initialized:
                    layer.cumulative_length.fill_(n)

    # -- forwards ----------------------------------------------------------------------------
    def _keep_index(self, n: int) -> torch.Tensor:
        t = self._keep_idx.get(n)
        if t is None:
            # an index tensor, not the int 1: transformers then gathers a contiguous [1, 1, H] copy of the last
            # hidden state, where ``1`` gives a strided view that sends CPU bf16 F.linear down a path ~20x slower
            t = self._keep_idx[n] = torch.tensor([n - 1], device=self.device)
        return t

    def _logits_eager(self, input_ids: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        kw = {"logits_to_keep": keep} if keep is not None else {}
        return self.model(input_ids=input_ids, past_key_values=self.cache, use_cache=True, **kw).logits

    def _argmax_eager(self, input_ids: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        return self._logits_eager(input_ids, keep)[0].argmax(-1)  # [n] in the model's dtype: no float copy

    def _hidden_eager(self, input_ids: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        out = self.model.base_model(input_ids=input_ids, past_key_values=self.cache, use_cache=True)
        h = out.last_hidden_state[0]  # [n, H]
        return h.index_select(0, keep) if keep is not None else h

    def _pruned_greedy_eager(self, input_ids: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        return self.model.lm_head.greedy(self._hidden_eager(input_ids, keep))  # [n]

    def _run(self, what: str, input_ids: torch.Tensor, last_only: bool) -> torch.Tensor:
        n = int(input_ids.shape[1])
        if n < 1:
            raise ValueError("forward needs at least one token")
        if self.cache_kind == "static" and self._n + n > self._capacity:
            self._grow(self._n + n)
        # one position projects one row anyway: no logits_to_keep for n == 1 (one compiled graph, not two)
        keep = self._keep_index(n) if (last_only and n > 1 and (self._keep or what != "logits")) else None
        fn = getattr(self, f"_{what}_eager")
        # compiled: the one-token step and the k-token verify (all positions, up to COMPILED_MAX_TOKENS); a
        # prefill, a draft's catch-up step (last position only) or a teacher-forced pass runs eager
        if self.compile and (n == 1 or (not last_only and n <= COMPILED_MAX_TOKENS)):
            fn, input_ids = self._compiled_step(what, n, fn, input_ids)
        with torch.inference_mode():
            out = fn(input_ids, keep)
        self._n += n
        return out

    def _compiled_step(self, what: str, n: int, fn: Any, input_ids: torch.Tensor) -> tuple[Any, torch.Tensor]:
        """The compiled ``fn`` for a one-token or a k-token step, and ``input_ids`` copied into a static buffer.

        The static input buffer gives every call the same strides and (for CUDA
        graphs) the same address; the first call of a shape compiles, timed into
        :attr:`compile_s`.
        """
        if self._inbuf is None:
            with torch.inference_mode():
                self._inbuf = torch.zeros(1, COMPILED_MAX_TOKENS, dtype=torch.long, device=self.device)
        with torch.inference_mode():
            self._inbuf[:, :n].copy_(input_ids)
        key = (what, n == 1)
        cfn = self._compiled.get(key)
        if cfn is None:
            from torch import _dynamo

            cfg = _dynamo.config
            # target, drafts and shapes share the step functions' code objects: allow their variants
            cfg.recompile_limit = max(getattr(cfg, "recompile_limit", 8), 64)
            cfg.accumulated_recompile_limit = max(getattr(cfg, "accumulated_recompile_limit", 256), 1024)
            mode = COMPILE_MODES.get(self.device.type, "default")
            cfn = torch.compile(fn, mode=mode, dynamic=n > 1)
            t0 = time.perf_counter()
            with torch.inference_mode():
                cfn(self._inbuf[:, :n], None)  # compile (its cache writes are undone below)
            self._sync()
            self.compile_s += time.perf_counter() - t0
            self._rollback_positions(self._n)
            self._compiled[key] = cfn
        return cfn, self._inbuf[:, :n]

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def forward(self, input_ids: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Float32 logits ``[n, V]`` of ``input_ids`` ``[1, n]`` after the cache (``[1, V]`` if ``last_only``)."""
        logits = self._run("logits", input_ids, last_only)[0]  # [n or 1, V]
        if last_only and logits.shape[0] > 1:
            logits = logits[-1:]
        return logits.float()

    def _kept_head(self) -> KeptVocabularyHead | None:
        """``model.lm_head`` when it is a :class:`~measure.seam.KeptVocabularyHead` (it may be swapped at any
        time; the check is redone only when it was)."""
        head = self.model.lm_head
        if head is not self._head:
            self._head, self._head_kept = head, isinstance(head, KeptVocabularyHead)
        return head if self._head_kept else None

    def forward_argmax(self, input_ids: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Greedy fast path: argmax token ids ``[n]`` (``[1]`` if ``last_only``) on the device, no host sync.

        Through a kept-vocabulary head's ``greedy`` when ``model.lm_head`` is one
        (:class:`~measure.seam.KeptVocabularyHead`; soft-capping is monotone, so
        the argmax is unchanged by it).
        """
        what = "pruned_greedy" if self._kept_head() is not None else "argmax"
        if what == "argmax" and last_only and not self._keep:
            return self._run("argmax", input_ids, False)[-1:]
        return self._run(what, input_ids, last_only)

    def forward_topk(self, input_ids: torch.Tensor, last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Pruned head only: kept ids ``[n, K]`` and float32 logits ``[n, K]`` (soft-capped like the model's).

        None when ``model.lm_head`` is not a kept-vocabulary head (use :meth:`forward`).
        """
        head = self._kept_head()
        if head is None:
            return None
        hidden = self._run("hidden", input_ids, last_only)  # [n, H]
        pl = head.project(hidden)
        logits = pl.logits
        if self._softcap is not None:
            logits = torch.tanh(logits / self._softcap) * self._softcap
        return pl.ids, logits

    # -- token trees (measure.trees) ----------------------------------------------------------
    def forward_tree(self, input_ids: torch.Tensor, prefix_tokens: int, slot_positions: torch.Tensor,
                     visible: torch.Tensor) -> torch.Tensor:
        """Float32 logits ``[m, V]`` of ``input_ids`` ``[1, m]`` fed after the cache under a tree attention mask.

        Every token sees the first ``prefix_tokens`` cached positions; of the
        slots from there on (the ``n_cached − prefix_tokens`` already cached,
        then the ``m`` new ones) it sees those marked in ``visible`` (bool
        ``[m, n_cached + m − prefix_tokens]``, its own slot included).
        ``slot_positions`` (long, one per such slot) are their positions: the
        new tokens' position ids, and what a sliding-window layer measures its
        window by. The cache grows by ``m``; always eager (never compiled).
        """
        n, m = self._n, int(input_ids.shape[1])
        if self.cache_kind == "static" and n + m > self._capacity:
            self._grow(n + m)
        kv = self._capacity if self.cache_kind == "static" else n + m
        dev = self.device
        allow = torch.zeros(m, kv, dtype=torch.bool, device=dev)
        allow[:, :prefix_tokens] = True
        allow[:, prefix_tokens:n + m] = visible.to(dev)
        key_pos = torch.arange(kv, device=dev)
        key_pos[prefix_tokens:n + m] = slot_positions.to(dev)
        pos = key_pos[n:n + m]
        dtype = next(self.model.parameters()).dtype
        dtype = dtype if dtype.is_floating_point else torch.float32

        def additive(ok: torch.Tensor) -> torch.Tensor:
            return torch.zeros(1, 1, m, kv, dtype=dtype, device=dev).masked_fill_(~ok, torch.finfo(dtype).min)

        cfg = self.model.config.get_text_config(decoder=True)
        window = getattr(cfg, "sliding_window", None)
        mask: Any = additive(allow)
        if window and "sliding_attention" in (getattr(cfg, "layer_types", None) or ()):
            mask = {"full_attention": mask,
                    "sliding_attention": additive(allow & (pos[:, None] - key_pos[None, :] < int(window)))}
        with torch.inference_mode():
            logits = self.model(input_ids=input_ids, past_key_values=self.cache, use_cache=True,
                                attention_mask=mask, position_ids=pos[None]).logits
        self._n += m
        return logits[0].float()

    def keep_slots(self, start: int, slots: list[int]) -> None:
        """Move cached positions ``slots`` (ascending, each >= ``start``) to ``start``, ``start + 1``, … and keep
        the first ``start + len(slots)``: a tree forward's accepted path put in place, without re-running it."""
        dst = list(range(start, start + len(slots)))
        if list(slots) != dst:
            src_t = torch.tensor(list(slots), device=self.device)
            dst_t = torch.tensor(dst, device=self.device)
            with torch.inference_mode():
                for layer in self.cache.layers:
                    if getattr(layer, "is_initialized", True):
                        for attr in ("keys", "values"):
                            t = getattr(layer, attr)
                            t.index_copy_(2, dst_t, t.index_select(2, src_t))
        self.rollback(start + len(slots))

    def warmup(self, k_tokens: int, sampling: bool = False) -> float:
        """Compile (and run once) the one-token and the ``k_tokens`` step now, outside any counted time.

        Returns the seconds spent compiling (also added to :attr:`compile_s`);
        the cache is left as it was. A no-op without ``compile``.
        """
        if not self.compile:
            return 0.0
        before, n0 = self.compile_s, self._n
        x = torch.zeros(1, max(2, int(k_tokens)), dtype=torch.long, device=self.device)
        for what in ("argmax", "logits") if sampling else ("argmax",):
            for n in (1, x.shape[1]):
                self._run(what, x[:, :n], False)
                self.rollback(n0)
        return self.compile_s - before

    def describe(self) -> dict:
        return {"cache": self.cache_kind, "compile": self.compile, "capacity_tokens": self._capacity,
                "compile_mode": COMPILE_MODES.get(self.device.type, "default") if self.compile else None}


# -- bare-model helpers (callers that time a model outside a decoder: profiling, the head sweep) --------
def new_cache() -> Any:
    """An empty transformers ``DynamicCache``."""
    from transformers import DynamicCache

    return DynamicCache()


def cache_len(cache: Any) -> int:
    return int(cache.get_seq_length()) if cache is not None else 0


def crop_cache(cache: Any, n_tokens: int) -> None:
    """Keep the first ``n_tokens`` positions of a ``DynamicCache`` (no-op if it is not longer)."""
    extra = cache_len(cache) - n_tokens
    if extra > 0:
        cache.crop(-extra)  # transformers 5: a negative count removes that many tokens


@torch.inference_mode()
def forward_logits(model: Any, input_ids: torch.Tensor, cache: Any | None, last_only: bool = False) -> torch.Tensor:
    """Logits ``[1, S, V]`` (float32) of ``input_ids`` ``[1, S]`` continuing ``cache`` (updated in place).

    ``last_only``: only the last position's logits (``logits_to_keep`` as an
    index tensor), result ``[1, 1, V]``. The loops use decoders instead; this
    serves callers that time a bare HF model.
    """
    kw = {}
    if last_only and takes_logits_to_keep(model.__class__):
        # an index tensor, not the int 1: transformers then gathers a contiguous [1, 1, H] copy of the last
        # hidden state, where ``1`` gives a strided view that sends CPU bf16 F.linear down a path ~20x slower
        kw["logits_to_keep"] = torch.tensor([input_ids.shape[1] - 1], device=input_ids.device)
    out = model(input_ids=input_ids, past_key_values=cache, use_cache=cache is not None, **kw)
    logits = out.logits
    return (logits[:, -1:] if last_only else logits).float()
