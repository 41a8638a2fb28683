"""A user's own llama-cpp-python process: the reference a llama.cpp sweep holds its loops against.

``python -m measure.engines.llamacpp_native.reference FD [--quiet]`` — started fresh by the engine, beside
its worker (:mod:`.worker`) and never inside it: no model, context or thread pool of ours shares this process,
no torch, nothing of llama.cpp's runtime set. What runs here is what a user of the library writes::

    llm = Llama(model_path=FILE, n_ctx=N, n_threads=T, n_threads_batch=T, verbose=False)
    for tok in llm.generate(prompt_ids, temp=0.0): ...

and, for prompt lookup, the same ``Llama`` with
``draft_model=LlamaPromptLookupDecoding(max_ngram_size=N, num_pred_tokens=γ)``. Every other setting is the
library's default (``n_batch`` / ``n_ubatch`` 512, flash attention off, logits of the last position only for
plain decoding — of every position with a draft model, as the library does —, its sampler chain: penalties
at 1.0 then greedy, or pure temperature sampling when ``temperature > 0``). ``n_threads_batch`` is the one
setting given beyond the constructor a user writes: our contexts process a prompt with the run's thread
count, and the library's default (every CPU) would make the two differ by a setting, not by a loop.

The timed span is a user's: from the ``generate`` call to the last token, the prompt processed inside it
(every generation starts from an empty cache, ``Llama.reset``: no prefix of an earlier prompt is reused),
as in our loop (:func:`measure.decoding.autoregressive_generate`).

The parent talks to it through :class:`.client.LlamaCppWorker` (``module="reference"``): ops ``hello``,
``plain`` and ``lookup``; a crash here is a :class:`.client.WorkerDied` like the worker's.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import sys
import time
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

from measure.engines.llamacpp_native.worker import Handler, serve

_LOGGER_NAME = "llama-cpp-python"


@dataclass(frozen=True)
class Generated:
    """One generation by llama-cpp-python: tokens, wall time from the ``generate`` call to the last token (the
    prompt processed inside it), time to the first token, and for prompt lookup what the draft proposed, how
    much of it the library then emitted, and how many proposals it asked for."""

    tokens: list[int]
    wall_s: float
    ttft_ms: float | None
    latency_ms: tuple[float, ...] = ()  # per emitted token, from the previous one (the first: from the call)
    drafted: int | None = None
    accepted: int | None = None
    rounds: int | None = None


def accepted_of(prompt_tokens: int, out: list[int], calls: list[tuple[int, list[int]]]) -> int:
    """Draft tokens the library emitted unchanged: per proposal made when the sequence was ``seq_len`` long,
    the length of its prefix that equals the tokens emitted from position ``seq_len`` on."""
    accepted = 0
    for seq_len, proposal in calls:
        emitted = out[seq_len - prompt_tokens:seq_len - prompt_tokens + len(proposal)]
        accepted += next((i for i, (a, b) in enumerate(zip(proposal, emitted)) if a != b),
                         min(len(proposal), len(emitted)))
    return accepted


def generate(llm: Any, prompt: list[int], eos: set[int], temperature: float, max_new_tokens: int,
             seed: int) -> Generated:
    """``llm.generate`` from an empty cache until ``max_new_tokens`` or an end-of-generation id: tokens, wall
    seconds from the call to the last token, milliseconds to the first token and between tokens."""
    llm.set_seed(int(seed))
    llm.reset()  # a fresh generation: the prompt is processed inside the timed span, as in our loop
    out: list[int] = []
    lat: list[float] = []
    t0 = last = time.perf_counter()
    for tok in llm.generate(prompt, temp=float(temperature), top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0,
                            repeat_penalty=1.0, reset=True):
        now = time.perf_counter()
        lat.append((now - last) * 1e3)
        last = now
        out.append(int(tok))
        if len(out) >= max_new_tokens or tok in eos:
            break
    return Generated(out, last - t0, lat[0] if lat else None, tuple(lat))


class Reference(Handler):
    """The ``Llama`` objects of this process, one per (file, context, threads, lookup), built on first use."""

    def __init__(self, quiet: bool) -> None:
        super().__init__()
        self.quiet = quiet
        self._llamas: dict[tuple, Any] = {}

    def llama(self, path: str, n_ctx: int, threads: int, gpu_layers: int, lookup: bool) -> Any:
        """The ``Llama`` of these settings (``gpu_layers``: 0 as the library's default, -1 all layers offloaded
        when our contexts offload them)."""
        key = (path, int(n_ctx), int(threads), int(gpu_layers), bool(lookup))
        if key not in self._llamas:
            from llama_cpp import Llama
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            self._llamas[key] = Llama(model_path=path, n_ctx=int(n_ctx), n_threads=int(threads),
                                      n_threads_batch=int(threads), n_gpu_layers=int(gpu_layers), verbose=False,
                                      draft_model=LlamaPromptLookupDecoding() if lookup else None)
            logging.getLogger(_LOGGER_NAME).setLevel(logging.ERROR if self.quiet else logging.WARNING)
        return self._llamas[key]

    def op_hello(self) -> dict:
        try:
            ver: str | None = importlib.metadata.version("llama-cpp-python")
        except importlib.metadata.PackageNotFoundError:
            ver = None
        return {"pid": os.getpid(), "torch_loaded": "torch" in sys.modules, "llama_cpp_python": ver,
                "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}

    def op_settings(self, path: str, n_ctx: int, threads: int, gpu_layers: int) -> dict:
        """The context settings the library chose for a plain ``Llama``."""
        cp = self.llama(path, n_ctx, threads, gpu_layers, False).context_params
        return {k: int(getattr(cp, k)) for k in ("n_ctx", "n_batch", "n_ubatch", "n_threads", "n_threads_batch",
                                                   "flash_attn_type", "type_k", "type_v", "swa_full")}

    def op_plain(self, path: str, n_ctx: int, threads: int, gpu_layers: int, prompt: list[int], eos: list[int],
                 temperature: float, max_new_tokens: int, seed: int) -> dict:
        """A plain ``Llama.generate``."""
        return generate(self.llama(path, n_ctx, threads, gpu_layers, False), prompt, set(eos), temperature,
                        max_new_tokens, seed).__dict__

    def op_lookup(self, path: str, n_ctx: int, threads: int, gpu_layers: int, prompt: list[int], eos: list[int],
                  max_ngram: int, gamma: int, temperature: float, max_new_tokens: int, seed: int) -> dict:
        """``Llama.generate`` with ``LlamaPromptLookupDecoding(max_ngram_size=max_ngram, num_pred_tokens=gamma)``
        (its rule: the longest n-gram that has an earlier match, its earliest match, up to γ tokens after it)."""
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        calls: list[tuple[int, list[int]]] = []

        class CountingLookup(LlamaPromptLookupDecoding):
            def __call__(self, ids: Any, /, **kw: Any) -> Any:
                got = super().__call__(ids, **kw)
                calls.append((int(ids.shape[0]), got.tolist()))
                return got

        llm = self.llama(path, n_ctx, threads, gpu_layers, True)
        llm.draft_model = CountingLookup(max_ngram_size=int(max_ngram), num_pred_tokens=int(gamma))
        g = generate(llm, prompt, set(eos), temperature, max_new_tokens, seed)
        return replace(g, drafted=sum(len(p) for _, p in calls), accepted=accepted_of(len(prompt), g.tokens, calls),
                       rounds=len(calls)).__dict__


def main(argv: list[str]) -> int:
    if not argv or not argv[0].isdigit():
        print("usage: python -m measure.engines.llamacpp_native.reference FD [--quiet]", file=sys.stderr)
        return 2
    return serve(Connection(int(argv[0])), Reference(quiet="--quiet" in argv[1:]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
