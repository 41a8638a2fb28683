"""Cost-curve points: which a run times (sized to the run) and which a fit may trust (screened against neighbours).

Torch-free (numpy and pandas on the tables), so ``calibrate`` screens a run's
``cost_target.csv`` exactly as the sweep did.

**Sized to the run** (:func:`plan_cost_points`). The cost curves time target
forwards of ``n`` tokens after ``c`` cached, and draft steps after ``c``. A
run's cells verify 1..γ_max + 1 tokens at contexts from their shortest prompt
to their longest prompt plus the new tokens, so that is what is timed most:

* contexts evenly spaced over [shortest prompt, longest prompt + new tokens],
  three when they span 64 tokens or more, two when 8 or more, else one;
  rounded to a multiple of 32 (of 8 when they span less than 96), so runs of
  similar prompts time the same contexts — the default run's are 64, 160 and
  256, as before;
* token counts 1..γ_max + 1, the ones the cells verify, with many repeats:
  40 at the default run's 6 (prompt, repeat) pairs per cell or more
  (``SweepConfig.cost_repeats_verified`` says why 40), in proportion below
  that, no fewer than 5 — a cell of 3 pairs cannot tell a cost error of a
  few percent from its own noise, so it does not pay 40 repeats to remove
  one;
* token counts up to :data:`CURVE_MAX_TOKENS` (16) beyond those, and the
  draft steps, with few: 5 at 6 pairs, no fewer than 3. They are cheap (the
  default run: 165 of its 780 points) and not idle: without them the target
  fit's context slope is worse determined and the speedup curve the
  calibration draws up to γ = 10 rests on a cost table extrapolated from
  its last two token counts. Re-calibrating 20 committed runs without them
  (``benchmarks/cost_plan_ablation.py``, ``results/2026-11-24-small-run.md``)
  made the held-out speedup error worse in most runs and moved the γ 1-10
  curve by up to 30%.

The default run (γ 2 and 4, 6 prompts of 53–181 tokens, 64 new tokens, 3
repeats) times the 780 points it always did; the issue's small run (γ 4, one
181-token prompt, 24 new tokens, 3 repeats) 2 × (5 × 20 + 11 × 3) + 2 × 3 =
272 where it timed the same 780 (its 40-repeat token counts at three
contexts were 525 of them). Every value given explicitly (``--cost-contexts``,
``--cost-max-tokens``, ``SweepConfig.cost_repeats`` …) is used as given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence

#: The default run's (prompt, repeat) pairs per cell, at which the repeats are the full ones below.
FULL_PAIRS = 6
#: Repeats of the token counts the cells verify, at :data:`FULL_PAIRS` pairs or more, and the fewest.
REPEATS_VERIFIED, MIN_REPEATS_VERIFIED = 40, 5
#: Repeats of every other point (draft steps, token counts beyond the verified ones), and the fewest.
REPEATS, MIN_REPEATS = 5, 3
#: Token counts timed (with :data:`REPEATS`) beyond the verified ones: the calibration's curve reaches γ = 10.
CURVE_MAX_TOKENS = 16


class CostSettings(Protocol):
    """What sizing the cost points reads of a sweep's config (``measure.sweep.SweepConfig`` has it)."""

    @property
    def gamma_max(self) -> int: ...

    max_new_tokens: int
    max_prompt_tokens: int
    repeats: int
    cost_contexts: tuple[int, ...] | None
    cost_max_tokens: int | None
    cost_repeats: int | None
    cost_repeats_verified: int | None


@dataclass(frozen=True)
class CostPlan:
    """The cost-curve points a run times: contexts × token counts 1..``max_tokens`` (the first ``n_verified``
    with ``repeats_verified`` repeats, the rest with ``repeats``), and draft steps at each context × ``repeats``.
    ``sized``: how each value was chosen, in words."""

    contexts: tuple[int, ...]
    max_tokens: int
    n_verified: int
    repeats: int
    repeats_verified: int
    sized: tuple[str, ...] = ()

    def n_points(self, n_drafts: int) -> int:
        """How many points the plan times for a run with ``n_drafts`` drafts."""
        n_v = min(self.n_verified, self.max_tokens)
        per_context = (n_v * max(self.repeats, self.repeats_verified) + (self.max_tokens - n_v) * self.repeats
                       + n_drafts * self.repeats)
        return len(self.contexts) * per_context

    def describe(self, n_drafts: int) -> dict:
        """``run.json`` ``cost_plan``."""
        return {"contexts": list(self.contexts), "max_tokens": self.max_tokens, "n_verified": self.n_verified,
                "repeats": self.repeats, "repeats_verified": self.repeats_verified,
                "n_points": self.n_points(n_drafts), "sized": list(self.sized)}

    def summary(self, n_drafts: int) -> str:
        """One line: ``780 points: contexts 64, 160, 256; 1-5 tokens × 40 repeats, 6-16 × 5; draft steps × 5``."""
        n_v = min(self.n_verified, self.max_tokens)
        tokens = f"1-{n_v} tokens × {max(self.repeats, self.repeats_verified)} repeats"
        if self.max_tokens > n_v:
            tokens += f", {n_v + 1}-{self.max_tokens} × {self.repeats}"
        return (f"{self.n_points(n_drafts)} points: contexts {', '.join(map(str, self.contexts))}; {tokens}; "
                f"draft steps × {self.repeats}")


def _clamp(v: float, lo: int, hi: int) -> int:
    return int(min(max(math.ceil(v), lo), hi))


def planned_contexts(prompt_tokens: Sequence[int], max_new_tokens: int, cap: int) -> tuple[int, ...]:
    """Contexts spanning what the cells see, [shortest prompt, longest prompt + new tokens] (module docstring),
    none above ``cap`` (what the engine's cache holds)."""
    if not prompt_tokens:
        raise ValueError("cost curves need the run's prompt lengths: no prompts")
    lo, hi = min(prompt_tokens), max(prompt_tokens) + max_new_tokens
    span = hi - lo
    k = 3 if span >= 64 else 2 if span >= 8 else 1
    grid = 32 if span >= 96 else 8 if span >= 16 else 1
    raw = [lo + i * span / (k - 1) for i in range(k)] if k > 1 else [lo]
    out = [min(max(grid * round(c / grid), 1), cap) for c in raw]
    return tuple(dict.fromkeys(out))


def plan_cost_points(config: CostSettings, prompt_tokens: Mapping[str, Sequence[int]]) -> CostPlan:
    """The cost points of a run (module docstring); ``prompt_tokens``: per domain, its prompts' token counts."""
    pairs = min(len(v) for v in prompt_tokens.values()) * config.repeats if prompt_tokens else config.repeats
    n_verified = config.gamma_max + 1
    sized = []
    if config.cost_max_tokens:
        max_tokens = config.cost_max_tokens
        sized.append(f"token counts 1-{max_tokens} as given (--cost-max-tokens)")
    else:
        max_tokens = max(n_verified, CURVE_MAX_TOKENS)
        sized.append(f"token counts 1-{n_verified} (the cells verify up to γ_max + 1) with more repeats, up to "
                     f"{max_tokens} for the fit's slope and the speedup curve")
    if config.cost_contexts:
        contexts = tuple(config.cost_contexts)
        sized.append("contexts as given (--cost-contexts)")
    else:
        lengths = [n for v in prompt_tokens.values() for n in v]
        contexts = planned_contexts(lengths, config.max_new_tokens, context_bound(config) - max_tokens)
        sized.append(f"contexts over the cells' {min(lengths)}-{max(lengths) + config.max_new_tokens} tokens "
                     "(shortest prompt to longest prompt + new tokens)")
    scale = pairs / FULL_PAIRS
    rep_v = config.cost_repeats_verified or _clamp(REPEATS_VERIFIED * scale, MIN_REPEATS_VERIFIED, REPEATS_VERIFIED)
    rep = config.cost_repeats or _clamp(REPEATS * scale, MIN_REPEATS, REPEATS)
    if not (config.cost_repeats_verified and config.cost_repeats):
        sized.append(f"repeats for {pairs} (prompt, repeat) pairs per cell ({FULL_PAIRS} or more: "
                     f"{REPEATS_VERIFIED} and {REPEATS})")
    return CostPlan(contexts, max_tokens, n_verified, rep, rep_v, tuple(sized))


def context_bound(config: CostSettings) -> int:
    """The longest sequence the cost points can reach (context + tokens), known before any prompt is encoded:
    what the engine's static cache must hold for them. Planned contexts stay within what the cells reach
    (longest prompt + new tokens + γ_max), so they never make the cache longer than the cells do."""
    n = config.cost_max_tokens or max(config.gamma_max + 1, CURVE_MAX_TOKENS)
    if config.cost_contexts:
        return max(config.cost_contexts) + n
    return max(config.max_prompt_tokens + config.max_new_tokens + config.gamma_max, 1 + n)
