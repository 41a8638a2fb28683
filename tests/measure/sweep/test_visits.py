"""Staging and resume of visits, shared by chains and trees (:mod:`measure.sweep.visits`), on an in-memory writer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from measure.sweep.visits import in_order, missing_visits, read_staged, stage_visit, visit_all, write_unit


@dataclass(frozen=True)
class _Visit:
    cell_id: str
    repeat: int
    prompt_index: int

    def to_record(self) -> dict:
        return {"cell_id": self.cell_id, "repeat": self.repeat, "prompt_index": self.prompt_index}

    @classmethod
    def from_record(cls, rec: dict) -> "_Visit":
        if not isinstance(rec["repeat"], int):
            raise ValueError(f"repeat {rec['repeat']!r} is not an integer")
        return cls(rec["cell_id"], rec["repeat"], rec["prompt_index"])


@dataclass
class _Writer:
    records: list[dict] = field(default_factory=list)
    quarantined: list[tuple[Any, str]] = field(default_factory=list)
    written: list[tuple[str, list]] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    repairs: list[str] = field(default_factory=list)

    def stage(self, record: Mapping[str, Any]) -> None:
        self.records.append(dict(record))

    def staged(self) -> list[dict]:
        return list(self.records)

    def quarantine(self, record: Any, reason: str) -> None:
        self.quarantined.append((record, reason))

    def append(self, table: str, rows: Iterable[Any]) -> int:
        self.written.append((table, list(rows)))
        return len(self.written[-1][1])

    def finish_cell(self, row: Any) -> None:
        self.written.append(("cells", [row]))

    def update(self, **fields: Any) -> None:
        self.meta.update(fields)

    def clear_staged(self) -> None:
        self.records.clear()


def test_staged_visits_read_back_with_bad_ones_quarantined_and_other_cells_skipped():
    w = _Writer()
    visits: dict[tuple[int, int], _Visit] = {}
    for v in (_Visit("a", 0, 1), _Visit("a", 0, 0), _Visit("b", 0, 0), _Visit("a", 5, 0)):
        stage_visit(w, visits, v)
    w.records.append({"cell_id": "a", "repeat": "x", "prompt_index": 0})
    w.records.append({"repeat": 0})
    got = read_staged(w, _Visit.from_record, {"a"},
                      lambda v: None if v.repeat < 2 else f"repeat {v.repeat} is outside the run's 2 repeats")
    assert got == [_Visit("a", 0, 1), _Visit("a", 0, 0)]
    assert [why for _r, why in w.quarantined] == ["repeat 5 is outside the run's 2 repeats",
                                                   "repeat 'x' is not an integer", "'cell_id'"]
    assert visits[(0, 0)] == _Visit("b", 0, 0) and [v.prompt_index for v in in_order(visits)] == [0, 1, 0]


def test_missing_visits_in_measuring_order_and_a_unit_written_row_last():
    assert missing_visits({(0, 1), (1, 0)}, 2, 2) == [(0, 0), (1, 1)]
    w = _Writer()
    write_unit(w, {"generations": [1, 2], "rounds": []}, "row")
    assert w.written == [("generations", [1, 2]), ("rounds", []), ("cells", ["row"])]


def test_the_visit_loop_measures_only_what_is_not_staged_and_stages_each_before_after_sees_it():
    w = _Writer()
    units: dict[str, dict[tuple[int, int], _Visit]] = {"a": {(0, 0): _Visit("a", 0, 0)}, "b": {}}
    seen: list[tuple[str, int, int, int]] = []

    def after(unit: str, v: _Visit) -> None:
        seen.append((unit, v.repeat, v.prompt_index, len(w.records)))

    schedule = [(u, rep, pi) for rep in range(2) for u in ("a", "b") for pi in range(1)]
    n = visit_all(w, schedule, units.__getitem__, lambda u, rep, pi: _Visit(u, rep, pi), after)
    assert n == 3 and seen == [("b", 0, 0, 1), ("a", 1, 0, 2), ("b", 1, 0, 3)]
    assert sorted(units["a"]) == [(0, 0), (1, 0)] and sorted(units["b"]) == [(0, 0), (1, 0)]
