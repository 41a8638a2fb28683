"""The statistics of a measured cell: one speedup estimator, its CI (Fieller), noise flags, honest summaries.

Torch-free (numpy + scipy), so ``calibrate`` and ``reports`` can reuse it on files.

**The speedup estimator** (Spec-Bench's, used everywhere in this project):
the ratio of the mean tokens/s of the method to the mean tokens/s of the
baseline, each mean taken over the cell's (prompt, repeat) generations::

    speedup = mean_{p,r}(tps_method[p, r]) / mean_{p,r}(tps_base[p, r])

**Its 95% CI:** Fieller's interval for a ratio of paired means, with
Student's t at n − 1 degrees of freedom (exact for normal pairs; Kalibera &
Jones, "Rigorous benchmarking in reasonable time", recommend it or the
bootstrap for ratios of means). The baseline and the method of one prompt
in one repeat are a pair, so their covariance enters. It replaced a paired
BCa bootstrap (``scipy.stats.bootstrap``) because at this project's sample
sizes the bootstrap's interval is too narrow: on seeded synthetic cells with
a known ratio it covered the truth 82% of the time at 4 pairs (the default
job's 2 prompts × 2 repeats), 87% at 6, 90% at 12 and 94% at 24, where
Fieller's covered 95–96% at every n (``python benchmarks/ci_coverage.py``,
``results/ci-coverage.json``; ``tests/measure/test_measure_stats.py`` checks the
rate at 4 and 24 pairs). Where Fieller's set is unbounded or reaches 0 or below (the
pairs vary too much to bound a positive ratio at 95%), there is no interval, and
:attr:`Estimate.note` says why.

**Positive quantities stay positive.** A mean tokens/s (or a latency) gets
its interval on the log scale: ``mean · exp(± t · s / (mean · √n))``, the
delta-method standard error of ``log(mean)`` with Student's t at n − 1
degrees of freedom. To first order it is Student's t interval (at this
project's 8% spread and 6 visits the two differ by < 0.1%), but it never
reaches 0: Student's t at 2 or 3 samples (t = 12.7, 4.3) went below zero on
a busy machine (``17.59 [-17.20, 52.38]`` tokens/s, issue #28). On seeded
gamma- and lognormal-distributed samples it covers the true mean 94–95% of
the time at a spread of 8–30% for 2 to 12 samples (Student's t: 94–95%, but
below zero in 17% of the 2-sample intervals even at 8%), and 92–95% at a
spread of 80% where Student's t covers 89–93%
(``tests/measure/test_measure_stats.py`` checks the rates). Fewer than 2 samples:
no interval, and the note says "too few samples". All closed forms: no
resampling, no seed.

**Noise:** a cell is ``unstable`` when its baseline tokens/s (in the order
the generations ran, relative to each prompt's mean) has a coefficient of
variation above ``cv_threshold`` or drifts from its first third to its last
third by more than ``drift_threshold`` (relative to the mean). The reason is
said in words. When the sweep interleaves its cells, each cell's visits span
the whole run, so the baseline is first divided by the machine's pace in
each pass (:func:`normalise_by_pace`): a machine drifting by 20% over ten
minutes, which pairing cancels, flags nothing; a disturbance of some
visits does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

#: Confidence level of every interval in the project.
CONFIDENCE = 0.95
#: Default noise thresholds (relative): baseline CV and start-to-end drift of a cell. Each is a statistic of
#: a few visits (6 in the default run) and so noisy itself: with the VM's ordinary noise (one baseline
#: generation varies ~8% around its pace) a drift between two thirds of 2 values each is ~N(0, 8%), so a 10%
#: drift threshold fires on 21% of quiet cells and a 10% CV one on 17% (6 values: P(χ²₅ > 5·(10/8)²)); at
#: 10% / 10% they would flag 21 of the 48 cells of eight quiet default runs (interleaved-c … -j in
#: results/2026-11-24-readme-evidence.md §3.2). At 15% / 20% (1.9 and 2.5 times that σ; 0.4% and 1.2% by the same arithmetic) they flag 3 of 48, and
#: still 4 of 6 cells in each of the two runs with a CPU hog beside them (-hog, -hog2: CV up to 38%, drift up
#: to 40%). The price: on seeded synthetic cells (8% noise) one visit slowed by 35% is flagged 80% of the
#: time (10% / 10%: 99.8%), two in a row 99%; tests/measure/test_measure_stats.py checks these rates.
CV_THRESHOLD = 0.15
DRIFT_THRESHOLD = 0.20


@dataclass(frozen=True)
class Estimate:
    """A point value with its 95% confidence interval (``lo``/``hi`` None when not computable; ``note`` then says
    why in words, e.g. "too few samples for an interval (1 sample)")."""

    value: float | None
    lo: float | None
    hi: float | None
    note: str = ""

    def contains(self, x: float) -> bool | None:
        """Whether ``x`` lies inside the interval (None without one)."""
        if self.lo is None or self.hi is None:
            return None
        return self.lo <= x <= self.hi

    def as_text(self, nd: int = 2) -> str:
        """``1.12 [1.05, 1.20]``; ``1.12 (too few samples for an interval (1 sample))`` without one; ``-`` when
        no value."""
        if self.value is None:
            return "-"
        if self.lo is None or self.hi is None:
            return f"{self.value:.{nd}f}" + (f" ({self.note})" if self.note else "")
        return f"{self.value:.{nd}f} [{self.lo:.{nd}f}, {self.hi:.{nd}f}]"


def too_few(n: int, unit: str = "sample") -> str:
    """The plain reason there is no interval for ``n`` < 2 values: ``too few samples for an interval (1 sample)``."""
    return f"too few {unit}s for an interval ({n} {unit}{'' if n == 1 else 's'})"


#: Why a ratio of two positive means has no 95% interval although it has 2 or more pairs.
TOO_NOISY = "too noisy for an interval: the pairs vary too much to bound the ratio above 0 at 95%"


@dataclass(frozen=True)
class Stability:
    """Whether a cell's baseline was steady enough to trust its timings."""

    unstable: bool
    cv: float | None
    drift: float | None
    reason: str


def _finite(xs: Sequence[float]) -> np.ndarray:
    a = np.asarray([float(x) for x in xs], dtype=float)
    return a


def ratio_of_means(base: np.ndarray, method: np.ndarray, axis: int = -1) -> np.ndarray:
    """The speedup estimator: ``mean(method) / mean(base)`` along ``axis``."""
    return np.mean(method, axis=axis) / np.mean(base, axis=axis)


def _student_t(n: int, confidence: float = CONFIDENCE) -> float:
    """The two-sided ``confidence`` quantile of Student's t for a sample of ``n`` (n − 1 degrees of freedom)."""
    from scipy import stats

    return float(stats.t.ppf(0.5 + confidence / 2, n - 1))


def fieller_ratio(base: np.ndarray, method: np.ndarray,
                  confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Fieller's ``confidence`` interval for ``mean(method) / mean(base)`` over paired samples.

    The set of R with ``(m̄ − R b̄)² ≤ t² · Var(m̄ − R b̄)``, a quadratic in R, with Student's t at
    n − 1 degrees of freedom and the pairs' sample covariance. None when n < 2 or when the interval is
    unbounded (the baseline mean is not distinguishable from 0).
    """
    n = len(base)
    if n < 2:
        return None
    t = _student_t(n, confidence)
    mb, mm = float(base.mean()), float(method.mean())
    cov = np.cov(np.vstack([method, base]), ddof=1) / n  # covariance of the two means
    smm, smb, sbb = float(cov[0, 0]), float(cov[0, 1]), float(cov[1, 1])
    a = mb * mb - t * t * sbb
    b = -2.0 * (mm * mb - t * t * smb)
    c = mm * mm - t * t * smm
    disc = b * b - 4.0 * a * c
    if disc < 0 and disc > -1e-12 * b * b:
        disc = 0.0  # rounding of an exactly degenerate sample (no spread): the interval is the point
    if a <= 0 or disc < 0:
        return None
    root = math.sqrt(disc)
    return (-b - root) / (2.0 * a), (-b + root) / (2.0 * a)


def speedup_ci(base_tps: Sequence[float], method_tps: Sequence[float]) -> Estimate:
    """Speedup (ratio of mean tokens/s) with Fieller's paired 95% CI.

    ``base_tps[i]`` and ``method_tps[i]`` belong to the same (prompt, repeat);
    pairs where either is missing (NaN) are dropped.
    """
    b, m = _finite(base_tps), _finite(method_tps)
    if b.shape != m.shape:
        raise ValueError(f"paired samples differ in length: {b.shape[0]} baseline vs {m.shape[0]} method")
    ok = np.isfinite(b) & np.isfinite(m) & (b > 0)
    b, m = b[ok], m[ok]
    if not len(b):
        return Estimate(None, None, None)
    value = float(ratio_of_means(b, m))
    if len(b) < 2:
        return Estimate(value, None, None, too_few(len(b), "pair"))
    ci = fieller_ratio(b, m)
    if ci is None or ci[0] <= 0:  # unbounded, or reaching a ratio <= 0 that positive speeds cannot have
        return Estimate(value, None, None, TOO_NOISY)
    return Estimate(value, *ci)


def mean_ci(values: Sequence[float]) -> Estimate:
    """Mean of a positive quantity (tokens/s, a latency) with its 95% CI on the log scale (NaNs dropped).

    ``mean · exp(± t · s / (mean · √n))`` (module docstring): always inside (0, ∞). Fewer than 2 values, or
    a value <= 0 (not a positive quantity): no interval, with the reason in :attr:`Estimate.note`.
    """
    a = _finite(values)
    a = a[np.isfinite(a)]
    if not len(a):
        return Estimate(None, None, None)
    mean = float(a.mean())
    if len(a) < 2:
        return Estimate(mean, None, None, too_few(len(a)))
    if (a <= 0).any():
        return Estimate(mean, None, None, f"a value <= 0 ({float(a.min()):g}) among the samples: no interval on "
                                          "the log scale")
    half_log = _student_t(len(a)) * float(a.std(ddof=1)) / (mean * math.sqrt(len(a)))
    return Estimate(mean, mean * math.exp(-half_log), mean * math.exp(half_log))


def stability(base_tps_in_order: Sequence[float], cv_threshold: float = CV_THRESHOLD,
              drift_threshold: float = DRIFT_THRESHOLD, what: str = "baseline") -> Stability:
    """Flag a baseline series (in the order it was measured) that varies or drifts too much.

    Prompts differ in length and content, so the series should be one value
    per (prompt, repeat) *normalised per prompt* (see :func:`normalise_per_prompt`);
    raw values work for a single prompt.
    """
    a = _finite(base_tps_in_order)
    a = a[np.isfinite(a)]
    if len(a) < 2 or a.mean() <= 0:
        return Stability(False, None, None, "")
    mean = float(a.mean())
    cv = float(a.std(ddof=1) / mean)
    third = max(1, len(a) // 3)
    drift = float(abs(a[-third:].mean() - a[:third].mean()) / mean) if len(a) >= 3 else 0.0
    reasons = []
    if cv > cv_threshold:
        reasons.append(f"{what} varied {_over(cv, cv_threshold)} (threshold {100 * cv_threshold:.0f}%)")
    if drift > drift_threshold:
        reasons.append(f"{what} drifted {_over(drift, drift_threshold)} from start to end (threshold "
                       f"{100 * drift_threshold:.0f}%)")
    return Stability(bool(reasons), cv, drift, "; ".join(reasons))


def _over(value: float, threshold: float) -> str:
    """``value`` as a percentage, with a decimal when whole percents would not show it above ``threshold``."""
    text = f"{100 * value:.0f}%"
    return text if text != f"{100 * threshold:.0f}%" else f"{100 * value:.1f}%"


def normalise_per_prompt(prompt_ids: Sequence[str], values: Sequence[float]) -> list[float]:
    """Each value divided by the mean of its prompt's values (so prompts of different speed compare)."""
    v = _finite(values)
    ids = list(prompt_ids)
    means: dict[str, float] = {}
    for p in set(ids):
        sel = np.array([i == p for i in ids])
        vals = v[sel & np.isfinite(v)]
        means[p] = float(vals.mean()) if len(vals) else float("nan")
    return [float(x) / means[p] if means[p] and math.isfinite(means[p]) else float("nan")
            for p, x in zip(ids, v)]


def normalise_by_pace(series: Mapping[str, tuple[Sequence[str], Sequence[int], Sequence[float]]]
                      ) -> dict[str, list[float]]:
    """Baselines of cells measured interleaved, each relative to its prompt and to the machine's pace then.

    ``series`` maps a cell to its visits' (prompt ids, passes, baseline tokens/s),
    in measured order. A value is divided by its prompt's mean over every cell
    (cells of one domain share prompts, and a baseline generation does the same
    work whatever the draft) and by the mean of the prompt-normalised values of
    its pass (the pace of the machine while that pass ran). A machine that
    slows or speeds up between passes — harmless to a speedup, whose baseline
    and method are measured back to back — then leaves the values flat; a
    visit disturbed on its own (a process competing for a core for a while)
    stands out.
    """
    cells = list(series)
    flat = normalise_per_prompt([p for c in cells for p in series[c][0]],
                                [v for c in cells for v in series[c][2]])  # prompts' means over every cell
    passes = [int(r) for c in cells for r in series[c][1]]
    by_pass: dict[int, list[float]] = {}
    for r, v in zip(passes, flat):
        if math.isfinite(v):
            by_pass.setdefault(r, []).append(v)
    pace = {r: float(np.mean(v)) for r, v in by_pass.items()}
    normed = [v / pace[r] if math.isfinite(v) and pace.get(r) else float("nan") for r, v in zip(passes, flat)]
    out: dict[str, list[float]] = {}
    i = 0
    for c in cells:
        n = len(series[c][2])
        out[c] = normed[i:i + n]
        i += n
    return out


def geomean_ci(estimates: Sequence[Estimate]) -> Estimate:
    """Geometric mean of cell speedups with a 95% CI from the cells' own CIs.

    Each cell's log-speedup standard error is taken from its CI
    (``(log hi − log lo) / (2 · 1.96)``); the geometric mean's is
    ``sqrt(Σ se²) / n`` (cells measured independently). Cells without a CI
    count in the value but make the interval unknown.
    """
    vals = [(e.value, e.lo, e.hi) for e in estimates if e.value is not None and e.value > 0]
    if not vals:
        return Estimate(None, None, None)
    logs = np.log([v for v, _, _ in vals])
    g = float(np.exp(logs.mean()))
    cis = [(lo, hi) for _, lo, hi in vals if lo is not None and hi is not None and lo > 0]
    if len(cis) < len(vals):
        return Estimate(g, None, None, "a cell without an interval")
    se = np.array([(math.log(hi) - math.log(lo)) / (2 * 1.959964) for lo, hi in cis])
    half = 1.959964 * float(np.sqrt((se ** 2).sum())) / len(vals)
    return Estimate(g, float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half)))


def overlaps(a: Estimate, b: Estimate) -> bool | None:
    """Whether two CIs overlap (None when either is missing)."""
    if a.lo is None or a.hi is None or b.lo is None or b.hi is None:
        return None
    return not (a.hi < b.lo or b.hi < a.lo)
