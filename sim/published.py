"""The table of published speculative-decoding results: what engines, papers and blogs measured.

Each row of ``sim/data/published.toml`` (``[[result]]`` tables) is one
:class:`PublishedResult`: a target model (Hugging Face id), a draft (its kind
and, where it is a model or a head, its repository), the GPU and how many,
the engine and precision, the batch (or concurrency) and the draft shape (a
chain of ``gamma`` steps, or a tree: ``tree_topk`` and
``tree_num_draft_tokens``), the published acceptance with its definition, the
published outcome (a speedup, tokens/s or ms per token, with and without
speculation), and where it was read: ``source`` (title and URL or repository
path) and ``cells`` (the exact table cells or lines).

Acceptance definitions (``acceptance_kind``):

* ``tau_incl_bonus``: mean tokens emitted per verification step, the bonus
  token included (1.0 without speculation; SGLang's ``accept_length``,
  Spec-Bench's τ, vLLM's "mean acceptance length").
* ``tau_excl_bonus``: mean draft tokens accepted per verification step
  (the above minus one).
* ``alpha_per_token``: a per-token acceptance probability.
* ``unknown``: the source does not say whether the bonus token counts.

Borrowed acceptance: a row whose source publishes no acceptance may name, in
``acceptance_from``, another row of the *same* source (the same ``source``
text) measured at batch 1 with the same target, draft (kind and model), chain
or tree shape, dataset and temperature, that does publish one: the acceptance
of speculative decoding is a property of the target, the draft and the text,
not of how many sequences share the GPU. The loader copies the lender's
``acceptance``, ``acceptance_max`` and ``acceptance_kind`` into the row and
keeps ``acceptance_from`` so every report can say the value was borrowed.

:func:`load_published` reads and validates the file: an unknown field, a
value of the wrong type, a number out of range, an unknown choice or a
repeated id is a one-line ``ValueError`` naming the row and the field. The
module is torch-free; ``python -m sim validate`` predicts every row.
"""

from __future__ import annotations

import tomllib
from dataclasses import MISSING, dataclass, fields, replace
from pathlib import Path
from typing import Any, get_args, get_type_hints

from sim.acceptance import expected_tokens_iid

PUBLISHED_FILE = Path(__file__).with_name("data") / "published.toml"

DRAFT_KINDS = ("eagle", "eagle2", "eagle3", "mtp", "medusa", "hydra", "model", "ngram", "suffix", "lookahead",
               "pld", "rest", "sps", "none")
"""Kinds of draft: EAGLE heads (1, 2, 3), MTP modules, Medusa/Hydra heads, a separate draft model, n-gram /
suffix / prompt lookup (``pld``), lookahead decoding, REST retrieval, Spec-Bench's ``sps`` (a small model)."""
HARDWARE = ("a100", "a10g", "h100", "h200", "h20", "b200", "b300", "gb200", "l40s", "l4", "mi300x", "mi325x",
            "mi355x", "rtx3090", "rtx4090", "t4")
ENGINES = ("sglang", "vllm", "trtllm", "hf", "spec-bench", "llama.cpp", "research")
"""``hf`` = Hugging Face transformers; ``spec-bench`` = Spec-Bench's harness (PyTorch, transformers models);
``research`` = a paper's or a company's own implementation (said in ``note``)."""
DTYPES = ("fp32", "fp16", "bf16", "fp8", "nvfp4", "int8", "int4")
ACCEPTANCE_KINDS = ("tau_incl_bonus", "tau_excl_bonus", "alpha_per_token", "unknown")
BATCH_KINDS = ("batch", "concurrency", "request_rate")
"""``batch``: B sequences decoding together (offline, lockstep); ``concurrency``: at most B requests in flight;
``request_rate``: requests arrive at ``request_rate_qps`` per second (``batch`` is then ``None``, not stated)."""
TOK_S_KINDS = ("total", "per_request")
"""Whether a tokens/s figure is the whole server's output throughput or one request's decoding speed."""
SPEEDUP_METRICS = ("throughput", "per_token_latency", "e2e_latency")
"""What a stated ``speedup`` is a ratio of: output tokens/s (or wall time for the same tokens), time per output
token, or end-to-end request latency (which includes the prefill)."""

_CHOICES: dict[str, tuple[str, ...]] = {
    "draft_kind": DRAFT_KINDS, "hardware": HARDWARE, "engine": ENGINES, "dtype": DTYPES,
    "acceptance_kind": ACCEPTANCE_KINDS, "batch_kind": BATCH_KINDS, "tok_s_kind": TOK_S_KINDS,
    "speedup_metric": SPEEDUP_METRICS,
}
_POSITIVE = ("gpus", "tp", "batch", "request_rate_qps", "gamma", "tree_topk", "tree_num_draft_tokens", "input_tokens", "output_tokens",
             "speedup", "baseline_tok_s", "spec_tok_s", "baseline_ms_per_token", "spec_ms_per_token")
_TAU_MAX = 64.0


@dataclass(frozen=True)
class PublishedResult:
    """One published measurement of speculative decoding (a row of ``sim/data/published.toml``).

    ``None`` means the source does not state the value (``hardware`` included: such a row cannot be
    priced). ``acceptance_max`` is the top of a range the source gives instead of one value
    (``acceptance`` is then its bottom). ``gamma`` is the number of chained draft steps
    (SGLang's ``speculative_num_steps``, vLLM's ``num_speculative_tokens``, the number of MTP layers); a
    tree adds ``tree_topk`` (branching per step) and ``tree_num_draft_tokens`` (tokens verified per
    round, the root included, as SGLang counts). ``speedup`` is the source's own figure; tokens/s and
    ms/token are the source's figures for the plain (``baseline_*``) and speculative (``spec_*``) runs.
    ``acceptance_from`` names the batch-1 row of the same source whose acceptance this row borrowed (the
    acceptance fields then hold the lender's values, copied by :func:`load_published`).
    """

    id: str
    target: str
    draft_kind: str
    engine: str
    source: str
    cells: str
    draft_model: str | None = None
    hardware: str | None = None
    gpus: int | None = None
    tp: int | None = None
    engine_version: str | None = None
    dtype: str | None = None
    batch: int | None = 1
    batch_kind: str = "batch"
    request_rate_qps: float | None = None
    gamma: int | None = None
    tree_topk: int | None = None
    tree_num_draft_tokens: int | None = None
    dataset: str | None = None
    temperature: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    acceptance: float | None = None
    acceptance_max: float | None = None
    acceptance_kind: str | None = None
    speedup: float | None = None
    speedup_metric: str | None = None
    baseline_tok_s: float | None = None
    spec_tok_s: float | None = None
    tok_s_kind: str | None = None
    baseline_ms_per_token: float | None = None
    spec_ms_per_token: float | None = None
    note: str | None = None
    acceptance_from: str | None = None

    def __post_init__(self) -> None:
        _check_row(self)

    @property
    def tau_incl_bonus(self) -> float | None:
        """The acceptance as τ with the bonus token (the middle of :attr:`tau_incl_bonus_range`)."""
        span = self.tau_incl_bonus_range
        return None if span is None else (span[0] + span[1]) / 2

    @property
    def tau_incl_bonus_range(self) -> tuple[float, float] | None:
        """The published acceptance (or its range) as τ with the bonus token, where the source's definition
        allows the conversion: ``tau_excl_bonus`` + 1; ``alpha_per_token`` with a chain length under the
        i.i.d. model, τ = (1 − α^(γ+1)) / (1 − α); ``None`` for ``unknown`` or no acceptance."""
        if self.acceptance is None:
            return None
        values = (self.acceptance, self.acceptance if self.acceptance_max is None else self.acceptance_max)
        if self.acceptance_kind == "tau_incl_bonus":
            return values
        if self.acceptance_kind == "tau_excl_bonus":
            return values[0] + 1.0, values[1] + 1.0
        if self.acceptance_kind == "alpha_per_token" and self.gamma is not None:
            return (float(expected_tokens_iid(values[0], self.gamma)),
                    float(expected_tokens_iid(values[1], self.gamma)))
        return None

    @property
    def published_speedup(self) -> float | None:
        """The source's speedup, else the ratio of its tokens/s (or ms per token) figures."""
        if self.speedup is not None:
            return self.speedup
        if self.baseline_tok_s is not None and self.spec_tok_s is not None:
            return self.spec_tok_s / self.baseline_tok_s
        if self.baseline_ms_per_token is not None and self.spec_ms_per_token is not None:
            return self.baseline_ms_per_token / self.spec_ms_per_token
        return None

    @property
    def baseline_step_ms(self) -> float | None:
        """The plain decoding's time per step that the published figures imply if every one of ``batch``
        sequences emitted a token each step (lockstep): 1000 · batch / tokens/s for a server's throughput,
        1000 / tokens/s for one request's speed, else the ms per token; ``None`` without a figure or a batch."""
        if self.baseline_tok_s is not None and self.batch is not None:
            return 1000.0 * (self.batch if self.tok_s_kind == "total" else 1) / self.baseline_tok_s
        if self.baseline_ms_per_token is not None and self.batch is not None:
            return self.baseline_ms_per_token
        return None


def _fail(row_id: str, name: str, message: str) -> ValueError:
    return ValueError(f"published result {row_id!r}: field {name!r} {message}")


def _check_row(r: PublishedResult) -> None:
    """Choices, ranges and the pairs of fields that go together; raises a one-line ``ValueError``."""
    for name, choices in _CHOICES.items():
        value = getattr(r, name)
        if value is not None and value not in choices:
            raise _fail(r.id, name, f"is {value!r}; valid: {', '.join(choices)}")
    for name in _POSITIVE:
        value = getattr(r, name)
        if value is not None and not value > 0:
            raise _fail(r.id, name, f"must be > 0, got {value!r}")
    for name in ("id", "target", "source", "cells"):
        if not getattr(r, name).strip():
            raise _fail(r.id, name, "must not be empty")
    if (r.batch_kind == "request_rate") != (r.request_rate_qps is not None):
        raise _fail(r.id, "request_rate_qps", "goes with batch_kind = 'request_rate' (and only with it)")
    if (r.batch is None) != (r.batch_kind == "request_rate"):
        raise _fail(r.id, "batch", "is not given with batch_kind = 'request_rate' and is required otherwise")
    if r.tp is not None and r.gpus is not None and r.tp > r.gpus:
        raise _fail(r.id, "tp", f"is {r.tp}, more than gpus = {r.gpus}")
    if r.temperature is not None and not 0 <= r.temperature <= 2:
        raise _fail(r.id, "temperature", f"must be in [0, 2], got {r.temperature!r}")
    if (r.speedup is None) != (r.speedup_metric is None):
        raise _fail(r.id, "speedup_metric", "and speedup go together: give both or neither")
    if (r.acceptance is None) != (r.acceptance_kind is None):
        raise _fail(r.id, "acceptance_kind", "and acceptance go together: give both or neither")
    if r.acceptance is not None:
        _check_acceptance(r)
    elif r.acceptance_max is not None:
        raise _fail(r.id, "acceptance_max", "needs acceptance (the bottom of the range)")
    if (r.baseline_tok_s is not None or r.spec_tok_s is not None) != (r.tok_s_kind is not None):
        raise _fail(r.id, "tok_s_kind", "is required with baseline_tok_s / spec_tok_s (and only then)")
    if r.draft_kind == "model" and r.draft_model is None:
        raise _fail(r.id, "draft_model", "is required when draft_kind = 'model'")
    if (r.tree_topk is None) != (r.tree_num_draft_tokens is None):
        raise _fail(r.id, "tree_topk", "and tree_num_draft_tokens go together: give both or neither")
    outcomes = ("speedup", "spec_tok_s", "spec_ms_per_token")
    if r.acceptance is None and all(getattr(r, n) is None for n in outcomes):
        raise _fail(r.id, "speedup", "missing: a row needs an acceptance or a published outcome "
                    "(speedup, spec_tok_s or spec_ms_per_token)")


def _check_acceptance(r: PublishedResult) -> None:
    a = r.acceptance
    assert a is not None
    if r.acceptance_kind == "alpha_per_token":
        ok, want = 0 <= a <= 1, "in [0, 1]"
    elif r.acceptance_kind == "tau_excl_bonus":
        ok, want = 0 <= a <= _TAU_MAX, f"in [0, {_TAU_MAX:g}]"
    else:
        ok, want = 0 < a <= _TAU_MAX, f"in (0, {_TAU_MAX:g}]"
        if r.acceptance_kind == "tau_incl_bonus":
            ok, want = 1 <= a <= _TAU_MAX, f"in [1, {_TAU_MAX:g}] (tokens per step, the bonus token included)"
    if not ok:
        raise _fail(r.id, "acceptance", f"must be {want} for {r.acceptance_kind}, got {a!r}")
    if r.acceptance_max is not None and not a < r.acceptance_max <= (1.0 if r.acceptance_kind == "alpha_per_token"
                                                                     else _TAU_MAX):
        raise _fail(r.id, "acceptance_max", f"must be above acceptance ({a!r}) and in its range, "
                    f"got {r.acceptance_max!r}")
    top = a if r.acceptance_max is None else r.acceptance_max
    if r.gamma is not None and r.acceptance_kind == "tau_incl_bonus" and top > r.gamma + 1 + 1e-9:
        raise _fail(r.id, "acceptance", f"is {top!r}, more than gamma + 1 = {r.gamma + 1} tokens per step")


def _field_types() -> dict[str, tuple[type, ...]]:
    """Each field and the TOML value types it takes (an int is a valid float; a bool is neither)."""
    out = {}
    for name, hint in get_type_hints(PublishedResult).items():
        allowed = tuple(t for t in (get_args(hint) or (hint,)) if t is not type(None))
        out[name] = allowed + ((int,) if float in allowed else ())
    return out


def _row(raw: object, index: int, types: dict[str, tuple[type, ...]]) -> PublishedResult:
    if not isinstance(raw, dict):
        raise ValueError(f"published result {index}: expected a table, got {type(raw).__name__}")
    row_id = raw.get("id", f"#{index}")
    for key, value in raw.items():
        if key not in types:
            raise _fail(row_id, key, f"is unknown; valid: {', '.join(types)}")
        if isinstance(value, bool) or not isinstance(value, types[key]):
            want = " or ".join(t.__name__ for t in types[key])
            raise _fail(row_id, key, f"must be {want}, got {value!r}")
    required = [f.name for f in fields(PublishedResult) if f.default is MISSING]
    missing = [n for n in required if n not in raw]
    if missing:
        raise _fail(row_id, missing[0], f"is missing (required: {', '.join(required)})")
    values: dict[str, Any] = {k: float(v) if float in types[k] and isinstance(v, int) else v for k, v in raw.items()}
    lent = [k for k in ("acceptance", "acceptance_max", "acceptance_kind") if k in raw]
    if "acceptance_from" in raw and lent:
        raise _fail(row_id, lent[0], "is not given with acceptance_from (the acceptance is the lender's)")
    if raw.get("batch_kind") == "request_rate":
        if "batch" in raw:
            raise _fail(row_id, "batch", "is not given with batch_kind = 'request_rate' (the source states a rate)")
        values["batch"] = None
    return PublishedResult(**values)


def load_published(path: str | Path | None = None) -> list[PublishedResult]:
    """The rows of a published-results TOML file (``sim/data/published.toml`` when ``path`` is ``None``).

    The file holds ``[[result]]`` tables of :class:`PublishedResult` fields. Every problem is a one-line
    ``ValueError`` naming the file or the row id and the field.
    """
    path = PUBLISHED_FILE if path is None else Path(path)
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"published results file {str(path)!r}: {exc}") from None
    extra = sorted(set(doc) - {"result"})
    if extra:
        raise ValueError(f"published results file {str(path)!r}: unknown top-level key(s) {extra}; valid: result")
    raws = doc.get("result", [])
    if not isinstance(raws, list) or not raws:
        raise ValueError(f"published results file {str(path)!r}: no [[result]] tables")
    types = _field_types()
    rows = [_row(raw, i, types) for i, raw in enumerate(raws, start=1)]
    seen: set[str] = set()
    for r in rows:
        if r.id in seen:
            raise _fail(r.id, "id", "is given more than once")
        seen.add(r.id)
    by_id = {r.id: r for r in rows}
    return [_borrow(r, by_id) for r in rows]


_SAME_FOR_ACCEPTANCE = ("source", "target", "draft_kind", "draft_model", "gamma", "tree_topk", "tree_num_draft_tokens",
                        "dataset", "temperature")
"""What a lender row must share with a row that borrows its acceptance (everything acceptance depends on)."""


def _borrow(r: PublishedResult, by_id: dict[str, PublishedResult]) -> PublishedResult:
    """``r`` with the acceptance of the row its ``acceptance_from`` names; a bad reference is a one-line error."""
    if r.acceptance_from is None:
        return r
    lender = by_id.get(r.acceptance_from)
    if lender is None:
        raise _fail(r.id, "acceptance_from", f"is {r.acceptance_from!r}, which names no row of the table")
    if lender.acceptance is None or lender.acceptance_from is not None:
        raise _fail(r.id, "acceptance_from", f"is {lender.id!r}, which publishes no acceptance of its own")
    if lender.batch != 1:
        raise _fail(r.id, "acceptance_from", f"is {lender.id!r}, measured at batch {lender.batch}, not batch 1")
    for name in _SAME_FOR_ACCEPTANCE:
        if getattr(lender, name) != getattr(r, name):
            values = "" if name == "source" else f" ({getattr(lender, name)!r}, here {getattr(r, name)!r})"
            raise _fail(r.id, "acceptance_from", f"is {lender.id!r}, whose {name} differs{values}; a lender "
                        "shares: " + ", ".join(_SAME_FOR_ACCEPTANCE))
    return replace(r, acceptance=lender.acceptance, acceptance_max=lender.acceptance_max,
                   acceptance_kind=lender.acceptance_kind)
