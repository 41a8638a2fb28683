"""γ (draft length) policies shared by the event simulator and ``measure``.

A policy is a small stateful object: ``gamma`` is the draft length for the next
round; ``update(drafted, accepted)`` feeds back the outcome of a round;
``reset()`` starts a new sequence. Build one from a spec string with
:func:`make_policy`:

* ``fixed:G`` — always G.
* ``heuristic:G`` — transformers' assisted-generation "heuristic" schedule:
  start at G, +2 after a round where every draft token was accepted, −1
  (not below 1) otherwise.
* ``threshold:G`` — raise γ by one when the rolling acceptance (accepted /
  drafted over the last ``window`` rounds) is above ``high``, lower it by one
  below ``low``; γ stays in [1, ``gamma_max``].
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

POLICY_KINDS = ("fixed", "heuristic", "threshold")


def _check_gamma(name: str, g: int) -> int:
    if int(g) != g or g < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {g}")
    return int(g)


@dataclass
class FixedGamma:
    initial_gamma: int

    def __post_init__(self) -> None:
        _check_gamma("gamma", self.initial_gamma)
        self.gamma = self.initial_gamma

    def update(self, drafted: int, accepted: int) -> int:
        return self.gamma

    def reset(self) -> None:
        self.gamma = self.initial_gamma

    def spec(self) -> str:
        return f"fixed:{self.initial_gamma}"


@dataclass
class HeuristicGamma:
    """transformers' ``num_assistant_tokens_schedule="heuristic"``."""

    initial_gamma: int
    gamma_max: int = 64

    def __post_init__(self) -> None:
        _check_gamma("gamma", self.initial_gamma)
        self.gamma = self.initial_gamma

    def update(self, drafted: int, accepted: int) -> int:
        if accepted >= drafted:
            self.gamma = min(self.gamma + 2, self.gamma_max)
        else:
            self.gamma = max(self.gamma - 1, 1)
        return self.gamma

    def reset(self) -> None:
        self.gamma = self.initial_gamma

    def spec(self) -> str:
        return f"heuristic:{self.initial_gamma}"


@dataclass
class ThresholdGamma:
    """Raise γ above a high-water mark of rolling acceptance, lower it below a low one."""

    initial_gamma: int
    low: float = 0.4
    high: float = 0.8
    window: int = 8
    gamma_max: int = 16
    _hist: deque = field(default_factory=deque, repr=False)

    def __post_init__(self) -> None:
        _check_gamma("gamma", self.initial_gamma)
        _check_gamma("gamma_max", self.gamma_max)
        if not 0.0 <= self.low < self.high <= 1.0:
            raise ValueError(f"need 0 <= low < high <= 1, got low={self.low}, high={self.high}")
        self.gamma = self.initial_gamma
        self._hist = deque(maxlen=self.window)

    def update(self, drafted: int, accepted: int) -> int:
        self._hist.append((drafted, accepted))
        d = sum(h[0] for h in self._hist)
        rate = sum(h[1] for h in self._hist) / d if d else 0.0
        if rate > self.high:
            self.gamma = min(self.gamma + 1, self.gamma_max)
        elif rate < self.low:
            self.gamma = max(self.gamma - 1, 1)
        return self.gamma

    def reset(self) -> None:
        self.gamma = self.initial_gamma
        self._hist.clear()

    def spec(self) -> str:
        return f"threshold:{self.initial_gamma}"


GammaPolicy = FixedGamma | HeuristicGamma | ThresholdGamma


def make_policy(spec: str | int) -> GammaPolicy:
    """Build a policy from ``"fixed:4"``, ``"heuristic:4"``, ``"threshold:4"`` or a bare int."""
    if isinstance(spec, int):
        return FixedGamma(spec)
    kind, _, g = str(spec).partition(":")
    if kind.isdigit() and not g:
        return FixedGamma(int(kind))
    if kind not in POLICY_KINDS:
        raise ValueError(f"unknown gamma policy {kind!r}; valid: {', '.join(POLICY_KINDS)}")
    try:
        gamma = int(g) if g else 4
    except ValueError:
        raise ValueError(f"gamma policy {spec!r}: {g!r} is not an integer") from None
    return {"fixed": FixedGamma, "heuristic": HeuristicGamma, "threshold": ThresholdGamma}[kind](gamma)
