"""The sweep's summary (measure/sweep/summary.py): the cells whose baseline leaves the engine's own plain decoding
(0.95–1.05), and whether our speedups agree with the engine's own speculative decoding within their intervals."""

from __future__ import annotations

from measure.ids import CellId
from measure.rows import CellRow
from measure.stats import Estimate
from measure.sweep.summary import summarize, summary_lines
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
