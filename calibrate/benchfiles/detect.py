"""Which tool wrote a benchmark file, and the ``/metrics`` scrapes beside it.

A path is a GuideLLM report (a JSON object with ``benchmarks`` of ``generative_benchmark`` and GuideLLM's
``metadata``), a ``vllm bench serve`` result (one JSON object or one per line), an inference-perf report
directory (``per_request_lifecycle_metrics.json`` inside) or a directory of such files (every ``*.json``
in it, in name order). Anything else is one line naming the file and the formats this reads.

Scrapes: beside a file ``X.json`` holding one load, ``X.before.prom`` and ``X.after.prom``; for a file or
directory holding several loads, ``X.<load>.before.prom`` (``X.c4.before.prom``) per load. Their counter
deltas (vLLM's or llama.cpp's spec-decode counters) give a load's acceptance where the file has none;
counters that go down between the two are refused.
"""

from __future__ import annotations

from pathlib import Path

from calibrate.benchfiles import guidellm, inference_perf, vllm_bench
from calibrate.benchfiles.rows import BenchFile, BenchFileError, BenchLoad, SpecCounts
from calibrate.ingest import llamacpp, vllm
from calibrate.ingest.detect import SCRAPE_PREFIX, scrape_delta
from toolkit.files import read_text
from toolkit.prometheus import parse_scrape

FORMATS = ("GuideLLM 0.8 benchmarks.json", "vllm bench serve --save-result --save-detailed JSON",
           "an inference-perf report directory (per_request_lifecycle_metrics.json)")


def read_one(path: str | Path) -> BenchFile:
    """The benchmark file at ``path`` (not a directory of files), its tool detected."""
    p = Path(path)
    if inference_perf.looks_like(p):
        return inference_perf.read(p)
    if p.is_dir():
        raise BenchFileError(p, "a directory without per_request_lifecycle_metrics.json")
    results = vllm_bench.results_of(p)
    first = results[0] if results else None
    if isinstance(first, dict) and guidellm.looks_like(first):
        return guidellm.read(p, first)
    if vllm_bench.looks_like(first):
        return vllm_bench.read(p, results)
    keys = ", ".join(sorted(first)[:8]) if isinstance(first, dict) else type(first).__name__
    raise BenchFileError(p, f"not a file of a known benchmark tool (top-level {keys}); this reads "
                         + "; ".join(FORMATS))


def read_path(path: str | Path) -> list[BenchFile]:
    """A file, an inference-perf directory, or a directory of benchmark files (``*.json``, name order)."""
    p = Path(path)
    if not p.exists():
        raise BenchFileError(p, "no such file or directory")
    if p.is_dir() and not inference_perf.looks_like(p):
        files = sorted(f for f in p.iterdir() if f.suffix == ".json" and f.is_file())
        subdirs = sorted(f for f in p.iterdir() if inference_perf.looks_like(f))
        if not files and not subdirs:
            raise BenchFileError(p, "holds no benchmark files (*.json) or inference-perf report directories")
        return [with_scrapes(read_one(f)) for f in [*files, *subdirs]]
    return [with_scrapes(read_one(p))]


def scrape_counts(before: Path, after: Path) -> SpecCounts | None:
    """The spec-decode counter deltas between two scrapes (vLLM or llama.cpp); None when they have none."""
    b = parse_scrape(read_text(before, "scrape"))
    a = parse_scrape(read_text(after, "scrape"))
    for engine, obs_of in (("vllm", vllm.scrape_observation), ("llamacpp", llamacpp.scrape_observation)):
        if not (a.has_prefix(SCRAPE_PREFIX[engine]) or b.has_prefix(SCRAPE_PREFIX[engine])):
            continue
        try:
            delta = scrape_delta(engine, (str(before), b), (str(after), a))
            obs = obs_of(str(after), delta)
        except ValueError as exc:
            raise BenchFileError(after, " ".join(str(exc).split())) from None
        if obs is None:
            return None
        try:
            return SpecCounts(obs.drafts or 0, obs.draft_tokens or 0, obs.accepted_tokens or 0,
                              obs.accepted_per_pos, "scrape")
        except ValueError as exc:
            raise BenchFileError(after, str(exc)) from None
    return None


def _scrape_pair(bf: BenchFile, load: BenchLoad) -> tuple[Path, Path] | None:
    p = Path(bf.path)
    stem = p if p.is_dir() else p.with_suffix("")
    names = [f"{stem.name}.{load.load.to_str()}"] + ([stem.name] if len(bf.loads) == 1 else [])
    for n in names:
        before, after = stem.parent / f"{n}.before.prom", stem.parent / f"{n}.after.prom"
        if before.is_file() and after.is_file():
            return before, after
        if before.is_file() != after.is_file():
            raise BenchFileError(before if before.is_file() else after, "a scrape without its pair (.before.prom "
                                 "and .after.prom go together)")
    return None


def with_scrapes(bf: BenchFile) -> BenchFile:
    """``bf`` with each load's counters from the scrapes beside it where the file gave none."""
    out = []
    for ld in bf.loads:
        pair = _scrape_pair(bf, ld)
        counts = scrape_counts(*pair) if pair is not None else None
        out.append(ld if ld.counts is not None or counts is None else
                   BenchLoad(ld.load, ld.requests, ld.duration_s, counts, ld.label))
    return BenchFile(bf.path, bf.tool, bf.tool_version, bf.command, bf.model, bf.hardware, tuple(out), bf.notes)
