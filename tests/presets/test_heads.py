"""Draft heads (presets.heads, sim.typical): their cost per step, their published acceptance, the CLIs using them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from presets import HEAD_KINDS, HEAD_PAIRS, PAIRS, HeadSpec, PublishedAcceptance, get_hardware, get_model, get_pair
from presets.pairs import Pair, make_pair
from sim.acceptance import implied_alpha_from_tau
from sim.claims import check_speedup, roofline_cost
from sim.typical import TYPICAL_ALPHA, default_alpha, typical_alpha

ROOT = Path(__file__).resolve().parents[2]


# -- cost: the head's weights per step -----------------------------------------------------------
@pytest.mark.parametrize("target, published", [("Vicuna-7B-v1.3", 0.24e9), ("Llama-2-13B", 0.37e9),
                                               ("Llama-2-70B", 0.99e9)])
def test_eagle_head_weights_match_the_papers_counts(target, published):
    # EAGLE (ICML 2024) §4: "The trainable parameters of EAGLE corresponding to the 7B, 13B, 33B, and 70B models
    # are 0.24B, 0.37B, 0.56B, and 0.99B" (LLaMA2-Chat 13B/70B have the Llama-2 shapes); printed to two digits
    assert HeadSpec("eagle", get_model(target)).counted_params() == pytest.approx(published, abs=0.006e9)


def test_weights_read_per_step_follow_each_architecture():
    t = get_model("Llama-3.1-8B")  # d 4096, 32 heads of 128, 8 KV heads, FFN 14336, vocab 128256
    d, q, kv, ffn, vocab = 4096, 32 * 128, 8 * 128, 14336, 128256
    layer = d * (q + 2 * kv) + q * d + 3 * d * ffn + 2 * d  # attention, gated MLP, two RMSNorms
    assert HeadSpec("eagle", t).step_params() == layer + (2 * d * d + d) + vocab * d
    assert HeadSpec("mtp", t).step_params() == layer + (2 * d * d + 2 * d) + vocab * d
    e3 = HeadSpec("eagle3", t)
    assert e3.step_params() == layer + d * (q + 2 * kv) + 32000 * d  # q/k/v on 2d inputs, own 32k LM head
    assert e3.round_params() == 3 * d * d  # the fusing FC, once per round
    md = HeadSpec("medusa", t)
    assert md.step_params() == d * d + d + vocab * d and md.n_layers == 0 and md.kv_bytes_per_token(2.0) == 0
    assert md.counted_params() == 5 * md.step_params()


def test_roofline_prices_a_head_by_its_bytes_and_eagle3_pays_its_fc_once_per_round():
    h100 = get_hardware("h100-sxm")
    cost = roofline_cost(get_pair("eagle3-llama3.1-8b"), h100)
    head = get_pair("eagle3-llama3.1-8b").draft
    weights_ms = head.step_params() * 2.0 / (h100.memory_bandwidth_bytes_per_s * h100.bandwidth_efficiency) * 1e3
    kv_ms = 512 * head.kv_bytes_per_token(2.0) / (h100.memory_bandwidth_bytes_per_s * h100.bandwidth_efficiency) * 1e3
    step = cost.draft_step_ms(511)  # forward of 1 token at context 511 reads 512 positions of KV
    assert step == pytest.approx(weights_ms + kv_ms + h100.fixed_overhead_ms + h100.layer_overhead_ms, rel=1e-9)
    fc_ms = 3 * 4096 * 4096 * 2.0 / (h100.memory_bandwidth_bytes_per_s * h100.bandwidth_efficiency) * 1e3
    assert cost.round_overhead_ms(4) == pytest.approx(fc_ms, rel=1e-9)
    # a separate-draft pair keeps no round overhead, and a head costs a few % of the target step, not a model's
    assert roofline_cost(get_pair("llama3-1b-8b"), h100).round_overhead_ms(4) == 0.0
    c = {n: roofline_cost(get_pair(n), h100).cost_ratio(512) for n in ("eagle3-llama3.1-8b", "eagle-llama3.1-8b",
                                                                         "llama3-1b-8b")}
    assert 0.03 < c["eagle3-llama3.1-8b"] < c["eagle-llama3.1-8b"] < 0.15 < c["llama3-1b-8b"]


def test_head_pairs_are_kept_apart_from_the_pairs_measure_runs():
    assert not set(HEAD_PAIRS) & set(PAIRS) and all(p.is_head and p.default_alpha is None for p in HEAD_PAIRS.values())
    assert {p.draft.kind for p in HEAD_PAIRS.values()} == set(HEAD_KINDS)
    pair = make_pair("eagle3", "Llama-3.1-8B")
    assert pair.is_head and pair.draft == get_pair("eagle3-llama3.1-8b").draft
    with pytest.raises(ValueError, match="valid: .*eagle3"):
        get_pair("eagle4-llama3.1-8b")
    with pytest.raises(ValueError, match="default_alpha None"):
        Pair("x", HeadSpec("eagle", get_model("Llama-3.1-8B")), get_model("Llama-3.1-8B"), 0.7, "s")
    with pytest.raises(ValueError, match="built for Llama-3.1-8B"):
        Pair("x", HeadSpec("eagle", get_model("Llama-3.1-8B")), get_model("Llama-3.1-70B"), None, "s")


@pytest.mark.parametrize("kwargs, needle", [
    (dict(measure="tau", low=2.0, high=3.0), "needs the draft depth"),
    (dict(measure="tau", low=2.0, high=6.0, depth=4), "τ must be in [1, depth + 1]"),
    (dict(measure="alpha", low=0.5, high=1.2), "must be in [0, 1]"),
    (dict(measure="alpha", low=0.5, high=0.6, headline=0.7), "headline 0.7 outside"),
    (dict(measure="count", low=0.5, high=0.6), "measure must be"),
])
def test_published_acceptance_refuses_figures_that_cannot_be(kwargs, needle):
    with pytest.raises(ValueError, match=needle.replace("[", r"\[").replace("+", r"\+")):
        PublishedAcceptance("a paper", setting="s", **kwargs)


# -- acceptance: the papers' figures, turned into α ----------------------------------------------
def test_typical_ranges_come_from_each_kinds_own_papers():
    assert typical_alpha(get_pair("llama3-1b-8b")) is TYPICAL_ALPHA and typical_alpha(None) is TYPICAL_ALPHA
    e3 = typical_alpha(get_pair("eagle3-llama3.1-8b"))
    assert (e3.low, e3.high) == (round(implied_alpha_from_tau(4.24, 8), 2), round(implied_alpha_from_tau(6.74, 8), 2))
    assert "EAGLE-3 (arXiv:2503.01840), Table 1" in e3.source and "upper estimate" in e3.notes[0]
    eagle = typical_alpha(get_pair("eagle-vicuna-7b"))
    assert eagle.low == 0.64 and "EAGLE (ICML 2024, arXiv:2401.15077), Table 2" in eagle.source
    assert eagle.high == round(implied_alpha_from_tau(4.71, 6), 2)  # EAGLE-2's trees reach higher
    mtp = typical_alpha(get_pair("mtp-llama3.1-8b"))
    assert (mtp.low, mtp.high) == (0.85, 0.90) and "DeepSeek-V3" in mtp.source and "not checked" in mtp.notes[0]
    md = typical_alpha(get_pair("medusa-vicuna-7b"))
    assert md.low == round(implied_alpha_from_tau(2.09, 4), 2) and len(md.notes) == 3
    alpha, why = default_alpha(get_pair("eagle3-llama3.1-8b"))
    assert alpha == pytest.approx(implied_alpha_from_tau(6.23, 8)) and "τ 6.23 at depth 8" in why


def test_a_head_claim_is_judged_against_the_heads_range_not_the_separate_drafts():
    pair = get_pair("eagle3-llama3.1-8b")
    cost = roofline_cost(pair, get_hardware("h100-sxm"))
    v = check_speedup(cost, 3.5, None, typical=typical_alpha(pair))
    plain = check_speedup(cost, 3.5, None)
    assert v.alpha_needed == pytest.approx(plain.alpha_needed)  # same physics, another yardstick
    assert "range typical for EAGLE-3 heads" in v.verdict and "Leviathan" not in v.verdict
    assert "range typical for such pairs" in plain.verdict and "Leviathan et al. 2023 §4.2" in plain.verdict


# -- the CLIs ------------------------------------------------------------------------------------------
def _run(module: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=120)


def test_sim_check_on_an_eagle3_claim_names_the_preset_and_where_its_range_comes_from():
    r = _run("sim", "check", "--preset", "eagle3-llama3.1-8b", "--hardware", "h100-sxm", "--speedup", "3.5")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "cost model: eagle3-llama3.1-8b on h100-sxm" in out
    assert "typical alpha for EAGLE-3 heads: 0.79-0.93, from:" in out
    assert "Table 1, EAGLE-3 rows for LLaMA-Instruct 3.1 8B" in out and "trees of depth 8 (Appendix A)" in out
    assert "0.5–0.9" not in out and "Leviathan" not in out  # the separate-draft range is not quoted for a head
    j = _run("sim", "check", "--draft", "mtp", "--target", "Llama-3.1-8B", "--speedup", "1.8", "--gamma", "1",
             "--format", "json")
    assert j.returncode == 0, j.stderr
    doc = json.loads(j.stdout)
    assert doc["draft_head"]["kind"] == "mtp" and doc["verdict"]["typical_alpha"]["low"] == 0.85


def test_sim_predicts_with_a_head_preset_and_says_where_its_alpha_comes_from():
    r = _run("sim", "--preset", "eagle3-llama3.1-8b", "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["alpha"] == pytest.approx(implied_alpha_from_tau(6.23, 8))
    assert doc["alpha_source"].startswith("EAGLE-3 head: α 0.905 from the headline tree τ 6.23 at depth 8")
    assert doc["cost_model"]["draft"]["model"] == "eagle3-head(Llama-3.1-8B)"
    mine = _run("sim", "--draft", "medusa", "--target", "Vicuna-7B-v1.3", "--alpha", "0.6", "--gamma", "3")
    assert mine.returncode == 0, mine.stderr
    listing = _run("sim", "--list-presets").stdout
    assert "eagle3-llama3.1-8b" in listing and "kind medusa" in listing
    bad = _run("sim", "--draft", "eagle4", "--target", "Llama-3.1-8B")
    assert bad.returncode == 2 and "valid: " in bad.stderr and "eagle3" in bad.stderr


def test_calibrate_ingest_prices_an_engines_eagle3_numbers_with_the_head_preset(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text("SpecDecoding metrics: Mean acceptance length: 3.03, Accepted throughput: 3.87 tokens/s, Drafted "
                   "throughput: 5.72 tokens/s, Accepted: 337 tokens, Drafted: 498 tokens, Per-position acceptance "
                   "rate: 0.837, 0.669, 0.524, Avg Draft acceptance rate: 67.7%\n")
    r = _run("calibrate", "ingest", str(log), "--preset", "eagle3-llama3.1-8b", "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    assert "costs: assumed: roofline of the EAGLE-3 head on Llama-3.1-8B" in r.stdout
    last = json.loads(r.stdout.strip().splitlines()[-1])
    s = _run("sim", "--acceptance", str(tmp_path / "o" / "acceptance.json"), "--preset", "eagle3-llama3.1-8b",
             "--gamma-max", "8", "--format", "json")
    assert s.returncode == 0, s.stderr
    assert [row["speedup"] for row in json.loads(s.stdout)["rows"]] == pytest.approx(last["speedup_by_k"])
