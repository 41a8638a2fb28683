"""Rank laws: the acceptance of a draft's 2nd, 3rd, … candidate when only its top-1 acceptance α is known.

Presets, ``--alpha`` and an engine's per-position rates give one number per
depth: how often the draft's top candidate is the target's token. A tree also
needs how often the r-th candidate is. A rank law is the stated assumption
that fills that in, from α alone, for the top ``ranks`` candidates:

* ``power`` (the default) — the share of positions where none of the top k
  candidates is the target's token falls as a power of k whose exponent grows
  with α::

      miss(k) = (1 − α) · k^−(a + b·α),   p_0 = α,   p_r = miss(r) − miss(r + 1)

  fitted (least squares on the top-2..5 recall) to the 15 top-1..top-5
  accuracy curves of Medusa's heads on Vicuna-7B/13B/33B
  (:data:`MEDUSA_TOPK_ACCURACY`, top-1 from 0.12 to 0.60), RMSE 0.008; the
  constants below are that fit (``tests/sim/test_rank_law.py`` refits them).
  Caveats, said wherever the law is used: Medusa heads predict the token
  after next without the next one, not a draft model continuing a chain; the
  accuracies are against the training text, not a target's greedy token; and
  presets' α (0.55–0.8) reach past the fitted 0.60.
* ``geometric`` — every further candidate is right with the same α given the
  earlier ones were not: ``p_r = α (1 − α)^r``. It overstates top-2..5 recall
  on the same data (RMSE 0.17: at α = 0.56 it gives top-2 recall 0.81 where
  Medusa's head measured 0.67); kept to show how much an answer depends on
  the law.

On real drafts (SmolLM2-135M's early exits and int8 copy, teacher-forced;
``results/2026-11-24-tree-rank-law.md``) the power law's top-2..5 recall is off
by 0.01–0.07 RMSE, both ways depending on the kind of draft, which moves the
best trees' E[τ] by −6% to +8% while the tree it picks stays within 0.5% of
the best; the geometric law is off by 0.05–0.29.

Either law gives Σ_r p_r = 1 − miss(ranks) ≤ 1, ranks past ``ranks`` never
accepted (:data:`DEFAULT_RANKS` = 10: the law is extrapolated from top-5 to
top-10, beyond which no rank is counted).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from sim.trees import PositionalAcceptance

RANK_LAWS = ("power", "geometric")
DEFAULT_RANK_LAW = "power"
DEFAULT_RANKS = 10

#: the power law's exponent a + b·α (fitted to :data:`MEDUSA_TOPK_ACCURACY`; rounded to 3 decimals)
POWER_A = 0.059
POWER_B = 0.664

MEDUSA_SOURCE = ("FasterDecoding/Medusa assets/medusa_acc.csv (commit 5d374e9): train/medusa{h}_top{k} of "
                 "Medusa-1 heads on Vicuna-7B/13B/33B-v1.3")
#: top-1..top-5 accuracy of each Medusa head (``h`` = tokens ahead beyond the next, 0..4), per model
MEDUSA_TOPK_ACCURACY: dict[str, tuple[tuple[float, ...], ...]] = {
    "vicuna-7b": (
        (0.5603876709938049, 0.6717196702957153, 0.7271371483802795, 0.7599403262138367, 0.7799453139305115),
        (0.31635186076164246, 0.4235834777355194, 0.4850894510746002, 0.5282057523727417, 0.5625),
        (0.2010437250137329, 0.28789758682250977, 0.3475397527217865, 0.3834492862224579, 0.4168737530708313),
        (0.14736579358577728, 0.22502483427524567, 0.27373260259628296, 0.3108846843242645, 0.3397117257118225),
        (0.11754472553730012, 0.18663020431995392, 0.23459243774414065, 0.2721172869205475, 0.2998260259628296),
    ),
    "vicuna-13b": (
        (0.5939363837242126, 0.705268383026123, 0.7578279972076416, 0.7924950122833252, 0.8161033391952515),
        (0.3397117257118225, 0.439985066652298, 0.5068339705467224, 0.5464711785316467, 0.580268383026123),
        (0.216078519821167, 0.30852383375167847, 0.3612077236175537, 0.4029572308063507, 0.4363816976547241),
        (0.14997513592243197, 0.23173458874225616, 0.28777334094047546, 0.32343438267707825, 0.3541252315044403),
        (0.12226639688014984, 0.1957007795572281, 0.243414506316185, 0.2790755331516266, 0.3070327937602997),
    ),
    "vicuna-33b": (
        (0.6045850515365601, 0.7161898016929626, 0.7648836374282837, 0.798293948173523, 0.8222854137420654),
        (0.3557846248149872, 0.4689888060092926, 0.5287009477615356, 0.5692198276519775, 0.59605473279953),
        (0.22463124990463257, 0.31970855593681335, 0.3785320818424225, 0.4210058748722077, 0.4462413489818573),
        (0.15958771109580994, 0.24880042672157288, 0.30726853013038635, 0.34796518087387085, 0.37551093101501465),
        (0.13701795041561127, 0.20668207108974457, 0.2621290385723114, 0.29838281869888306, 0.32575085759162903),
    ),
}


@dataclass(frozen=True)
class RankLaw:
    """A named rank law and how many ranks it gives (``ranks`` ≥ 1)."""

    kind: str = DEFAULT_RANK_LAW
    ranks: int = DEFAULT_RANKS

    def __post_init__(self) -> None:
        if self.kind not in RANK_LAWS:
            raise ValueError(f"unknown rank law {self.kind!r}; valid: {', '.join(RANK_LAWS)}")
        if int(self.ranks) != self.ranks or self.ranks < 1:
            raise ValueError(f"a rank law needs ranks >= 1, got {self.ranks}")

    def probs(self, alpha: float) -> tuple[float, ...]:
        """p_0..p_{ranks−1} for top-1 acceptance ``alpha``."""
        if not (0.0 <= alpha <= 1.0) or math.isnan(alpha):
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        return tuple(float(x) for x in np.diff(1.0 - self.miss(alpha, np.arange(0, self.ranks + 1))))

    def miss(self, alpha: float, k: np.ndarray | Sequence[int]) -> np.ndarray:
        """P(none of the top ``k`` candidates is the target's token); ``k = 0`` gives 1."""
        k = np.asarray(k, dtype=float)
        if self.kind == "geometric":
            return (1.0 - alpha) ** k
        out = (1.0 - alpha) * np.power(np.maximum(k, 1.0), -(POWER_A + POWER_B * alpha))
        return np.where(k == 0, 1.0, out)

    def describe(self) -> str:
        """Where the numbers come from, in one sentence."""
        if self.kind == "geometric":
            return (f"ranks 2..{self.ranks} from the geometric rank law p_r = alpha (1 - alpha)^r (each further "
                    "candidate right with the same alpha; overstates Medusa's measured top-2..5 recall, RMSE 0.17)")
        return (f"ranks 2..{self.ranks} from the power rank law miss(k) = (1 - alpha) k^-({POWER_A} + {POWER_B} "
                f"alpha), fitted to Medusa's top-1..5 head accuracies ({MEDUSA_SOURCE}; top-1 0.12-0.60, "
                "RMSE 0.008), extrapolated past top-5 and past alpha 0.60")

    def extend(self, acceptance: PositionalAcceptance) -> PositionalAcceptance:
        """A chain acceptance (one rank per depth) with each depth's ranks from its top-1 rate."""
        if not acceptance.is_chain:
            raise ValueError("a rank law extends a top-1-only (chain) acceptance; this one already gives ranks "
                             f"{[len(r) for r in acceptance.p]} per depth")
        source = f"{acceptance.source}; {self.describe()}" if acceptance.source else self.describe()
        return PositionalAcceptance(tuple(self.probs(row[0]) for row in acceptance.p), source)


def recall_curve(alpha: float, law: RankLaw, k_max: int) -> np.ndarray:
    """Top-1..top-``k_max`` recall the law gives at top-1 ``alpha``: 1 − miss(k)."""
    return 1.0 - law.miss(alpha, np.arange(1, k_max + 1))


def fit_power_law(curves: Sequence[Sequence[float]] | None = None) -> tuple[float, float, float]:
    """Least-squares (a, b) of the power law on top-2..5 recall, and its RMSE (Medusa's curves by default)."""
    from scipy.optimize import least_squares  # imported here: only the fit needs it

    data = np.asarray(curves if curves is not None else
                      [c for model in MEDUSA_TOPK_ACCURACY.values() for c in model], dtype=float)
    alpha, k = data[:, :1], np.arange(1, data.shape[1] + 1, dtype=float)[None, :]

    def resid(x: np.ndarray) -> np.ndarray:
        return ((1.0 - (1.0 - alpha) * k ** -(x[0] + x[1] * alpha)) - data)[:, 1:].ravel()

    fit = least_squares(resid, x0=[0.1, 0.8])
    return float(fit.x[0]), float(fit.x[1]), float(np.sqrt(np.mean(fit.fun ** 2)))


__all__ = ["DEFAULT_RANKS", "DEFAULT_RANK_LAW", "MEDUSA_SOURCE", "MEDUSA_TOPK_ACCURACY", "POWER_A", "POWER_B",
           "RANK_LAWS", "RankLaw", "fit_power_law", "recall_curve"]
