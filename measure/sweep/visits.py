"""Staging and resume of a run's visits, shared by every kind that measures in visits (chains, trees).

A *visit* is one (repeat, prompt) of a unit (a cell): the generations measured back to back on one prompt, as
the rows of the unit's tables. Each kind has its own visit type (:class:`measure.sweep.cells.Visit`,
:class:`measure.trees.run.TreeVisit`); what they share is how a visit lives on disk
(:meth:`measure.records.RunWriter.stage`, ``visits.partial.jsonl``) so that a run killed at any point (even by
SIGKILL) loses at most the visit that was running:

* :func:`read_staged` — the visits an interrupted run staged that belong to the units still to measure; a
  record that cannot belong is quarantined with the reason (:meth:`measure.records.RunWriter.quarantine`);
* :func:`missing_visits` — which (repeat, prompt) visits of a unit are still to measure;
* :func:`stage_visit` — one finished visit staged on disk and kept with its unit's visits;
* :func:`visit_all` — the one visit loop: each (unit, repeat, prompt) of a kind's schedule not yet staged is
  measured by the kind's "generate one visit" function and staged at once;
* :func:`write_unit` — a unit whose visits are all in: its rows table by table, its summary row last (the row
  that marks it finished).
"""

from __future__ import annotations

from typing import Any, Callable, Container, Iterable, Mapping, MutableMapping, Protocol, Sequence, TypeVar

from measure import records
from measure.rows import R, Row


class StagedVisit(Protocol):
    """What the staging needs of a kind's visit: which unit, which (repeat, prompt), and its record on disk."""

    @property
    def cell_id(self) -> str: ...

    @property
    def repeat(self) -> int: ...

    @property
    def prompt_index(self) -> int: ...

    def to_record(self) -> dict: ...


V = TypeVar("V", bound=StagedVisit)
U = TypeVar("U")

#: What a staged record that is not a visit raises when it is parsed (the record is quarantined, never pooled).
BAD_RECORD = (ValueError, TypeError, KeyError)


def read_staged(writer: records.CellWriter[Any], parse: Callable[[dict], V], wanted: Container[str],
                  problem: Callable[[V], str | None], adjust: Callable[[V], V] | None = None) -> list[V]:
    """The visits staged on disk (in staged order) that belong to the units ``wanted`` (by cell id).

    ``parse`` makes a visit of a record (raising one of :data:`BAD_RECORD` for one that is not); ``adjust``
    (optional) changes a parsed visit of a wanted unit before it is checked; ``problem`` says why a visit cannot
    belong to its unit as configured (None if it can). A record that does not parse or has a problem is
    quarantined with the reason; a visit of another unit (a finished one, or one not in this run) is skipped.
    """
    out: list[V] = []
    for rec in writer.staged():
        try:
            v = parse(rec)
        except BAD_RECORD as e:
            writer.quarantine(rec, str(e))
            continue
        if v.cell_id not in wanted:
            continue
        if adjust is not None:
            v = adjust(v)
        why = problem(v)
        if why is not None:
            writer.quarantine(rec, why)
            continue
        out.append(v)
    return out


def missing_visits(visits: Container[tuple[int, int]], repeats: int, n_prompts: int) -> list[tuple[int, int]]:
    """The (repeat, prompt index) visits of a unit of ``repeats`` repeats over ``n_prompts`` prompts not yet in
    ``visits``, in measuring order (repeat, then prompt)."""
    return [(rep, pi) for rep in range(repeats) for pi in range(n_prompts) if (rep, pi) not in visits]


def stage_visit(writer: records.CellWriter[Any], visits: MutableMapping[tuple[int, int], V], v: V) -> None:
    """Stage the finished visit ``v`` on disk at once (a SIGKILL after this keeps it), then keep it in its unit's
    ``visits``."""
    writer.stage(v.to_record())
    visits[(v.repeat, v.prompt_index)] = v


def visit_all(writer: records.CellWriter[Any], schedule: Iterable[tuple[U, int, int]],
              visits_of: Callable[[U], MutableMapping[tuple[int, int], V]], measure: Callable[[U, int, int], V],
              after: Callable[[U, V], None] | None = None) -> int:
    """The one visit loop of every kind that measures in visits; returns how many visits it measured.

    For each ``(unit, repeat, prompt index)`` of ``schedule`` (the kind's order: it may be a generator that
    looks at the visits so far and stops early) whose visit is not yet among ``visits_of(unit)``: ``measure``
    generates the visit (baseline and speculative back to back, judged lossless), it is staged on disk and kept
    (:func:`stage_visit`), then ``after`` sees it (progress, cost points timed between the visits).
    """
    n = 0
    for unit, rep, pi in schedule:
        visits = visits_of(unit)
        if (rep, pi) in visits:
            continue
        v = measure(unit, rep, pi)
        stage_visit(writer, visits, v)
        n += 1
        if after is not None:
            after(unit, v)
    return n


def write_unit(writer: records.CellWriter[R], tables: Mapping[str, Iterable[Row]], row: R) -> None:
    """Write a unit whose visits are all in: its rows, table by table in ``tables``' order, then its summary
    ``row`` last (:meth:`measure.records.RunWriter.finish_cell`: the row that marks the unit finished)."""
    for table, rows in tables.items():
        writer.append(table, list(rows))
    writer.finish_cell(row)


def in_order(visits: Mapping[tuple[int, int], V]) -> Sequence[V]:
    """A unit's visits in measured order (repeat, then prompt)."""
    return [visits[k] for k in sorted(visits)]
