"""Frozen records of ingestion: engine figures, observations and the normalised acceptance record.

The project's definitions (what every engine's numbers are converted to):

* **conditional per-position acceptance** α_i = P(draft token i accepted |
  tokens 1..i−1 accepted), with the counts it rests on — ``judged`` rounds that
  reached position i, ``accepted`` of them that accepted it — and a 95% Wilson
  interval;
* **acceptance rate** = accepted draft tokens / drafted tokens;
* **mean tokens per round** = 1 + accepted draft tokens / rounds (the bonus or
  correction token included; vLLM's "mean acceptance length", Spec-Bench's τ).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, NoReturn

from sim.limits import GAMMA_LIMIT
from toolkit.prometheus import Sample, sample_text


@dataclass(frozen=True)
class Figure:
    """One number as the engine printed it, the engine's definition and what it became."""

    name: str
    value: str
    definition: str
    converted: str = ""


class ImpossibleFigure(ValueError):
    """A figure no engine can report (negative, non-finite, more accepted than drafted, k out of range).

    Refused in one line naming the field, never skipped like a truncated line:
    a parser that skips what it cannot read lets this one through.
    """


def check_counters(path: str, samples: Iterable[Sample]) -> None:
    """Every sample a finite number >= 0 (counters, and the gauges of accept length and rate); else one line."""
    for s in samples:
        if not math.isfinite(s.value) or s.value < 0:
            raise ImpossibleFigure(f"{path}: {sample_text(s)} is {s.value:g}: a spec-decode counter or gauge must be "
                                   "a finite number >= 0")


#: What a message calls each checked field when the parser gives no engine name for it.
FIELD_NAMES = {"k": "draft length k", "drafts": "drafts", "draft_tokens": "drafted tokens",
               "accepted_tokens": "accepted tokens", "tau": "mean tokens per round",
               "acceptance_rate": "acceptance rate", "rounds_by_accepted": "rounds by accepted count"}


def check_draft_capacity(source: str, k: int | None, drafts: int | None, draft_tokens: int | None,
                         names: dict[str, str] | None = None) -> None:
    """Drafted tokens fit in ``drafts`` drafts of at most ``k`` tokens (when all three are known), else refused.

    For inputs whose k is the configured maximum (vLLM, llama.cpp counters and
    requests); an adaptive depth or an SGLang tree would exceed it legitimately.
    """
    if k is None or not 1 <= k <= GAMMA_LIMIT or drafts is None or draft_tokens is None or draft_tokens <= drafts * k:
        return  # (a k out of range is refused by the Observation, naming it)
    n = {**FIELD_NAMES, **(names or {})}
    raise ImpossibleFigure(f"{source}: {n['draft_tokens']} ({draft_tokens}) is more than {n['drafts']} x k = "
                           f"{drafts} x {k} = {drafts * k}: no draft holds more than k = {k} tokens ({n['k']})")


@dataclass(frozen=True)
class Observation:
    """What one unit of input (a log line, a scrape or scrape delta, a request) says.

    Every field is optional: engines report different subsets. Counts are the
    engine's own; ``accepted_per_pos`` uses vLLM's unconditional definition
    (how many drafts had position i accepted), ``rounds_by_accepted[j]`` is the
    number of rounds that accepted exactly j draft tokens, ``per_round`` holds
    (drafted, accepted) per round. ``tau`` is mean tokens per round including
    the bonus token; ``acceptance_rate`` is accepted / drafted. ``names`` gives
    the engine's own name of a field (``(("k", "num_spec_tokens"),)``) for the
    one-line refusal of an impossible value (:class:`ImpossibleFigure`).
    """

    engine: str
    fmt: str
    source: str
    k: int | None = None
    drafts: int | None = None
    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    accepted_per_pos: tuple[int, ...] | None = None
    rounds_by_accepted: tuple[int, ...] | None = None
    per_round: tuple[tuple[int, int], ...] | None = None
    tau: float | None = None
    acceptance_rate: float | None = None
    figures: tuple[Figure, ...] = ()
    notes: tuple[str, ...] = ()
    names: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        n = {**FIELD_NAMES, **dict(self.names)}

        def refuse(why: str) -> NoReturn:
            raise ImpossibleFigure(f"{self.source}: {why}")

        for name in ("k", "drafts", "draft_tokens", "accepted_tokens"):
            v = getattr(self, name)
            if v is not None and v < 0:
                refuse(f"{n[name]} {v}: a count must be >= 0")
        if self.k is not None and not 1 <= self.k <= GAMMA_LIMIT:
            refuse(f"{n['k']} {self.k} is not a draft length: valid 1..{GAMMA_LIMIT} (pass --spec-tokens K, the k "
                   "the engine ran with, if the input's is wrong)")
        if self.accepted_tokens is not None and self.draft_tokens is not None \
                and self.accepted_tokens > self.draft_tokens:
            refuse(f"{n['accepted_tokens']} ({self.accepted_tokens}) is more than {n['draft_tokens']} "
                   f"({self.draft_tokens}): no engine accepts more draft tokens than it drafted")
        h = self.rounds_by_accepted
        if h is not None and any(x < 0 for x in h):
            refuse(f"{n['rounds_by_accepted']} {list(h)}: a count must be >= 0")
        if h is not None and self.k is not None and any(h[self.k + 1:]):
            refuse(f"{n['rounds_by_accepted']} has rounds that accepted up to {len(h) - 1} tokens, more than "
                   f"k = {self.k} ({n['k']})")
        for name in ("tau", "acceptance_rate"):
            v = getattr(self, name)
            if v is not None and not math.isfinite(v):
                refuse(f"{n[name]} {v}: not a finite number")
        if self.tau is not None and self.tau < 1.0:
            refuse(f"{n['tau']} must be >= 1 (the bonus token included), got {self.tau}")
        if self.tau is not None and self.tau > 1.0 and 0 in (self.drafts, self.draft_tokens):
            zero = n["draft_tokens"] if self.draft_tokens == 0 else n["drafts"]
            refuse(f"{n['tau']} {self.tau:g} with {zero} 0: without a draft there is no acceptance length")
        if self.acceptance_rate is not None and not 0.0 <= self.acceptance_rate <= 1.0:
            refuse(f"{n['acceptance_rate']} must be in [0, 1], got {self.acceptance_rate}")


@dataclass(frozen=True)
class PositionAcceptance:
    """Conditional acceptance at one draft position (1-based) with its counts and 95% Wilson interval."""

    position: int
    accepted: int
    judged: int
    alpha: float
    ci_low: float
    ci_high: float

    def as_dict(self) -> dict:
        return {"position": self.position, "accepted": self.accepted, "judged": self.judged,
                "alpha": self.alpha, "ci95_low": self.ci_low, "ci95_high": self.ci_high}


@dataclass(frozen=True)
class AcceptanceRecord:
    """Everything ingested, in the project's definitions.

    ``positions`` is empty when the input has no per-position information; then
    ``iid_alpha`` is the i.i.d. α implied by ``iid_basis`` (a stated
    assumption). ``notes`` holds one line per lossy conversion.
    """

    engine: str
    formats: tuple[str, ...]
    sources: tuple[str, ...]
    observations: int
    k: int | None
    drafts: int | None
    draft_tokens: int | None
    accepted_tokens: int | None
    positions: tuple[PositionAcceptance, ...]
    acceptance_rate: float | None
    mean_tokens_per_round: float | None
    iid_alpha: float | None
    iid_basis: str
    skipped_lines: int
    notes: tuple[str, ...]
    figures: tuple[Figure, ...] = field(default=(), repr=False)

    @property
    def alphas(self) -> tuple[float, ...]:
        """Conditional α_1..α_k (empty without per-position information)."""
        return tuple(p.alpha for p in self.positions)

    def as_dict(self) -> dict:
        return {
            "engine": self.engine,
            "formats": list(self.formats),
            "sources": list(self.sources),
            "observations": self.observations,
            "k": self.k,
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "alpha_per_position": [p.as_dict() for p in self.positions],
            "acceptance_rate": self.acceptance_rate,
            "mean_tokens_per_round": self.mean_tokens_per_round,
            "iid_alpha": self.iid_alpha,
            "iid_basis": self.iid_basis,
            "skipped_lines": self.skipped_lines,
            "notes": list(self.notes),
            "conversions": [{"figure": f.name, "value": f.value, "engine_definition": f.definition,
                             "converted": f.converted} for f in self.figures],
        }


@dataclass(frozen=True)
class ParseResult:
    """What one engine parser read from one file: observations, format name, lines skipped."""

    engine: str
    fmt: str
    observations: tuple[Observation, ...]
    skipped: int = 0
