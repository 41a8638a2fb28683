"""Measure until the answer is known: a sequential race between candidates with a stated error rate.

Torch-free (numpy + scipy), in the run-format layer, so ``calibrate`` and ``reports`` can replay a race from its
files. The question is "which candidate (a γ, a tree, a k at one load, a draft) is best?"; the data are
per-unit values on the log scale — a unit is one (prompt, repeat) visit, or one repeat of a load, and its value
``log(method tokens/s ÷ baseline tokens/s of the same visit)`` — so that the machine's pace, which moves both
numbers of a visit alike, cancels before two candidates are compared.

**The rule** (:func:`look`). At each look, the *leader* is the candidate with the highest mean. Every other
live candidate ``j`` is compared with the leader on the units both were measured on: the paired differences
``d_u = x_j,u − x_leader,u`` give Student's t interval for the mean log ratio ``j ÷ leader``. Then

* ``j`` is **eliminated** when its interval lies below 0 (worse than the leader, beyond its interval);
* ``j`` is **resolved** when the interval's upper end is at most ``log(1 + regret)``: it cannot beat the
  leader by more than the user's threshold;
* the race is **decided** when every live challenger is resolved (or eliminated): choosing the leader then
  costs at most ``regret`` of throughput.

**The error rate.** Each interval is taken at level ``1 − α'`` with ``α' = α / (max_looks · K(K−1)/2)``
(Bonferroni over every look the race may take and every pair that may be compared, since which pair is
compared depends on the data). On the event that all those intervals cover their truth — probability at least
``1 − α`` whatever the stopping time — every elimination is right and the decided leader is within ``regret`` of
the best: **P(the decision's regret exceeds the threshold) ≤ α**. It is conservative (a Bonferroni bound);
``tests/measure/test_racing.py`` checks the rate on seeded simulated races with known answers, and that naive
unadjusted 95% looks exceed it on the same problems. It assumes roughly normal per-unit log ratios, which the
project's measured visits are (``measure/stats.py``: 6.6–8.1% spread per pair on the 2-core VM).

**With a prior** (``--prior CALIBRATION``, :mod:`measure.prior`): candidates a calibration predicts to lose
beyond its held-out error are deferred — not measured until the rest is decided, then each checked by its own
interval on fresh units (eliminated, resolved, or it joins the race). The race keeps ``(1 − s)`` of ``α`` and the
checks share ``s``, so **the same bound holds with a right or a wrong prior**; a wrong prior costs measuring only.

**What to measure next** (:meth:`RaceState.next_candidates`): the leader and the challengers not yet resolved —
the units that can still change the decision. Resolved candidates are not measured again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Hashable, Mapping, Sequence

import numpy as np

if TYPE_CHECKING:
    import argparse

#: The default family-wise confidence of a race's decision and the default regret threshold (relative).
DEFAULT_CONFIDENCE = 0.95
DEFAULT_REGRET = 0.02


def add_race_arguments(p: "argparse.ArgumentParser", until_help: str, unit: str, step: str,
                       defaults: bool = True) -> None:
    """The race's flags (``--until-decided``, ``--regret``, ``--confidence``, ``--time-budget``) on ``p``, for the
    chain sweep (``unit`` "visits", ``step`` "pass") and serving ("units", "repeat"). ``defaults=False`` leaves
    ``--regret``/``--confidence`` at None, so a caller can tell them given without ``--until-decided``."""
    from toolkit.cli import float_arg

    p.add_argument("--until-decided", action="store_true", help=until_help)
    p.add_argument("--regret", type=float_arg(0, 0.99, lo_open=True), default=DEFAULT_REGRET if defaults else None,
                   help=f"with --until-decided: the throughput a decision may leave, relative (default {DEFAULT_REGRET})")
    p.add_argument("--confidence", type=float_arg(0.5, 0.999), default=DEFAULT_CONFIDENCE if defaults else None,
                   help=f"with --until-decided: the decisions' family-wise confidence (default {DEFAULT_CONFIDENCE})")
    p.add_argument("--time-budget", type=float_arg(0, 1e7, lo_open=True), default=None, metavar="SECONDS",
                   help=f"with --until-decided: measure no more {unit} after this many seconds of measuring (the "
                        f"first {step} always completes)")


@dataclass(frozen=True)
class RaceRule:
    """How sure the decision must be: its family-wise ``confidence``, the ``regret`` (relative throughput) the user
    accepts, the ``max_looks`` the error budget is split over and the fewest ``min_units`` per comparison."""

    confidence: float = DEFAULT_CONFIDENCE
    regret: float = DEFAULT_REGRET
    max_looks: int = 10
    min_units: int = 3

    def __post_init__(self) -> None:
        if not 0.5 <= self.confidence < 1:
            raise ValueError(f"confidence must be in [0.5, 1), got {self.confidence}")
        if not 0 < self.regret < 1:
            raise ValueError(f"regret must be in (0, 1), got {self.regret}")
        if self.max_looks < 1:
            raise ValueError(f"max_looks must be >= 1, got {self.max_looks}")
        if self.min_units < 2:
            raise ValueError(f"min_units must be >= 2 (an interval needs two units), got {self.min_units}")

    def alpha_per_interval(self, n_candidates: int) -> float:
        """α' of one interval: the error budget ``1 − confidence`` split over every look and every pair."""
        pairs = max(n_candidates * (n_candidates - 1) // 2, 1)
        return (1.0 - self.confidence) / (self.max_looks * pairs)

    @property
    def log_regret(self) -> float:
        return math.log1p(self.regret)


@dataclass(frozen=True)
class Comparison:
    """A challenger against the leader at one look: the mean log ratio ``challenger ÷ leader`` over ``n_units``
    shared units and its interval (``lo``/``hi`` None with fewer than the rule's ``min_units``)."""

    challenger: str
    leader: str
    n_units: int
    log_ratio: float
    lo: float | None
    hi: float | None

    @property
    def ratio(self) -> float:
        return math.exp(self.log_ratio)


@dataclass(frozen=True)
class Elimination:
    """A candidate dropped at ``look``: its comparison with the leader then, the evidence."""

    candidate: str
    look: int
    evidence: Comparison


@dataclass(frozen=True)
class RaceState:
    """Where a race stands after a look."""

    look: int
    leader: str
    alive: tuple[str, ...]
    comparisons: tuple[Comparison, ...]
    eliminated: tuple[Elimination, ...]
    resolved: tuple[str, ...]
    rule: RaceRule = field(default_factory=RaceRule)

    @property
    def decided(self) -> bool:
        """Every live challenger resolved: the leader's regret is below the rule's threshold at its confidence."""
        return all(c in self.resolved for c in self.alive if c != self.leader)

    @property
    def out_of_looks(self) -> bool:
        return self.look + 1 >= self.rule.max_looks

    def next_candidates(self) -> tuple[str, ...]:
        """What the next round measures: the leader and every live challenger not yet resolved."""
        return tuple(c for c in self.alive if c == self.leader or c not in self.resolved)

    def stop_reason(self) -> str | None:
        """``decided`` or ``out of looks``; None while the race goes on."""
        if self.decided:
            return "decided"
        if self.out_of_looks:
            return "out of looks"
        return None


def compare(challenger: Mapping[Hashable, float], leader: Mapping[Hashable, float], names: tuple[str, str],
            alpha: float, min_units: int) -> Comparison:
    """``challenger ÷ leader`` on their shared units: the mean log ratio and its Student t interval at level
    ``1 − alpha`` (none with fewer than ``min_units``)."""
    shared = [u for u in challenger if u in leader]
    d = np.array([challenger[u] - leader[u] for u in shared], dtype=float)
    n = int(d.size)
    mean = float(d.mean()) if n else 0.0
    if n < min_units:
        return Comparison(names[0], names[1], n, mean, None, None)
    sd = float(d.std(ddof=1))
    from scipy import stats as sps  # 0.5 s to import: only when a race compares

    half = float(sps.t.ppf(1.0 - alpha / 2.0, n - 1)) * sd / math.sqrt(n)
    return Comparison(names[0], names[1], n, mean, mean - half, mean + half)


def look(samples: Mapping[str, Mapping[Hashable, float]], rule: RaceRule, look_index: int,
         previous: RaceState | None = None, pair_alpha: Callable[[str, str], float] | None = None) -> RaceState:
    """One look of the race over ``samples`` (candidate → unit → log value): the leader, the comparisons, the
    eliminations (kept from ``previous``) and which challengers are resolved. ``pair_alpha(challenger, leader)``:
    the α' of that pair's interval where the error budget is not split evenly (:mod:`measure.prior`); default
    the rule's :meth:`RaceRule.alpha_per_interval` for every pair."""
    if not samples:
        raise ValueError("a race needs at least one candidate")
    if not 0 <= look_index < rule.max_looks:
        raise ValueError(f"look {look_index} is outside the rule's {rule.max_looks} looks")
    gone = {e.candidate for e in previous.eliminated} if previous else set()
    alive = tuple(c for c in samples if c not in gone)
    means = {c: float(np.mean(list(samples[c].values()))) if samples[c] else -math.inf for c in alive}
    leader = max(alive, key=lambda c: means[c])
    alpha = rule.alpha_per_interval(len(samples))
    comps, eliminated, resolved = [], list(previous.eliminated) if previous else [], []
    for c in alive:
        if c == leader:
            continue
        comp = compare(samples[c], samples[leader], (c, leader), pair_alpha(c, leader) if pair_alpha else alpha,
                       rule.min_units)
        comps.append(comp)
        if comp.hi is None:
            continue
        if comp.hi < 0.0:
            eliminated.append(Elimination(c, look_index, comp))
        elif comp.hi <= rule.log_regret:
            resolved.append(c)
    out = {e.candidate for e in eliminated}
    return RaceState(look_index, leader, tuple(c for c in alive if c not in out), tuple(comps), tuple(eliminated),
                     tuple(resolved), rule)


def simulate_race(true_log_means: Sequence[float], sigma: float, rule: RaceRule, units_per_round: int,
                  rng: np.random.Generator) -> tuple[RaceState, int]:
    """A race on simulated candidates with known means (per-unit values ``N(mean_j, sigma²)``, a unit shared by
    the candidates measured in its round): the final state and the units measured in all. For tests and the
    benchmark's error-rate check."""
    names = [f"c{i}" for i in range(len(true_log_means))]
    samples: dict[str, dict[Hashable, float]] = {c: {} for c in names}
    measured, unit, state = 0, 0, None
    todo: tuple[str, ...] = tuple(names)
    for k in range(rule.max_looks):
        for _ in range(units_per_round):
            for c in todo:
                samples[c][unit] = float(rng.normal(true_log_means[names.index(c)], sigma))
                measured += 1
            unit += 1
        state = look(samples, rule, k, state)
        if state.stop_reason():
            break
        todo = state.next_candidates()
    assert state is not None
    return state, measured
