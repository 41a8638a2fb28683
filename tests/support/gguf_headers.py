"""GGUF files that hold a header only (metadata, no tensors): what header readers and pre-flight checks see."""

from __future__ import annotations

import struct

from measure.engines.gguf_files import GGUF_MAGIC


def gguf_string(text: str) -> bytes:
    """A GGUF string: its UTF-8 length (u64), then its bytes."""
    return struct.pack("<Q", len(text.encode())) + text.encode()


def gguf_header(kvs: list[tuple[str, int, bytes]], version: int = 3) -> bytes:
    """A GGUF file with metadata only: ``kvs`` are (key, gguf type, encoded value)."""
    body = b"".join(gguf_string(k) + struct.pack("<I", t) + v for k, t, v in kvs)
    return GGUF_MAGIC + struct.pack("<IQQ", version, 0, len(kvs)) + body


def llama_header(layers: int, heads: int, kv_heads: int, width: int) -> bytes:
    """A header-only GGUF of a llama-architecture model of these sizes (u32 values)."""
    u32 = 4
    return gguf_header([("general.architecture", 8, gguf_string("llama")),
                        ("llama.block_count", u32, struct.pack("<I", layers)),
                        ("llama.attention.head_count", u32, struct.pack("<I", heads)),
                        ("llama.attention.head_count_kv", u32, struct.pack("<I", kv_heads)),
                        ("llama.embedding_length", u32, struct.pack("<I", width))])
