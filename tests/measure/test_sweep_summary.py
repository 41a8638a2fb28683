"""The sweep's summary (measure/sweep/summary.py): the routing table of model pooling."""

from __future__ import annotations

import pytest

from measure.ids import CellId
from measure.rows import CellRow
from measure.stats import Estimate
from measure.sweep.summary import routing, summarize, summary_lines
from sim.policies import GammaSpec


def _cell(draft: str, gamma: int, domain: str, speedup: float) -> CellRow:
    return CellRow.make(cell=CellId(draft, GammaSpec("fixed", gamma), 0.0, domain), n_prompts=2, new_tokens=64,
                        tokens_per_s_baseline=None, tokens_per_s_speculative=None, tokens_per_s_peer=None,
                        speedup=Estimate(speedup, speedup * 0.95, speedup * 1.05), acceptance_rate=None,
                        mean_accepted_per_round=None, n_rounds=None, outputs_identical=True, synthetic=False)


def test_routing_sends_each_domain_to_its_best_draft_and_says_the_gain() -> None:
    cells = [_cell("ngram:3", 2, "code", 1.40), _cell("ngram:3", 4, "code", 1.20),
             _cell("ngram:3", 2, "docs", 0.90), _cell("int8", 2, "code", 1.10), _cell("int8", 2, "docs", 1.21),
             _cell("int8", 2, "conversation", 0.80), _cell("ngram:3", 2, "conversation", 0.95)]
    route = routing(cells)
    assert route is not None
    by = {r["domain"]: r for r in route["routes"]}
    assert by["code"]["draft"] == "ngram:3" and by["code"]["speedup"] == pytest.approx(1.40)
    assert by["docs"]["draft"] == "int8"
    assert by["conversation"]["draft"] == "off" and by["conversation"]["cell_id"] is None
    # single best draft over the domains (a losing domain counts as plain decoding, 1.0): ngram 1.4*1*1 vs
    # int8 1.1*1.21*1 -> ngram:3; routing gains docs 1.21 over ngram's 1.0
    assert route["single_best_draft"] == "ngram:3"
    assert route["gain"] == pytest.approx(1.21 ** (1 / 3))
    summary = summarize(cells, synthetic=False)
    assert summary["routing"] == route
    text = "\n".join(summary_lines(summary))
    assert "routing each domain to its best draft" in text and "docs (T=0) -> int8" in text


def test_one_draft_has_no_routing_table() -> None:
    assert routing([_cell("ngram:3", 2, "code", 1.4), _cell("ngram:3", 4, "docs", 1.1)]) is None
    assert "routing" not in summarize([_cell("ngram:3", 2, "code", 1.4)], synthetic=False)
