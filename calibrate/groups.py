"""Acceptance groups: the cells whose rounds share one acceptance fit, and the fits made per group or draft.

A group is ``draft | temperature | domain [| head_k]``; :func:`pooled_acceptance`
fits each draft on all its cells, :func:`group_traces` keeps each group's greedy
proposal-run trace for exact replay in ``python -m sim``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd

from calibrate.dataset import Dataset, rows_of
from calibrate.fit_acceptance import AcceptanceFit, fit_acceptance, trace_model
from sim.acceptance import RunTraceAcceptance


def slug(text: str) -> str:
    """File-name-safe form of a draft or run name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(text)).strip("_") or "x"



@dataclass(frozen=True)
class AcceptanceGroup:
    """Cells whose rounds share one acceptance fit: ``draft=..|temp=..|domain=..[|head_k=..]`` on disk."""

    draft: str
    temperature: float
    domain: str
    head_k: int | None = None

    @classmethod
    def of_cell(cls, row: pd.Series) -> "AcceptanceGroup":
        k = row["head_k"]
        return cls(str(row["draft"]), float(row["temperature"]), str(row["domain"]),
                   None if k is None or pd.isna(k) else int(k))

    def to_str(self) -> str:
        k = "" if self.head_k is None else f"|head_k={self.head_k}"
        return f"draft={self.draft}|temp={self.temperature:g}|domain={self.domain}{k}"

    @classmethod
    def parse(cls, text: str) -> "AcceptanceGroup":
        parts = dict(p.partition("=")[::2] for p in str(text).split("|"))
        if not {"draft", "temp", "domain"} <= set(parts) or set(parts) - {"draft", "temp", "domain", "head_k"}:
            raise ValueError(f"acceptance group {text!r}: expected draft=..|temp=..|domain=..[|head_k=..]")
        hk = parts.get("head_k")
        return cls(parts["draft"], float(parts["temp"]), parts["domain"], None if hk is None else int(hk))

    def file_name(self, suffix: str = "") -> str:
        """``acceptance-<draft>-<domain>-t<temp>[-k<K>]<suffix>.json``."""
        k = "" if self.head_k is None else f"-k{self.head_k}"
        return f"acceptance-{slug(self.draft)}-{slug(self.domain)}-t{slug(f'{self.temperature:g}')}{k}{suffix}.json"


def acceptance_groups(cells: pd.DataFrame) -> list[tuple[AcceptanceGroup, pd.DataFrame]]:
    """``cells`` split by acceptance group, in the order of the groups' strings."""
    labels = cells.apply(lambda r: AcceptanceGroup.of_cell(r).to_str(), axis=1)
    return [(AcceptanceGroup.parse(str(label)), sub) for label, sub in cells.groupby(labels)]



def pooled_acceptance(data: Dataset) -> dict[str, AcceptanceFit]:
    """Per draft, the acceptance fit on every one of its cells' rounds."""
    out = {}
    for draft, sub in data.cells.groupby("draft"):
        rounds = rows_of(data.rounds, sub["key"])
        if len(rounds):
            out[str(draft)] = fit_acceptance(rounds, f"draft={draft} (all cells)")
    return out


def group_traces(data: Dataset) -> dict[AcceptanceGroup, RunTraceAcceptance]:
    """Per acceptance group, the proposal-run trace of its cells (greedy runs that recorded one)."""
    tr = data.traces
    if tr.empty or not {"proposed", "accept_run"} <= set(tr.columns):
        return {}
    out = {}
    for grp, sub in acceptance_groups(data.cells):
        model = trace_model(rows_of(tr, sub["key"]))
        if isinstance(model, RunTraceAcceptance):
            out[grp] = model
    return out


