"""Published speculative-decoding results next to what the simulator predicts for them.

Only numbers whose source could be quoted are listed; each row says where it
comes from and which fields the source does not state. Where the source gives
no cost ratio c, the simulator is evaluated at c = 0 (a free draft: verify =
one target step), which is an *upper bound* on the speedup the Leviathan model
allows, and the column ``implied_cost_ratio`` gives the c at which the closed
form reproduces the reported speedup (only when γ is stated).

* Spec-Bench leaderboard (Xia et al., hemingkx/Spec-Bench ``Leaderboard.md``,
  "Leaderboard on A100", Vicuna-7B-v1.3, greedy, FP16, batch 1): SpS 1.49×
  overall with 2.28 mean accepted tokens per step; PLD 1.59× with 1.73.
  γ and α are not stated (τ = mean accepted tokens per step is).
* Leviathan et al. 2023 (arXiv:2211.17192), Table 2, T5-XXL target, T5-small
  draft, WMT EnDe, greedy: γ = 7, α = 0.75, 3.4× — quoted from the paper's
  table as recalled; it could not be re-checked against the paper text in the
  session that wrote this file, so the row is marked ``unverified``.
* gpt-fast (pytorch-labs blog) reports speculative-decoding throughput but no
  α or c in a form that could be checked here, so it has no row.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import pandas as pd

from sim.acceptance import IIDAcceptance, expected_tokens_iid
from sim.analytic import speedup_leviathan


@dataclass(frozen=True)
class PublishedResult:
    """One published measurement; ``None`` for fields the source does not state."""

    source: str
    setting: str
    reported_speedup: float
    alpha: float | None
    tau_tokens_per_step: float | None
    gamma: int | None
    cost_ratio: float | None
    status: str  # "verified" (quoted from the source file) or "unverified"
    note: str

    def __post_init__(self) -> None:
        if self.alpha is None and self.tau_tokens_per_step is None:
            raise ValueError(f"{self.source}: need α or τ (tokens per step)")
        if self.status not in ("verified", "unverified"):
            raise ValueError(f"status must be 'verified' or 'unverified', got {self.status!r}")


PUBLISHED: tuple[PublishedResult, ...] = (
    PublishedResult(
        source="Spec-Bench leaderboard, A100 (hemingkx/Spec-Bench Leaderboard.md)",
        setting="SpS, Vicuna-7B-v1.3 target, greedy, FP16, batch 1, overall",
        reported_speedup=1.49, alpha=None, tau_tokens_per_step=2.28, gamma=None, cost_ratio=None,
        status="verified", note="γ, α and c not stated; τ = #mean accepted tokens per step",
    ),
    PublishedResult(
        source="Spec-Bench leaderboard, A100 (hemingkx/Spec-Bench Leaderboard.md)",
        setting="PLD (prompt lookup), Vicuna-7B-v1.3, greedy, FP16, batch 1, overall",
        reported_speedup=1.59, alpha=None, tau_tokens_per_step=1.73, gamma=None, cost_ratio=None,
        status="verified", note="γ, α not stated; draft is a string lookup (c ≈ 0)",
    ),
    PublishedResult(
        source="Leviathan et al. 2023 (arXiv:2211.17192), Table 2",
        setting="T5-XXL target, T5-small draft, WMT EnDe, greedy",
        reported_speedup=3.4, alpha=0.75, tau_tokens_per_step=None, gamma=7, cost_ratio=None,
        status="unverified", note="numbers not re-checked against the paper in this session; c not stated per row",
    ),
)


def published_table(rows: tuple[PublishedResult, ...] = PUBLISHED) -> pd.DataFrame:
    """The published rows with the simulator's prediction (see module docstring)."""
    out = []
    for r in rows:
        c = r.cost_ratio if r.cost_ratio is not None else 0.0
        if r.alpha is not None and r.gamma is not None:
            tokens = float(IIDAcceptance(r.alpha).expected_tokens(r.gamma))
            predicted = float(speedup_leviathan(r.alpha, c, r.gamma))
        else:
            tokens = float(r.tau_tokens_per_step)
            predicted = tokens / 1.0  # c = 0: every round costs one target step
        implied_c = (tokens / r.reported_speedup - 1.0) / r.gamma if r.gamma else math.nan
        if r.alpha is not None and r.gamma is not None:
            assert math.isclose(tokens, float(expected_tokens_iid(r.alpha, r.gamma)))
        out.append({
            **asdict(r),
            "cost_ratio_used": c,
            "expected_tokens_per_round": tokens,
            "simulator_speedup": predicted,
            "simulator_is_upper_bound": r.cost_ratio is None,
            "implied_cost_ratio": implied_c,
        })
    return pd.DataFrame(out)
