"""Devices and dtypes by name: ``--device auto|cpu|cuda[:N]`` and ``--dtype``, resolved once, checked in one line."""

from __future__ import annotations

import torch

DEVICES = ("auto", "cpu", "cuda")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> str:
    """``auto`` → ``cuda`` when available else ``cpu``; a clear error when CUDA is asked for and absent."""
    if device not in DEVICES and not str(device).startswith("cuda:"):
        raise ValueError(f"unknown device {device!r}; valid: {', '.join(DEVICES)}")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available here; use --device cpu or auto")
    return str(device)


def resolve_dtype(dtype: str) -> torch.dtype:
    """The torch dtype called ``dtype`` (one of :data:`DTYPES`); one-line ``ValueError`` for another name."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPES)}")
    return DTYPES[dtype]
