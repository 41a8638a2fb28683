"""Benchmark files of several configurations → the serving rows a ``measure serve`` run has (a
:class:`calibrate.serve.ServeData`), so the serving calibration reads them unchanged.

One configuration is speculation off or one draft length k; it is given one or more paths (files or
directories, :func:`calibrate.benchfiles.detect.read_path`). Every load of a configuration becomes a unit
(``serve_units`` row, :class:`measure.rows.UnitRow`) with its requests (``serve_requests`` rows,
:class:`measure.rows.RequestRow`); the same load met again (another file, or the same load twice in one
file) is the next repeat. A unit's percentiles are computed as ``measure serve`` computes them (TTFT,
TPOT = (last − first token) / (tokens − 1), ITL over every gap the file kept, e2e), its throughput is the
completion tokens over first send to last token. Where a configuration ran a load once, the unit also
gets an interval over its requests (``<metric>_lo``/``_hi``: the 95% order-statistic interval of the
latency percentiles, and for throughput a seeded bootstrap of the requests' tokens-per-second ratio), which
the calibration uses in place of the interval over repeats. Bad input (a missing off configuration, mixed
models or GPUs, a configuration without requests) is one line naming the file.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from calibrate.benchfiles.rows import BenchFile, BenchFileError, BenchLoad
from measure.runkinds import SERVE
from measure.serve.units import CONFIDENCE, RequestRow, ServeConfig, StepCostRow, UnitId, UnitRow, order_stat_ci

#: Bootstrap draws behind a one-run unit's throughput interval (seeded).
BOOT = 2000


@dataclass(frozen=True)
class ConfigFiles:
    """The files of one configuration: ``k`` = 0 for speculation off."""

    k: int
    paths: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"k={self.k}" if self.k else "off"


def parse_spec(text: str) -> tuple[int, str]:
    """``k=4:FILE`` (or ``4:FILE``) → (4, FILE); one-line ``ValueError`` otherwise."""
    head, sep, path = str(text).partition(":")
    k_text = head.strip().removeprefix("k=")
    if not sep or not path.strip() or not k_text.isdigit() or not 1 <= int(k_text) <= 64:
        raise ValueError(f"--spec {text!r}: expected k=K:FILE with K a draft length 1..64 (e.g. k=4:runs/k4.json)")
    return int(k_text), path.strip()


def _pct(x: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(x, dtype=float), q)) if len(x) else None


def _throughput_ci(ld: BenchLoad, value: float | None, seed: int) -> tuple[float | None, float | None]:
    """A one-run unit's throughput interval over its requests: the ratio Σ tokens / Σ generation time
    bootstrapped (seeded), scaled to the measured throughput."""
    ok = [r for r in ld.ok_requests if r.completion_tokens]
    if value is None or len(ok) < 4:
        return None, None
    tok = np.array([r.completion_tokens for r in ok], dtype=float)
    t = np.array([r.e2e_ms for r in ok], dtype=float)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(ok), size=(BOOT, len(ok)))
    ratio = tok[idx].sum(axis=1) / t[idx].sum(axis=1) / (tok.sum() / t.sum())
    lo, hi = np.quantile(ratio, [(1 - CONFIDENCE) / 2, 1 - (1 - CONFIDENCE) / 2])
    return float(value * lo), float(value * hi)


def unit_rows(ld: BenchLoad, uid: UnitId, new_tokens: int, hardware: str, one_run: bool,
              seed: int = 0) -> tuple[dict, list[RequestRow]]:
    """One load → its ``serve_units`` row (a dict: :class:`UnitRow` plus the one-run intervals) and requests."""
    cid = uid.to_str()
    ok = ld.ok_requests
    tokens = int(sum(r.completion_tokens or 0 for r in ok))
    ttft = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    e2e = [r.e2e_ms for r in ok if r.e2e_ms is not None]
    tpot = [t for t in (r.tpot_ms for r in ok) if t is not None]
    itl = [g for r in ok for g in r.itl_ms]
    c = ld.counts
    per = " ".join(str(v) for v in c.accepted_per_pos) if c is not None and c.accepted_per_pos else None
    thr = tokens / ld.duration_s if ok and ld.duration_s > 0 else None
    cfg = uid.config
    row = UnitRow(
        cell_id=cid, config=cfg.to_str(), spec_type="benchfile" if cfg.speculative else "none", spec_k=cfg.k,
        spec_ngram_n=cfg.ngram_n, slots=uid.slots, load=uid.load.to_str(), concurrency=uid.load.concurrency or None,
        rate_per_s=uid.load.rate_per_s or None, repeat=uid.repeat, block=uid.repeat, synthetic=False,
        n_requests=len(ld.requests), n_errors=len(ld.requests) - len(ok), new_tokens=new_tokens,
        duration_s=float(ld.duration_s), completion_tokens=tokens, throughput_tokens_per_s=thr,
        ttft_p50_ms=_pct(ttft, 50), ttft_p95_ms=_pct(ttft, 95), ttft_p99_ms=_pct(ttft, 99),
        tpot_p50_ms=_pct(tpot, 50), tpot_p95_ms=_pct(tpot, 95), tpot_p99_ms=_pct(tpot, 99),
        itl_p50_ms=_pct(itl, 50), itl_p95_ms=_pct(itl, 95), itl_p99_ms=_pct(itl, 99),
        e2e_p50_ms=_pct(e2e, 50), e2e_p95_ms=_pct(e2e, 95), e2e_p99_ms=_pct(e2e, 99),
        metrics=c is not None, drafts=c.drafts if c else None, draft_tokens=c.draft_tokens if c else None,
        accepted_tokens=c.accepted_tokens if c else None, accepted_per_pos=per, tokens_predicted=None,
        n_decode=None, prompt_tokens=None, client_cpu_s=0.0, client_cpu_share=0.0, send_lag_p99_ms=None,
        hardware=hardware)
    d = asdict(row)
    if one_run:
        d["throughput_tokens_per_s_lo"], d["throughput_tokens_per_s_hi"] = _throughput_ci(ld, thr, seed)
        for name, x in (("e2e", e2e), ("ttft", ttft), ("tpot", tpot)):
            for q, tag in ((0.5, "p50"), (0.95, "p95")):
                _, lo, hi = order_stat_ci(np.asarray(x, dtype=float), q)
                d[f"{name}_{tag}_ms_lo"], d[f"{name}_{tag}_ms_hi"] = lo, hi
    reqs = [RequestRow(cid, i, f"request-{i}" if r.prompt_tokens is None else f"p{r.prompt_tokens}", "benchfile",
                       r.send_s, r.ttft_ms, r.e2e_ms, r.tpot_ms, r.completion_tokens if r.ok else None,
                       len(r.itl_ms) + 1 if r.ok else 0, r.prompt_tokens, r.draft_tokens, r.accepted_tokens, None,
                       None, r.error)
            for i, r in enumerate(ld.requests)]
    return d, reqs


def check_same_deployment(files: dict[str, list[BenchFile]]) -> tuple[str | None, str | None]:
    """The one model and GPU every file names (None where none names one); one line when they differ."""
    out: list[str | None] = []
    for attr, what in (("model", "models"), ("hardware", "GPUs")):
        seen: dict[str, str] = {}
        for fs in files.values():
            for f in fs:
                v = getattr(f, attr)
                if v:
                    seen.setdefault(str(v), f.path)
        if len(seen) > 1:
            (a, pa), (b, pb) = list(seen.items())[:2]
            raise BenchFileError(pb, f"mixed {what} across configurations: {b!r} here, {a!r} in {pa}: calibrate one "
                                 "deployment at a time")
        out.append(next(iter(seen), None))
    return out[0], out[1]


def new_tokens_of(files: dict[str, list[BenchFile]]) -> tuple[int, list[str]]:
    """Output tokens a request asks (the largest completion seen: the simulator gives each request the same)."""
    toks = [r.completion_tokens for fs in files.values() for f in fs for ld in f.loads for r in ld.ok_requests
            if r.completion_tokens]
    if not toks:
        raise ValueError("no successful request with output tokens in any file")
    hi, med = max(toks), float(np.median(toks))
    notes = [] if med >= 0.9 * hi else [f"output lengths vary (median {med:.0f}, max {hi} tokens): the simulator "
                                         f"gives every request {hi}; predictions of e2e latency are for that length"]
    return int(hi), notes


def build(configs: Sequence[tuple[ConfigFiles, list[BenchFile]]], slots: int | None, ngram_n: int,
          seed: int = 0) -> tuple[Any, Any, Any, dict]:
    """The (units, requests, steps, meta) of a :class:`calibrate.serve.ServeData` from read files."""
    import pandas as pd

    if not any(cf.k == 0 for cf, _ in configs):
        first = configs[0][0].paths[0] if configs else "(no files)"
        raise BenchFileError(first, "no speculation-off configuration: give --off FILE (the same loads without "
                             "speculation), which every speedup is judged against")
    files = {cf.name: fs for cf, fs in configs}
    model, hardware = check_same_deployment(files)
    new_tokens, notes = new_tokens_of(files)
    max_conc = max((ld.load.concurrency for _, fs in configs for f in fs for ld in f.loads), default=0)
    n_slots = slots or max(max_conc, 1)
    units, reqs = [], []
    for cf, fs in configs:
        cfg = ServeConfig("ngram", cf.k, ngram_n) if cf.k else ServeConfig("off")
        by_load: dict[str, list[BenchLoad]] = {}
        for f in fs:
            for ld in f.loads:
                by_load.setdefault(ld.load.to_str(), []).append(ld)
        if not by_load:
            raise BenchFileError(cf.paths[0], f"configuration {cf.name}: no loads")
        for key, lds in by_load.items():
            for rep, ld in enumerate(lds):
                if not ld.ok_requests:
                    raise BenchFileError(cf.paths[0], f"configuration {cf.name}, load {key} ({ld.label}): no "
                                         "successful request")
                u, rq = unit_rows(ld, UnitId(cfg, n_slots, ld.load, rep), new_tokens, hardware or "unknown",
                                  len(lds) == 1, seed)
                units.append(u)
                reqs.extend(rq)
    meta = {"status": "complete", "config": SERVE.stamp({"slots": n_slots, "max_new_tokens": new_tokens,
                                                         "batch_tokens": 2048, "source": "benchfiles"}),
            "model": model, "hardware": hardware, "notes": notes,
            "sources": {cf.name: [f.describe() for f in fs] for cf, fs in configs}}
    steps = pd.DataFrame(columns=list(StepCostRow.columns()))
    return pd.DataFrame(units), pd.DataFrame([asdict(r) for r in reqs]), steps, meta


def load_benchfiles(configs: Sequence[ConfigFiles], slots: int | None = None, ngram_n: int = 1,
                    path: str | Path = ".", seed: int = 0) -> Any:
    """Read every configuration's files and build the :class:`calibrate.serve.ServeData`."""
    from calibrate.benchfiles.detect import read_path
    from calibrate.serve import ServeData

    read = [(cf, [f for p in cf.paths for f in read_path(p)]) for cf in configs]
    units, reqs, steps, meta = build(read, slots, ngram_n, seed)
    for col in ("ttft_ms", "e2e_ms", "tpot_ms", "prompt_ms", "predicted_ms", "draft_n", "draft_n_accepted",
                "completion_tokens", "prompt_tokens"):
        reqs[col] = reqs[col].astype(float)
    reqs["error"] = reqs["error"].astype(object).where(reqs["error"].notna(), None)
    return ServeData(Path(path), units, reqs, steps, meta)
