"""The simulator as a prior for a race (measure/prior.py): what it defers, that a right prior saves units, that a
wrong one keeps the stated error rate, what it reports, and its bad input in one line."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from measure.prior import CHECK_SHARE, GroupRace, load_prior, plan_group, simulate
from measure.racing import RaceRule, simulate_race
from tests.support.cli_inprocess import run_main

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "results" / "cpu-smollm2-ngram-gammas-calibration"


def test_a_candidate_is_deferred_only_beyond_the_uncertainty_and_off_never() -> None:
    plan = plan_group({"a": 1.30, "b": 1.20, "c": 0.80, "d": None, "off": 1.0}, 0.05, ("off",))
    assert plan.leader == "a"
    assert plan.deferred == ("c",), "b's optimistic 1.26 reaches a's pessimistic 1.235; d is not predicted"
    assert plan_group({"a": 0.7, "off": 1.0}, 0.05, ("off",)).deferred == ("a",)
    assert plan_group({"a": 1.3, "b": 0.9}, 1.0).deferred == (), "an uncertainty of 100% separates nothing"


def test_without_a_deferral_the_race_is_the_race_without_a_prior() -> None:
    rule = RaceRule(confidence=0.95, regret=0.02, max_looks=8)
    means = [math.log(s) for s in (0.9, 1.0, 1.08, 1.1)]
    for seed in range(5):
        state, measured = simulate_race(means, 0.08, rule, 3, np.random.default_rng(seed))
        for predicted in (None, [1.0, 1.0, 1.0, 1.0]):
            race, last, units, _ = simulate(means, 0.08, rule, 3, np.random.default_rng(seed), predicted, 0.05)
            assert (units, last.state.leader, last.decided) == (measured, state.leader, state.decided)
            assert not race.deferred


def _units(truth: tuple[float, ...], predicted: list[float] | None, runs: int, off: bool = True,
           looks: int = 12) -> tuple[float, int, float]:
    """Mean units measured, decided races and the mean saving reported, over seeded races (2 units a pass)."""
    rule = RaceRule(confidence=0.95, regret=0.02, max_looks=looks, min_units=2)
    means = [math.log(s) for s in truth]
    total, decided, saved = 0, 0, 0.0
    for seed in range(runs):
        race, last, units, samples = simulate(means, 0.08, rule, 2, np.random.default_rng(seed), predicted, 0.07,
                                              off=off)
        total += units
        decided += last.decided
        if predicted is not None:
            saved += race.savings(samples, 2, last.state.look + 1, {})["units"]
    return total / runs, decided, saved / runs


def test_a_right_prior_saves_units_and_says_so() -> None:
    truth = (0.62, 0.66, 1.22, 1.28)  # two clear losers, a close race between the two others and off
    without, decided_without, _ = _units(truth, None, 60)
    with_prior, decided_with, saved = _units(truth, list(truth), 60)
    assert with_prior < without, (with_prior, without)
    assert decided_with >= decided_without - 3
    assert saved > 0


@pytest.mark.slow
def test_a_prior_that_defers_the_true_best_keeps_the_stated_error_rate() -> None:
    rule = RaceRule(confidence=0.95, regret=0.02, max_looks=20)
    truth = [math.log(s) for s in (1.0, 1.05, 1.10, 1.13)]
    wrong = decided = deferred_best = 0
    runs = 300
    for seed in range(runs):
        race, last, _, _ = simulate(truth, 0.08, rule, 3, np.random.default_rng(seed), [1.12, 1.1, 1.12, 0.7], 0.05)
        deferred_best += "c3" in race.deferred
        if last.decided:
            decided += 1
            wrong += truth[int(last.state.leader[1:])] < max(truth) - rule.log_regret
    assert deferred_best == runs, "the prior defers the true best in every race"
    assert decided > runs // 4, "the races must decide often enough for the rate to say something"
    assert wrong / runs <= 1 - rule.confidence


def test_the_checks_and_the_race_share_the_stated_budget() -> None:
    rule = RaceRule(confidence=0.9, max_looks=6)
    race = GroupRace(rule, ("a", "b", "c", "off"), plan_group({"a": 1.3, "b": 0.6, "c": 1.25, "off": 1.0}, 0.05,
                                                              ("off",)), ("off",))
    assert race.deferred == ("b",)
    pairs = [(x, y) for i, x in enumerate(race.candidates) for y in race.candidates[i + 1:]]
    spent = sum(race.pair_alpha(x, y) for x, y in pairs) * rule.max_looks + race.alpha_check * len(race.deferred)
    assert spent == pytest.approx(1 - rule.confidence)
    assert race.alpha_check == pytest.approx((1 - rule.confidence) * CHECK_SHARE)
    assert race.pair_alpha("a", "c") > rule.alpha_per_interval(4), "the pairs raced get more than without a prior"


def test_the_committed_calibration_predicts_the_default_question() -> None:
    prior = load_prior(str(COMMITTED), "smollm2-135m", "transformers")
    assert prior.method == "trace" and 0 < prior.uncertainty < 0.1
    for domain in ("code", "conversation", "docs"):
        assert all(prior.predict("ngram:3", domain, g, 0.0) is not None for g in (1, 2, 4, 8))
    assert prior.predict("ngram:3", "code", 12, 0.0) is None, "beyond the curves' γ = 1..10"
    assert prior.predict("ngram:3", "code", None, 0.0) is None, "a γ policy that is not fixed"
    assert prior.predict("ngram:3", "code", 4, 0.7) is None, "a temperature it did not measure"
    assert prior.predict("int8", "code", 4, 0.0) is None


@pytest.mark.parametrize("where, target, engine, words", [
    ("/nonexistent/cal", "smollm2-135m", "transformers", "no such directory"),
    (str(ROOT / "results"), "smollm2-135m", "transformers", "holds no calibration.json"),
    (str(COMMITTED), "toy", "transformers", "a calibration of target 'smollm2-135m' on engine 'transformers'"),
    (str(COMMITTED), "smollm2-135m", "llamacpp", "this run measures target 'smollm2-135m' on engine 'llamacpp'"),
])
def test_a_bad_prior_is_one_line(where: str, target: str, engine: str, words: str) -> None:
    with pytest.raises(ValueError, match=words) as e:
        load_prior(where, target, engine)
    assert str(e.value).startswith(f"--prior {where!r}") and "\n" not in str(e.value)


def test_a_calibration_without_a_held_out_error_is_refused(calibration_dir) -> None:
    cal = calibration_dir({("ngram:2", "code", 2): 1.1})
    (cal / "predictions.csv").write_text("method,split,ape_speedup_pct,temperature\ntrace,in_sample,1.0,0\n")
    with pytest.raises(ValueError, match="no held-out error"):
        load_prior(str(cal), "toy", "transformers")


@pytest.mark.parametrize("args, words", [
    (("--until-decided", "--prior", "/nonexistent/cal"), "--prior '/nonexistent/cal': no such directory"),
    (("--prior", str(COMMITTED)), "--prior needs --until-decided"),
    (("--until-decided", "--prior", str(COMMITTED), "--engine", "llamacpp"), "on engine 'llamacpp'"),
])
def test_the_cli_refuses_a_bad_prior_in_one_line_before_any_model(tmp_path, args, words) -> None:
    from measure.__main__ import main

    out = tmp_path / "r"
    p = run_main(main, ("--out", str(out), "--no-system-check", "--no-progress", "--no-cost", *args))
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and words in lines[0], p.stderr
    assert not out.exists()


def test_a_paired_candidate_is_measured_while_its_group_is_undecided() -> None:
    """Off on a server (``paired``): its units pair the others', so it is measured while the group races, even
    eliminated, and not once the group is decided; the look's record is the ``run.json`` schema."""
    rule = RaceRule(confidence=0.9, regret=0.05, max_looks=4, min_units=3)
    units = range(5)
    lead = [0.30, 0.34, 0.28, 0.33, 0.31]
    off = {u: 0.0 for u in units}
    # k2 and k4 within noise of each other, far above off (0 on every unit) and k8: undecided, off eliminated
    close = {"off": off, "k2": dict(enumerate(lead)), "k4": {u: x + d for u, x, d in
                                                             zip(units, lead, [0.1, -0.1, 0.12, -0.08, 0.0])},
             "k8": {u: x - 0.6 for u, x in enumerate(lead)}}
    gl = GroupRace(rule, ("off", "k2", "k4", "k8"), paired=("off",)).look(close, 0, 1)
    assert not gl.decided and "off" in {e.candidate for e in gl.state.eliminated}
    assert set(gl.measure_next) == {"off", "k2", "k4"}
    assert set(GroupRace(rule, ("off", "k2", "k4", "k8")).look(close, 0, 1).measure_next) == {"k2", "k4"}
    # k2 leads, k8 loses clearly, off is eliminated too: decided, nothing measured, off included
    clear = {"off": off, "k2": dict(enumerate(lead)), "k8": {u: x - 0.6 for u, x in enumerate(lead)}}
    gl = GroupRace(rule, ("off", "k2", "k8"), paired=("off",)).look(clear, 0, 1)
    assert gl.decided and gl.measure_next == ()
    rec = gl.record()
    assert rec["leader"] == "k2" and rec["stop_reason"] == "decided"
    assert {e["cell_id"] for e in rec["eliminated"]} == {"off", "k8"} and all(e["ratio_hi"] < 1
                                                                              for e in rec["eliminated"])
