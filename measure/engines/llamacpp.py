"""The llama.cpp engine: GGUF models run by llama.cpp in its own process, behind the engine seam.

What users run small models with on CPUs and laptops. llama.cpp runs here as
its users run it: the build of :mod:`measure.engines.llamacpp_native.build`
(portable, the CPU variant checked by a test decode on this machine), in a
worker process that never imports torch and changes nothing of llama.cpp's
runtime (:mod:`measure.engines.llamacpp_native.worker`). This module is the
parent's side, the :class:`~measure.seam.Engine` the sweep sees:

* :class:`LlamaCppTarget` — a model loaded in the worker; hands out
  :class:`LlamaCppDecoder` objects, each its own llama.cpp context (KV cache)
  over the shared weights;
* :class:`LlamaCppDecoder` — ``forward`` feeds ``n`` tokens in one
  ``llama_decode`` and gets their logits back as a float32 tensor ``[n, V]``
  (only where sampling or a lossless check needs them); ``forward_argmax``
  gets only the greedy ids (what greedy verification and the cost curves
  use: token ids in, token ids out); ``rollback(m)`` removes positions
  ``m..`` (``llama_memory_seq_rm``); ``greedy_generate`` is the greedy
  baseline with its token loop in the worker. Every call is one message to
  the worker and back (its cost is inside the times our loop measures: once
  per round for the speculative loop and the cost curves' forwards, once per
  generation for the greedy baseline, as a user's loop has none per token);
* :class:`LlamaCppTreeDecoder` — in a tree run (``EngineOptions.tree_sequences``)
  every decoder is one: a context with ``n_seq_max`` sequences in a unified KV
  cache, where a token tree is verified in one ``llama_decode`` (its tokens
  carrying the sequence ids of the paths through them) and only the accepted
  path is kept (:mod:`measure.engines.llamacpp_native.tree`); argmaxes and
  top-k ids with log-probabilities come back, not logits;
* the peer — llama-cpp-python's own prompt lookup,
  ``Llama(draft_model=LlamaPromptLookupDecoding(max_ngram_size=N,
  num_pred_tokens=γ)).generate``, beside ``ngram:N:first`` cells (the
  library's earliest-match rule; ``ngram:N``'s most-recent rule has no peer);
* the library baseline — llama-cpp-python's plain ``Llama.generate`` on the
  same prompt in the same visit, which our baseline is held against.

The peer and the library baseline run in the *reference* process
(:mod:`measure.engines.llamacpp_native.reference`): a user's own
llama-cpp-python, started fresh beside the worker, ``Llama(model_path=...,
n_ctx=..., n_threads=...)`` with the library's defaults otherwise — not in our
worker, so nothing of ours (its contexts, its message loop) is in what they
measure.

Model specs (``--target``): ``gguf:FILE``, ``smollm2-135m``, ``gemma3-270m``
(:data:`measure.engines.gguf_files.PACKAGED`). Draft specs: ``ngram`` /
``ngram:N`` / ``ngram:N:first`` (:class:`measure.drafts.NGramDraft`);
``model:gguf:FILE`` or ``model:<packaged name>`` (refused in one line unless
its vocabulary is the target's); ``quant:TYPE`` (a copy of the target made by
llama.cpp's own ``llama_model_quantize``, cached by the source's SHA-256);
a ``model:`` or ``quant:`` draft is :class:`measure.drafts.ModelDraft` over a
:class:`LlamaCppDecoder`, as every engine's model drafts are.
Specs are validated without llama-cpp-python installed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from measure.drafts import ModelDraft, NGramDraft, ngram_draft
from measure.engines.gguf_files import (
    PACKAGED,
    cache_root,
    check_gguf,
    check_quant_type,
    file_sha256,
    gguf_context_tokens,
)
from measure.engines.lossless import NEAR_TIE_TOLERANCE
from measure.engines.llamacpp_native.build import BUILD_COMMAND
from measure.seam import Decoder, Draft, EngineOptions, GenerationResult, PeerResult, TargetModel, TreeDecoder

EXTRA_HINT = f"build llama.cpp and install llama-cpp-python over it: {BUILD_COMMAND}"
#: Draft kinds this engine builds (``ngram`` rules come from :mod:`measure.drafts`).
DRAFT_FORMS = ("ngram", "ngram:N", "ngram:N:first", "model:gguf:FILE", "model:<packaged name>", "quant:TYPE")


# -- specs ------------------------------------------------------------------------------------
def resolve_model_path(spec: str, flag: str = "--target ") -> Path:
    """The GGUF file a model spec names, checked (exists, GGUF magic); ``ValueError`` in one line otherwise."""
    spec = str(spec)
    if spec in PACKAGED:
        return check_gguf(PACKAGED[spec](), f"{flag}{spec} -> ")
    if spec.startswith("gguf:"):
        return check_gguf(spec[len("gguf:"):], f"{flag}gguf:")
    valid = ", ".join(["gguf:FILE", *PACKAGED])
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
            ngram_draft(d, vocab_size=1)  # its parser's one-line ValueError if bad


def context_tokens(spec: str) -> int | None:
    """The training context of GGUF model ``spec`` (``gguf:FILE`` or a packaged name), from its header."""
    return gguf_context_tokens(resolve_model_path(spec))


def resolved_threads(options: EngineOptions) -> int:
    """``options.threads``, else every CPU this process may run on."""
    if options.threads:
        return int(options.threads)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


# -- the model and its decoders -------------------------------------------------------------------
class LlamaCppTarget(TargetModel):
    """A GGUF model loaded in the worker: the :class:`~measure.seam.TargetModel` of this engine."""

    synthetic = False
    device = "cpu"  # logits come back to the host also when layers are offloaded (recorded as gpu_layers)
    tokenizer = None  # no transformers tokenizer: LlamaCppEngine.encode tokenises with llama.cpp

    def __init__(self, engine: "LlamaCppEngine", name: str, path: Path, gpu_layers: int) -> None:
        self.engine, self.name, self.path, self.gpu_layers = engine, name, path, int(gpu_layers)
        self.source = f"gguf:{path}"
        info = engine.worker.call("load", path=str(path), gpu_layers=self.gpu_layers)
        self.handle = int(info["handle"])
        self.vocab_size = int(info["n_vocab"])
        self.eos_token_ids = tuple(int(i) for i in info["eos"])
        self.desc, self.params, self.weight_bytes = str(info["desc"]), int(info["params"]), int(info["weight_bytes"])
        self.sha256 = file_sha256(path)

    @property
    def dtype(self) -> str:
        """The GGUF's weight type as llama.cpp names it (``Q4_1``, ``Q8_0`` …)."""
        return self.desc.rsplit(" ", 1)[-1]


    def describe(self) -> dict:
        """The ``run.json`` ``models`` entry."""
        return {"name": self.name, "source": self.source, "synthetic": False, "vocab_size": self.vocab_size,
                "params": self.params, "dtype": self.dtype, "device": self.device, "engine": "llamacpp",
                "gpu_layers": self.gpu_layers, "desc": self.desc, "file_bytes": self.path.stat().st_size,
                "weight_bytes": self.weight_bytes, "sha256": self.sha256}

    def new_decoder(self) -> LlamaCppDecoder:
        """A fresh, empty decoder (its own llama.cpp context and KV cache) over this model's weights: a
        :class:`LlamaCppTreeDecoder` in a tree run (``EngineOptions.tree_sequences``)."""
        seqs = int(self.engine.options.tree_sequences)
        return LlamaCppTreeDecoder(self, seqs) if seqs > 1 else LlamaCppDecoder(self)


class LlamaCppDecoder(Decoder):
    """One llama.cpp context in the worker: a KV-cached sequence (batch size 1), the
    :class:`~measure.seam.Decoder` of this engine. It declares every fast path of the seam (``forward_argmax``,
    ``forward_topk_logprobs``, ``greedy_generate``): only ids and a few scores come back from the worker, and
    the greedy baseline's token loop runs there."""

    def __init__(self, target: LlamaCppTarget, sequences: int = 1) -> None:
        self._worker = target.engine.worker
        self.vocab_size = target.vocab_size
        opts = target.engine.options
        info = self._worker.call("decoder", model=target.handle, max_len_tokens=int(opts.max_len_tokens),
                                 threads=target.engine.threads, sequences=int(sequences))
        self.handle, self.n_ctx, self.n_batch = int(info["handle"]), int(info["n_ctx"]), int(info["n_batch"])
        self.n_seq_max = int(info["n_seq_max"])
        self._n_cached = 0

    @property
    def n_cached(self) -> int:
        """Positions currently in the cache."""
        return self._n_cached

    def reset(self) -> None:
        """Empty the cache (a new sequence)."""
        self._worker.call("reset", dec=self.handle)
        self._n_cached = 0

    def forward(self, input_ids: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Feed ``input_ids`` ``[1, n]`` in one ``llama_decode`` → logits ``[n, V]`` (``[1, V]`` if ``last_only``)."""
        ids = input_ids.reshape(-1).tolist()
        out = self._worker.call("forward", dec=self.handle, ids=ids, last_only=bool(last_only))
        self._n_cached += len(ids)
        return torch.from_numpy(out)  # [rows, V] float32

    def forward_argmax(self, input_ids: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Like :meth:`forward`, but only the greedy ids come back: ``[n]`` (``[1]`` if ``last_only``)."""
        ids = input_ids.reshape(-1).tolist()
        out = self._worker.call("argmax", dec=self.handle, ids=ids, last_only=bool(last_only))
        self._n_cached += len(ids)
        return torch.tensor(out, dtype=torch.long)

    def greedy_generate(self, input_ids: torch.Tensor, max_new_tokens: int,
                        eos_token_ids: Sequence[int] = ()) -> GenerationResult:
        """Greedy decoding of ``input_ids`` ``[1, S]`` from an empty cache with the token loop in the worker:
        one message per generation, none per token (the baseline of :func:`measure.decoding.autoregressive_generate`).

        A message per token made every token of our baseline wait for two process wake-ups that a user's own
        loop never waits for: a few per cent on a quiet machine, tens of per cent on a busy one (issue 44).
        Times are the worker's, from its start to the last token, the prompt processed inside.
        """
        ids = input_ids.reshape(-1).tolist()
        r = self._worker.call("greedy", dec=self.handle, ids=ids, max_new_tokens=int(max_new_tokens),
                              eos=[int(t) for t in eos_token_ids])
        self._n_cached = len(ids) + len(r["tokens"]) - 1  # the last token is emitted, not fed
        lat = tuple(float(v) for v in r["latency_ms"])
        return GenerationResult(tokens=tuple(int(t) for t in r["tokens"]), prompt_tokens=len(ids),
                                wall_s=float(r["wall_s"]), ttft_ms=lat[0], token_latency_ms=lat)

    def forward_topk_logprobs(self, input_ids: torch.Tensor, k: int,
                              last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Like :meth:`forward`, but only each row's ``k`` best ids (best first) and their log-probabilities
        come back: ``[n, k]`` long and float32 (``[1, k]`` if ``last_only``)."""
        ids = input_ids.reshape(-1).tolist()
        top, logp = self._worker.call("topk", dec=self.handle, ids=ids, k=int(k), last_only=bool(last_only))
        self._n_cached += len(ids)
        return torch.tensor(top, dtype=torch.long), torch.tensor(logp, dtype=torch.float32)

    def rollback(self, n_tokens: int) -> None:
        """Keep the first ``n_tokens`` cached positions."""
        if n_tokens < 0:
            raise ValueError(f"rollback to {n_tokens} tokens")
        if n_tokens >= self._n_cached:
            return
        self._worker.call("rollback", dec=self.handle, n_tokens=int(n_tokens))
        self._n_cached = int(n_tokens)

    def __del__(self) -> None:
        w = getattr(self, "_worker", None)
        if w is not None and w.alive:
            try:
                w.call("free", dec=self.handle)
            except (RuntimeError, ValueError):
                pass


def tree_parents(prefix_tokens: int, n_cached: int, known: list[frozenset[int]], slot_positions: torch.Tensor,
                 visible: torch.Tensor) -> tuple[list[int], list[frozenset[int]]]:
    """A tree attention mask read back as a tree: each new token's parent slot (-1: the context's last
    position) and what it sees, ``ValueError`` naming the token if the mask is not one of a tree.

    The slots are the cached positions from ``prefix_tokens`` on (``known``: what each cached one sees, as slot
    numbers counted from ``prefix_tokens``), then the new tokens; ``visible`` (bool ``[m, n_cached + m −
    prefix_tokens]``) and ``slot_positions`` are :meth:`~measure.seam.TreeDecoder.forward_tree`'s. A token's
    parent is the deepest slot it sees; it must see exactly its parent's ancestors, its parent and itself, at
    its parent's position + 1.
    """
    m, width = int(visible.shape[0]), n_cached - prefix_tokens + int(visible.shape[0])
    if tuple(visible.shape) != (m, width) or int(slot_positions.shape[0]) != width or len(known) != width - m:
        raise ValueError(f"tree forward: visible {tuple(visible.shape)} and slot_positions "
                         f"{tuple(slot_positions.shape)} do not cover the {width} slots after {prefix_tokens}")
    pos = slot_positions.tolist()
    sees = list(known)
    parents = []
    for i, row in enumerate(visible.tolist()):
        own = width - m + i
        seen = frozenset(j for j, v in enumerate(row) if v)
        above = seen - {own}
        parent = max(above, key=lambda j: pos[j]) if above else -1
        want = (sees[parent] if parent >= 0 else frozenset()) | {own}
        at = pos[parent] + 1 if parent >= 0 else prefix_tokens
        if seen != want or parent >= own or pos[own] != at:
            raise ValueError(f"tree forward: token {i} (slot {own}) sees slots {sorted(seen)} at position "
                             f"{pos[own]}: not a tree node (its ancestors {sorted(want - {own})}, position {at})")
        sees.append(seen)
        parents.append(prefix_tokens + parent if parent >= 0 else -1)
    return parents, sees


class LlamaCppTreeDecoder(LlamaCppDecoder, TreeDecoder):
    """A :class:`LlamaCppDecoder` over a tree context (several sequences, a unified KV cache): the
    :class:`~measure.seam.TreeDecoder` of this engine, with its fast paths ``forward_tree_argmax`` and
    ``forward_tree_topk`` (:mod:`measure.engines.llamacpp_native.tree` says how the mask is made)."""

    def __init__(self, target: LlamaCppTarget, sequences: int) -> None:
        super().__init__(target, sequences)
        self._committed = 0
        self._sees: list[frozenset[int]] = []  # per tree slot after the committed ones: the slots it sees

    def reset(self) -> None:
        super().reset()
        self._committed, self._sees = 0, []

    def forward(self, input_ids: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        out = super().forward(input_ids, last_only)
        self._committed = self._n_cached
        return out

    def forward_argmax(self, input_ids: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        out = super().forward_argmax(input_ids, last_only)
        self._committed = self._n_cached
        return out

    def greedy_generate(self, input_ids: torch.Tensor, max_new_tokens: int,
                        eos_token_ids: Sequence[int] = ()) -> GenerationResult:
        out = super().greedy_generate(input_ids, max_new_tokens, eos_token_ids)
        self._committed, self._sees = self._n_cached, []
        return out

    def forward_topk_logprobs(self, input_ids: torch.Tensor, k: int,
                              last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        out = super().forward_topk_logprobs(input_ids, k, last_only)
        self._committed = self._n_cached
        return out

    def _tree(self, input_ids: torch.Tensor, prefix_tokens: int, slot_positions: torch.Tensor,
              visible: torch.Tensor, out: str, k: int = 0) -> Any:
        if prefix_tokens != self._committed:
            raise ValueError(f"tree forward after {prefix_tokens} tokens: llama.cpp's committed sequence holds "
                             f"{self._committed} (the tree slots follow it)")
        parents, sees = tree_parents(prefix_tokens, self._n_cached, self._sees, slot_positions, visible)
        ids = input_ids.reshape(-1).tolist()
        res = self._worker.call("tree", dec=self.handle, ids=ids, parents=parents, out=out, k=int(k))
        self._n_cached += len(ids)
        self._sees = sees
        return res

    def forward_tree(self, input_ids: torch.Tensor, prefix_tokens: int, slot_positions: torch.Tensor,
                     visible: torch.Tensor) -> torch.Tensor:
        """Float32 logits ``[m, V]`` of the tree tokens (:meth:`~measure.seam.TreeDecoder.forward_tree`)."""
        return torch.from_numpy(self._tree(input_ids, prefix_tokens, slot_positions, visible, "logits"))

    def forward_tree_argmax(self, input_ids: torch.Tensor, prefix_tokens: int, slot_positions: torch.Tensor,
                            visible: torch.Tensor) -> torch.Tensor:
        """Each tree token's argmax ``[m]``: only ids come back."""
        return torch.tensor(self._tree(input_ids, prefix_tokens, slot_positions, visible, "argmax"),
                            dtype=torch.long)

    def forward_tree_topk(self, input_ids: torch.Tensor, prefix_tokens: int, slot_positions: torch.Tensor,
                          visible: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each tree token's ``k`` best ids ``[m, k]`` and their log-probabilities ``[m, k]``."""
        top, logp = self._tree(input_ids, prefix_tokens, slot_positions, visible, "topk", k)
        return torch.tensor(top, dtype=torch.long), torch.tensor(logp, dtype=torch.float32)

    def keep_slots(self, start: int, slots: list[int]) -> None:
        """Keep the first ``start`` positions and the tree slots ``slots`` (one path on from them): the
        accepted path's sequence becomes the committed one, every other path's cells go."""
        self._worker.call("tree_keep", dec=self.handle, start=int(start), slots=[int(s) for s in slots])
        self._n_cached = self._committed = int(start) + len(slots)
        self._sees = []

    def rollback(self, n_tokens: int) -> None:
        if n_tokens < 0:
            raise ValueError(f"rollback to {n_tokens} tokens")
        if n_tokens >= self._n_cached:
            return
        super().rollback(n_tokens)
        self._committed = self._n_cached
        self._sees = []

    def cached_sequences(self) -> dict[int, tuple[int, int]]:
        """Per sequence holding cells in llama.cpp's cache, its lowest and highest position."""
        return {int(k): (int(v[0]), int(v[1])) for k, v in self._worker.call("tree_cells", dec=self.handle).items()}


# -- the engine -------------------------------------------------------------------------------------
class LlamaCppEngine:
    """The llama.cpp :class:`~measure.seam.Engine` (see module docstring).

    The worker starts with the first model this engine needs, after the check
    before trusting (:func:`measure.engines.llamacpp_native.probe.check_installed`):
    a test decode of that model in a throw-away process, once per build and CPU.
    """

    name = "llamacpp"
    near_tie_tolerance = NEAR_TIE_TOLERANCE

    def __init__(self, options: EngineOptions) -> None:
        if not _bindings_installed():
            raise ImportError(f"--engine llamacpp needs llama-cpp-python: {EXTRA_HINT}")
        self.options = options
        self.threads = resolved_threads(options)
        self._worker: Any = None
        self._reference: Any = None
        self.trust: dict = {}
        # the loop's own tensor work (ids in and out, one argmax where sampling) is tiny: torch's own thread
        # pool is not needed in this process, which only waits for the worker while llama.cpp computes
        torch.set_num_threads(1)

    # the worker
    def _start(self, model: Path) -> Any:
        if self._worker is None:
            from measure.engines.llamacpp_native.client import LlamaCppWorker
            from measure.engines.llamacpp_native.probe import LibraryCrashed, check_installed

            try:
                self.trust = check_installed(model)
            except LibraryCrashed as e:
                raise ValueError(str(e)) from None
            self._worker = LlamaCppWorker(quiet=self.options.quiet)
            if self._worker.hello.get("torch_loaded"):
                raise RuntimeError("the llama.cpp worker imported torch; it must run without it")
        return self._worker

    @property
    def worker(self) -> Any:
        """The worker process (started by the first :meth:`load_target`)."""
        if self._worker is None:
            raise RuntimeError("the llama.cpp engine has no model loaded yet (load_target first)")
        return self._worker

    def close(self) -> None:
        """End the worker process and the reference process."""
        for name in ("_worker", "_reference"):
            proc = getattr(self, name)
            if proc is not None:
                proc.close()
                setattr(self, name, None)

    # loading
    def gpu_layers(self, device: str) -> int:
        """Layers to offload: all on ``cuda`` (needs a GPU build of llama.cpp), none on ``cpu``."""
        device = str(device)
        if device == "cpu":
            return 0
        if device not in ("auto",) and not device.startswith("cuda"):
            raise ValueError(f"--device {device!r}: unknown; valid: auto, cpu, cuda")
        offload = bool(self._worker.hello.get("gpu_offload")) if self._worker is not None else False
        if device == "auto":
            return -1 if offload else 0
        if not offload:
            raise ValueError(f"--device {device}: this llama.cpp build has no GPU offload; build one with "
                             f"{BUILD_COMMAND} --kind cuda (needs the CUDA toolkit), or use --device cpu")
        return -1

    def load_target(self, spec: str, *, device: str = "cpu", dtype: str = "float32", seed: int = 0) -> LlamaCppTarget:
        """Load ``gguf:FILE`` or a packaged name; ``dtype`` is the file's own (ignored), ``seed`` unused (no random weights)."""
        path = resolve_model_path(spec)
        self._start(path)
        name = spec if spec in PACKAGED else path.stem
        return LlamaCppTarget(self, name, path, self.gpu_layers(device))

    def check_specs(self, target_spec: str, draft_specs: tuple[str, ...] | list[str]) -> None:
        """:func:`check_specs` plus the vocabulary of every ``model:`` draft (vocabularies only, no weights)."""
        check_specs(target_spec, draft_specs)
        target = resolve_model_path(target_spec)
        for d in draft_specs:
            kind, arg = parse_draft(d)
            if kind == "model":
                self._check_vocab(d, target, resolve_model_path(arg, "--draft model:"))

    def _check_vocab(self, spec: str, target: Path, draft: Path) -> None:
        why = self._start(target).call("vocab_mismatch", target=str(target), draft=str(draft))
        if why:
            raise ValueError(f"--draft {spec}: {draft.name} has another vocabulary than the target {target.name} "
                             f"({why}); draft and target must share a tokenizer")

    def make_draft(self, spec: str, target: LlamaCppTarget, *, seed: int = 0) -> Draft:
        """A draft for ``target`` (see module docstring for the specs)."""
        kind, arg = parse_draft(spec)
        if kind == "ngram":
            return ngram_draft(spec, target.vocab_size)
        device = "cuda" if target.gpu_layers else "cpu"
        if kind == "model":
            path = resolve_model_path(arg, "--draft model:")
            name = arg if arg in PACKAGED else path.stem
            self._check_vocab(spec, target.path, path)  # before any weights
            loaded = LlamaCppTarget(self, name, path, self.gpu_layers(device))
            return ModelDraft(f"model:{arg}", "model", loaded.new_decoder(), loaded=loaded,
                              info={"source": loaded.source, "name": name, "params": loaded.params,
                                    "dtype": loaded.dtype, "sha256": loaded.sha256})
        qpath, made = self.worker.call("quantize", source=str(target.path), qtype=arg, threads=self.threads,
                                       root=str(cache_root()))  # the cache this process sees
        qpath = Path(qpath)
        loaded = LlamaCppTarget(self, f"{target.name}-{arg}", qpath, self.gpu_layers(device))
        return ModelDraft(f"quant:{arg}", "quant", loaded.new_decoder(), loaded=loaded,
                          info={"source": loaded.source, "of": target.name, "quant_type": arg,
                                "params": loaded.params, "dtype": loaded.dtype, "sha256": loaded.sha256,
                                "quantised_now": made})

    # tokens
    def tokenize(self, target: LlamaCppTarget, text: str, add_special: bool, parse_special: bool) -> list[int]:
        """llama.cpp's tokenisation of ``text`` with ``target``'s vocabulary."""
        return list(self.worker.call("tokenize", model=target.handle, text=text, add_special=bool(add_special),
                                     parse_special=bool(parse_special)))

    def encode(self, target: LlamaCppTarget, text: str, max_prompt_tokens: int) -> torch.Tensor:
        """Token ids ``[1, S]`` of a user message: the GGUF's chat template when it has one (as
        llama-cpp-python's chat completion renders it), else the plain text; the last ``max_prompt_tokens`` kept."""
        ids = self.worker.call("encode", model=target.handle, text=text, max_prompt_tokens=int(max_prompt_tokens))
        return torch.tensor([ids], dtype=torch.long)

    def versions(self) -> Mapping[str, str | None]:
        """For ``run.json`` and the fingerprint: llama-cpp-python's version, threads, the build and the CPU
        backend llama.cpp loaded with the feature line it reports, that it ran in a process of its own, how the
        reference (the library's own loops) is made, and in a
        tree run the contexts' tree settings (``n_seq_max``, unified KV cache)."""
        h = self.worker.hello
        build = self.trust.get("build") or {}
        sel = self.trust.get("selection") or {}
        return {"llama_cpp_python": h.get("llama_cpp_python"), "llamacpp_threads": str(self.threads),
                "llamacpp_gpu_offload": str(bool(h.get("gpu_offload"))),
                "llamacpp_system_info": h.get("system_info"), "llamacpp_cpu_backend": h.get("cpu_backend"),
                "llamacpp_build": build.get("key") or f"not specscope's ({h.get('library')})",
                "llamacpp_process": f"own process, torch {'loaded' if h.get('torch_loaded') else 'not loaded'}, "
                                    f"OMP_WAIT_POLICY {h.get('omp_wait_policy') or 'unset'}",
                "llamacpp_reference": f"a process of its own beside the worker, started fresh: Llama(model_path, "
                                      f"n_ctx={self.options.max_len_tokens}, n_threads={self.threads}, "
                                      f"n_threads_batch={self.threads}), the library's defaults otherwise",
                **({"llamacpp_variants_tried": "; ".join(f"{v}: {o}" for v, o in sel.get("tried", []))}
                   if sel else {}),
                **({"llamacpp_tree_context": f"n_seq_max={self.options.tree_sequences}, kv_unified=true (a tree "
                                             "run's contexts, as llama.cpp's examples/speculative needs)"}
                   if self.options.tree_sequences > 1 else {})}

    # llama-cpp-python's own loops, in a user's own process
    @property
    def reference(self) -> Any:
        """The reference process (:mod:`measure.engines.llamacpp_native.reference`): a user's own
        llama-cpp-python, started fresh beside the worker by the first call that needs it."""
        if self._reference is None:
            from measure.engines.llamacpp_native.client import LlamaCppWorker

            self._reference = LlamaCppWorker(quiet=self.options.quiet, module="reference")
            if self._reference.hello.get("torch_loaded"):
                raise RuntimeError("the llama.cpp reference process imported torch; it must run without it")
        return self._reference

    def _reference_args(self, target: LlamaCppTarget, input_ids: torch.Tensor) -> dict:
        return {"path": str(target.path), "n_ctx": int(self.options.max_len_tokens), "threads": self.threads,
                "gpu_layers": target.gpu_layers, "prompt": input_ids.reshape(-1).tolist(),
                "eos": list(target.eos_token_ids)}

    def has_peer(self, target: LlamaCppTarget, draft: Draft, gamma: int) -> bool:
        """Whether :meth:`peer_generate` runs this pair: llama-cpp-python's prompt lookup takes ``ngram:N:first``
        drafts only (the earliest-match rule, llama-cpp-python's and transformers')."""
        return isinstance(draft, NGramDraft) and draft.rule == "first" and gamma >= 1

    def has_library(self, target: LlamaCppTarget) -> bool:
        """True: llama-cpp-python's plain ``Llama.generate`` runs every target."""
        return True

    def peer_generate(self, target: LlamaCppTarget, draft: Any, input_ids: torch.Tensor, gamma: int,
                      temperature: float, max_new_tokens: int, seed: int) -> PeerResult | None:
        """llama-cpp-python's own prompt lookup in the reference process, for ``ngram:N:first`` drafts only (None
        for others): pure temperature sampling, seeded by ``seed``; ``drafted``/``accepted``/``rounds`` counted
        from the proposals the library asked for and the tokens it then emitted."""
        if not self.has_peer(target, draft, gamma):
            return None
        r = self.reference.call("lookup", **self._reference_args(target, input_ids), max_ngram=int(draft.max_ngram),
                                gamma=int(gamma), temperature=float(temperature), max_new_tokens=int(max_new_tokens),
                                seed=int(seed))
        return PeerResult(tokens=tuple(r["tokens"]), wall_s=r["wall_s"], drafted=r["drafted"],
                          accepted=r["accepted"], rounds=r["rounds"], ttft_ms=r["ttft_ms"])

    def library_generate(self, target: LlamaCppTarget, input_ids: torch.Tensor, temperature: float,
                         max_new_tokens: int, seed: int) -> PeerResult:
        """llama-cpp-python's plain ``Llama.generate`` of the prompt in the reference process (pure temperature
        sampling, seeded)."""
        r = self.reference.call("plain", **self._reference_args(target, input_ids), temperature=float(temperature),
                                max_new_tokens=int(max_new_tokens), seed=int(seed))
        return PeerResult(tokens=tuple(r["tokens"]), wall_s=r["wall_s"], ttft_ms=r["ttft_ms"])


def _bindings_installed() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("llama_cpp") is not None
    except (ImportError, ValueError):  # sys.modules["llama_cpp"] set to None: treated as missing
        return False


def make_engine(options: EngineOptions) -> LlamaCppEngine:
    """The llama.cpp engine (``ImportError`` naming the build command when llama-cpp-python is missing)."""
    return LlamaCppEngine(options)
