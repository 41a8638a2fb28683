"""Run directories the calibrate tests share: committed runs, and a noisy copy of one (issue #45).

``noisy_run`` is the committed default job (``results/cpu-make-run-fresh3``)
with its ``cost_target.csv`` forwards at the shortest context timed 1.8–2.2×
slower (seeded): what a busy machine does to the micro-benchmark when another
process loads the CPU while those forwards are timed. Fitted without bounds,
those timings give the target forward a steeply negative cost per context
token, and the report's next command answered ``0.000x over 1000000000.0
tok/s``. ``one_prompt_run`` is the committed one-prompt run
(``results/cpu-small-run-fresh-1``: one domain, one prompt, two cost contexts
for the draft), on which ``python -m calibrate`` wrote ``NaN``. ``llama_config_dir``: a
local model directory (a ``config.json`` only) for ``--target``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"
#: the committed default job and the committed one-prompt run
DEFAULT_RUN = RESULTS / "cpu-make-run-fresh3"
ONE_PROMPT_RUN = RESULTS / "cpu-small-run-fresh-1"


def perturb_short_context(run: Path, seed: int = 0, low: float = 1.8, high: float = 2.2) -> None:
    """Time ``run``'s ``cost_target.csv`` forwards at its shortest context ``low``–``high``× slower (seeded)."""
    path = run / "cost_target.csv"
    table = pd.read_csv(path)
    short = table["context_tokens"] == table["context_tokens"].min()
    table.loc[short, "ms"] *= np.random.default_rng(seed).uniform(low, high, int(short.sum()))
    table.to_csv(path, index=False)


@pytest.fixture(scope="module")
def noisy_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the committed default job whose short-context forwards were timed on a busy machine."""
    run = tmp_path_factory.mktemp("noisy") / "cpu-make-run-busy"
    shutil.copytree(DEFAULT_RUN, run)
    perturb_short_context(run)
    return run


@pytest.fixture(scope="module")
def one_prompt_run() -> Path:
    return ONE_PROMPT_RUN


@pytest.fixture(scope="module")
def default_run() -> Path:
    return DEFAULT_RUN


@pytest.fixture
def llama_config_dir(tmp_path: Path) -> str:
    """A local model directory holding only a small Llama ``config.json`` (what ``--target DIR`` reads)."""
    d = tmp_path / "my-llama"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 4, "hidden_size": 512,
        "num_attention_heads": 8, "num_key_value_heads": 4, "intermediate_size": 1024, "vocab_size": 4000}))
    return str(d)
