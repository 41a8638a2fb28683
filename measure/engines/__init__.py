"""Engines: where a model's forward pass and KV cache live (transformers, llama.cpp).

The decoding loops (:mod:`measure.decoding`), the drafts and the sweep are
written once, against the small seam in :mod:`measure.seam`: an
engine loads models and hands out :class:`~measure.seam.Decoder`
objects (one model's KV-cached sequence: forward n tokens with their logits,
roll back to a length), tokenises prompts and, where it has one, runs its own
speculative decoding as a peer. A new engine is an adapter module here, not a
second sweep.
"""

from __future__ import annotations

import importlib

from measure.seam import ENGINES, Engine, EngineOptions


def make_engine(name: str, options: EngineOptions) -> Engine:
    """The engine called ``name`` (one of :data:`ENGINES`), configured by ``options``.

    An engine whose library is missing raises ``ImportError`` with the extra that installs it.
    """
    return _module(name).make_engine(options)


def check_specs(name: str, target_spec: str, draft_specs: tuple[str, ...] | list[str]) -> None:
    """Check a target and drafts for engine ``name`` without loading weights (one-line ``ValueError``).

    Each engine module's own ``check_specs`` knows its draft forms (``quant:TYPE``
    is a llama.cpp draft, ``int8`` a transformers one) and what of a target can
    be checked from its spec alone (a GGUF file's path and magic).
    """
    _module(name).check_specs(target_spec, draft_specs)


def context_tokens(name: str, spec: str) -> int | None:
    """The positions model ``spec`` was trained for, as engine ``name`` would load it, read without its weights
    (a GGUF header, a ``config.json``, a preset); None when that is not known before loading."""
    return _module(name).context_tokens(spec)


def _module(name: str):
    """The adapter module of engine ``name`` (one-line ``ValueError`` for an unknown name)."""
    if name not in ENGINES:
        raise ValueError(f"--engine {name!r}: unknown; valid: {', '.join(ENGINES)}")
    return importlib.import_module(f"measure.engines.{name}")
