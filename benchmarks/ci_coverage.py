"""How often does a cell's 95% speedup CI cover the true ratio? Fieller (ours) against the paired BCa bootstrap.

Seeded synthetic cells shaped like this project's measurements: n (prompt,
repeat) pairs; prompts differ in speed (each prompt twice, as with 2
repeats); a per-pair machine factor hits the baseline and the method alike
(the machine's slow and fast spells); independent noise on each side. The
true speedup is known (0.9), so coverage is counted, per n, for
:func:`measure.stats.speedup_ci` (Fieller's interval, Student t) and for the
paired BCa bootstrap of ``scipy.stats.bootstrap`` that it replaced. Also the
mean width of each. Same seed, same output.

    python benchmarks/ci_coverage.py --trials 400 --pairs 4,6,8,12,24
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np
from scipy import stats as sps

from measure import stats

TRUE_RATIO = 0.9


def _bootstrap(base: np.ndarray, method: np.ndarray, seed: int) -> tuple[float, float] | None:
    try:
        res = sps.bootstrap((base, method), stats.ratio_of_means, paired=True, vectorized=True, n_resamples=2000,
                            confidence_level=stats.CONFIDENCE, method="BCa", random_state=np.random.default_rng(seed))
    except ValueError:
        return None
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return (lo, hi) if np.isfinite(lo) and np.isfinite(hi) else None


def coverage(n: int, trials: int, seed: int) -> dict:
    """Coverage and mean width of both intervals over ``trials`` seeded cells of ``n`` pairs."""
    rng = np.random.default_rng(seed)
    hits = {"fieller": 0, "bootstrap": 0}
    width = {"fieller": 0.0, "bootstrap": 0.0}
    for i in range(trials):
        prompt = np.repeat(rng.normal(1.0, 0.05, (n + 1) // 2), 2)[:n]
        machine = rng.normal(1.0, 0.06, n)
        base = 13 * prompt * machine * (1 + rng.normal(0, 0.03, n))
        method = TRUE_RATIO * 13 * prompt * machine * (1 + rng.normal(0, 0.06, n))
        for name, ci in (("fieller", stats.fieller_ratio(base, method)), ("bootstrap", _bootstrap(base, method, i))):
            if ci is not None:
                hits[name] += ci[0] <= TRUE_RATIO <= ci[1]
                width[name] += ci[1] - ci[0]
    return {"pairs": n, "trials": trials, **{f"{k}_coverage": hits[k] / trials for k in hits},
            **{f"{k}_mean_width": width[k] / trials for k in width}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=400)
    p.add_argument("--pairs", default="4,6,8,12,24", help="comma-separated numbers of pairs per cell")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="also write the rows as JSON here")
    a = p.parse_args(argv)
    try:
        ns = [int(x) for x in a.pairs.split(",")]
    except ValueError:
        p.error(f"--pairs {a.pairs!r}: need comma-separated integers, e.g. 4,6,8")
    if a.trials < 1 or any(n < 2 for n in ns):
        p.error(f"--trials {a.trials} / --pairs {a.pairs}: need trials >= 1 and every n >= 2")
    rows = [coverage(n, a.trials, a.seed) for n in ns]
    for r in rows:
        print(f"{r['pairs']:>3} pairs: Fieller covers {100 * r['fieller_coverage']:.1f}% "
              f"(mean width {r['fieller_mean_width']:.3f}), BCa bootstrap {100 * r['bootstrap_coverage']:.1f}% "
              f"(width {r['bootstrap_mean_width']:.3f}); target 95%, {r['trials']} seeded cells")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
