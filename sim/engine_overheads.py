"""The engine overheads fitted on published results, shipped as data, and a cost model that pays them.

What a serving engine spends per speculative round beyond the kernels (the
draft loop's sampling and launches, the accept/reject bookkeeping SGLang ran
without its overlap scheduler) is fitted by ``python -m sim validate`` on the
fit half of the published table (:mod:`sim.validate`: the overhead model with
the least leave-one-out error, per cost source) and written with
``--write-overheads`` to ``sim/data/engine_overheads.toml``. The file names
the model, its values, the rows it was fitted on, its leave-one-out and
held-out median |error| and the SHA-256 of the table it came from (a test
holds it to the shipped table, so an edited table without a refit fails).

``python -m sim``, ``sim check``, ``sim tree`` and ``calibrate ingest`` price a
GPU round through the step-cost seam and then add the fitted overhead of the source that priced
the target (:class:`WithEngineOverhead`: the per-step term on every draft
forward, the per-round term of a chain's or a tree's round, :func:`for_shape`),
saying so in one line; ``--engine-overhead none`` leaves it out. An engine
with no per-round term of its own (one no fitted row ran on) pays the
per-draft-step term only, and the line says that.
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from sim.cost import CostModel
from sim.stepcost import EngineOverheads, EngineRoundOverhead, StepCost

OVERHEADS_FILE = Path(__file__).with_name("data") / "engine_overheads.toml"
SOURCES = ("kernels", "roofline")
ENGINE_OVERHEADS = ("fitted", "none")
"""The ``--engine-overhead`` choices of every command that prices GPU rounds through the seam."""
ENGINE_OVERHEAD_HELP = ("fitted (default: add what the engine spends per round beyond the kernels, as python -m sim "
                        "validate fitted it on published results; sim/data/engine_overheads.toml) or none")


@dataclass(frozen=True)
class FittedOverhead:
    """One cost source's adopted overhead model and where it came from (ms). ``per_round_ms`` holds a per-round
    term per round kind (an engine, or ``"<engine> tree"``); ``any_round_ms`` is what a kind not named pays (a
    model with one per-round term for every engine puts it there)."""

    source: str
    model: str
    per_draft_step_ms: float = 0.0
    per_round_ms: tuple[tuple[str, float], ...] = ()
    any_round_ms: float = 0.0
    per_extra_sequence_ms: float = 0.0
    fit_rows: int = 0
    leave_one_out_error: float | None = None
    held_out_error: float | None = None
    table_sha256: str = ""

    @classmethod
    def of(cls, source: str, model: str, o: float | EngineRoundOverhead | EngineOverheads, **where: object) -> FittedOverhead:
        """The record of a fitted overhead of any model shape (:data:`sim.validate.Overhead`)."""
        if isinstance(o, EngineOverheads):
            return cls(source, model, o.per_draft_step_ms, o.per_round_ms, **where)  # type: ignore[arg-type]
        if isinstance(o, EngineRoundOverhead):
            return cls(source, model, o.per_draft_step_ms, (), o.per_round_ms, o.per_extra_sequence_ms,
                       **where)  # type: ignore[arg-type]
        return cls(source, model, float(o), **where)  # type: ignore[arg-type]

    def for_engine(self, engine: str, tree: bool = False) -> EngineRoundOverhead:
        """What a round of ``engine`` (a tree round where ``tree``) pays (:meth:`EngineOverheads.for_engine`)."""
        return EngineOverheads(self.per_draft_step_ms, self.per_round_ms, self.any_round_ms,
                               self.per_extra_sequence_ms).for_engine(engine, tree)

    def names_engine(self, engine: str) -> bool:
        """Whether a per-round term was fitted for ``engine`` (or one holds for every engine)."""
        return engine in dict(self.per_round_ms) or self.any_round_ms > 0 or not self.per_round_ms


def table_sha256(path: Path) -> str:
    """The SHA-256 of a published table's bytes: which table a fitted overhead came from."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _toml_key(key: str) -> str:
    return key if key.replace("_", "").isalnum() else f'"{key}"'


def write_overheads(path: Path, fitted: dict[str, FittedOverhead]) -> None:
    """Write one table per source (TOML, by hand: the values are numbers and short strings)."""
    lines = ["# The engine overheads python -m sim validate --write-overheads fitted on the published table's fit rows",
             "# (sim/engine_overheads.py); written by the command, not by hand.", ""]
    for source in SOURCES:
        f = fitted[source]
        rounds = ", ".join(f"{_toml_key(k)} = {v:.4f}" for k, v in f.per_round_ms)
        lines += [f"[{source}]", f'model = "{f.model}"', f"per_draft_step_ms = {f.per_draft_step_ms:.4f}",
                  f"per_round_ms = {{ {rounds} }}" if rounds else "per_round_ms = {}",
                  f"any_round_ms = {f.any_round_ms:.4f}", f"per_extra_sequence_ms = {f.per_extra_sequence_ms:.4f}",
                  f"fit_rows = {f.fit_rows}"]
        lines += [f"{name} = {value:.6f}" for name, value in (("leave_one_out_error", f.leave_one_out_error),
                                                               ("held_out_error", f.held_out_error))
                  if value is not None]
        lines += [f'table_sha256 = "{f.table_sha256}"', ""]
    path.write_text("\n".join(lines))


def load_overheads(path: Path = OVERHEADS_FILE) -> dict[str, FittedOverhead]:
    """The fitted overheads per source; a missing or malformed file is one ``ValueError`` line naming it."""
    try:
        doc = tomllib.loads(path.read_text())
        out = {}
        for source in SOURCES:
            t = doc[source]
            out[source] = FittedOverhead(
                source, str(t["model"]), float(t["per_draft_step_ms"]),
                tuple((str(k), float(v)) for k, v in dict(t["per_round_ms"]).items()), float(t["any_round_ms"]),
                float(t["per_extra_sequence_ms"]), int(t["fit_rows"]),
                None if "leave_one_out_error" not in t else float(t["leave_one_out_error"]),
                None if "held_out_error" not in t else float(t["held_out_error"]), str(t["table_sha256"]))
        return out
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"engine overheads {path}: {exc}; rewrite it with python -m sim validate "
                         "--write-overheads") from None


@dataclass(frozen=True)
class WithEngineOverhead:
    """A seam cost plus an engine's fitted overhead: the per-draft-step term on every draft forward (a chain's γ
    steps, a tree's levels: what ``sim validate`` charges), the per-round term of the round's kind (a chain's,
    or the engine's tree term where ``tree``) and the per-sequence term once per round."""

    cost: StepCost
    fitted: FittedOverhead
    engine: str
    batch: int = 1
    tree: bool = False

    @property
    def overhead(self) -> EngineRoundOverhead:
        """What a round of this engine and kind pays."""
        return self.fitted.for_engine(self.engine, self.tree)

    def shaped(self, tree: bool) -> WithEngineOverhead:
        """The same cost for a round of the other kind (a token tree, or a chain)."""
        return replace(self, tree=tree)

    def target_step_ms(self, context_tokens: float, batch: int = 1) -> float:
        return self.cost.target_step_ms(context_tokens, batch)

    def draft_step_ms(self, context_tokens: float, batch: int = 1) -> float:
        return self.cost.draft_step_ms(context_tokens, batch) + self.overhead.per_draft_step_ms

    def verify_ms(self, n_tokens: int, context_tokens: float, batch: int = 1) -> float:
        return self.cost.verify_ms(n_tokens, context_tokens, batch)

    def verify_extend_ms(self, n_tokens: int, extend_tokens: int, context_tokens: float, batch: int = 1) -> float:
        return self.cost.verify_extend_ms(n_tokens, extend_tokens, context_tokens, batch)

    def draft_forward_ms(self, n_tokens: int, context_tokens: float, batch: int = 1) -> float:
        return self.cost.draft_forward_ms(n_tokens, context_tokens, batch) + self.overhead.per_draft_step_ms

    def prefill_ms(self, prompt_tokens: int, batch: int = 1) -> float:
        return self.cost.prefill_ms(prompt_tokens, batch)

    def round_overhead_ms(self, gamma: int) -> float:
        """The seam's own round overhead, the kind's per-round term and the per-sequence one: the engine's round
        of no draft steps (the per-step term is on the draft forwards)."""
        return self.cost.round_overhead_ms(gamma) + self.overhead.round_ms(0, self.batch)

    def line(self) -> str:
        """The one line saying what is added, from where, and how to leave it out."""
        f = self.fitted
        chain, tree = f.for_engine(self.engine), f.for_engine(self.engine, True)
        parts = [f"{chain.per_draft_step_ms:.2f} ms per draft step"]
        if chain.per_round_ms or tree.per_round_ms:
            parts.append(f"{chain.per_round_ms:.2f} ms per round" if tree.per_round_ms == chain.per_round_ms
                         else f"{chain.per_round_ms:.2f} ms per chain round ({tree.per_round_ms:.2f} per tree round)")
        if chain.per_extra_sequence_ms:
            parts.append(f"{chain.per_extra_sequence_ms:.2f} ms per sequence beyond the first")
        own = "" if f.names_engine(self.engine) else (f"; no fitted row ran on {self.engine}, so no per-round "
                                                      "term of its own")
        err = "" if f.held_out_error is None else f", held-out median |error| {100 * f.held_out_error:.1f}%"
        return (f"engine overhead: {' + '.join(parts)} ({self.engine}, {f.source} source; the '{f.model}' model "
                f"python -m sim validate fitted on {f.fit_rows} published rows{err}{own}; --engine-overhead none "
                "leaves it out)")

    def describe(self) -> dict:
        return {**self.cost.describe(), "engine_overhead": self.line()}


def with_fitted_overhead(cost: StepCost, engine: str, batch: int = 1, tree: bool = False,
                         path: Path = OVERHEADS_FILE) -> WithEngineOverhead:
    """``cost`` plus the overhead fitted for the source that priced its target (a round of ``engine``; a token
    tree's where ``tree``)."""
    fitted = load_overheads(path)[cost.target_side.source if cost.target_side.source in SOURCES else "roofline"]
    return WithEngineOverhead(cost, fitted, engine, batch, tree)


def engine_cost(cost: StepCost, asked: str, engine: str, batch: int = 1) -> CostModel:
    """What a command prices a GPU round with: ``cost`` plus the engine's fitted overhead
    (:func:`with_fitted_overhead`) unless ``--engine-overhead none`` (``asked``) or the seam priced a CPU."""
    if asked == "none" or cost.setup.get("hardware") == "cpu":
        return cost
    return with_fitted_overhead(cost, engine, batch)


def for_shape(cost: CostModel, tree: bool) -> CostModel:
    """``cost`` for a round of a chain or of a token tree: a cost with an engine overhead takes its kind's
    per-round term; any other cost model is returned as it is."""
    return cost.shaped(tree) if isinstance(cost, WithEngineOverhead) else cost
