"""Fixtures of the benchmark-file tests: the committed fixture files and small files written per test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "benchfiles"


@pytest.fixture
def fixtures() -> Path:
    """``tests/fixtures/benchfiles`` (README.md there says how each file was made)."""
    return FIXTURES


@pytest.fixture
def vllm_result() -> Callable[..., dict]:
    """A small ``vllm bench serve --save-detailed`` result object (``n`` requests, concurrency ``c``)."""

    def make(c: int = 2, n: int = 6, model: str = "m", **extra: object) -> dict:
        res = {"date": "20261127-080000", "backend": "openai-chat", "model_id": model, "request_rate": "inf",
               "max_concurrency": c, "duration": 3.0, "completed": n, "failed": 0,
               "start_times": [100.0 + 0.4 * i for i in range(n)], "ttfts": [0.1 + 0.01 * i for i in range(n)],
               "itls": [[0.02] * 15 for _ in range(n)], "latencies": [0.4 + 0.01 * i for i in range(n)],
               "input_lens": [30] * n, "output_lens": [16] * n, "errors": [""] * n}
        res.update(extra)
        return res

    return make


@pytest.fixture
def write_json(tmp_path: Path) -> Callable[[str, object], Path]:
    """Write ``obj`` as JSON (a list of objects: one per line) to ``tmp_path/name``."""

    def write(name: str, obj: object) -> Path:
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        text = "\n".join(json.dumps(o) for o in obj) if isinstance(obj, list) and name.endswith(".jsonl") \
            else json.dumps(obj)
        p.write_text(text + "\n")
        return p

    return write
