"""The serving simulator (sim/serving.py): held against a slot-by-slot reference, closed forms and its own rules."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.acceptance import IIDAcceptance, PerPositionAcceptance, ProposalAcceptance, RunTraceAcceptance
from sim.serving import (
    ClosedLoop,
    OpenLoop,
    Scheduler,
    Workload,
    _FixedRounds,
    llama_server,
    lockstep,
    round_pmf,
    simulate_server,
)


class _Cost:
    """A step cost that depends on every total the simulator keeps (so a wrong total changes the times)."""

    uses_max_draft = True

    def step_ms(self, seqs, tokens, max_draft, ctx_sum, attn, prompt_tokens, prompt_seqs, emitted):
        return 3.0 + 0.7 * seqs + 0.9 * tokens + 0.31 * max_draft + 1e-3 * ctx_sum + 2e-5 * attn \
            + 0.05 * prompt_tokens + 1.3 * prompt_seqs + 0.17 * emitted

    def describe(self):
        return {}


def _reference(workload: Workload, sched: Scheduler, cost, acceptance, gamma: int | None, ctx_base: float,
               seed: int):
    """Slot by slot, step by step, the rules of the module docstring written plainly; rounds are read off the
    same pools the simulator draws from, in admission order, so both must give the same run."""
    _, rounds_rng = np.random.default_rng(seed).spawn(2)
    pool = _FixedRounds(acceptance, gamma or 1, rounds_rng)
    n, n_new = workload.n_requests, workload.new_tokens
    prompts = np.atleast_1d(workload.prompt_tokens)
    load = workload.load
    send = np.array(workload.arrivals_ms, float) if workload.arrivals_ms is not None else np.zeros(n)
    arrivals = [(send[i] + workload.request_overhead_ms, i) for i in range(n)] if isinstance(load, OpenLoop) \
        else [(workload.request_overhead_ms, i) for i in range(load.concurrency)]
    next_id = len(arrivals)
    first, finish, tokens = np.full(n, math.nan), np.full(n, math.nan), np.zeros(n, int)
    slots: list[dict | None] = [None] * sched.slots
    queue: list[int] = []
    t, steps = 0.0, []

    def draw(remaining):
        out = []
        while remaining > 0:
            if pool.p >= len(pool.dl):
                pool._refill()
            d, a = pool.dl[pool.p], pool.al[pool.p]
            pool.p += 1
            if sched.cap_drafts:
                d = min(d, remaining - 1)
                a = min(a, d)
            out.append((d, a))
            remaining -= a + 1
        return out

    while np.isnan(finish).any():
        arrivals.sort()
        while arrivals and arrivals[0][0] <= t:
            queue.append(arrivals.pop(0)[1])
        if all(sl is None for sl in slots) and not queue:
            t = max(t, arrivals[0][0])
            continue
        for k in range(sched.slots):
            if slots[k] is None and queue:
                r = queue.pop(0)
                p = int(prompts[r % prompts.size])
                have = 1 if sched.prefill else 0
                slots[k] = {"r": r, "prompt": max(p, 1) if sched.prefill else 0, "p_done": 0, "ctx": ctx_base + p,
                            "rounds": draw(n_new - have), "produced": have}
        # build the batch: generating slots first (in admission order), then prompt chunks
        order = sorted((sl for sl in slots if sl is not None), key=lambda sl: sl["r"])
        gen = [sl for sl in order if sl["prompt"] == 0]
        seqs = len(gen)
        tok = sum(1 + sl["rounds"][0][0] for sl in gen)
        dmax = max((sl["rounds"][0][0] for sl in gen), default=0)
        ctx_sum = sum(sl["ctx"] for sl in gen)
        attn = sum((1 + sl["rounds"][0][0]) * (sl["ctx"] + 0.5 * (2 + sl["rounds"][0][0])) for sl in gen)
        p_tok = p_seqs = 0
        chunks = []
        for sl in order:
            if sl["prompt"] > 0:
                take = min(sl["prompt"], sched.n_batch_tokens - tok - p_tok)
                if take > 0:
                    c0 = sl["ctx"] - sl["prompt"]
                    attn += take * c0 + 0.5 * take * (take + 1)
                    p_tok += take
                    p_seqs += 1
                    chunks.append((sl, take))
        emitted = sum(1 + sl["rounds"][0][1] for sl in gen)
        dt = cost.step_ms(seqs, tok + p_tok, dmax, ctx_sum, attn, p_tok, p_seqs, emitted)
        t += dt
        steps.append((dt, seqs))
        for sl in gen:
            d, a = sl["rounds"].pop(0)
            sl["produced"] += a + 1
            sl["ctx"] += a + 1
        for sl, take in chunks:
            sl["prompt"] -= take
            if sl["prompt"] == 0:  # the prompt step's token: context counts the tokens produced
                first[sl["r"]] = t
                sl["ctx"] += 1
        for k, sl in enumerate(slots):
            if sl is not None and not sl["rounds"] and sl["prompt"] == 0:
                if not sched.prefill and math.isnan(first[sl["r"]]):
                    first[sl["r"]] = t
                finish[sl["r"]] = t
                tokens[sl["r"]] = sl["produced"]
                slots[k] = None
                if isinstance(load, ClosedLoop) and next_id < n:
                    send[next_id] = t + load.think_ms
                    arrivals.append((t + load.think_ms + workload.request_overhead_ms, next_id))
                    next_id += 1
            elif sl is not None and not sched.prefill and math.isnan(first[sl["r"]]):
                first[sl["r"]] = t
    return send, first, finish, tokens, steps


@pytest.mark.parametrize("sched", [llama_server(3), llama_server(2, n_batch_tokens=40), lockstep(3)],
                         ids=["llama-server", "prompt-chunks", "lockstep"])
@pytest.mark.parametrize("load", [ClosedLoop(4, think_ms=2.0), OpenLoop(30.0)], ids=["closed", "open"])
@pytest.mark.parametrize("acceptance,gamma", [(None, None), (ProposalAcceptance(0.6, IIDAcceptance(0.7)), 4),
                                              (PerPositionAcceptance((0.9, 0.5)), 3)],
                         ids=["off", "lookup-k4", "perpos-k3"])
def test_matches_a_slot_by_slot_reference(sched, load, acceptance, gamma):
    rng = np.random.default_rng(5)
    arrivals = np.cumsum(rng.exponential(30.0, 40)) if isinstance(load, OpenLoop) else None
    w = Workload(40, 23, load, prompt_tokens=[17, 60, 5, 33], request_overhead_ms=1.5, arrivals_ms=arrivals)
    policy = None if gamma is None else f"fixed:{gamma}"
    run = simulate_server(w, sched, _Cost(), acceptance, policy, context_tokens=7.0, seed=11)
    send, first, finish, tokens, steps = _reference(w, sched, _Cost(), acceptance, gamma, 7.0, 11)
    np.testing.assert_allclose(run.send_ms, send)
    np.testing.assert_allclose(run.first_token_ms, first)
    np.testing.assert_allclose(run.finish_ms, finish)
    np.testing.assert_array_equal(run.tokens, tokens)
    np.testing.assert_allclose(run.step_ms, [s[0] for s in steps])
    np.testing.assert_array_equal(run.step_seqs, [s[1] for s in steps])
    if sched.cap_drafts:
        assert (run.tokens == 23).all()  # a capped draft never runs past max_tokens
    assert run.accepted <= run.drafted


def test_one_client_one_slot_is_the_sum_of_its_steps():
    class Const:
        def step_ms(self, seqs, tokens, *rest):
            return 10.0 + tokens

        def describe(self):
            return {}

    w = Workload(3, 5, ClosedLoop(1), prompt_tokens=20, request_overhead_ms=1.0)
    run = simulate_server(w, llama_server(1), Const())
    # prompt step (20 tokens: 30 ms) gives the first token, then 4 one-token steps of 11 ms
    np.testing.assert_allclose(run.ttft_ms, 1.0 + 30.0)
    np.testing.assert_allclose(run.e2e_ms, 1.0 + 30.0 + 4 * 11.0)
    np.testing.assert_allclose(run.tpot_ms, 11.0)
    np.testing.assert_allclose(np.diff(run.send_ms), 1.0 + 30.0 + 44.0)  # each request sent when the last ended
    stats = run.stats()
    assert stats.itl.p50_ms == pytest.approx(11.0)
    assert stats.mean_batch == 1.0


def test_saturated_server_delivers_its_slots_per_step():
    class Const:
        def step_ms(self, *args):
            return 20.0

        def describe(self):
            return {}

    # far more requests than slots, arriving at once: every step serves 4 slots (bar the edges); long requests,
    # so that the last rounds of each (drafts capped at the budget) hardly count
    w = Workload(100, 400, OpenLoop(1e6), prompt_tokens=10)
    stats = simulate_server(w, llama_server(4), Const()).stats()
    assert stats.throughput_tokens_per_s == pytest.approx(4 * 1000.0 / 20.0, rel=0.01)
    spec = simulate_server(w, llama_server(4), Const(), IIDAcceptance(0.8), "fixed:3").stats()
    tau = IIDAcceptance(0.8).expected_tokens(3)
    assert spec.throughput_tokens_per_s / stats.throughput_tokens_per_s == pytest.approx(tau, rel=0.04)


def test_round_distribution_matches_the_models():
    for model, g in ((IIDAcceptance(0.7), 4), (PerPositionAcceptance((0.9, 0.6, 0.3)), 5),
                     (ProposalAcceptance(0.4, IIDAcceptance(0.8)), 3)):
        pmf = round_pmf(model, g)
        assert pmf.sum() == pytest.approx(1.0)
        d, a = np.indices(pmf.shape)
        assert (pmf[a > d] == 0).all()
        assert (pmf * (a + 1)).sum() == pytest.approx(model.expected_tokens(g))
        np.testing.assert_allclose(pmf.sum(axis=1), model.drafted_probs(g), atol=1e-12)
    trace = RunTraceAcceptance(((np.array([0, 3, 3, 1, 0, 2, 3, 3, 0]), np.array([0, 2, 1, 1, 0, 0, 3, 1, 0])),), 3)
    pmf = round_pmf(trace, 3)
    assert (pmf * (np.indices(pmf.shape)[1] + 1)).sum() == pytest.approx(trace.expected_tokens(3))


def test_seeded_and_bad_input():
    w = Workload(50, 20, OpenLoop(10.0), prompt_tokens=12)
    a = simulate_server(w, llama_server(2), _Cost(), IIDAcceptance(0.6), "fixed:2", seed=3)
    b = simulate_server(w, llama_server(2), _Cost(), IIDAcceptance(0.6), "fixed:2", seed=3)
    c = simulate_server(w, llama_server(2), _Cost(), IIDAcceptance(0.6), "fixed:2", seed=4)
    np.testing.assert_array_equal(a.finish_ms, b.finish_ms)
    assert not np.array_equal(a.finish_ms, c.finish_ms)
    adaptive = simulate_server(w, llama_server(2), _Cost(), IIDAcceptance(0.9), "heuristic:2", seed=3)
    assert (adaptive.tokens == 20).all() and adaptive.drafted > 0
    for bad, match in ((lambda: OpenLoop(0.0), "arrival rate"), (lambda: OpenLoop(math.nan), "arrival rate"),
                       (lambda: ClosedLoop(0), "concurrency"), (lambda: Scheduler(0), "slots"),
                       (lambda: Workload(0, 5, ClosedLoop(1)), "n_requests"),
                       (lambda: Workload(3, 5, ClosedLoop(1), prompt_tokens=-1), "prompt tokens"),
                       (lambda: simulate_server(w, llama_server(2), _Cost(), IIDAcceptance(0.6)), "both")):
        with pytest.raises(ValueError, match=match):
            bad()


def test_acceptance_per_prompt():
    # requests of prompt 0 accept nearly every draft, those of prompt 1 nearly none
    w = Workload(40, 30, ClosedLoop(2), prompt_tokens=[20, 20])
    run = simulate_server(w, llama_server(2), _Cost(), [IIDAcceptance(0.97), IIDAcceptance(0.02)], "fixed:4", seed=1)
    even, odd = run.request_rounds[0::2], run.request_rounds[1::2]
    assert even.max() < odd.min()  # fewer rounds for the same tokens
    assert (run.request_drafted[0::2] < run.request_drafted[1::2]).all()
    assert (run.tokens == 30).all()
    with pytest.raises(ValueError, match="empty list"):
        simulate_server(w, llama_server(2), _Cost(), [], "fixed:4")


def test_linear_step_cost_features_are_what_its_coefficients_multiply():
    from sim.serving import LinearStepCost, StepLoad

    rng = np.random.default_rng(4)
    for _ in range(50):
        coef = rng.uniform(0.0, 3.0, len(LinearStepCost.FIELDS))
        cost = LinearStepCost(*coef)
        seqs = int(rng.integers(0, 9))
        tok = seqs + int(rng.integers(0, 3 * seqs + 1))
        load = StepLoad(seqs, tok + 40, 2, 100.0 * seqs, float(rng.uniform(0, 1e5)), 40, 1,
                        seqs + int(rng.integers(0, tok - seqs + 1)))
        by_features = float(np.dot(coef, LinearStepCost.features(load)))
        assert cost.step_ms(load.seqs, load.tokens, load.max_draft, load.ctx_sum, load.attn, load.prompt_tokens,
                            load.prompt_seqs, load.emitted) == pytest.approx(by_features)
    # accepted tokens (emitted beyond one a slot) are what per_accepted_ms prices; a cost from before it loads
    c = LinearStepCost(1.0, per_accepted_ms=2.0)
    assert c.step_ms(3, 9, 2, 0.0, 0.0, 0, 0, 3) == 1.0 and c.step_ms(3, 9, 2, 0.0, 0.0, 0, 0, 7) == 9.0
    old = {"kind": "linear_step", "base_ms": 5.0, "per_seq_ms": 1.0, "per_token_ms": 2.0,
           "per_prompt_token_ms": 0.1, "per_attn_ms": 0.0, "metadata": {}}
    assert LinearStepCost.from_dict(old).per_accepted_ms == 0.0
    assert LinearStepCost.from_dict(LinearStepCost(1.0, per_accepted_ms=2.5).describe()).per_accepted_ms == 2.5


def test_serve_benchmark_times_the_calibrated_model_and_refuses_bad_input(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    bench = root / "benchmarks" / "bench_serve.py"
    p = subprocess.run([sys.executable, str(bench), "--requests", "300", "--repeats", "2"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout.strip().splitlines()[-1])
    assert doc["requests"] == 300 and len(doc["seconds"]) == 2 and doc["median_s"] > 0
    assert doc["target_s"] == pytest.approx(60.0 * 300 / 1e6) and 0 < doc["mean_batch"] <= 8
    for argv in (["--requests", "0"], ["--calibration", str(tmp_path / "none.json")]):
        p = subprocess.run([sys.executable, str(bench), *argv], cwd=tmp_path, capture_output=True, text=True,
                           timeout=60, check=False)
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_same_numbers_as_the_golden_runs():
    """Every output of the golden runs (tests/support/serve_golden.py) is bit for bit what the simulator gave when the
    fixture was written (before its loop was made faster): a rewrite must not move one ulp."""
    import json

    from tests.support.serve_golden import FIXTURE, golden

    want = json.loads(FIXTURE.read_text())
    got = golden()
    assert sorted(got) == sorted(want)
    for name in want:
        diff = {k: (got[name][k], v) for k, v in want[name].items() if got[name][k] != v}
        assert not diff, f"{name}: {diff}"


@pytest.mark.parametrize("window", [1, 4, 128])
def test_the_ring_window_changes_no_number(monkeypatch, window):
    """The loop reads the ring's totals a window of steps at a time; any window gives the golden numbers (a
    window of 1 re-reads every step, one of 128 spans many admissions and finishes)."""
    import json

    import sim.serving
    from tests.support.serve_golden import FIXTURE, _configs, digest

    monkeypatch.setattr(sim.serving, "_WINDOW", window)
    want = json.loads(FIXTURE.read_text())
    for name in ("llama-closed-iid-k3-chunks", "llama-closed-off-ctx", "llama-trace-sends", "lockstep-all-totals"):
        assert digest(_configs()[name]()) == want[name], name


@pytest.mark.parametrize("whole", [True, False], ids=["whole-contexts-way", "general-way"])
@pytest.mark.parametrize("pool", [7, 61])
def test_pools_of_any_size_give_the_same_run(monkeypatch, pool, whole):
    """Pools are slices of one stream of draws, so their size changes no number (with whole-number contexts,
    whose totals are exact in any order): tiny pools make requests' rounds, and their capped last rounds, run
    across pool ends again and again, on both ways of adding them."""
    import json

    import sim.serving
    from tests.support.serve_golden import FIXTURE, _configs, digest

    monkeypatch.setattr(sim.serving, "_POOL_ROUNDS", pool)
    monkeypatch.setattr(sim.serving, "_WHOLE_CONTEXTS", whole)
    want = json.loads(FIXTURE.read_text())
    for name in ("llama-per-prompt", "llama-trace-sends", "lockstep-roofline"):
        assert digest(_configs()[name]()) == want[name], name


def test_pool_draws_by_comparison_are_those_of_a_search(monkeypatch):
    import sim.serving

    models = [(ProposalAcceptance(0.3, IIDAcceptance(0.8)), 4), (PerPositionAcceptance((0.9, 0.6, 0.3)), 5),
              (IIDAcceptance(0.7), 12)]
    pools = []
    for limit in (64, 0):  # every distribution drawn by comparisons, then every one by searchsorted
        monkeypatch.setattr(sim.serving, "_COMPARE_CDF_MAX", limit)
        pools.append([_FixedRounds(m, g, np.random.default_rng(9)) for m, g in models])
    for a, b in zip(*pools):
        assert list(a.dl) == list(b.dl) and list(a.al) == list(b.al)
        np.testing.assert_array_equal(a.block, b.block)


class _Forward:
    """A forward whose time is linear in what it reads (tokens, sequences, context): exact checks of the composition."""

    def forward_ms(self, n_tokens, context_tokens, batch=1):
        return 5.0 + 0.5 * n_tokens * batch + 0.01 * context_tokens * batch

    def prefill_ms(self, prompt_tokens, batch=1):
        return 6.0 + 0.1 * prompt_tokens * batch

    def describe(self):
        return {"source": "test"}


def test_forward_step_cost_composes_a_step_from_the_forward():
    from sim.serving import ForwardStepCost, StepLoad

    c = ForwardStepCost(_Forward(), efficiency=2.0, overhead_ms=1.5, context_quantum_tokens=64.0)
    f = _Forward()
    # a decode step on the grid: one forward of 3 sequences x 2 tokens at the mean context
    assert c.forward_part_ms(3, 6, 3 * 128.0, 0, 0) == pytest.approx(f.forward_ms(2, 128.0, 3))
    assert c.step_ms(3, 6, 1, 3 * 128.0, 0.0, 0, 0, 3) == pytest.approx(2.0 * f.forward_ms(2, 128.0, 3) + 1.5)
    # ragged drafts (2.5 tokens a slot) and a context between grid points: bilinear, exact for a bilinear forward
    assert c.forward_part_ms(2, 5, 2 * 100.0, 0, 0) == pytest.approx(f.forward_ms(2.5, 100.0, 2))
    # a prompt alone is its prefill; a mixed step is one forward: the prompt plus what decoding adds beyond the
    # one-token, no-context forward both hold (the weight read paid once)
    assert c.forward_part_ms(0, 80, 0.0, 80, 2) == pytest.approx(f.prefill_ms(40, 2))
    mixed = f.prefill_ms(40, 2) + f.forward_ms(1, 128.0, 3) - f.forward_ms(1, 0.0, 1)
    assert c.forward_part_ms(3, 83, 3 * 128.0, 80, 2) == pytest.approx(mixed)
    load = StepLoad(3, 83, 0, 3 * 128.0, 0.0, 80, 2, 3)
    assert c.features(load) == (pytest.approx(mixed), 1.0)
    assert c.step_ms(3, 83, 0, 3 * 128.0, 0.0, 80, 2, 3) == pytest.approx(np.dot((2.0, 1.5), c.features(load)))
    with pytest.raises(ValueError, match="efficiency must be a finite number >= 0"):
        ForwardStepCost(_Forward(), efficiency=float("nan"))


def test_forward_step_cost_drives_the_server_and_reads_back():
    from presets.hardware import get_hardware
    from sim.serving import ForwardStepCost, LinearStepCost, forward_step_cost, step_cost_from_dict
    from sim.stepcost import GpuSetup

    cost = forward_step_cost("Llama-3.2-1B", GpuSetup(get_hardware("t4"), moe_routing="power_law_1.01"),
                             "roofline").fitted(1.3, 2.0)
    assert cost.setup["source"] == "roofline" and "asked" in cost.setup["why"]
    assert cost.setup["moe_routing"] == "power_law_1.01"  # kept, so a kernel-priced MoE model reads back the same
    wl = Workload(12, 16, ClosedLoop(3), prompt_tokens=[200, 500])
    acc = ProposalAcceptance(0.8, IIDAcceptance(0.7))
    a = simulate_server(wl, llama_server(4), cost, acc, "fixed:3", seed=1)
    back = step_cost_from_dict(cost.describe())
    assert isinstance(back, ForwardStepCost) and back.describe() == cost.describe()
    b = simulate_server(wl, llama_server(4), back, acc, "fixed:3", seed=1)
    assert np.array_equal(a.step_ms, b.step_ms) and a.step_ms.min() > 2.0
    assert isinstance(step_cost_from_dict(LinearStepCost(1.0).describe()), LinearStepCost)
    for bad, msg in (({"kind": "nope"}, "unknown step cost kind 'nope'; valid: linear_step, forward_step"),
                     ({**cost.describe(), "extra": 1}, "unknown field 'extra'"),
                     ({k: v for k, v in cost.describe().items() if k != "overhead_ms"}, "lacks the field 'overhead_ms'"),
                     ({**cost.describe(), "setup": {**cost.setup, "hardware": "h900"}}, "unknown hardware 'h900'"),
                     ({**cost.describe(), "setup": {**cost.setup, "moe_routing": "zipf"}}, "unknown MoE routing 'zipf'")):
        with pytest.raises(ValueError, match=msg):
            step_cost_from_dict(bad)
