"""A tree run (``python -m measure tree``, measure.trees.run) killed with SIGKILL resumes: the finished visits and
cells are kept, only the missing visits are measured, and the cells equal an uninterrupted run's."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from measure import records
from measure.trees import run as tree_run
from tests.support.tiny_models import save_tiny, without_eos

ROOT = Path(__file__).resolve().parents[3]

#: Runs ``python -m measure tree`` with its arguments, SIGKILLing itself right after the N-th staged visit
#: (``stage``) or the N-th finished cell (``finish``): argv[1] the kill point, argv[2] N, the rest the arguments.
_KILL_SCRIPT = """
import os, signal, sys
from measure import records
from measure.__main__ import main
where, n = sys.argv[1], int(sys.argv[2])
name = {"stage": "stage", "finish": "finish_cell"}[where]
real = getattr(records.RunWriter, name)
calls = []
def killing(self, *a, **kw):
    real(self, *a, **kw)
    calls.append(1)
    if len(calls) == n:
        os.kill(os.getpid(), signal.SIGKILL)
setattr(records.RunWriter, name, killing)
sys.exit(main(["tree", *sys.argv[3:]]))
"""

#: 2 cells (a tree, a chain) x 2 prompts x 2 repeats = 8 visits
N_VISITS = 8


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> str:
    return without_eos(save_tiny(tmp_path_factory.mktemp("llama-t"), "llama"))


def _args(target: str, out: Path) -> list[str]:
    return ["--target", target, "--draft", "early:2", "--tree", "depth=2,topk=2", "--gamma", "2", "--prompts", "2",
            "--repeats", "2", "--max-new-tokens", "6", "--warmup", "0", "--no-cost-curves", "--out", str(out)]


def _staged(out: Path) -> list[tree_run.TreeVisit]:
    f = out / records.STAGED_VISITS
    lines = f.read_text().splitlines() if f.exists() else []
    return [tree_run.TreeVisit.from_record(json.loads(ln)) for ln in lines if ln.strip()]


def _deterministic(run: records.Run) -> dict:
    """What a run's tables hold apart from timings."""
    gens = run.table("generations").sort_values(["cell_id", "repeat", "prompt_id", "mode"])
    cells = run.table("tree_cells")
    return {"cells": cells[["cell_id", "shape", "new_tokens", "n_rounds", "mean_accepted_per_round",
                            "mean_nodes_per_round", "outputs_identical"]].to_dict("records"),
            "generations": gens[["cell_id", "prompt_id", "repeat", "mode", "order", "tokens", "lossless"]]
            .to_dict("records"),
            "nodes": run.table("tree_nodes").to_dict("records"), "ranks": run.table("tree_ranks").to_dict("records"),
            "rounds": len(run.table("rounds"))}


@pytest.fixture(scope="module")
def uninterrupted(target, tmp_path_factory) -> Path:
    """The same run measured without an interruption (copy it before writing into it)."""
    from measure.__main__ import main

    whole = tmp_path_factory.mktemp("whole") / "r"
    assert main(["tree", *_args(target, whole)]) == 0
    return whole


@pytest.mark.slow
@pytest.mark.parametrize("where, n", [("stage", 3), ("finish", 1)])
def test_a_tree_run_killed_resumes_measuring_only_the_missing_visits(target, uninterrupted, tmp_path, monkeypatch,
                                                                     where, n):
    """SIGKILLed after its 3rd staged visit, or after its first finished cell (every visit staged), the run keeps
    what it measured; re-running the command measures only the missing visits, and the run then holds the same
    cells, visits, tokens and trees as one measured without an interruption."""
    from measure.__main__ import main

    out = tmp_path / "killed"
    # the killed run's threads are this process's (an engine test before may have set torch's to 1 here), so the
    # resume below is the same setup and its fingerprint matches, whatever ran before in this worker
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS=str(torch.get_num_threads()))
    p = subprocess.run([sys.executable, "-c", _KILL_SCRIPT, where, str(n), *_args(target, out)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    assert records.load_run(out).status == "interrupted"  # the dead pid is noticed
    staged = _staged(out)
    kept = {(v.cell_id, v.repeat, v.prompt_index) for v in staged}
    assert len(kept) == len(staged) == (n if where == "stage" else N_VISITS)
    measured = []
    real_visit = tree_run.visit

    def counting(ctx, cell, prompt, rep, pi, order):
        measured.append((cell.cell_id, rep, pi))
        return real_visit(ctx, cell, prompt, rep, pi, order)

    monkeypatch.setattr(tree_run, "visit", counting)
    assert main(["tree", *_args(target, out)]) == 0
    assert len(measured) == N_VISITS - len(kept) and not set(measured) & set(kept)  # nothing measured twice
    resumed = records.load_run(out)
    assert resumed.status == "complete" and not (out / records.STAGED_VISITS).exists()
    gens = resumed.table("generations")
    final = {(r["cell_id"], r["repeat"], r["prompt_id"], r["mode"]): r["wall_s"] for r in gens.to_dict("records")}
    assert len(final) == len(gens) == 2 * N_VISITS  # every generation once
    before = {(r.cell_id, r.repeat, r.prompt_id, r.mode): r.wall_s for v in staged for r in v.generations}
    assert all(final[k] == pytest.approx(w) for k, w in before.items())  # the visits from before the kill, kept
    assert _deterministic(resumed) == _deterministic(records.load_run(uninterrupted))  # the same cells, visits, tokens and trees


def test_a_tree_run_refuses_to_resume_another_kind(target, tmp_path, capsys):
    from measure.__main__ import main

    out = tmp_path / "r"
    out.mkdir()
    (out / records.RUN_JSON).write_text(json.dumps({"schema_version": 2, "status": "complete",  # no kind: a chain
                                                     "config": {"target": "x"}, "summary": {}}))
    with pytest.raises(SystemExit) as e:
        main(["tree", *_args(target, out)])
    assert e.value.code == 2 and "holds a chain sweep (python -m measure), not a tree run" in capsys.readouterr().err


@pytest.mark.slow
def test_a_tree_run_refuses_another_setup_and_force_new_sets_it_aside(target, uninterrupted, tmp_path, capsys):
    from measure.__main__ import main

    out = tmp_path / "r"
    shutil.copytree(uninterrupted, out)
    other = [*_args(target, out), "--max-new-tokens", "5"]
    with pytest.raises(SystemExit) as e:
        main(["tree", *other])
    assert e.value.code == 2 and "max_new_tokens 6 -> 5" in capsys.readouterr().err
    assert records.load_run(out).status == "complete"  # nothing written
    assert main(["tree", *other, "--force-new"]) == 0
    assert [d.name.split(".replaced-")[0] for d in tmp_path.iterdir() if ".replaced-" in d.name] == ["r"]
    assert records.load_run(out).meta["config"]["max_new_tokens"] == 5


def test_a_tree_runs_config_records_what_it_always_recorded():
    """The settings a tree run shares with a sweep live in its SweepConfig, and run.json's config is as before: the
    committed tree run's config (written when TreeRunConfig declared them itself) comes back key for key."""
    committed = json.loads((ROOT / "results" / "cpu-trees-smollm2-int8" / records.RUN_JSON).read_text())["config"]
    flat = {k: v for k, v in committed.items() if k not in ("kind", "sweep", "engine_options")}
    own = {k: flat.pop(k) for k in ("target", "draft", "trees", "gammas", "quiet")}
    cfg = tree_run.TreeRunConfig.of(own["target"], own["draft"], tuple(own["trees"]), tuple(own["gammas"]),
                                    own["quiet"], **{k: tuple(v) if isinstance(v, list) else v for k, v in flat.items()})
    recorded = json.loads(json.dumps(cfg.as_dict()))
    assert list(recorded) == [k for k in committed if k not in ("kind", "sweep")] + ["engine"]
    assert recorded == {**{k: v for k, v in committed.items() if k not in ("kind", "sweep")}, "engine": "transformers"}


def test_a_tree_runs_sweep_is_its_shared_settings_and_the_sweep_defaults():
    from dataclasses import fields

    from measure.sweep.config import SweepConfig
    from measure.trees.loop import parse_tree_option

    cfg = tree_run.TreeRunConfig.of("smollm2-135m", "int8", ("depth=3,topk=2,budget=5",), (2,), domains=("code",),
                                    repeats=3, threads=2, max_new_tokens=32, cost_curves=False)
    sweep = tree_run.sweep_config(cfg, [parse_tree_option(t) for t in cfg.trees])
    assert all(getattr(sweep, k) == getattr(cfg.sweep, k) for k in tree_run.SHARED)
    assert sweep.drafts == ("int8",) and [g.to_str() for g in sweep.gammas] == ["fixed:5"]
    assert (sweep.temperatures, sweep.peer, sweep.library, sweep.traces) == ((0.0,), False, False, False)
    own = {*tree_run.SHARED, "drafts", "gammas", "temperatures", "peer", "library", "traces", "cost_max_tokens"}
    assert all(getattr(sweep, f.name) == f.default for f in fields(SweepConfig) if f.name not in own)
    with pytest.raises(TypeError, match="unknown setting"):
        tree_run.TreeRunConfig.of("smollm2-135m", "int8", (), gammas=(2,), peer=True)
    with pytest.raises(ValueError, match="a tree run measures one draft"):
        tree_run.TreeRunConfig(SweepConfig(drafts=("int8", "ngram:3")), ())
