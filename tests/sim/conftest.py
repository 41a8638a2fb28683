"""Fixtures of the sim tests: a cost model with known prices per forward width."""

from __future__ import annotations

import pytest


class KnownCost:
    """Known prices per forward width (ms): draft 1 + 0.1 per token, target 10 + 0.5 per token, extend 0.2 per
    position; with a chain the SGLang round is exactly the chain round."""

    def target_step_ms(self, context_tokens: float, batch: int = 1) -> float:
        return 10.5

    def draft_step_ms(self, context_tokens: float, batch: int = 1) -> float:
        return self.draft_forward_ms(1, context_tokens, batch)

    def draft_forward_ms(self, n_tokens: int, context_tokens: float, batch: int = 1) -> float:
        return 1.0 + 0.1 * n_tokens * batch

    def verify_ms(self, n_tokens: int, context_tokens: float, batch: int = 1) -> float:
        return self.verify_extend_ms(n_tokens, n_tokens, context_tokens, batch)

    def verify_extend_ms(self, n_tokens: int, extend_tokens: int, context_tokens: float, batch: int = 1) -> float:
        return 10.0 + 0.5 * n_tokens * batch + 0.2 * extend_tokens * batch

    def round_overhead_ms(self, gamma: int) -> float:
        return 0.0

    def describe(self) -> dict:
        return {"kind": "known"}


@pytest.fixture()
def known_cost() -> KnownCost:
    return KnownCost()
