"""The machine and the software a result was produced with: package versions, the CPU's name."""

from __future__ import annotations

import importlib.metadata
import platform


def package_version(name: str) -> str | None:
    """The installed version of distribution ``name`` (``"transformers"``), None when it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what :mod:`platform` knows."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        return cpu
