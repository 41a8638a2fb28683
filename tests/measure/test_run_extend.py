"""Adding cells to a finished run is explicit and recorded (issue #28): ``--extend``, ``run.json`` ``extensions``.

Before: re-using a finished run's ``--out`` with another γ merged the new cells in silently, rewrote the
recorded config and command, and an interruption of that merge marked the whole, complete run interrupted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibrate.dataset import load_runs
from measure import records, runplan
from measure.sweep import SweepConfig, run_sweep

from tests.support.fake_engine import InterruptedToy, ToyEngine


def _cfg(**kw) -> SweepConfig:
    base = dict(target="toy", drafts=("ngram:2",), gammas=("fixed:2",), domains=("code",), prompts_per_domain=2,
                max_new_tokens=8, repeats=2, warmup=1, cost_curves=False, device="cpu")
    base.update(kw)
    return SweepConfig(**base)


@pytest.fixture()
def finished(tmp_path) -> Path:
    path = tmp_path / "r"
    run_sweep(_cfg(), path, command="measure --gamma 2", engine=ToyEngine(), show_bar=False)
    return path


def test_another_gamma_without_extend_is_refused_in_one_line_and_writes_nothing(finished):
    before = (finished / "run.json").read_text()
    eng = ToyEngine()
    with pytest.raises(records.FingerprintMismatch) as e:
        run_sweep(_cfg(gammas=("fixed:2", "fixed:3")), finished, engine=eng, show_bar=False)
    msg = str(e.value)
    assert "refusing to add cells to a run without --extend (adds γ fixed:3)" in msg and "\n" not in msg
    assert eng.loads == [] and (finished / "run.json").read_text() == before


@pytest.mark.slow
def test_extend_adds_the_cells_and_keeps_the_run_its_config_and_command(finished):
    first = records.load_run(finished)
    gens = first.table("generations")
    notes: list[str] = []
    run = run_sweep(_cfg(gammas=("fixed:2", "fixed:3")), finished, command="measure --gamma 2,3 --extend",
                    engine=ToyEngine(), show_bar=False, extend=True, progress=notes.append)
    assert "--extend: adding γ fixed:3 to the run (its 1 finished cells are kept, its config and command too); " \
           "recorded in run.json extensions" in notes
    assert run.status == "complete" and sorted(run.table("cells")["gamma"]) == [2, 3]
    assert run.meta["config"] == first.meta["config"] and run.meta["command"] == "measure --gamma 2"
    assert run.meta["created_utc"] == first.meta["created_utc"] and "resumed_utc" not in run.meta
    (ext,) = run.meta["extensions"]
    assert ext["command"] == "measure --gamma 2,3 --extend" and ext["added"] == {"gammas": ["fixed:3"]}
    assert ext["status"] == "complete" and ext["started_utc"] <= ext["finished_utc"]
    assert ext["config"]["gammas"] == ["fixed:2", "fixed:3"] and ext["pid"] and ext["heartbeat_utc"]
    old = run.table("generations")
    assert old[old["cell_id"].isin(gens["cell_id"])]["wall_s"].tolist() == gens["wall_s"].tolist()
    assert runplan.recorded_plan(run.meta).gammas == ("fixed:2", "fixed:3")
    # the extended command again: a plain resume, nothing to do; the original one: refused (it leaves γ 3 out)
    again = run_sweep(_cfg(gammas=("fixed:2", "fixed:3")), finished, engine=ToyEngine(), show_bar=False)
    assert again.status == "complete" and len(again.meta["extensions"]) == 1
    with pytest.raises(records.FingerprintMismatch, match=r"leaves out γ fixed:3.*re-run the command of its last "
                                                          r"extension \(measure --gamma 2,3 --extend\)"):
        run_sweep(_cfg(), finished, engine=ToyEngine(), show_bar=False)


@pytest.mark.slow
def test_an_interrupted_extension_leaves_the_run_complete_and_resumes(finished, tmp_path):
    # 1 warm-up of the new cell, then its visits: stopped in its 2nd
    with pytest.raises(KeyboardInterrupt):
        run_sweep(_cfg(gammas=("fixed:2", "fixed:3")), finished, command="measure --gamma 2,3 --extend",
                  engine=InterruptedToy(stop_at=3), show_bar=False, extend=True)
    run = records.load_run(finished)
    assert run.meta["status"] == "complete" and run.status == "complete"  # its cell was complete and still is
    assert run.meta["extensions"][-1]["status"] == "interrupted"
    st, note = run.extension_status
    assert st == "interrupted" and "its extension 1 (adding gammas fixed:3) is interrupted" in note
    assert "re-run 'measure --gamma 2,3 --extend'" in note
    assert list(run.table("cells")["gamma"]) == [2]
    data = load_runs([finished])  # calibrate uses the complete cells and says the extension is unfinished
    assert len(data.cells) == 1 and any("its extension 1" in n for n in data.notes)
    # a second extension waits for the first to finish
    with pytest.raises(records.FingerprintMismatch, match="its last extension at .* is interrupted"):
        run_sweep(_cfg(gammas=("fixed:2", "fixed:3", "fixed:4")), finished, engine=ToyEngine(), show_bar=False,
                  extend=True)
    notes: list[str] = []
    done = run_sweep(_cfg(gammas=("fixed:2", "fixed:3")), finished, engine=ToyEngine(), show_bar=False,
                     progress=notes.append)
    assert "resuming the run's unfinished extension (1 cells finished so far)" in notes
    ext = done.meta["extensions"][-1]
    assert ext["status"] == "complete" and len(ext["resumed_utc"]) == 1 and "resumed_utc" not in done.meta
    assert done.status == "complete" and done.extension_status == ("complete", "")
    assert sorted(done.table("cells")["gamma"]) == [2, 3]


@pytest.mark.slow
def test_extend_adds_a_domain_and_keeps_the_runs_prompts(finished):
    run = run_sweep(_cfg(domains=("code", "docs")), finished, engine=ToyEngine(), show_bar=False, extend=True)
    assert sorted(run.table("cells")["domain"]) == ["code", "docs"]
    assert run.meta["extensions"][0]["added"] == {"domains": ["docs"]}
    ids = run.meta["fingerprint"]["prompts"]["prompt_ids"]
    assert [i.partition("/")[0] for i in ids] == ["code", "code", "docs", "docs"]  # a resume compares all of them
    again = run_sweep(_cfg(domains=("code", "docs")), finished, engine=ToyEngine(), show_bar=False)
    assert again.status == "complete"


@pytest.mark.slow
def test_what_extend_cannot_do_is_refused_in_one_line(finished, tmp_path):
    cases = {
        "other temperatures": (_cfg(gammas=("fixed:2", "fixed:3"), temperatures=(0.0, 0.8)),
                               "(temperatures 0 -> 0,0.8): a resume asks for the same cells (re-run its own command "
                               "(measure --gamma 2)); --extend adds γ policies, drafts and domains only; use "
                               "--force-new"),
        "other prompts": (_cfg(gammas=("fixed:2", "fixed:3"), prompts_per_domain=1), "prompts.prompt_ids"),
        "a recorded γ left out": (_cfg(gammas=("fixed:3",)), "(γ fixed:2 -> fixed:3 (leaves out γ fixed:2))"),
    }
    for what, (cfg, expected) in cases.items():
        with pytest.raises(records.FingerprintMismatch) as e:
            run_sweep(cfg, finished, engine=ToyEngine(), show_bar=False, extend=True)
        assert expected in str(e.value) and "\n" not in str(e.value), what
    with pytest.raises(records.FingerprintMismatch, match="holds no run to extend; drop --extend"):
        run_sweep(_cfg(), tmp_path / "nothing", engine=ToyEngine(), show_bar=False, extend=True)
    cut = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        run_sweep(_cfg(), cut, engine=InterruptedToy(stop_at=3), show_bar=False)
    with pytest.raises(records.FingerprintMismatch, match="--extend: the run at .* is interrupted, not complete"):
        run_sweep(_cfg(gammas=("fixed:2", "fixed:3")), cut, engine=ToyEngine(), show_bar=False, extend=True)
    assert json.loads((cut / "run.json").read_text())["status"] == "interrupted"
