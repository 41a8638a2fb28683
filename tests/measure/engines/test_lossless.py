"""The one lossless check every run kind applies to a visit (:func:`measure.engines.lossless.judge_against_baseline`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from measure.engines.lossless import judge_against_baseline


@dataclass
class _Engine:
    near_tie_tolerance: float


class _Decoder:
    """A decoder whose logits favour token 2 over token 5 by ``margin`` at every position."""

    def __init__(self, margin: float) -> None:
        self.margin = margin

    def reset(self) -> None:
        pass

    def forward(self, ids: torch.Tensor, last_only: bool = True) -> torch.Tensor:
        x = torch.full((1, 8), -10.0)
        x[0, 2], x[0, 5] = 4.0, 4.0 - self.margin
        return x


class _Target:
    def __init__(self, margin: float) -> None:
        self.margin, self.decoders = margin, 0

    def new_decoder(self) -> Any:
        self.decoders += 1
        return _Decoder(self.margin)


def test_identical_outputs_open_no_decoder_and_carry_the_engines_tolerance():
    target = _Target(0.1)
    c = judge_against_baseline(_Engine(0.25), target, torch.tensor([[1]]), [2, 2], (2, 2))
    assert c.status == "identical" and c.tolerance == 0.25 and target.decoders == 0


def test_a_divergence_is_judged_on_a_fresh_decoder_with_the_engines_tolerance():
    ids = torch.tensor([[1]])
    near = judge_against_baseline(_Engine(0.5), _Target(0.1), ids, [2, 2], [2, 5])
    assert near.status == "near_tie" and near.position == 1 and near.tokens == (2, 5)
    assert judge_against_baseline(_Engine(0.0), _Target(0.1), ids, [2, 2], [2, 5]).status == "failure"
