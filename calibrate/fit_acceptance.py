"""Fit acceptance models to measured rounds (``rounds.csv``) and traces (``traces.csv``).

Every round at draft length γ that accepted ``a`` tokens is a run of
Bernoulli trials: positions 1..a accepted and, if ``a < γ``, position a+1
rejected; positions past a+1 were never judged. Hence, by position i,
``n_i = #(rounds with accepted ≥ i−1 and γ ≥ i)`` trials and
``k_i = #(accepted ≥ i)`` successes (``measure.analysis.per_position_acceptance``).

Models fitted by maximum likelihood on those counts:

* ``iid`` — α_i = α (1 parameter); α̂ = Σk / Σn, standard error √(α(1−α)/Σn).
* ``geometric`` — α_i = a · r^(i−1) (2 parameters).
* ``power_law`` — α_i = a · i^(−b) (2 parameters).
* ``per_position`` — a free α_i per measured position (one parameter each),
  reported with 95% Wilson score intervals.

**Criterion:** the model with the lowest BIC = k ln(N) − 2 ln L (N = Σ n_i
Bernoulli trials) is the one used for prediction ("chosen"); the decay
family reported is the better of geometric and power law by the same BIC.
AIC = 2k − 2 ln L is reported too. BIC rather than AIC because under greedy
decoding the cells at different γ replay the *same* prompts and match flags,
so the per-position counts of a group are not independent draws and AIC's
light penalty picks the free per-position model on noise (seen on synthetic
i.i.d. runs); BIC's ln N penalty does not. Fitted α_i are clipped to
[1e-6, 1 − 1e-6] inside the likelihood.

**Drafts that may propose nothing** (lookup / n-gram): positions a round
did not draft are not trials, and ``p_propose`` = share of rounds that drafted
at least one token. When it is below 1 the model used is
:class:`sim.acceptance.ProposalAcceptance` (propose γ tokens with probability
``p_propose`` and accept them by the chosen family, else draft nothing). The
share is a per-round figure measured at the training γ: it drifts with γ
(a longer γ consumes a matching stretch in fewer rounds), which the
run-trace replay below does not suffer from.

Trace-driven prediction rebuilds :class:`sim.acceptance.TraceAcceptance` from
the recorded per-position match flags (greedy) or Σ min(p, q) values
(sampling) and replays them round by round at any γ. Greedy runs that
record ``proposed``/``accept_run`` per position give
:class:`sim.acceptance.RunTraceAcceptance` instead, whose replay is exact for
lookup drafts too (it knows where the draft proposes nothing or a short
continuation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import optimize

from measure.analysis import TRACE_GAMMA_MAX, drafted_counts, per_position_acceptance
from sim.acceptance import (AcceptanceModel, IIDAcceptance, PerPositionAcceptance, ProposalAcceptance,
                            RunTraceAcceptance, TraceAcceptance)

#: How many positions a fitted parametric model is written out for (the last repeats beyond).
MODEL_POSITIONS = 16
_EPS = 1e-6
FAMILIES = ("iid", "geometric", "power_law", "per_position")


def wilson_ci(k: np.ndarray, n: np.ndarray, z: float = 1.96) -> tuple[np.ndarray, np.ndarray]:
    """95% Wilson score interval for k successes out of n (NaN where n = 0)."""
    k = np.asarray(k, dtype=float)
    n = np.asarray(n, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = k / n
        den = 1 + z**2 / n
        centre = (p + z**2 / (2 * n)) / den
        half = z * np.sqrt(p * (1 - p) / n + z**2 / (4 * n**2)) / den
    return np.where(n > 0, centre - half, np.nan), np.where(n > 0, centre + half, np.nan)


def _loglik(alphas: np.ndarray, k: np.ndarray, n: np.ndarray) -> float:
    a = np.clip(alphas, _EPS, 1 - _EPS)
    return float(np.sum(k * np.log(a) + (n - k) * np.log1p(-a)))


def _family_alphas(name: str, theta: np.ndarray, positions: np.ndarray) -> np.ndarray:
    if name == "geometric":
        return theta[0] * theta[1] ** (positions - 1)
    if name == "power_law":
        return theta[0] * positions ** (-theta[1])
    raise ValueError(f"unknown decay family {name!r}; valid: geometric, power_law")


@dataclass(frozen=True)
class FamilyFit:
    """One acceptance model fitted by maximum likelihood."""

    name: str
    params: dict
    n_params: int
    loglik: float
    aic: float
    bic: float
    alphas: tuple[float, ...]  # α_1..α_MODEL_POSITIONS

    def model(self) -> AcceptanceModel:
        if self.name == "iid":
            return IIDAcceptance(self.params["alpha"])
        return PerPositionAcceptance(self.alphas)

    def as_dict(self) -> dict:
        return {"name": self.name, "params": self.params, "n_params": self.n_params, "loglik": self.loglik,
                "aic": self.aic, "bic": self.bic, "alphas": list(self.alphas)}


@dataclass(frozen=True)
class AcceptanceFit:
    """Acceptance of one group of rounds (e.g. one draft × domain × temperature)."""

    key: str
    n_rounds: int
    alpha_iid: float
    alpha_iid_stderr: float
    per_position: pd.DataFrame  # position, n, accepted, alpha, ci_low, ci_high
    families: tuple[FamilyFit, ...]
    chosen: str
    decay_family: str
    p_propose: float = 1.0  # share of rounds that drafted at least one token

    def family(self, name: str) -> FamilyFit:
        for f in self.families:
            if f.name == name:
                return f
        raise KeyError(name)

    def model(self) -> AcceptanceModel:
        """The BIC-chosen model (wrapped in the proposal share when some rounds drafted nothing)."""
        inner = self.family(self.chosen).model()
        return inner if self.p_propose >= 1.0 else ProposalAcceptance(self.p_propose, inner)

    def describe_model(self) -> dict:
        """``sim.acceptance.acceptance_from_dict``-readable description of the chosen model."""
        return self.model().describe()

    def as_dict(self) -> dict:
        return {
            "key": self.key, "n_rounds": self.n_rounds, "p_propose": self.p_propose,
            "alpha_iid": self.alpha_iid, "alpha_iid_stderr": self.alpha_iid_stderr,
            "per_position": self.per_position.to_dict(orient="records"),
            "families": [f.as_dict() for f in self.families],
            "criterion": "lowest BIC = k ln(N) - 2 ln L over iid, geometric, power_law, per_position (N = trials)",
            "chosen": self.chosen, "decay_family": self.decay_family,
            "model": self.describe_model(),
        }


def fit_acceptance(rounds: pd.DataFrame, key: str = "all") -> AcceptanceFit:
    """Fit every acceptance model to ``rounds`` (columns ``gamma, accepted``)."""
    if rounds.empty:
        raise ValueError(f"no rounds to fit acceptance for {key}")
    p_propose = float((drafted_counts(rounds) > 0).mean())
    if p_propose == 0.0:
        raise ValueError(f"no round of {key} drafted a token: nothing to fit acceptance on")
    pp = per_position_acceptance(rounds)
    pp = pp[pp["n"] > 0].reset_index(drop=True)
    lo, hi = wilson_ci(pp["accepted"].to_numpy(), pp["n"].to_numpy())
    pp = pp.assign(ci_low=lo, ci_high=hi)
    pos = pp["position"].to_numpy(dtype=float)
    k = pp["accepted"].to_numpy(dtype=float)
    n = pp["n"].to_numpy(dtype=float)
    out_pos = np.arange(1, MODEL_POSITIONS + 1, dtype=float)
    fams: list[FamilyFit] = []

    a_iid = float(k.sum() / n.sum())
    se_iid = math.sqrt(a_iid * (1 - a_iid) / n.sum()) if n.sum() > 0 else float("nan")
    ll = _loglik(np.full_like(k, a_iid), k, n)
    log_n = math.log(max(n.sum(), 1.0))
    fams.append(FamilyFit("iid", {"alpha": a_iid, "alpha_stderr": se_iid}, 1, ll, 2 - 2 * ll, log_n - 2 * ll,
                          tuple([a_iid] * MODEL_POSITIONS)))

    if len(pos) >= 2:
        for name, x0, bounds, pnames in (
            ("geometric", [max(min(a_iid, 0.99), 0.01), 1.0], [(1e-4, 1.0), (1e-3, 2.0)], ("a", "r")),
            ("power_law", [max(min(a_iid, 0.99), 0.01), 0.0], [(1e-4, 1.0), (-2.0, 5.0)], ("a", "b")),
        ):
            res = optimize.minimize(lambda th: -_loglik(_family_alphas(name, th, pos), k, n), x0,
                                    method="L-BFGS-B", bounds=bounds)
            th = res.x
            ll = -float(res.fun)
            al = np.clip(_family_alphas(name, th, out_pos), 0.0, 1.0)
            fams.append(FamilyFit(name, dict(zip(pnames, map(float, th))), 2, ll, 4 - 2 * ll, 2 * log_n - 2 * ll,
                                  tuple(float(a) for a in al)))
    a_free = np.clip(k / n, 0.0, 1.0)
    ll = _loglik(a_free, k, n)
    free_out = np.concatenate([a_free, np.full(max(MODEL_POSITIONS - a_free.size, 0), a_free[-1])])
    fams.append(FamilyFit("per_position", {"alphas": [float(a) for a in a_free]}, int(a_free.size), ll,
                          2 * a_free.size - 2 * ll, a_free.size * log_n - 2 * ll, tuple(float(a) for a in free_out)))
    chosen = min(fams, key=lambda f: (f.bic, f.n_params)).name
    decays = [f for f in fams if f.name in ("geometric", "power_law")]
    decay = min(decays, key=lambda f: f.bic).name if decays else "iid"
    return AcceptanceFit(key, int(len(rounds)), a_iid, se_iid, pp, tuple(fams), chosen, decay, p_propose)


def interpolate_models(points: list[tuple[float, AcceptanceModel]], x: float) -> AcceptanceModel:
    """Per-position α interpolated linearly in ``x`` between models at known x (clamped at the ends).

    Used to predict a held-out kept-vocabulary K from neighbouring K (x = log K).
    """
    if not points:
        raise ValueError("no models to interpolate between")
    points = sorted(points, key=lambda p: p[0])
    xs = np.array([p[0] for p in points])
    mats = np.array([m.prefix_accept_probs(MODEL_POSITIONS) for _, m in points])
    cond = np.empty_like(mats)
    cond[:, 0] = mats[:, 0]
    with np.errstate(invalid="ignore", divide="ignore"):
        cond[:, 1:] = np.where(mats[:, :-1] > 0, mats[:, 1:] / mats[:, :-1], 0.0)
    alphas = [float(np.interp(x, xs, cond[:, i])) for i in range(MODEL_POSITIONS)]
    return PerPositionAcceptance(tuple(np.clip(alphas, 0.0, 1.0)))


def trace_model(traces: pd.DataFrame) -> TraceAcceptance | RunTraceAcceptance | None:
    """Trace model from ``traces.csv`` rows (one sequence per cell × prompt, deduplicated by prompt).

    :class:`RunTraceAcceptance` when every row carries ``proposed``/``accept_run``
    (greedy runs recorded since they were added), else :class:`TraceAcceptance`
    on the match flags. Returns None when there are no rows.
    """
    if traces.empty:
        return None
    cols = ["proposed", "accept_run"]
    runs_known = set(cols) <= set(traces.columns) and bool(traces[cols].notna().all().all())
    runs: list[tuple[np.ndarray, np.ndarray]] = []  # per sequence (proposed, accept_run), when runs_known
    flags: list[np.ndarray] = []  # per sequence the match flags, otherwise
    seen: set = set()
    for (cid, pid), sub in traces.groupby(["cell_id", "prompt_id"], sort=True):
        if pid in seen:  # the same prompt recorded by another γ cell: identical flags
            continue
        seen.add(pid)
        sub = sub.sort_values("position")
        if runs_known:
            runs.append((sub["proposed"].to_numpy(dtype=int), sub["accept_run"].to_numpy(dtype=int)))
        else:
            flags.append(sub["value"].to_numpy(dtype=float))
    if runs_known:
        gmax = max(TRACE_GAMMA_MAX, max(int(p.max()) for p, _ in runs))
        return RunTraceAcceptance(tuple(runs), gmax, source="traces.csv proposed/accept_run")
    return TraceAcceptance(tuple(flags), source="traces.csv")


__all__ = ["AcceptanceFit", "FAMILIES", "FamilyFit", "MODEL_POSITIONS", "fit_acceptance",
           "interpolate_models", "trace_model", "wilson_ci"]
