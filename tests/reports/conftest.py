"""Fixtures shared by the tests of reports: a race record as a ``--until-decided`` run writes it."""

from __future__ import annotations

import pytest

A, B, C = ("draft=ngram:3|gamma=fixed:2|temp=0|domain=code", "draft=ngram:3|gamma=fixed:4|temp=0|domain=code",
           "draft=ngram:3|gamma=fixed:8|temp=0|domain=code")


def _cmp(cell: str, ratio: float, lo: float | None, hi: float | None, n: int) -> dict:
    return {"cell_id": cell, "ratio": ratio, "ratio_lo": lo, "ratio_hi": hi, "n_units": n}


@pytest.fixture
def race_record() -> dict:
    """``run.json`` ``race`` of two groups over three looks: in ``code T=0`` γ = 8 leads, γ = 4 is eliminated
    after pass 2 and γ = 2, deferred by the prior, is eliminated by its check; in ``k=4 c=8`` (a serving race's
    group: any key, any candidate names) ``off`` leads and ``k=4`` is resolved after pass 2."""
    elim = {"cell_id": B, "look": 1, "ratio": 0.8, "ratio_hi": 0.93, "n_units": 4}
    check = {"cell_id": A, "look": 2, "ratio": 0.6, "ratio_hi": 0.8, "n_units": 2}
    looks = [
        {"look": 0, "groups": {
            "code T=0": {"leader": C, "stop_reason": None, "resolved": [], "eliminated": [],
                         "comparisons": [_cmp(A, 1.0, None, None, 0), _cmp(B, 0.82, 0.5, 1.3, 2),
                                         _cmp("off", 0.8, 0.6, 1.1, 2)]},
            "k=4 c=8": {"leader": "off", "stop_reason": None, "resolved": [], "eliminated": [],
                        "comparisons": [_cmp("k=4", 0.97, 0.9, 1.05, 3)]}}},
        {"look": 1, "groups": {
            "code T=0": {"leader": C, "stop_reason": None, "resolved": [], "eliminated": [elim],
                         "comparisons": [_cmp(A, 0.6, None, None, 2), _cmp(B, 0.8, 0.7, 0.93, 4),
                                         _cmp("off", 0.8, 0.7, 0.9, 4)]},
            "k=4 c=8": {"leader": "off", "stop_reason": "decided", "resolved": ["k=4"], "eliminated": [],
                        "comparisons": [_cmp("k=4", 0.98, 0.95, 1.01, 6)]}}},
        {"look": 2, "groups": {
            "code T=0": {"leader": C, "stop_reason": "decided", "resolved": ["off"], "eliminated": [elim, check],
                         "comparisons": [_cmp(A, 0.6, 0.45, 0.8, 2), _cmp("off", 0.8, 0.75, 0.85, 6)]}}},
    ]
    prior = {"calibration": "/cal", "method": "trace", "uncertainty": 0.072, "check_share": 0.2,
             "saved_units": 3, "saved_s": 12.5, "definition": "saved = ...",
             "groups": {"code T=0": {"predicted": {A: 0.94, B: 1.22, C: 1.28, "off": 1.0}, "predicted_leader": C,
                                     "deferred": [A], "joined": [],
                                     "checks": [{"cell_id": A, "leader": C, "start_look": 0, "end_look": 2,
                                                 "verdict": "eliminated", "n_units": 2, "ratio": 0.6,
                                                 "ratio_lo": 0.45, "ratio_hi": 0.8}],
                                     "saved": {"units": 3, "seconds": 12.5, "per_candidate": {},
                                               "leader_extra_units": 0}}}}
    return {"rule": {"confidence": 0.95, "regret": 0.02, "max_looks": 6, "min_units": 2}, "looks": looks,
            "stopped_by": "decided", "decided": {"code T=0": C, "k=4 c=8": "off"}, "prior": prior}
