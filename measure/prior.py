"""The simulator as a prior for a race (``--until-decided --prior CALIBRATION``): measure first the candidates the
prediction cannot separate, check the others at the end, and keep the race's stated error rate.

Torch-free, in the run-format layer next to :mod:`measure.racing`, whose races it runs.

**The prior** (:func:`load_prior`, :func:`plan_group`). Before the first pass, every candidate of a race group
(a draft at a fixed γ, in one domain at one temperature) gets the speedup a calibration predicts for it:
``speedup_curves.csv`` of ``python -m calibrate`` (the calibration's fitted step costs and that draft's acceptance
in that domain, at γ = 1..10), by the prediction method with the smallest held-out error. Its uncertainty ``u`` is
that method's *largest* held-out error of a speedup (``predictions.csv``, split ``held_out``): the prior claims
each true speedup lies within ``predicted · (1 ± u)``. *off* (plain decoding) is predicted exactly 1. A candidate
it cannot predict (another draft, a γ policy that is not fixed, γ > 10, a temperature the calibration did not
measure, a head K) is not deferred. The predicted leader is the highest prediction; a candidate ``j`` is
**deferred** when ``predicted_j · (1 + u) < predicted_leader · (1 − u)`` (*off* never is: it costs nothing).

**The rule** (:class:`GroupRace`). The race (:func:`measure.racing.look`) runs over every candidate, deferred
ones included (a deferred candidate has no units, so it is never resolved and the group is not decided while it
waits), but the first pass measures only the candidates the prior does not defer. At the first look each deferred
candidate ``j`` gets a **check**: it and that look's leader ``L`` are measured for the next ``n_j`` passes — the
fewest (at most :data:`MAX_CHECK_PASSES`) whose interval would separate the gap the prior predicts between the
measured leader and ``j``, at the largest spread of a paired difference measured so far — alongside the race
of the others. Then one interval of the mean log ratio ``j ÷ L`` over the check's units, at level
``1 − α_check``, says:

* ``j`` is **eliminated** when it lies below 0, **resolved** when its upper end is at most ``log(1 + regret)``
  (while ``L`` stays the leader), and otherwise ``j`` **joins** the race, measured every pass like any other
  candidate — the measurement contradicted the prior. A candidate whose check would need more passes (the
  measured leader does not leave the predicted gap) joins at once.

The race also compares a checked candidate at each look; it may eliminate or resolve it before its check ends.

**The error rate still holds.** The error budget ``α = 1 − confidence`` is split before the first pass, from the
prior alone: each of the ``|D|`` checks gets ``α_check = s α / |D|`` (:data:`CHECK_SHARE` ``s``), and the race's
intervals share ``(1 − s) α`` over every look and every pair of candidates (deferred ones included), a pair with a
deferred candidate weighted :data:`DEFERRED_PAIR_WEIGHT` against 1 for the others (:meth:`GroupRace.pair_alpha`):
a right prior makes those pairs rare, so the pairs the race does compare get a larger share than without a prior.
A check's units are measured after the look that planned it, and which leader, which ``j`` and how many passes
were all fixed by the units before them, so — the per-unit log ratios roughly normal, as the race assumes — a
check's interval fails to cover with probability at most ``α_check`` whatever led to it. By the union bound, all
the race's intervals and all checks cover with probability at least ``1 − α``, and on that event every
elimination is right and the decided leader is within ``regret`` of the best — **a wrong prior included**: it
costs measuring, not correctness. ``tests/measure/test_prior.py`` checks the rate on seeded races whose prior
defers the true best. With no deferred candidate the race is exactly the race without a prior.

**What the prior saved** (:meth:`GroupRace.savings`), against the counterfactual of the same race without a prior,
in which each deferred candidate would have been measured from the first pass until the race's rule (at the
level of the race *without* a prior, ``α / (looks · pairs)``) eliminated or resolved it. Its number of passes
``n_cf(j)`` is estimated from ``j``'s own units: the first ``n`` at which an interval over ``n`` passes of units
with the mean and spread of ``j``'s measured differences from the leader would have eliminated or resolved it
(all the group's passes where it never would, or where ``j`` was never measured). Then, per group,

    saved units = Σ_j (units_per_pass · n_cf(j) − units measured on j) − leader units of the extra passes

where the extra passes are the passes planned only for checks (every other challenger already resolved or
eliminated: the leader measured only because a check was still running), less those the race without a prior
would have run anyway (its passes up to ``max_j n_cf(j)``); none when the leader is *off*. A deferred candidate
that ends as the leader counts ``n_cf`` = all the group's passes. Seconds: each of those units at the mean
measured seconds of a visit of its cell. A negative saving says the prior cost time.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Hashable, Mapping, Sequence

import numpy as np
from scipy import stats as sps

from measure import racing
from toolkit.jsonio import read_json

#: The share of the race's error budget kept for the checks of deferred candidates (0 when none is deferred).
CHECK_SHARE = 0.2
#: The weight of a pair with a deferred candidate in the race's split of the rest (1 for the other pairs): such
#: a pair is raced only once its candidate joins, which a right prior makes rare.
DEFERRED_PAIR_WEIGHT = 0.25
#: The most passes a check may take; a deferred candidate whose check would need more joins the race at once.
MAX_CHECK_PASSES = 3
#: The prediction methods ``speedup_curves.csv`` holds, in order of preference at equal held-out error.
CURVE_METHODS = ("trace", "closed_form")
#: A check is sized so that its interval's half-width is the predicted gap (plus the regret) over this: the rest
#: leaves room for the noise of the check's mean (about a 90% chance to pass when the prediction is right).
CHECK_SLACK = 1.5
#: The paired spread assumed for a check's size when no measured pair has two units (log ratio per unit).
FALLBACK_SPREAD = 0.1

Units = Mapping[Hashable, float]


def _refuse(path: str, why: str) -> ValueError:
    return ValueError(f"--prior {path!r}: {why}")


@dataclass(frozen=True)
class CalibrationPrior:
    """What a calibration predicts for a race: speedups by (draft, domain, γ) of fixed γ at the calibration's one
    temperature, by ``method``, with ``uncertainty`` (relative) the method's largest held-out error."""

    path: str
    target: str
    engine: str
    method: str
    uncertainty: float
    mape: float
    temperature: float | None
    curves: Mapping[tuple[str, str, int], float]

    def predict(self, draft: str, domain: str, gamma: int | None, temperature: float,
                head_k: int | None = None) -> float | None:
        """The predicted speedup of a cell; None where the calibration cannot say (γ not fixed: ``gamma`` None)."""
        if gamma is None or head_k is not None or self.temperature is None or temperature != self.temperature:
            return None
        return self.curves.get((draft, domain, int(gamma)))

    def describe(self) -> dict:
        return {"calibration": self.path, "target": self.target, "engine": self.engine, "method": self.method,
                "uncertainty": self.uncertainty, "held_out_mape_pct": self.mape, "check_share": CHECK_SHARE}


def _read_rows(path: Path, where: str) -> list[dict]:
    if not path.is_file():
        raise _refuse(where, f"has no {path.name}; not a whole calibration (python -m calibrate RUN --out DIR)")
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _number(text: str | None) -> float | None:
    try:
        v = float(text) if text not in (None, "") else None
    except ValueError:
        return None
    return v if v is not None and math.isfinite(v) else None


def _calibration_doc(where: str) -> dict:
    path = Path(where)
    if not path.is_dir():
        raise _refuse(where, "no such directory; give a directory python -m calibrate wrote (calibration.json)")
    if not (path / "calibration.json").is_file():
        raise _refuse(where, "holds no calibration.json: not a calibration directory (python -m calibrate RUN "
                             "--out DIR writes one)")
    try:
        doc = read_json(path / "calibration.json", "calibration file")
    except ValueError as e:
        raise _refuse(where, str(e)) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("runs"), dict) or not doc["runs"] \
            or not isinstance(doc.get("mape"), dict):
        raise _refuse(where, "calibration.json has no runs or no mape: not written by python -m calibrate")
    return doc


def _target_engine(doc: dict, where: str) -> tuple[str, str]:
    """The one target and engine of the calibration's runs (a runs' target description names its engine; the
    transformers engine's does not)."""
    found = set()
    for info in doc["runs"].values():
        t = ((info or {}).get("models") or {}).get("target") or {}
        found.add((str(t.get("name")), str(t.get("engine") or "transformers")))
    if len(found) != 1:
        raise _refuse(where, f"calibrates several targets/engines ({sorted(found)}); give one of one target")
    return found.pop()


def load_prior(where: str, target: str, engine: str) -> CalibrationPrior:
    """The prior ``python -m calibrate`` wrote in ``where`` for a race of ``target`` on ``engine``; a
    ``ValueError`` line naming ``--prior`` and what is wrong (no directory, not a calibration, another target or
    engine, no held-out error)."""
    doc = _calibration_doc(where)
    cal_target, cal_engine = _target_engine(doc, where)
    if (cal_target, cal_engine) != (target, engine):
        raise _refuse(where, f"a calibration of target {cal_target!r} on engine {cal_engine!r}; this run measures "
                             f"target {target!r} on engine {engine!r}: calibrate a run of that pair")
    path = Path(where)
    held = [r for r in _read_rows(path / "predictions.csv", where) if r.get("split") == "held_out"]
    curves = _read_rows(path / "speedup_curves.csv", where)
    mape = ((doc["mape"].get("held_out") or {}) if isinstance(doc["mape"].get("held_out"), dict) else {})
    methods = [m for m in CURVE_METHODS if isinstance(mape.get(m), dict)
               and _number(str(mape[m].get("speedup_mape_pct"))) is not None
               and any(r.get("method") == m for r in curves) and any(r.get("method") == m for r in held)]
    if not methods:
        raise _refuse(where, "has no held-out error of a speedup curve's method (calibrated with --holdout none?), "
                             "so the prior has no stated uncertainty; calibrate with --holdout gamma or domain")
    method = min(methods, key=lambda m: float(mape[m]["speedup_mape_pct"]))
    errors = [e for e in (_number(r.get("ape_speedup_pct")) for r in held if r.get("method") == method)
              if e is not None]
    if not errors:
        raise _refuse(where, f"predictions.csv has no held-out ape_speedup_pct of {method}: not a whole calibration")
    temps = {_number(r.get("temperature")) for r in held}
    by: dict[tuple[str, str, int], list[float]] = {}
    for r in curves:
        v, g = _number(r.get("predicted_speedup")), _number(r.get("gamma"))
        if r.get("method") == method and v is not None and g is not None and not r.get("head_k"):
            by.setdefault((str(r.get("draft")), str(r.get("domain")), int(g)), []).append(v)
    return CalibrationPrior(str(where), cal_target, cal_engine, method,
                            max(errors) / 100.0, float(mape[method]["speedup_mape_pct"]),
                            temps.pop() if len(temps) == 1 else None,
                            {k: float(np.mean(v)) for k, v in by.items()})


@dataclass(frozen=True)
class PriorPlan:
    """A race group's prior: the predicted speedup of each candidate it can predict, the uncertainty (relative),
    the predicted leader and the candidates deferred."""

    predicted: Mapping[str, float]
    uncertainty: float
    leader: str
    deferred: tuple[str, ...]


def plan_group(predicted: Mapping[str, float | None], uncertainty: float, free: Sequence[str] = ()) -> PriorPlan:
    """Defer each predicted candidate whose optimistic prediction is below the predicted leader's pessimistic one
    (module docstring); ``free`` candidates (*off*) are never deferred."""
    known = {c: float(v) for c, v in predicted.items() if v is not None and v > 0 and math.isfinite(v)}
    if not known:
        return PriorPlan({}, uncertainty, "", ())
    leader = max(known, key=lambda c: known[c])
    floor = known[leader] * (1.0 - uncertainty) if uncertainty < 1 else 0.0
    deferred = tuple(c for c in known if c != leader and c not in free and known[c] * (1.0 + uncertainty) < floor)
    return PriorPlan(known, uncertainty, leader, deferred)


@dataclass(frozen=True)
class Check:
    """The check of a deferred candidate: planned at look ``start`` against ``leader``, its verdict at look
    ``end`` (``eliminated``, ``resolved``, ``joined``; None while it runs) with its evidence."""

    candidate: str
    leader: str
    start: int
    end: int
    verdict: str | None = None
    evidence: racing.Comparison | None = None

    def to_json(self) -> dict:
        ev = self.evidence
        return {"cell_id": self.candidate, "leader": self.leader, "start_look": self.start, "end_look": self.end,
                "verdict": self.verdict, "n_units": ev.n_units if ev else 0, "ratio": ev.ratio if ev else None,
                "ratio_lo": math.exp(ev.lo) if ev and ev.lo is not None else None,
                "ratio_hi": math.exp(ev.hi) if ev and ev.hi is not None else None}


@dataclass(frozen=True)
class GroupLook:
    """A group's race after a look: the race's state, whether it is decided, what the next pass measures."""

    state: racing.RaceState
    decided: bool
    measure_next: tuple[str, ...]

    @property
    def stop_reason(self) -> str | None:
        if self.decided:
            return "decided"
        return "out of looks" if self.state.out_of_looks else None

    def record(self) -> dict:
        """The look as ``run.json`` ``race.looks[i].groups[group]`` records it (the chain sweep's and a serving
        run's): the leader, the stop reason, the resolved candidates, every elimination with its evidence (ratio
        to the leader, the upper end of its interval) and every comparison; a candidate is named ``cell_id``."""
        st = self.state
        return {"leader": st.leader, "stop_reason": self.stop_reason, "resolved": list(st.resolved),
                "eliminated": [{"cell_id": e.candidate, "look": e.look, "ratio": e.evidence.ratio,
                                "ratio_hi": math.exp(e.evidence.hi) if e.evidence.hi is not None else None,
                                "n_units": e.evidence.n_units} for e in st.eliminated],
                "comparisons": [{"cell_id": c.challenger, "ratio": c.ratio, "n_units": c.n_units,
                                 "ratio_lo": math.exp(c.lo) if c.lo is not None else None,
                                 "ratio_hi": math.exp(c.hi) if c.hi is not None else None}
                                for c in st.comparisons]}


def _paired_spread(samples: Mapping[str, Units], leader: str, free: Sequence[str]) -> float:
    """The largest SD of a paired difference from the leader among the measured candidates (free ones only
    where no other pair has two units); :data:`FALLBACK_SPREAD` when none."""
    spreads: dict[bool, list[float]] = {True: [], False: []}
    for c, units in samples.items():
        shared = [u for u in units if u in samples[leader]]
        if c != leader and len(shared) >= 2:
            d = np.array([units[u] - samples[leader][u] for u in shared])
            spreads[c in free].append(float(d.std(ddof=1)))
    found = spreads[False] or spreads[True]
    return max(found) if found else FALLBACK_SPREAD


def passes_needed(margin: float, spread: float, alpha: float, units_per_pass: int, min_units: int,
                  most: int) -> int:
    """The fewest passes (1..``most``) whose units give a t interval at level ``1 − alpha`` of half-width at most
    ``margin`` for a spread ``spread``; ``most`` when none does."""
    for n in range(1, most + 1):
        k = n * units_per_pass
        if k >= max(min_units, 2) and float(sps.t.ppf(1 - alpha / 2, k - 1)) * spread / math.sqrt(k) <= margin:
            return n
    return most


@dataclass
class GroupRace:
    """One race group (:func:`measure.racing.look` over ``candidates``) with an optional :class:`PriorPlan`
    (module docstring); ``free`` candidates (*off* in the chain sweep: a log speedup of 0 by definition) are never
    measured, never deferred; ``paired`` ones (*off* on a server: its units pair the others') are measured while
    the group is undecided, whatever the race says of them."""

    rule: racing.RaceRule
    candidates: tuple[str, ...]
    plan: PriorPlan | None = None
    free: tuple[str, ...] = ()
    state: racing.RaceState | None = None
    checks: dict[str, Check] = field(default_factory=dict)
    joined: set[str] = field(default_factory=set)
    check_only: int = 0  # passes planned only for checks: every other challenger resolved or eliminated
    paired: tuple[str, ...] = ()

    @property
    def deferred(self) -> tuple[str, ...]:
        return self.plan.deferred if self.plan else ()

    def pair_alpha(self, challenger: str, leader: str) -> float:
        """α' of one race interval: ``(1 − s) α`` split over the pairs (weight 1, or :data:`DEFERRED_PAIR_WEIGHT`
        for a pair with a deferred candidate) and the looks."""
        k, d = len(self.candidates), len(self.deferred)
        pairs_d = d * (k - d) + d * (d - 1) // 2
        weights = k * (k - 1) // 2 - pairs_d + DEFERRED_PAIR_WEIGHT * pairs_d
        w = DEFERRED_PAIR_WEIGHT if challenger in self.deferred or leader in self.deferred else 1.0
        return (1.0 - self.rule.confidence) * (1.0 - CHECK_SHARE) * w / (weights * self.rule.max_looks)

    @property
    def alpha_check(self) -> float:
        return (1.0 - self.rule.confidence) * CHECK_SHARE / max(len(self.deferred), 1)

    def first_pass(self) -> tuple[str, ...]:
        """What the first pass measures: every candidate but the deferred and free ones."""
        return tuple(c for c in self.candidates if c not in self.deferred and c not in self.free)

    def _pending(self, samples: Mapping[str, Units]) -> list[str]:
        """Deferred candidates neither checked nor joined; one with units already (a resume under another prior)
        joins."""
        out = []
        for c in self.deferred:
            if c in self.checks or c in self.joined or self.state is None or c not in self.state.alive:
                continue
            if samples.get(c):
                self.joined.add(c)
            else:
                out.append(c)
        return out

    def _verdicts(self, samples: Mapping[str, Units], look_index: int) -> None:
        """The checks that end at this look: eliminated (kept by the race), resolved or joined; a check whose
        candidate the race eliminated first ends so."""
        assert self.state is not None
        for c, chk in list(self.checks.items()):
            if chk.verdict is not None:
                continue
            if c not in self.state.alive:
                gone = next(e for e in self.state.eliminated if e.candidate == c)
                self.checks[c] = replace(chk, verdict="eliminated", evidence=gone.evidence)
                continue
            if chk.end != look_index:
                continue
            comp = racing.compare(samples[c], samples[chk.leader], (c, chk.leader), self.alpha_check,
                                  self.rule.min_units)
            if comp.hi is not None and comp.hi < 0:
                verdict = "eliminated"
                e = racing.Elimination(c, look_index, comp)
                self.state = replace(self.state, eliminated=self.state.eliminated + (e,),
                                     alive=tuple(a for a in self.state.alive if a != c))
            elif comp.hi is not None and comp.hi <= self.rule.log_regret:
                verdict = "resolved"
            else:
                verdict = "joined"
                self.joined.add(c)
            self.checks[c] = replace(chk, verdict=verdict, evidence=comp)

    def _plan_checks(self, samples: Mapping[str, Units], look_index: int, units_per_pass: int) -> None:
        """Plan the check of every deferred candidate against this look's leader (or let it join)."""
        assert self.state is not None and self.plan is not None
        leader = self.state.leader
        measured = float(np.mean(list(samples[leader].values()))) if samples[leader] else 0.0
        spread = _paired_spread(samples, leader, self.free)
        left = self.rule.max_looks - 1 - look_index
        for c in self._pending(samples):
            gap = measured - math.log(self.plan.predicted[c])
            n = passes_needed((gap + self.rule.log_regret) / CHECK_SLACK, spread, self.alpha_check, units_per_pass,
                              self.rule.min_units, MAX_CHECK_PASSES + 1) if gap > 0 else MAX_CHECK_PASSES + 1
            if n > min(MAX_CHECK_PASSES, left):
                self.joined.add(c)
                continue
            self.checks[c] = Check(c, leader, look_index, look_index + n)

    def look(self, samples: Mapping[str, Units], look_index: int, units_per_pass: int) -> GroupLook:
        """Look at ``samples`` (every candidate, deferred ones with their units or none) after pass
        ``look_index``: the race, the checks that end, the checks to plan (at the first look), what to measure
        next."""
        full = {c: samples.get(c, {}) for c in self.candidates}
        self.state = racing.look(full, self.rule, look_index, self.state,
                                 self.pair_alpha if self.deferred else None)
        self._verdicts(full, look_index)
        if self.plan is not None and self._pending(full):
            self._plan_checks(full, look_index, units_per_pass)
        leader = self.state.leader
        open_ = self._open(leader)
        if not open_:  # decided: a check the race resolved first ends so
            for c, chk in self.checks.items():
                if chk.verdict is None:
                    ev = next((k for k in self.state.comparisons if k.challenger == c), None)
                    self.checks[c] = replace(chk, verdict="resolved", evidence=ev)
        nxt = [c for c in self.candidates if (c == leader or c in open_ or c in self.paired) and c not in self.free
               ] if open_ else []
        running = {c for c, k in self.checks.items() if k.verdict is None}
        self.check_only += bool(open_) and set(open_) <= running
        return GroupLook(self.state, not open_, tuple(nxt))

    def _open(self, leader: str) -> list[str]:
        """The live challengers not yet resolved (by the race, or by a check against this leader)."""
        assert self.state is not None
        by_check = {c for c, k in self.checks.items() if k.verdict == "resolved" and k.leader == leader}
        return [c for c in self.state.alive if c != leader and c not in self.state.resolved and c not in by_check]

    def describe(self) -> dict:
        """``run.json`` ``race.prior.groups[key]``: the predictions, the deferrals, the checks."""
        if self.plan is None:
            return {}
        return {"predicted": dict(self.plan.predicted), "predicted_leader": self.plan.leader,
                "deferred": list(self.deferred), "joined": sorted(self.joined),
                "checks": [k.to_json() for k in self.checks.values()]}

    def savings(self, samples: Mapping[str, Units], units_per_pass: int, passes: int,
                seconds_per_unit: Mapping[str, float]) -> dict:
        """What the prior saved in this group (module docstring): units and seconds, per deferred candidate, and
        the leader's extra units; ``passes``: the passes the group was measured in."""
        if not self.deferred or self.state is None:
            return {"units": 0, "seconds": 0.0, "per_candidate": {}, "leader_extra_units": 0}
        plain = self.rule.alpha_per_interval(len(self.candidates))
        leader = self.state.leader
        per, n_cf = {}, []
        for c in self.deferred:
            n = passes if c == leader else _counterfactual_passes(samples.get(c, {}), samples.get(leader, {}),
                                                                   self.rule, plain, units_per_pass, passes)
            n_cf.append(n)
            units = units_per_pass * n - len(samples.get(c, {}))
            per[c] = {"counterfactual_passes": n, "measured_units": len(samples.get(c, {})), "saved_units": units,
                      "saved_s": units * seconds_per_unit.get(c, 0.0)}
        extra = 0 if leader in self.free else units_per_pass * max(0, min(self.check_only, passes - max(n_cf)))
        units = int(sum(p["saved_units"] for p in per.values())) - extra
        secs = sum(p["saved_s"] for p in per.values()) - extra * seconds_per_unit.get(leader, 0.0)
        return {"units": units, "seconds": secs, "per_candidate": per, "leader_extra_units": extra}


def _counterfactual_passes(units: Units, leader: Units, rule: racing.RaceRule, alpha: float, units_per_pass: int,
                           passes: int) -> int:
    """``n_cf``: the passes the race without a prior would have measured a candidate with these units for."""
    shared = [u for u in units if u in leader]
    if len(shared) < 2:
        return passes
    d = np.array([units[u] - leader[u] for u in shared])
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    for n in range(1, passes + 1):
        k = n * units_per_pass
        if k < max(rule.min_units, 2):
            continue
        hi = mean + float(sps.t.ppf(1 - alpha / 2, k - 1)) * sd / math.sqrt(k)
        if hi < 0 or hi <= rule.log_regret:
            return n
    return passes


#: How ``race.prior.saved_units`` is counted (the module docstring in full), as ``run.json`` states it.
SAVINGS_DEFINITION = ("saved = units the race without the prior would have measured on the deferred candidates "
                      "(each from the first pass until the race's own interval, with the mean and spread of its "
                      "measured differences from the leader, would have eliminated or resolved it) minus the units "
                      "measured on them, minus the leader's units in passes run only for the checks; seconds at "
                      "each cell's mean measured seconds per visit")


def prior_summary(prior: CalibrationPrior, races: Mapping[str, GroupRace], samples: Mapping[str, Mapping[str, Units]],
                  units_per_pass: Mapping[str, int], visit_s: Mapping[str, float]) -> dict:
    """``run.json`` ``race.prior``: the calibration used, per group what it predicted, deferred and checked, and
    what it saved (:data:`SAVINGS_DEFINITION`), in all and per group."""
    groups, units, secs = {}, 0, 0.0
    for key, race in races.items():
        got = samples.get(key, {})
        passes = len({u[0] if isinstance(u, tuple) else u for units_ in got.values() for u in units_})
        known = [v for c, v in visit_s.items() if c in race.candidates]
        per_unit = {c: visit_s.get(c, float(np.mean(known)) if known else 0.0) for c in race.candidates}
        saved = race.savings(got, units_per_pass.get(key, 1), passes, per_unit)
        groups[key] = {**race.describe(), "saved": saved}
        units, secs = units + saved["units"], secs + saved["seconds"]
    return {**prior.describe(), "groups": groups, "saved_units": units, "saved_s": secs,
            "definition": SAVINGS_DEFINITION}


def prior_line(summary: Mapping) -> str:
    """The one line a run with a prior ends with: what it deferred and saved."""
    deferred = sum(len(g.get("deferred") or []) for g in summary["groups"].values())
    joined = sum(len(g.get("joined") or []) for g in summary["groups"].values())
    return (f"prior {summary['calibration']} ({summary['method']}, ±{100 * summary['uncertainty']:.1f}% held out): "
            f"deferred {deferred} cells ({joined} joined the race); saved {summary['saved_units']} units "
            f"(≈ {summary['saved_s']:.0f} s) against the race without it (run.json race.prior.definition)")


def simulate(true_log_means: Sequence[float], sigma: float, rule: racing.RaceRule, units_per_round: int,
             rng: np.random.Generator, predicted: Sequence[float | None] | None = None,
             uncertainty: float = 0.0, off: bool = False
             ) -> tuple[GroupRace, GroupLook, int, dict[str, dict[Hashable, float]]]:
    """A race on simulated candidates ``c0, c1, …`` (per-unit values ``N(mean_j, sigma²)``) with the prior
    ``predicted`` (speedups; None: no prior) and, with ``off``, the free candidate ``off`` (0 on every unit):
    the race, its last look, the units measured in all and the samples. Without a prior or ``off`` it measures what
    :func:`measure.racing.simulate_race` does."""
    names = tuple(f"c{i}" for i in range(len(true_log_means)))
    free = ("off",) if off else ()
    guesses = dict(zip(names, predicted)) if predicted is not None else None
    plan = plan_group({**guesses, **{f: 1.0 for f in free}}, uncertainty, free) if guesses is not None else None
    race = GroupRace(rule, names + free, plan, free)
    samples: dict[str, dict[Hashable, float]] = {c: {} for c in names + free}
    measured, unit, todo, last = 0, 0, race.first_pass(), None
    for k in range(rule.max_looks):
        for _ in range(units_per_round):
            for c in todo:
                samples[c][unit] = float(rng.normal(true_log_means[names.index(c)], sigma))
                measured += 1
            for f in free:
                samples[f][unit] = 0.0
            unit += 1
        last = race.look(samples, k, units_per_round)
        if last.stop_reason:
            break
        todo = last.measure_next
    assert last is not None
    return race, last, measured, samples
