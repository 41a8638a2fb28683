"""Tests of sim.claims (verdict logic, roofline check, the claims table) and ``python -m sim check``."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from presets import get_hardware, get_pair
from sim.acceptance import implied_alpha_from_tau
from sim.analytic import speedup_leviathan
from sim.claims import (
    CLAIMS,
    CLAIMS_FILE,
    GAMMA_LIMIT,
    TYPICAL_ALPHA,
    Claim,
    DraftScaledCost,
    alpha_needed,
    check_claim,
    check_claims,
    check_roofline,
    check_speedup,
    load_claims,
    roofline_cost,
    speedup_at,
)
from sim.cost import LeviathanCost

ROOT = Path(__file__).resolve().parents[2]


# -- verdict logic on cases with known answers ----------------------------------------------
def test_claim_above_the_alpha1_bound_is_not_reachable():
    cost = LeviathanCost(0.25)
    bound = (4 + 1) / (4 * 0.25 + 1)  # α = 1: γ + 1 tokens per round of cost γc + 1
    v = check_speedup(cost, bound * 1.01, 4)
    assert v.kind == "not_reachable" and v.alpha_needed is None
    assert v.bound_at_alpha1 == pytest.approx(bound)
    assert "not reachable under the cost model at any α" in v.verdict
    assert check_speedup(cost, bound * 0.99, 4).kind != "not_reachable"


@pytest.mark.parametrize("alpha,c,gamma", [(0.3, 0.05, 2), (0.62, 0.02, 7), (0.8, 0.1, 4), (0.95, 0.3, 12)])
def test_claim_equal_to_the_prediction_gets_its_alpha_back(alpha, c, gamma):
    claimed = float(speedup_leviathan(alpha, c, gamma))  # Theorem 3.8, independent of predict_row
    got = alpha_needed(LeviathanCost(c), claimed, gamma)
    assert got == pytest.approx(alpha, abs=1e-6)
    v = check_speedup(LeviathanCost(c), claimed, gamma, alpha=alpha)
    assert v.kind == "consistent" and v.alpha_needed == pytest.approx(alpha, abs=1e-6)
    assert v.predicted_at_reference == pytest.approx(claimed)


def test_alpha_needed_is_zero_when_even_no_acceptance_wins_and_on_a_roofline_cost():
    assert alpha_needed(LeviathanCost(0.0), 0.5, 4) == 0.0  # c = 0: α = 0 gives 1.0x already
    cost = roofline_cost(get_pair("gpt2-small-large"), get_hardware("t4"))
    target = speedup_at(cost, 0.7, 4)
    assert alpha_needed(cost, target, 4) == pytest.approx(0.7, abs=1e-6)


def test_stated_alpha_above_need_is_consistent_and_below_needs_alpha():
    cost = LeviathanCost(0.02)
    claimed = float(speedup_leviathan(0.75, 0.02, 7))
    assert check_speedup(cost, claimed, 7, alpha=0.80).kind == "consistent"
    v = check_speedup(cost, claimed, 7, alpha=0.70)
    assert v.kind == "needs_alpha" and "above the source's own α = 0.700" in v.verdict
    assert v.would_have_to_be_true[0].startswith("α ≥ 0.750")


def test_without_stated_alpha_the_typical_range_decides():
    cost = LeviathanCost(0.1)
    low = float(speedup_leviathan(TYPICAL_ALPHA.low - 0.05, 0.1, 4))
    mid = float(speedup_leviathan(0.8, 0.1, 4))
    high = float(speedup_leviathan(0.95, 0.1, 4))
    assert check_speedup(cost, low, 4).kind == "consistent"
    v_mid, v_high = check_speedup(cost, mid, 4), check_speedup(cost, high, 4)
    assert v_mid.kind == v_high.kind == "needs_alpha"
    assert "inside the range typical" in v_mid.verdict and "above the range typical" in v_high.verdict
    assert TYPICAL_ALPHA.source in v_mid.verdict


def test_what_would_have_to_be_true_solves_the_draft_cost_and_baseline():
    cost = LeviathanCost(0.2)
    claimed = float(speedup_leviathan(0.9, 0.05, 4))  # reachable at α = 0.9 only with c = 0.05
    v = check_speedup(cost, claimed, 4)
    assert v.draft_cost_ratio_needed == pytest.approx(0.05, rel=1e-6)
    assert v.baseline_slowdown_needed == pytest.approx(claimed / float(speedup_leviathan(0.9, 0.2, 4)))
    assert speedup_at(DraftScaledCost(cost, 0.25), 0.9, 4) == pytest.approx(claimed)


def test_tau_without_gamma_uses_the_smallest_gamma_that_can_hold_it():
    v = check_speedup(LeviathanCost(0.0), 1.5, None, tau=2.28, gamma_max=8)
    assert v.gamma == 2 and v.alpha_stated == pytest.approx(implied_alpha_from_tau(2.28, 2))
    assert v.predicted_at_reference == pytest.approx(2.28)  # c = 0: speedup = τ
    assert v.kind == "consistent"


def test_unstated_gamma_picks_the_one_needing_least_alpha():
    cost = LeviathanCost(0.05)
    v = check_speedup(cost, 3.0, None, gamma_max=16)
    needs = {g: alpha_needed(cost, 3.0, g) for g in range(1, 17)}
    best = min((g for g in needs if needs[g] is not None), key=lambda g: needs[g])
    assert v.gamma == best and not v.gamma_stated and v.alpha_needed == pytest.approx(needs[best])


def test_curve_spans_alpha_zero_to_one_and_rises():
    v = check_speedup(LeviathanCost(0.1), 2.0, 5)
    alphas = [a for a, _ in v.curve]
    speeds = [s for _, s in v.curve]
    assert alphas[0] == 0.0 and alphas[-1] == 1.0 and speeds == sorted(speeds)
    assert speeds[-1] == pytest.approx(v.bound_at_alpha1)


@pytest.mark.parametrize("kwargs,match", [
    (dict(speedup=0.0, gamma=4), "speedup"), (dict(speedup=math.nan, gamma=4), "speedup"),
    (dict(speedup=math.inf, gamma=4), "speedup"), (dict(speedup=-2.0, gamma=4), "speedup"),
    (dict(speedup=2.0, gamma=0), "gamma"), (dict(speedup=2.0, gamma=GAMMA_LIMIT + 1), "gamma"),
    (dict(speedup=2.0, gamma=4, alpha=1.2), "alpha"), (dict(speedup=2.0, gamma=2, tau=4.0), "tau"),
])
def test_bad_inputs_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        check_speedup(LeviathanCost(0.1), **kwargs)


# -- roofline check ------------------------------------------------------------------------
def test_roofline_check_flags_slow_baselines_and_memory():
    pair, t4 = get_pair("gpt2-small-large"), get_hardware("t4")
    r = check_roofline(pair, t4, 4, 2.5, baseline_ms=156.0, speculative_ms=62.0)
    assert r.baseline_roofline_ms == pytest.approx(roofline_cost(pair, t4).target_step_ms(512))
    assert r.baseline_ratio == pytest.approx(156.0 / r.baseline_roofline_ms) and r.baseline_ratio > 10
    assert r.nearest_hardware == "cpu" and r.fits_memory is True
    assert r.ms_implied_speedup == pytest.approx(156 / 62)
    big = check_roofline(get_pair("llama2-7b-13b"), t4, 4, 2.9, baseline_ms=89.0)
    assert big.fits_memory is False and any("do not fit" in f for f in big.findings)
    assert big.nearest_hardware not in ("t4", "l4")  # only devices the weights fit
    fast = check_roofline(pair, t4, 4, 2.0, baseline_ms=1.0, speculative_ms=0.5)
    assert any("faster than the t4 roofline" in f for f in fast.findings)
    assert any("below the fastest" in f for f in fast.findings)


# -- the claims table --------------------------------------------------------------------------
def test_every_claim_has_a_source_and_a_verification_note():
    assert len(CLAIMS) >= 20 and len({c.claim_id for c in CLAIMS}) == len(CLAIMS)
    for c in CLAIMS:
        assert c.source.strip() and c.quote.strip() and c.assumptions.strip()
        if c.verified:
            assert c.verification.startswith("verified") or c.verification.startswith("checked")
        else:
            assert c.verification.startswith("not verified here")
    with pytest.raises(ValueError, match="source"):
        Claim("x", " ", "q", False, "n", "s", 2.0, 4, "a", cost_ratio=0.1)


def test_the_claims_are_data_read_from_the_toml_file():
    assert CLAIMS_FILE.name == "claims.toml" and CLAIMS == load_claims(CLAIMS_FILE)
    source = (ROOT / "sim" / "claims.py").read_text()
    assert "Leviathan, Kalman" not in source and "Spec-Bench" not in source  # no claim data left in code
    t5 = [c for c in CLAIMS if c.claim_id.startswith("leviathan-")]
    assert len(t5) == 12 and {c.source for c in t5} == {t5[0].source}  # the template's fields, shared


@pytest.mark.slow
def test_no_claim_carries_internal_wording():
    for c in CLAIMS:
        text = " ".join(str(v) for v in check_claim(c).row().values()).lower()
        for needle in ("issue #", "specscope issue", "this session", "stored", "computed here", "searchable"):
            assert needle not in text, (c.claim_id, needle)


_GOOD = """
[templates.t]
source = "a paper"
verified = true
verification = "checked against the paper"

[[claim]]
template = "t"
claim_id = "one"
quote = "2x"
setting = "s"
speedup = 2
assumptions = "a"
cost_ratio = 0.1
"""


@pytest.mark.parametrize("edit,needle", [
    (("speedup = 2", "speedup = \"2\""), "claim 1 (one): field 'speedup' must be float or int, got '2'"),
    (("cost_ratio = 0.1", "cost_ratio = 0.1\ncolour = 1"), "claim 1 (one): unknown field 'colour'; valid: claim_id"),
    (('template = "t"', 'template = "u"'), "unknown template 'u'; valid: t"),
    (("speedup = 2", "speedup = 2\nsource = \"x\""), "field(s) ['source'] set by the claim and by its template"),
    (('quote = "2x"\n', ""), "claim 1 (one): missing field(s) ['quote']"),
    (("verified = true", "verified = 1"), "[templates.t]: field 'verified' must be bool, got 1"),
    (("cost_ratio = 0.1", "cost_ratio = true"), "field 'cost_ratio' must be float or int, got True"),
    (("[[claim]]", "[colours]\n[[claim]]"), "unknown top-level key(s) ['colours']"),
    (("cost_ratio = 0.1", "cost_ratio = 0.1\n[[claim]]\ntemplate = \"t\"\nclaim_id = \"one\"\nquote = \"q\"\n"
      "setting = \"s\"\nspeedup = 2\nassumptions = \"a\"\ncost_ratio = 0.2"), "claim id(s) ['one'] given more than once"),
    (("cost_ratio = 0.1", 'preset = "gpt2-small-large"'), "a preset needs a hardware profile"),
    (("speedup = 2", "speedup = 2 2"), "claims file"),
])
def test_a_bad_claims_file_is_refused_naming_the_claim_and_field(tmp_path, edit, needle):
    path = tmp_path / "claims.toml"
    path.write_text(_GOOD)
    (only,) = load_claims(path)
    assert only.gamma is None and only.source == "a paper" and only.speedup == 2.0
    path.write_text(_GOOD.replace(*edit))
    with pytest.raises(ValueError) as exc:
        load_claims(path)
    assert needle in str(exc.value)


@pytest.mark.slow
def test_leviathan_rows_reproduce_the_papers_expected_column():
    # Table 4 of the paper: Exp = Theorem 3.8 at the row's α, γ, c, printed to one decimal (the α and c it prints
    # are rounded too, so agreement is within a few hundredths), and the measured Emp = the claimed speed
    exp = {"ende-t5-small-t0": 3.2, "ende-t5-base-t0": 3.3, "ende-t5-large-t0": 2.5, "ende-t5-small-t1": 2.3,
           "ende-t5-base-t1": 2.4, "ende-t5-large-t1": 2.0, "cnndm-t5-small-t0": 2.4, "cnndm-t5-base-t0": 2.6,
           "cnndm-t5-large-t0": 2.0, "cnndm-t5-small-t1": 1.9, "cnndm-t5-base-t1": 1.8, "cnndm-t5-large-t1": 1.6}
    checks = {c.claim.claim_id: c for c in check_claims()}
    for cid, e in exp.items():
        v = checks[f"leviathan-{cid}"].verdict
        assert abs(v.predicted_at_reference - e) < 0.07, cid
        assert v.kind == ("consistent" if v.claimed_speedup <= v.predicted_at_reference else "needs_alpha"), cid
    assert checks["leviathan-ende-t5-small-t0"].verdict.kind == "needs_alpha"  # Emp 3.4 > Exp 3.2
    assert checks["leviathan-ende-t5-large-t0"].verdict.kind == "consistent"  # Emp 1.7 < Exp 2.5


@pytest.mark.slow
def test_article_claims_verdicts():
    checks = {c.claim.claim_id: c for c in check_claims()}
    for cid in ("article-llama-7b-13b", "article-1000-tokens"):
        assert checks[cid].verdict.kind == "not_reachable" and checks[cid].claim.verified is False
    gpt2 = checks["article-gpt2-small-large"]
    assert gpt2.verdict.kind == "needs_alpha" and gpt2.verdict.alpha_needed > TYPICAL_ALPHA.high
    assert gpt2.roofline is not None and gpt2.roofline.baseline_ratio > 10


def test_check_claim_row_is_flat_and_json_able():
    row = check_claim(CLAIMS[0]).row()
    json.dumps(row)
    assert {"claim", "source", "status", "verdict", "bound_at_alpha1", "alpha_needed"} <= set(row)
    json.dumps(check_claim(CLAIMS[0]).as_dict())


# -- CLI ---------------------------------------------------------------------------------------
def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sim", "check", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_cli_prints_the_verdict():
    r = _cli("--preset", "gpt2-small-large", "--hardware", "t4", "--gamma", "4", "--speedup", "2.5",
             "--baseline-ms", "156", "--speculative-ms", "62")
    assert r.returncode == 0, r.stderr
    assert "bound at alpha = 1: 2.791x" in r.stdout and "alpha needed: 0.945" in r.stdout
    assert "verdict: needs α ≥ 0.945" in r.stdout and "roofline:" in r.stdout


def test_cli_json_matches_the_function():
    r = _cli("--cost-ratio", "0.02", "--gamma", "7", "--alpha", "0.75", "--speedup", "3.4", "--format", "json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    v = check_speedup(LeviathanCost(0.02), 3.4, 7, alpha=0.75)
    assert d["verdict"]["alpha_needed"] == pytest.approx(v.alpha_needed) and d["verdict"]["kind"] == v.kind


@pytest.mark.slow
def test_cli_claims_table_and_markdown():
    r = _cli("--claims")
    assert r.returncode == 0 and len(r.stdout.strip().splitlines()) == len(CLAIMS) + 1
    m = _cli("--claims", "--format", "markdown")
    rows = [ln for ln in m.stdout.splitlines() if ln.startswith("| ")]
    assert m.returncode == 0 and len(rows) == len(CLAIMS) + 1 and "**(not verified here)**" in m.stdout


@pytest.mark.parametrize("args,needle", [
    (["--preset", "nope", "--speedup", "2"], "valid: gpt2-small-large"),
    (["--preset", "gpt2-small-large", "--hardware", "v100", "--speedup", "2"], "valid: h100-sxm"),
    (["--preset", "gpt2-small-large", "--speedup", "0"], "argument --speedup: '0' is out of range; valid: a finite number > 0"),
    (["--preset", "gpt2-small-large", "--speedup", "-1"], "argument --speedup: '-1' is out of range"),
    (["--preset", "gpt2-small-large", "--speedup", "nan"], "argument --speedup: 'nan' is not a finite number"),
    (["--preset", "gpt2-small-large", "--speedup", "inf"], "argument --speedup: 'inf' is not a finite number"),
    (["--preset", "gpt2-small-large", "--speedup", "2", "--gamma", "0"], "--gamma: '0' is out of range; valid: an integer in 1..64"),
    (["--preset", "gpt2-small-large", "--speedup", "2", "--gamma", "65"], "--gamma: '65' is out of range; valid: an integer in 1..64"),
    (["--preset", "gpt2-small-large", "--speedup", "two"], "--speedup"),
    (["--preset", "gpt2-small-large"], "--speedup is required"),
    (["--speedup", "2"], "name the pair"),
    (["--preset", "gpt2-small-large", "--speedup", "2", "--alpha", "1.5"], "--alpha: '1.5' is out of range; valid: a finite number in [0, 1]"),
    (["--preset", "gpt2-small-large", "--speedup", "2", "--format", "xml"], "valid: table, json, markdown"),
    # issue 32: a ZeroDivisionError, ignored flags, NaN context, an ignored --gamma-max
    (["--cost-ratio", "1e308"], "argument --cost-ratio: '1e308' is out of range; valid: a finite number in [0, 100]"),
    (["--claims", "--speedup", "3", "--preset", "nosuch"], "--claims checks the built-in table and would ignore "
                                                           "--speedup, --preset: drop them"),
    (["--claims", "--context-tokens", "512"], "would ignore --context-tokens: drop it"),
    (["--preset", "gpt2-small-large", "--speedup", "2", "--context-tokens", "nan"],
     "argument --context-tokens: 'nan' is not a finite number"),
    (["--preset", "gpt2-small-large", "--speedup", "2", "--gamma", "4", "--gamma-max", "8"],
     "argument --gamma-max: not allowed with argument --gamma"),
    (["--preset", "gpt2-small-large", "--speedup", "2", "--bytes-per-param", "1e9"], "--bytes-per-param: '1e9'"),
    (["--preset", "gpt2-small-large", "--speedup", "2", "--bytes-per-param", "1e-300"], "[0.125, 8]"),
    (["--preset", "gpt2-small-large", "--speedup", "2", "--context-tokens", "0"], "--context-tokens: '0'"),
])
def test_cli_bad_input_one_line_exit_2(args, needle):
    r = _cli(*args)
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr and "usage:" not in r.stderr


def test_a_cost_ratio_whose_speedup_rounds_to_zero_gives_a_verdict():
    # the library behind the CLI bound: 1e308 once divided by a predicted speedup of 0.0
    v = check_speedup(LeviathanCost(1e308), 2.0, 4)
    assert v.kind == "not_reachable" and v.bound_at_alpha1 < 1e-300


def test_check_prices_any_model_through_the_seam_and_names_the_source():
    from sim.check_cli import main as check_main

    args = ["--speedup", "2", "--preset", "eagle3-llama3.1-8b", "--hardware", "b200", "--cost-source", "roofline",
            "--gamma", "3", "--alpha", "0.8", "--format", "json"]
    out = subprocess.run([sys.executable, "-m", "sim", "check", *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["cost_model"]["kind"] == "step" and doc["cost_model"]["target"]["source"] == "roofline"
    assert any(line.startswith("cost source: target roofline") for line in doc["cost_source"])
    assert check_main(["--speedup", "2", "--preset", "eagle3-llama3.1-8b", "--dtype", "fp8",
                       "--bytes-per-param", "1"]) == 2
