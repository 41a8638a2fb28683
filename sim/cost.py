"""Cost models: how long a draft step, a verification and a baseline step take.

Every time is in milliseconds (``_ms``), every length in tokens (``_tokens``).

One interface, :class:`CostModel`, three implementations:

* :class:`LeviathanCost` — the pure model of Leviathan et al. (2023): a draft
  step costs ``cost_ratio`` target steps, verifying γ+1 tokens costs one target
  step, no overhead. ``--cost-ratio`` on the CLI selects it.
* :class:`RooflineCost` — derived from architecture numbers and a hardware
  profile (see :mod:`presets`): max(bytes / bandwidth, FLOPs / peak) plus a
  fixed per-forward overhead; verify cost grows with tokens verified, context
  and batch.
* :class:`TabulatedCost` — measured or fitted numbers (what ``calibrate``
  writes and ``python -m sim --cost-model FILE`` reads): verify time per number
  of tokens verified at a reference context (no linearity assumed: on CPU a
  forward of 2–3 tokens can cost more than one of 4–8), linear context slopes,
  and a per-round overhead.

A round of speculative decoding costs
``gamma * draft_step_ms(ctx) + verify_ms(gamma + 1, ctx) + round_overhead_ms(gamma)``;
the autoregressive baseline costs ``target_step_ms(ctx)`` per token. A token
tree (:mod:`sim.trees`) drafts one forward per level over that level's parents:
:func:`draft_forward_ms` prices a draft forward over several tokens.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Protocol, runtime_checkable

import numpy as np

from presets.hardware import Hardware, RooflineForward
from presets.pairs import Pair
from sim.files import check_schema_version
from toolkit.jsonio import read_json

COST_MODEL_SCHEMA_VERSION = 1


def _check_nonneg(name: str, value: float) -> float:
    value = float(value)
    if math.isnan(value) or value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def _check_positive(name: str, value: float) -> float:
    value = float(value)
    if math.isnan(value) or value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return value


@runtime_checkable
class CostModel(Protocol):
    """Times of the pieces of a speculative-decoding round, in milliseconds."""

    def target_step_ms(self, context_tokens: float, batch: int = 1) -> float:
        """One autoregressive target forward (1 new token per sequence)."""
        ...

    def draft_step_ms(self, context_tokens: float, batch: int = 1) -> float:
        """One draft forward producing one draft token per sequence."""
        ...

    def verify_ms(self, n_tokens: int, context_tokens: float, batch: int = 1) -> float:
        """One target forward scoring ``n_tokens`` positions per sequence."""
        ...

    def round_overhead_ms(self, gamma: int) -> float:
        """Per-round time that is neither drafting nor verifying (sampling, rollback)."""
        ...

    def describe(self) -> dict:
        """JSON-able description."""
        ...


def draft_forward_ms(cost: CostModel, n_tokens: int, context_tokens: float, batch: int = 1) -> float:
    """One draft forward over ``n_tokens`` positions per sequence (a level of a token tree: its parents).

    A cost model with a multi-token draft time (``draft_forward_ms`` method:
    :class:`RooflineCost`) gives it; the others charge one draft step whatever
    ``n_tokens`` (Leviathan's model prices every forward the same; a fitted
    :class:`TabulatedCost` has timed the draft at one token only). The stated
    assumption: a small draft's forward over a few tokens is memory-bound, its
    weights read once. ``n_tokens = 1`` is :meth:`CostModel.draft_step_ms` in every model.
    """
    if int(n_tokens) != n_tokens or n_tokens < 1:
        raise ValueError(f"a draft forward needs an integer number of tokens >= 1, got {n_tokens}")
    forward = getattr(cost, "draft_forward_ms", None)
    if forward is None:
        return cost.draft_step_ms(context_tokens, batch)
    return forward(int(n_tokens), context_tokens, batch)


def round_time_ms(cost: CostModel, gamma: int, context_tokens: float, batch: int = 1) -> float:
    """Wall time of one speculative round at draft length ``gamma``."""
    return (
        gamma * cost.draft_step_ms(context_tokens, batch)
        + cost.verify_ms(gamma + 1, context_tokens, batch)
        + cost.round_overhead_ms(gamma)
    )


@dataclass(frozen=True)
class LeviathanCost:
    """Draft step = ``cost_ratio`` × target step; verify = one target step; no overhead."""

    cost_ratio: float
    target_ms: float = 1.0

    def __post_init__(self) -> None:
        _check_nonneg("cost ratio", self.cost_ratio)
        _check_positive("target step time (ms)", self.target_ms)

    def target_step_ms(self, context_tokens: float, batch: int = 1) -> float:
        return self.target_ms

    def draft_step_ms(self, context_tokens: float, batch: int = 1) -> float:
        return self.cost_ratio * self.target_ms

    def verify_ms(self, n_tokens: int, context_tokens: float, batch: int = 1) -> float:
        return self.target_ms

    def round_overhead_ms(self, gamma: int) -> float:
        return 0.0

    def describe(self) -> dict:
        return {"kind": "leviathan", "cost_ratio": self.cost_ratio, "target_ms": self.target_ms}


class ForwardCost(Protocol):
    """A model on a device: the time of one forward (see ``presets.roofline``)."""

    def forward_ms(self, n_tokens: int, context_tokens: float, batch: int = 1) -> float: ...

    def describe(self) -> dict: ...


@dataclass(frozen=True)
class RooflineCost:
    """Costs from two per-model forward-time functions (roofline estimates from presets)."""

    draft: ForwardCost
    target: ForwardCost
    overhead_ms: float = 0.0

    def __post_init__(self) -> None:
        _check_nonneg("round overhead (ms)", self.overhead_ms)

    def target_step_ms(self, context_tokens: float, batch: int = 1) -> float:
        return self.target.forward_ms(1, context_tokens, batch)

    def draft_step_ms(self, context_tokens: float, batch: int = 1) -> float:
        return self.draft.forward_ms(1, context_tokens, batch)

    def verify_ms(self, n_tokens: int, context_tokens: float, batch: int = 1) -> float:
        return self.target.forward_ms(n_tokens, context_tokens, batch)

    def draft_forward_ms(self, n_tokens: int, context_tokens: float, batch: int = 1) -> float:
        """The draft's roofline forward over ``n_tokens`` positions (a token-tree level).

        Medusa's heads all read the target's last hidden state once (no draft
        tokens go back in), so a level of any width costs one head's pass.
        """
        if getattr(getattr(self.draft, "model", None), "kind", None) == "medusa":
            n_tokens = 1
        return self.draft.forward_ms(n_tokens, context_tokens, batch)

    def round_overhead_ms(self, gamma: int) -> float:
        return self.overhead_ms

    def cost_ratio(self, context_tokens: float, batch: int = 1) -> float:
        """c = draft step / target step at this context."""
        return self.draft_step_ms(context_tokens, batch) / self.target_step_ms(context_tokens, batch)

    def describe(self) -> dict:
        return {
            "kind": "roofline",
            "draft": self.draft.describe(),
            "target": self.target.describe(),
            "overhead_ms": self.overhead_ms,
        }


def pair_roofline_cost(pair: Pair, hardware: Hardware) -> RooflineCost:
    """The roofline cost of a preset pair on a device: both forwards on the roofline, no round overhead,
    except a draft head's once-per-round part (EAGLE-3's fusing FC), priced on the same roofline at batch 1."""
    overhead_ms = 0.0
    if pair.head is not None and pair.head.round_params():
        flops, bytes_moved = pair.head.round_flops_and_bytes(1, hardware.bytes_per_param)
        overhead_ms = hardware.roofline_ms(flops, bytes_moved)
    return RooflineCost(RooflineForward(pair.draft, hardware), RooflineForward(pair.target, hardware), overhead_ms)


@dataclass(frozen=True)
class TabulatedCost:
    """Measured/fitted costs.

    * ``verify_ms_by_tokens[n]``: target forward time for ``n`` tokens at
      ``reference_context_tokens``; ``n = 1`` is the baseline step. Between
      tabulated ``n`` the time is interpolated linearly, past the largest it
      is extrapolated from the last two points.
    * ``target_context_ms_per_token``: added per token of context beyond the
      reference (may be negative for ``context < reference``).
      ``context_ms_per_token_by_tokens`` (optional) gives that slope per ``n``
      instead (interpolated between tabulated ``n``, the last one beyond): a
      forward's context cost need not be the same for 1 and for 8 tokens.
    * ``draft_step_ms`` at the reference context, plus ``draft_context_ms_per_token``.
    * ``round_overhead_ms`` + ``overhead_per_draft_token_ms`` × γ per round.
    * ``batch_exponent``: forward time × batch**exponent (0 = batching is free,
      1 = linear); only used by the serving simulation.
    """

    verify_ms_by_tokens: Mapping[int, float]
    draft_step_ms_ref: float
    reference_context_tokens: float = 0.0
    target_context_ms_per_token: float = 0.0
    draft_context_ms_per_token: float = 0.0
    round_overhead_ms_base: float = 0.0
    overhead_per_draft_token_ms: float = 0.0
    batch_exponent: float = 0.0
    metadata: Mapping[str, Any] = field(default_factory=dict)
    context_ms_per_token_by_tokens: Mapping[int, float] | None = None

    def __post_init__(self) -> None:
        if self.context_ms_per_token_by_tokens is not None:
            slopes = {int(k): float(v) for k, v in dict(self.context_ms_per_token_by_tokens).items()}
            if not slopes or min(slopes) < 1:
                raise ValueError("context_ms_per_token_by_tokens needs token counts >= 1")
            object.__setattr__(self, "context_ms_per_token_by_tokens", dict(sorted(slopes.items())))
        table = {int(k): float(v) for k, v in dict(self.verify_ms_by_tokens).items()}
        if 1 not in table:
            raise ValueError("verify_ms_by_tokens must include n=1 (the baseline target step)")
        for n, v in table.items():
            if n < 1:
                raise ValueError(f"verify_ms_by_tokens has token count {n}; counts must be >= 1")
            _check_positive(f"verify time for {n} tokens (ms)", v)
        object.__setattr__(self, "verify_ms_by_tokens", dict(sorted(table.items())))
        _check_positive("draft step time (ms)", self.draft_step_ms_ref)
        _check_nonneg("reference context (tokens)", self.reference_context_tokens)
        _check_nonneg("round overhead (ms)", self.round_overhead_ms_base)
        _check_nonneg("batch exponent", self.batch_exponent)

    def _n_table(self) -> tuple[np.ndarray, np.ndarray]:
        ns = np.fromiter(self.verify_ms_by_tokens.keys(), dtype=float)
        ts = np.fromiter(self.verify_ms_by_tokens.values(), dtype=float)
        return ns, ts

    def _verify_ref_ms(self, n_tokens: int) -> float:
        ns, ts = self._n_table()
        if n_tokens <= ns[-1] or ns.size == 1:
            if ns.size == 1:
                return float(ts[0]) if n_tokens == ns[0] else float(ts[0] * n_tokens / ns[0])
            return float(np.interp(n_tokens, ns, ts))
        slope = (ts[-1] - ts[-2]) / (ns[-1] - ns[-2])
        return float(ts[-1] + max(slope, 0.0) * (n_tokens - ns[-1]))

    def _batch_factor(self, batch: int) -> float:
        return float(batch) ** self.batch_exponent

    def target_step_ms(self, context_tokens: float, batch: int = 1) -> float:
        return self.verify_ms(1, context_tokens, batch)

    def draft_step_ms(self, context_tokens: float, batch: int = 1) -> float:
        base = self.draft_step_ms_ref + self.draft_context_ms_per_token * (
            context_tokens - self.reference_context_tokens
        )
        return max(base, 1e-6) * self._batch_factor(batch)

    def context_slope(self, n_tokens: int) -> float:
        """ms per token of context for an ``n_tokens`` forward."""
        if self.context_ms_per_token_by_tokens is None:
            return self.target_context_ms_per_token
        ns = np.fromiter(self.context_ms_per_token_by_tokens.keys(), dtype=float)
        ss = np.fromiter(self.context_ms_per_token_by_tokens.values(), dtype=float)
        return float(np.interp(n_tokens, ns, ss))

    def verify_ms(self, n_tokens: int, context_tokens: float, batch: int = 1) -> float:
        base = self._verify_ref_ms(n_tokens) + self.context_slope(n_tokens) * (
            context_tokens - self.reference_context_tokens
        )
        return max(base, 1e-6) * self._batch_factor(batch)

    def round_overhead_ms(self, gamma: int) -> float:
        return max(self.round_overhead_ms_base + self.overhead_per_draft_token_ms * gamma, 0.0)

    def describe(self) -> dict:
        d = asdict(self)
        d["verify_ms_by_tokens"] = {str(k): v for k, v in self.verify_ms_by_tokens.items()}
        if self.context_ms_per_token_by_tokens is None:
            d.pop("context_ms_per_token_by_tokens")
        else:
            d["context_ms_per_token_by_tokens"] = {str(k): v for k, v in self.context_ms_per_token_by_tokens.items()}
        d["metadata"] = dict(self.metadata)
        return {"kind": "tabulated", "schema_version": COST_MODEL_SCHEMA_VERSION, **d}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.describe(), indent=2) + "\n")


_TABULATED_NUMBERS = ("draft_step_ms_ref", "reference_context_tokens", "target_context_ms_per_token",
                      "draft_context_ms_per_token", "round_overhead_ms_base", "overhead_per_draft_token_ms",
                      "batch_exponent")
_TABULATED_FIELDS = ("kind", "schema_version", "verify_ms_by_tokens", "context_ms_per_token_by_tokens",
                     "metadata", *_TABULATED_NUMBERS)


def _number_field(d: Mapping[str, Any], key: str, default: float | None = None) -> float:
    """A finite number from ``d[key]``; a missing required key or a wrong type is a one-line ``ValueError``."""
    if key not in d:
        if default is None:
            raise ValueError(f"lacks the field {key!r}")
        return default
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"field {key!r} must be a finite number, got {v!r}")
    return float(v)


def _token_table(d: Mapping[str, Any], key: str) -> dict[int, float]:
    """``{"1": ms, "4": ms, ...}`` as ``{1: ms, 4: ms}``; keys must be whole token counts >= 1."""
    v = d[key]
    if not isinstance(v, Mapping) or not v:
        raise ValueError(f"field {key!r} must be a non-empty object of token count -> ms, got {v!r}")
    out = {}
    for k, x in v.items():
        try:
            n = int(k)
        except (TypeError, ValueError):
            raise ValueError(f"field {key!r} has key {k!r}; keys must be token counts (1, 2, ...)") from None
        out[n] = _number_field(v, k)
    return out


#: Why each number of a tabulated model has its physical range (:func:`check_physical`).
_NONNEG_WHY = {
    "target_context_ms_per_token": "a target forward would get faster with a longer context",
    "draft_context_ms_per_token": "a draft step would get faster with a longer context",
    "context_ms_per_token_by_tokens": "a target forward would get faster with a longer context",
    "round_overhead_ms_base": "a round would take less time than its forwards",
    "overhead_per_draft_token_ms": "each drafted token would take time off the round",
    "batch_exponent": "a larger batch would take less time than one sequence",
    "reference_context_tokens": "a context is a number of tokens",
}


def _at_context_0(ms: float, slope: float, ref: float, key: str, what: str) -> None:
    """``ms`` at ``ref`` tokens of context less ``slope`` per token must stay positive down to context 0."""
    if ms - slope * ref <= 0:
        raise ValueError(f"field {key!r}: {what} is {ms:.4g} ms at {ref:g} tokens of context and its context slope "
                         f"{slope:.4g} ms/token makes it {ms - slope * ref:.4g} ms at context 0: an impossible model "
                         "(a forward takes a positive time)")


def check_physical(fields: Mapping[str, Any]) -> None:
    """A tabulated model's numbers (the keyword arguments of :class:`TabulatedCost`) in their physical ranges.

    Every time positive, at every context from 0 up (the tabulated times and
    the draft step, less their context slopes down to context 0); every cost
    per context token, the round overhead and the batch exponent non-negative.
    The first number out of range is a one-line ``ValueError`` naming its field
    and why: such a model would price a forward at no time (a speedup of
    ``0.000x over 1e9 tok/s``) or make a longer context faster.
    """
    for key, why in _NONNEG_WHY.items():
        values = fields.get(key)
        table = values if isinstance(values, Mapping) else {None: 0.0 if values is None else values}
        for n, v in table.items():
            if v < 0:
                at = f" for {n} token(s)" if n is not None else ""
                raise ValueError(f"field {key!r} is {v:.4g}{at}: negative, so {why}; an impossible model "
                                 "(refit it with python -m calibrate, whose fits are bounded, or write a value >= 0)")
    ref = float(fields.get("reference_context_tokens", 0.0))
    slopes = fields.get("context_ms_per_token_by_tokens")
    for n, ms in fields["verify_ms_by_tokens"].items():
        if ms <= 0:
            raise ValueError(f"field 'verify_ms_by_tokens' gives {ms:.4g} ms for {n} token(s): an impossible model "
                             "(a forward takes a positive time)")
        slope = (float(np.interp(n, list(slopes), list(slopes.values()))) if slopes
                 else float(fields.get("target_context_ms_per_token", 0.0)))
        _at_context_0(ms, slope, ref, "verify_ms_by_tokens", f"the forward of {n} token(s)")
    draft = float(fields["draft_step_ms_ref"])
    if draft <= 0:
        raise ValueError(f"field 'draft_step_ms_ref' is {draft:.4g} ms: an impossible model (a draft step takes a "
                         "positive time)")
    _at_context_0(draft, float(fields.get("draft_context_ms_per_token", 0.0)), ref, "draft_step_ms_ref",
                  "the draft step")


def cost_model_from_dict(d: Any) -> CostModel:
    """Rebuild a cost model from its ``describe()`` dict (``leviathan`` or ``tabulated``).

    Every problem — not an object, an unknown kind or field, a missing field, a
    wrong type, NaN/inf, a newer ``schema_version``, a number out of its
    physical range (:func:`check_physical`) — is a one-line ``ValueError``
    naming the field.
    """
    if not isinstance(d, Mapping):
        raise ValueError(f"must be a JSON object with a 'kind', got {type(d).__name__}")
    check_schema_version(d, COST_MODEL_SCHEMA_VERSION, "cost model")
    kind = d.get("kind")
    if kind == "leviathan":
        ratio, target_ms = _number_field(d, "cost_ratio"), _number_field(d, "target_ms", 1.0)
        if ratio < 0 or target_ms <= 0:
            key, v = ("cost_ratio", ratio) if ratio < 0 else ("target_ms", target_ms)
            raise ValueError(f"field {key!r} is {v:g}: an impossible model (a forward takes a positive time)")
        return LeviathanCost(ratio, target_ms)
    if kind != "tabulated":
        raise ValueError(f"unknown cost model kind {kind!r}; valid: 'leviathan', 'tabulated'")
    unknown = sorted(set(d) - set(_TABULATED_FIELDS))
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r} in a tabulated cost model; valid: {', '.join(_TABULATED_FIELDS)}")
    if "verify_ms_by_tokens" not in d:
        raise ValueError("lacks the field 'verify_ms_by_tokens'")
    fields: dict[str, Any] = {k: _number_field(d, k) for k in _TABULATED_NUMBERS if k in d or k == "draft_step_ms_ref"}
    fields["verify_ms_by_tokens"] = _token_table(d, "verify_ms_by_tokens")
    if d.get("context_ms_per_token_by_tokens") is not None:
        fields["context_ms_per_token_by_tokens"] = _token_table(d, "context_ms_per_token_by_tokens")
    meta = d.get("metadata", {})
    if not isinstance(meta, Mapping):
        raise ValueError(f"field 'metadata' must be an object, got {meta!r}")
    check_physical(fields)
    return TabulatedCost(metadata=dict(meta), **fields)


def load_cost_model(path: str | Path) -> CostModel:
    """Read a cost-model JSON file (as written by ``calibrate``); any problem is one line naming the file.

    A ``calibration.json`` works too: its ``cost_model`` section is read.
    """
    what = f"cost model file {str(path)!r}"
    d = read_json(path, "cost model file")
    if isinstance(d, Mapping) and "cost_model" in d:  # a calibration file holding several sections
        d = d["cost_model"]
    try:
        return cost_model_from_dict(d)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None


#: The metadata ``source`` of the cost models specscope writes (a prefix), what each is, whether it was measured
_KNOWN_SOURCES = (
    ("calibrate", "fitted by python -m calibrate to measured timings", True),
    ("llama-bench", "measured by llama-bench", True),
)


def cost_provenance(cost: CostModel | Mapping[str, Any]) -> tuple[str, bool]:
    """Where a cost model comes from, in words, and whether its numbers were measured (or fitted to timings).

    A tabulated model is what its metadata ``source`` says only when specscope
    wrote it (``calibrate…``, ``llama-bench``); a file with no source, or
    one specscope does not write, is *supplied by the user*: taken as given,
    never called measured. Leviathan's model and a roofline are assumed.
    ``cost``: a model or its ``describe()`` dict.
    """
    d = cost if isinstance(cost, Mapping) else cost.describe()
    if d.get("kind") == "leviathan":
        return f"assumed: Leviathan et al.'s model, a draft step = {d['cost_ratio']:g} x a target step", False
    if d.get("kind") == "roofline":
        return "assumed: a roofline of the models on a hardware profile", False
    src = str((d.get("metadata") or {}).get("source") or "")
    for prefix, text, measured in _KNOWN_SOURCES:
        if src.startswith(prefix):
            return text + (f" ({src})" if src != prefix else ""), measured
    said = f"its metadata names the source {src!r}, which specscope did not write" if src else "it records no source"
    return f"supplied by the user ({said}): taken as given, not measured", False
