"""Conversions to the project's definitions, and the aggregation of observations into one record.

The conversions, each a small function checked by hand-computed examples in
the tests:

* unconditional → conditional: vLLM (and llama.cpp's newer builds) count, per
  position i, the drafts whose i-th token was accepted (``p_i`` = count /
  drafts). Acceptance stops at the first rejection, so the rounds that reached
  position i are exactly those that accepted position i−1:
  α_1 = p_1, α_i = p_i / p_{i−1}; counts ``judged_i = count_{i−1}``.
* a histogram of rounds by accepted count (SGLang, vLLM per request, TGI
  buckets) → the same unconditional counts: ``count_i = Σ_{j ≥ i} h_j``.
* per-round (drafted, accepted) pairs → conditional counts, exactly, even when
  drafts have different lengths.
* bonus token: "acceptance length" figures that include the bonus token are
  mean tokens per round τ; accepted per round = τ − 1.
* without per-position information: the i.i.d. α whose expected tokens per
  round at the engine's draft length k equals τ (``sim.acceptance.implied_alpha_from_tau``),
  or whose accepted/drafted equals the rate (τ = 1 + rate × k). Stated as an
  assumption in the record's notes.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from calibrate.fit_acceptance import wilson_ci
from calibrate.ingest.records import AcceptanceRecord, Figure, Observation, PositionAcceptance
from sim.acceptance import implied_alpha_from_tau
from sim.limits import GAMMA_LIMIT

#: How many observations' figures the conversion table keeps (the rest are aggregated the same way).
FIGURES_KEPT = 5


def conditional_from_unconditional(accepted_per_pos: Sequence[int], drafts: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(judged, accepted) per position from vLLM-style unconditional counts.

    ``accepted_per_pos[i-1]`` = drafts whose position i was accepted. Raises
    when a count exceeds the one before it (acceptance is a prefix).
    """
    counts = [int(c) for c in accepted_per_pos]
    judged, accepted = [], []
    prev = int(drafts)
    for i, c in enumerate(counts, start=1):
        if c > prev:
            raise ValueError(f"accepted count at position {i} ({c}) exceeds the rounds that reached it ({prev})")
        judged.append(prev)
        accepted.append(c)
        prev = c
    return tuple(judged), tuple(accepted)


def per_pos_from_histogram(rounds_by_accepted: Sequence[int]) -> tuple[int, tuple[int, ...]]:
    """(rounds, unconditional per-position counts) from rounds-by-accepted-count ``h_0..h_k``."""
    h = [int(x) for x in rounds_by_accepted]
    if any(x < 0 for x in h):
        raise ValueError(f"histogram counts must be >= 0, got {h}")
    tail = np.cumsum(h[::-1])[::-1]  # tail[j] = Σ_{i >= j} h_i
    return int(tail[0]) if h else 0, tuple(int(x) for x in tail[1:])


def counts_from_rounds(per_round: Sequence[tuple[int, int]]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(judged, accepted) per position from (drafted, accepted) per round; exact for any draft lengths."""
    rounds = np.asarray(per_round, dtype=int).reshape(-1, 2)
    if rounds.size == 0:
        return (), ()
    d, a = rounds[:, 0], rounds[:, 1]
    if np.any(a > d) or np.any(a < 0):
        raise ValueError("a round cannot accept more tokens than it drafted")
    k = int(d.max())
    judged = tuple(int(np.sum((d >= i) & (a >= i - 1))) for i in range(1, k + 1))
    accepted = tuple(int(np.sum(a >= i)) for i in range(1, k + 1))
    return judged, accepted


def counts_from_rates(rates: Sequence[float], drafts: int) -> tuple[int, ...]:
    """Unconditional counts from printed per-position rates (rate × drafts, rounded)."""
    return tuple(int(round(float(r) * drafts)) for r in rates)


def rounding_slack(positions: int, drafts: int, decimals: int = 3) -> float:
    """How far Σ round(rate_i × drafts) may miss the accepted total when rates are printed to ``decimals``."""
    return positions * (0.5 * 10.0 ** -decimals * drafts + 0.5) + 1.0


def iid_alpha_from_tau(tau: float, k: int) -> float:
    """The i.i.d. α whose mean tokens per round (bonus included) at draft length k is τ."""
    if not 1.0 <= tau <= k + 1 + 1e-9:
        raise ValueError(f"mean tokens per round {tau:.4g} is impossible at draft length k={k} "
                         f"(must be in [1, {k + 1}]): is k right? pass --spec-tokens K")
    return implied_alpha_from_tau(min(tau, k + 1.0), k)


def iid_alpha_from_rate(rate: float, k: int) -> float:
    """The i.i.d. α whose accepted/drafted at draft length k (every round drafting k) is ``rate``."""
    return iid_alpha_from_tau(1.0 + float(rate) * k, k)


def observation_counts(obs: Observation) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """Conditional (judged, accepted) counts of one observation, from its most detailed figures."""
    if obs.per_round:
        return counts_from_rounds(obs.per_round)
    if obs.rounds_by_accepted:
        drafts, per_pos = per_pos_from_histogram(obs.rounds_by_accepted)
        return conditional_from_unconditional(per_pos, drafts)
    if obs.accepted_per_pos is not None and obs.drafts is not None:
        return conditional_from_unconditional(obs.accepted_per_pos, obs.drafts)
    return None


def _totals(obs: Observation, k: int | None) -> tuple[int | None, int | None, int | None]:
    """(drafts, draft tokens, accepted tokens) of one observation, derived where the detail allows.

    Drafts from drafted tokens need every draft to have had ``k`` tokens (the caller says so).
    """
    drafts, dtok, acc = obs.drafts, obs.draft_tokens, obs.accepted_tokens
    if obs.per_round:
        drafted = [d for d, _ in obs.per_round]
        drafts = drafts if drafts is not None else sum(1 for d in drafted if d > 0)
        dtok = dtok if dtok is not None else int(sum(drafted))
        acc = acc if acc is not None else int(sum(a for _, a in obs.per_round))
    elif obs.rounds_by_accepted:
        h = obs.rounds_by_accepted
        drafts = drafts if drafts is not None else int(sum(h))
        acc = acc if acc is not None else int(sum(j * n for j, n in enumerate(h)))
        if dtok is None and obs.k is not None:
            dtok = int(sum(h)) * obs.k
    elif obs.accepted_per_pos is not None and acc is None:
        acc = int(sum(obs.accepted_per_pos))
    if drafts is None and dtok is not None and k:
        drafts = dtok // k
    return drafts, dtok, acc


def _sum_all(values: list[int | None]) -> int | None:
    return None if not values or any(v is None for v in values) else int(sum(values))  # type: ignore[arg-type]


# long: the record's figures in four commented stages (draft length, per-position counts, totals, i.i.d. alpha),
#   each adding to one notes list that the record carries
def normalise(observations: Sequence[Observation], skipped_lines: int = 0,
              spec_tokens: int | None = None) -> AcceptanceRecord:
    """Aggregate observations of one engine into an :class:`AcceptanceRecord`.

    Counts are summed (exact: each log line, request or scrape delta counts
    its own rounds). Averages without counts (SGLang windows) are averaged with
    equal weights, and said so. ``spec_tokens`` is the user's draft length k
    for inputs that do not state it.
    """
    if not observations:
        raise ValueError("nothing to normalise: no observation was read")
    engines = sorted({o.engine for o in observations})
    if len(engines) > 1:
        raise ValueError(f"the files come from different engines ({', '.join(engines)}): ingest one engine at a time")
    notes: list[str] = []
    for o in observations:
        for note in o.notes:
            if note not in notes:
                notes.append(note)

    # Draft length k: stated by the input, else the user's --spec-tokens.
    ks = sorted({o.k for o in observations if o.k is not None})
    k: int | None = max(ks) if ks else None
    if len(ks) > 1:
        notes.append(f"draft length k differs between observations ({', '.join(map(str, ks))}): "
                     f"per-position counts pooled per position, k = {k} used for the i.i.d. conversions")
    if spec_tokens is not None:
        if not 1 <= spec_tokens <= GAMMA_LIMIT:
            raise ValueError(f"--spec-tokens {spec_tokens}: the draft length must be in 1..{GAMMA_LIMIT}")
        if k is None:
            k = int(spec_tokens)
            notes.append(f"draft length k = {k} from --spec-tokens (the input does not state it)")
        elif spec_tokens != k:
            notes.append(f"--spec-tokens {spec_tokens} ignored: the input says k = {k}")

    # Per-position counts, pooled.
    judged: list[int] = []
    accepted: list[int] = []
    with_pos = 0
    for o in observations:
        c = observation_counts(o)
        if c is None:
            continue
        with_pos += 1
        for i, (n, a) in enumerate(zip(*c)):
            if i >= len(judged):
                judged.append(0)
                accepted.append(0)
            judged[i] += n
            accepted[i] += a
    if with_pos and with_pos < len(observations):
        notes.append(f"{len(observations) - with_pos} of {len(observations)} observations carry no per-position "
                     f"counts: alpha_i from the other {with_pos}")
    while judged and judged[-1] == 0:
        judged.pop()
        accepted.pop()
        notes.append(f"no round reached draft position {len(judged) + 1}: alpha_{len(judged) + 1} not observed")
    positions: tuple[PositionAcceptance, ...] = ()
    if judged:
        lo, hi = wilson_ci(np.asarray(accepted), np.asarray(judged))
        positions = tuple(PositionAcceptance(i + 1, accepted[i], judged[i], accepted[i] / judged[i],
                                             float(lo[i]), float(hi[i])) for i in range(len(judged)))
        if k is None:
            k = len(positions)

    # Totals and the two summary figures.
    tot = [_totals(o, k) for o in observations]
    if any(o.drafts is None and o.draft_tokens is not None and not o.per_round and not o.rounds_by_accepted
           for o in observations) and k:
        notes.append(f"no draft (round) count: drafts = drafted tokens / k, assuming every draft had k = {k} tokens")
    drafts = _sum_all([t[0] for t in tot])
    draft_tokens = _sum_all([t[1] for t in tot])
    accepted_tokens = _sum_all([t[2] for t in tot])
    if accepted_tokens is not None and draft_tokens:
        rate: float | None = accepted_tokens / draft_tokens
    else:
        rates = [o.acceptance_rate for o in observations if o.acceptance_rate is not None]
        rate = float(np.mean(rates)) if rates else None
        if len(rates) > 1:
            notes.append(f"acceptance rate: mean of {len(rates)} reported rates with equal weights (no counts)")
    if accepted_tokens is not None and drafts:
        tau: float | None = 1.0 + accepted_tokens / drafts
    else:
        taus = [o.tau for o in observations if o.tau is not None]
        tau = float(np.mean(taus)) if taus else None
        if len(taus) > 1:
            notes.append(f"mean tokens per round: mean of {len(taus)} window averages with equal weights (no counts)")
    if rate is None:
        notes.append("no draft count: acceptance rate not available")
    if tau is None:
        notes.append("no round count: mean tokens per round not available")

    iid_alpha: float | None = None
    basis = ""
    if not positions:
        if k is None:
            notes.append("no per-position counts and no draft length k: alpha not available "
                         "(pass --spec-tokens K, the k the engine ran with)")
        elif tau is not None:
            iid_alpha = iid_alpha_from_tau(tau, k)
            basis = f"mean tokens per round {tau:.4g} at k={k}"
        elif rate is not None:
            iid_alpha = iid_alpha_from_rate(rate, k)
            basis = f"acceptance rate {rate:.4g} at k={k}, every round drafting k"
        if iid_alpha is not None and not any("assumed i.i.d." in n for n in notes):
            notes.append(f"{engines[0]} gives no per-position counts here: per-position acceptance assumed i.i.d. "
                         f"(alpha = {iid_alpha:.4f} implied by {basis})")

    figures: list[Figure] = []
    for o in observations[:FIGURES_KEPT]:
        figures.extend(o.figures)
    return AcceptanceRecord(
        engine=engines[0],
        formats=tuple(sorted({o.fmt for o in observations})),
        sources=tuple(dict.fromkeys(o.source.rsplit(":", 1)[0] if o.source.rsplit(":", 1)[-1].isdigit()
                                    else o.source for o in observations)),
        observations=len(observations),
        k=k,
        drafts=drafts,
        draft_tokens=draft_tokens,
        accepted_tokens=accepted_tokens,
        positions=positions,
        acceptance_rate=rate,
        mean_tokens_per_round=tau,
        iid_alpha=iid_alpha,
        iid_basis=basis,
        skipped_lines=int(skipped_lines),
        notes=tuple(notes),
        figures=tuple(figures),
    )
