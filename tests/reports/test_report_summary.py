"""reports.summary: the answer a report leads with, from small hand-made tables (no calibration needed)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from reports.page import group_labels
from reports.summary import cell_label, cell_results, headline, measured_setups, predicted_optima


def _cells() -> pd.DataFrame:
    rows = [("code", "fixed:2", 1.27, 1.15, 1.40, True, "baseline drifted 20% from start to end (threshold 20%)"),
            ("code", "fixed:4", 0.97, 0.84, 1.11, False, None),
            ("docs", "fixed:2", 1.09, 0.91, 1.27, False, None),
            ("docs", "fixed:4", 0.87, 0.73, 0.99, False, None)]
    return pd.DataFrame([{"run": "r", "cell_id": f"draft=ng|gamma={g}|temp=0|domain={d}", "draft": "ng", "domain": d,
                          "gamma_policy": g, "temperature": 0.0, "head_k": None, "speedup": s, "speedup_lo": lo,
                          "speedup_hi": hi, "unstable": u, "unstable_reason": why}
                         for d, g, s, lo, hi, u, why in rows])


def _pred(cells: pd.DataFrame, split: str = "held_out") -> pd.DataFrame:
    return pd.DataFrame([{"run": "r", "cell_id": c["cell_id"], "method": m, "split": split,
                          "predicted_speedup": c["speedup"] * 1.05, "ape_speedup_pct": 5.0, "inside_ci": True}
                         for _, c in cells.iterrows() for m in ("trace", "closed_form")])


def _doc(held: bool = True, mape_pct: float = 5.0) -> dict:
    table = {m: {"speedup_mape_pct": mape_pct, "tokens_per_s_mape_pct": 4.0, "n_cells": 3, "n_inside_ci": 3,
                 "n_with_ci": 3, "share_inside_ci": 1.0} for m in ("trace", "closed_form")}
    return {"runs": {"r": {"hardware": {"device_name": "Test CPU", "cores": 2}}},
            "holdout": {"mode": "gamma" if held else "none"},
            "mape": {"in_sample": table, "held_out": table if held else {}},
            "files": {"cost_models": {"r/ng": "cost_model-ng.json"}, "acceptance": {"draft=ng": "acceptance-ng.json"}}}


def _curves() -> pd.DataFrame:
    speed = {1: 1.0, 2: 1.05, 3: 1.0, 4: 0.97, 5: 1.0, 6: 1.1, 7: 1.15, 8: 1.24, 9: 1.2, 10: 1.19}
    return pd.DataFrame([{"series": "ng/code", "gamma": g, "method": "closed_form", "predicted_speedup": v}
                         for g, v in speed.items()])


def test_a_cell_with_one_bound_of_its_interval_has_no_interval():
    """A cells table with ``speedup_lo`` but an empty ``speedup_hi`` (hand-edited): no interval, not a TypeError."""
    cells = _cells()
    cells.loc[1, "speedup_hi"] = float("nan")
    one = cell_results(cells, _pred(cells))[1]
    assert one.lo == 0.84 and one.hi is None
    assert one.against_one() == "no interval" and one.ci_text() == "0.97×"


def test_every_cell_is_accounted_for_and_the_unstable_one_is_not_the_answer():
    cells = _cells()
    results = cell_results(cells, _pred(cells))
    assert [r.label for r in results] == ["ng · code · γ 2", "ng · code · γ 4", "ng · docs · γ 2", "ng · docs · γ 4"]
    assert results[0].left_out == "unstable: baseline drifted 20% from start to end (threshold 20%)"
    assert [r.left_out for r in results[1:]] == ["", "", ""]
    assert [r.against_one() for r in results] == ["faster", "not distinguishable", "not distinguishable", "slower"]
    h = headline(results, _doc(), [], Path("/cal"))
    assert h.answer.startswith("Best measured speedup: 1.09× [0.91, 1.27] (95% CI) with ng · docs · γ 2: not "
                               "distinguishable from plain decoding")
    assert h.caveat.startswith("ng · code · γ 2 measured more, 1.27× [1.15, 1.40], but it is flagged unstable")
    assert "over 3 of 4 cells" in h.error and "held out by γ" in h.error
    assert h.left_out == ("ng · code · γ 2: unstable: baseline drifted 20% from start to end (threshold 20%)",)
    commands = [s.command for s in h.next_steps]
    assert "--until-stable 2" in commands and "--prompts N --repeats N" in commands
    assert commands[-1] == "python -m sim --cost-model /cal/cost_model-ng.json --acceptance /cal/acceptance-ng.json " \
                           "--gamma-max 10"


def test_a_predicted_best_gamma_beyond_the_measured_ones_is_named_an_extrapolation():
    cells = _cells()
    results = cell_results(cells, _pred(cells))
    (opt,) = predicted_optima(_curves(), results)
    assert (opt.gamma, opt.measured_gammas, opt.measured) == (8, (2, 4), False)  # the unstable γ 2 was measured too
    assert opt.speedup_at_best_measured == 0.97  # the best stable measurement is γ 4
    steps = headline(results, _doc(), [opt], Path("/cal")).next_steps
    far = [s for s in steps if "extrapolation" in s.text]
    assert len(far) == 1 and "1.24× for ng · code at γ = 8, beyond the measured γ 2, 4" in far[0].text
    assert far[0].command == "--gamma 2,4,8"
    # the model's best γ among the measured ones: nothing to extrapolate, no such step
    (opt2,) = predicted_optima(_curves().assign(predicted_speedup=lambda d: d["predicted_speedup"].where(
        d["gamma"] != 4, 1.3)), results)
    assert opt2.measured and opt2.gain == 0.0
    assert not any("extrapolation" in s.text for s in headline(results, _doc(), [opt2], Path("/cal")).next_steps)


def test_a_rough_or_in_sample_error_is_said_and_a_clear_win_is_named():
    cells = _cells().assign(speedup_lo=lambda d: d["speedup"] * 0.95, speedup_hi=lambda d: d["speedup"] * 1.05,
                            unstable=False)
    results = cell_results(cells, _pred(cells, "in_sample"))
    h = headline(results, _doc(held=False), [], Path("/cal"))
    texts = [s.text for s in h.next_steps]
    assert texts[0] == "Use ng at γ = 2 for code text: it measured 1.27× [1.21, 1.33]."
    assert any("Nothing was held out" in t for t in texts) and "in-sample: nothing was held out" in h.error
    rough = headline(cell_results(cells, _pred(cells)), _doc(mape_pct=17.2), [], Path("/cal"))
    assert any("misses held-out cells by 17.2%" in s.text for s in rough.next_steps)


def test_the_setup_names_models_engine_and_machine():
    meta = {"models": {"target": {"name": "smollm2-135m", "params": 134515008, "dtype": "float32",
                                  "source": "gguf:/x/SmolLM2.gguf"},
                       "drafts": {"ngram:3": {"kind": "ngram", "max_ngram": 3}}},
            "config": {"engine": "transformers", "gammas": ["fixed:2"], "prompts_per_domain": 2, "repeats": 3,
                       "max_new_tokens": 64, "temperatures": [0.0]},
            "versions": {"transformers": "5.23.0", "torch": "2.13.0"}, "command": "python -m measure",
            "status": "complete", "created_utc": "2026-11-24T07:36:45Z"}
    (st,) = measured_setups(_doc(), {"r": meta}, _cells())
    assert st.target == "smollm2-135m (134.5M parameters, float32, SmolLM2.gguf)"
    assert st.drafts == ("ngram:3 (prompt lookup: the last ≤ 3 tokens matched in the context)",)
    assert st.engine.startswith("transformers 5.23.0 (torch 2.13.0") and st.hardware == "Test CPU, 2 cores"
    assert "domains code, docs" in st.workload and st.status == "complete, 2026-11-24"
    # cells added later (--extend): their γ in the workload, their command after the run's, their status said
    meta["extensions"] = [{"added": {"gammas": ["fixed:4"]}, "command": "python -m measure --gamma 2,4 --extend",
                           "status": "interrupted"}]
    (st,) = measured_setups(_doc(), {"r": meta}, _cells())
    assert "γ policies fixed:2, fixed:4;" in st.workload
    assert st.command == "python -m measure; then python -m measure --gamma 2,4 --extend"
    assert st.status == "complete, 2026-11-24; 1 extension(s), the last interrupted"


def test_labels_keep_what_tells_cells_and_groups_apart():
    assert cell_label("ng", "code", "fixed:4", head_k=512.0, temperature=0.7, run="r2") == "r2 · ng · code · γ 4 · " \
                                                                                        "K 512 · T 0.7"
    assert cell_label("ng", "code", "heuristic:2") == "ng · code · heuristic:2"
    groups = ["draft=a|temp=0|domain=code", "draft=a|temp=0|domain=docs", "draft=b|temp=0.7|domain=code"]
    assert group_labels(groups) == {groups[0]: "a · temp 0 · code", groups[1]: "a · temp 0 · docs",
                                    groups[2]: "b · temp 0.7 · code"}
    assert group_labels(groups[:2]) == {groups[0]: "a · code", groups[1]: "a · docs"}
