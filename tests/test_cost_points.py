"""measure.costpoints: cost points sized to the run (issue #28: a small run timed the default run's 780 points)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from measure import costpoints
from measure.sweep import SweepConfig, run_sweep

from fake_engine import ToyEngine

ROOT = Path(__file__).resolve().parents[1]
#: the default run's prompts (results/cpu-make-run-fresh3/run.json), per domain
DEFAULT_PROMPTS = {"code": [181, 161], "conversation": [62, 53], "docs": [84, 131]}


def test_the_default_run_times_the_points_it_always_did():
    """Sized to the default run, the plan is the one the default run's fixed settings gave (no slower, and its
    calibration unchanged)."""
    cfg = SweepConfig(gammas=("fixed:2", "fixed:4"), repeats=3)  # python -m measure with no arguments
    plan = costpoints.plan_cost_points(cfg, DEFAULT_PROMPTS)
    committed = json.loads((ROOT / "results" / "cpu-make-run-fresh3" / "run.json").read_text())["config"]
    assert plan.contexts == tuple(committed["cost_contexts"]) == (64, 160, 256)
    assert (plan.max_tokens, plan.repeats, plan.repeats_verified) == \
        (committed["cost_max_tokens"], committed["cost_repeats"], committed["cost_repeats_verified"])
    assert plan.n_points(1) == 780  # 3 × (5 × 40 + 11 × 5) + 3 × 5
    assert costpoints.context_bound(cfg) == 256 + 64 + 4  # the engine's cache: what the cells need, as before


def test_the_issues_small_run_times_a_third_of_the_points():
    """``--prompts 1 --max-new-tokens 24 --gamma 4 --domains code``: one 181-token prompt, 3 repeats; it timed
    the default run's 780 points (3 contexts × 5 token counts × 40 repeats of them)."""
    cfg = SweepConfig(gammas=("fixed:4",), domains=("code",), prompts_per_domain=1, max_new_tokens=24, repeats=3)
    plan = costpoints.plan_cost_points(cfg, {"code": [181]})
    assert plan.contexts == (184, 208)  # 181..205, what its cells see, on a grid of 8
    assert (plan.max_tokens, plan.n_verified, plan.repeats_verified, plan.repeats) == (16, 5, 20, 3)
    assert plan.n_points(1) == 272  # 2 × (5 × 20 + 11 × 3 + 3)
    assert plan.summary(1) == "272 points: contexts 184, 208; 1-5 tokens × 20 repeats, 6-16 × 3; draft steps × 3"


def test_values_given_are_used_as_given_and_repeats_never_drop_below_the_floor():
    cfg = SweepConfig(gammas=("fixed:2",), cost_contexts=(8, 16), cost_max_tokens=4, cost_repeats=2,
                      cost_repeats_verified=3, repeats=1)
    plan = costpoints.plan_cost_points(cfg, {"code": [30]})
    assert (plan.contexts, plan.max_tokens, plan.n_verified, plan.repeats, plan.repeats_verified) == \
        ((8, 16), 4, 3, 2, 3)
    tiny = costpoints.plan_cost_points(SweepConfig(gammas=("fixed:2",), repeats=1), {"code": [30]})
    assert (tiny.repeats_verified, tiny.repeats) == (7, 3)  # 1 pair: 40/6 → 7, and at least 3
    assert costpoints.planned_contexts([100], 4, cap=1000) == (100,)  # a span under 8 tokens: one context
    assert costpoints.planned_contexts([300], 64, cap=310) == (304, 310)  # never above the engine's cache
    with pytest.raises(ValueError, match="no prompts"):
        costpoints.planned_contexts([], 4, cap=10)


def test_a_sweep_times_the_points_its_plan_names_and_records_the_plan(tmp_path):
    cfg = SweepConfig(target="toy", drafts=("ngram:2",), gammas=("fixed:2",), domains=("code",),
                      prompts_per_domain=1, max_new_tokens=10, repeats=2, warmup=0, device="cpu")
    notes: list[str] = []
    run = run_sweep(cfg, tmp_path / "r", engine=ToyEngine(), show_bar=False, progress=notes.append)
    plan = run.meta["cost_plan"]
    ct, cd = run.table("cost_target"), run.table("cost_draft")
    per_n = ct.groupby("n_tokens")["repeat"].nunique().to_dict()
    assert per_n == {n: 14 if n <= 3 else 3 for n in range(1, 17)}  # 2 pairs: 14 and 3 repeats (not 40 and 5)
    prompt = next(iter(run.meta["prompts"].values()))["prompt_tokens"]
    assert set(ct["context_tokens"]) == set(plan["contexts"])
    assert min(plan["contexts"]) >= prompt - 16 and max(plan["contexts"]) <= prompt + 10
    assert len(ct) + len(cd) == plan["n_points"] == len(plan["contexts"]) * (3 * 14 + 13 * 3 + 3)
    assert any("sized to the run" in n and f"{plan['n_points']} points" in n for n in notes)
