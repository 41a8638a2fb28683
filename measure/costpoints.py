"""Cost-curve points: which a run times (sized to the run) and which a fit may trust (screened against neighbours).

Torch-free (numpy and pandas on the tables), so ``calibrate`` screens a run's
``cost_target.csv`` exactly as the sweep did.

**Screened** (:func:`screen_and_retime`). The fits use the median of a point's
repeats, which one slow repeat cannot move; a machine busy for a while can
slow most of them (issue #28: a 6-token forward at 1,764 ms among 53-ms
neighbours, and the prediction at γ = 5 fell to 0.07×). After the last point
the sweep compares each point's median with its neighbours' on the curve (n ± 1
tokens at its context); one over :data:`OUTLIER_RATIO` times theirs is timed
again (as many repeats again); if the re-timing is in line it replaces the
first timings (kept on disk, listed as ``superseded``), else the point is left
out of the fit. Both are said in the run's output and in ``run.json``
``cost_screening``; ``calibrate`` screens every run's table the same way
(runs written before, cost curves timed on a Ray worker) and says so in its notes.

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
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Protocol, Sequence

if TYPE_CHECKING:
    import pandas as pd

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

    # read-only (properties): a frozen dataclass's fields satisfy them
    @property
    def gamma_max(self) -> int: ...
    @property
    def max_new_tokens(self) -> int: ...
    @property
    def max_prompt_tokens(self) -> int: ...
    @property
    def repeats(self) -> int: ...
    @property
    def cost_contexts(self) -> tuple[int, ...] | None: ...
    @property
    def cost_max_tokens(self) -> int | None: ...
    @property
    def cost_repeats(self) -> int | None: ...
    @property
    def cost_repeats_verified(self) -> int | None: ...


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
    max_tokens = max_tokens_of(config)
    if config.cost_max_tokens:
        sized.append(f"token counts 1-{max_tokens} as given (--cost-max-tokens)")
    else:
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


def max_tokens_of(config: CostSettings) -> int:
    """The largest token count the cost points time: ``--cost-max-tokens``, else max(γ_max + 1, 16)."""
    return config.cost_max_tokens or max(config.gamma_max + 1, CURVE_MAX_TOKENS)


def context_bound(config: CostSettings) -> int:
    """The longest sequence the cost points can reach (context + tokens), known before any prompt is encoded:
    what the engine's static cache must hold for them. Planned contexts stay within what the cells reach
    (longest prompt + new tokens + γ_max), so they never make the cache longer than the cells do."""
    n = max_tokens_of(config)
    if config.cost_contexts:
        return max(config.cost_contexts) + n
    return max(config.max_prompt_tokens + config.max_new_tokens + config.gamma_max, 1 + n)


# -- which points a fit may trust -------------------------------------------------------------------------------
#: A point whose median is this many times above the median of its neighbours' is out of line: CPU
#: shape effects move a forward by up to 1.6x between neighbouring token counts (4 tokens after 3 on the 2-core
#: VM), a machine busy for a while by 20-30x (a 6-token forward at 1,764 ms among 53-ms neighbours, issue #28).
#: Of the 34 committed cost tables (results/, hogged runs included) none has a point out of line at 1.7x, one
#: at 1.5x, 14 at 1.3x.
OUTLIER_RATIO = 2.0
#: A point's median over fewer repeats is a mean (of 1 or 2 timings), not robust enough to call it out of line.
MIN_SCREEN_REPEATS = 3


@dataclass(frozen=True)
class CostOutlier:
    """A target forward whose median over its repeats is out of line with its neighbours on the curve (n ± 1 at
    its context), and what was done: ``re-timed`` (the re-timing is in line: it replaces the first timings) or
    ``dropped`` (still out of line, or not re-timed: left out of the fit)."""

    n_tokens: int
    context_tokens: int
    median_ms: float
    expected_ms: float
    repeats: int
    action: str
    retimed_ms: float | None = None

    def as_text(self) -> str:
        """The point and what was done, in words (the run's output, ``run.json``, calibration notes)."""
        what = (f"a {self.n_tokens}-token forward after {self.context_tokens} cached took {self.median_ms:,.1f} ms "
                f"(median of {self.repeats}) against {self.expected_ms:,.1f} ms around it")
        if self.action == "re-timed":
            return f"{what}: re-timed, {self.retimed_ms:,.1f} ms, in line; the re-timing replaces it"
        if self.retimed_ms is not None:
            return f"{what}: re-timed, still {self.retimed_ms:,.1f} ms; dropped from the fit"
        return f"{what}: dropped from the fit"

    def as_dict(self) -> dict:
        """``run.json`` ``cost_screening.outliers`` entry."""
        return {"n_tokens": self.n_tokens, "context_tokens": self.context_tokens, "median_ms": self.median_ms,
                "expected_ms": self.expected_ms, "repeats": self.repeats, "action": self.action,
                "retimed_ms": self.retimed_ms, "text": self.as_text()}


@dataclass(frozen=True)
class Screening:
    """A ``cost_target`` table screened: ``kept`` the rows a fit may use (superseded repeats and out-of-line
    points left out), ``outliers`` the points left out, each dropped."""

    kept: "pd.DataFrame"
    outliers: tuple[CostOutlier, ...]


Key = tuple[int, int, int]  # (n_tokens, context_tokens, repeat) of a cost_target row


def _neighbours(med: dict[tuple[int, int], float], n: int, c: int) -> list[float]:
    """The medians of the curve's neighbours of (n, c): the next smaller and larger token count at context c."""
    ns = sorted(k[0] for k in med if k[1] == c)
    i = ns.index(n)
    return [med[(m, c)] for m in ns[max(i - 1, 0):i] + ns[i + 1:i + 2]]


def out_of_line(cost_target: "pd.DataFrame", ratio: float = OUTLIER_RATIO
                ) -> list[tuple[int, int, float, float, int]]:
    """The target points whose median is over ``ratio`` times their neighbours' median, as ``(n, context,
    median ms, neighbours' median ms, repeats)``, the most extreme first.

    Only too slow: a busy machine makes a timing slower, never faster, and a point faster than its neighbours
    is what an in-line point next to a busy one looks like. Iterative: the most extreme point is set aside
    before the next is judged, so one busy point never makes its neighbours look out of line. A point is judged
    only with :data:`MIN_SCREEN_REPEATS` repeats or more and at least one neighbour.
    """
    import numpy as np

    if cost_target.empty:
        return []
    g = cost_target.groupby(["n_tokens", "context_tokens"])["ms"]
    med = {(int(n), int(c)): float(v) for (n, c), v in g.median().items()}
    reps = {(int(n), int(c)): int(v) for (n, c), v in g.size().items()}
    found: list[tuple[int, int, float, float, int]] = []
    while True:
        worst = None
        for (n, c), m in med.items():
            if reps[(n, c)] < MIN_SCREEN_REPEATS:
                continue
            near = _neighbours(med, n, c)
            if not near or m <= 0:
                continue
            expected = float(np.median(near))
            off = math.log(m / expected) if expected > 0 else math.inf
            if off > math.log(ratio) and (worst is None or off > worst[0]):
                worst = (off, n, c, m, expected)
        if worst is None:
            return found
        _, n, c, m, expected = worst
        found.append((n, c, m, expected, reps[(n, c)]))
        del med[(n, c)]


def screen_target(cost_target: "pd.DataFrame", superseded: Iterable[Sequence[int]] = (),
                  retimed: "dict[tuple[int, int], CostOutlier] | None" = None) -> Screening:
    """``cost_target`` without its superseded repeats (``run.json`` ``cost_screening.superseded``) and without
    the points :func:`out_of_line` finds in what is left (each a ``dropped`` :class:`CostOutlier`; ``retimed``:
    the first timings of points re-timed, to say so)."""
    sup = {tuple(int(x) for x in k) for k in superseded}
    df = cost_target
    if sup and not df.empty:
        keys = list(zip(df["n_tokens"].astype(int), df["context_tokens"].astype(int), df["repeat"].astype(int)))
        df = df[[k not in sup for k in keys]]
    bad = out_of_line(df)
    outliers = []
    for n, c, m, expected, reps in bad:
        first = (retimed or {}).get((n, c))
        if first is not None:
            outliers.append(CostOutlier(n, c, first.median_ms, first.expected_ms, first.repeats, "dropped", m))
        else:
            outliers.append(CostOutlier(n, c, m, expected, reps, "dropped"))
    if bad:
        drop = {(n, c) for n, c, *_ in bad}
        pairs = list(zip(df["n_tokens"].astype(int), df["context_tokens"].astype(int)))
        df = df[[p not in drop for p in pairs]]
    return Screening(df, tuple(outliers))


def screen_and_retime(cost_target: "pd.DataFrame", prior: Mapping | None = None,
                      retime: "Callable[[list[Key]], pd.DataFrame] | None" = None) -> dict:
    """Screen a run's target points and re-time the out-of-line ones once (``retime(keys)`` times the
    ``(n, context, repeat)`` keys given, records them, and returns their rows; None: drop them).

    ``prior``: the run's ``cost_screening`` so far (a resumed or extended run): its superseded repeats stay
    superseded and its re-timed points stay reported. Returns ``run.json`` ``cost_screening``: ``superseded``
    (the first timings of re-timed points), ``outliers`` and ``notes`` (in words, for the run's output).
    """
    import pandas as pd

    prior = dict(prior or {})
    sup = {tuple(int(x) for x in k) for k in prior.get("superseded", [])}
    first = screen_target(cost_target, sup)
    retimed: dict[tuple[int, int], CostOutlier] = {}
    table = cost_target
    if first.outliers and retime is not None:
        next_rep = int(cost_target["repeat"].max()) + 1
        keys = [(o.n_tokens, o.context_tokens, next_rep + i) for o in first.outliers
                for i in range(max(o.repeats, MIN_SCREEN_REPEATS))]
        table = pd.concat([cost_target, retime(keys)], ignore_index=True)
        for o in first.outliers:
            sup |= {(int(r.n_tokens), int(r.context_tokens), int(r.repeat)) for r in cost_target.itertuples()
                    if (int(r.n_tokens), int(r.context_tokens)) == (o.n_tokens, o.context_tokens)}
            retimed[(o.n_tokens, o.context_tokens)] = o
    final = screen_target(table, sup, retimed)
    dropped = {(o.n_tokens, o.context_tokens) for o in final.outliers}
    kept_med = final.kept.groupby(["n_tokens", "context_tokens"])["ms"].median() if len(final.kept) else {}
    outliers = list(final.outliers) + [
        CostOutlier(o.n_tokens, o.context_tokens, o.median_ms, o.expected_ms, o.repeats, "re-timed",
                    float(kept_med[(o.n_tokens, o.context_tokens)]))
        for k, o in retimed.items() if k not in dropped]
    now = {(o.n_tokens, o.context_tokens) for o in outliers}
    earlier = [o for o in prior.get("outliers", []) if o.get("action") == "re-timed"
               and (int(o["n_tokens"]), int(o["context_tokens"])) not in now | dropped]
    notes = [f"cost curves: {o.as_text()}" for o in sorted(outliers, key=lambda o: (o.n_tokens, o.context_tokens))]
    entries = earlier + [o.as_dict() for o in outliers]
    entries.sort(key=lambda o: (int(o["n_tokens"]), int(o["context_tokens"])))
    return {"superseded": sorted(list(k) for k in sup), "outliers": entries, "notes": notes, "rule": SCREEN_RULE}


#: How :func:`out_of_line` judges a point, in words (``run.json`` ``cost_screening.rule``).
SCREEN_RULE = (f"a point whose median is over {OUTLIER_RATIO:g}x the median of its neighbours' on the curve "
               f"(n ± 1 tokens at its context), judged with "
               f"{MIN_SCREEN_REPEATS} or more repeats; re-timed once, dropped from the fit if still out of line")
