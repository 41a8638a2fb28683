"""Tests of measure.analysis: per-position acceptance and drafted counts from ``rounds`` records."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd

from measure import analysis


def test_per_position_acceptance():
    rounds = pd.DataFrame({"gamma": [2, 2, 2, 1], "accepted": [0, 1, 2, 1]})
    alpha = analysis.per_position_acceptance(rounds)
    # position 1: 4 rounds reach it, 3 accept; position 2: rounds with gamma>=2 and accepted>=1 -> 2, 1 accepts
    assert alpha["n"].tolist() == [4, 2] and alpha["accepted"].tolist() == [3, 1]
    assert alpha["alpha"].tolist() == [0.75, 0.5]


def test_drafted_counts_prefers_drafted_over_gamma():
    rounds = pd.DataFrame({"gamma": [4, 4], "drafted": [4, 0], "accepted": [1, 0]})
    assert analysis.drafted_counts(rounds).tolist() == [4, 0]
    assert analysis.drafted_counts(rounds.drop(columns="drafted")).tolist() == [4, 4]
    # a position never proposed was never judged
    assert analysis.per_position_acceptance(rounds)["n"].tolist() == [1, 1, 0, 0]


def test_analysis_imports_no_torch():
    code = "import sys, measure.analysis; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
