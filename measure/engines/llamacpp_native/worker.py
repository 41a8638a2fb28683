"""The llama.cpp engine's own process: ``python -m measure.engines.llamacpp_native.worker FD [--quiet]``.

llama.cpp's CPU backend runs an OpenMP thread pool that spins between
parallel regions; beside torch's own OpenMP runtime in one process the two
fought over the cores (decoding 10-40x slower), and the passive waiting that
stopped the fight slowed every token instead (25 tok/s where llama-cpp-python
alone gives 65-86). So the engine's work runs here, in a process that never
imports torch and changes nothing of llama.cpp's runtime: it is llama.cpp as a
user's ``Llama(...)`` runs it.

The parent (:mod:`.client`) sends ``(op, args)`` over the inherited socket
``FD`` and gets ``("ok", result)`` or ``("error", kind, message)`` back:
token ids in, token ids (or, where sampling or a lossless check needs them,
logits as a numpy array) out. Objects live here under integer handles. A
native crash kills only this process; the parent sees the socket close and
names the signal.

Fault injection for the crash tests: ``SPECSCOPE_LLAMACPP_FAULT=OP:N`` makes
the N-th call of ``OP`` die of a segmentation fault inside native code, the
way a miscompiled llama.cpp did.
"""

from __future__ import annotations

import ctypes
import os
import sys
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from measure.engines.llamacpp_native.runtime import Context, ContextSettings, Model, Runtime, vocabulary_mismatch
from measure.engines.llamacpp_native.tree import TreeContext

FAULT_ENV = "SPECSCOPE_LLAMACPP_FAULT"


class Handler:
    """Operations by name (``op_<name>`` methods) with the fault injection of the crash tests; the base of this
    worker and of the reference process (:mod:`.reference`)."""

    def __init__(self) -> None:
        op, _, n = os.environ.get(FAULT_ENV, "").partition(":")
        self._fault = (op, int(n)) if op and n.isdigit() else None
        self._calls: dict[str, int] = {}

    def dispatch(self, op: str, args: dict) -> Any:
        fn = getattr(self, f"op_{op}", None)
        if fn is None:
            raise ValueError(f"llama.cpp {type(self).__name__.lower()}: unknown operation {op!r}")
        self._calls[op] = self._calls.get(op, 0) + 1
        if self._fault is not None and self._fault == (op, self._calls[op]):
            ctypes.string_at(0)  # a read of address 0 in native code: SIGSEGV
        return fn(**args)


class Worker(Handler):
    """The objects of one engine (models, contexts) and the operations the parent may ask for."""

    def __init__(self, quiet: bool) -> None:
        super().__init__()
        self.rt = Runtime(quiet=quiet)
        self.models: dict[int, Model] = {}
        self.contexts: dict[int, Any] = {}
        self._next = 1

    def _handle(self) -> int:
        self._next += 1
        return self._next

    # -- the process and its library -------------------------------------------------------------
    def op_hello(self) -> dict:
        return {**self.rt.environment(), **self.rt.versions()}

    # -- models ----------------------------------------------------------------------------------
    def op_load(self, path: str, gpu_layers: int) -> dict:
        m = self.rt.load_model(Path(path), gpu_layers)
        h = self._handle()
        self.models[h] = m
        return {"handle": h, **m.describe()}

    def op_vocab_mismatch(self, target: str, draft: str) -> str | None:
        a = self.rt.load_model(Path(target), 0, vocab_only=True)
        b = self.rt.load_model(Path(draft), 0, vocab_only=True)
        return vocabulary_mismatch(a.n_vocab, b.n_vocab, a.token_text, b.token_text)

    def op_tokenize(self, model: int, text: str, add_special: bool, parse_special: bool) -> list[int]:
        return self.rt.tokenize(self.models[model], text, add_special, parse_special)

    def op_encode(self, model: int, text: str, max_prompt_tokens: int) -> list[int]:
        return self.rt.encode(self.models[model], text, max_prompt_tokens)

    def op_quantize(self, source: str, qtype: str, threads: int, root: str) -> tuple[str, bool]:
        return self.rt.quantize(Path(source), qtype, threads, Path(root))

    # -- contexts (our decoders) -----------------------------------------------------------------
    def op_decoder(self, model: int, max_len_tokens: int, threads: int, sequences: int = 1) -> dict:
        m = self.models[model]
        c: Context
        if sequences > 1:  # a tree run's context: n_seq_max sequences in a unified KV cache
            c = TreeContext(self.rt.ll, m, ContextSettings(max_len_tokens, threads, m.gpu_layers, sequences))
        else:
            c = self.rt.new_decoder(m, max_len_tokens, threads)
        h = self._handle()
        self.contexts[h] = c
        return {"handle": h, "n_ctx": c.n_ctx, "n_batch": c.n_batch, "n_seq_max": c.n_seq_max}

    def op_forward(self, dec: int, ids: list[int], last_only: bool) -> Any:
        return self.contexts[dec].forward(ids, last_only)

    def op_argmax(self, dec: int, ids: list[int], last_only: bool) -> list[int]:
        return self.contexts[dec].argmax(ids, last_only)

    def op_greedy(self, dec: int, ids: list[int], max_new_tokens: int, eos: list[int]) -> dict:
        return self.contexts[dec].greedy(ids, max_new_tokens, eos)

    def op_topk(self, dec: int, ids: list[int], k: int, last_only: bool) -> tuple[list, list]:
        return self.contexts[dec].topk(ids, k, last_only)

    def op_tree(self, dec: int, ids: list[int], parents: list[int], out: str, k: int = 0) -> Any:
        return self._tree(dec).tree(ids, parents, out, k)

    def op_tree_keep(self, dec: int, start: int, slots: list[int]) -> None:
        self._tree(dec).keep(start, slots)

    def op_tree_cells(self, dec: int) -> dict:
        return self._tree(dec).cached_positions()

    def _tree(self, dec: int) -> Any:
        c = self.contexts[dec]
        if not hasattr(c, "keep"):
            raise ValueError(f"decoder {dec}: a chain context (one sequence) has no tree forward")
        return c

    def op_rollback(self, dec: int, n_tokens: int) -> None:
        self.contexts[dec].rollback(n_tokens)

    def op_reset(self, dec: int) -> None:
        self.contexts[dec].reset()

    def op_free(self, dec: int) -> None:
        self.contexts.pop(dec, None)


def serve(conn: Connection, handler: Handler) -> int:
    """Answer the parent's requests with ``handler`` until it says ``exit`` or goes away."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return 0
        op, args = msg
        if op == "exit":
            conn.send(("ok", None))
            return 0
        try:
            result = handler.dispatch(op, args)
        except (ValueError, RuntimeError, OSError, KeyError, TypeError) as e:
            conn.send(("error", type(e).__name__, str(e) or type(e).__name__))
            continue
        conn.send(("ok", result))


def main(argv: list[str]) -> int:
    if not argv or not argv[0].isdigit():
        print("usage: python -m measure.engines.llamacpp_native.worker FD [--quiet]", file=sys.stderr)
        return 2
    return serve(Connection(int(argv[0])), Worker(quiet="--quiet" in argv[1:]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
