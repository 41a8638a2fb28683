"""Fixtures shared by the tests of measure.engines: the packaged model on the llama.cpp engine."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def smollm2(engine):
    """The packaged SmolLM2-135M GGUF loaded by the requesting module's own ``engine`` fixture (a llama.cpp engine
    with that module's options), once per module; skips without the GGUF. Here it replaces
    tests/measure/conftest.py's ``smollm2`` (the same model through transformers)."""
    from measure.engines.gguf_files import PACKAGED

    try:
        PACKAGED["smollm2-135m"]()
    except ValueError as e:
        pytest.skip(str(e))
    return engine.load_target("smollm2-135m", device="cpu", dtype="float32", seed=0)
