"""Shared test settings.

Hypothesis: the per-example deadline (200 ms) measures wall time, which on a
shared 2-core CI machine says more about the neighbours than about the code;
the property tests here check values, never speed (speed is benchmarked in
``benchmarks/``), so the deadline is off. ``derandomize`` makes every run draw
the same examples (seeded from each test), so a CI failure reproduces.

Ctrl-C: a shell without job control starts a background command with SIGINT
ignored, and an ignored signal stays ignored in every child, so the tests that
interrupt a child (``measure`` closing a run ``interrupted``) would see the
interrupt do nothing. The suite gives SIGINT its usual handler back, here in the
controller and in every xdist worker, so those tests test the code, not how the
suite was launched.

Threads: ``make test`` runs one xdist worker per core, so each worker (and every
process it starts: a ``python -m measure`` subprocess, the notebook's kernel)
gets one compute thread (``OMP_NUM_THREADS=1``, unless the caller set it).
torch's default of one thread per core in each of them put N² busy threads on N
cores; OpenMP's spinning threads then waited on each other and a real-model test
took several times its time alone. A plain ``pytest`` (no workers) keeps
torch's default.
"""

import os
import signal
import sys
from pathlib import Path

import pytest
from hypothesis import settings

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if "torch" in sys.modules:  # imported before this file (a plugin): its pool is sized already
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

settings.register_profile("specscope", deadline=None, derandomize=True)
settings.load_profile("specscope")


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A random-weight Llama (4 layers, vocabulary 300, 512 positions) saved once per worker: a ``--target``
    whose cells measure in a fraction of a second, for the tests of the pipeline rather than of a model."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    path = tmp_path_factory.mktemp("tiny_llama")
    cfg = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    return str(path)


@pytest.fixture()
def model_dir(tmp_path: Path) -> Path:
    """A user's own Llama-shaped model: a directory holding its config.json (the step-cost seam's input)."""
    from tests.support.model_configs import LLAMA_LIKE, write_model_dir

    return write_model_dir(tmp_path / "my-llama", LLAMA_LIKE)


@pytest.fixture()
def no_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The costs extra absent: aiconfigurator-core cannot be found (``auto`` falls back to the roofline)."""
    from sim import kernels

    monkeypatch.setattr(kernels, "kernels_unavailable", lambda: "aiconfigurator-core==0.12.0 is not installed")
    monkeypatch.setattr(kernels, "package_dir", lambda: None)
