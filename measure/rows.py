"""The run directory's tables as typed rows: one frozen dataclass per table, the tables' only schema.

A row's fields are its table's columns, in the order they are written
(``docs/RUN_FORMAT.md``); :data:`ROW_TYPES` maps each table to its row type
and :data:`measure.records.TABLE_COLUMNS` is derived from them. Text exists
only on disk: :meth:`Row.to_csv` writes a row's cells and :meth:`Row.from_csv`
parses them back, :meth:`Row.to_json` / :meth:`Row.from_json` do the same for
the JSON a staged visit holds. A confidence interval is written as three
columns (``x``, ``x_lo``, ``x_hi``): :meth:`Row.make` takes it as one
:class:`~measure.stats.Estimate` and :meth:`Row.estimate` gives it back as one.
A cell's identity is a :class:`~measure.ids.CellId` the same way
(:meth:`CellRow.make` ``cell=``, :attr:`CellRow.cell`).

Torch-free, like everything ``calibrate`` and ``reports`` may read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Callable, ClassVar, Mapping, TypeVar

from measure.ids import CellId
from measure.stats import Estimate
from sim.policies import GammaSpec

R = TypeVar("R", bound="Row")


def ids_text(tokens: tuple[int, ...] | list[int]) -> str:
    """Token ids as a ``tokens`` cell (``generations.csv``, ``run.json`` prompts): space-separated."""
    return " ".join(str(int(t)) for t in tokens)


def parse_tokens(text: Any) -> tuple[int, ...]:
    """Token ids from a ``tokens`` cell (:func:`ids_text`); empty (None, NaN, ``""``) → ``()``."""
    if text is None or (isinstance(text, float) and math.isnan(text)):
        return ()
    return tuple(int(t) for t in str(text).split())


def format_cell(value: Any) -> Any:
    """A value as ``csv`` writes it: None and non-finite floats empty, booleans ``true``/``false``."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return ""
    if isinstance(value, tuple):
        return ids_text(value)
    return value


def _parse_bool(text: str) -> bool:
    if text in ("true", "True"):
        return True
    if text in ("false", "False"):
        return False
    raise ValueError(f"{text!r} is not true/false")


def _parse_int(text: str) -> int:
    v = float(text)
    if not math.isfinite(v) or v != int(v):
        raise ValueError(f"{text!r} is not an integer")
    return int(v)


#: The cell types a row may have (field annotations), and how each is parsed from its text.
PARSERS: dict[str, Callable[[str], Any]] = {"str": str, "int": _parse_int, "float": float, "bool": _parse_bool,
                                            "tuple[int, ...]": parse_tokens}


def _a(base: str) -> str:
    """``"an int"``, ``"a float"``, ``"token ids"``: a type named in an error."""
    return {"int": "an integer", "tuple[int, ...]": "token ids"}.get(base, f"a {base}")


def _kind(annotation: str) -> tuple[str, bool]:
    """``("float", True)`` for ``"float | None"``: the base type and whether the cell may be empty."""
    base, _, none = annotation.partition(" | ")
    return base, none == "None"


@dataclass(frozen=True)
class Row:
    """A row of a run-directory table (subclasses: one per table, fields = columns, in order)."""

    table: ClassVar[str] = ""

    @classmethod
    def columns(cls) -> tuple[str, ...]:
        """The table's columns, in order."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def column_types(cls) -> dict[str, tuple[str, bool]]:
        """Column → (base type, may be empty)."""
        return {f.name: _kind(str(f.type)) for f in fields(cls)}

    @classmethod
    def make(cls: type[R], **values: Any) -> R:
        """The row from its column values; an :class:`~measure.stats.Estimate` given for a column ``x`` that has
        ``x_lo`` and ``x_hi`` columns fills all three."""
        cols = set(cls.columns())
        out: dict[str, Any] = {}
        for name, v in values.items():
            if isinstance(v, Estimate) and f"{name}_lo" in cols and f"{name}_hi" in cols:
                out.update({name: v.value, f"{name}_lo": v.lo, f"{name}_hi": v.hi})
            else:
                out[name] = v
        return cls(**out)

    def estimate(self, name: str) -> Estimate:
        """Column ``name`` with its ``_lo``/``_hi`` columns as one :class:`~measure.stats.Estimate`."""
        return Estimate(getattr(self, name), getattr(self, f"{name}_lo"), getattr(self, f"{name}_hi"))

    def to_csv(self) -> list[Any]:
        """The row's cells in column order, as ``csv.writer`` writes them (:func:`format_cell`)."""
        return [format_cell(getattr(self, c)) for c in self.columns()]

    @classmethod
    def from_csv(cls: type[R], cells: Mapping[str, str]) -> R:
        """The row of ``cells`` (column → text as read; a column missing, as in older runs, reads as empty).

        One-line ``ValueError`` naming the column and the text that does not parse.
        """
        values: dict[str, Any] = {}
        for name, (base, optional) in cls.column_types().items():
            text = cells.get(name, "")
            if text == "" and (optional or base == "tuple[int, ...]"):
                values[name] = () if base == "tuple[int, ...]" else None
                continue
            try:
                values[name] = PARSERS[base](text)
            except (TypeError, ValueError):
                raise ValueError(f"{cls.table}.csv column {name}: {text!r} is not {_a(base)}") from None
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        """The row as a JSON object (a staged visit's): values as they are, token ids as text."""
        return {c: ids_text(v) if isinstance(v, tuple) else v for c in self.columns() for v in [getattr(self, c)]}

    @classmethod
    def from_json(cls: type[R], obj: Mapping[str, Any]) -> R:
        """The row of a JSON object written by :meth:`to_json`; ``ValueError`` naming a missing column or a value
        of the wrong type."""
        if not isinstance(obj, Mapping):
            raise ValueError(f"a {cls.table} row is not a JSON object")
        values: dict[str, Any] = {}
        for name, (base, optional) in cls.column_types().items():
            if name not in obj:
                raise ValueError(f"a {cls.table} row has no {name}")
            v = obj[name]
            if v is None and optional:
                values[name] = None
            elif base == "tuple[int, ...]" and isinstance(v, str):
                values[name] = parse_tokens(v)
            elif base == "str" and isinstance(v, str) or base == "bool" and isinstance(v, bool) \
                    or base == "int" and isinstance(v, int) and not isinstance(v, bool) \
                    or base == "float" and isinstance(v, (int, float)) and not isinstance(v, bool):
                values[name] = v
            else:
                raise ValueError(f"{cls.table} row: {name} {v!r} is not {_a(base)}")
        return cls(**values)


@dataclass(frozen=True)
class CellRow(Row):
    """One measured cell (``cells.csv``): its identity, tokens/s and speedup with 95% CIs, acceptance, noise flags.

    Written last, after every other row of the cell: a ``cells.csv`` row marks its cell finished.
    """

    table: ClassVar[str] = "cells"

    cell_id: str
    draft: str
    gamma_policy: str
    gamma: int
    temperature: float
    domain: str
    head_k: int | None
    n_prompts: int
    new_tokens: int
    tokens_per_s_baseline: float | None
    tokens_per_s_speculative: float | None
    tokens_per_s_peer: float | None
    speedup: float | None
    acceptance_rate: float | None
    mean_accepted_per_round: float | None
    n_rounds: int | None
    outputs_identical: bool | None
    synthetic: bool | None
    # schema 2: repeats, 95% CIs, noise flags, the peer's own counts
    repeats: int | None = None
    speedup_lo: float | None = None
    speedup_hi: float | None = None
    tokens_per_s_baseline_lo: float | None = None
    tokens_per_s_baseline_hi: float | None = None
    tokens_per_s_speculative_lo: float | None = None
    tokens_per_s_speculative_hi: float | None = None
    tokens_per_s_peer_lo: float | None = None
    tokens_per_s_peer_hi: float | None = None
    speedup_peer: float | None = None
    speedup_peer_lo: float | None = None
    speedup_peer_hi: float | None = None
    peer_acceptance_rate: float | None = None
    baseline_cv: float | None = None
    baseline_drift: float | None = None
    unstable: bool | None = None
    unstable_reason: str | None = None
    attempts: int | None = None
    # the machine that measured the cell (records.hardware_label); a Ray sweep's cells may differ
    hardware: str | None = None
    # greedy generations of the cell that diverged within the engine's near-tie tolerance, or beyond it
    n_near_tie: int | None = None
    n_lossless_failures: int | None = None
    # the engine's own plain decoding in the same visits, and our baseline over it (with 95% CIs)
    tokens_per_s_library: float | None = None
    tokens_per_s_library_lo: float | None = None
    tokens_per_s_library_hi: float | None = None
    baseline_vs_library: float | None = None
    baseline_vs_library_lo: float | None = None
    baseline_vs_library_hi: float | None = None

    def __post_init__(self) -> None:
        for name, (base, optional) in self.column_types().items():  # as on disk: a non-finite value is empty
            v = getattr(self, name)
            if base == "float" and optional and v is not None and not math.isfinite(v):
                object.__setattr__(self, name, None)

    @classmethod
    def make(cls, cell: CellId | None = None, **values: Any) -> "CellRow":
        """:meth:`Row.make`, the identity columns from ``cell``."""
        if cell is not None:
            values.update(cell_id=cell.to_str(), draft=cell.draft, gamma_policy=cell.gamma.to_str(),
                          gamma=cell.gamma.gamma, temperature=cell.temperature, domain=cell.domain,
                          head_k=cell.head_k)
        return super().make(**values)

    @property
    def cell(self) -> CellId:
        """The cell's identity (from its columns)."""
        return CellId(self.draft, GammaSpec.parse(self.gamma_policy), self.temperature, self.domain, self.head_k)

    @property
    def is_unstable(self) -> bool:
        return self.unstable is True


@dataclass(frozen=True)
class GenerationRow(Row):
    """One counted generation (``generations.csv``): one mode of one visit, its timing and its token ids."""

    table: ClassVar[str] = "generations"

    cell_id: str
    prompt_id: str
    domain: str
    mode: str
    prompt_tokens: int
    new_tokens: int
    wall_s: float
    tokens_per_s: float | None
    ttft_ms: float | None
    peak_mem_bytes: int | None
    outputs_identical: bool | None
    # schema 2
    repeat: int | None = None
    order: int | None = None
    drafted: int | None = None
    accepted: int | None = None
    n_rounds: int | None = None
    tokens: tuple[int, ...] = ()
    # greedy: identical | near_tie | failure against the baseline (measure.engines.lossless)
    lossless: str | None = None
    divergence_position: int | None = None
    divergence_margin: float | None = None


@dataclass(frozen=True)
class RoundRow(Row):
    """One speculative round of a generation (``rounds.csv``)."""

    table: ClassVar[str] = "rounds"

    cell_id: str
    prompt_id: str
    round: int
    gamma: int
    context_tokens: int
    drafted: int
    accepted: int
    draft_ms: float
    verify_ms: float
    overhead_ms: float
    repeat: int | None = None


@dataclass(frozen=True)
class TokenLatencyRow(Row):
    """The time since the previous token of one emitted token (``token_latency.csv``)."""

    table: ClassVar[str] = "token_latency"

    cell_id: str
    prompt_id: str
    mode: str
    token_index: int
    latency_ms: float
    repeat: int | None = None


@dataclass(frozen=True)
class TraceRow(Row):
    """One position of a teacher-forced acceptance trace (``traces.csv``)."""

    table: ClassVar[str] = "traces"

    cell_id: str
    draft: str
    temperature: float
    domain: str
    prompt_id: str
    position: int
    value: float
    proposed: int | None
    accept_run: int | None


@dataclass(frozen=True)
class CostTargetRow(Row):
    """One timed target forward of ``n_tokens`` after ``context_tokens`` (``cost_target.csv``)."""

    table: ClassVar[str] = "cost_target"

    n_tokens: int
    context_tokens: int
    repeat: int
    ms: float


@dataclass(frozen=True)
class CostDraftRow(Row):
    """One timed draft step after ``context_tokens`` (``cost_draft.csv``; ``head_k`` of a pruned head)."""

    table: ClassVar[str] = "cost_draft"

    draft: str
    head_k: int | None
    context_tokens: int
    repeat: int
    ms: float


@dataclass(frozen=True)
class ProfileRow(Row):
    """One component's share of a profiled step (``profile.csv``)."""

    table: ClassVar[str] = "profile"

    model: str
    role: str
    component: str
    ms: float
    share: float


@dataclass(frozen=True)
class HeadSweepRow(Row):
    """One ``(variant, K)`` of the pruned-head sweep (``head_sweep.csv``)."""

    table: ClassVar[str] = "head_sweep"

    variant: str
    head_k: int
    head_ms: float
    draft_step_ms: float
    acceptance_rate: float
    tokens_per_s: float
    speedup: float | None
    head_fast_ms: float
    tokens_per_s_baseline: float
    e2e_acceptance_rate: float
    mean_accepted_per_round: float
    kept_recall: float
    n_eval_tokens: int
    outputs_identical: bool
    model: str
    draft: str
    vocab_size: int
    gamma: int
    synthetic: bool


# python -m measure serve (measure/serve): a unit is one load on one server configuration in one repeat; its
# serve_units row is written last and marks it finished (``cell_id`` holds the unit id, measure.ids.UnitId)
@dataclass(frozen=True)
class RequestRow(Row):
    """``serve_requests.csv``: one request as the client saw it (times from its send), and the server's timings."""

    table: ClassVar[str] = "serve_requests"

    cell_id: str
    request_index: int
    prompt_id: str
    domain: str
    send_s: float  # since the unit started
    ttft_ms: float | None
    e2e_ms: float | None
    tpot_ms: float | None
    completion_tokens: int | None  # usage.completion_tokens (or the streamed events when the server gives none)
    events: int  # streamed chunks that carried text
    prompt_tokens: int | None
    draft_n: int | None
    draft_n_accepted: int | None
    predicted_ms: float | None
    prompt_ms: float | None
    error: str | None = None


@dataclass(frozen=True)
class TokenRow(Row):
    """``serve_tokens.csv``: one streamed text chunk: its time since the send and since the chunk before."""

    table: ClassVar[str] = "serve_tokens"

    cell_id: str
    request_index: int
    event_index: int
    t_ms: float
    gap_ms: float | None


@dataclass(frozen=True)
class StepCostRow(Row):
    """``serve_step_cost.csv``: what one server step cost in a synthetic unit, per context bucket.

    Every slot generates (``seqs``), each verifying ``tokens_per_seq`` tokens (1 + k) at about
    ``context_tokens``; ``step_ms`` is the median inter-token time there (every slot emits one token a
    step), ``_lo``/``_hi`` its 95% order-statistic CI. Rows with ``prompt_tokens`` give the unit's first
    step instead: ``seqs`` prompts of ``prompt_tokens`` in all, ``ttft_ms`` their median TTFT.
    """

    table: ClassVar[str] = "serve_step_cost"

    cell_id: str
    seqs: int
    tokens_per_seq: int
    context_tokens: float
    n_steps: int
    step_ms: float | None
    step_ms_lo: float | None
    step_ms_hi: float | None
    prompt_tokens: int | None = None
    ttft_ms: float | None = None


@dataclass(frozen=True)
class UnitRow(Row):
    """``serve_units.csv``: one finished unit: its identity, throughput, latency percentiles, counter deltas."""

    table: ClassVar[str] = "serve_units"

    cell_id: str
    config: str
    spec_type: str
    spec_k: int
    spec_ngram_n: int
    slots: int
    load: str
    concurrency: int | None
    rate_per_s: float | None
    repeat: int
    block: int
    synthetic: bool
    n_requests: int
    n_errors: int
    new_tokens: int
    duration_s: float
    completion_tokens: int
    throughput_tokens_per_s: float | None
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    tpot_p95_ms: float | None
    tpot_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p95_ms: float | None
    itl_p99_ms: float | None
    e2e_p50_ms: float | None
    e2e_p95_ms: float | None
    e2e_p99_ms: float | None
    metrics: bool  # /metrics answered (counter deltas below; else they are empty)
    drafts: int | None
    draft_tokens: int | None
    accepted_tokens: int | None
    accepted_per_pos: str | None  # space-separated counts per draft position (0-based)
    tokens_predicted: int | None
    n_decode: int | None
    prompt_tokens: int | None
    client_cpu_s: float
    client_cpu_share: float  # the load generator's CPU time / the unit's wall time (one core = 1.0)
    send_lag_p99_ms: float | None  # open loop: how late requests left against their schedule
    hardware: str
    # other processes' CPU during the unit (machine busy minus server and load generator), and the CPU the
    # hypervisor stole, in cores; None where unmeasurable (no /proc, or --url: the server is not ours)
    other_cpu_share: float | None = None
    steal_share: float | None = None



# python -m measure tree (measure/trees): a cell is one draft shape (a token tree, or a chain) against the baseline;
# its tree_cells row is written last and marks it finished
@dataclass(frozen=True)
class TreeCellRow(Row):
    """``tree_cells.csv``: one finished tree-run cell, a tree or a chain over every prompt and repeat."""

    table: ClassVar[str] = "tree_cells"

    cell_id: str
    draft: str
    loop: str  # "tree": one-forward tree verification (measure.trees); "chain": the chain loop (measure.decoding)
    shape: str  # the --tree value in canonical form, or "gamma=G" for a chain-loop cell
    depth: int
    topk: int
    budget: int
    domain: str
    n_prompts: int
    repeats: int
    new_tokens: int
    tokens_per_s_baseline: float
    tokens_per_s_speculative: float
    speedup: float | None  # ratio of mean tokens/s, with Fieller's 95% CI (measure.stats.speedup_ci)
    speedup_lo: float | None
    speedup_hi: float | None
    mean_accepted_per_round: float | None
    mean_nodes_per_round: float | None
    n_rounds: int
    outputs_identical: bool  # every speculative output equal to the baseline's, token for token
    synthetic: bool
    hardware: str | None = None
    # generations that diverged within the engine's near-tie tolerance, or beyond it (measure.engines.lossless)
    n_near_tie: int | None = None
    n_lossless_failures: int | None = None


@dataclass(frozen=True)
class TreeNodeRow(Row):
    """``tree_nodes.csv``: one drafted node of one tree round (breadth-first ``node``; ``parent`` −1: the root)."""

    table: ClassVar[str] = "tree_nodes"

    cell_id: str
    prompt_id: str
    repeat: int
    round: int
    node: int
    parent: int
    depth: int
    rank: int
    token: int
    accepted: int  # 1: on the accepted path


@dataclass(frozen=True)
class TreeRankRow(Row):
    """``tree_ranks.csv``: one position a tree round decided, counterfactually: the target's token at ``depth``
    (1 = the root's child) after the accepted path, and its ``rank`` among the ``candidates`` the draft ranked
    at its parent (−1: none of them). What any tree would have accepted there: a rank-``r`` child, if the tree
    has one, exactly when ``rank == r``."""

    table: ClassVar[str] = "tree_ranks"

    cell_id: str
    prompt_id: str
    repeat: int
    round: int
    depth: int
    rank: int
    candidates: int


#: Table → its row type, in the order of ``docs/RUN_FORMAT.md``.
ROW_TYPES: dict[str, type[Row]] = {t.table: t for t in (CellRow, GenerationRow, RoundRow, TokenLatencyRow, TraceRow,
                                                        CostTargetRow, CostDraftRow, ProfileRow, HeadSweepRow,
                                                        UnitRow, RequestRow, TokenRow, StepCostRow, TreeCellRow,
                                                        TreeNodeRow, TreeRankRow)}
