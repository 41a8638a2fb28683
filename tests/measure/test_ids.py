"""The run format's identities: each has one codec (``to_str``/``parse``), and every form on disk decodes.

Round trips for γ policies, chain cells, tree cells, serving configurations, loads and units; then every
committed run under ``results/`` (each kind) is read, and every identity in its finishing table and its
``run.json`` config decodes and encodes back to the same text.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from measure.ids import CellId, LoadSpec, ServeConfig, TreeCellId, UnitId
from measure.records import load_run
from measure.runkinds import CHAIN, HEAD_SWEEP, SERVE, TREES, kind_of
from sim.policies import GammaSpec

ROOT = Path(__file__).resolve().parents[2]
#: Every committed run directory (``results/**/run.json``).
COMMITTED_RUNS = sorted(p.parent for p in (ROOT / "results").rglob("run.json"))


@pytest.mark.parametrize("text", ["fixed:1", "fixed:4", "heuristic:4", "threshold:7"])
def test_gamma_spec_round_trips(text: str) -> None:
    assert GammaSpec.parse(text).to_str() == text
    assert GammaSpec.parse(GammaSpec.parse(text)) == GammaSpec.parse(text)


def test_gamma_spec_reads_a_bare_count_as_fixed() -> None:
    assert GammaSpec.parse("4") == GammaSpec.parse(4) == GammaSpec("fixed", 4)
    with pytest.raises(ValueError, match="unknown gamma policy 'greedy'"):
        GammaSpec.parse("greedy:4")


@pytest.mark.parametrize("cell", [CellId("int8", GammaSpec("fixed", 4), 0.0, "code"),
                                  CellId("ngram:3", GammaSpec("heuristic", 2), 0.7, "chat", 512)])
def test_cell_id_round_trips(cell: CellId) -> None:
    assert CellId.parse(cell.to_str()) == cell


@pytest.mark.parametrize("cell", [TreeCellId("int8", "[[0],[1],[0,0]]", "code"),
                                  TreeCellId("ngram:3", "depth=3,topk=2,budget=5", "code,chat"),
                                  TreeCellId.chain("int8", 4, "code")])
def test_tree_cell_id_round_trips(cell: TreeCellId) -> None:
    assert TreeCellId.parse(cell.to_str()) == cell


def test_a_tree_runs_chain_cell_is_shape_gamma() -> None:
    assert TreeCellId.chain("int8", 4, "code").to_str() == "draft=int8|shape=gamma=4|temp=0|domain=code"


@pytest.mark.parametrize("text", ["off", "url", "ngram:3:k4", "synth:k2:p512", "synth:off:p512"])
def test_serve_config_round_trips(text: str) -> None:
    assert ServeConfig.parse(text).to_str() == text


@pytest.mark.parametrize("text, closed, amount", [("c4", True, 4.0), ("r2.5", False, 2.5), ("r0.1", False, 0.1)])
def test_load_round_trips(text: str, closed: bool, amount: float) -> None:
    load = LoadSpec.parse(text)
    assert load.to_str() == text and load.closed is closed and load.amount == amount


def test_unit_id_round_trips() -> None:
    uid = UnitId(ServeConfig("ngram", 4, 3), 4, LoadSpec(rate_per_s=2.5), 1)
    assert uid.to_str() == "config=ngram:3:k4|slots=4|load=r2.5|repeat=1"
    assert UnitId.parse(uid.to_str()) == uid


@pytest.mark.parametrize("codec, text", [(CellId, "draft=int8|gamma=fixed:4"), (TreeCellId, "draft=x|shape=y"),
                                         (UnitId, "config=off|slots=1"), (LoadSpec, "x4"),
                                         (ServeConfig, "ngram:3")])
def test_a_bad_text_is_one_line(codec: type, text: str) -> None:
    with pytest.raises(ValueError) as e:
        codec.parse(text)
    assert "\n" not in str(e.value) and text in str(e.value)


def _finished_ids(run_dir: Path) -> tuple[type, list[str]]:
    run = load_run(run_dir)
    kind = kind_of(run.meta)
    return kind.identity, [str(c) for c in run.table(kind.finish_table)["cell_id"]]


def test_committed_runs_are_found() -> None:
    kinds = {kind_of(load_run(p).meta) for p in COMMITTED_RUNS}
    assert {CHAIN, HEAD_SWEEP, TREES, SERVE} <= kinds, "results/ should hold a run of every kind"


@pytest.mark.parametrize("run_dir", COMMITTED_RUNS, ids=lambda p: str(p.relative_to(ROOT / "results")))
def test_every_committed_identity_decodes(run_dir: Path) -> None:
    identity, ids = _finished_ids(run_dir)
    for text in ids:
        assert identity.parse(text).to_str() == text
    run = load_run(run_dir)
    if identity is CellId:
        cells = run.table("cells")
        for cid, policy in zip(cells["cell_id"], cells["gamma_policy"]):
            assert CellId.parse(cid).gamma == GammaSpec.parse(policy)
        for g in run.meta["config"].get("gammas") or ():
            GammaSpec.parse(g)
    if identity is UnitId:
        units = run.table("serve_units")
        for uid, config, load in zip(units["cell_id"], units["config"], units["load"]):
            unit = UnitId.parse(uid)
            assert (unit.config, unit.load) == (ServeConfig.parse(config), LoadSpec.parse(load))
