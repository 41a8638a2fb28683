"""The sweep's summary (measure/sweep/summary.py): the cells whose baseline leaves the engine's own plain decoding
(0.95–1.05), whether our speedups agree with the engine's own speculative decoding within their intervals, and the
routing table of model pooling."""

from __future__ import annotations

import pytest

from measure.ids import CellId
from measure.rows import CellRow
from measure.stats import Estimate
from measure.sweep.summary import routing, summarize, summary_lines
from sim.policies import GammaSpec


def _cell(gamma: int, ratio: Estimate, speedup: Estimate, peer: Estimate) -> CellRow:
    return CellRow.make(cell=CellId("ngram:2:first", GammaSpec.parse(f"fixed:{gamma}"), 0.0, "code"), n_prompts=2,
                        new_tokens=128, tokens_per_s_baseline=Estimate(50.0, 45.0, 55.0),
                        tokens_per_s_speculative=Estimate(40.0, 35.0, 45.0), tokens_per_s_peer=Estimate(41.0, 1, 99),
                        speedup=speedup, acceptance_rate=0.3, mean_accepted_per_round=0.8, n_rounds=40,
                        outputs_identical=True, synthetic=False, repeats=2, speedup_peer=peer,
                        baseline_vs_library=ratio)


def test_a_cell_whose_baseline_leaves_the_engines_own_is_flagged_with_its_interval():
    cells = [_cell(2, Estimate(0.99, 0.95, 1.03), Estimate(0.8, 0.7, 0.9), Estimate(0.78, 0.7, 0.86)),
             _cell(4, Estimate(0.86, 0.80, 0.93), Estimate(0.7, 0.65, 0.75), Estimate(0.9, 0.85, 0.95)),
             _cell(8, Estimate(1.02, None, None), Estimate(0.6, None, None), Estimate(0.55, None, None))]
    s = summarize(cells, synthetic=False)
    lib = s["baseline_vs_library"]
    assert lib["n_cells"] == 3 and lib["target"] == [0.95, 1.05]
    assert [c["cell_id"] for c in lib["outside"]] == [cells[1].cell_id]
    assert (lib["outside"][0]["ratio"], lib["outside"][0]["lo"], lib["outside"][0]["hi"]) == (0.86, 0.80, 0.93)
    # our speedup against the peer's: the cell without intervals is not counted, the disjoint one is named
    peer = s["speedup_vs_peer"]
    assert (peer["n_cells"], peer["n_overlap"]) == (2, 1) and [c["cell_id"] for c in peer["apart"]] == [cells[1].cell_id]
    lines = summary_lines(s)
    flagged = [ln for ln in lines if "outside 0.95–1.05" in ln]
    assert len(flagged) == 1 and cells[1].cell_id in flagged[0] and "0.860 [0.800, 0.930]" in flagged[0]
    assert "our speedup's CI overlaps the engine's own speculative decoding's in 1 of 2 cells" in lines
    assert any(ln.endswith("apart") and cells[1].cell_id in ln for ln in lines)


def test_a_run_without_a_library_or_peer_says_nothing_of_them():
    none = Estimate(None, None, None)
    s = summarize([_cell(2, none, Estimate(0.8, 0.7, 0.9), none)], synthetic=False)
    assert "baseline_vs_library" not in s and "speedup_vs_peer" not in s
    assert not [ln for ln in summary_lines(s) if "engine's own" in ln]


def _routed(draft: str, gamma: int, domain: str, speedup: float) -> CellRow:
    return CellRow.make(cell=CellId(draft, GammaSpec("fixed", gamma), 0.0, domain), n_prompts=2, new_tokens=64,
                        tokens_per_s_baseline=None, tokens_per_s_speculative=None, tokens_per_s_peer=None,
                        speedup=Estimate(speedup, speedup * 0.95, speedup * 1.05), acceptance_rate=None,
                        mean_accepted_per_round=None, n_rounds=None, outputs_identical=True, synthetic=False)


def test_routing_sends_each_domain_to_its_best_draft_and_says_the_gain() -> None:
    cells = [_routed("ngram:3", 2, "code", 1.40), _routed("ngram:3", 4, "code", 1.20),
             _routed("ngram:3", 2, "docs", 0.90), _routed("int8", 2, "code", 1.10), _routed("int8", 2, "docs", 1.21),
             _routed("int8", 2, "conversation", 0.80), _routed("ngram:3", 2, "conversation", 0.95)]
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
    assert routing([_routed("ngram:3", 2, "code", 1.4), _routed("ngram:3", 4, "docs", 1.1)]) is None
    assert "routing" not in summarize([_routed("ngram:3", 2, "code", 1.4)], synthetic=False)
