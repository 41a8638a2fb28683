"""Which engine and format each file is, scrape deltas, and the ingestion of a list of files.

Every file is tried against the formats of the chosen engine (all of them
for ``auto``); llama-bench output is read as costs. Prometheus scrapes of one
engine are combined: two or more → the counter deltas between the first and
the last (so a long-lived server's history does not count), checked for
counters going down and for scrapes of different servers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from calibrate.ingest import llamabench, llamacpp, sglang, tgi, vllm
from calibrate.ingest.normalise import normalise
from calibrate.ingest.records import AcceptanceRecord, Observation, ParseResult, check_counters
from toolkit.prometheus import Sample, Scrape, looks_like_scrape, parse_scrape, sample_text

ENGINES = ("vllm", "sglang", "llamacpp", "tgi")
#: Metric-name prefix of each engine's /metrics, and the names that hold its spec-decode figures.
SCRAPE_PREFIX = {"vllm": "vllm:", "sglang": "sglang:", "llamacpp": "llamacpp:", "tgi": "tgi_"}
SPEC_METRICS = {
    "vllm": vllm.COUNTERS,
    "sglang": sglang.GAUGES,
    "llamacpp": llamacpp.COUNTERS,
    "tgi": (tgi.METRIC, "tgi_request_success"),
}
FORMATS_TRIED = {
    "vllm": ["vLLM 'SpecDecoding metrics:'/'Speculative metrics:' log lines", "vLLM per-request "
             "speculative_decoding JSON", "vLLM /metrics scrape"],
    "sglang": ["SGLang 'Decode batch ... accept len' log lines", "SGLang meta_info JSON", "SGLang /metrics scrape"],
    "llamacpp": ["llama-speculative(-simple) end-of-run output", "llama-server draft acceptance/statistics log "
                 "lines", "llama-server timings JSON", "llama-server /metrics scrape"],
    "tgi": ["TGI /metrics scrape (tgi_request_skipped_tokens)"],
}
BENCH_FORMATS = "llama-bench md/csv/json/jsonl"


@dataclass(frozen=True)
class BenchInput:
    """llama-bench rows read from one file (turned into a cost model once the context is known)."""

    path: str
    fmt: str
    rows: tuple[llamabench.BenchRow, ...]
    skipped: int


@dataclass(frozen=True)
class Ingested:
    """What a list of files held: the normalised acceptance record and/or llama-bench costs."""

    record: AcceptanceRecord | None
    bench: BenchInput | None
    files: tuple[tuple[str, str], ...]  # (path, format) per file


def _parsers(engine: str, spec_tokens: int | None) -> list[Callable[[str, str], ParseResult | None]]:
    if engine == "vllm":
        return [vllm.parse_log, vllm.parse_requests]
    if engine == "sglang":
        return [lambda p, t: sglang.parse_log(p, t, spec_tokens), lambda p, t: sglang.parse_requests(p, t, spec_tokens)]
    if engine == "llamacpp":
        return [llamacpp.parse_run, llamacpp.parse_log, llamacpp.parse_timings]
    return []


def _scrape_engine(scrape: Scrape, engines: tuple[str, ...]) -> str | None:
    for e in engines:
        if scrape.has_prefix(SCRAPE_PREFIX[e]):
            return e
    return None


def _spec_samples(engine: str, scrape: Scrape) -> dict[tuple[str, tuple[tuple[str, str], ...]], Sample]:
    names = SPEC_METRICS[engine]
    return {(s.name, s.labels): s for s in scrape.samples
            if any(s.name == n or s.name.startswith(n + "_") for n in names)}


def scrape_delta(engine: str, before: tuple[str, Scrape], after: tuple[str, Scrape]) -> Scrape:
    """``after − before`` of the engine's spec-decode counters; raises on counters going down or other servers."""
    (bp, b), (ap, a) = before, after
    bs, as_ = _spec_samples(engine, b), _spec_samples(engine, a)
    models_b = {s.label("model_name") for s in bs.values() if s.label("model_name")}
    models_a = {s.label("model_name") for s in as_.values() if s.label("model_name")}
    if models_b and models_a and models_b != models_a:
        raise ValueError(f"{bp} and {ap} come from different servers (model_name {', '.join(sorted(models_b))} vs "
                         f"{', '.join(sorted(models_a))}): give two scrapes of the same server")
    if set(bs) != set(as_) and bs and as_:
        raise ValueError(f"{bp} and {ap} come from different servers: their spec-decode metrics differ "
                         "(another draft length or engine set): give two scrapes of the same server")
    out = []
    for key, s in as_.items():
        prev = bs.get(key)
        if prev is None:
            out.append(s)
            continue
        if s.value < prev.value - 1e-9:
            raise ValueError(f"counters went down from {bp} to {ap} ({sample_text(s)}: {prev.value:g} -> "
                             f"{s.value:g}): give the scrapes in order (before, after) of one server that did "
                             "not restart in between")
        out.append(Sample(s.name, s.labels, s.value - prev.value))
    return Scrape(tuple(out), 0, 0)


def _scrape_observation(engine: str, path: str, scrape: Scrape, spec_tokens: int | None) -> Observation | None:
    if engine == "vllm":
        return vllm.scrape_observation(path, scrape)
    if engine == "sglang":
        return sglang.scrape_observation(path, scrape, spec_tokens)
    if engine == "llamacpp":
        return llamacpp.scrape_observation(path, scrape)
    return tgi.scrape_observation(path, scrape)


def read_text(path: str) -> str:
    """The file's text; a one-line ValueError when it cannot be read."""
    p = Path(path)
    try:
        return p.read_text(errors="replace")
    except FileNotFoundError:
        raise ValueError(f"file not found: {path}") from None
    except IsADirectoryError:
        raise ValueError(f"{path} is a directory: give the metrics files themselves") from None
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None


def ingest_files(paths: list[str], engine: str = "auto", spec_tokens: int | None = None) -> Ingested:
    """Read every file, combine scrapes, normalise the observations of one engine."""
    if engine != "auto" and engine not in ENGINES:
        raise ValueError(f"unknown --engine {engine!r}; valid: auto, {', '.join(ENGINES)}")
    engines = ENGINES if engine == "auto" else (engine,)
    results: list[ParseResult] = []
    scrapes: dict[str, list[tuple[str, Scrape]]] = {}
    bench: BenchInput | None = None
    files: list[tuple[str, str]] = []
    for path in paths:
        text = read_text(path)
        got = None
        for e in engines:
            for parser in _parsers(e, spec_tokens):
                got = parser(path, text)
                if got is not None:
                    break
            if got is not None:
                break
        if got is not None:
            results.append(got)
            files.append((path, got.fmt))
            continue
        if looks_like_scrape(text):
            scrape = parse_scrape(text)
            scraped = _scrape_engine(scrape, engines)
            if scraped is not None:
                spec = _spec_samples(scraped, scrape)
                if not spec:
                    raise ValueError(f"no spec-decode counters in {path}: was speculative decoding on?")
                check_counters(path, spec.values())
                scrapes.setdefault(scraped, []).append((path, scrape))
                files.append((path, f"{scraped}-prometheus"))
                continue
        b = llamabench.parse_rows(text)
        if b is not None and b[1]:
            if bench is not None:
                raise ValueError(f"two llama-bench files ({bench.path}, {path}): give one (llama-bench -m target "
                                 "-m draft writes both models into one)")
            bench = BenchInput(path, b[0], tuple(b[1]), b[2])
            files.append((path, b[0]))
            continue
        tried = [f for e in engines for f in FORMATS_TRIED[e]] + [BENCH_FORMATS]
        raise ValueError(f"{path}: not in any known format (tried: {'; '.join(tried)})")

    for e, lst in scrapes.items():
        obs = _combine_scrapes(e, lst, spec_tokens)
        results.append(ParseResult(e, obs.fmt, (obs,), 0))

    observations = [o for r in results for o in r.observations]
    skipped = sum(r.skipped for r in results)
    record = None
    if results:
        if not observations:
            where = ", ".join(p for p, _ in files)
            raise ValueError(f"no complete spec-decode figures in {where}: {skipped} partial or truncated "
                             "line(s) skipped")
        record = normalise(observations, skipped, spec_tokens)
    return Ingested(record, bench, tuple(files))


def _combine_scrapes(engine: str, scrapes: list[tuple[str, Scrape]], spec_tokens: int | None) -> Observation:
    """One observation from an engine's scrapes: the delta first → last for counters, the last for gauges."""
    notes: list[str] = []
    first, last = scrapes[0], scrapes[-1]
    if engine == "sglang" or len(scrapes) == 1:
        source, scrape = last
        if engine == "sglang" and len(scrapes) > 1:
            notes.append("SGLang exports gauges, not counters: the last scrape is used, no delta")
        elif engine != "sglang":
            notes.append(f"one scrape of {engine}: counters since the server started (give a before and an after "
                         "scrape to scope a benchmark)")
    else:
        source, scrape = f"{first[0]} -> {last[0]}", scrape_delta(engine, first, last)
        if len(scrapes) > 2:
            notes.append(f"{len(scrapes)} scrapes of {engine}: deltas between the first and the last")
    obs = _scrape_observation(engine, source, scrape, spec_tokens)
    if obs is None:
        raise ValueError(f"no spec-decode counters in {last[0]}: was speculative decoding on?")
    if len(scrapes) > 1 and engine != "sglang":
        if obs.drafts == 0 or (obs.rounds_by_accepted is not None and not sum(obs.rounds_by_accepted)):
            raise ValueError(f"no drafts between {first[0]} and {last[0]}: the counters did not move "
                             "(was the benchmark run between the two scrapes?)")
        return replace(obs, fmt=obs.fmt + "-delta", notes=obs.notes + tuple(notes))
    return replace(obs, notes=obs.notes + tuple(notes))
