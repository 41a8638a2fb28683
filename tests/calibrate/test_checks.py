"""What ``calibrate`` and ``calibrate trees`` read, checked before anything is fitted (issue 43): a committed run
copied and damaged — a row written twice, torn or lost, a value out of range, a missing file or column — ends in
one line naming the file and the fault, exit status 2, nothing written."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

import pytest

from tests.support import damage
from tests.support.cli_inprocess import run_module

ROOT = Path(__file__).resolve().parents[2]
TREE_RUN = ROOT / "results" / "cpu-trees-smollm2-llamacpp-ngram3"  # 4 cells, 200 KB: the checks take ms
CHAIN_RUN = ROOT / "results" / "cpu-smollm2-ngram-code-g7-11"


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("calibration*"))
    return dst


TREE_CASES: list[tuple[str, Callable[[Path], None], list[str]]] = [
    # a cell row written twice: held-out MAPE 4.4% -> 2.8% on this run (21.6% on another row), rc 0
    ("dup_cell", lambda d: damage.duplicate_row(d / "tree_cells.csv"),
     ["tree_cells.csv", "line 6 repeats the row of line 2", "written twice"]),
    ("dup_rank", lambda d: damage.duplicate_row(d / "tree_ranks.csv", 5), ["tree_ranks.csv", "repeats the row of line 6"]),
    # ranks beyond the ones the draft ranked (held-out 4.4% -> 4.2%), and beyond the candidates at that node
    ("rank_beyond", lambda d: damage.set_value(d / "tree_ranks.csv", "rank", "9"),
     ["tree_ranks.csv", "line 2, column rank: 9 is out of range", "<= 7"]),
    ("rank_beyond_candidates", lambda d: damage.set_value(d / "tree_ranks.csv", "rank", "5"),
     ["tree_ranks.csv", "line 2: rank 5 of 2 candidates"]),
    ("depth_negative", lambda d: damage.set_value(d / "tree_ranks.csv", "depth", "-1"),
     ["tree_ranks.csv", "column depth: -1 is out of range", ">= 1"]),
    ("depth_beyond_the_tree", lambda d: damage.set_value(d / "tree_ranks.csv", "depth", "7"),
     ["tree_ranks.csv", "depth 7 beyond its cell's tree (depth 2"]),
    ("node_depth_negative", lambda d: damage.set_value(d / "tree_nodes.csv", "depth", "-2"),
     ["tree_nodes.csv", "column depth: -2"]),
    ("cell_depth_negative", lambda d: damage.set_value(d / "tree_cells.csv", "depth", "-1"),
     ["tree_cells.csv", "column depth: -1"]),
    ("inf_speedup", lambda d: damage.set_value(d / "tree_cells.csv", "speedup", "inf"),
     ["tree_cells.csv", "line 2, column speedup: inf is not finite", "> 0"]),
    ("zero_baseline", lambda d: damage.set_value(d / "tree_cells.csv", "tokens_per_s_baseline", "0"),
     ["tree_cells.csv", "column tokens_per_s_baseline: 0.0 is out of range", "> 0"]),
    ("negative_generation", lambda d: damage.set_value(d / "generations.csv", "tokens_per_s", "-1"),
     ["generations.csv", "column tokens_per_s"]),
    ("inf_round", lambda d: damage.set_value(d / "rounds.csv", "verify_ms", "inf"),
     ["rounds.csv", "column verify_ms: inf is not finite"]),
    ("torn_cells", lambda d: damage.tear_row(d / "tree_cells.csv"), ["tree_cells.csv", "line 3 has 3 fields"]),
    ("torn_ranks", lambda d: damage.tear_row(d / "tree_ranks.csv"), ["tree_ranks.csv", "line 3 has 3 fields"]),
    ("no_generations", lambda d: (d / "generations.csv").unlink(), ["generations.csv: missing", "calibrate trees needs"]),
    ("no_ranks", lambda d: (d / "tree_ranks.csv").unlink(), ["tree_ranks.csv: missing"]),
    ("no_nodes", lambda d: (d / "tree_nodes.csv").unlink(), ["tree_nodes.csv: missing"]),
    ("no_rounds", lambda d: (d / "rounds.csv").unlink(), ["rounds.csv: missing"]),
    ("no_speedup_column", lambda d: damage.drop_column(d / "tree_cells.csv", "speedup"),
     ["tree_cells.csv: missing column(s) speedup"]),
    ("lost_generation", lambda d: damage.drop_last_row(d / "generations.csv"),
     ["generations.csv: 7 of the 8 generations of finished cell"]),
    ("lost_round", lambda d: damage.drop_last_row(d / "rounds.csv"), ["rounds.csv", "rounds of finished cell"]),
    # a complete run whose last cell row was lost: held-out 4.4% -> 6.5% on the other three, rc 0
    ("lost_last_cell", lambda d: damage.drop_last_row(d / "tree_cells.csv"),
     ["tree_cells.csv: 3 finished cell(s), but run.json recorded 4", "n_finished_cells"]),
]


@pytest.mark.parametrize("name,hurt,needles", TREE_CASES, ids=[c[0] for c in TREE_CASES])
def test_calibrate_trees_refuses_a_damaged_run_in_one_line(tmp_path, name, hurt, needles):
    run = _copy(TREE_RUN, tmp_path / "run")
    hurt(run)
    out = tmp_path / "cal"
    r = run_module("calibrate", ["trees", str(run), "--out", str(out), "--bootstrap", "2"])
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m calibrate trees: error: "), r.stderr
    for n in needles:
        assert n in lines[0]
    assert r.stdout == "" and not out.exists()  # nothing written, not even the directory


CHAIN_CASES: list[tuple[str, Callable[[Path], None], list[str]]] = [
    ("lost_last_cell", lambda d: damage.drop_last_row(d / "cells.csv"),
     ["cells.csv: 1 finished cell(s), but run.json recorded 2", "lost rows"]),
    ("inf_speedup", lambda d: damage.set_value(d / "cells.csv", "speedup", "inf"),
     ["cells.csv: line 2, column speedup: inf is not finite"]),
    ("zero_baseline", lambda d: damage.set_value(d / "cells.csv", "tokens_per_s_baseline", "0"),
     ["cells.csv: line 2, column tokens_per_s_baseline"]),
    ("negative_round", lambda d: damage.set_value(d / "rounds.csv", "draft_ms", "-4"), ["rounds.csv", "draft_ms"]),
]


@pytest.mark.parametrize("name,hurt,needles", CHAIN_CASES, ids=[c[0] for c in CHAIN_CASES])
def test_calibrate_refuses_a_damaged_chain_run_in_one_line(tmp_path, name, hurt, needles):
    run = _copy(CHAIN_RUN, tmp_path / "run")
    hurt(run)
    r = run_module("calibrate", [str(run), "--out", str(tmp_path / "cal")])
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m calibrate: error: "), r.stderr
    for n in needles:
        assert n in lines[0]
    assert not list((tmp_path / "cal").glob("*"))


def test_the_committed_runs_pass_the_checks():
    """Every committed tree and chain run this suite calibrates is what its writer wrote: no refusal."""
    from calibrate.checks import check_tree_run
    from calibrate.dataset import load_runs
    from measure.records import load_run

    run = load_run(TREE_RUN)  # the int8 tree run: test_calibrate_trees.py calibrates it, through the same checks
    names = ("tree_cells", "generations", "rounds", "tree_nodes", "tree_ranks", "cost_target", "cost_draft")
    check_tree_run(TREE_RUN, run.meta, {n: run.table(n) for n in names})
    assert len(load_runs([CHAIN_RUN]).cells) == 2
