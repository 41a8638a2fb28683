"""calibrate serve: the fits recover a known server, held-out loads are predicted, advice has low regret."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibrate.advice import AdviceRow, ranges, trtllm_config, vllm_config
from calibrate.serve import (
    calibrate_serve,
    default_split,
    fit_acceptance,
    fit_serve_model,
    fit_step_cost,
    load_serve,
    simulate_counters,
)
from measure.serve.units import LoadSpec
from sim.acceptance import IIDAcceptance, PerPositionAcceptance, ProposalAcceptance
from sim.serving import LinearStepCost
from tests.support.serve_runs import TRUE_COST, TRUE_OVERHEAD_MS, make_serve_run

ROOT = Path(__file__).resolve().parents[2]
TRUE_ACC = {k: ProposalAcceptance(0.55, PerPositionAcceptance((0.8, 0.7, 0.6, 0.55))) for k in (2, 4, 8)}
LOADS = [LoadSpec(concurrency=c) for c in (1, 2, 4)] + [LoadSpec(rate_per_s=4.0)]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return make_serve_run(tmp_path_factory.mktemp("serve") / "run", TRUE_ACC, LOADS)


@pytest.fixture(scope="module")
def cal(run_dir):
    data = load_serve(run_dir)
    return data, calibrate_serve(data, default_split(data.units), seeds=4)


def test_step_cost_fit_recovers_the_server(run_dir):
    fit = fit_step_cost(load_serve(run_dir).steps)
    c = fit.cost
    assert c.base_ms == pytest.approx(TRUE_COST.base_ms, rel=0.15)
    assert c.per_token_ms == pytest.approx(TRUE_COST.per_token_ms, rel=0.1)
    assert fit.request_overhead_ms == pytest.approx(TRUE_OVERHEAD_MS, abs=2.0)
    assert fit.median_abs_residual_pct < 3.0


def test_step_rows_behind_too_few_steps_are_left_out(run_dir):
    # two slots' tokens that arrive apart look like a one- or two-step group with a wild duration
    steps = load_serve(run_dir).steps
    gen = steps[steps["prompt_tokens"].isna() & steps["step_ms"].notna()]
    wild = gen.head(4).assign(n_steps=2, step_ms=gen["step_ms"].max() * 50)
    fit = fit_step_cost(pd.concat([steps, wild], ignore_index=True))
    assert fit.cost.base_ms == pytest.approx(TRUE_COST.base_ms, rel=0.15)
    assert fit.cost.per_token_ms == pytest.approx(TRUE_COST.per_token_ms, rel=0.1)


def test_the_request_overhead_is_measured_apart_from_the_servers_prompt_time(run_dir):
    # llama-server's timings.prompt_ms is its own prompt time; TTFT - prompt_ms is all the client waits beyond it.
    # A server whose prompt step has a fixed 30 ms more than the decode-step fit: from TTFTs alone that 30 ms
    # looks like request overhead (time the server is free), which over-states its capacity under load
    steps = load_serve(run_dir).steps.copy()
    first = steps["prompt_tokens"].notna()
    server = steps.loc[first, "ttft_ms"] - TRUE_OVERHEAD_MS + 30.0
    steps.loc[first, "ttft_ms"] = server + TRUE_OVERHEAD_MS
    reqs = pd.DataFrame({"cell_id": steps.loc[first, "cell_id"], "prompt_tokens": steps.loc[first, "prompt_tokens"],
                         "ttft_ms": steps.loc[first, "ttft_ms"], "prompt_ms": server, "error": None})
    assert fit_step_cost(steps).request_overhead_ms > TRUE_OVERHEAD_MS + 20  # TTFTs alone: taken as overhead
    fit = fit_step_cost(steps, reqs)
    assert fit.request_overhead_ms == pytest.approx(TRUE_OVERHEAD_MS, abs=0.01)
    assert any("measured apart" in n for n in fit.notes)


def test_acceptance_fit_undoes_the_draft_cap():
    truth = ProposalAcceptance(0.6, PerPositionAcceptance((0.85, 0.75, 0.7, 0.65, 0.6, 0.6, 0.6, 0.6)))
    new = 24  # short requests: many drafts capped at the budget
    c = simulate_counters(truth, 8, new, 300, np.random.default_rng(3))
    fit = fit_acceptance(c, new, n_requests=600)
    assert fit.p_propose == pytest.approx(0.6, abs=0.04)
    assert fit.inner.alphas[0] == pytest.approx(0.85, abs=0.04)
    assert fit.inner.alphas[7] == pytest.approx(0.6, abs=0.08)


@pytest.mark.slow
def test_held_out_loads_and_k_are_predicted(cal):
    data, cal = cal
    split = cal.split
    assert split.test_k == (4,) and set(split.test_loads) == {"c2", "r4"}
    held = [r for r in cal.rows if r["split"] == "held-out"]
    assert {r["config"] for r in held} >= {"off", "ngram:3:k4"}
    s = cal.summary()
    assert s["throughput_tokens_per_s"]["mape_pct"] < 5.0
    assert s["e2e_p50_ms"]["mape_pct"] < 10.0
    assert s["e2e_p95_ms"]["mape_pct"] < 15.0
    assert any("never trained on" in n for n in cal.notes)


@pytest.mark.slow
def test_advice_configs_and_regret(cal):
    from calibrate.advice import advise, regret

    data, cal = cal
    rows = advise(cal.model, cal.counters, data, [2, 4, 8], [1, 2, 4], seeds=2, draws=3)
    assert all(r.best_k in (0, 2, 4, 8) for r in rows)
    for r in rows:
        if r.best_k:
            assert r.speedup_lo <= r.speedup <= r.speedup_hi or r.speedup_lo <= r.speedup_hi
            assert r.speedup >= 1.0
    assert all(g.regret <= 0.05 for g in regret(rows, data))


def test_regret_is_paired_by_repeat_and_says_when_it_is_noise():
    from types import SimpleNamespace

    from calibrate.advice import regret

    # concurrency 1: k = 4 beats off in every repeat by ~5% while the machine drifts 20% between repeats;
    # concurrency 2: off and k = 4 swap places from repeat to repeat
    thr = {(1, 0): [100, 120, 80], (1, 4): [105, 127, 83.5], (2, 0): [100, 98, 103], (2, 4): [104, 95, 104]}
    units = pd.DataFrame([{"synthetic": False, "load": f"c{c}", "spec_k": k, "repeat": r, "throughput_tokens_per_s": v}
                          for (c, k), vs in thr.items() for r, v in enumerate(vs)])
    rows = [AdviceRow(1, 0, 1.0, 1.0, 1.0, {0: 1.0, 4: 0.99}), AdviceRow(2, 0, 1.0, 1.0, 1.0, {0: 1.0, 4: 0.99})]
    g1, g2 = regret(rows, SimpleNamespace(units=units))
    assert g1.measured_best_k == 4 and g1.regret == pytest.approx(1 - 1 / 1.05, abs=0.003)
    assert 0 < g1.regret_lo < g1.regret < g1.regret_hi < 0.08 and not g1.within_noise  # drift cancels in pairs
    assert g2.measured_best_k == 4 and g2.regret > 0 and g2.regret_lo < 0 and g2.within_noise


def test_config_formats():
    rows = [AdviceRow(1, 4, 1.3, 1.2, 1.4, {0: 1.0, 4: 1.3}), AdviceRow(2, 4, 1.2, 1.1, 1.3, {0: 1.0, 4: 1.2}),
            AdviceRow(4, 2, 1.05, 1.0, 1.1, {0: 1.0, 2: 1.05}), AdviceRow(8, 0, 1.0, 1.0, 1.0, {0: 1.0})]
    assert ranges(rows) == [(1, 2, 4), (4, 4, 2), (8, 4096, 0)]
    v = vllm_config(rows)
    assert v["num_speculative_tokens"] == 4 and v["num_speculative_tokens_per_batch_size"]["8-4096"] == 0
    t = trtllm_config(rows)
    assert t == {"draft_len_schedule": {2: 4, 4: 2}, "max_concurrency": 4}


@pytest.mark.slow
def test_cli_end_to_end_and_bad_input(run_dir, tmp_path):
    out = tmp_path / "cal"
    p = subprocess.run([sys.executable, "-m", "calibrate", str(run_dir), "--seeds", "2", "--advice-draws", "2",
                        "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "held-out MAPE throughput_tokens_per_s" in p.stdout and "vLLM speculative_config" in p.stdout
    assert "regret at concurrency" in p.stdout
    doc = json.loads((out / "serve_calibration.json").read_text())
    assert doc["step_cost"]["kind"] == "linear_step" and set(doc["acceptance"]) == {"2", "4", "8"}
    for name in ("serve_predictions.csv", "serve_curves.csv", "advice.json"):
        assert (out / name).is_file()
    # bad input: the CLI's main in this process (the process above ran its ``python -m`` entry point)
    from tests.support.cli_inprocess import run_module

    for argv, msg in (([str(tmp_path)], "not a run directory"),
                      ([str(run_dir), "--holdout-loads", "c99"], "not measured"),
                      ([str(run_dir), "--holdout-k", "2,4,8"], "every draft length is held out")):
        p = run_module("calibrate", ["serve", *argv, "--out", str(tmp_path / "x")])
        assert p.returncode == 2 and msg in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


@pytest.mark.slow
def test_iid_model_also_fits(tmp_path):
    acc = {2: IIDAcceptance(0.7), 4: IIDAcceptance(0.7)}
    run = make_serve_run(tmp_path / "r", acc, [LoadSpec(concurrency=1), LoadSpec(concurrency=3)], repeats=2,
                         n_requests=6, new_tokens=32)
    data = load_serve(run)
    cal = calibrate_serve(data, default_split(data.units, [], ["c3"]), seeds=3)
    assert cal.model.acceptance[4].inner.alphas[0] == pytest.approx(0.7, abs=0.1)


@pytest.mark.slow
def test_prompts_that_accept_differently_get_their_own_scale(tmp_path):
    # prompt p0 accepts most drafts, p1 few, p2 in between: their requests' latencies spread accordingly
    shape = (0.8, 0.7, 0.6, 0.55)
    per = [ProposalAcceptance(0.8, PerPositionAcceptance(tuple(min(a * s, 0.97) for a in shape))) for s in
           (1.2, 0.3, 0.8)]
    run = make_serve_run(tmp_path / "r", {2: per, 8: per}, LOADS, repeats=3)
    data = load_serve(run)
    cal = calibrate_serve(data, default_split(data.units), seeds=4)
    s = cal.model.prompt_scales
    assert s["p0"].alpha_scale > s["p2"].alpha_scale > s["p1"].alpha_scale
    summ = cal.summary()
    assert summ["e2e_p95_ms"]["mape_pct"] < 15.0 and summ["throughput_tokens_per_s"]["mape_pct"] < 5.0


def test_simulated_counters_match_the_servers_rules_written_plainly():
    acc = ProposalAcceptance(0.6, PerPositionAcceptance((0.85, 0.75, 0.7, 0.65)))
    rng = np.random.default_rng(1)
    rounds = drafts = drafted = 0
    pos = np.zeros(4)
    for _ in range(1500):  # llama-server's rules round by round: the prompt gives one token, drafts capped
        left = 47
        while left > 0:
            d, a = acc.sample_round(4, rng)
            d = min(int(d), left - 1)
            a = min(int(a), d)
            rounds, drafts, drafted = rounds + 1, drafts + (d > 0), drafted + d
            pos[:a] += 1
            left -= a + 1
    c = simulate_counters(acc, 4, 48, 1500, np.random.default_rng(2))
    assert c.rounds == pytest.approx(rounds, rel=0.02) and c.drafts == pytest.approx(drafts, rel=0.02)
    assert c.draft_tokens == pytest.approx(drafted, rel=0.02)
    np.testing.assert_allclose(c.accepted_per_pos, pos, rtol=0.03)


@pytest.mark.slow
def test_a_k_below_the_lookup_ngram_never_drafts_and_is_said(tmp_path):
    # llama.cpp's ngram-simple with k = 2 < n = 3 drafts nothing (copy_max < size_n): the run shows it
    never = ProposalAcceptance(0.0, PerPositionAcceptance((0.0, 0.0)))
    run = make_serve_run(tmp_path / "r", {2: never, 4: TRUE_ACC[4], 8: TRUE_ACC[8]},
                         [LoadSpec(concurrency=1), LoadSpec(concurrency=2)], repeats=2, n_requests=6)
    data = load_serve(run)
    cal = calibrate_serve(data, default_split(data.units, [4], []), seeds=2)
    assert cal.model.acceptance[2].p_propose == 0.0
    assert any("never drafted" in n for n in cal.notes)
    assert cal.model.acceptance[4].p_propose == pytest.approx(cal.model.acceptance[8].p_propose)  # not pooled with 0


SMALL = dict(repeats=2, n_requests=6, new_tokens=32)  # a run the fits take seconds on


@pytest.mark.slow
def test_held_out_units_cannot_move_the_fit(tmp_path):
    # every measured number of a held-out unit (its times, tokens, counters, its requests' times and timings)
    # changed wildly: the fitted model (step cost, overhead, acceptance, prompt scales) stays what it was
    run = make_serve_run(tmp_path / "r", {2: TRUE_ACC[2], 4: TRUE_ACC[4]}, [LoadSpec(concurrency=1),
                         LoadSpec(concurrency=2)], **SMALL)
    data = load_serve(run)
    split = default_split(data.units, [4], ["c2"])
    model, counters, _ = fit_serve_model(data, split)
    assert model.step.n_units > 0  # the real training units are fitted to
    held = {c for c, k, ld, syn in zip(data.units["cell_id"], data.units["spec_k"], data.units["load"],
                                        data.units["synthetic"]) if not syn and not split.is_train(int(k), ld)}
    units, req = data.units.copy(), data.requests.copy()
    hu, hr = units["cell_id"].isin(held), req["cell_id"].isin(held)
    for col in ("duration_s", "throughput_tokens_per_s", "e2e_p50_ms", "e2e_p95_ms", "drafts", "draft_tokens"):
        units.loc[hu, col] = units.loc[hu, col] * 3.0
    units.loc[hu, "accepted_per_pos"] = "1 1 1 1 1 1 1 1"
    for col in ("ttft_ms", "e2e_ms", "send_s"):
        req.loc[hr, col] = req.loc[hr, col] * 2.5
    req.loc[hr, "draft_n_accepted"] = 0
    model2, counters2, _ = fit_serve_model(type(data)(data.path, units, req, data.steps, data.meta), split)
    assert model2.step.cost.describe() == model.step.cost.describe()
    assert model2.step.request_overhead_ms == model.step.request_overhead_ms
    assert {k: a.to_dict() for k, a in model2.acceptance.items()} == {k: a.to_dict() for k, a in model.acceptance.items()}
    assert model2.prompt_scales == model.prompt_scales and counters2 == counters
    # ... while the same change to one training unit does move it (the check above can fail)
    tu = units["cell_id"] == next(c for c in data.units["cell_id"] if c not in held and "synth" not in c)
    units.loc[tu, "duration_s"] = units.loc[tu, "duration_s"] * 3.0
    model3, _, _ = fit_serve_model(type(data)(data.path, units, req, data.steps, data.meta), split)
    assert model3.step.cost.describe() != model.step.cost.describe()


def test_real_units_show_what_an_accepted_token_costs(tmp_path):
    # a server whose accepted tokens cost 4 ms each (sampled, detokenised, streamed) beyond the verify: the
    # synthetic step-cost units (acceptance forced to 0, one token a slot) cannot show it; fitted to the real
    # training units as well, the step cost finds it and predicts the held-out load's speculative units
    from calibrate.serve import predict_unit

    truth = LinearStepCost(**{**{f: getattr(TRUE_COST, f) for f in LinearStepCost.FIELDS}, "per_accepted_ms": 4.0})
    acc = ProposalAcceptance(0.8, PerPositionAcceptance((0.9, 0.85, 0.8, 0.8)))
    run = make_serve_run(tmp_path / "r", {4: acc}, [LoadSpec(concurrency=1), LoadSpec(concurrency=3)],
                         true_cost=truth, **SMALL)
    data = load_serve(run)
    split = default_split(data.units, [], ["c3"])
    before, _, _ = fit_serve_model(data, split, refit=False)
    after, _, _ = fit_serve_model(data, split)
    assert before.step.cost.per_accepted_ms == 0.0 and before.step.n_units == 0
    c = after.step.cost
    assert c.per_accepted_ms == pytest.approx(4.0, rel=0.25) and after.step.n_units == 4
    assert c.per_token_ms == pytest.approx(TRUE_COST.per_token_ms, rel=0.15)
    held = data.units[(data.units["load"] == "c3") & (data.units["spec_k"] == 4)]
    err = {name: np.mean([abs(predict_unit(m, data, u.cell_id, 2, 0)["throughput_tokens_per_s"]
                              / u.throughput_tokens_per_s - 1) for u in held.itertuples()])
           for name, m in (("before", before), ("after", after))}
    assert err["after"] < 0.05 < err["before"]


def test_acceptance_from_totals_alone_takes_an_iid_alpha_per_position():
    from calibrate.serve import iid_per_pos

    pos = iid_per_pos(100, 90, 3)  # 0.9 accepted per draft at k = 3: alpha + alpha^2 + alpha^3 = 0.9
    a = pos[0] / 100
    assert abs(a + a**2 + a**3 - 0.9) < 0.02 and list(pos) == sorted(pos, reverse=True)


@pytest.mark.slow
def test_a_forward_step_cost_fit_recovers_its_efficiency_and_overhead(tmp_path):
    # a server whose step is 1.7 x the T4 roofline forward of Llama-3.2-1B + 3 ms, read as benchmark files are (no
    # step-cost units, no request overhead apart): starting from the forward, the fit finds both numbers
    from calibrate.serve import ServeData
    from presets.hardware import get_hardware
    from sim.serving import ForwardStepCost, forward_step_cost
    from sim.stepcost import GpuSetup

    start = forward_step_cost("Llama-3.2-1B", GpuSetup(get_hardware("t4")), "roofline")
    run = make_serve_run(tmp_path / "r", {2: TRUE_ACC[2], 4: TRUE_ACC[4]},
                         [LoadSpec(concurrency=c) for c in (1, 2, 4)], true_cost=start.fitted(1.7, 3.0),
                         request_overhead_ms=0.0, prompts=(200, 600, 400), **SMALL)
    full = load_serve(run)
    data = ServeData(full.path, full.units, full.requests, None, full.meta)
    model, _, notes = fit_serve_model(data, default_split(data.units, [], ["c2"]), start=start)
    c = model.step.cost
    assert isinstance(c, ForwardStepCost) and c.forward is start.forward
    assert c.efficiency == pytest.approx(1.7, rel=0.05) and c.overhead_ms == pytest.approx(3.0, rel=0.25)
    assert any("efficiency and a per-step overhead fitted" in n for n in notes)
    with pytest.raises(ValueError, match="for benchmark files"):
        fit_serve_model(full, default_split(full.units, [], ["c2"]), start=start)
