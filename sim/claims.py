"""Check a speedup claim against what the simulator says is possible.

A claim names (roughly) a pair, a draft length γ, a device and a speedup. For
it, :func:`check_speedup` evaluates the simulator's own closed form
(:func:`sim.analytic.predict_row`, i.i.d. acceptance) under a cost model and
says:

* the speedup at the claim's γ over α ∈ [0, 1] (``curve``) and its bound at
  α = 1;
* the α the claim needs (``scipy.optimize.brentq`` on that same function);
* a verdict — ``consistent``, ``needs_alpha`` ("needs α ≥ x", with the
  acceptance typical for such pairs and its source) or ``not_reachable``
  ("not reachable under the cost model at any α");
* what would have to be true for it to hold: a cheaper draft than the
  cost model's, a baseline slower than the target forward the speculative
  loop uses, another γ.

Verdict rule. With an α stated by the source (or implied by a stated τ), the
claim is *consistent* when the α it needs is at most the stated one (+0.005,
the rounding of a two-decimal α). Without one, it is *consistent* when the α
it needs is at most the low end of the range typical for the kind of draft
(:func:`sim.typical.typical_alpha`: Leviathan et al.'s 0.5–0.9 for a separate
draft model, the papers' own figures for a draft head such as EAGLE-3), i.e.
reachable even with a weak typical draft; otherwise it *needs α ≥ x*, and the
text says whether x lies inside or above that range, and where the range
comes from.

:func:`check_roofline` holds a claim's ms/token figures against the preset's
roofline on the stated device (and says which preset device is nearest).

:data:`CLAIMS` is the table of published and circulating claims, each with a
precise source and whether its wording was verified, read from
``sim/data/claims.toml`` by :func:`load_claims`;
:func:`check_claim` runs one, and ``python -m sim check`` (``sim/check_cli.py``)
and the report page both call these functions.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import MISSING, asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, get_args, get_type_hints

import numpy as np
from scipy.optimize import brentq

from presets import HARDWARE, get_hardware, get_pair
from presets.hardware import Hardware
from presets.pairs import Pair
from sim.acceptance import IIDAcceptance, implied_alpha_from_tau
from sim.analytic import predict_row
from sim.cost import CostModel, LeviathanCost, RooflineCost, pair_roofline_cost, round_time_ms
from sim.limits import GAMMA_LIMIT  # the largest draft length the check accepts and searches
from sim.typical import TYPICAL_ALPHA, AlphaRange, typical_alpha

DEFAULT_CONTEXT_TOKENS = 512.0
ALPHA_ROUNDING = 0.005
"""A stated α is given to two decimals: a need within this of it counts as met."""
MS_CONSISTENCY_REL = 0.05
"""Claimed speedup and the ratio of its own ms/token figures may differ by this much (rounding)."""


@dataclass(frozen=True)
class DraftScaledCost:
    """``base`` with every draft step multiplied by ``draft_factor`` (what a cheaper draft would do)."""

    base: CostModel
    draft_factor: float

    def __post_init__(self) -> None:
        if not self.draft_factor >= 0:
            raise ValueError(f"draft factor must be >= 0, got {self.draft_factor}")

    def target_step_ms(self, context_tokens: float, batch: int = 1) -> float:
        return self.base.target_step_ms(context_tokens, batch)

    def draft_step_ms(self, context_tokens: float, batch: int = 1) -> float:
        return self.draft_factor * self.base.draft_step_ms(context_tokens, batch)

    def verify_ms(self, n_tokens: int, context_tokens: float, batch: int = 1) -> float:
        return self.base.verify_ms(n_tokens, context_tokens, batch)

    def round_overhead_ms(self, gamma: int) -> float:
        return self.base.round_overhead_ms(gamma)

    def describe(self) -> dict:
        return {"kind": "draft_scaled", "draft_factor": self.draft_factor, "base": self.base.describe()}


# -- the check ------------------------------------------------------------------------------
def speedup_at(cost: CostModel, alpha: float, gamma: int, context_tokens: float = DEFAULT_CONTEXT_TOKENS) -> float:
    """The simulator's closed-form speedup at i.i.d. ``alpha`` and draft length ``gamma``."""
    return float(predict_row(IIDAcceptance(alpha), cost, gamma, context_tokens).speedup)


def alpha_needed(cost: CostModel, speedup: float, gamma: int,
                 context_tokens: float = DEFAULT_CONTEXT_TOKENS) -> float | None:
    """Smallest i.i.d. α at which the speedup at ``gamma`` reaches ``speedup``; ``None`` if α = 1 does not."""
    lo, hi = speedup_at(cost, 0.0, gamma, context_tokens), speedup_at(cost, 1.0, gamma, context_tokens)
    if lo >= speedup:
        return 0.0
    if hi < speedup:
        return None
    if math.isclose(hi, speedup, rel_tol=1e-12):
        return 1.0
    return float(brentq(lambda a: speedup_at(cost, a, gamma, context_tokens) - speedup, 0.0, 1.0, xtol=1e-10))


def draft_factor_needed(cost: CostModel, speedup: float, alpha: float, gamma: int,
                        context_tokens: float = DEFAULT_CONTEXT_TOKENS) -> float | None:
    """Factor on the draft step at which the speedup at (``alpha``, ``gamma``) reaches ``speedup``.

    ``None`` when even a free draft falls short; values above 1 mean the
    draft could be that much dearer.
    """
    def f(k: float) -> float:
        return speedup_at(DraftScaledCost(cost, k), alpha, gamma, context_tokens) - speedup

    if f(0.0) < 0:
        return None
    hi = 1.0
    while f(hi) > 0 and hi < 1e6:
        hi *= 2.0
    if f(hi) > 0:
        return hi
    return float(brentq(f, 0.0, hi, xtol=1e-10))


@dataclass(frozen=True)
class Verdict:
    """What the simulator says about one claimed speedup under one cost model."""

    claimed_speedup: float
    gamma: int
    gamma_stated: bool
    gamma_candidates: tuple[int, ...]
    cost_ratio: float
    verify_ratio: float
    bound_at_alpha1: float
    alpha_needed: float | None
    alpha_stated: float | None
    alpha_reference: float
    alpha_reference_source: str
    predicted_at_reference: float
    typical_alpha: AlphaRange
    kind: str  # "consistent", "needs_alpha", "not_reachable"
    verdict: str
    would_have_to_be_true: tuple[str, ...]
    draft_cost_ratio_needed: float | None
    baseline_slowdown_needed: float | None
    best_gamma: int
    alpha_needed_at_best_gamma: float | None
    bound_at_alpha1_best: float
    curve: tuple[tuple[float, float], ...]

    def short_verdict(self) -> str:
        """The verdict in a few words (tables)."""
        if self.kind == "not_reachable":
            return f"not reachable (bound {self.bound_at_alpha1:.2f}× at α = 1)"
        if self.kind == "consistent":
            return "consistent"
        need = self.alpha_needed
        assert need is not None, "a needs_alpha verdict has the α it needs"
        if self.alpha_stated is not None:
            return f"needs α ≥ {need:.3f} (source: {self.alpha_stated:.3f})"
        place = "inside" if need <= self.typical_alpha.high else "above"
        return (f"needs α ≥ {need:.3f} ({place} typical {self.typical_alpha.low:g}–"
                f"{self.typical_alpha.high:g})")

    def curve_text(self, alphas: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)) -> str:
        """Speedup at a few α of the curve, e.g. ``0.5: 1.08×, …, 1: 2.79×``."""
        by_alpha = {round(a, 6): sp for a, sp in self.curve}
        return ", ".join(f"{a:g}: {by_alpha[round(a, 6)]:.2f}×" for a in alphas)

    def would_text(self) -> str:
        """``would_have_to_be_true`` as one sentence of alternatives."""
        items = list(self.would_have_to_be_true)
        if items and items[0].startswith("or "):
            items[0] = items[0][3:]
        return "; ".join(items)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["curve"] = [{"alpha": a, "speedup": s} for a, s in self.curve]
        return d


def _check_inputs(speedup: float, gamma: int | None, gamma_max: int, alpha: float | None, tau: float | None) -> None:
    if not (isinstance(speedup, (int, float)) and math.isfinite(speedup) and speedup > 0):
        raise ValueError(f"claimed speedup must be a finite number > 0, got {speedup}")
    for name, g in (("gamma", gamma), ("gamma_max", gamma_max)):
        if g is not None and (int(g) != g or not 1 <= g <= GAMMA_LIMIT):
            raise ValueError(f"{name} must be an integer in [1, {GAMMA_LIMIT}], got {g}")
    if alpha is not None and tau is not None:
        raise ValueError("give alpha or tau, not both")
    if alpha is not None and not (math.isfinite(alpha) and 0.0 <= alpha <= 1.0):
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if tau is not None and not (math.isfinite(tau) and tau >= 1.0):
        raise ValueError(f"tau (tokens per round) must be a finite number >= 1, got {tau}")


def _fmt_x(v: float) -> str:
    return f"{v:.2f}×"


# long: one verdict over every way a claim can be stated (α, τ, γ given or not); each case a few lines, kept
#   together so the verdicts read as one table
def check_speedup(
    cost: CostModel,
    speedup: float,
    gamma: int | None,
    *,
    alpha: float | None = None,
    tau: float | None = None,
    gamma_max: int = 16,
    context_tokens: float = DEFAULT_CONTEXT_TOKENS,
    typical: AlphaRange = TYPICAL_ALPHA,
    parameter_ratio: float | None = None,
) -> Verdict:
    """Hold a claimed ``speedup`` at draft length ``gamma`` against ``cost`` (see module docstring).

    ``gamma=None`` (not stated, or adaptive): the γ in 1..``gamma_max`` most
    favourable to the claim is used. ``alpha`` or ``tau`` (mean tokens per
    round) is what the source states, if anything.
    """
    _check_inputs(speedup, gamma, gamma_max, alpha, tau)
    candidates = (int(gamma),) if gamma is not None else tuple(range(1, int(gamma_max) + 1))
    if tau is not None:
        feasible = [g for g in candidates if tau <= g + 1]
        if not feasible:
            raise ValueError(f"tau {tau} needs gamma >= {math.ceil(tau - 1)}, got gamma {candidates[-1]}")
        candidates = tuple(feasible)

    def stated_alpha(g: int) -> float | None:
        if tau is not None:
            return implied_alpha_from_tau(tau, g)
        return alpha

    def reference_alpha(g: int) -> float:  # the α the verdict is read at: the source's, else the typical top
        a = stated_alpha(g)
        return a if a is not None else typical.high

    bounds = {g: speedup_at(cost, 1.0, g, context_tokens) for g in candidates}
    needs = {g: alpha_needed(cost, speedup, g, context_tokens) for g in candidates}
    if len(candidates) == 1:
        g_eval = candidates[0]
    elif alpha is not None or tau is not None:  # the γ where the stated acceptance gives the most
        g_eval = max(candidates, key=lambda g: (round(speedup_at(cost, reference_alpha(g), g, context_tokens), 9), -g))
    elif any(n is not None for n in needs.values()):  # the γ that needs the least acceptance
        g_eval = min((g for g in candidates if needs[g] is not None), key=lambda g: (needs[g], g))
    else:
        g_eval = max(candidates, key=lambda g: (bounds[g], -g))

    a_stated = stated_alpha(g_eval)
    a_ref = reference_alpha(g_eval)
    ref_source = ("stated by the source" if alpha is not None else
                  f"implied by the stated τ = {tau:g} at γ = {g_eval}" if tau is not None else
                  f"top of the typical range ({typical.text()})")
    need = needs[g_eval]
    bound = bounds[g_eval]
    predicted_ref = speedup_at(cost, a_ref, g_eval, context_tokens)
    target_ms = cost.target_step_ms(context_tokens)
    c = cost.draft_step_ms(context_tokens) / target_ms
    v = cost.verify_ms(g_eval + 1, context_tokens) / target_ms
    where = f"γ = {g_eval}" if gamma is not None else f"γ = {g_eval} (γ not stated; the most favourable of 1–{candidates[-1]})"

    if need is None:
        kind = "not_reachable"
        verdict = (f"not reachable under the cost model at any α: the bound at α = 1 is {_fmt_x(bound)} at {where}"
                   + ("" if gamma is not None else f", the highest over γ ≤ {candidates[-1]}"))
    elif a_stated is not None:
        if need <= a_stated + ALPHA_ROUNDING:
            kind = "consistent"
            verdict = (f"consistent: needs α ≥ {need:.3f} at {where}; the source's α is {a_stated:.3f} "
                       f"(predicted {_fmt_x(predicted_ref)})")
        else:
            kind = "needs_alpha"
            verdict = (f"needs α ≥ {need:.3f} at {where}, above the source's own α = {a_stated:.3f} "
                       f"(which predicts {_fmt_x(predicted_ref)})")
    elif need <= typical.low:
        kind = "consistent"
        verdict = f"consistent: needs α ≥ {need:.3f} at {where}, at or below the typical range ({typical.text()})"
    else:
        kind = "needs_alpha"
        place = "inside" if need <= typical.high else "above"
        verdict = (f"needs α ≥ {need:.3f} at {where} ({place} the range typical for {typical.label}: "
                   f"{typical.text()})")

    # What would have to be true, each at the reference α.
    k = draft_factor_needed(cost, speedup, a_ref, g_eval, context_tokens)
    c_needed = None if k is None else k * c
    slowdown = speedup / predicted_ref if predicted_ref > 0 else math.inf  # a speedup that rounds to 0
    all_g = range(1, GAMMA_LIMIT + 1)
    needs_all = {g: alpha_needed(cost, speedup, g, context_tokens) for g in all_g}
    reachable = [g for g in all_g if needs_all[g] is not None]
    best_g = min(reachable, key=lambda g: (needs_all[g], g)) if reachable else \
        max(all_g, key=lambda g: (speedup_at(cost, 1.0, g, context_tokens), -g))
    best_bound = speedup_at(cost, 1.0, best_g, context_tokens)
    wants: list[str] = []
    short = predicted_ref < speedup  # the claim is out of reach at the reference α
    if kind != "consistent":
        at = f"at α = {a_ref:.2f}, {'the source' if a_stated is not None else 'the top of the typical range'}"
        ratio_txt = f"; parameter ratio {parameter_ratio:.3f}" if parameter_ratio is not None else ""
        if need is not None:
            wants.append(f"α ≥ {need:.3f} at γ = {g_eval}")
        if short and c_needed is None:
            wants.append(f"(a cheaper draft cannot do it: even a free one, c = 0, falls short {at})")
        elif short:
            wants.append(f"or a draft costing ≤ {c_needed:.3f} of a target step {at} "
                         f"(cost model: {c:.3f}{ratio_txt})")
        if short:
            wants.append(f"or a baseline {slowdown:.2f}× slower than the target forward the speculative loop "
                         f"uses (the cost model predicts {_fmt_x(predicted_ref)} {at})")
        if reachable and best_g != g_eval:
            wants.append(f"or γ = {best_g}, where it needs α ≥ {needs_all[best_g]:.3f}")
        elif not reachable:
            wants.append(f"(no γ ≤ {GAMMA_LIMIT} reaches it at any α: highest bound {_fmt_x(best_bound)} "
                         f"at γ = {best_g})")
    alphas = np.round(np.linspace(0.0, 1.0, 21), 10)
    curve = tuple((float(a), speedup_at(cost, float(a), g_eval, context_tokens)) for a in alphas)
    return Verdict(
        claimed_speedup=float(speedup), gamma=g_eval, gamma_stated=gamma is not None,
        gamma_candidates=candidates, cost_ratio=c, verify_ratio=v, bound_at_alpha1=bound,
        alpha_needed=need, alpha_stated=a_stated, alpha_reference=a_ref, alpha_reference_source=ref_source,
        predicted_at_reference=predicted_ref, typical_alpha=typical, kind=kind, verdict=verdict,
        would_have_to_be_true=tuple(wants), draft_cost_ratio_needed=c_needed,
        baseline_slowdown_needed=slowdown if kind != "consistent" and short else None,
        best_gamma=best_g, alpha_needed_at_best_gamma=needs_all[best_g], bound_at_alpha1_best=best_bound,
        curve=curve,
    )


# -- ms/token against the roofline ------------------------------------------------------------
@dataclass(frozen=True)
class RooflineCheck:
    """A claim's ms/token figures next to the preset's roofline on the stated device."""

    hardware: str
    baseline_roofline_ms: float
    claimed_baseline_ms: float | None
    baseline_ratio: float | None
    speculative_floor_ms: float
    claimed_speculative_ms: float | None
    speculative_ratio: float | None
    ms_implied_speedup: float | None
    weights_gb: float
    memory_gb: float | None
    fits_memory: bool | None
    nearest_hardware: str | None
    nearest_baseline_ms: float | None
    findings: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def roofline_cost(pair: Pair, hardware: Hardware) -> RooflineCost:
    """The preset cost model of ``pair`` on ``hardware`` (:func:`sim.cost.pair_roofline_cost`)."""
    return pair_roofline_cost(pair, hardware)


def _weights_bytes(pair: Pair, hardware: Hardware) -> float:
    return (pair.draft.counted_params() + pair.target.counted_params()) * hardware.bytes_per_param


# long: a docstring of the roofline's assumptions; the body prices baseline and speculative steps, then states the
#   verdict
def check_roofline(pair: Pair, hardware: Hardware, gamma: int, claimed_speedup: float,
                   baseline_ms: float | None = None, speculative_ms: float | None = None,
                   context_tokens: float = DEFAULT_CONTEXT_TOKENS,
                   bytes_per_param: float | None = None) -> RooflineCheck:
    """Compare claimed baseline / speculative ms per token with the roofline of ``pair`` on ``hardware``.

    ``bytes_per_param`` overrides the weight precision of ``hardware`` and of
    every preset device the nearest one is chosen from (only devices the
    weights fit are candidates).
    """
    if bytes_per_param is not None:
        hardware = replace(hardware, bytes_per_param=bytes_per_param)
    for name, v in (("baseline ms/token", baseline_ms), ("speculative ms/token", speculative_ms)):
        if v is not None and not (math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a finite number > 0, got {v}")
    cost = roofline_cost(pair, hardware)
    base = cost.target_step_ms(context_tokens)
    floor = round_time_ms(cost, gamma, context_tokens) / (gamma + 1)  # α = 1: every round yields γ + 1 tokens
    weights = _weights_bytes(pair, hardware)
    memory = hardware.memory_bytes
    fits = None if memory is None else weights <= memory
    findings: list[str] = []
    b_ratio = s_ratio = implied = None
    nearest = nearest_ms = None
    if baseline_ms is not None:
        b_ratio = baseline_ms / base
        devices = {n: (h if bytes_per_param is None else replace(h, bytes_per_param=bytes_per_param))
                   for n, h in HARDWARE.items()}
        by_hw = {n: roofline_cost(pair, h).target_step_ms(context_tokens) for n, h in devices.items()
                 if h.memory_bytes is None or _weights_bytes(pair, h) <= h.memory_bytes}
        nearest = min(by_hw, key=lambda n: abs(math.log(baseline_ms / by_hw[n])))
        nearest_ms = by_hw[nearest]
        if b_ratio < 0.95:
            findings.append(f"the baseline {baseline_ms:g} ms/token is faster than the {hardware.name} roofline "
                            f"({base:.1f} ms): not possible on that device at this precision")
        elif b_ratio > 2.0:
            findings.append(f"the baseline {baseline_ms:g} ms/token is {b_ratio:.1f}× the {hardware.name} roofline "
                            f"({base:.1f} ms): a loop dominated by overhead, or another device (nearest "
                            f"preset the weights fit: {nearest}, {nearest_ms:.1f} ms at "
                            f"{devices[nearest].bytes_per_param:g} bytes/param)")
        else:
            findings.append(f"the baseline {baseline_ms:g} ms/token is {b_ratio:.2f}× the {hardware.name} roofline "
                            f"({base:.1f} ms)")
    if speculative_ms is not None:
        s_ratio = speculative_ms / floor
        if s_ratio < 1.0:
            findings.append(f"the speculative {speculative_ms:g} ms/token is below the fastest the cost model allows "
                            f"on {hardware.name} at γ = {gamma} even at α = 1 ({floor:.2f} ms/token)")
        else:
            findings.append(f"the speculative {speculative_ms:g} ms/token is {s_ratio:.1f}× the α = 1 floor "
                            f"on {hardware.name} at γ = {gamma} ({floor:.2f} ms/token)")
    if baseline_ms is not None and speculative_ms is not None:
        implied = baseline_ms / speculative_ms
        if abs(implied / claimed_speedup - 1.0) > MS_CONSISTENCY_REL:
            findings.append(f"its own ms figures give {implied:.2f}×, not the {claimed_speedup:g}× it states")
    if memory is not None and not fits:
        findings.append(f"draft + target weights ({weights / 1e9:.1f} GB at {hardware.bytes_per_param:g} bytes/param) "
                        f"do not fit the {hardware.name}'s {memory / 1e9:.0f} GB")
    return RooflineCheck(
        hardware=hardware.name, baseline_roofline_ms=base, claimed_baseline_ms=baseline_ms, baseline_ratio=b_ratio,
        speculative_floor_ms=floor, claimed_speculative_ms=speculative_ms, speculative_ratio=s_ratio,
        ms_implied_speedup=implied, weights_gb=weights / 1e9,
        memory_gb=None if memory is None else memory / 1e9, fits_memory=fits,
        nearest_hardware=nearest, nearest_baseline_ms=nearest_ms, findings=tuple(findings),
    )


# -- the table of claims ----------------------------------------------------------------------
@dataclass(frozen=True)
class Claim:
    """One published or circulating speedup claim, mapped to a cost model.

    Either ``preset`` + ``hardware`` (roofline cost model; ``bytes_per_param``
    overrides the device's weight precision) or ``cost_ratio`` (the pure
    Leviathan et al. model, for sources that state c or a draft-cost ratio).
    ``verified`` says whether the quoted wording was checked against the
    source's own text here; ``verification`` says against what, or why not.
    """

    claim_id: str
    source: str
    quote: str
    verified: bool
    verification: str
    setting: str
    speedup: float
    gamma: int | None
    assumptions: str
    preset: str | None = None
    hardware: str | None = None
    cost_ratio: float | None = None
    bytes_per_param: float | None = None
    alpha: float | None = None
    tau: float | None = None
    gamma_max: int = 16
    baseline_ms_per_token: float | None = None
    speculative_ms_per_token: float | None = None
    context_tokens: float = DEFAULT_CONTEXT_TOKENS

    def __post_init__(self) -> None:
        if not self.source.strip() or not self.verification.strip():
            raise ValueError(f"claim {self.claim_id!r}: every claim needs a source and a verification note")
        if (self.preset is None) == (self.cost_ratio is None):
            raise ValueError(f"claim {self.claim_id!r}: give either a preset (+ hardware) or a cost ratio")
        if self.preset is not None and self.hardware is None:
            raise ValueError(f"claim {self.claim_id!r}: a preset needs a hardware profile")
        _check_inputs(self.speedup, self.gamma, self.gamma_max, self.alpha, self.tau)

    def cost_model(self) -> tuple[CostModel, Pair | None, Hardware | None]:
        """The cost model the claim is checked under, and the pair and device behind it (if any)."""
        if self.cost_ratio is not None:
            return LeviathanCost(self.cost_ratio), None, None
        assert self.preset is not None and self.hardware is not None, "__post_init__: no cost ratio, so a preset"
        pair, hw = get_pair(self.preset), get_hardware(self.hardware)
        if self.bytes_per_param is not None:
            hw = replace(hw, bytes_per_param=self.bytes_per_param)
        return roofline_cost(pair, hw), pair, hw


@dataclass(frozen=True)
class ClaimCheck:
    """A claim with its verdict and, where it gives ms/token, the roofline check."""

    claim: Claim
    verdict: Verdict
    roofline: RooflineCheck | None
    cost_model: dict = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        """One flat record for tables (report page, README, ``--format json``)."""
        c, v = self.claim, self.verdict
        mapping = (f"{c.preset} on {c.hardware}" + (f" ({c.bytes_per_param:g} bytes/param)" if c.bytes_per_param
                                                    else "")) if c.preset else f"Leviathan model, c = {c.cost_ratio:g}"
        return {
            "claim": c.claim_id,
            "source": c.source,
            "quote": c.quote,
            "status": "verified" if c.verified else "not verified here",
            "verification": c.verification,
            "setting": c.setting,
            "mapped_to": mapping,
            "assumptions": c.assumptions,
            "claimed_speedup": c.speedup,
            "gamma": v.gamma,
            "gamma_stated": v.gamma_stated,
            "alpha_stated": v.alpha_stated,
            "cost_ratio": v.cost_ratio,
            "bound_at_alpha1": v.bound_at_alpha1,
            "alpha_needed": v.alpha_needed,
            "verdict_kind": v.kind,
            "verdict": v.verdict,
            "verdict_short": v.short_verdict(),
            "speedup_by_alpha": v.curve_text(),
            "would_have_to_be_true": v.would_text(),
            "roofline": "; ".join(self.roofline.findings) if self.roofline else "",
        }

    def as_dict(self) -> dict[str, Any]:
        return {"claim": asdict(self.claim), "verdict": self.verdict.as_dict(),
                "roofline": self.roofline.as_dict() if self.roofline else None, "cost_model": self.cost_model}


def check_claim(claim: Claim) -> ClaimCheck:
    """Run :func:`check_speedup` (and :func:`check_roofline` where ms/token are given) on one claim."""
    cost, pair, hardware = claim.cost_model()
    ratio = pair.draft.params / pair.target.params if pair is not None else None
    verdict = check_speedup(cost, claim.speedup, claim.gamma, alpha=claim.alpha, tau=claim.tau,
                            gamma_max=claim.gamma_max, context_tokens=claim.context_tokens, parameter_ratio=ratio,
                            typical=typical_alpha(pair))
    roof = None
    if pair is not None and hardware is not None and (claim.baseline_ms_per_token or claim.speculative_ms_per_token):
        roof = check_roofline(pair, hardware, verdict.gamma, claim.speedup,
                              claim.baseline_ms_per_token, claim.speculative_ms_per_token, claim.context_tokens,
                              claim.bytes_per_param)
    return ClaimCheck(claim, verdict, roof, cost.describe())


def check_claims(claims: tuple[Claim, ...] | None = None) -> list[ClaimCheck]:
    """Every claim of the table (or of ``claims``), checked."""
    return [check_claim(c) for c in (CLAIMS if claims is None else claims)]


# -- the table of claims, from sim/data/claims.toml ---------------------------------------------
CLAIMS_FILE = Path(__file__).resolve().parent / "data" / "claims.toml"
"""The published and circulating claims (:func:`load_claims` reads and validates it)."""

_TABLE_KEYS = ("templates", "claim")


def _field_types() -> dict[str, tuple[type, ...]]:
    """Each :class:`Claim` field and the TOML value types it takes (an int is a valid float)."""
    out = {}
    for name, hint in get_type_hints(Claim).items():
        allowed = tuple(t for t in (get_args(hint) or (hint,)) if t is not type(None))
        out[name] = allowed + ((int,) if float in allowed else ())
    return out


def _claim_fields(where: str, table: object, types: dict[str, tuple[type, ...]]) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise ValueError(f"{where}: expected a table of claim fields, got {type(table).__name__}")
    for key, value in table.items():
        if key not in types:
            raise ValueError(f"{where}: unknown field {key!r}; valid: {', '.join(types)}")
        ok = isinstance(value, types[key]) and (bool in types[key] or not isinstance(value, bool))
        if not ok:
            want = " or ".join(t.__name__ for t in types[key])
            raise ValueError(f"{where}: field {key!r} must be {want}, got {value!r}")
    return dict(table)


def load_claims(path: str | Path = CLAIMS_FILE) -> tuple[Claim, ...]:
    """The claims of a TOML file: ``[[claim]]`` tables of :class:`Claim` fields, optionally ``template = NAME``
    taking the fields of ``[templates.NAME]`` (a field set in both is refused).

    ``gamma`` left out means not stated. Bad content raises ``ValueError`` naming the file, the claim and
    the field; each claim is then validated by :class:`Claim` itself.
    """
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"claims file {str(path)!r}: {exc}") from None
    extra = sorted(set(doc) - set(_TABLE_KEYS))
    if extra:
        raise ValueError(f"claims file {str(path)!r}: unknown top-level key(s) {extra}; valid: {', '.join(_TABLE_KEYS)}")
    types = _field_types()
    templates = {name: _claim_fields(f"{path.name} [templates.{name}]", t, types)
                 for name, t in doc.get("templates", {}).items()}
    claims: list[Claim] = []
    for i, raw in enumerate(doc.get("claim", []), start=1):
        where = f"{path.name} claim {i}" + (f" ({raw.get('claim_id')})" if isinstance(raw, dict) else "")
        if not isinstance(raw, dict):
            raise ValueError(f"{where}: expected a table, got {type(raw).__name__}")
        raw = dict(raw)
        base: dict[str, Any] = {}
        if "template" in raw:
            name = raw.pop("template")
            if name not in templates:
                raise ValueError(f"{where}: unknown template {name!r}; valid: {', '.join(templates) or 'none'}")
            base = templates[name]
        fields_ = _claim_fields(where, raw, types)
        both = sorted(set(base) & set(fields_))
        if both:
            raise ValueError(f"{where}: field(s) {both} set by the claim and by its template")
        merged = {"gamma": None, **base, **fields_}
        missing = [n for n, f in Claim.__dataclass_fields__.items()
                   if f.default is MISSING and f.default_factory is MISSING and n not in merged]
        if missing:
            raise ValueError(f"{where}: missing field(s) {missing}")
        claims.append(Claim(**merged))
    ids = [c.claim_id for c in claims]
    dup = sorted({c for c in ids if ids.count(c) > 1})
    if dup:
        raise ValueError(f"claims file {str(path)!r}: claim id(s) {dup} given more than once")
    if not claims:
        raise ValueError(f"claims file {str(path)!r}: no [[claim]] tables")
    return tuple(claims)


CLAIMS: tuple[Claim, ...] = load_claims()
