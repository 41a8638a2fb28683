"""llama-bench output (md, csv, json, jsonl) as a cost model for :mod:`sim`.

llama-bench times tests: ``tg N`` generates N tokens one at a time (``n_prompt
= 0``), ``pp N`` processes an N-token prompt in one batch (``n_gen = 0``),
optionally after ``n_depth`` tokens of context (``@ dD``). Read as costs:

* the target's ``tg`` at a depth = one autoregressive target step;
* the target's ``pp n`` at a depth = verifying n tokens. This is the
  llama.cpp maintainers' own approximation of the verify cost of n − 1 draft
  tokens (``llama-bench -p 1,2,4,8,16 -n 0 -d DEPTH``), not a measurement of
  speculative decoding;
* the draft's ``tg`` at a depth = one draft step.

The smaller model (by parameter count, else file size) is the draft. Times
are ``avg_ns`` (json/csv) or N / (t/s) (markdown). Several depths give the
context slopes; the pp sizes give the batch exponent used only by the
serving simulation (an assumption: b sequences verifying n tokens cost like
one forward of b·n tokens).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import dataclass

import numpy as np

from calibrate.ingest.records import ImpossibleFigure
from sim.cost import TabulatedCost
from toolkit.jsonio import loads

MAINTAINERS = ("verify cost of n tokens = llama-bench pp n at the same depth "
               "(the llama.cpp maintainers' approximation, not a speculative-decoding measurement)")
#: Largest pp batch read as a verify cost (larger prompts are prefill, not verification).
MAX_VERIFY_TOKENS = 64
_MD_TEST = re.compile(r"^(pp|tg)\s*(\d+)(?:\s*@\s*d(\d+))?$")


@dataclass(frozen=True)
class BenchRow:
    """One llama-bench test: model, kind (pp/tg), tokens, depth, mean and std of its time."""

    model: str
    n_params: float
    size_bytes: float
    kind: str
    n_tokens: int
    depth_tokens: int
    avg_ms: float
    stddev_ms: float


def _from_record(r: dict) -> BenchRow | None:
    try:
        n_prompt, n_gen = int(r["n_prompt"]), int(r["n_gen"])
        depth = int(r.get("n_depth", 0) or 0)
        avg_ns, std_ns = float(r["avg_ns"]), float(r.get("stddev_ns", 0.0) or 0.0)
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    for key, v in (("avg_ns", avg_ns), ("stddev_ns", std_ns)):
        if not math.isfinite(v) or v < 0 or (key == "avg_ns" and v == 0):
            raise ImpossibleFigure(f"llama-bench row {r.get('model_filename') or r.get('model_type') or '?'} "
                                   f"(n_prompt {n_prompt}, n_gen {n_gen}): {key} is {v:g}: a time must be a finite "
                                   "number > 0")
    if (n_prompt == 0) == (n_gen == 0):  # pg tests (prompt + generation) are neither
        return None
    kind, n = ("tg", n_gen) if n_prompt == 0 else ("pp", n_prompt)
    name = str(r.get("model_filename") or r.get("model_type") or "model")
    return BenchRow(name, float(r.get("model_n_params", 0) or 0), float(r.get("model_size", 0) or 0), kind, n,
                    depth, avg_ns / 1e6, std_ns / 1e6)


def _size(text: str, unit_scale: dict[str, float]) -> float:
    m = re.match(r"\s*([0-9.]+)\s*(\w+)", text)
    return float(m.group(1)) * unit_scale.get(m.group(2), 1.0) if m else 0.0


def _md_rows(text: str) -> tuple[list[BenchRow], int] | None:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("|")]
    if len(lines) < 2:
        return None
    header = [c.strip().lower() for c in lines[0].strip("|").split("|")]
    if "test" not in header or "t/s" not in header or "model" not in header:
        return None
    col = {name: i for i, name in enumerate(header)}
    rows, skipped = [], 0
    for ln in lines[1:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        if set("".join(cells)) <= set("-: "):
            continue
        if len(cells) != len(header):
            skipped += 1
            continue
        m = _MD_TEST.match(cells[col["test"]])
        ts = re.match(r"([0-9.]+)(?:\s*±\s*([0-9.]+))?", cells[col["t/s"]])
        if m is None or ts is None:
            skipped += 1
            continue
        n = int(m.group(2))
        t_s, sd = float(ts.group(1)), float(ts.group(2) or 0.0)
        if t_s <= 0:
            skipped += 1
            continue
        avg_ms = n / t_s * 1000.0
        std_ms = avg_ms * sd / t_s  # first-order propagation of the t/s spread
        params = _size(cells[col["params"]], {"B": 1e9, "M": 1e6, "K": 1e3}) if "params" in col else 0.0
        size = _size(cells[col["size"]], {"GiB": 2**30, "MiB": 2**20, "KiB": 2**10}) if "size" in col else 0.0
        rows.append(BenchRow(cells[col["model"]], params, size, m.group(1), n, int(m.group(3) or 0), avg_ms, std_ms))
    return rows, skipped


def parse_rows(text: str) -> tuple[str, list[BenchRow], int] | None:
    """(format, rows, lines skipped) of llama-bench output; None when the text is not llama-bench's."""
    s = text.strip()
    if not s:
        return None
    if s.startswith("["):
        try:
            doc = loads(s, "llama-bench JSON", constants=True)
        except json.JSONDecodeError:
            doc = None
        if isinstance(doc, list) and doc and all(isinstance(r, dict) and "avg_ns" in r for r in doc):
            rows = [_from_record(r) for r in doc]
            return "llama-bench-json", [r for r in rows if r is not None], sum(r is None for r in rows)
    if s.startswith("{"):
        recs, skipped = [], 0
        for ln in s.splitlines():
            try:
                r = loads(ln, "llama-bench JSON line", constants=True)
            except json.JSONDecodeError:
                skipped += 1
                continue
            if isinstance(r, dict) and "avg_ns" in r:
                recs.append(r)
        if recs:
            rows = [_from_record(r) for r in recs]
            return "llama-bench-jsonl", [r for r in rows if r is not None], skipped + sum(r is None for r in rows)
        return None
    first = s.splitlines()[0]
    if "avg_ns" in first and "n_prompt" in first and "," in first:
        reader = csv.DictReader(io.StringIO(s))
        kept: list[BenchRow] = []
        skipped = 0
        for r in reader:
            row = _from_record(r) if None not in r.values() else None
            if row is None:
                skipped += 1
            else:
                kept.append(row)
        return "llama-bench-csv", kept, skipped
    md = _md_rows(s)
    if md is not None:
        return "llama-bench-md", md[0], md[1]
    return None


@dataclass(frozen=True)
class BenchCost:
    """A cost model from llama-bench and the lines explaining where each number came from."""

    cost: TabulatedCost
    fmt: str
    target: str
    draft: str
    reference_depth_tokens: int
    lines: tuple[str, ...]


def _slope(depths: list[int], ms: list[float]) -> float:
    return float(np.polyfit(np.asarray(depths, float), np.asarray(ms, float), 1)[0]) if len(set(depths)) >= 2 else 0.0


# long: the cost table from llama-bench rows in one pass (models, reference depth, verify table, slopes, batch
#   exponent), each step with its one-line error and report line
def cost_from_rows(path: str, fmt: str, rows: list[BenchRow], context_tokens: float) -> BenchCost:
    """Target = the larger model, draft = the smaller; reference depth = the measured depth nearest ``context_tokens``."""
    models: dict[str, tuple[float, float]] = {}
    for r in rows:
        models.setdefault(r.model, (r.n_params, r.size_bytes))
    if len(models) < 2:
        raise ValueError(f"llama-bench output {path} has {len(models)} model(s) ({', '.join(models) or 'none'}): "
                         "a cost model needs the target and the draft (llama-bench -m target.gguf -m draft.gguf "
                         "-p 1,2,4,8,16 -n 32 -d 512)")
    if len(models) > 2:
        raise ValueError(f"llama-bench output {path} has {len(models)} models ({', '.join(models)}): "
                         "give one target and one draft")
    draft, target = sorted(models, key=lambda m: models[m])
    tgt = [r for r in rows if r.model == target]
    dft = [r for r in rows if r.model == draft]
    tg_t = {r.depth_tokens: r for r in tgt if r.kind == "tg"}
    tg_d = {r.depth_tokens: r for r in dft if r.kind == "tg"}
    pp_t = {(r.n_tokens, r.depth_tokens): r for r in tgt if r.kind == "pp" and 2 <= r.n_tokens <= MAX_VERIFY_TOKENS}
    if not tg_t:
        raise ValueError(f"llama-bench output {path} has no tg test of the target {target}: add -n 32")
    if not tg_d:
        raise ValueError(f"llama-bench output {path} has no tg test of the draft {draft}: add -n 32")
    usable = sorted(d for d in tg_t if any(dd == d for _, dd in pp_t))
    if not usable:
        raise ValueError(f"llama-bench output {path} has no small-batch pp test (2..{MAX_VERIFY_TOKENS} tokens) of the "
                         f"target {target} at a depth with a tg test: run llama-bench -p 1,2,4,8,16 -n 32 -d DEPTH")
    ref = min(usable, key=lambda d: (abs(d - context_tokens), d))
    tg_ms = lambda r: r.avg_ms / r.n_tokens  # noqa: E731 — one generated token
    verify = {1: tg_ms(tg_t[ref])}
    for (n, d), r in sorted(pp_t.items()):
        if d == ref:
            verify[n] = r.avg_ms
    d_ref = min(tg_d, key=lambda d: (abs(d - ref), d))
    lines = [f"llama-bench ({fmt}) {path}: target {target}, draft {draft} (the smaller model)",
             f"target step = tg at depth {ref}: {verify[1]:.3f} ms/token",
             f"draft step = draft tg at depth {d_ref}: {tg_ms(tg_d[d_ref]):.3f} ms/token"
             + ("" if d_ref == ref else f" (no draft tg at depth {ref}: nearest depth used)"),
             "verify ms by tokens at depth %d: %s" % (ref, ", ".join(f"{n}: {v:.3f}" for n, v in verify.items())),
             MAINTAINERS]
    # context slopes from several depths
    t_depths = sorted(tg_t)
    t_slope = _slope(t_depths, [tg_ms(tg_t[d]) for d in t_depths])
    d_depths = sorted(tg_d)
    d_slope = _slope(d_depths, [tg_ms(tg_d[d]) for d in d_depths])
    by_n: dict[int, float] = {}
    if len(t_depths) >= 2:
        by_n[1] = t_slope
        for n in sorted({n for n, _ in pp_t}):
            ds = sorted(d for nn, d in pp_t if nn == n)
            if len(ds) >= 2:
                by_n[n] = _slope(ds, [pp_t[(n, d)].avg_ms for d in ds])
        lines.append(f"context slopes from depths {t_depths}: target {t_slope * 1000:.3f} us/token, "
                     f"draft {d_slope * 1000:.3f} us/token")
    else:
        lines.append(f"one depth only ({ref}): context cost assumed flat around it")
    # batch exponent: log t_verify(n) against log n at the reference depth
    ns = np.asarray(sorted(verify), float)
    ts = np.asarray([verify[int(n)] for n in ns], float)
    exponent = float(max(np.polyfit(np.log(ns), np.log(ts), 1)[0], 0.0)) if ns.size >= 2 else 0.0
    lines.append(f"batch exponent {exponent:.3f} (assumed: b sequences x n tokens cost like one pp of b*n tokens; "
                 "used by the serving simulation only)")
    meta = {"source": "llama-bench", "file": path, "format": fmt, "target": target, "draft": draft,
            "reference_depth_tokens": ref, "approximation": MAINTAINERS}
    cost = TabulatedCost(
        verify_ms_by_tokens=verify,
        draft_step_ms_ref=tg_ms(tg_d[d_ref]),
        reference_context_tokens=float(ref),
        target_context_ms_per_token=t_slope,
        draft_context_ms_per_token=d_slope,
        batch_exponent=exponent,
        metadata=meta,
        context_ms_per_token_by_tokens=by_n if len(by_n) >= 2 else None,
    )
    return BenchCost(cost, fmt, target, draft, ref, tuple(lines))
