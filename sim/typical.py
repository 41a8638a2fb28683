"""The acceptance typical for a kind of draft, and where that comes from.

Two kinds of draft, two sources:

* a separate draft model (a small model of the target's family):
  :data:`TYPICAL_ALPHA`, Leviathan et al.'s 0.5–0.9;
* a draft head on the target (EAGLE, EAGLE-3, MTP, Medusa): the figures the
  head's papers print (:data:`presets.heads.HEAD_KINDS`), turned into an
  i.i.d. α here. A printed α is taken as it is; a printed τ (mean tokens per
  round at draft depth d) becomes the α whose expected tokens per round at d
  equal τ (:func:`sim.acceptance.implied_alpha_from_tau`). τ measured with
  tree drafts gives an upper estimate of what a chain of the same depth
  accepts, and the range's text says so.

:func:`typical_alpha` gives the range for a pair (what ``python -m sim check``
holds a claim against); :func:`default_alpha` the single α ``python -m sim``
uses for a draft head when none is given, with a sentence saying where it
comes from.
"""

from __future__ import annotations

from dataclasses import dataclass

from presets.heads import HeadKind, PublishedAcceptance
from presets.pairs import Pair
from sim.acceptance import implied_alpha_from_tau


@dataclass(frozen=True)
class AlphaRange:
    """Acceptance typical for a kind of draft, with where that comes from.

    ``label`` names the kind in sentences ("the range typical for such pairs");
    ``notes`` say, per source, what was measured and how (printed under a
    draft head's verdict).
    """

    low: float
    high: float
    source: str
    quote: str = ""
    label: str = "such pairs"
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 0.0 <= self.low <= self.high <= 1.0:
            raise ValueError(f"typical alpha range must satisfy 0 <= low <= high <= 1, got {self.low}, {self.high}")

    def text(self) -> str:
        return f"{self.low:g}–{self.high:g}, {self.source}"


TYPICAL_ALPHA = AlphaRange(
    0.5, 0.9, "Leviathan et al. 2023 §4.2",
    quote="approximation models that are a couple of orders of magnitude smaller than the target model tend to "
          "produce α values between 0.5 and 0.9",
)
"""Separate draft models (not draft heads)."""


def evidence_alpha(e: PublishedAcceptance) -> tuple[float, float]:
    """The i.i.d. α range one source's figures stand for (a τ converted at its draft depth)."""
    if e.measure == "alpha":
        return e.low, e.high
    assert e.depth is not None  # a τ always has its depth (PublishedAcceptance checks it)
    return implied_alpha_from_tau(e.low, e.depth), implied_alpha_from_tau(e.high, e.depth)


def _evidence_short(e: PublishedAcceptance) -> str:
    if e.measure == "alpha":
        return f"{e.figures()}, {e.source}"
    lo, hi = evidence_alpha(e)
    return f"α {lo:.2f}–{hi:.2f} from {e.figures()}, {e.source}"


def _evidence_note(e: PublishedAcceptance) -> str:
    upper = ("; tree drafts accept more than a chain of the same depth: the α is an upper estimate"
             if e.tree else "")
    return f"{_evidence_short(e)}: {e.setting}{upper} ({e.checked})"


def head_alpha_range(kind: HeadKind) -> AlphaRange:
    """The union of the α ranges every source on ``kind`` stands for, rounded to two decimals, with the sources."""
    ranges = [evidence_alpha(e) for e in kind.acceptance]
    low, high = round(min(lo for lo, _ in ranges), 2), round(max(hi for _, hi in ranges), 2)
    return AlphaRange(low, high, "; ".join(_evidence_short(e) for e in kind.acceptance), label=f"{kind.title}s",
                      notes=tuple(_evidence_note(e) for e in kind.acceptance))


def typical_alpha(pair: Pair | None) -> AlphaRange:
    """The typical α range for the draft of ``pair``: its head kind's published range, or :data:`TYPICAL_ALPHA`."""
    if pair is None or pair.head is None:
        return TYPICAL_ALPHA
    return head_alpha_range(pair.head.head_kind)


def default_alpha(pair: Pair) -> tuple[float, str]:
    """The α ``python -m sim`` assumes for ``pair`` when none is given, and a sentence saying where it comes from.

    A separate draft: the preset's ``default_alpha`` and source. A head: its
    first source's headline figure (a τ converted at its depth), else the
    middle of that source's range.
    """
    if pair.head is None:
        assert pair.default_alpha is not None  # a separate draft always has one (Pair checks it)
        return pair.default_alpha, pair.alpha_source
    kind = pair.head.head_kind
    first = kind.acceptance[0]
    if first.headline is not None:
        figure = first.headline
        alpha = figure if first.measure == "alpha" or first.depth is None else implied_alpha_from_tau(figure, first.depth)
        how = (f"{'tree ' if first.tree else ''}τ {figure:g} at depth {first.depth}" if first.measure == "tau"
               else f"α {figure:g}")
        what = f"the headline {how} of {first.source}"
    else:
        lo, hi = evidence_alpha(first)
        alpha = (lo + hi) / 2
        what = f"the middle of {first.figures()}, {first.source}"
    rng = head_alpha_range(kind)
    return alpha, f"{kind.title}: α {alpha:.3f} from {what}; typical range {rng.low:g}–{rng.high:g}"


__all__ = ["TYPICAL_ALPHA", "AlphaRange", "default_alpha", "evidence_alpha", "head_alpha_range", "typical_alpha"]
