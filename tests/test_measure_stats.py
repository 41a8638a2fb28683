"""measure.stats on synthetic timings with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from measure import stats


def test_speedup_ci_covers_the_true_ratio_at_the_stated_rate():
    """Over seeded trials with a known true ratio (1.2), the 95% CI covers it about 95% of the time."""
    rng = np.random.default_rng(0)
    trials, n_pairs, true = 200, 24, 1.2
    covered = 0
    for i in range(trials):
        prompt_speed = rng.uniform(15, 25, n_pairs)  # prompts differ; pairs share their prompt's speed
        base = prompt_speed * rng.normal(1, 0.06, n_pairs)
        spec = true * prompt_speed * rng.normal(1, 0.06, n_pairs)
        est = stats.speedup_ci(base, spec, seed=i)
        covered += bool(est.contains(true))
    rate = covered / trials
    assert 0.89 <= rate <= 0.99, rate


def test_speedup_is_the_ratio_of_mean_tokens_per_s():
    est = stats.speedup_ci([10, 20], [15, 20], seed=0)
    assert est.value == pytest.approx(35 / 30)
    assert est.lo <= est.value <= est.hi


def test_degenerate_samples():
    assert stats.speedup_ci([], []).value is None
    one = stats.speedup_ci([10.0], [12.0])
    assert one.value == pytest.approx(1.2) and one.lo is None
    same = stats.speedup_ci([10.0, 10.0, 10.0], [12.0, 12.0, 12.0])
    assert same.lo == same.hi == pytest.approx(1.2)
    with pytest.raises(ValueError, match="paired samples differ"):
        stats.speedup_ci([1.0, 2.0], [1.0])


def test_drifting_baseline_is_flagged_and_a_steady_one_is_not():
    rng = np.random.default_rng(1)
    steady = 20 * rng.normal(1, 0.02, 12)
    drifting = np.linspace(24, 16, 12) * rng.normal(1, 0.02, 12)  # a background job starts mid-cell
    s = stats.stability(steady)
    d = stats.stability(drifting)
    assert not s.unstable and s.reason == ""
    assert d.unstable and "drifted" in d.reason and "threshold 10%" in d.reason
    noisy = stats.stability([20, 30, 14, 27, 18, 31])
    assert noisy.unstable and "varied" in noisy.reason


def test_normalise_per_prompt_removes_prompt_differences():
    vals = stats.normalise_per_prompt(["a", "b", "a", "b"], [10, 40, 10, 40])
    assert vals == [1.0, 1.0, 1.0, 1.0]
    assert not stats.stability(vals).unstable


def test_geomean_ci_and_overlap():
    a = stats.Estimate(1.2, 1.1, 1.3)
    b = stats.Estimate(0.9, 0.8, 1.0)
    g = stats.geomean_ci([a, b])
    assert g.value == pytest.approx((1.2 * 0.9) ** 0.5) and g.lo < g.value < g.hi
    assert stats.overlaps(a, b) is False and stats.overlaps(a, stats.Estimate(1.25, 1.2, 1.4)) is True
    assert stats.geomean_ci([stats.Estimate(1.1, None, None)]).lo is None
    assert a.as_text(2) == "1.20 [1.10, 1.30]"
