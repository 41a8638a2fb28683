"""The cost fits give physical models only (issue #45): bounded least squares, and a stated fallback.

On a busy machine (the committed default job with its short-context forwards timed slower: ``noisy_run``)
and on the committed default job itself, unbounded fits gave the target forward a negative cost per context
token; every test here failed before the fits were bounded.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from calibrate.fit_cost import (MIN_STEP_MS, Bounds, bounded_ols, fallback_lines, fit_cost, fit_draft, ols,
                                target_curve)
from sim.cost import TabulatedCost, check_physical


def _line(x: np.ndarray, y: np.ndarray):
    design = np.column_stack([np.ones_like(x), x])
    return bounded_ols(design, y, ["a", "b"], ["ms", "ms/token"], "ms = a + b x",
                       Bounds(design, np.array([MIN_STEP_MS, 0.0]), ("a", "b"), ("ms", "ms/token")), "line")


def test_bounded_fit_is_ordinary_least_squares_on_physical_data():
    rng = np.random.default_rng(0)
    x = np.linspace(0, 100, 40)
    y = 2.0 + 0.5 * x + rng.normal(0, 0.3, x.size)
    fit = _line(x, y)
    plain = ols(np.column_stack([np.ones_like(x), x]), y, ["a", "b"], ["ms", "ms/token"], "ms = a + b x")
    assert fit.fallbacks == ()
    for p, q in zip(fit.params, plain.params):
        assert p.value == pytest.approx(q.value) and p.stderr == pytest.approx(q.stderr)


def test_a_negative_slope_is_held_at_zero_with_no_standard_error_and_said():
    rng = np.random.default_rng(1)
    x = np.linspace(0, 100, 40)
    y = 10.0 - 0.02 * x + rng.normal(0, 0.3, x.size)
    fit = _line(x, y)
    assert fit.value("b") == 0.0 and math.isnan(fit.params[1].stderr)
    assert fit.value("a") == pytest.approx(y.mean())  # the simpler model: a constant
    (held,) = fit.fallbacks
    assert held.parameter == "b" and held.unconstrained < 0 and held.held_at == 0
    (line,) = fallback_lines(fit.fallbacks)
    assert line.startswith("line: the data cannot support b (unconstrained -0.0") and "b = 0" in line


def _physical(curve) -> None:
    for n, ms in curve.verify_ms_by_tokens.items():
        slope = (curve.slopes_by_tokens or {}).get(n, curve.slope_ms_per_token)
        assert slope >= 0, (n, slope)
        assert ms - slope * curve.ctx_ref > 0, n  # positive down to context 0


@pytest.mark.parametrize("slopes", ["linear", "per_n", "shared"])
def test_a_busy_machine_gives_non_negative_context_costs_and_says_which_it_held(noisy_run, slopes):
    curve = target_curve(pd.read_csv(noisy_run / "cost_target.csv"), slopes)
    _physical(curve)
    assert curve.fit.fallbacks, "the busy machine's negative slope must be said, not silently clipped"
    assert all(f.unconstrained is not None and f.held_at == 0 for f in curve.fit.fallbacks if "slope" in f.parameter
               or "per_context" in f.parameter)


def test_the_committed_default_job_fits_non_negative_context_costs(default_run):
    # unbounded, its n = 1 forward got -0.0166 ms per context token (s_0 = -0.021)
    curve = target_curve(pd.read_csv(default_run / "cost_target.csv"))
    _physical(curve)


def test_one_timed_context_is_a_stated_flat_model():
    cd = pd.DataFrame({"draft": "d", "context_tokens": 100, "repeat": range(5), "ms": [1.0, 1.1, 0.9, 1.0, 1.05]})
    fit, _ = fit_draft(cd, ctx_ref=100.0, label="draft 'd' step")
    assert fit.value("draft_step_ms") == pytest.approx(1.0)
    (held,) = fit.fallbacks
    assert held.unconstrained is None and "one context (100 tokens)" in held.why and "flat" in held.model


def test_a_draft_step_is_positive_at_every_context(one_prompt_run):
    # two timed contexts: the unbounded line reached -0.094 ms at context 0
    fit, _ = fit_draft(pd.read_csv(one_prompt_run / "cost_draft.csv"), ctx_ref=196.0)
    assert fit.value("draft_step_ms") - fit.value("draft_ms_per_context_token") * 196.0 >= MIN_STEP_MS * 0.999
    assert fit.value("draft_ms_per_context_token") >= 0


def test_the_cost_model_is_physical_and_marks_each_fallback(noisy_run):
    rounds = pd.DataFrame({"overhead_ms": [-0.5, -0.2, 0.1], "draft_ms": 1.0, "verify_ms": 50.0,
                           "context_tokens": 100, "drafted": 2})
    fit = fit_cost("ngram:3", pd.read_csv(noisy_run / "cost_target.csv"), pd.read_csv(noisy_run / "cost_draft.csv"),
                   rounds, pd.DataFrame(), use_in_loop_scales=False)
    model = fit.model
    assert isinstance(model, TabulatedCost)
    check_physical(model.describe())  # what python -m sim will check when it reads the file
    meta = model.metadata
    assert meta["fit"].startswith("bounded least squares")
    marked = {(f["fit"], f["parameter"]) for f in meta["fit_fallbacks"]}
    assert ("target forward", "target_ms_per_context_token_base") in marked
    assert ("round overhead", "round_overhead_ms") in marked and model.round_overhead_ms_base == 0.0
    assert len([n for n in fit.notes if n.startswith("target forward: the data cannot support")]) == 1
