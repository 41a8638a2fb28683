"""The sweep's one pipeline on a toy engine: repeats in rotating order, CIs, resume identity, tokens on disk,
crash safety (SIGTERM, SIGKILL) and the head sweep through the same cell code."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from measure import records, stats
from measure.sweep import cells, identity
from measure.rows import parse_tokens
from measure.sweep import MODES, CostCurves, SweepConfig, Visit, rotation, run_sweep

from tests.support.fake_engine import ToyEngine

ROOT = Path(__file__).resolve().parents[2]


def _cfg(**kw) -> SweepConfig:
    base = dict(target="toy", drafts=("ngram:2",), gammas=("fixed:2", "fixed:3"), domains=("code", "docs"),
                prompts_per_domain=2, max_new_tokens=10, repeats=2, warmup=1, cost_contexts=(8, 16),
                cost_max_tokens=2, cost_repeats=2, cost_repeats_verified=2, device="cpu")
    base.update(kw)
    return SweepConfig(**base)


def test_rotation_cycles_through_every_order():
    modes = ("baseline", "speculative", "peer")
    orders = [rotation(i, modes) for i in range(4)]
    assert orders[0] == modes and orders[1] == ("speculative", "peer", "baseline")
    assert orders[2] == ("peer", "baseline", "speculative") and orders[3] == modes


@pytest.mark.slow
def test_sweep_records_repeats_cis_and_tokens(tmp_path):
    run = run_sweep(_cfg(), tmp_path / "r", engine=ToyEngine(), show_bar=False)
    assert run.status == "complete" and run.schema_version == records.SCHEMA_VERSION
    cells = run.table("cells")
    assert len(cells) == 4 and (cells["repeats"] == 2).all()
    assert (cells["speedup_lo"] <= cells["speedup"]).all() and (cells["speedup"] <= cells["speedup_hi"]).all()
    gens = run.table("generations")
    # 2 prompts x 2 repeats x 4 modes per cell (the toy engine has a peer and a library baseline); 4 visits per
    # cell rotate the 4 modes through every position of the order
    assert len(gens) == 4 * 2 * 2 * 4
    assert set(gens["order"]) == {0, 1, 2, 3}
    for mode in ("baseline", "speculative", "peer", "library"):
        assert set(gens[gens["mode"] == mode]["order"]) == {0, 1, 2, 3}
    assert set(gens["repeat"]) == {0, 1}
    assert run.summary["drafts"]["ngram:2"]["geomean_speedup"] > 0
    # the library baseline: a column per cell with its CI, our baseline over it, and the run's geometric mean
    assert (cells["tokens_per_s_library"] > 0).all() and (cells["baseline_vs_library"] > 0).all()
    assert (cells["baseline_vs_library_lo"] <= cells["baseline_vs_library"]).all()
    base_mean = gens[gens["mode"] == "baseline"].groupby("cell_id")["tokens_per_s"].mean()
    lib_mean = gens[gens["mode"] == "library"].groupby("cell_id")["tokens_per_s"].mean()
    ratio = cells.set_index("cell_id")["baseline_vs_library"]
    assert ((ratio - base_mean / lib_mean).abs() < 1e-9).all()
    lib = run.summary["baseline_vs_library"]
    assert lib["n_cells"] == 4 and lib["lo"] <= lib["geomean"] <= lib["hi"] and lib["target"] == [0.95, 1.05]
    assert "estimator" in run.summary
    assert len(run.table("cost_target")) == 2 * 2 * 2  # contexts x n x repeats, interleaved


def test_tokens_on_disk_reproduce_the_lossless_check(tmp_path):
    run = run_sweep(_cfg(gammas=("fixed:3",), domains=("code",)), tmp_path / "r", engine=ToyEngine(),
                    show_bar=False)
    gens = run.table("generations")
    key = ["cell_id", "prompt_id", "repeat"]
    base = gens[gens["mode"] == "baseline"].set_index(key)["tokens"].map(parse_tokens)
    spec = gens[gens["mode"] == "speculative"].set_index(key)["tokens"].map(parse_tokens)
    assert len(base) == 4 and all(len(t) == 10 for t in base)
    recomputed = (base == spec.loc[base.index])
    assert recomputed.all() and bool(run.table("cells")["outputs_identical"].all())
    # acceptance recomputes from the rounds on disk
    rounds = run.table("rounds")
    cell = run.table("cells").iloc[0]
    assert rounds["accepted"].sum() / rounds["drafted"].sum() == pytest.approx(cell["acceptance_rate"])


@pytest.mark.slow
def test_resume_with_changed_max_new_tokens_is_refused(tmp_path):
    run_sweep(_cfg(domains=("code",), gammas=("fixed:2",)), tmp_path / "r", engine=ToyEngine(), show_bar=False)
    before = (tmp_path / "r" / "run.json").read_text()
    eng = ToyEngine()
    with pytest.raises(records.FingerprintMismatch, match="max_new_tokens 10 -> 12"):
        run_sweep(_cfg(domains=("code",), gammas=("fixed:2",), max_new_tokens=12), tmp_path / "r", engine=eng,
                  show_bar=False)
    assert eng.loads == []  # refused before any model load
    assert (tmp_path / "r" / "run.json").read_text() == before
    # --force-new keeps the old run aside and starts afresh
    run = run_sweep(_cfg(domains=("code",), gammas=("fixed:2",), max_new_tokens=12), tmp_path / "r",
                    engine=ToyEngine(), show_bar=False, force_new=True)
    assert run.status == "complete" and len(list(tmp_path.glob("r.replaced-*"))) == 1


@pytest.mark.slow
def test_extend_adds_cells_without_redoing_finished_ones(tmp_path):
    run_sweep(_cfg(gammas=("fixed:2",), domains=("code",)), tmp_path / "r", engine=ToyEngine(), show_bar=False)
    first = records.load_run(tmp_path / "r").table("generations")
    run = run_sweep(_cfg(gammas=("fixed:2", "fixed:3"), domains=("code",)), tmp_path / "r", engine=ToyEngine(),
                    show_bar=False, extend=True)
    gens = run.table("generations")
    old = gens[gens["cell_id"] == first["cell_id"].iloc[0]]
    assert old["wall_s"].tolist() == first["wall_s"].tolist() and len(run.table("cells")) == 2


@pytest.mark.slow
def test_until_stable_remeasures_an_unstable_cell(tmp_path, monkeypatch):
    calls = []
    real = stats.stability

    def flaky(values, cv, drift, what="baseline"):
        calls.append(1)
        st = real(values, cv, drift, what)
        if len(calls) == 1:  # the first attempt looks noisy
            return stats.Stability(True, 0.5, 0.0, "baseline varied 50% (threshold 10%)")
        return st

    monkeypatch.setattr(stats, "stability", flaky)
    run = run_sweep(_cfg(gammas=("fixed:2",), domains=("code",), until_stable=2, cv_threshold=5.0,
                         drift_threshold=5.0), tmp_path / "r", engine=ToyEngine(), show_bar=False)
    cell = run.table("cells").iloc[0]
    assert cell["attempts"] == 2 and not cell["unstable"]
    assert len(run.table("generations")) == 2 * 2 * len(MODES)  # only the last attempt's rows are kept


_KILL_SCRIPT = """
import sys
from tests.support.fake_engine import ToyEngine
from measure.sweep import SweepConfig, run_sweep
cfg = SweepConfig(target="toy", drafts=("ngram:2",), gammas=("fixed:2", "fixed:3", "fixed:4"),
                  domains=("code", "docs"), prompts_per_domain=2, max_new_tokens=12, repeats=2,
                  cost_curves=False, device="cpu")
try:
    run_sweep(cfg, sys.argv[1], engine=ToyEngine(step_s=0.02), show_bar=False)
except KeyboardInterrupt:
    sys.exit(143)
"""


def _staged_lines(out: Path) -> int:
    f = out / records.STAGED_VISITS
    return len(f.read_text().splitlines()) if f.exists() else 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
@pytest.mark.slow
def test_kill_during_a_run_then_resume(tmp_path, sig):
    """Killed mid-sweep, the run keeps every finished visit (staged on disk); the resume measures only the
    missing ones and finishes every cell whole."""
    out = tmp_path / "r"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.Popen([sys.executable, "-c", _KILL_SCRIPT, str(out)], env=env)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:  # wait for a few finished visits (cells finish only at the end)
            if _staged_lines(out) >= 3:
                break
            time.sleep(0.05)
        else:
            pytest.fail("no visit finished")
        p.send_signal(sig)
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    run = records.load_run(out)
    assert run.status == "interrupted"  # SIGTERM: closed by the handler; SIGKILL: the dead pid is noticed
    if sig == signal.SIGTERM:
        assert p.returncode == 143
    staged = [Visit.from_record(json.loads(ln))
              for ln in (out / records.STAGED_VISITS).read_text().splitlines() if ln.strip()]
    assert len(staged) >= 3
    kept = {(r.cell_id, r.prompt_id, r.repeat, r.mode): r.wall_s for v in staged for r in v.gen_rows}
    cfg = SweepConfig(target="toy", drafts=("ngram:2",), gammas=("fixed:2", "fixed:3", "fixed:4"),
                      domains=("code", "docs"), prompts_per_domain=2, max_new_tokens=12, repeats=2,
                      cost_curves=False, device="cpu")
    again = run_sweep(cfg, out, engine=ToyEngine(step_s=0.0), show_bar=False)
    cells = again.table("cells")
    assert again.status == "complete" and len(cells) == 6 and cells["cell_id"].is_unique
    gens = again.table("generations")
    assert (gens.groupby("cell_id").size() == 2 * 2 * len(MODES)).all()  # no half cell left behind
    final = {(r["cell_id"], r["prompt_id"], r["repeat"], r["mode"]): r["wall_s"] for r in gens.to_dict("records")}
    assert all(final[k] == pytest.approx(w) for k, w in kept.items())  # the staged visits, not re-measured
    assert not (out / records.STAGED_VISITS).exists()  # every cell finished: nothing staged is left


@pytest.mark.parametrize("mode", ["sweep", "cell"])
@pytest.mark.slow
def test_visits_are_interleaved_across_cells(tmp_path, monkeypatch, mode):
    """``sweep``: prompt by prompt, repeat by repeat, every cell in each pass; ``cell``: one cell at a time."""
    order = []
    real = cells._visit

    def spy(ctx, plan, modes, rep, pi, attempt):
        order.append((plan.cell_id, rep, pi))
        return real(ctx, plan, modes, rep, pi, attempt)

    monkeypatch.setattr(cells, "_visit", spy)
    run = run_sweep(_cfg(interleave=mode, cost_curves=False), tmp_path / "r", engine=ToyEngine(), show_bar=False)
    cids = list(run.table("cells")["cell_id"])
    assert len(cids) == 4 and len(order) == 4 * 2 * 2
    if mode == "sweep":
        want = [(c, rep, pi) for rep in range(2) for pi in range(2) for c in cids]
    else:
        want = [(c, rep, pi) for c in cids for rep in range(2) for pi in range(2)]
    assert order == want


def test_interleave_is_part_of_the_run_identity(tmp_path):
    run_sweep(_cfg(domains=("code",), gammas=("fixed:2",), cost_curves=False), tmp_path / "r", engine=ToyEngine(),
              show_bar=False)
    with pytest.raises(records.FingerprintMismatch, match="interleave"):
        run_sweep(_cfg(domains=("code",), gammas=("fixed:2",), cost_curves=False, interleave="cell"),
                  tmp_path / "r", engine=ToyEngine(), show_bar=False)
    with pytest.raises(ValueError, match="--interleave 'pass': unknown; valid: sweep, cell"):
        _cfg(interleave="pass")


@pytest.mark.slow
def test_head_sweep_and_main_sweep_cells_share_one_code_path(tiny_llama_dir, tmp_path, monkeypatch):
    """Both front ends measure and write cells with measure.sweep.measure_cells (its ``_finish``); the head
    sweep's cells carry the same columns."""
    from measure.head import head_sweep

    seen = []
    real = cells._finish

    def spy(ctx, plan, *a, **kw):
        seen.append(plan.cell.head_k)
        return real(ctx, plan, *a, **kw)

    monkeypatch.setattr(cells, "_finish", spy)
    cfg = head_sweep.HeadSweepConfig(target=tiny_llama_dir, draft="bf16", head_ks=("50", "full"),
                                     variants=("clustered",), domains=("code",), prompts_per_domain=1,
                                     max_new_tokens=6, n_clusters=8, context_tokens=8, head_repeats=2,
                                     step_repeats=2, profile=False, cache_dir=str(tmp_path / "cache"),
                                     device="cpu", repeats=5)  # 2 pairs: Fieller's CI is often unbounded
    hs = head_sweep.run_head_sweep(cfg, tmp_path / "hs")
    assert sorted(k for k in seen if k is not None) == [50, 300]
    main = run_sweep(_cfg(gammas=("fixed:2",), domains=("code",)), tmp_path / "main", engine=ToyEngine(),
                     show_bar=False)
    assert None in seen  # the main sweep's cell went through the same function
    hc, mc = hs.table("cells"), main.table("cells")
    assert list(hc.columns) == list(mc.columns)
    for col in ("speedup", "repeats", "unstable", "attempts"):
        assert hc[col].notna().all() and mc[col].notna().all(), col
    hg = hs.table("generations")
    # each cell's CI is the one measure.stats gives on its generations on disk (Fieller's interval may be
    # unbounded, i.e. empty, when a tiny model's millisecond timings are that noisy: the same on both sides)
    for row in hc.itertuples():
        g = hg[hg["cell_id"] == row.cell_id].pivot_table(index=["prompt_id", "repeat"], columns="mode",
                                                         values="tokens_per_s")
        ci = stats.speedup_ci(g["baseline"].tolist(), g["speculative"].tolist())
        assert ci.value == pytest.approx(row.speedup)
        for want, got in ((ci.lo, row.speedup_lo), (ci.hi, row.speedup_hi)):
            assert (want is None and pd.isna(got)) or want == pytest.approx(got)
    assert set(hg["mode"]) == {"baseline", "speculative"} and hg["tokens"].notna().all()
    assert len(hs.table("head_sweep")) == 2
    assert hs.meta["config"]["clusters"]["max_cluster_size"] >= 1  # the clustered variant built them


@pytest.mark.parametrize("mode", ["sweep", "cell"])
@pytest.mark.slow
def test_cost_curves_are_timed_between_the_visits_of_an_interleaved_sweep(tmp_path, monkeypatch, mode):
    log: list[str] = []
    real_visit, real_measure = cells._visit, CostCurves.measure

    def visit(*a, **k):
        log.append("visit")
        return real_visit(*a, **k)

    def measure(self, count=None):
        t_rows, d_rows = real_measure(self, count)
        log.append(f"cost {len(t_rows) + len(d_rows)}")
        return t_rows, d_rows

    monkeypatch.setattr(cells, "_visit", visit)
    monkeypatch.setattr(CostCurves, "measure", measure)
    run = run_sweep(_cfg(interleave=mode), tmp_path / "r", engine=ToyEngine(), show_bar=False)
    points = 2 * 2 * 2 + 2 * 2  # target: contexts x n x repeats; draft: contexts x repeats
    assert len(run.table("cost_target")) == 8 and len(run.table("cost_draft")) == 4
    visits = 4 * 2 * 2  # cells x prompts x repeats
    if mode == "cell":  # one block before the first visit
        assert log[0] == f"cost {points}" and log[1:] == ["visit"] * visits
    else:  # 12 points over 16 visits: one after each of the first 12
        assert log[0] == "visit" and log.count("visit") == visits
        assert [e for e in log if e != "visit"] == ["cost 1"] * points
        assert log[:4] == ["visit", "cost 1", "visit", "cost 1"]


def test_a_resume_times_only_the_cost_points_not_on_disk(tmp_path):
    run_sweep(_cfg(gammas=("fixed:2",), domains=("code",)), tmp_path / "r", engine=ToyEngine(), show_bar=False)
    f = tmp_path / "r" / "cost_target.csv"
    lines = f.read_text().splitlines()
    f.write_text("\n".join(lines[:4]) + "\n")  # an interrupted run: 3 of the 8 target points on disk
    kept = records.load_run(tmp_path / "r").table("cost_target")
    run = run_sweep(_cfg(gammas=("fixed:2",), domains=("code",)), tmp_path / "r", engine=ToyEngine(),
                    show_bar=False)
    ct = run.table("cost_target")
    keys = ["n_tokens", "context_tokens", "repeat"]
    assert len(ct) == 8 and not ct.duplicated(keys).any()
    assert ct.head(3)["ms"].tolist() == kept["ms"].tolist()  # the points on disk were not timed again
    assert len(run.table("cost_draft")) == 4 and not run.table("cost_draft").duplicated().any()


def test_the_token_counts_the_cells_verify_get_more_cost_repeats(tmp_path):
    run = run_sweep(_cfg(gammas=("fixed:2",), domains=("code",), cost_max_tokens=4, cost_repeats_verified=3),
                    tmp_path / "r", engine=ToyEngine(), show_bar=False)
    ct = run.table("cost_target")
    ct = ct[ct["repeat"] < 3]  # a point out of line with its neighbours (a busy machine) is re-timed after these
    per_n = ct.groupby("n_tokens")["repeat"].nunique().to_dict()
    assert per_n == {1: 3, 2: 3, 3: 3, 4: 2}  # γ = 2 verifies up to 3 tokens; n = 4 keeps cost_repeats
    assert len(ct) == 2 * (3 * 3 + 2) and len(run.table("cost_draft")) == 2 * 2


def test_source_state_says_when_the_checkout_is_dirty(tmp_path, monkeypatch):
    """run.json's git_commit and git_dirty: a clean checkout, then a tracked file changed, then no git at all."""
    repo = tmp_path / "repo"
    (repo / "measure").mkdir(parents=True)
    fake = repo / "measure" / "sweep.py"
    fake.write_text("x = 1\n")
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    monkeypatch.setattr(identity, "__file__", str(fake))
    clean = identity.source_state()
    assert len(clean["git_commit"]) == 40 and clean["git_dirty"] is False
    fake.write_text("x = 2\n")
    assert identity.source_state() == {"git_commit": clean["git_commit"], "git_dirty": True}
    (repo / "new.txt").write_text("untracked files do not count\n")
    fake.write_text("x = 1\n")
    assert identity.source_state()["git_dirty"] is False
    bare = tmp_path / "nogit" / "measure"
    bare.mkdir(parents=True)
    monkeypatch.setattr(identity, "__file__", str(bare / "sweep.py"))
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    assert identity.source_state() == {"git_commit": None, "git_dirty": None}




@pytest.mark.slow
def test_until_decided_stops_measuring_a_clear_loser_and_records_the_race(tmp_path, monkeypatch):
    import math

    from measure.ids import CellId

    speed = {"fixed:2": 1.30, "fixed:3": 1.0, "fixed:4": 0.6}  # known speedups, a 1% wobble per visit
    monkeypatch.setattr(cells, "_log_speedup", lambda v: math.log(speed[CellId.parse(v.cell_id).gamma.to_str()])
                        + 0.01 * ((v.repeat + v.prompt_index) % 2 - 0.5))
    cfg = _cfg(gammas=("fixed:2", "fixed:3", "fixed:4"), domains=("code",), prompts_per_domain=3, repeats=6,
               until_decided=True, regret=0.05, confidence=0.9, cost_curves=False)
    run = run_sweep(cfg, tmp_path / "r", engine=ToyEngine(), show_bar=False)
    assert run.status == "complete"
    race = run.meta["race"]
    best = next(c for c in run.table("cells")["cell_id"] if "fixed:2" in c)
    assert race["stopped_by"] == "decided" and race["decided"] == {"code T=0": best}
    repeats = run.table("cells").set_index("cell_id")["repeats"]
    assert repeats.max() < 6, "the race decided before the fixed design's six passes"
    gens = run.table("generations")
    per_cell = gens[gens["mode"] == "baseline"].groupby("cell_id").size()
    assert (per_cell == repeats * 3).all(), "each cell is written with the visits it has"
    loser = next(e for look in race["looks"] for g in look["groups"].values() for e in g["eliminated"]
                 if "fixed:4" in e["cell_id"])
    assert loser["ratio_hi"] < 1

@pytest.mark.slow
def test_the_time_budget_stops_a_race_between_two_visits_and_looks_at_what_was_measured(tmp_path, monkeypatch):
    import math

    from measure.ids import CellId

    checks = iter(range(10_000))  # the check before pass 2 and its first two visits pass, the third does not
    monkeypatch.setattr(cells, "_over_budget", lambda budget_s, started: next(checks) >= 3)
    # known, undecidable speedups (the two γ swap a ±5% wobble), not the toy engine's timings: a loaded machine
    # must not let the race decide after pass 1
    monkeypatch.setattr(cells, "_log_speedup", lambda v: 0.05 * ((v.repeat + v.prompt_index + (
        CellId.parse(v.cell_id).gamma.to_str() == "fixed:3")) % 2 - 0.5) + math.log(1.2))
    cfg = _cfg(gammas=("fixed:2", "fixed:3"), domains=("code",), prompts_per_domain=3, repeats=4,
               until_decided=True, regret=0.001, time_budget_s=60.0, cost_curves=False)
    run = run_sweep(cfg, tmp_path / "r", engine=ToyEngine(), show_bar=False)
    race = run.meta["race"]
    assert race["stopped_by"] == "time budget"
    gens = run.table("generations")
    assert len(gens[gens["mode"] == "baseline"]) == 6 + 2, "the whole first pass, then two visits of the second"
    assert [look["look"] for look in race["looks"]] == [0, 1], "a look after pass 1, one over pass 2's visits"


@pytest.mark.slow
def test_a_prior_defers_the_predicted_losers_checks_them_and_says_what_it_saved(tmp_path, monkeypatch,
                                                                                calibration_dir):
    import math

    from measure.ids import CellId

    speed = {"fixed:2": 1.30, "fixed:3": 1.25, "fixed:4": 0.6}  # known speedups, a 1% wobble per visit
    monkeypatch.setattr(cells, "_log_speedup", lambda v: math.log(speed[CellId.parse(v.cell_id).gamma.to_str()])
                        + 0.01 * ((v.repeat + v.prompt_index) % 2 - 0.5))
    cal = calibration_dir({("ngram:2", "code", g): speed[f"fixed:{g}"] for g in (2, 3, 4)}, error_pct=5.0)
    cfg = _cfg(gammas=("fixed:2", "fixed:3", "fixed:4"), domains=("code",), prompts_per_domain=3, repeats=6,
               until_decided=True, regret=0.05, confidence=0.9, cost_curves=False, prior=str(cal))
    said: list[str] = []
    run = run_sweep(cfg, tmp_path / "r", engine=ToyEngine(), show_bar=False, progress=said.append)
    race = run.meta["race"]
    cid = {g: next(c for c in run.table("cells")["cell_id"] if g in c) for g in speed}
    assert race["stopped_by"] == "decided" and race["decided"] == {"code T=0": cid["fixed:2"]}
    group = race["prior"]["groups"]["code T=0"]
    assert group["deferred"] == [cid["fixed:4"]] and group["predicted_leader"] == cid["fixed:2"]
    assert [(c["cell_id"], c["verdict"]) for c in group["checks"]] == [(cid["fixed:4"], "eliminated")]
    gens = run.table("generations")
    first_pass = gens[(gens["repeat"] == 0) & (gens["mode"] == "baseline")]
    assert cid["fixed:4"] not in set(first_pass["cell_id"]), "a deferred cell is not measured in the first pass"
    assert race["prior"]["saved_units"] == group["saved"]["units"]
    assert race["prior"]["method"] == "trace" and race["prior"]["uncertainty"] == pytest.approx(0.05)
    assert any(line.startswith("prior ") and "saved" in line for line in said)


def test_until_decided_refuses_what_it_cannot_race():
    with pytest.raises(ValueError, match="--interleave sweep"):
        _cfg(until_decided=True, interleave="cell")
    with pytest.raises(ValueError, match="--until-stable"):
        _cfg(until_decided=True, until_stable=1)
    with pytest.raises(ValueError, match="regret"):
        _cfg(until_decided=True, regret=0.0)
    with pytest.raises(ValueError, match="--prior needs --until-decided"):
        _cfg(prior="/some/calibration")
