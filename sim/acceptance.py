"""Acceptance models: how many drafted tokens the target accepts per round.

Five models, one interface (:class:`AcceptanceModel`):

* :class:`IIDAcceptance` — every drafted token is accepted with the same
  probability ``alpha``, independently (Leviathan et al. 2023, Sec. 3).
* :class:`PerPositionAcceptance` — ``alphas[i-1]`` is the *conditional*
  probability that draft token ``i`` is accepted given tokens ``1..i-1`` were.
  Positions past the end of the list reuse the last value.
* :class:`TraceAcceptance` — an empirical trace measured by ``measure``:
  per-position match flags of the draft teacher-forced on the target's output
  (greedy; replay is exact for any γ) or per-position acceptance
  probabilities Σ min(p, q) (sampling).
* :class:`RunTraceAcceptance` — per position of a greedy generation, how many
  tokens the draft proposes there and how many of them the target accepts.
  Replay is exact for any γ ≤ ``gamma_max`` and for drafts that may propose
  fewer than γ tokens or none (n-gram / prompt lookup).
* :class:`ProposalAcceptance` — a parametric model plus the probability that
  the draft proposes anything at all in a round (a lookup draft with no match
  proposes nothing, and its round costs a 1-token verify).

Every model has every capability of the Protocol: ``drafted_probs(gamma)``
(P(drafted = 0..γ); all mass at γ except for ``proposal`` and ``run_trace``,
which may propose fewer tokens or none), ``sample_round(gamma, rng) ->
(drafted, accepted)``, ``gamma_max`` (the largest γ a recorded trace can
replay; None for any γ) and ``to_dict()`` (what :func:`acceptance_from_dict`
reads back). The cost side uses ``drafted_probs``/``sample_round`` so a round
that drafts ``d`` tokens is charged ``d`` draft steps and a ``d + 1``-token
verify.

Expectations are closed forms, except the trace models' (exact replays of
the recorded sequences); ``sample_accepted`` draws from the model with an
explicit ``numpy.random.Generator`` so every simulation is seeded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol, Sequence, runtime_checkable

import numpy as np

from sim.files import check_schema_version
from toolkit.jsonio import read_json


def _check_alpha(name: str, value: float) -> float:
    value = float(value)
    if not (0.0 <= value <= 1.0) or math.isnan(value):
        raise ValueError(f"{name} must be in [0, 1], got {value}")
    return value


def _check_gamma(gamma: int) -> int:
    if int(gamma) != gamma or gamma < 1:
        raise ValueError(f"gamma (draft length) must be an integer >= 1, got {gamma}")
    return int(gamma)


@runtime_checkable
class AcceptanceModel(Protocol):
    """What the predictor and the event simulator need from an acceptance model (every model has all of it)."""

    @property
    def gamma_max(self) -> int | None:
        """The largest γ the model can replay (a recorded trace), None for any γ."""
        ...

    def prefix_accept_probs(self, gamma: int) -> np.ndarray:
        """P(tokens 1..j all accepted) for j = 1..gamma, shape ``[gamma]``."""
        ...

    def expected_tokens(self, gamma: int) -> float:
        """Expected tokens produced per round (accepted + the one correction/bonus)."""
        ...

    def sample_accepted(self, gamma: int, rng: np.random.Generator) -> int:
        """Draw how many of ``gamma`` drafted tokens are accepted (0..gamma)."""
        ...

    def drafted_probs(self, gamma: int) -> np.ndarray:
        """P(drafted = d) for d = 0..gamma, shape ``[gamma + 1]``."""
        ...

    def sample_round(self, gamma: int, rng: np.random.Generator) -> tuple[int, int]:
        """Draw (drafted, accepted) for one round at draft length ``gamma``."""
        ...

    def describe(self) -> dict:
        """JSON-able description (kind and parameters; a summary for the trace models)."""
        ...

    def to_dict(self) -> dict:
        """Everything :func:`acceptance_from_dict` needs to rebuild the model."""
        ...


class _DraftsGamma:
    """The capabilities of a model whose draft always proposes γ tokens."""

    gamma_max: ClassVar[int | None] = None

    def drafted_probs(self, gamma: int) -> np.ndarray:
        gamma = _check_gamma(gamma)
        out = np.zeros(gamma + 1)
        out[gamma] = 1.0
        return out

    def sample_round(self, gamma: int, rng: np.random.Generator) -> tuple[int, int]:
        gamma = _check_gamma(gamma)
        return gamma, int(self.sample_accepted(gamma, rng))  # type: ignore[attr-defined]

    def to_dict(self) -> dict:
        return self.describe()  # type: ignore[attr-defined]


def expected_tokens_iid(alpha: np.ndarray | float, gamma: np.ndarray | int) -> np.ndarray:
    """(1 - α^(γ+1)) / (1 - α), vectorised over broadcastable ``alpha`` and ``gamma``.

    Computed as the geometric sum Σ_{j=0..γ} α^j in closed form, with the α → 1
    limit (γ + 1) taken exactly, so there is no division by zero.
    """
    a = np.asarray(alpha, dtype=float)
    g = np.asarray(gamma, dtype=float)
    a, g = np.broadcast_arrays(a, g)
    one = np.isclose(a, 1.0, rtol=0.0, atol=1e-12)
    safe = np.where(one, 0.5, a)
    out = (1.0 - safe ** (g + 1.0)) / (1.0 - safe)
    return np.where(one, g + 1.0, out)


def _expected_from_prefix(prefix: np.ndarray) -> float:
    return float(1.0 + prefix.sum())


@dataclass(frozen=True)
class IIDAcceptance(_DraftsGamma):
    """Each drafted token accepted independently with probability ``alpha``."""

    alpha: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "alpha", _check_alpha("alpha", self.alpha))

    def prefix_accept_probs(self, gamma: int) -> np.ndarray:
        gamma = _check_gamma(gamma)
        return self.alpha ** np.arange(1, gamma + 1, dtype=float)

    def expected_tokens(self, gamma: int) -> float:
        return float(expected_tokens_iid(self.alpha, _check_gamma(gamma)))

    def sample_accepted(self, gamma: int, rng: np.random.Generator) -> int:
        if self.alpha >= 1.0:
            return gamma
        if self.alpha <= 0.0:
            return 0
        # Leading successes of Bernoulli(alpha) trials = Geometric(1 - alpha) - 1.
        return min(int(rng.geometric(1.0 - self.alpha)) - 1, gamma)

    def describe(self) -> dict:
        return {"kind": "iid", "alpha": self.alpha}


@dataclass(frozen=True)
class PerPositionAcceptance(_DraftsGamma):
    """Conditional acceptance per draft position; the last value repeats beyond the list."""

    alphas: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.alphas) == 0:
            raise ValueError("alphas must hold at least one per-position acceptance rate")
        checked = tuple(_check_alpha(f"alpha_{i + 1}", a) for i, a in enumerate(self.alphas))
        object.__setattr__(self, "alphas", checked)

    def conditional(self, gamma: int) -> np.ndarray:
        """α_1..α_γ, extending the list with its last value."""
        gamma = _check_gamma(gamma)
        a = np.asarray(self.alphas, dtype=float)
        if gamma <= a.size:
            return a[:gamma]
        return np.concatenate([a, np.full(gamma - a.size, a[-1])])

    def prefix_accept_probs(self, gamma: int) -> np.ndarray:
        return np.cumprod(self.conditional(gamma))

    def expected_tokens(self, gamma: int) -> float:
        return _expected_from_prefix(self.prefix_accept_probs(gamma))

    def sample_accepted(self, gamma: int, rng: np.random.Generator) -> int:
        u = rng.random(gamma)
        rejected = np.nonzero(u >= self.conditional(gamma))[0]
        return int(rejected[0]) if rejected.size else gamma

    def describe(self) -> dict:
        return {"kind": "per_position", "alphas": list(self.alphas)}


@dataclass(frozen=True)
class TraceAcceptance(_DraftsGamma):
    """Empirical acceptance from measured traces.

    ``sequences`` holds one array per generated sequence. For greedy decoding
    each entry is a 0/1 flag: did the draft, fed the target's own output up to
    that position, propose exactly the target's token? Replaying a round of
    length γ from position t accepts the number of leading ones in
    ``flags[t:t+γ]`` and then moves to t + accepted + 1, which is exactly what
    greedy speculative decoding does. For sampling each entry is the
    per-position acceptance probability Σ_v min(p_v, q_v) and replay uses the
    expectation of the chain of independent acceptances. ``gamma_max``: the
    largest γ the trace can replay (set when it was rebuilt from one γ's rounds).
    """

    sequences: tuple[np.ndarray, ...]
    source: str = "trace"
    gamma_max: int | None = None  # type: ignore[misc]  # a field here, None on the parametric models
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        seqs = tuple(np.asarray(s, dtype=float) for s in self.sequences)
        seqs = tuple(s for s in seqs if s.size > 0)
        if not seqs:
            raise ValueError("trace acceptance needs at least one non-empty sequence")
        for s in seqs:
            if s.ndim != 1 or np.any((s < 0) | (s > 1)) or np.any(np.isnan(s)):
                raise ValueError("trace entries must be match flags or probabilities in [0, 1]")
        if self.gamma_max is not None:
            _check_gamma(self.gamma_max)
        object.__setattr__(self, "sequences", seqs)  # canonical form of the input (float arrays, none empty)

    @classmethod
    def from_accepted_lengths(cls, gamma: int, accepted: Sequence[int]) -> "TraceAcceptance":
        """Rebuild flags from per-round accepted counts measured at one ``gamma``.

        Exact for replay at the same ``gamma``. A fully accepted round is
        followed by the target's bonus token, whose draft match was never
        observed: it gets flag 1 and is skipped by same-γ replay. Replay at a
        larger γ' would need unseen positions and raises.
        """
        gamma = _check_gamma(gamma)
        flags: list[float] = []
        for a in accepted:
            if not 0 <= a <= gamma:
                raise ValueError(f"accepted count {a} outside [0, {gamma}]")
            flags.extend([1.0] * int(a))
            flags.append(0.0 if a < gamma else 1.0)
        return cls((np.asarray(flags),), source=f"accepted_lengths@gamma={gamma}", gamma_max=gamma)

    def _round_starts_and_accepts(self, gamma: int) -> tuple[np.ndarray, np.ndarray]:
        """Replay every sequence at draft length γ; returns expected accepted per round."""
        key = ("replay", gamma)
        if key not in self._cache:
            if self.gamma_max is not None and gamma > self.gamma_max:
                raise ValueError(
                    f"this trace was recorded at gamma={self.gamma_max}; cannot replay gamma={gamma}"
                )
            accepted: list[float] = []
            produced: list[float] = []
            for s in self.sequences:
                t = 0
                n = s.size
                while t < n:
                    window = s[t : t + gamma]
                    prefix = np.cumprod(window)
                    if window.size < gamma and prefix[-1] > 0:
                        break  # the trace ends before this round is decided
                    exp_acc = float(prefix.sum())
                    accepted.append(exp_acc)
                    produced.append(exp_acc + 1.0)
                    # advance by the (rounded) expected number of tokens of the round
                    t += int(round(exp_acc)) + 1
            if not accepted:
                raise ValueError(f"trace too short to replay a single round at gamma={gamma}")
            self._cache[key] = (np.asarray(accepted), np.asarray(produced))
        return self._cache[key]

    def prefix_accept_probs(self, gamma: int) -> np.ndarray:
        gamma = _check_gamma(gamma)
        key = ("prefix", gamma)
        if key not in self._cache:
            # P(first j accepted) averaged over every start position of every sequence.
            windows = [
                np.lib.stride_tricks.sliding_window_view(s, gamma)
                for s in self.sequences
                if s.size >= gamma
            ]
            if not windows:
                raise ValueError(f"trace too short for gamma={gamma}")
            w = np.concatenate(windows, axis=0)
            self._cache[key] = np.cumprod(w, axis=1).mean(axis=0)
        return self._cache[key]

    def expected_tokens(self, gamma: int) -> float:
        """Tokens per round from replaying the trace round by round."""
        _, produced = self._round_starts_and_accepts(_check_gamma(gamma))
        return float(produced.mean())

    def sample_accepted(self, gamma: int, rng: np.random.Generator) -> int:
        gamma = _check_gamma(gamma)
        seq = self.sequences[int(rng.integers(len(self.sequences)))]
        if seq.size < gamma:
            seq = np.concatenate([seq, np.zeros(gamma - seq.size)])
        t = int(rng.integers(seq.size - gamma + 1))
        u = rng.random(gamma)
        rejected = np.nonzero(u >= seq[t : t + gamma])[0]
        return int(rejected[0]) if rejected.size else gamma

    def mean_alpha(self) -> float:
        """Mean per-position acceptance over the whole trace."""
        return float(np.concatenate(self.sequences).mean())

    def describe(self) -> dict:
        return {
            "kind": "trace",
            "source": self.source,
            "sequences": len(self.sequences),
            "positions": int(sum(s.size for s in self.sequences)),
            "mean_alpha": self.mean_alpha(),
        }

    def to_dict(self) -> dict:
        """:meth:`describe` plus the sequences (and ``gamma_max`` if set): what :func:`acceptance_from_dict` reads."""
        return {**self.describe(), "values": [s.tolist() for s in self.sequences],
                **({"gamma_max": self.gamma_max} if self.gamma_max is not None else {})}


def drafted_distribution(model: AcceptanceModel, gamma: int) -> np.ndarray:
    """P(drafted = d) for d = 0..γ, shape ``[γ + 1]`` (:meth:`AcceptanceModel.drafted_probs`, as floats)."""
    return np.asarray(model.drafted_probs(_check_gamma(gamma)), dtype=float)


def sample_round(model: AcceptanceModel, gamma: int, rng: np.random.Generator) -> tuple[int, int]:
    """Draw (drafted, accepted) for one round at draft length γ (:meth:`AcceptanceModel.sample_round`, as ints)."""
    d, a = model.sample_round(_check_gamma(gamma), rng)
    return int(d), int(a)


@dataclass(frozen=True)
class ProposalAcceptance:
    """``inner`` acceptance in rounds where the draft proposes; none proposed with probability 1 − ``p_propose``.

    For lookup drafts (prompt lookup / n-gram): when the last tokens have no
    earlier match the draft proposes nothing and the round is a plain 1-token
    target step. A round that proposes drafts γ tokens.
    """

    p_propose: float
    inner: AcceptanceModel

    def __post_init__(self) -> None:
        object.__setattr__(self, "p_propose", _check_alpha("p_propose", self.p_propose))

    def drafted_probs(self, gamma: int) -> np.ndarray:
        gamma = _check_gamma(gamma)
        out = np.zeros(gamma + 1)
        out[0] += 1.0 - self.p_propose
        out[gamma] += self.p_propose
        return out

    def prefix_accept_probs(self, gamma: int) -> np.ndarray:
        return self.p_propose * self.inner.prefix_accept_probs(gamma)

    def expected_tokens(self, gamma: int) -> float:
        return float(1.0 - self.p_propose + self.p_propose * self.inner.expected_tokens(gamma))

    def sample_round(self, gamma: int, rng: np.random.Generator) -> tuple[int, int]:
        gamma = _check_gamma(gamma)
        if rng.random() >= self.p_propose:
            return 0, 0
        return gamma, int(self.inner.sample_accepted(gamma, rng))

    def sample_accepted(self, gamma: int, rng: np.random.Generator) -> int:
        return self.sample_round(gamma, rng)[1]

    @property
    def gamma_max(self) -> int | None:
        return self.inner.gamma_max

    def describe(self) -> dict:
        return {"kind": "proposal", "p_propose": self.p_propose, "inner": self.inner.describe()}

    def to_dict(self) -> dict:
        return {**self.describe(), "inner": self.inner.to_dict()}


@dataclass(frozen=True)
class RunTraceAcceptance:
    """Greedy proposal runs measured per position of a generation (``traces.csv`` ``proposed``/``accept_run``).

    ``sequences`` holds, per generated sequence, two integer arrays of equal
    length: ``proposed[t]`` — how many tokens the draft proposes when a round
    starts with ``t`` tokens generated (asked for ``gamma_max``) — and
    ``run[t]`` — how many of those match the target's own continuation, in a
    row. Drafts propose prefixes (asked for γ < ``gamma_max`` they propose the
    first γ of the same tokens), so replaying a round of length γ from ``t``
    drafts ``d = min(proposed[t], γ)`` tokens, accepts ``min(run[t], d)`` and
    moves on by accepted + 1 — exactly what greedy speculative decoding does.
    As ``measure`` does, replay starts after the prefill token (t = 1) and
    caps γ so a round never drafts past the end of the sequence.
    """

    sequences: tuple[tuple[np.ndarray, np.ndarray], ...]
    gamma_max: int
    source: str = "run_trace"
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        gmax = _check_gamma(self.gamma_max)
        seqs = []
        for pr in self.sequences:
            proposed, run = (np.asarray(x) for x in pr)
            if proposed.shape != run.shape or proposed.ndim != 1:
                raise ValueError("proposed and run must be 1-D arrays of the same length")
            if proposed.size == 0:
                continue
            if np.any(np.isnan(proposed.astype(float))) or np.any(np.isnan(run.astype(float))):
                raise ValueError("proposed/run entries must be integers, got NaN")
            proposed, run = proposed.astype(int), run.astype(int)
            if np.any(proposed < 0) or np.any(proposed > gmax) or np.any(run < 0) or np.any(run > proposed):
                raise ValueError(f"need 0 <= run <= proposed <= gamma_max={gmax} at every position")
            seqs.append((proposed, run))
        if not seqs:
            raise ValueError("run-trace acceptance needs at least one non-empty sequence")
        object.__setattr__(self, "sequences", tuple(seqs))
        object.__setattr__(self, "gamma_max", gmax)

    def _check(self, gamma: int) -> int:
        gamma = _check_gamma(gamma)
        if gamma > self.gamma_max:
            raise ValueError(f"this trace was recorded up to gamma={self.gamma_max}; cannot replay gamma={gamma}")
        return gamma

    def replay(self, gamma: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every round of every sequence at draft length γ: (start position, drafted, accepted)."""
        gamma = self._check(gamma)
        key = ("replay", gamma)
        if key not in self._cache:
            starts, drafted, accepted = [], [], []
            for proposed, run in self.sequences:
                n = proposed.size
                t = 1
                while t < n:
                    d = min(int(proposed[t]), gamma, n - t - 1)
                    a = min(int(run[t]), d)
                    starts.append(t)
                    drafted.append(d)
                    accepted.append(a)
                    t += a + 1
            if not starts:
                raise ValueError("run trace too short to replay a single round")
            self._cache[key] = (np.asarray(starts), np.asarray(drafted), np.asarray(accepted))
        return self._cache[key]

    def drafted_probs(self, gamma: int) -> np.ndarray:
        _, d, _ = self.replay(gamma)
        return np.bincount(d, minlength=gamma + 1)[: gamma + 1] / d.size

    def prefix_accept_probs(self, gamma: int) -> np.ndarray:
        """P(accepted ≥ j) over the replayed rounds, j = 1..γ."""
        _, _, a = self.replay(gamma)
        return np.array([(a >= j).mean() for j in range(1, gamma + 1)])

    def expected_tokens(self, gamma: int) -> float:
        _, _, a = self.replay(gamma)
        return float(a.mean() + 1.0)

    def sample_round(self, gamma: int, rng: np.random.Generator) -> tuple[int, int]:
        """A round drawn uniformly from the replayed rounds."""
        _, d, a = self.replay(gamma)
        i = int(rng.integers(d.size))
        return int(d[i]), int(a[i])

    def sample_accepted(self, gamma: int, rng: np.random.Generator) -> int:
        return self.sample_round(gamma, rng)[1]

    def describe(self) -> dict:
        prop = np.concatenate([p for p, _ in self.sequences])
        run = np.concatenate([r for _, r in self.sequences])
        return {
            "kind": "run_trace",
            "source": self.source,
            "gamma_max": self.gamma_max,
            "sequences": len(self.sequences),
            "positions": int(prop.size),
            "share_proposing": float((prop > 0).mean()),
            "mean_run": float(run.mean()),
        }

    def to_dict(self) -> dict:
        """:meth:`describe` plus the sequences themselves (what :func:`acceptance_from_dict` reads back)."""
        return {**self.describe(),
                "proposed": [p.tolist() for p, _ in self.sequences],
                "run": [r.tolist() for _, r in self.sequences]}


def implied_alpha_from_tau(tau: float, gamma: int) -> float:
    """The i.i.d. α whose expected tokens per round at ``gamma`` equals ``tau``.

    ``tau`` is the mean number of tokens produced per round (accepted + 1), as
    vLLM and Spec-Bench report it. Note that accepted/drafted is *not* α: with
    i.i.d. α the draft tokens after the first rejection are never judged, so
    accepted/drafted = (τ − 1)/γ underestimates α.
    """
    gamma = _check_gamma(gamma)
    tau = float(tau)
    if not 1.0 <= tau <= gamma + 1:
        raise ValueError(f"tau (tokens per round) must be in [1, {gamma + 1}] for gamma={gamma}, got {tau}")
    if tau >= gamma + 1 - 1e-12:
        return 1.0
    if tau <= 1.0 + 1e-12:
        return 0.0
    from scipy.optimize import brentq

    return float(brentq(lambda a: float(expected_tokens_iid(a, gamma)) - tau, 0.0, 1.0, xtol=1e-12))


ACCEPTANCE_KINDS = ("iid", "per_position", "proposal", "run_trace", "trace")
ACCEPTANCE_SCHEMA_VERSION = 1


def _prob_field(d: dict, key: str) -> float:
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"field {key!r} must be a number in [0, 1], got {v!r}")
    return float(v)


def _float_lists(d: dict, key: str) -> list[np.ndarray]:
    v = d[key]
    ok = isinstance(v, list) and all(isinstance(seq, list) and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in seq) for seq in v)
    if not ok:
        raise ValueError(f"field {key!r} must be a list of lists of numbers in [0, 1]")
    return [np.asarray(seq, dtype=float) for seq in v]


def _int_lists(d: dict, key: str) -> list[np.ndarray]:
    v = d[key]
    ok = isinstance(v, list) and all(isinstance(seq, list) and all(
        isinstance(x, int) and not isinstance(x, bool) for x in seq) for seq in v)
    if not ok:
        raise ValueError(f"field {key!r} must be a list of lists of integers")
    return [np.asarray(seq, dtype=int) for seq in v]


def acceptance_from_dict(d: object) -> AcceptanceModel:
    """Rebuild a model from what its ``to_dict`` wrote (``describe`` suffices for the parametric models).

    Every problem — not an object, an unknown kind, a missing field, a wrong
    type, a value out of range, a newer ``schema_version`` — is a one-line ``ValueError``.
    """
    if not isinstance(d, dict):
        raise ValueError(f"must be a JSON object with a 'kind', got {type(d).__name__}")
    check_schema_version(d, ACCEPTANCE_SCHEMA_VERSION, "acceptance model")
    kind = d.get("kind")
    try:
        if kind == "iid":
            return IIDAcceptance(_prob_field(d, "alpha"))
        if kind == "per_position":
            alphas = d["alphas"]
            if not isinstance(alphas, list) or not alphas:
                raise ValueError(f"field 'alphas' must be a non-empty list of numbers in [0, 1], got {alphas!r}")
            return PerPositionAcceptance(tuple(_prob_field({"alphas": a}, "alphas") for a in alphas))
        if kind == "proposal":
            return ProposalAcceptance(_prob_field(d, "p_propose"), acceptance_from_dict(d["inner"]))
        if kind == "run_trace":
            proposed, run = _int_lists(d, "proposed"), _int_lists(d, "run")
            if len(proposed) != len(run):
                raise ValueError("run_trace needs as many 'run' as 'proposed' sequences")
            gmax = d["gamma_max"]
            if isinstance(gmax, bool) or not isinstance(gmax, int):
                raise ValueError(f"field 'gamma_max' must be an integer >= 1, got {gmax!r}")
            return RunTraceAcceptance(tuple(zip(proposed, run)), gmax, source=str(d.get("source", "run_trace")))
        if kind == "trace":
            gmax = d.get("gamma_max")
            if gmax is not None and (isinstance(gmax, bool) or not isinstance(gmax, int)):
                raise ValueError(f"field 'gamma_max' must be an integer >= 1, got {gmax!r}")
            return TraceAcceptance(tuple(_float_lists(d, "values")), source=str(d.get("source", "trace")),
                                   gamma_max=gmax)
    except KeyError as exc:
        raise ValueError(f"acceptance model of kind {kind!r} lacks the field {exc.args[0]!r}") from None
    raise ValueError(f"unknown acceptance model kind {kind!r}; valid: {', '.join(map(repr, ACCEPTANCE_KINDS))}")


def load_acceptance(path: str | Path) -> AcceptanceModel:
    """Read an acceptance-model JSON file (as written by ``calibrate``); any problem is one line naming the file."""
    d = read_json(path, "acceptance file")
    try:
        return acceptance_from_dict(d)
    except ValueError as exc:
        raise ValueError(f"acceptance file {str(path)!r}: {exc}") from None
