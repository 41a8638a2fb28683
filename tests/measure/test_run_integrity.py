"""Records that cannot be corrupted (issue #32): one writer per run, checked staged visits, a resume that verifies
before it trusts (and never deletes intact data), calibrate's integrity check, disk errors as one line.

Each damaged run is made from a real small run of the sweep (the toy engine: real loops, real tables), damaged
the way the issue's hostile user did, then resumed and calibrated.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from calibrate.dataset import load_runs
from measure import records
from measure.sweep import SweepConfig, run_sweep

from tests.support.fake_engine import InterruptedToy, ToyEngine

ROOT = Path(__file__).resolve().parents[2]
MODES = 4  # baseline, speculative, the toy's peer and its library baseline


def _cfg(**kw) -> SweepConfig:
    base = dict(target="toy", drafts=("ngram:2",), gammas=("fixed:2", "fixed:3"), domains=("code",),
                prompts_per_domain=2, max_new_tokens=8, repeats=2, warmup=1, cost_curves=False, device="cpu")
    base.update(kw)
    return SweepConfig(**base)


@pytest.fixture(scope="module")
def complete_run(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("runs") / "complete"
    run = run_sweep(_cfg(), path, engine=ToyEngine(), show_bar=False)
    assert run.status == "complete" and len(run.table("cells")) == 2
    return path


@pytest.fixture(scope="module")
def interrupted_run(tmp_path_factory) -> Path:
    """Two cells interleaved, stopped in the 4th of their 8 visits: 3 visits staged, no cell finished."""
    path = tmp_path_factory.mktemp("runs") / "interrupted"
    with pytest.raises(KeyboardInterrupt):
        run_sweep(_cfg(), path, engine=InterruptedToy(stop_at=2 + 4), show_bar=False)  # 2 warm-ups, then visits
    assert len((path / records.STAGED_VISITS).read_text().splitlines()) == 3
    return path


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(src, dst)
    (dst / records.LOCK_FILE).unlink(missing_ok=True)
    return dst


def _generations_per_cell(path: Path) -> dict[str, int]:
    g = pd.read_csv(path / "generations.csv")
    return g.groupby("cell_id").size().to_dict()


def _resume(path: Path, notes: list[str]) -> records.Run:
    return run_sweep(_cfg(), path, engine=ToyEngine(), show_bar=False, progress=notes.append)


def _aside_tables(path: Path) -> list[Path]:
    return sorted(path.glob(f"{records.DAMAGED_PREFIX}*/generations.csv"))


# -- resume verifies before it trusts ---------------------------------------------------------------------
def _nul_cells(p: Path) -> None:
    f = p / "cells.csv"
    f.write_bytes(b"\0" * f.stat().st_size)


def _nul_block_in_generations(p: Path) -> None:
    f = p / "generations.csv"
    data = bytearray(f.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 4096] = b"\0" * min(4096, len(data) - mid)
    f.write_bytes(bytes(data))


def _torn_last_round(p: Path) -> None:
    f = p / "rounds.csv"
    f.write_bytes(f.read_bytes()[:-7])


def _deleted_generations(p: Path) -> None:
    (p / "generations.csv").unlink()


def _middle_round_missing(p: Path) -> None:
    f = p / "rounds.csv"
    lines = f.read_text().splitlines(keepends=True)
    del lines[len(lines) // 2]
    f.write_text("".join(lines))


def _cell_written_twice(p: Path) -> None:
    f = p / "cells.csv"
    lines = f.read_text().splitlines(keepends=True)
    f.write_text("".join(lines + [lines[1]]))


DAMAGE = {
    "NUL-filled cells.csv": _nul_cells,
    "a 4 KB NUL block in generations.csv": _nul_block_in_generations,
    "a torn last rounds.csv row": _torn_last_round,
    "a deleted generations.csv": _deleted_generations,
    "a missing middle rounds.csv row": _middle_round_missing,
    "a cells.csv row written twice": _cell_written_twice,
}


@pytest.mark.parametrize("case", list(DAMAGE))
@pytest.mark.slow
def test_damaged_finished_cells_are_refused_by_calibrate_and_remeasured_on_resume(case, complete_run, tmp_path):
    path = _copy(complete_run, tmp_path)
    DAMAGE[case](path)
    as_found = {t: (path / f"{t}.csv").read_bytes() for t in records.TABLE_COLUMNS if (path / f"{t}.csv").exists()}
    assert records.damaged_cells(path), case
    with pytest.raises(ValueError) as e:  # calibrate never takes a damaged run silently
        load_runs([path])
    assert "\n" not in str(e.value) and str(path) in str(e.value)
    notes: list[str] = []
    run = _resume(path, notes)
    assert run.status == "complete" and len(run.table("cells")) == 2
    assert set(run.table("cells")["cell_id"]) == {f"draft=ngram:2|gamma=fixed:{g}|temp=0|domain=code" for g in (2, 3)}
    assert set(_generations_per_cell(path).values()) == {2 * 2 * MODES}  # every visit of every mode, once
    assert not records.damaged_cells(path)
    assert any("damaged or missing rows" in n for n in notes), notes
    aside = next(path.glob(f"{records.DAMAGED_PREFIX}*"))
    for t, data in as_found.items():  # nothing on disk was deleted: every table is kept as the resume found it
        assert (aside / f"{t}.csv").read_bytes() == data, (case, t)
    assert json.loads((aside / "damage.json").read_text())


def test_calibrate_can_leave_damaged_cells_out_and_names_them(complete_run, tmp_path):
    path = _copy(complete_run, tmp_path)
    _middle_round_missing(path)
    data = load_runs([path], exclude_damaged=True)
    assert len(data.cells) == 1 and any("left out 1 damaged cell" in n for n in data.notes)


def test_a_deleted_run_json_with_measured_data_is_refused_not_started_over(interrupted_run, tmp_path):
    path = _copy(interrupted_run, tmp_path)
    (path / records.RUN_JSON).unlink()
    staged = (path / records.STAGED_VISITS).read_bytes()
    with pytest.raises(ValueError, match=r"holds measured data .* but no run\.json"):
        _resume(path, [])
    assert (path / records.STAGED_VISITS).read_bytes() == staged  # the staged visits are untouched


# -- staged visits are checked records ----------------------------------------------------------------------
def _bad_staged(path: Path, kind: str) -> None:
    f = path / records.STAGED_VISITS
    lines = f.read_text().splitlines()
    rec = json.loads(lines[0])
    if kind == "torn tail":
        f.write_bytes(f.read_bytes()[:-40])
        return
    if kind == "no attempt":
        rec.pop("attempt")
    elif kind == "generations as a string":
        rec["generations"] = "oops"
    elif kind == "repeat 7 of 2":
        rec["repeat"] = 7
    elif kind == "prompt_index 5 of 2":
        rec["prompt_index"] = 5
    elif kind == "not JSON":
        f.write_text("\n".join(lines + ["{not json"]) + "\n")
        return
    f.write_text("\n".join(lines + [json.dumps(rec)]) + "\n")


@pytest.mark.parametrize("kind", ["torn tail", "no attempt", "generations as a string", "repeat 7 of 2",
                                  "prompt_index 5 of 2", "not JSON"])
@pytest.mark.slow
def test_bad_staged_visits_are_repaired_or_quarantined_never_pooled(kind, interrupted_run, tmp_path):
    path = _copy(interrupted_run, tmp_path)
    _bad_staged(path, kind)
    notes: list[str] = []
    run = _resume(path, notes)
    assert run.status == "complete"
    assert set(_generations_per_cell(path).values()) == {2 * 2 * MODES}  # no visit pooled twice or out of range
    g = run.table("generations")
    assert set(g["repeat"]) == {0, 1} and len(g.drop_duplicates(["cell_id", "prompt_id", "repeat", "mode"])) == len(g)
    if kind == "torn tail":
        assert any("cut a torn last line" in n for n in notes), notes
    else:
        q = [json.loads(ln) for ln in (path / records.QUARANTINE).read_text().splitlines()]
        assert len(q) == 1 and q[0]["reason"] and any("failed validation" in n for n in notes), notes


# -- one writer per run --------------------------------------------------------------------------------------
def test_a_second_writer_on_a_run_is_refused_naming_the_first(tmp_path):
    holder = textwrap.dedent(f"""
        import sys, time
        from measure import records
        w = records.RunWriter({str(tmp_path / 'r')!r})
        print("locked", flush=True)
        time.sleep(60)
    """)
    p = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    try:
        assert p.stdout.readline().strip() == "locked"
        with pytest.raises(records.RunLocked, match=rf"another specscope process \(pid {p.pid}\) is writing"):
            records.RunWriter(tmp_path / "r")
        with pytest.raises(records.RunLocked):  # --force-new does not move a live run away
            run_sweep(_cfg(), tmp_path / "r", engine=ToyEngine(), show_bar=False, force_new=True)
        assert (tmp_path / "r" / records.RUN_JSON).exists() and not list(tmp_path.glob("r.replaced-*"))
    finally:
        p.kill()
        p.wait()
    w = records.RunWriter(tmp_path / "r")  # the holder is gone: its lock went with it
    w.close("complete")


@pytest.mark.slow
def test_two_simultaneous_sweeps_into_one_out_never_both_write(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        from tests.support.fake_engine import ToyEngine
        from measure.sweep import SweepConfig, run_sweep
        cfg = SweepConfig(target="toy", drafts=("ngram:2",), gammas=("fixed:2",), domains=("code",),
                          prompts_per_domain=2, max_new_tokens=8, repeats=2, cost_curves=False, device="cpu")
        try:
            run_sweep(cfg, {str(tmp_path / 'r')!r}, engine=ToyEngine(), show_bar=False)
        except ValueError as e:
            print("refused:", e)
            sys.exit(3)
    """)
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=ROOT, env=env) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    codes = sorted(p.returncode for p in procs)
    g = pd.read_csv(tmp_path / "r" / "generations.csv")
    cells = pd.read_csv(tmp_path / "r" / "cells.csv")
    assert len(cells) == 1 and len(g) == 2 * 2 * MODES, outs  # one writer's run, never a mix
    if codes == [0, 3]:  # they overlapped: the second was refused in one line naming the first
        assert any("is writing this run" in o for o, _ in outs), outs
    else:  # one finished before the other started: the second found a complete run and measured nothing
        assert codes == [0, 0], outs


# -- disk errors are one line, and the run stays resumable -------------------------------------------------
@pytest.mark.slow
def test_a_disk_error_mid_run_interrupts_the_run_in_one_line(tmp_path, monkeypatch):
    real = records._append_bytes
    calls = {"n": 0}

    def full_disk(path, data):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(28, "No space left on device", str(path))
        return real(path, data)

    monkeypatch.setattr(records, "_append_bytes", full_disk)
    with pytest.raises(records.RunInterrupted) as e:
        run_sweep(_cfg(), tmp_path / "r", engine=ToyEngine(), show_bar=False)
    msg = str(e.value)
    assert "No space left on device" in msg and str(tmp_path / "r") in msg and "\n" not in msg
    meta = json.loads((tmp_path / "r" / records.RUN_JSON).read_text())
    assert meta["status"] == "interrupted" and "No space left" in meta["interruption"]
    monkeypatch.setattr(records, "_append_bytes", real)
    run = _resume(tmp_path / "r", [])
    assert run.status == "complete" and set(_generations_per_cell(tmp_path / "r").values()) == {2 * 2 * MODES}


# -- a resume keeps every staged visit, whatever --warmup was (issue #43) --------------------------------------
def _kill_at(monkeypatch: pytest.MonkeyPatch, stage: str) -> None:
    """Raise ``KeyboardInterrupt`` (what a kill leaves, short of the heartbeat) at ``stage`` of the first run."""
    from measure.sweep import cells

    calls = {"n": 0}

    def nth(n: int, fn, before: bool = True):
        def wrapped(*a, **kw):
            calls["n"] += 1
            if before and calls["n"] == n:
                raise KeyboardInterrupt
            out = fn(*a, **kw)
            if not before and calls["n"] == n:
                raise KeyboardInterrupt
            return out
        return wrapped

    if stage == "warming up":
        monkeypatch.setattr(cells, "_warm", nth(2, cells._warm))
    elif stage == "mid-visit":
        monkeypatch.setattr(cells, "_visit", nth(4, cells._visit))
    elif stage == "between visits":
        monkeypatch.setattr(records.RunWriter, "stage", nth(5, records.RunWriter.stage, before=False))
    else:  # writing the cells: the first cell's tables appended, its cells.csv row not
        monkeypatch.setattr(records.RunWriter, "finish_cell", nth(1, records.RunWriter.finish_cell))


@pytest.mark.parametrize("warmup", [0, 1])
@pytest.mark.parametrize("stage", ["warming up", "mid-visit", "between visits", "writing cells"])
@pytest.mark.slow
def test_a_resume_measures_nothing_again_whatever_the_warmup(stage, warmup, tmp_path, monkeypatch):
    from measure.sweep import cells
    from tests.support.fake_engine import NoLibraryToy

    cfg = _cfg(warmup=warmup, traces=False)  # NoLibraryToy: three modes a visit, as the transformers engine
    measured: list[list[tuple]] = [[], []]
    visit = cells._visit

    def counted(ctx, plan, modes, rep, pi, attempt):
        v = visit(ctx, plan, modes, rep, pi, attempt)
        measured[-1].append((v.cell_id, v.repeat, v.prompt_index))
        return v

    monkeypatch.setattr(cells, "_visit", counted)
    path = tmp_path / "run"
    with monkeypatch.context() as m:
        _kill_at(m, stage)
        with pytest.raises(KeyboardInterrupt):
            run_sweep(cfg, path, engine=NoLibraryToy(), show_bar=False)
    first = measured.pop()
    measured.append([])
    notes: list[str] = []
    run = run_sweep(cfg, path, engine=NoLibraryToy(), show_bar=False, progress=notes.append)
    again = measured[-1]
    assert run.status == "complete" and len(run.table("cells")) == 2
    assert not set(first) & set(again), f"measured again: {sorted(set(first) & set(again))}"
    assert len(set(first) | set(again)) == 2 * 2 * 2  # cells x prompts x repeats
    assert not (path / records.QUARANTINE).exists(), notes
    assert set(run.table("generations")["mode"]) == {"baseline", "speculative", "peer"}


def test_a_peer_that_fails_mid_run_is_dropped_and_its_visits_kept(tmp_path):
    from tests.support.fake_engine import NoLibraryToy

    class FailingPeer(NoLibraryToy):
        calls = 0

        def peer_generate(self, *a, **kw):
            FailingPeer.calls += 1
            if FailingPeer.calls == 3:
                raise RuntimeError("peer broke on this prompt")
            return super().peer_generate(*a, **kw)

    run = run_sweep(_cfg(warmup=0, traces=False), tmp_path / "run", engine=FailingPeer(), show_bar=False)
    assert run.status == "complete" and len(run.table("cells")) == 2
    assert "peer broke" in run.meta["peer_errors"]["ngram:2"]
    g = run.table("generations")
    assert set(g["mode"]) == {"baseline", "speculative"} and len(g) == 2 * 8  # every visit kept, peer dropped
    assert run.table("cells")["tokens_per_s_peer"].isna().all()


# -- a run that failed before measuring anything does not block the corrected command (issue #43) ----------------
def test_a_run_that_failed_before_measuring_does_not_block_the_corrected_command(tmp_path):
    class BadDraft(ToyEngine):
        def make_draft(self, spec, target, *, seed):
            raise ValueError(f"--draft {spec}: layer 99 is beyond the target's 4 layers")

    path = tmp_path / "run"
    with pytest.raises(ValueError, match="layer 99"):
        run_sweep(_cfg(gammas=("fixed:2",), drafts=("ngram:3",)), path, engine=BadDraft(), show_bar=False)
    assert records.load_run(path).status == "failed"
    notes: list[str] = []
    run = run_sweep(_cfg(gammas=("fixed:2",), traces=False), path, engine=ToyEngine(), show_bar=False,
                    progress=notes.append)  # the corrected command: another draft, no --force-new
    assert run.status == "complete" and len(run.table("cells")) == 1
    kept = list(path.glob("run.failed-*.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text())["status"] == "failed"
    assert any("failed before it measured anything" in n and "layer 99" in n for n in notes), notes


def test_a_failed_run_with_measured_data_is_not_set_aside(interrupted_run, tmp_path):
    path = _copy(interrupted_run, tmp_path)
    meta = json.loads((path / records.RUN_JSON).read_text())
    (path / records.RUN_JSON).write_text(json.dumps({**meta, "status": "failed"}))
    notes: list[str] = []
    _resume(path, notes)
    assert not list(path.glob("run.failed-*.json")) and not any("failed before" in n for n in notes)


def test_a_race_cut_by_its_time_budget_is_whole_not_damaged():
    # results/cpu-bench-tune/tuned: its budget stopped code γ = 1 inside its third pass (5 of 6 visits); a
    # calibration read it as damaged until damaged_cells knew a race may cut a cell's last pass
    run = ROOT / "results" / "cpu-bench-tune" / "tuned"
    config = json.loads((run / "run.json").read_text())["config"]
    assert config["until_decided"] and not records.damaged_cells(run, config)
    damaged = records.damaged_cells(run, {**config, "until_decided": False})
    assert [d.reason for d in damaged] == ["15 of its 18 generations"], "the same cells, unraced, are incomplete"
