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
it needs is at most the low end of the range typical for a separate draft
model (:data:`TYPICAL_ALPHA`), i.e. reachable even with a weak typical draft;
otherwise it *needs α ≥ x*, and the text says whether x lies inside or above
that range.

:func:`check_roofline` holds a claim's ms/token figures against the preset's
roofline on the stated device (and says which preset device is nearest).

:data:`CLAIMS` is the table of published and circulating claims, each with a
precise source and whether its wording could be verified here;
:func:`check_claim` runs one, and ``python -m sim check`` (``sim/check_cli.py``)
and the report page both call these functions.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
from scipy.optimize import brentq

from presets import HARDWARE, RooflineForward, get_hardware, get_pair
from presets.hardware import Hardware
from presets.pairs import Pair
from sim.acceptance import IIDAcceptance, implied_alpha_from_tau
from sim.analytic import predict_row
from sim.cost import CostModel, LeviathanCost, RooflineCost, round_time_ms
from sim.limits import GAMMA_LIMIT  # the largest draft length the check accepts and searches

DEFAULT_CONTEXT_TOKENS = 512.0
ALPHA_ROUNDING = 0.005
"""A stated α is given to two decimals: a need within this of it counts as met."""
MS_CONSISTENCY_REL = 0.05
"""Claimed speedup and the ratio of its own ms/token figures may differ by this much (rounding)."""


@dataclass(frozen=True)
class AlphaRange:
    """Acceptance typical for a kind of draft, with where that comes from."""

    low: float
    high: float
    source: str
    quote: str = ""

    def __post_init__(self) -> None:
        if not 0.0 <= self.low <= self.high <= 1.0:
            raise ValueError(f"typical alpha range must satisfy 0 <= low <= high <= 1, got {self.low}, {self.high}")

    def text(self) -> str:
        return f"{self.low:g}–{self.high:g}, {self.source}"


TYPICAL_ALPHA = AlphaRange(
    0.5, 0.9, "Leviathan et al. 2023 §4.2",
    quote="approximation models that are a couple of orders of magnitude smaller than the target model tend to "
          "produce α values between 0.5 and 0.9",
)


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
        if self.alpha_stated is not None:
            return f"needs α ≥ {self.alpha_needed:.3f} (source: {self.alpha_stated:.3f})"
        place = "inside" if self.alpha_needed <= self.typical_alpha.high else "above"
        return (f"needs α ≥ {self.alpha_needed:.3f} ({place} typical {self.typical_alpha.low:g}–"
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

    bounds = {g: speedup_at(cost, 1.0, g, context_tokens) for g in candidates}
    needs = {g: alpha_needed(cost, speedup, g, context_tokens) for g in candidates}
    if len(candidates) == 1:
        g_eval = candidates[0]
    elif alpha is not None or tau is not None:  # the γ where the stated acceptance gives the most
        g_eval = max(candidates, key=lambda g: (round(speedup_at(cost, stated_alpha(g), g, context_tokens), 9), -g))
    elif any(n is not None for n in needs.values()):  # the γ that needs the least acceptance
        g_eval = min((g for g in candidates if needs[g] is not None), key=lambda g: (needs[g], g))
    else:
        g_eval = max(candidates, key=lambda g: (bounds[g], -g))

    a_stated = stated_alpha(g_eval)
    a_ref = a_stated if a_stated is not None else typical.high
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
        verdict = (f"needs α ≥ {need:.3f} at {where} ({place} the range typical for such pairs: {typical.text()})")

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
    """The preset cost model of ``pair`` on ``hardware`` (roofline forwards, no round overhead)."""
    return RooflineCost(RooflineForward(pair.draft, hardware), RooflineForward(pair.target, hardware))


def _weights_bytes(pair: Pair, hardware: Hardware) -> float:
    return (pair.draft.counted_params() + pair.target.counted_params()) * hardware.bytes_per_param


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
    fits = None if hardware.memory_bytes is None else weights <= hardware.memory_bytes
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
    if fits is False:
        findings.append(f"draft + target weights ({weights / 1e9:.1f} GB at {hardware.bytes_per_param:g} bytes/param) "
                        f"do not fit the {hardware.name}'s {hardware.memory_bytes / 1e9:.0f} GB")
    return RooflineCheck(
        hardware=hardware.name, baseline_roofline_ms=base, claimed_baseline_ms=baseline_ms, baseline_ratio=b_ratio,
        speculative_floor_ms=floor, claimed_speculative_ms=speculative_ms, speculative_ratio=s_ratio,
        ms_implied_speedup=implied, weights_gb=weights / 1e9,
        memory_gb=None if hardware.memory_bytes is None else hardware.memory_bytes / 1e9, fits_memory=fits,
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
    cost, pair, _ = claim.cost_model()
    ratio = pair.draft.params / pair.target.params if pair is not None else None
    verdict = check_speedup(cost, claim.speedup, claim.gamma, alpha=claim.alpha, tau=claim.tau,
                            gamma_max=claim.gamma_max, context_tokens=claim.context_tokens, parameter_ratio=ratio)
    roof = None
    if pair is not None and (claim.baseline_ms_per_token or claim.speculative_ms_per_token):
        roof = check_roofline(pair, get_hardware(claim.hardware), verdict.gamma, claim.speedup,
                              claim.baseline_ms_per_token, claim.speculative_ms_per_token, claim.context_tokens,
                              claim.bytes_per_param)
    return ClaimCheck(claim, verdict, roof, cost.describe())


def check_claims(claims: tuple[Claim, ...] | None = None) -> list[ClaimCheck]:
    """Every claim of the table (or of ``claims``), checked."""
    return [check_claim(c) for c in (CLAIMS if claims is None else claims)]


_LEVIATHAN = "Leviathan, Kalman, Matias 2023, Fast Inference from Transformers via Speculative Decoding " \
             "(ICML 2023, arXiv:2211.17192)"
_LEVIATHAN_VERIFIED = ("checked against a stored text copy of the paper: Table 2 (γ, α, speed) and "
                       "Appendix A.3 Table 4 (c \"estimated … based on profiler traces\", Exp vs Emp)")
_LEVIATHAN_SETTING = "T5-XXL 11B target (T5 v1.1), batch 1, single TPU-v4, against the T5X implementation"
_LEVIATHAN_ASSUMPTIONS = "cost model = Leviathan et al.'s own: draft step = c × target step (c from Table 4), " \
                         "verify = one target step, no overhead; i.i.d. α"

# (task, draft, temp, γ, α, c, speed): Table 2 with c from Table 4, as printed in the paper.
_T5_ROWS = (
    ("EnDe", "T5-small", 0, 7, 0.75, 0.02, 3.4), ("EnDe", "T5-base", 0, 7, 0.80, 0.04, 2.8),
    ("EnDe", "T5-large", 0, 7, 0.82, 0.11, 1.7), ("EnDe", "T5-small", 1, 7, 0.62, 0.02, 2.6),
    ("EnDe", "T5-base", 1, 5, 0.68, 0.04, 2.4), ("EnDe", "T5-large", 1, 3, 0.71, 0.11, 1.4),
    ("CNNDM", "T5-small", 0, 5, 0.65, 0.02, 3.1), ("CNNDM", "T5-base", 0, 5, 0.73, 0.04, 3.0),
    ("CNNDM", "T5-large", 0, 3, 0.74, 0.11, 2.2), ("CNNDM", "T5-small", 1, 5, 0.53, 0.02, 2.3),
    ("CNNDM", "T5-base", 1, 3, 0.55, 0.04, 2.2), ("CNNDM", "T5-large", 1, 3, 0.56, 0.11, 1.7),
)

_ARTICLE = ("implementation-guide article, a follow-up to \"AI Daily News — September 18, 2025\" "
            "(as quoted in specscope issue #15)")
_ARTICLE_UNVERIFIED = ("not verified here: the article could not be found in the sources searchable from this "
                       "session; numbers as quoted in issue #15")
_SPEC_BENCH = ("Spec-Bench leaderboard (Xia et al. 2024, ACL Findings), github.com/hemingkx/Spec-Bench "
               "Leaderboard.md, \"Leaderboard on A100\", Vicuna-7B-v1.3 table, Overall column")
_SPEC_BENCH_VERIFIED = "verified against the stored Leaderboard.md (speedup and #Mean Accepted Tokens)"
_SPEC_BENCH_SETTING = "single A100 80GB, greedy, FP16, batch 1, Vicuna-7B-v1.3 target"
_TORCH_VELOCITY = "github.com/mmcmanus1/Torch-Velocity README.md (\"demonstrating 1.5-2.5x inference speedups\")"
_TORCH_VELOCITY_VERIFIED = ("verified against the stored README (Models table: distilgpt2 82M draft, gpt2-medium "
                            "355M target; \"Open velocity_demo.ipynb in Google Colab (free T4 GPU)\") and "
                            "velocity_demo.ipynb (velocity_generate: initial_gamma=4, min_gamma=1, max_gamma=8, "
                            "temperature=1.0)")
_FROM_SCRATCH = "github.com/ParamChordiya/speculative-decoding README.md, \"What is Speculative Decoding?\""
_FROM_SCRATCH_QUOTE = ("\"At a 70–80% token acceptance rate with a 10–20× cheaper draft model, this yields "
                       "2–3× wall-clock speedup\"")
_FROM_SCRATCH_VERIFIED = ("verified against the stored README; the same README says the decoding engine is "
                          "\"in progress\", so the sentence is a projection, not a measurement")


def _t5_claim(task: str, draft: str, temp: int, gamma: int, alpha: float, c: float, speed: float) -> Claim:
    return Claim(
        claim_id=f"leviathan-{task.lower()}-{draft.lower()}-t{temp}",
        source=f"{_LEVIATHAN}, Table 2 (c: Table 4)",
        quote=f"{task} | {draft} | temp {temp} | γ {gamma} | α {alpha:g} | {speed:g}X (Table 4: c = {c:g})",
        verified=True, verification=_LEVIATHAN_VERIFIED,
        setting=f"{_LEVIATHAN_SETTING}; {task}, {'argmax' if temp == 0 else 'standard sampling'}",
        speedup=speed, gamma=gamma, alpha=alpha, cost_ratio=c, assumptions=_LEVIATHAN_ASSUMPTIONS,
    )


def _article(claim_id: str, quote: str, speedup: float, baseline_ms: float, speculative_ms: float,
             preset: str, hardware: str, setting: str, assumptions: str) -> Claim:
    return Claim(claim_id=claim_id, source=_ARTICLE, quote=quote, verified=False, verification=_ARTICLE_UNVERIFIED,
                 setting=setting, preset=preset, hardware=hardware, speedup=speedup, gamma=4,
                 baseline_ms_per_token=baseline_ms, speculative_ms_per_token=speculative_ms, assumptions=assumptions)


_LLAMA_ASSUMED = ("Llama-7B/13B mapped to the Llama-2 shapes (LLaMA-1 has the same); device not stated: A100 80GB "
                  "bf16 batch 1 assumed (7B + 13B weights at 2 bytes, 39.5 GB, fit no 16 or 24 GB card)")


def _torch_velocity(end: str, speedup: float, preset: str = "distilgpt2-gpt2-medium") -> Claim:
    notebook = preset != "distilgpt2-gpt2-medium"
    return Claim(
        claim_id=f"torch-velocity-{end}",
        source=("github.com/mmcmanus1/Torch-Velocity velocity_demo.ipynb, MODEL_CONFIGS['t4'] (USE_CONFIG = 't4')"
                if notebook else _TORCH_VELOCITY),
        quote=("'t4': gpt2-xl target + distilgpt2 draft, \"Larger models with 18x ratio (should show speedup)\"; "
               "notebook headline \"achieving 1.5-2.5x inference speedups\" (2.5× checked)" if notebook else
               f"distilgpt2 → gpt2-medium, adaptive γ, T4: {speedup:g}× ({end} end of 1.5–2.5×)"),
        verified=True, verification=_TORCH_VELOCITY_VERIFIED,
        setting="Colab T4, adaptive γ in 1–8, temperature 1.0 (rejection sampling)",
        preset=preset, hardware="t4", speedup=speedup, gamma=None, gamma_max=8,
        assumptions="T4 fp16 batch 1 roofline (the notebook loads fp32 weights: the fp16 roofline is the "
                    "optimistic case); adaptive γ → the most favourable fixed γ in 1–8",
    )


def _from_scratch(end: str, cheaper: int, alpha: float, speedup: float) -> Claim:
    return Claim(
        claim_id=f"from-scratch-readme-{speedup:g}x", source=_FROM_SCRATCH,
        quote=f"{_FROM_SCRATCH_QUOTE} — {end} end: α {alpha:g}, draft {cheaper}× cheaper, {speedup:g}×",
        verified=True, verification=_FROM_SCRATCH_VERIFIED,
        setting="no pair, device or γ; \"acceptance rate\" read as i.i.d. α",
        cost_ratio=1 / cheaper, alpha=alpha, speedup=speedup, gamma=None,
        assumptions=f"c = 1/{cheaper}, α = {alpha:g}, the most favourable γ in 1–16",
    )


def _spec_bench(method: str, speedup: float, tau: float, assumptions: str, preset: str | None = None) -> Claim:
    return Claim(
        claim_id=f"spec-bench-a100-{method.split()[0].lower()}", source=_SPEC_BENCH,
        quote=f"{method} | {speedup:.2f}x overall | #Mean Accepted Tokens {tau:.2f}",
        verified=True, verification=_SPEC_BENCH_VERIFIED, setting=_SPEC_BENCH_SETTING,
        preset=preset, hardware="a100-80gb" if preset else None, cost_ratio=None if preset else 0.0,
        speedup=speedup, gamma=None, tau=tau, gamma_max=8, assumptions=assumptions,
    )


_FREE_DRAFT = "draft cost c = 0 and verify = one target step: an upper bound"

CLAIMS: tuple[Claim, ...] = (
    _article("article-gpt2-small-large",
             "GPT-2 Small draft / GPT-2 Large target, K = 4, greedy: 156 → 62 ms/token, 2.5×", 2.5, 156.0, 62.0,
             "gpt2-small-large", "t4", "K = 4 drafts, greedy; device not stated",
             "device not stated: T4 fp16, batch 1, memory-bound roofline, 512-token context assumed"),
    _article("article-llama-7b-13b", "Llama-7B draft / Llama-13B target, K = 4, greedy: 89 → 31 ms/token, 2.9×",
             2.9, 89.0, 31.0, "llama2-7b-13b", "a100-80gb", "K = 4 drafts, greedy; device not stated",
             _LLAMA_ASSUMED),
    _article("article-1000-tokens", "a 1000-token generation, 89 s → 28 s, 3.2×", 3.2, 89.0, 28.0,
             "llama2-7b-13b", "a100-80gb", "K = 4 drafts, greedy; pair and device not stated",
             "pair not stated: 89 s / 1000 tokens = 89 ms/token, the Llama-13B baseline above, so that pair; "
             + _LLAMA_ASSUMED),
    _torch_velocity("low", 1.5),
    _torch_velocity("high", 2.5),
    _torch_velocity("notebook-xl", 2.5, preset="distilgpt2-gpt2-xl"),
    _from_scratch("favourable", 20, 0.8, 3.0),
    _from_scratch("unfavourable", 10, 0.7, 2.0),
    *(_t5_claim(*row) for row in _T5_ROWS),
    _spec_bench("SpS", 1.49, 2.28, "draft not named on the leaderboard: the 68M Vicuna draft of NJUNLP/MCSD (the "
                "weights Spec-Bench's Readme links for SpS) assumed; γ not stated: the γ ≥ τ − 1 most favourable "
                "at τ = 2.28 (greedy chain, i.i.d. α)", preset="vicuna-68m-7b"),
    _spec_bench("PLD", 1.59, 1.73, f"prompt lookup, a string match: {_FREE_DRAFT}; γ not stated"),
    _spec_bench("EAGLE", 2.29, 3.61, f"tree drafts from a one-layer head, cost not stated: {_FREE_DRAFT} (the "
                "chain model does not describe trees)"),
    _spec_bench("Medusa", 1.78, 2.32, f"heads on the target, cost not stated: {_FREE_DRAFT} (tree drafts)"),
    Claim(
        claim_id="gpt-fast-70b-int4",
        source="github.com/pytorch-labs/gpt-fast README.md, Benchmarks → Speculative Sampling",
        quote="Verifier: Llama-70B (int4), Draft: Llama-7B (int4): 48.4 tok/s (baseline table: Llama-2-70B "
              "4-bit (G=32) 25.25 tok/s) → 1.92×",
        verified=True, verification="verified against the stored README (both tok/s figures; the speedup is their "
                                    "ratio, computed here)",
        setting="A100 80GB power-limited to 330 W, batch 1, 5-token prompt, int4 weights (group size 32)",
        preset="llama2-7b-70b", hardware="a100-80gb", bytes_per_param=0.625,
        speedup=round(48.4 / 25.25, 2), gamma=None, gamma_max=8,
        baseline_ms_per_token=round(1000 / 25.25, 2), speculative_ms_per_token=round(1000 / 48.4, 2),
        context_tokens=128.0,
        assumptions="int4 g32 = 0.5 byte + a 2-byte scale and zero per 32 weights = 0.625 bytes/param; "
                    "speculate_k not stated in the README (scripts/speculate_70B_int4.sh is not stored here): "
                    "the most favourable γ in 1–8; short context (128 tokens)",
    ),
)
