"""A run's identity: the machine and software it ran on (:func:`environment`) and its fingerprint.

The fingerprint (:func:`fingerprint`, known before any model loads, and
:func:`target_fingerprint`, known once the target is loaded) decides whether a
resume may append to a run (:class:`measure.records.RunWriter`).
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import torch

from measure.prompts import file_sha256
from measure.seam import Engine, TargetModel
from measure.sweep.config import SweepConfig


def environment(device: str) -> tuple[dict, dict, dict]:
    """(hardware, versions, source) for ``run.json``; ``source``: :func:`source_state`."""
    import importlib.metadata as md

    def ver(pkg: str) -> str | None:
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return None

    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else None
    hardware = {"device": "cuda" if gpu else "cpu", "device_name": gpu or cpu, "cpu": cpu,
                "cores": os.cpu_count(), "memory_bytes": int(mem), "gpu": gpu,
                "torch_threads": torch.get_num_threads()}
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": ver("transformers"), "specscope": ver("specscope"),
                "cuda": torch.version.cuda}
    return hardware, versions, source_state()


def source_state() -> dict:
    """``git_commit`` (HEAD of this checkout, None outside git) and ``git_dirty`` (tracked files changed since
    it, None when unknown): a run measured from uncommitted code says so."""
    here = Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            r = subprocess.run(["git", *args], capture_output=True, text=True, timeout=5, cwd=here)
        except (OSError, subprocess.SubprocessError):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    commit = git("rev-parse", "HEAD") or None
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"git_commit": commit, "git_dirty": None if status is None else bool(status)}


def model_file_sha256(source: str) -> str | None:
    """SHA-256 of a model's local weight file (``gguf:/path`` or a file path), None for hub ids / synthetic."""
    path = Path(str(source).split(":", 1)[1] if ":" in str(source) else str(source))
    try:
        return file_sha256(path) if path.is_file() else None
    except OSError:
        return None


def fingerprint(config: SweepConfig, device: str, selection: dict, hardware: dict, versions: dict) -> dict:
    """Everything known before loading that changes a measured number (the run's identity, part 1)."""
    return {"target": config.target, "dtype": config.dtype, "device": device,
            "engine": {"name": config.engine, "threads": config.threads, "cache": config.cache,
                       "compile": config.compile},
            "prompts": {k: v for k, v in selection.items() if k != "file"},
            "max_new_tokens": config.max_new_tokens, "max_prompt_tokens": config.max_prompt_tokens,
            "seed": config.seed, "repeats": config.repeats, "warmup": config.warmup,
            "interleave": config.interleave, "peer": config.peer, "library": config.library,
            "versions": {k: versions.get(k) for k in ("python", "torch", "transformers", "cuda")},
            "hardware": {k: hardware.get(k) for k in ("device", "cpu", "cores", "gpu")}}


def target_fingerprint(target: TargetModel, engine: Engine) -> dict:
    """The loaded target's identity (part 2 of the fingerprint, known after loading)."""
    d = target.describe()
    return {"model": {"name": d.get("name"), "source": d.get("source"), "params": d.get("params"),
                      "vocab_size": d.get("vocab_size"), "file_sha256": model_file_sha256(str(d.get("source")))},
            "engine_versions": {k: v for k, v in dict(engine.versions()).items()}}
