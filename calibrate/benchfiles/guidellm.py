"""GuideLLM 0.8 reports (``guidellm run ... --output kind=json,path=benchmarks.json``).

Read field by field as GuideLLM 0.8.1 writes them (``guidellm/benchmark/schemas/report.py``
``GenerativeBenchmarksReport``: ``metadata`` (``version`` 2, ``guidellm_version``), ``config`` (the
scenario: backend, profile, data, constraints), ``benchmarks``; each ``GenerativeBenchmark``
(``type_`` ``generative_benchmark``) has ``config.strategy`` (``synchronous``, ``concurrent`` with
``streams``, ``constant``/``poisson`` with ``rate``, ``throughput``) and ``requests`` grouped
``successful``/``incomplete``/``errored`` of ``GenerativeRequestStats``
(``guidellm/schemas/base/request_stats.py``): ``info.timings`` (``request_start``, ``first_token_iteration``,
``last_token_iteration``, ``request_end``: wall-clock seconds), ``prompt_tokens``, ``output_tokens``,
``inter_token_latency_ms`` and ``response_metrics`` (a server's own per-request metrics: vLLM with
``--enable-per-request-metrics --per-request-spec-decode-metrics summary`` puts ``speculative_decoding``
there). GuideLLM keeps the first and last token times of a request, not every gap: a request's ITL is its
mean inter-token latency. One benchmark is one load. ``config.sample_size`` (reservoir sampling of the
requests kept) must keep them all. The version 2 report schema is the one read; another is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from calibrate.benchfiles.rows import (
    BenchFile,
    BenchFileError,
    BenchLoad,
    BenchRequest,
    SpecCounts,
    count,
    duration_of,
    number,
)
from measure.serve.units import LoadSpec

TOOL = "guidellm"
SCHEMA_VERSIONS = (2,)


def looks_like(obj: Any) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get("benchmarks"), list) and (
        "guidellm_version" in (obj.get("metadata") or {})
        or any(isinstance(b, dict) and b.get("type_") == "generative_benchmark" for b in obj["benchmarks"]))


def _load(path: str, i: int, strategy: dict) -> LoadSpec:
    kind = strategy.get("type_")
    if kind == "synchronous":
        return LoadSpec(concurrency=1)
    if kind == "concurrent":
        return LoadSpec(concurrency=count(path, f"benchmark {i} strategy.streams", strategy.get("streams"), False)
                        or 1)
    if kind in ("constant", "poisson"):
        if strategy.get("max_concurrency"):
            raise BenchFileError(path, f"benchmark {i}: a {kind} rate capped at max_concurrency "
                                 f"{strategy['max_concurrency']}, which the serving simulator does not model")
        rate = number(path, f"benchmark {i} strategy.rate", strategy.get("rate"), False)
        assert rate is not None
        return LoadSpec(rate_per_s=rate)
    if kind == "throughput" and strategy.get("max_concurrency"):
        return LoadSpec(concurrency=count(path, f"benchmark {i} max_concurrency", strategy["max_concurrency"])
                        or 1)
    raise BenchFileError(path, f"benchmark {i}: strategy {kind!r} is not one this reads (synchronous, "
                         "concurrent, constant, poisson, throughput with max_concurrency)")


def _spec(path: str, where: str, rm: Any) -> tuple[int | None, int | None, int | None]:
    """(drafts, drafted, accepted) of a request's vLLM per-request speculative metrics, where present."""
    sd = rm.get("speculative_decoding") if isinstance(rm, dict) else None
    if not isinstance(sd, dict):
        return None, None, None
    return (count(path, f"{where} num_spec_steps", sd.get("num_spec_steps")),
            count(path, f"{where} num_draft_tokens", sd.get("num_draft_tokens")),
            count(path, f"{where} num_accepted_draft_tokens", sd.get("num_accepted_draft_tokens")))


def _request(path: str, where: str, r: Any, status: str) -> tuple[float, BenchRequest, int | None]:
    """(absolute send time, the request from that time, drafts) of one ``GenerativeRequestStats``."""
    if not isinstance(r, dict) or not isinstance(r.get("info"), dict):
        raise BenchFileError(path, f"{where} is not a GuideLLM request record (no info)")
    t = r["info"].get("timings") or {}
    start = number(path, f"{where} timings.request_start", t.get("request_start"))
    if start is None:
        start = number(path, f"{where} timings.resolve_start", t.get("resolve_start"), False)
    first = number(path, f"{where} timings.first_token_iteration", t.get("first_token_iteration"))
    end = number(path, f"{where} timings.request_end", t.get("request_end"))
    if end is None:
        end = number(path, f"{where} timings.resolve_end", t.get("resolve_end"))
    assert start is not None
    ok = status == "successful" and first is not None and end is not None and end > start
    itl = number(path, f"{where} inter_token_latency_ms", r.get("inter_token_latency_ms"))
    drafts, drafted, accepted = _spec(path, where, r.get("response_metrics"))
    err = r["info"].get("error") or (None if ok else f"{status} request")
    return start, BenchRequest(
        0.0, (first - start) * 1000.0 if ok and first is not None else None,
        (end - start) * 1000.0 if ok and end is not None else None, (itl,) if ok and itl is not None else (),
        count(path, f"{where} prompt_tokens", r.get("prompt_tokens")),
        count(path, f"{where} output_tokens", r.get("output_tokens")) if ok else None,
        None if ok else str(err), drafted, accepted), drafts


def _benchmark(path: str, i: int, b: Any) -> BenchLoad:
    if not isinstance(b, dict) or b.get("type_") != "generative_benchmark":
        raise BenchFileError(path, f"benchmark {i} is not a generative_benchmark")
    cfg = b.get("config") or {}
    if cfg.get("sample_size") not in (None,):
        raise BenchFileError(path, f"benchmark {i} kept a sample of {cfg['sample_size']} requests per status "
                             "(--metrics sample_size): run with every request kept")
    load = _load(path, i, cfg.get("strategy") or {})
    groups = b.get("requests") or {}
    rows = []
    for status in ("successful", "incomplete", "errored"):
        for j, r in enumerate(groups.get(status) or []):
            rows.append(_request(path, f"benchmark {i} {status}[{j}]", r, status))
    if not rows:
        raise BenchFileError(path, f"benchmark {i} holds no requests")
    rows.sort(key=lambda x: x[0])
    t0 = rows[0][0]
    reqs = [BenchRequest(s - t0, *[getattr(r, f) for f in ("ttft_ms", "e2e_ms", "itl_ms", "prompt_tokens",
                                                           "completion_tokens", "error", "draft_tokens",
                                                           "accepted_tokens")]) for s, r, _ in rows]
    counts = None
    spec = [(d, r) for _, r, d in rows if d is not None and r.draft_tokens is not None]
    if spec:
        counts = SpecCounts(sum(d for d, _ in spec), sum(r.draft_tokens or 0 for _, r in spec),
                            sum(r.accepted_tokens or 0 for _, r in spec), None, "requests")
    return BenchLoad(load, tuple(reqs), duration_of(reqs), counts, f"benchmark {i} ({load.to_str()})")


def _spec_of(doc: dict) -> dict:
    cfg = doc.get("config")
    spec = cfg.get("spec", cfg) if isinstance(cfg, dict) else None
    return spec if isinstance(spec, dict) else {}


def _command(doc: dict) -> str | None:
    """The scenario GuideLLM recorded (``config.spec``; it keeps no command line): the backend's kind and
    target, the profile, constraints and data, as the ``guidellm run`` options that give them."""
    spec = _spec_of(doc)
    if not spec:
        return None
    backend = spec.get("backend") or {}
    parts = ["guidellm run"]
    if isinstance(backend, dict):
        parts.append("--backend " + json.dumps({k: backend[k] for k in ("kind", "target", "model", "request_format")
                                                 if backend.get(k)}, sort_keys=True))
    for key, flag in (("profile", "--profile"), ("constraints", "--constraint"), ("data", "--data")):
        items = spec.get(key)
        for item in items if isinstance(items, list) else [items] if items else []:
            parts.append(f"{flag} " + json.dumps(item, sort_keys=True, default=str))
    return " ".join(parts)[:4000]


def read(path: str | Path, doc: dict) -> BenchFile:
    """One GuideLLM report: one load per benchmark."""
    p = str(path)
    meta = doc.get("metadata") or {}
    if meta.get("version") not in SCHEMA_VERSIONS:
        raise BenchFileError(p, f"GuideLLM report schema version {meta.get('version')!r} (GuideLLM "
                             f"{meta.get('guidellm_version', '?')}); this reads version "
                             f"{', '.join(map(str, SCHEMA_VERSIONS))} (GuideLLM 0.8)")
    loads = tuple(_benchmark(p, i, b) for i, b in enumerate(doc["benchmarks"]))
    if not loads:
        raise BenchFileError(p, "no benchmarks")
    backend = _spec_of(doc).get("backend") or {}
    model = backend.get("model") if isinstance(backend, dict) else None
    return BenchFile(p, TOOL, str(meta.get("guidellm_version")), _command(doc), str(model) if model else None,
                     None, loads)
