"""measure.costpoints: cost points sized to the run (issue #28: a small run timed the default run's 780 points)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from measure import costpoints
from measure.sweep import SweepConfig, run_sweep

from tests.support.fake_engine import ToyEngine

ROOT = Path(__file__).resolve().parents[2]
#: the default run's prompts (results/cpu-make-run-fresh3/run.json), per domain
DEFAULT_PROMPTS = {"code": [181, 161], "conversation": [62, 53], "docs": [84, 131]}


def test_the_default_run_times_the_points_it_always_did():
    """Sized to the default run, the plan is the one the default run's fixed settings gave (no slower, and its
    calibration unchanged)."""
    cfg = SweepConfig(gammas=("fixed:2", "fixed:4"), repeats=3)  # python -m measure with no arguments
    plan = costpoints.plan_cost_points(cfg, DEFAULT_PROMPTS)
    committed = json.loads((ROOT / "results" / "cpu-make-run-fresh3" / "run.json").read_text())["config"]
    assert plan.contexts == tuple(committed["cost_contexts"]) == (64, 160, 256)
    assert (plan.max_tokens, plan.repeats, plan.repeats_verified) == \
        (committed["cost_max_tokens"], committed["cost_repeats"], committed["cost_repeats_verified"])
    assert plan.n_points(1) == 780  # 3 × (5 × 40 + 11 × 5) + 3 × 5
    assert costpoints.context_bound(cfg) == 256 + 64 + 4  # the engine's cache: what the cells need, as before


def test_the_issues_small_run_times_a_third_of_the_points():
    """``--prompts 1 --max-new-tokens 24 --gamma 4 --domains code``: one 181-token prompt, 3 repeats; it timed
    the default run's 780 points (3 contexts × 5 token counts × 40 repeats of them)."""
    cfg = SweepConfig(gammas=("fixed:4",), domains=("code",), prompts_per_domain=1, max_new_tokens=24, repeats=3)
    plan = costpoints.plan_cost_points(cfg, {"code": [181]})
    assert plan.contexts == (184, 208)  # 181..205, what its cells see, on a grid of 8
    assert (plan.max_tokens, plan.n_verified, plan.repeats_verified, plan.repeats) == (16, 5, 20, 3)
    assert plan.n_points(1) == 272  # 2 × (5 × 20 + 11 × 3 + 3)
    assert plan.summary(1) == "272 points: contexts 184, 208; 1-5 tokens × 20 repeats, 6-16 × 3; draft steps × 3"


def test_values_given_are_used_as_given_and_repeats_never_drop_below_the_floor():
    cfg = SweepConfig(gammas=("fixed:2",), cost_contexts=(8, 16), cost_max_tokens=4, cost_repeats=2,
                      cost_repeats_verified=3, repeats=1)
    plan = costpoints.plan_cost_points(cfg, {"code": [30]})
    assert (plan.contexts, plan.max_tokens, plan.n_verified, plan.repeats, plan.repeats_verified) == \
        ((8, 16), 4, 3, 2, 3)
    tiny = costpoints.plan_cost_points(SweepConfig(gammas=("fixed:2",), repeats=1), {"code": [30]})
    assert (tiny.repeats_verified, tiny.repeats) == (7, 3)  # 1 pair: 40/6 → 7, and at least 3
    assert costpoints.planned_contexts([100], 4, cap=1000) == (100,)  # a span under 8 tokens: one context
    assert costpoints.planned_contexts([300], 64, cap=310) == (304, 310)  # never above the engine's cache
    with pytest.raises(ValueError, match="no prompts"):
        costpoints.planned_contexts([], 4, cap=10)


def test_a_sweep_times_the_points_its_plan_names_and_records_the_plan(tmp_path):
    cfg = SweepConfig(target="toy", drafts=("ngram:2",), gammas=("fixed:2",), domains=("code",),
                      prompts_per_domain=1, max_new_tokens=10, repeats=2, warmup=0, device="cpu")
    notes: list[str] = []
    run = run_sweep(cfg, tmp_path / "r", engine=ToyEngine(), show_bar=False, progress=notes.append)
    plan = run.meta["cost_plan"]
    ct, cd = run.table("cost_target"), run.table("cost_draft")
    retimed = {(o["n_tokens"], o["context_tokens"]) for o in run.meta["cost_screening"]["outliers"]}
    extra = ct[ct["repeat"] >= 14]  # re-timings of points out of line (a busy machine), numbered after the plan's
    assert set(zip(extra["n_tokens"], extra["context_tokens"])) <= retimed
    ct = ct[ct["repeat"] < 14]
    per_n = ct.groupby("n_tokens")["repeat"].nunique().to_dict()
    assert per_n == {n: 14 if n <= 3 else 3 for n in range(1, 17)}  # 2 pairs: 14 and 3 repeats (not 40 and 5)
    prompt = next(iter(run.meta["prompts"].values()))["prompt_tokens"]
    assert set(ct["context_tokens"]) == set(plan["contexts"])
    assert min(plan["contexts"]) >= prompt - 16 and max(plan["contexts"]) <= prompt + 10
    assert len(ct) + len(cd) == plan["n_points"] == len(plan["contexts"]) * (3 * 14 + 13 * 3 + 3)
    assert any("sized to the run" in n and f"{plan['n_points']} points" in n for n in notes)


# -- screening: a point timed while the machine was busy ---------------------------------------------------------
def _table(slow: dict[tuple[int, int], float] | None = None, repeats: int = 5):
    """A cost table like the 2-core VM's (about 50 ms + 10 ms per token, + 0.1 ms per cached token), with the
    points in ``slow`` timed at that many ms in every repeat."""
    import pandas as pd

    rows = []
    for c in (64, 160, 256):
        for n in range(1, 9):
            for r in range(repeats):
                ms = (slow or {}).get((n, c), 50 + 10 * n + 0.1 * c + 0.5 * r)
                rows.append({"n_tokens": n, "context_tokens": c, "repeat": r, "ms": ms})
    return pd.DataFrame(rows)


def test_a_point_out_of_line_with_its_neighbours_is_found_and_only_it():
    assert costpoints.out_of_line(_table()) == []
    bad = costpoints.out_of_line(_table({(6, 160): 1764.0, (2, 64): 250.0}))
    assert [(n, c) for n, c, *_ in bad] == [(6, 160), (2, 64)]  # the most extreme first
    n, c, med, expected, reps = bad[0]
    assert med == 1764.0 and 100 < expected < 130 and reps == 5
    # its in-line neighbours are not dragged along, even where it is their only neighbour in n
    one_ctx = _table({(2, 64): 2000.0})
    one_ctx = one_ctx[one_ctx["context_tokens"] == 64]
    assert [(n, c) for n, c, *_ in costpoints.out_of_line(one_ctx)] == [(2, 64)]
    # a median of 2 timings is a mean: not judged
    assert costpoints.out_of_line(_table({(6, 160): 1764.0}, repeats=2)) == []


def test_screen_and_retime_keeps_an_in_line_retiming_and_drops_a_point_still_out_of_line():
    import pandas as pd

    table = _table({(6, 160): 1764.0})
    asked = []

    def retime(keys, ms=120.0):
        asked.extend(keys)
        return pd.DataFrame([{"n_tokens": n, "context_tokens": c, "repeat": r, "ms": ms} for n, c, r in keys])

    s = costpoints.screen_and_retime(table, None, retime)
    assert asked == [(6, 160, 5 + i) for i in range(5)]  # as many repeats again, numbered after the last
    assert sorted(tuple(k) for k in s["superseded"]) == [(6, 160, r) for r in range(5)]
    (o,) = s["outliers"]
    assert o["action"] == "re-timed" and o["median_ms"] == 1764.0 and o["retimed_ms"] == 120.0
    assert s["notes"] == ["cost curves: a 6-token forward after 160 cached took 1,764.0 ms (median of 5) against "
                          f"{o['expected_ms']:,.1f} ms around it: re-timed, 120.0 ms, in line; the re-timing "
                          "replaces it"]
    full = pd.concat([table, retime(asked[:5])], ignore_index=True)
    kept = costpoints.screen_target(full, s["superseded"]).kept
    assert kept[(kept["n_tokens"] == 6) & (kept["context_tokens"] == 160)]["ms"].tolist() == [120.0] * 5
    still = costpoints.screen_and_retime(table, None, lambda keys: retime(keys, 1700.0))
    (o,) = still["outliers"]
    assert o["action"] == "dropped" and o["retimed_ms"] == 1700.0 and "dropped from the fit" in still["notes"][0]
    dropped = costpoints.screen_and_retime(table, None, None)  # nothing to re-time with (timed on a Ray worker)
    assert dropped["outliers"][0]["action"] == "dropped" and dropped["superseded"] == []


class BusyPointToy(ToyEngine):
    """The toy engine (10-ms forwards: a loaded test machine's scheduling noise stays well under 2x) on a machine
    busy while one cost point (4 tokens after 16 cached) is timed: its first ``busy_calls`` forwards (the warm-up
    and its repeats) take 300 ms more; later ones (a re-timing) do not."""

    def __init__(self, busy_calls: int) -> None:
        super().__init__(step_s=0.01)
        self.busy_calls = busy_calls

    def load_target(self, spec, *, device, dtype, seed):
        target = super().load_target(spec, device=device, dtype=dtype, seed=seed)
        engine, real = self, target.new_decoder

        def new_decoder():
            dec = real()
            forward = dec.forward

            def slow(input_ids, last_only=False):
                if dec.n_cached == 16 and input_ids.shape[1] == 4 and engine.busy_calls > 0:
                    engine.busy_calls -= 1
                    time.sleep(0.3)
                return forward(input_ids, last_only)

            dec.forward = slow
            return dec

        target.new_decoder = new_decoder
        return target


@pytest.mark.parametrize("busy_calls,action", [(4, "re-timed"), (100, "dropped")])
@pytest.mark.slow
def test_a_sweep_retimes_a_busy_cost_point_says_so_and_records_it(tmp_path, busy_calls, action):
    cfg = SweepConfig(target="toy", drafts=("ngram:2",), gammas=("fixed:2",), domains=("code",),
                      prompts_per_domain=1, max_new_tokens=6, repeats=1, warmup=0, device="cpu",
                      cost_contexts=(8, 16, 24), cost_max_tokens=6, cost_repeats=3, cost_repeats_verified=3)
    notes: list[str] = []
    run = run_sweep(cfg, tmp_path / "r", engine=BusyPointToy(busy_calls), show_bar=False, progress=notes.append)
    screening = run.meta["cost_screening"]
    found = [o for o in screening["outliers"] if (o["n_tokens"], o["context_tokens"]) == (4, 16)]
    assert len(found) == 1 and found[0]["action"] == action and found[0]["median_ms"] > 300
    said = [n for n in notes if n.startswith("cost curves: a 4-token forward after 16 cached")]
    assert said and (("in line" in said[0]) if action == "re-timed" else ("dropped from the fit" in said[0]))
    ct = run.table("cost_target")
    point = ct[(ct["n_tokens"] == 4) & (ct["context_tokens"] == 16)]
    assert len(point) == 6  # 3 repeats, then 3 re-timed (repeats 3, 4, 5): nothing measured is deleted
    assert {(4, 16, 0), (4, 16, 1), (4, 16, 2)} <= {tuple(k) for k in screening["superseded"]}


@pytest.mark.slow
def test_calibrate_leaves_a_busy_cost_point_out_and_says_so(tmp_path, monkeypatch):
    """A run whose table has a point timed while the machine was busy (a Ray worker's, or written before the
    sweep screened): 5 tokens after 16 cached, beyond the 4 its γ ≤ 3 cells verify, as in the issue (6 tokens
    beyond γ = 4). Unscreened, the speedup curve collapses at γ = 4 and the jump is flagged; screened as the
    sweep does, the point is left out, said, and the curve has no jump."""
    import pandas as pd

    import calibrate.calibration as cal
    import calibrate.prediction as prediction
    from measure.costpoints import Screening

    cfg = SweepConfig(target="toy", drafts=("ngram:2",), gammas=("fixed:2", "fixed:3"), domains=("code",),
                      prompts_per_domain=2, max_new_tokens=12, repeats=2, warmup=0, device="cpu",
                      cost_contexts=(8, 16, 24), cost_max_tokens=6, cost_repeats=3, cost_repeats_verified=3)
    run_sweep(cfg, tmp_path / "r", engine=ToyEngine(step_s=0.01), show_bar=False)  # 10 ms: steadier under load
    f = tmp_path / "r" / "cost_target.csv"
    ct = pd.read_csv(f)
    busy = (ct["n_tokens"] == 5) & (ct["context_tokens"] == 16)
    ct.loc[busy, "ms"] *= 1000  # every repeat of it: the median cannot hide it
    ct.to_csv(f, index=False)  # (the run's own screening, in run.json, saw it in line)

    def closed_form(res):
        c = res.curves[res.curves["method"] == "closed_form"].sort_values("gamma")
        return dict(zip(c["gamma"], c["predicted_speedup"]))

    res = cal.calibrate([tmp_path / "r"])
    said = [n for n in res.data.notes if "cost curves: a 5-token forward after 16 cached" in n]
    assert len(said) == 1 and "dropped from the fit" in said[0]
    assert not [n for n in res.data.notes if "jumps" in n and "at γ = 4:" in n]  # (the toy's own noise may jump
    curve = closed_form(res)                                                      # elsewhere on a loaded machine)
    assert 0.5 < curve[4] / curve[3] < 2
    with monkeypatch.context() as m:  # the same calibration without the screening
        m.setattr(prediction, "screen_target", lambda table, superseded=(): Screening(table, ()))
        raw = cal.calibrate([tmp_path / "r"])
    assert closed_form(raw)[4] / closed_form(raw)[3] < 0.5
    (jump,) = [n for n in raw.data.notes if "jumps" in n and "(closed_form)" in n]
    assert "at γ = 3 to" in jump and "at γ = 4: no cost model allows that" in jump and "near 5 tokens" in jump


def test_a_curve_with_a_jump_no_cost_model_allows_is_flagged():
    """The issue's prediction: 1.62x at γ = 4, 0.07x at γ = 5."""
    import pandas as pd

    from calibrate.checks import curve_jumps

    def curve(values):
        return pd.DataFrame({"run": "r", "series": "ngram:3/code", "method": "closed_form",
                             "gamma": range(1, len(values) + 1), "predicted_speedup": values})

    (note,) = curve_jumps(curve([1.1, 1.3, 1.5, 1.62, 0.07, 0.07]))
    assert note.startswith("r: the predicted speedup curve of ngram:3/code (closed_form) jumps from 1.62x at γ = 4 "
                           "to 0.07x at γ = 5: no cost model allows that")
    assert "near 6 tokens" in note
    assert curve_jumps(curve([0.9, 1.2, 1.3, 1.25, 1.1, 0.95])) == []  # an ordinary curve: rises, then falls
