"""Closed-form speedup predictor (Leviathan et al. 2023), numpy-vectorised.

Speedup of one request, decoding ``N`` tokens at a representative context:

    speedup(γ) = E[tokens per round](γ) × t_target_step / E[t_round](γ)
    t_round(d) = d · t_draft_step + t_verify(d + 1) + t_overhead(d)

where ``d`` is the number of tokens drafted in the round: γ, except for
acceptance models whose draft may propose fewer (lookup drafts; see
``sim.acceptance.drafted_distribution``), for which the expectation runs over
``d``. Ratio of expectations = long-run tokens per unit time (renewal-reward).

With ``t_verify = t_target_step``, ``t_draft_step = c · t_target_step`` and no
overhead this is exactly Leviathan et al. Theorem 3.8:
``(1 − α^(γ+1)) / ((1 − α)(γc + 1))`` — see :func:`speedup_leviathan`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from sim.acceptance import AcceptanceModel, IIDAcceptance, _check_gamma, drafted_distribution, expected_tokens_iid
from sim.cost import CostModel, LeviathanCost, round_time_ms


def speedup_leviathan(
    alpha: np.ndarray | float, cost_ratio: np.ndarray | float, gamma: np.ndarray | int
) -> np.ndarray:
    """Theorem 3.8 of Leviathan et al., broadcast over ``alpha``, ``cost_ratio``, ``gamma``."""
    a = np.asarray(alpha, dtype=float)
    c = np.asarray(cost_ratio, dtype=float)
    g = np.asarray(gamma, dtype=float)
    return expected_tokens_iid(a, g) / (g * c + 1.0)


def sweep(
    alphas: np.ndarray, cost_ratios: np.ndarray, gammas: np.ndarray
) -> np.ndarray:
    """Speedup on the full grid, shape ``[len(alphas), len(cost_ratios), len(gammas)]``."""
    a = np.asarray(alphas, dtype=float)[:, None, None]
    c = np.asarray(cost_ratios, dtype=float)[None, :, None]
    g = np.asarray(gammas, dtype=float)[None, None, :]
    return speedup_leviathan(a, c, g)


def optimal_gamma_leviathan(
    alpha: np.ndarray | float, cost_ratio: np.ndarray | float, gamma_max: int = 16
) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised argmax over γ = 1..gamma_max; returns (best γ, best speedup)."""
    gamma_max = _check_gamma(gamma_max)
    gs = np.arange(1, gamma_max + 1, dtype=float)
    a = np.asarray(alpha, dtype=float)[..., None]
    c = np.asarray(cost_ratio, dtype=float)[..., None]
    s = speedup_leviathan(a, c, gs)
    idx = np.argmax(s, axis=-1)
    return gs[idx].astype(int), np.take_along_axis(s, idx[..., None], axis=-1)[..., 0]


@dataclass(frozen=True)
class PredictionRow:
    """Prediction at one γ."""

    gamma: int
    expected_tokens_per_round: float
    round_time_ms: float
    draft_ms: float
    verify_ms: float
    overhead_ms: float
    baseline_ms_per_token: float
    speculative_ms_per_token: float
    tokens_per_s_baseline: float
    tokens_per_s_speculative: float
    speedup: float

    def as_dict(self) -> dict:
        return asdict(self)


def predict_row(
    acceptance: AcceptanceModel,
    cost: CostModel,
    gamma: int,
    context_tokens: float = 0.0,
    batch: int = 1,
) -> PredictionRow:
    """Closed-form prediction for one request at draft length ``gamma``."""
    gamma = _check_gamma(gamma)
    tokens = acceptance.expected_tokens(gamma)
    probs = drafted_distribution(acceptance, gamma)  # P(drafted = d), d = 0..γ
    ds = [d for d in range(gamma + 1) if probs[d] > 0]
    draft = sum(probs[d] * d * cost.draft_step_ms(context_tokens, batch) for d in ds)
    verify = sum(probs[d] * cost.verify_ms(d + 1, context_tokens, batch) for d in ds)
    overhead = sum(probs[d] * cost.round_overhead_ms(d) for d in ds)
    assert math.isclose(draft + verify + overhead,
                        sum(probs[d] * round_time_ms(cost, d, context_tokens, batch) for d in ds), rel_tol=1e-9)
    return PredictionRow(gamma=gamma, **timing_fields(tokens, draft, verify, overhead,
                                                      cost.target_step_ms(context_tokens, batch)))


def timing_fields(tokens_per_round: float, draft_ms: float, verify_ms: float, overhead_ms: float,
                  baseline_ms_per_token: float) -> dict:
    """Every :class:`PredictionRow` field but γ, from tokens per round and the round's times (renewal-reward)."""
    rt = draft_ms + verify_ms + overhead_ms
    spec_per_tok = rt / tokens_per_round
    return {"expected_tokens_per_round": tokens_per_round, "round_time_ms": rt, "draft_ms": draft_ms,
            "verify_ms": verify_ms, "overhead_ms": overhead_ms, "baseline_ms_per_token": baseline_ms_per_token,
            "speculative_ms_per_token": spec_per_tok, "tokens_per_s_baseline": 1000.0 / baseline_ms_per_token,
            "tokens_per_s_speculative": 1000.0 / spec_per_tok, "speedup": baseline_ms_per_token / spec_per_tok}


def predict(
    acceptance: AcceptanceModel,
    cost: CostModel,
    gammas: range | list[int],
    context_tokens: float = 0.0,
    batch: int = 1,
) -> list[PredictionRow]:
    """Predictions for every γ in ``gammas``."""
    return [predict_row(acceptance, cost, g, context_tokens, batch) for g in gammas]


def optimal_gamma(rows: list[PredictionRow]) -> PredictionRow:
    """The row with the highest speedup (the smallest γ on ties)."""
    if not rows:
        raise ValueError("no predictions to choose from")
    return max(rows, key=lambda r: (r.speedup, -r.gamma))


def break_even_alpha(
    gamma: int,
    cost: CostModel | None = None,
    cost_ratio: float | None = None,
    context_tokens: float = 0.0,
    batch: int = 1,
) -> float | None:
    """The i.i.d. α at which speculative decoding at ``gamma`` exactly matches the baseline.

    Returns 0.0 when it wins even at α = 0 and ``None`` when it loses even at
    α = 1 (the draft plus verification is too expensive for any acceptance).
    """
    gamma = _check_gamma(gamma)
    if cost is None:
        if cost_ratio is None:
            raise ValueError("give either a cost model or a cost ratio")
        cost = LeviathanCost(cost_ratio)
    needed = round_time_ms(cost, gamma, context_tokens, batch) / cost.target_step_ms(context_tokens, batch)
    # speedup >= 1  <=>  E[tokens](alpha) >= round_time / target_step
    if needed <= 1.0:
        return 0.0
    if needed > gamma + 1:
        return None
    if math.isclose(needed, gamma + 1):
        return 1.0
    from scipy.optimize import brentq  # imported here: scipy.optimize costs ~0.5 s, most runs never need it

    return float(brentq(lambda a: float(expected_tokens_iid(a, gamma)) - needed, 0.0, 1.0, xtol=1e-12))


def cost_per_million_tokens(tokens_per_s: float, usd_per_hour: float) -> float:
    """Dollars per 1M generated tokens for a device rented at ``usd_per_hour``."""
    if tokens_per_s <= 0:
        raise ValueError(f"tokens per second must be > 0, got {tokens_per_s}")
    if usd_per_hour < 0:
        raise ValueError(f"price per hour must be >= 0, got {usd_per_hour}")
    return usd_per_hour / 3600.0 / tokens_per_s * 1e6


__all__ = [
    "IIDAcceptance",
    "PredictionRow",
    "break_even_alpha",
    "cost_per_million_tokens",
    "optimal_gamma",
    "optimal_gamma_leviathan",
    "predict",
    "predict_row",
    "speedup_leviathan",
    "sweep",
    "timing_fields",
]
