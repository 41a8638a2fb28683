"""Greedy losslessness with a stated near-tie tolerance (any engine).

Greedy speculative decoding must emit exactly the target's greedy tokens.
On engines whose kernels give slightly different logits for a batch of
tokens than for the same tokens one at a time (llama.cpp's quantised
kernels do; so can cuBLAS), the speculative loop — which verifies γ+1
tokens in one batch — may pick the other token where the target's top two
logits are within that noise. So a generation is judged as:

* ``identical`` — the same tokens as the baseline;
* ``near_tie`` — the first divergence is at a position where the target's
  own top-two logit margin (from its token-by-token baseline path) is at most
  ``tolerance``, and both diverging tokens are within ``tolerance`` of the top
  logit; everything after a near tie is a different (equally greedy)
  continuation and is not compared;
* ``failure`` — any other divergence (a larger margin, a token outside the
  near-tied pair, or one output a strict prefix of the other).

:data:`NEAR_TIE_TOLERANCE` is the default tolerance, in logits; see its
comment for where the number comes from.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import torch

from measure.seam import Decoder, Engine, TargetModel

#: Logit margin below which a greedy divergence counts as a near tie. Measured with llama.cpp on the packaged
#: SmolLM2-135M Q4_1 (3 prompts x 48 greedy tokens, batches of 2..9 tokens against the same positions decoded
#: one at a time, 1869 rows): single logits move by up to 1.47, the target's top-two margin by up to 0.42
#: (median 0.09, p99 0.40). 0.5 covers that spread; a divergence at a wider margin is a bug, not noise.
NEAR_TIE_TOLERANCE = 0.5

STATUSES = ("identical", "near_tie", "failure")


@dataclass(frozen=True)
class LosslessCheck:
    """Verdict on one greedy generation against the baseline (see module docstring).

    ``position``: index into the new tokens of the first divergence (None when
    identical); ``margin``: the target's top-two logit margin there (None when
    identical or when one output is a prefix of the other); ``tokens``:
    (baseline token, speculative token) at the divergence.
    """

    status: str
    position: int | None = None
    margin: float | None = None
    tolerance: float = NEAR_TIE_TOLERANCE
    tokens: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"lossless status {self.status!r}: unknown; valid: {', '.join(STATUSES)}")

    @property
    def ok(self) -> bool:
        """Identical or a near tie (the loop is lossless up to the engine's batch noise)."""
        return self.status != "failure"

    def as_dict(self) -> dict:
        return asdict(self)


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token, ``min(len)`` when one is a strict prefix, None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if int(x) != int(y):
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def check_greedy_lossless(baseline: Sequence[int], speculative: Sequence[int],
                          logits_at: Callable[[int], torch.Tensor],
                          tolerance: float = NEAR_TIE_TOLERANCE) -> LosslessCheck:
    """Judge ``speculative`` against ``baseline`` (new tokens of greedy generations of the same prompt).

    ``logits_at(i)`` returns the target's logits ``[V]`` for new position ``i``
    given the prompt and ``baseline[:i]`` (called only at a divergence).
    """
    if not tolerance >= 0:
        raise ValueError(f"near-tie tolerance must be >= 0, got {tolerance}")
    i = first_divergence(baseline, speculative)
    if i is None:
        return LosslessCheck("identical", tolerance=tolerance)
    if i >= len(baseline) or i >= len(speculative):  # a strict prefix: stopped early or ran on
        return LosslessCheck("failure", position=i, tolerance=tolerance)
    b, s = int(baseline[i]), int(speculative[i])
    logits = logits_at(i).float().reshape(-1)  # [V]
    top2 = torch.topk(logits, 2).values
    margin = float(top2[0] - top2[1])
    top = float(top2[0])
    tied = margin <= tolerance and top - float(logits[b]) <= tolerance and top - float(logits[s]) <= tolerance
    return LosslessCheck("near_tie" if tied else "failure", position=i, margin=margin, tolerance=tolerance,
                         tokens=(b, s))


def baseline_logits_at(decoder: Decoder, prompt_ids: torch.Tensor, baseline: Sequence[int]) -> Callable[[int], torch.Tensor]:
    """A ``logits_at`` for :func:`check_greedy_lossless` following the target's token-by-token baseline path.

    Prefills ``prompt_ids`` ``[1, S]`` on ``decoder`` (reset first), then feeds
    ``baseline`` one token at a time up to the asked position, as the
    autoregressive baseline did, and returns that position's logits (a copy).
    """

    def logits_at(i: int) -> torch.Tensor:
        decoder.reset()
        logits = decoder.forward(prompt_ids, last_only=True)[-1]  # [V]
        for t in baseline[:i]:
            logits = decoder.forward(torch.tensor([[int(t)]], dtype=torch.long), last_only=True)[-1]
        out = logits.clone()
        decoder.reset()
        return out

    return logits_at


def judge_against_baseline(engine: Engine, target: TargetModel, prompt_ids: torch.Tensor, baseline: Sequence[int],
                           other: Sequence[int]) -> LosslessCheck:
    """A greedy generation ``other`` judged against the ``baseline`` of the same prompt with ``engine``'s near-tie
    tolerance: the one check every run kind (chains, trees) applies to each visit.

    Identical outputs cost nothing; at a divergence the target's logits along the baseline's token-by-token path
    are recomputed once, on a fresh decoder of ``target`` (:func:`baseline_logits_at`), for the margin.
    """
    tol = engine.near_tie_tolerance
    if tuple(other) == tuple(baseline):
        return LosslessCheck("identical", tolerance=tol)
    logits_at = baseline_logits_at(target.new_decoder(), prompt_ids, baseline)
    return check_greedy_lossless(baseline, other, logits_at, tol)


def count_statuses(checks: Sequence[LosslessCheck]) -> dict[str, int]:
    """``{"identical": n, "near_tie": n, "failure": n}`` over generations."""
    return {s: sum(c.status == s for c in checks) for s in STATUSES}
