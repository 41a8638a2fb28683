"""The kinds of run (measure/runkinds.py): the registry, the one reader of a run's kind, the one opener."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from measure import records
from measure.ids import CellId, TreeCellId
from measure.rows import CellRow, TreeCellRow, UnitRow
from measure.runkinds import (CHAIN, HEAD_SWEEP, RUN_KINDS, SERVE, TREES, kind_of, open_run_dir, read_kind,
                              set_aside)
from measure.serve.units import UnitId

ROOT = Path(__file__).resolve().parents[2]


def test_every_kind_names_its_tables_identity_and_calibration():
    assert list(RUN_KINDS) == ["chain", "head_sweep", "trees", "serve"]
    assert (CHAIN.finish_table, TREES.finish_table, SERVE.finish_table) == ("cells", "tree_cells", "serve_units")
    assert (CHAIN.identity, TREES.identity, SERVE.identity) == (CellId, TreeCellId, UnitId)
    assert CHAIN.rows[0] is CellRow and TREES.rows[0] is TreeCellRow and SERVE.rows[0] is UnitRow
    assert set(HEAD_SWEEP.tables) >= set(CHAIN.tables) | {"head_sweep", "profile"}
    for kind in RUN_KINDS.values():  # every table is one the run format knows, once
        assert set(kind.tables) <= set(records.TABLE_COLUMNS) and len(set(kind.tables)) == len(kind.tables)
    assert (TREES.calibrate_command, TREES.calibration_file) == ("python -m calibrate trees", "tree_calibration.json")
    assert SERVE.calibration_dir == "calibration-serve" and CHAIN.extends and not TREES.extends


def test_a_run_without_a_kind_reads_as_a_chain_and_an_unknown_one_is_one_line():
    assert kind_of({"config": {"gammas": ["fixed:4"]}}) is CHAIN
    assert kind_of({"config": {}}) is CHAIN and kind_of({}) is CHAIN
    assert kind_of({"config": TREES.stamp({"x": 1})}) is TREES
    assert TREES.stamp({"x": 1}) == {"x": 1, "kind": "trees"}
    with pytest.raises(ValueError, match=r"config.kind 'beams' is not a kind of run .*; valid: chain, head_sweep, "
                                         r"trees, serve$"):
        kind_of({"config": {"kind": "beams"}})


def test_a_schema_3_run_names_its_kind_and_an_older_one_without_is_a_chain():
    assert kind_of({"schema_version": 2, "config": {"target": "x"}}) is CHAIN
    with pytest.raises(ValueError, match=r"^run.json config names no kind; a schema-3 run records it \(valid: chain"):
        kind_of({"schema_version": 3, "config": {"target": "x"}})
    assert kind_of({"schema_version": 3, "config": SERVE.stamp({})}) is SERVE


@pytest.mark.parametrize("run, kind", [("cpu-smollm2-ngram-gammas", CHAIN), ("cpu-trees-smollm2-int8", TREES),
                                       ("cpu-serve-small", SERVE), ("cpu-smollm2-head-sweep", HEAD_SWEEP)])
def test_committed_runs_read_as_their_kind(run, kind):
    assert read_kind(ROOT / "results" / run) is kind


def test_read_kind_of_a_directory_without_a_run_is_none(tmp_path):
    assert read_kind(tmp_path) is None
    (tmp_path / "run.json").write_text("{not json")
    assert read_kind(tmp_path) is None


def test_a_new_run_records_its_kind_at_once(tmp_path):
    w = open_run_dir(TREES, tmp_path / "r", fingerprint={"a": 1})
    try:
        assert w.finish_table == "tree_cells" and not w.resumed
        assert json.loads((tmp_path / "r" / "run.json").read_text())["config"] == {"kind": "trees"}
    finally:
        w.close()


def test_no_run_json_is_ever_written_without_its_kind(tmp_path, monkeypatch):
    """A run killed right after its first write must still read as its kind (schema 3 requires one)."""
    from measure import records

    written = []
    real = records.RunWriter._write_meta

    def spy(self):
        real(self)
        written.append(json.loads((self.path / "run.json").read_text())["config"].get("kind"))

    monkeypatch.setattr(records.RunWriter, "_write_meta", spy)
    for meta in (None, {"config": {"draft": "ngram:3"}}):
        written.clear()
        w = open_run_dir(TREES, tmp_path / f"r{len(str(meta))}", meta=meta)
        w.close()
        assert written and set(written) == {"trees"}


def test_a_run_of_another_kind_is_refused_under_the_lock_and_left_as_it_was(tmp_path):
    w = open_run_dir(SERVE, tmp_path / "r")
    w.close()
    before = (tmp_path / "r" / "run.json").read_text()
    with pytest.raises(ValueError, match=r"holds a serving run \(python -m measure serve\), not a tree run"):
        open_run_dir(TREES, tmp_path / "r")
    assert (tmp_path / "r" / "run.json").read_text() == before
    open_run_dir(SERVE, tmp_path / "r").close()  # its own kind resumes it (the lock was released)


def test_force_new_sets_the_run_aside_and_starts_a_new_one(tmp_path):
    open_run_dir(CHAIN, tmp_path / "r").close()
    said: list[str] = []
    w = open_run_dir(TREES, tmp_path / "r", force_new=True, say=said.append)
    w.close()
    (moved,) = [p for p in tmp_path.iterdir() if p.name.startswith("r.replaced-")]
    assert said == [f"--force-new: the previous run is kept in {moved}"]
    assert read_kind(moved) is CHAIN and read_kind(tmp_path / "r") is TREES


def test_force_new_never_moves_a_run_another_process_is_writing(tmp_path):
    open_run_dir(SERVE, tmp_path / "r").close()
    fd = records.acquire_run_lock(tmp_path / "r")  # the writer of the run, as another process holds it
    try:
        with pytest.raises(records.RunLocked, match="is writing this run"):
            open_run_dir(SERVE, tmp_path / "r", force_new=True)
        with pytest.raises(records.RunLocked):
            set_aside(tmp_path / "r")
    finally:
        os.close(fd)
    assert [p.name for p in tmp_path.iterdir()] == ["r"]


@pytest.mark.parametrize("kind, kw, message", [
    (CHAIN, {"extend": True, "force_new": True}, "--extend adds to the run in --out; --force-new starts a new one"),
    (TREES, {"extend": True}, "--extend: a tree run cannot be extended; valid for: python -m measure, python -m "
                              "measure serve"),
])
def test_extend_is_refused_where_it_cannot_apply(tmp_path, kind, kw, message):
    with pytest.raises(ValueError) as e:
        open_run_dir(kind, tmp_path / "r", **kw)
    assert str(e.value) == message if kind is TREES else str(e.value).startswith(message)
    assert not (tmp_path / "r").exists()


def test_the_plan_sees_the_stored_run_under_the_lock(tmp_path):
    seen: list = []
    open_run_dir(CHAIN, tmp_path / "r", plan=seen.append).close()
    open_run_dir(CHAIN, tmp_path / "r", plan=seen.append).close()
    assert seen[0] is None and seen[1]["config"] == {"kind": "chain"}
