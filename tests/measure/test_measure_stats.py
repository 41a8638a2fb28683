"""measure.stats on synthetic timings with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from measure import stats


@pytest.mark.parametrize("n_pairs,trials,lo,hi", [(24, 200, 0.89, 0.99), (4, 400, 0.92, 0.98)])
def test_speedup_ci_covers_the_true_ratio_at_the_stated_rate(n_pairs, trials, lo, hi):
    """Over seeded trials with a known true ratio (1.2), the 95% CI covers it about 95% of the time — also at
    the default job's 4 pairs per cell, where the paired BCa bootstrap it replaced covered about 82%."""
    rng = np.random.default_rng(0)
    true = 1.2
    covered = 0
    for _ in range(trials):
        prompt_speed = rng.uniform(15, 25, n_pairs)  # prompts differ; pairs share their prompt's speed
        base = prompt_speed * rng.normal(1, 0.06, n_pairs)
        spec = true * prompt_speed * rng.normal(1, 0.06, n_pairs)
        covered += bool(stats.speedup_ci(base, spec).contains(true))
    rate = covered / trials
    assert lo <= rate <= hi, rate


def test_mean_ci_is_on_the_log_scale():
    est = stats.mean_ci([10.0, 12.0, 11.0, 13.0])
    half = 3.182446 * np.std([10.0, 12.0, 11.0, 13.0], ddof=1) / 2  # t(0.975, 3) * s / sqrt(4)
    assert est.value == pytest.approx(11.5)
    assert est.lo == pytest.approx(11.5 * np.exp(-half / 11.5), rel=1e-5)
    assert est.hi == pytest.approx(11.5 * np.exp(half / 11.5), rel=1e-5)
    assert est.lo == pytest.approx(11.5 - half, rel=0.02)  # to first order Student's t interval
    assert stats.mean_ci([]).value is None


def test_a_positive_quantity_never_gets_an_interval_below_zero():
    """The issue's run: 3 tokens/s samples on a busy machine gave Student's t ``17.59 [-17.20, 52.38]``."""
    busy = [31.0, 2.6, 19.17]  # mean 17.59, s 14.2: t(0.975, 2) = 4.30 puts Student's lower end at -17.7
    t_lo = np.mean(busy) - 4.302653 * np.std(busy, ddof=1) / np.sqrt(3)
    assert t_lo < 0  # what the interval was
    est = stats.mean_ci(busy)
    assert 0 < est.lo < est.value < est.hi
    assert est.as_text(2).startswith("17.59 [")
    # fewer than 2 samples: no interval, and the reason in plain words
    one = stats.mean_ci([17.59])
    assert one.lo is None and one.hi is None and one.note == "too few samples for an interval (1 sample)"
    assert one.as_text(2) == "17.59 (too few samples for an interval (1 sample))"
    assert "no interval" in stats.mean_ci([0.0, 3.0]).note  # 0 is not a positive quantity's value
    for seed in range(200):  # 2 samples, any spread: never below zero
        x = np.random.default_rng(seed).gamma(1.5, 10, 2)
        assert stats.mean_ci(x).lo > 0


@pytest.mark.parametrize("n,cv,lo,hi", [(2, 0.08, 0.93, 0.97), (3, 0.3, 0.93, 0.97), (6, 0.3, 0.93, 0.97),
                                        (3, 0.8, 0.91, 0.97)])
def test_mean_ci_covers_the_true_mean_at_the_stated_rate(n, cv, lo, hi):
    """Seeded gamma-distributed samples with a known mean: the log-scale interval covers it ~95% of the time
    (2,000 trials, so ±1% of sampling error), also at 2 samples and at an 80% spread."""
    rng = np.random.default_rng(n * 100 + int(cv * 100))
    k = 1 / cv**2
    hits = sum(bool(stats.mean_ci(rng.gamma(k, 20 / k, n)).contains(20.0)) for _ in range(2000))
    assert lo <= hits / 2000 <= hi, hits / 2000


def test_speedup_is_the_ratio_of_mean_tokens_per_s():
    est = stats.speedup_ci([10, 20, 15, 12], [15, 20, 18, 14])
    assert est.value == pytest.approx(67 / 57)
    assert est.lo <= est.value <= est.hi
    # two pairs this far apart cannot bound the ratio at 95% (t = 12.7 at 1 degree of freedom): no interval
    wide = stats.speedup_ci([10, 20], [15, 20])
    assert wide.value == pytest.approx(35 / 30) and wide.lo is None and wide.hi is None
    assert wide.note == stats.TOO_NOISY


def test_a_speedup_interval_never_reaches_zero():
    """Fieller's set for a method whose mean is not distinguishable from 0 runs below 0: a positive ratio has
    no such values, so there is no interval (said), never a negative lower end."""
    base, method = [10.0, 10.5, 9.8], [1.0, 30.0, 2.0]
    raw = stats.fieller_ratio(np.array(base), np.array(method))
    assert raw is not None and raw[0] < 0  # what the interval would have been
    est = stats.speedup_ci(base, method)
    assert est.lo is None and est.note == stats.TOO_NOISY and est.value == pytest.approx(33 / 30.3)


def test_degenerate_samples():
    assert stats.speedup_ci([], []).value is None
    one = stats.speedup_ci([10.0], [12.0])
    assert one.value == pytest.approx(1.2) and one.lo is None and one.note == "too few pairs for an interval (1 pair)"
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
    assert d.unstable and "drifted" in d.reason and "threshold 20%" in d.reason
    noisy = stats.stability([20, 30, 14, 27, 18, 31])
    assert noisy.unstable and "varied" in noisy.reason
    # just over a threshold: a decimal, so the value does not read as equal to it
    just = stats.stability([1.0, 1.0, 1.0, 1.0, 1.0, 1.0], drift_threshold=0.2)
    assert not just.unstable
    over = stats.stability([0.9, 0.9, 1.0, 1.0, 1.105, 1.105])
    assert "drifted 20.5% from start to end (threshold 20%)" in over.reason


def test_default_thresholds_rarely_flag_ordinary_noise_and_catch_a_hog():
    """Seeded cells of 6 visits: ordinary noise (8% per visit, this VM's) flagged rarely at the defaults but
    often at 10% / 10%; one visit slowed by a process on the side (-35%) flagged mostly, two nearly always."""
    rng = np.random.default_rng(3)
    quiet = [rng.normal(1, 0.08, 6) for _ in range(2000)]
    flagged = np.mean([stats.stability(v).unstable for v in quiet])
    flagged_10 = np.mean([stats.stability(v, 0.10, 0.10).unstable for v in quiet])
    assert flagged < 0.04 < 0.25 < flagged_10
    for visits, rate in ((1, 0.7), (2, 0.95)):  # visits in a row under the hog
        hogged = []
        for _ in range(500):
            v = rng.normal(1, 0.08, 6)
            at = int(rng.integers(0, 7 - visits))
            v[at:at + visits] *= 0.65
            hogged.append(stats.stability(v).unstable)
        assert np.mean(hogged) > rate


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


def _interleaved(pace: list[float], hog: tuple[str, int, int] | None = None, seed: int = 0) -> dict:
    """Baselines of 4 cells (2 domains × 2 γ, 2 prompts each) visited in passes, the machine's speed per pass
    given by ``pace``; ``hog`` = (cell, pass, prompt index) slowed to 60%. 1% seeded jitter."""
    rng = np.random.default_rng(seed)
    speed = {"code/a": 14.0, "code/b": 17.0, "docs/a": 12.0, "docs/b": 15.0}
    out = {}
    for cell, dom in (("c2", "code"), ("c4", "code"), ("d2", "docs"), ("d4", "docs")):
        ids, passes, vals = [], [], []
        for r, s in enumerate(pace):
            for pi, p in enumerate((f"{dom}/a", f"{dom}/b")):
                v = speed[p] * s * (1 + 0.01 * rng.standard_normal())
                if hog == (cell, r, pi):
                    v *= 0.6
                ids.append(p), passes.append(r), vals.append(v)
        out[cell] = (ids, passes, vals)
    return out


def test_pace_normalisation_ignores_a_drifting_machine_and_flags_a_disturbed_visit():
    drifting = _interleaved([1.0, 1.15, 1.3])  # the whole machine 30% faster by the last pass
    flat = stats.normalise_by_pace(drifting)
    for cell, (ids, _, vals) in drifting.items():
        assert stats.stability(stats.normalise_per_prompt(ids, vals)).unstable  # judged raw: every cell flagged
        assert not stats.stability(flat[cell]).unstable, cell  # against the pace: none
    hogged = _interleaved([1.0, 1.15, 1.3], hog=("d2", 1, 0))
    flags = {c: stats.stability(v, what="baseline (against the pace)") for c, v in
             stats.normalise_by_pace(hogged).items()}
    assert flags["d2"].unstable and "baseline (against the pace) varied" in flags["d2"].reason
    assert not any(f.unstable for c, f in flags.items() if c != "d2")
