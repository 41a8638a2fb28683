"""γ (draft length) policies shared by the event simulator and ``measure``.

A policy is a small stateful object: ``gamma`` is the draft length for the next
round; ``update(drafted, accepted)`` feeds back the outcome of a round;
``reset()`` starts a new sequence. A policy's identity is a :class:`GammaSpec`
(kind + initial γ), written ``fixed:4`` on disk, with one :meth:`GammaSpec.parse` /
:meth:`GammaSpec.to_str` pair; :meth:`GammaSpec.policy` (or :func:`make_policy`
from a spec string) builds a fresh policy:

* ``fixed:G`` — always G.
* ``heuristic:G`` — transformers' assisted-generation "heuristic" schedule:
  start at G, +2 after a round where every draft token was accepted, −1
  (not below 1) otherwise.
* ``threshold:G`` — raise γ by one when the rolling acceptance (accepted /
  drafted over the last ``window`` rounds) is above ``high``, lower it by one
  below ``low``; γ stays in [1, ``gamma_max``].

Next to them, :class:`TreePolicy` drafts the same token tree every round
(:class:`sim.trees.TokenTree`; the event simulator charges its levels, its
verify and samples τ from a :class:`sim.trees.PositionalAcceptance`).
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field

from sim.trees import TokenTree

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
        return GammaSpec("fixed", self.initial_gamma).to_str()


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
        return GammaSpec("heuristic", self.initial_gamma).to_str()


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
        return GammaSpec("threshold", self.initial_gamma).to_str()


@dataclass
class TreePolicy:
    """Draft ``tree`` every round (a static tree, as vLLM's ``speculative_token_tree``); feedback changes nothing."""

    tree: TokenTree

    def __post_init__(self) -> None:
        if not isinstance(self.tree, TokenTree):
            raise ValueError(f"a tree policy needs a TokenTree, got {type(self.tree).__name__}")

    @property
    def gamma(self) -> int:
        """Draft tokens per round: the tree's nodes."""
        return self.tree.n_nodes

    def update(self, drafted: int, accepted: int) -> int:
        return self.gamma

    def reset(self) -> None:
        pass

    def spec(self) -> str:
        return "tree:" + json.dumps(self.tree.to_lists(), separators=(",", ":"))


GammaPolicy = FixedGamma | HeuristicGamma | ThresholdGamma
_POLICY_TYPES = {"fixed": FixedGamma, "heuristic": HeuristicGamma, "threshold": ThresholdGamma}


@dataclass(frozen=True)
class GammaSpec:
    """The identity of a γ policy: its kind and initial γ (``fixed:4`` on disk); validated on construction."""

    kind: str
    gamma: int

    def __post_init__(self) -> None:
        if self.kind not in POLICY_KINDS:
            raise ValueError(f"unknown gamma policy {self.kind!r}; valid: {', '.join(POLICY_KINDS)}")
        _check_gamma("gamma", self.gamma)

    @classmethod
    def parse(cls, spec: "str | int | GammaSpec") -> "GammaSpec":
        """``"fixed:4"``, ``"heuristic:4"``, ``"threshold:4"``, a bare int (fixed) or a kind alone (γ 4)."""
        if isinstance(spec, GammaSpec):
            return spec
        if isinstance(spec, int):
            return cls("fixed", spec)
        kind, _, g = str(spec).partition(":")
        if kind.isdigit() and not g:
            return cls("fixed", int(kind))
        if kind not in POLICY_KINDS:
            raise ValueError(f"unknown gamma policy {kind!r}; valid: {', '.join(POLICY_KINDS)}")
        try:
            gamma = int(g) if g else 4
        except ValueError:
            raise ValueError(f"gamma policy {spec!r}: {g!r} is not an integer") from None
        return cls(kind, gamma)

    def to_str(self) -> str:
        return f"{self.kind}:{self.gamma}"

    @property
    def is_fixed(self) -> bool:
        return self.kind == "fixed"

    def policy(self) -> GammaPolicy:
        """A fresh (stateful) policy of this spec."""
        return _POLICY_TYPES[self.kind](self.gamma)


def make_policy(spec: "str | int | GammaSpec") -> GammaPolicy:
    """Build a policy from ``"fixed:4"``, ``"heuristic:4"``, ``"threshold:4"``, a bare int or a :class:`GammaSpec`."""
    return GammaSpec.parse(spec).policy()
