"""Tests of calibrate: fits recover the parameters of synthetic runs; hold-out; files; CLI.

The CLI runs in this process (:func:`cli_inprocess.run_module`); ``python -m calibrate`` as a process is
tested in test_sim_bad_input.py and test_specscope_cli.py. The toy-engine run the noise-floor tests
calibrate is measured once per module and copied for each test that edits it.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibrate.calibration import calibrate
from tests.support.cli_inprocess import run_module
from calibrate.dataset import load_runs
from calibrate.folds import holdout_folds
from calibrate.fit_acceptance import fit_acceptance, interpolate_models, trace_model, wilson_ci
from calibrate.fit_cost import fit_draft, fit_target, ols
from calibrate.outputs import write_outputs
from sim.acceptance import IIDAcceptance, PerPositionAcceptance, acceptance_from_dict
from sim.analytic import predict_row
from sim.cost import TabulatedCost, load_cost_model
from tests.support.fixtures_runs import SyntheticTruth, make_run
from toolkit.jsonio import clean_json

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("runs") / "synthetic"
    make_run(p, seed=11)
    return p


@pytest.fixture(scope="module")
def calibrated(run_dir, tmp_path_factory):
    res = calibrate([run_dir], holdout="gamma", seed=0)
    out = tmp_path_factory.mktemp("cal")
    summary = write_outputs(res, out)
    return res, out, summary


# -- cost fits -------------------------------------------------------------------------
def test_ols_standard_errors_match_textbook():
    rng = np.random.default_rng(0)
    x = np.column_stack([np.ones(200), rng.uniform(0, 10, 200)])
    y = 3.0 + 0.5 * x[:, 1] + rng.normal(0, 0.2, 200)
    fit = ols(x, y, ["a", "b"], ["ms", "ms"], "y = a + b x")
    assert abs(fit.value("a") - 3.0) < 4 * fit.params[0].stderr
    assert abs(fit.value("b") - 0.5) < 4 * fit.params[1].stderr
    # textbook slope SE: sigma / sqrt(sum((x - mean)^2))
    expected = 0.2 / math.sqrt(((x[:, 1] - x[:, 1].mean()) ** 2).sum())
    assert fit.params[1].stderr == pytest.approx(expected, rel=0.25)
    assert fit.residual_rms_ms == pytest.approx(0.2, rel=0.2)
    with pytest.raises(ValueError, match="2 points for 3 parameters"):
        ols(np.ones((2, 3)), np.ones(2), ["a", "b", "c"], ["", "", ""], "f")


def test_fit_target_recovers_non_linear_table_and_slope(run_dir):
    truth = SyntheticTruth()
    ct = pd.read_csv(run_dir / "cost_target.csv")
    shared, _ = fit_target(ct, slopes="shared")
    slope = shared.value("target_ms_per_context_token")
    assert slope == pytest.approx(truth.target_ms_per_context_token, abs=4 * shared.params[-1].stderr + 1e-3)
    fit, ctx_ref = fit_target(ct, slopes="per_n")  # one slope per n: each near the (shared) truth, within its SE
    for n in (1, 4, 16):
        p = next(q for q in fit.params if q.name == f"target_ms_per_context_token_n{n}")
        assert p.value == pytest.approx(truth.target_ms_per_context_token, abs=4 * p.stderr + 2e-3)
    for n in (1, 2, 3, 4, 8, 16):
        assert fit.value(f"verify_ms_n{n}") == pytest.approx(truth.verify_ms(n, ctx_ref), rel=0.03)
    # the CPU-like bump: 2-3 tokens cost more than 4 — kept, not smoothed away
    assert fit.value("verify_ms_n3") > fit.value("verify_ms_n4")
    assert all(p.stderr > 0 for p in fit.params)


def test_fit_target_linear_slopes_recover_a_slope_growing_with_n():
    """The default slope model s_n = s_0 + s_1 n: recovered from noisy timings, and per-n slopes follow from it."""
    from calibrate.fit_cost import SLOPE_BASE, SLOPE_PER_TOKEN, target_curve

    rng = np.random.default_rng(7)
    s0, s1 = 0.02, 0.03  # ms per context token: KV read, then per query token
    base = {1: 50.0, 2: 60.0, 3: 62.0, 4: 100.0, 5: 104.0, 6: 110.0}  # a CPU-like bump kept as it is
    rows = [{"n_tokens": n, "context_tokens": c, "repeat": r,
             "ms": (b + (s0 + s1 * n) * (c - 160)) * (1 + rng.normal(0, 0.05))}
            for n, b in base.items() for c in (64, 160, 256) for r in range(20)]
    ct = pd.DataFrame(rows)
    fit, ctx_ref = fit_target(ct)
    assert ctx_ref == pytest.approx(160)
    for name, truth in ((SLOPE_BASE, s0), (SLOPE_PER_TOKEN, s1)):
        p = next(q for q in fit.params if q.name == name)
        assert p.value == pytest.approx(truth, abs=4 * p.stderr) and p.stderr < 0.02
    for n, b in base.items():
        assert fit.value(f"verify_ms_n{n}") == pytest.approx(b, rel=0.03)
    tc = target_curve(ct)
    assert tc.slope_ms_per_token == 0.0
    for n in base:  # the per-n slopes the simulator reads
        assert tc.slopes_by_tokens[n] == pytest.approx(s0 + s1 * n, abs=0.02)
    per_n, _ = fit_target(ct, slopes="per_n")
    assert len(per_n.params) == 2 * len(base) and len(fit.params) == len(base) + 2
    with pytest.raises(ValueError, match="slopes 'cubic': unknown; valid: linear, per_n, shared"):
        fit_target(ct, slopes="cubic")


def test_fit_draft_recovers_step_context_and_head_k_terms(tmp_path):
    truth = SyntheticTruth()
    make_run(tmp_path / "k", seed=3, head_ks=(1024, 4096, 16384), gammas=(2, 4))
    cd = pd.read_csv(tmp_path / "k" / "cost_draft.csv")
    fit, k_ref = fit_draft(cd, ctx_ref=100.0)
    assert k_ref == pytest.approx(np.mean([1024, 4096, 16384]))
    assert fit.value("draft_ms_per_head_k") == pytest.approx(truth.draft_ms_per_head_k, rel=0.15)
    assert fit.value("draft_step_ms") == pytest.approx(truth.draft_ms("small", 100.0, k_ref), rel=0.03)
    assert fit.value("draft_ms_per_context_token") == pytest.approx(truth.draft_ms_per_context_token, abs=0.002)


# -- acceptance fits -----------------------------------------------------------------
def _rounds_from(model, gammas, n_per_gamma, seed):
    rng = np.random.default_rng(seed)
    rows = [{"gamma": g, "accepted": model.sample_accepted(g, rng)} for g in gammas for _ in range(n_per_gamma)]
    return pd.DataFrame(rows)


def test_identities_round_trip():
    from calibrate.groups import AcceptanceGroup
    from calibrate.fit_cost import ParamName

    for text in ("draft=int8|temp=0|domain=code", "draft=bf16+lowrank|temp=0.7|domain=docs|head_k=1024"):
        g = AcceptanceGroup.parse(text)
        assert g.to_str() == text and AcceptanceGroup.parse(g.to_str()) == g
    assert AcceptanceGroup("ngram:3", 0.0, "code", 64).file_name("-trace") == "acceptance-ngram_3-code-t0-k64-trace.json"
    for text in ("verify_ms_n4", "target_ms_per_context_token_n12", "target_ms_per_context_token", "ttft_ms_0"):
        assert ParamName.parse(text).to_str() == text
    assert ParamName.parse("verify_ms_n4") == ParamName("verify_ms", 4)
    assert ParamName.parse("ttft_ms_0").n_tokens is None


def test_iid_alpha_recovered_within_its_standard_error():
    rounds = _rounds_from(IIDAcceptance(0.7), (1, 2, 4, 8), 1500, seed=5)
    fit = fit_acceptance(rounds)
    assert abs(fit.alpha_iid - 0.7) < 3.5 * fit.alpha_iid_stderr
    assert fit.chosen == "iid"
    pp = fit.per_position
    assert ((pp["ci_low"] <= 0.7 + 0.05) & (pp["ci_high"] >= 0.7 - 0.05)).all()


def test_geometric_decay_is_chosen_and_recovered():
    truth = [0.9 * 0.85 ** i for i in range(8)]
    rounds = _rounds_from(PerPositionAcceptance(tuple(truth)), (2, 4, 8), 3000, seed=7)
    fit = fit_acceptance(rounds)
    assert fit.decay_family == "geometric"
    assert fit.chosen in ("geometric", "power_law")
    geo = fit.family("geometric")
    assert geo.params["a"] == pytest.approx(0.9, abs=0.03)
    assert geo.params["r"] == pytest.approx(0.85, abs=0.03)
    assert fit.family("iid").bic > geo.bic
    desc = fit.describe_model()
    assert acceptance_from_dict(desc).expected_tokens(4) == pytest.approx(
        PerPositionAcceptance(tuple(truth)).expected_tokens(4), rel=0.05)


def test_wilson_interval_properties():
    lo, hi = wilson_ci(np.array([0, 5, 10]), np.array([10, 10, 10]))
    assert lo[0] == pytest.approx(0.0, abs=1e-12) and hi[0] > 0
    assert lo[1] < 0.5 < hi[1]
    assert hi[2] == pytest.approx(1.0) and lo[2] < 1
    lo0, _ = wilson_ci(np.array([0]), np.array([0]))
    assert math.isnan(lo0[0])


def test_interpolate_models_between_neighbours():
    m = interpolate_models([(0.0, IIDAcceptance(0.5)), (1.0, IIDAcceptance(0.7))], 0.5)
    assert m.conditional(3) == pytest.approx([0.6, 0.6, 0.6])
    assert interpolate_models([(0.0, IIDAcceptance(0.5))], 3.0).conditional(1)[0] == pytest.approx(0.5)


def test_trace_model_deduplicates_prompts(run_dir):
    traces = pd.read_csv(run_dir / "traces.csv")
    t = trace_model(traces[traces["draft"] == "small"])
    # 2 domains × 3 prompts, every γ cell records the same prompts
    assert len(t.sequences) == traces[traces["draft"] == "small"]["prompt_id"].nunique()
    assert trace_model(traces.iloc[0:0]) is None


# -- hold-out -------------------------------------------------------------------------
def test_gamma_folds_leave_each_gamma_out_once(run_dir):
    data = load_runs([run_dir])
    folds = holdout_folds(data.cells, "gamma")
    assert [f for f, _ in folds] == [f"gamma_policy=fixed:{g}" for g in (1, 2, 4, 6)]
    covered = sum(m.astype(int) for _, m in folds)
    assert (covered == 1).all()
    with pytest.raises(ValueError, match="need at least 2 distinct head_k"):
        holdout_folds(data.cells, "k")
    with pytest.raises(ValueError, match="valid: auto, gamma, domain, k, none"):
        holdout_folds(data.cells, "prompt")


@pytest.mark.slow
def test_calibration_recovers_measured_speedups_on_held_out_gamma(calibrated):
    res, out, summary = calibrated
    held = res.held_out
    assert set(held["fold"]) == {f"gamma_policy=fixed:{g}" for g in (1, 2, 4, 6)}
    # every held-out cell is predicted from a fit that did not see its γ
    for fold in res.folds:
        g = fold["fold"].split("fixed:")[1]
        assert all(f"fixed:{g}|" not in k for k in fold["train_cells"])
    for method in ("closed_form", "trace", "event_sim"):
        m = res.mape_held_out[method]
        assert m["n_cells"] == 16
        assert m["speedup_mape_pct"] < 5.0, (method, m)
        assert m["tokens_per_s_mape_pct"] < 5.0, (method, m)
    assert summary["mape_held_out"]["closed_form"]["speedup_mape_pct"] == pytest.approx(
        held[held["method"] == "closed_form"]["ape_speedup_pct"].mean())


def test_cell_weighted_ratio_trusts_the_steady_cell():
    """Two cells' in-loop ratios, 1.0 (steady generations) and 1.5 (generations that disagree): combined by
    inverse variance the steady cell dominates; pooled they would meet half-way."""
    import pandas as pd

    from calibrate.fit_cost import _ratio_param, cell_weighted_ratio

    rng = np.random.default_rng(0)
    rows, measured, modelled = [], [], []
    for cell, ratio, noise in (("steady", 1.0, 0.01), ("busy", 1.5, 0.4)):
        for rep in range(6):
            for _ in range(10):  # rounds of one generation
                rows.append({"cell_id": cell, "prompt_id": "p", "repeat": rep})
                modelled.append(50.0)
                measured.append(50.0 * ratio * (1 + noise * rng.standard_normal()))
    rows = pd.DataFrame(rows)
    w = cell_weighted_ratio("verify_scale", np.array(measured), np.array(modelled), rows)
    pooled = _ratio_param("verify_scale", np.array(measured), np.array(modelled))
    assert w.value == pytest.approx(1.0, abs=0.02) and pooled.value == pytest.approx(1.25, abs=0.05)
    assert 0 < w.stderr < 0.01
    one = cell_weighted_ratio("verify_scale", np.array(measured[:60]), np.array(modelled[:60]), rows.iloc[:60])
    assert one == _ratio_param("verify_scale", np.array(measured[:60]), np.array(modelled[:60]))  # one cell


def test_fitted_overhead_and_scales(calibrated):
    res, _, _ = calibrated
    fit = res.models.cost[("synthetic", "small", None)]
    assert fit.overhead.value == pytest.approx(SyntheticTruth().overhead_ms, rel=0.02)
    for s in fit.scales:  # micro-benchmarks and loop come from the same truth: scales ≈ 1
        assert s.value == pytest.approx(1.0, abs=0.03), s


def test_written_files_are_read_by_sim(calibrated):
    res, out, summary = calibrated
    assert summary["cost_model_files"] == {"synthetic/small": "cost_model-small.json",
                                           "synthetic/tiny": "cost_model-tiny.json"}
    cost = load_cost_model(out / "cost_model-small.json")
    assert isinstance(cost, TabulatedCost)
    # as written: strict JSON, an unknown standard error null rather than NaN
    assert cost.describe() == clean_json(res.models.cost[("synthetic", "small", None)].model.describe())
    acc = acceptance_from_dict(json.loads((out / "acceptance-small.json").read_text()))
    row = predict_row(acc, cost, 4, 80.0)
    assert 0.5 < row.speedup < 3.0
    doc = json.loads((out / "calibration.json").read_text())
    assert doc["holdout"]["mode"] == "gamma"
    assert "shared" in doc["holdout"]["explanation"]
    assert {"closed_form", "trace", "event_sim"} <= set(doc["mape"]["held_out"])
    for name in ("predictions.csv", "cost_params.csv", "acceptance_per_position.csv",
                 "acceptance_families.csv", "speedup_curves.csv", "acceptance-small-code-t0.json"):
        assert (out / name).exists(), name
    params = pd.read_csv(out / "cost_params.csv")
    assert {"name", "value", "stderr", "unit"} <= set(params.columns)
    curves = pd.read_csv(out / "speedup_curves.csv")
    assert sorted(curves["gamma"].unique()) == list(range(1, 11))


def test_holdout_k_interpolates_acceptance(tmp_path):
    make_run(tmp_path / "k", seed=4, head_ks=(1024, 4096, 16384), gammas=(2, 4), prompts_per_domain=2)
    res = calibrate([tmp_path / "k"], holdout="k")
    held = res.held_out
    mid = held[(held["head_k"] == 4096) & (held["method"] == "closed_form")]
    assert len(mid) == 2 and mid["predicted_speedup"].notna().all()
    # K=4096 is interpolated between 1024 and 16384 (2 prompts each: acceptance is noisy)
    assert mid["ape_speedup_pct"].max() < 25.0
    assert held[held["method"] != "trace"]["predicted_speedup"].notna().all()
    assert held[held["method"] == "trace"]["predicted_speedup"].isna().all()  # no traces for an unseen K


# -- CLI ------------------------------------------------------------------------------
def _cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``python -m calibrate ARGS`` (its ``main``, in this process)."""
    return run_module("calibrate", args, cwd=cwd)


def test_cli_writes_outputs_and_ends_with_json(run_dir, tmp_path):
    r = _cli(str(run_dir), "--holdout", "none", "--out", str(tmp_path / "c"))
    assert r.returncode == 0, r.stderr
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert last["calibration"] == str(tmp_path / "c" / "calibration.json")
    assert last["mape_held_out"] == {}
    assert "MAPE in-sample" in r.stdout
    assert (tmp_path / "c" / "cost_model-tiny.json").exists()


@pytest.mark.parametrize("args, needle", [
    (["{run}", "--holdout", "weekday"], "unknown --holdout 'weekday'; valid: auto, gamma, domain, k, none"),
    (["{tmp}/missing"], "run directory not found"),
    (["{tmp}"], "is not a run directory (no run.json)"),
    (["{run}", "--holdout", "k"], "need at least 2 distinct head_k"),
])
def test_cli_bad_input_is_one_line_error(run_dir, tmp_path, args, needle):
    r = _cli(*[a.format(run=run_dir, tmp=tmp_path) for a in args])
    assert r.returncode == 2
    assert needle in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


# -- the default hold-out adapts to what the runs measured ------------------------------------------
def _one_gamma_run(path: Path, domains: tuple[str, ...]) -> Path:
    make_run(path, seed=3, drafts=("small",), gammas=(4,), domains=domains, prompts_per_domain=2,
             max_new_tokens=40)
    return path


def test_one_gamma_run_holds_out_by_domain_by_default_and_says_so(tmp_path):
    run = _one_gamma_run(tmp_path / "g4", ("code", "chat"))
    r = _cli(str(run), "--out", str(tmp_path / "cal"))
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith("hold-out: domain, not gamma (the run has one γ policy, fixed:4)"), first
    doc = json.loads((tmp_path / "cal" / "calibration.json").read_text())
    assert doc["holdout"]["mode"] == "domain" and doc["holdout"]["note"] == first
    assert [f["fold"] for f in doc["holdout"]["folds"]] == ["domain=chat", "domain=code"]
    assert doc["mape"]["held_out"]["closed_form"]["n_cells"] == 2


def test_one_gamma_one_domain_run_is_calibrated_in_sample_with_a_note(tmp_path):
    run = _one_gamma_run(tmp_path / "g4", ("code",))
    res = calibrate([run])
    assert res.holdout == "none" and res.held_out.empty and res.mape_in_sample
    assert res.holdout_choice.note.startswith("hold-out: none (one γ policy, fixed:4, one domain, code")
    assert "in-sample only" in res.holdout_choice.note


def test_an_explicit_gamma_holdout_on_a_one_gamma_run_names_the_fix(tmp_path):
    run = _one_gamma_run(tmp_path / "g4", ("code", "chat"))
    r = _cli(str(run), "--holdout", "gamma", "--out", str(tmp_path / "cal"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "found 1 (fixed:4); use --holdout domain (2 domains) or --holdout none" in r.stderr
    assert "leave --holdout out" in r.stderr


@pytest.mark.slow
def test_the_default_on_a_two_gamma_run_is_the_gamma_holdout_unchanged(run_dir, tmp_path):
    default = _cli(str(run_dir), "--out", str(tmp_path / "auto"))
    explicit = _cli(str(run_dir), "--holdout", "gamma", "--out", str(tmp_path / "gamma"))
    assert default.returncode == explicit.returncode == 0, default.stderr + explicit.stderr
    assert default.stdout.splitlines()[0] == "hold-out: gamma (the default: each of the 4 γ policies predicted from " \
                                             "the others)"
    docs = [json.loads((tmp_path / d / "calibration.json").read_text()) for d in ("auto", "gamma")]
    for d in docs:
        d.pop("created_utc")
    assert docs[0] == docs[1] and "note" not in docs[0]["holdout"]


# -- lookup drafts (propose nothing at some positions) -----------------------------------------
def test_lookup_draft_held_out_gamma_predicted_from_proposal_runs(tmp_path):
    """A draft that proposes at only 40% of positions: the run-trace replay predicts held-out γ
    within the timing noise; the fitted mixture knows p_propose; files replay in `python -m sim`."""
    from sim.acceptance import ProposalAcceptance, RunTraceAcceptance

    truth = SyntheticTruth(propose_prob={"tiny": 0.4}, noise_rel=0.02)
    make_run(tmp_path / "lk", truth, seed=5, drafts=("tiny",), gammas=(1, 2, 4, 8), domains=("code",),
             prompts_per_domain=4, max_new_tokens=80)
    res = calibrate([tmp_path / "lk"], holdout="gamma", seed=0)
    fit = next(iter(res.models.acceptance.values()))
    assert 0.2 < fit.p_propose < 0.7
    assert isinstance(fit.model(), ProposalAcceptance)
    # the inner α is the acceptance *given* a proposal: near the truth, not dragged down by empty rounds
    assert fit.alpha_iid == pytest.approx(truth.alpha[("tiny", "code")], abs=0.08)
    held = res.held_out
    tr = held[held["method"] == "trace"]
    assert len(tr) == 4 and tr["ape_speedup_pct"].max() < 3.0, tr[["gamma", "ape_speedup_pct"]]
    out = tmp_path / "cal"
    summary = write_outputs(res, out)
    trace_files = sorted(out.glob("acceptance-*-trace.json"))
    assert len(trace_files) == 1
    model = acceptance_from_dict(json.loads(trace_files[0].read_text()))
    assert isinstance(model, RunTraceAcceptance)
    cost_file = out / next(iter(summary["cost_model_files"].values()))
    r = run_module("sim", ["--cost-model", str(cost_file), "--acceptance", str(trace_files[0]), "--gamma-max", "8",
                           "--context-tokens", "80", "--format", "json"])
    assert r.returncode == 0, r.stderr
    rows = {row["gamma"]: row for row in json.loads(r.stdout)["rows"]}
    cost = load_cost_model(cost_file)
    for g in (1, 2, 4, 8):  # the CLI replays the file's trace with the file's costs
        assert rows[g]["speedup"] == pytest.approx(predict_row(model, cost, g, 80.0).speedup, rel=1e-9)
    r = run_module("sim", ["--cost-model", str(cost_file), "--acceptance", str(trace_files[0]), "--gamma-max", "20"])
    assert r.returncode == 2 and "gamma=17" in r.stderr and "Traceback" not in r.stderr


# -- against the noise floor (schema-2 runs from the toy engine) ------------------------------------
@pytest.fixture(scope="module")
def toy_run(tmp_path_factory) -> Path:
    """A run of the toy engine (schema 2: repeats, CIs, cost curves), measured once for the module."""
    from tests.support.fake_engine import ToyEngine
    from measure.sweep import SweepConfig, run_sweep

    # the toy's millisecond timings are noise: no cell is flagged unless a test marks it (_mark_unstable)
    cfg = SweepConfig(target="toy", drafts=("ngram:2",), gammas=("fixed:2", "fixed:3"), domains=("code", "docs"),
                      prompts_per_domain=2, max_new_tokens=12, repeats=2, cost_contexts=(8, 32), cost_max_tokens=4,
                      cost_repeats=2, device="cpu", cv_threshold=10.0, drift_threshold=10.0)
    return run_sweep(cfg, tmp_path_factory.mktemp("toy") / "r", engine=ToyEngine(), show_bar=False).path


def _toy_run(toy_run: Path, path: Path) -> Path:
    """A copy of the module's toy run at ``path``, for a test to edit."""
    shutil.copytree(toy_run, path)
    return path


@pytest.mark.slow
def test_predictions_are_judged_against_the_measured_ci(toy_run, tmp_path):
    from calibrate.calibration import calibrate as run_calibration

    _toy_run(toy_run, tmp_path / "r")
    res = run_calibration([tmp_path / "r"], holdout="gamma")
    held = res.held_out
    assert {"measured_speedup_lo", "measured_speedup_hi", "inside_ci"} <= set(held.columns)
    for method, v in res.mape_held_out.items():
        assert v["n_with_ci"] == v["n_cells"] and 0 <= v["n_inside_ci"] <= v["n_with_ci"]
        known = held[(held["method"] == method) & held["inside_ci"].notna()]
        assert v["n_inside_ci"] == int(known["inside_ci"].astype(bool).sum())


def _mark_unstable(run_dir, pick, reason: str) -> str:
    """Flag the first cell of ``run_dir/cells.csv`` that ``pick(row)`` accepts as unstable; its cell id."""
    import csv

    f = run_dir / "cells.csv"
    rows = list(csv.DictReader(f.open()))
    i = next(j for j, r in enumerate(rows) if pick(r))
    rows[i]["unstable"], rows[i]["unstable_reason"] = "true", reason
    with f.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return rows[i]["cell_id"]


def test_unstable_cells_are_weighted_in_the_cost_fit_left_out_of_prefill_and_reported_apart(toy_run, tmp_path):
    from calibrate.calibration import calibrate as run_calibration

    _toy_run(toy_run, tmp_path / "r")
    cell_id = _mark_unstable(tmp_path / "r", lambda r: True, "baseline varied 40% (threshold 10%)")
    res = run_calibration([tmp_path / "r"], holdout="gamma")
    bad = f"r/{cell_id}"
    assert res.unstable_cells == (bad,)
    trained = [fold for fold in res.folds if bad not in fold["test_cells"]]
    assert trained and all(bad not in fold["train_cells"] and bad in fold["cost_train_cells"] for fold in trained)
    assert res.unstable_held_out and all(v["n_cells"] <= 1 for v in res.unstable_held_out.values())
    assert all(v["n_cells"] <= 3 for v in res.mape_held_out.values())  # 4 cells, the unstable one left out


def test_a_fold_without_a_stable_training_cell_fits_its_prefill_on_the_unstable_ones(toy_run, tmp_path):
    from calibrate.calibration import calibrate as run_calibration

    _toy_run(toy_run, tmp_path / "r")
    for domain in ("code", "docs"):  # every γ = 2 cell: the γ = 3 fold has no stable training cell
        _mark_unstable(tmp_path / "r", lambda r, d=domain: r["gamma_policy"] == "fixed:2" and r["domain"] == d,
                       "baseline varied 40% (threshold 10%)")
    res = run_calibration([tmp_path / "r"], holdout="gamma")
    (fold,) = [fo for fo in res.folds if fo["fold"] == "gamma_policy=fixed:3"]
    assert any("no stable training cell" in n for n in fold["notes"])
    assert fold["train_cells"] == fold["cost_train_cells"] and len(fold["train_cells"]) == 2
    held = res.held_out[res.held_out["gamma_policy"] == "fixed:3"]
    assert np.isfinite(held["predicted_speedup"]).all()


def test_an_unstable_cell_keeps_its_acceptance_in_the_fits(toy_run, tmp_path):
    """Timing noise does not change which tokens were accepted: an unstable training cell is left out of
    the cost fits only, and the held-out cell of its domain still gets that domain's acceptance and trace
    (not a pool over the other domains)."""
    from calibrate.calibration import calibrate as run_calibration

    _toy_run(toy_run, tmp_path / "r")
    cell_id = _mark_unstable(tmp_path / "r", lambda r: r["gamma_policy"] == "fixed:2" and r["domain"] == "code",
                             "baseline drifted 30% from start to end (threshold 10%)")
    res = run_calibration([tmp_path / "r"], holdout="gamma")
    bad = f"r/{cell_id}"
    (fold,) = [fo for fo in res.folds if fo["fold"] == "gamma_policy=fixed:3"]
    assert bad not in fold["train_cells"] and bad in fold["acceptance_train_cells"]
    held = res.held_out[(res.held_out["gamma_policy"] == "fixed:3") & (res.held_out["domain"] == "code")]
    cf = held[held["method"] == "closed_form"].iloc[0]
    assert cf["note"].startswith("fitted on") and "domain=code" in cf["note"], cf["note"]
    assert np.isfinite(held[held["method"] == "trace"]["predicted_speedup"]).all()


def test_incomplete_runs_are_refused_and_duplicates_counted_once(toy_run, tmp_path):
    import json

    from calibrate.dataset import load_runs

    _toy_run(toy_run, tmp_path / "r")
    data = load_runs([tmp_path / "r", tmp_path / "r"])
    assert len(data.runs) == 1 and "given twice" in data.notes[0]
    meta = tmp_path / "r" / "run.json"
    doc = json.loads(meta.read_text())
    meta.write_text(json.dumps({**doc, "status": "running", "pid": 2**22 + 12345}))
    with pytest.raises(ValueError, match=r"run is interrupted \(its process \(pid \d+\) is gone\), not complete"):
        load_runs([tmp_path / "r"])
    assert "--allow-incomplete" in load_runs([tmp_path / "r"], allow_incomplete=True).notes[0]
    p = _cli(str(tmp_path / "r"), "--out", str(tmp_path / "c"))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "--allow-incomplete" in p.stderr


def test_run_without_generations_is_refused_in_one_line(tmp_path):
    """A committed head sweep written before generations.csv existed: one line, not a KeyError."""
    import shutil

    run = tmp_path / "old-head-sweep"
    shutil.copytree(ROOT / "results" / "cpu-smollm2-head-sweep", run)
    assert not (run / "generations.csv").exists()
    r = _cli(str(run), "--holdout", "k", "--out", str(tmp_path / "cal"))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "no generations.csv" in lines[0] and str(run) in lines[0]
    assert "Traceback" not in r.stderr and not (tmp_path / "cal" / "calibration.json").exists()


def test_every_cell_unstable_fits_on_all_of_them_with_a_note(toy_run, tmp_path, monkeypatch):
    """A busy machine touches every interleaved cell: calibrate still fits (on all of them) and says so."""
    from calibrate import calibration

    real = calibration.load_runs

    def all_unstable(*a, **kw):
        data = real(*a, **kw)
        data.cells["unstable"] = True
        return data

    run = _toy_run(toy_run, tmp_path / "r")
    monkeypatch.setattr(calibration, "load_runs", all_unstable)
    res = calibration.calibrate([run])
    assert any("every cell is flagged unstable" in n for n in res.data.notes)
    assert len(res.unstable_cells) == len(res.data.cells) and res.unstable_held_out
