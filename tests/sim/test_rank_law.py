"""Rank laws (sim/rank_law.py): the power law's constants come from Medusa's data, every law is a distribution."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.rank_law import (
    MEDUSA_TOPK_ACCURACY,
    POWER_A,
    POWER_B,
    RANK_LAWS,
    RankLaw,
    fit_power_law,
    recall_curve,
)
from sim.trees import PositionalAcceptance


def _curves() -> np.ndarray:
    return np.array([c for model in MEDUSA_TOPK_ACCURACY.values() for c in model])


def test_power_constants_are_the_fit_to_medusa_data():
    a, b, rmse = fit_power_law()
    assert round(a, 3) == POWER_A and round(b, 3) == POWER_B
    assert round(rmse, 3) == 0.008  # the RMSE the docs quote


def test_the_docs_numbers_for_both_laws():
    curves = _curves()
    assert curves.shape == (15, 5) and curves[:, 0].min() == pytest.approx(0.1175, abs=1e-4)
    assert curves[:, 0].max() == pytest.approx(0.6046, abs=1e-4)
    for law, quoted in (("power", 0.008), ("geometric", 0.17)):
        err = np.array([recall_curve(c[0], RankLaw(law), 5) - c for c in curves])[:, 1:]
        assert round(float(np.sqrt(np.mean(err ** 2))), 3 if law == "power" else 2) == quoted
    # the docstring's example: at alpha = 0.56 the geometric law gives top-2 recall 0.81, Medusa measured 0.67
    assert recall_curve(0.56, RankLaw("geometric"), 2)[1] == pytest.approx(0.806, abs=1e-3)
    assert MEDUSA_TOPK_ACCURACY["vicuna-7b"][0][1] == pytest.approx(0.672, abs=1e-3)


@given(st.floats(0.0, 1.0, allow_nan=False), st.sampled_from(RANK_LAWS), st.integers(1, 32))
def test_each_law_is_a_distribution_over_ranks(alpha, kind, ranks):
    p = np.array(RankLaw(kind, ranks).probs(alpha))
    assert p.size == ranks and p[0] == pytest.approx(alpha, abs=1e-12)
    assert np.all(p >= -1e-15) and p.sum() <= 1.0 + 1e-12
    assert np.all(np.diff(p[1:]) <= 1e-12)  # the 2nd, 3rd, ... candidates: ever less likely
    PositionalAcceptance((tuple(p),))  # valid as a row


def test_extend_only_top1_acceptance_and_says_where_the_numbers_come_from():
    acc = RankLaw().extend(PositionalAcceptance.from_chain([0.8, 0.6], "preset x"))
    assert [len(r) for r in acc.p] == [10, 10] and acc.p[0][0] == 0.8 and acc.p[1][0] == 0.6
    assert acc.source.startswith("preset x; ranks 2..10 from the power rank law") and "Medusa" in acc.source
    with pytest.raises(ValueError, match="already gives ranks"):
        RankLaw().extend(acc)
    with pytest.raises(ValueError, match="unknown rank law 'zipf'"):
        RankLaw("zipf")


def test_held_out_by_model_size_the_fit_carries_over():
    # docs/design/trees.md: fit on two models' heads, test on the third: RMSE 0.007-0.009, worst point 0.022
    for held in MEDUSA_TOPK_ACCURACY:
        train = [c for m, v in MEDUSA_TOPK_ACCURACY.items() if m != held for c in v]
        a, b, _ = fit_power_law(train)
        assert abs(a - POWER_A) <= 0.005 and abs(b - POWER_B) <= 0.005
        test = np.array(MEDUSA_TOPK_ACCURACY[held])
        alpha, k = test[:, :1], np.arange(1, 6)[None, :]
        err = ((1 - (1 - alpha) * k ** -(a + b * alpha)) - test)[:, 1:]
        assert 0.006 <= np.sqrt(np.mean(err ** 2)) <= 0.009 and np.abs(err).max() <= 0.022
