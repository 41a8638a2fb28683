"""``vllm bench serve --save-result --save-detailed`` result files.

Read field by field as ``vllm/benchmarks/serve.py`` writes them (vLLM main at commit
``009e6d4a1cd6``, ``benchmark()`` and ``main_async()``): one JSON object per run (``--append-result`` puts
several in one file, one per line: each is one load). Per request (only with ``--save-detailed``; without it
the file holds aggregates alone and is refused): ``start_times`` (``time.perf_counter()`` seconds at the
send), ``ttfts`` and ``latencies`` (seconds), ``itls`` (the gaps between streamed chunks, seconds),
``input_lens``, ``output_lens`` (tokens, counted by the client's tokenizer) and ``errors`` (``""`` when the
request succeeded). The load: ``max_concurrency`` with ``request_rate`` ``"inf"`` is a closed loop of that
many clients; a finite ``request_rate`` without ``max_concurrency`` is an open loop (the simulator replays
the measured send times). Recent versions add the spec-decode counter deltas they scraped from the
server's ``/metrics`` around the run: ``spec_decode_num_drafts``, ``spec_decode_draft_tokens``,
``spec_decode_accepted_tokens`` and ``spec_decode_per_position_acceptance_rates`` (accepted at position
i ÷ drafts). The file carries no vLLM version and no command line; ``--metadata KEY=VALUE`` pairs land at
its top level (``gpu=...`` is read as the hardware).
"""

from __future__ import annotations

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
    read_json_file,
)
from measure.serve.units import LoadSpec
from toolkit.jsonio import loads

TOOL = "vllm-bench-serve"
#: Keys every ``vllm bench serve`` result has (``benchmark()``'s result and ``main_async()``'s setup).
SIGNATURE = ("backend", "model_id", "request_rate", "max_concurrency", "duration", "completed")
PER_REQUEST = ("start_times", "ttfts", "itls", "latencies", "input_lens", "output_lens", "errors")


def looks_like(obj: Any) -> bool:
    return isinstance(obj, dict) and all(k in obj for k in SIGNATURE)


def _load_spec(path: str, res: dict, n: int) -> LoadSpec:
    rate, conc = res.get("request_rate"), res.get("max_concurrency")
    finite = rate not in ("inf", None) and not (isinstance(rate, float) and rate == float("inf"))
    if finite and conc is not None:
        raise BenchFileError(path, f"request_rate {rate} with max_concurrency {conc}: a capped open loop, which the "
                             "serving simulator does not model; run one or the other")
    if finite:
        r = number(path, "request_rate", rate, allow_none=False)
        assert r is not None
        return LoadSpec(rate_per_s=r)
    c = count(path, "max_concurrency", conc)
    return LoadSpec(concurrency=c or n)  # no cap and no rate: every request at once


def _requests(path: str, res: dict) -> list[BenchRequest]:
    missing = [k for k in PER_REQUEST if not isinstance(res.get(k), list)]
    if missing:
        raise BenchFileError(path, f"no per-request {', '.join(missing)}: save the result with --save-detailed "
                             "(without it vllm bench serve keeps only aggregates)")
    n = len(res["start_times"])
    if any(len(res[k]) != n for k in PER_REQUEST):
        raise BenchFileError(path, "its per-request lists differ in length: " + ", ".join(
            f"{k} {len(res[k])}" for k in PER_REQUEST))
    if not n:
        raise BenchFileError(path, "no requests")
    t0 = min(number(path, f"start_times[{i}]", v, False) or 0.0 for i, v in enumerate(res["start_times"]))
    out = []
    for i in range(n):
        err = res["errors"][i] or None
        lat = number(path, f"latencies[{i}]", res["latencies"][i])
        ok = err is None and lat is not None and lat > 0
        ttft = number(path, f"ttfts[{i}]", res["ttfts"][i])
        itl = res["itls"][i] if isinstance(res["itls"][i], list) else []
        out.append(BenchRequest(
            send_s=(number(path, f"start_times[{i}]", res["start_times"][i], False) or 0.0) - t0,
            ttft_ms=ttft * 1000.0 if ok and ttft is not None else None,
            e2e_ms=lat * 1000.0 if ok and lat is not None else None,
            itl_ms=tuple((number(path, f"itls[{i}]", g, False) or 0.0) * 1000.0 for g in itl),
            prompt_tokens=count(path, f"input_lens[{i}]", res["input_lens"][i]),
            completion_tokens=count(path, f"output_lens[{i}]", res["output_lens"][i]) if ok else None,
            error=None if ok else (err or "failed (no latency)")))
    return out


def _counts(path: str, res: dict) -> SpecCounts | None:
    if "spec_decode_num_drafts" not in res:
        return None
    drafts = count(path, "spec_decode_num_drafts", res["spec_decode_num_drafts"], False) or 0
    rates = res.get("spec_decode_per_position_acceptance_rates") or []
    per = tuple(int(round((number(path, "spec_decode_per_position_acceptance_rates", r, False) or 0.0) * drafts))
                for r in rates)
    try:
        return SpecCounts(drafts, count(path, "spec_decode_draft_tokens", res.get("spec_decode_draft_tokens"),
                                        False) or 0,
                          count(path, "spec_decode_accepted_tokens", res.get("spec_decode_accepted_tokens"),
                                False) or 0, per or None, "file")
    except ValueError as exc:
        raise BenchFileError(path, str(exc)) from None


def results_of(path: str | Path) -> list[dict]:
    """The result objects of one file: one JSON object, or several one per line (``--append-result``)."""
    obj = read_json_file(path, TOOL) if not _several(path) else None
    if obj is not None:
        return [obj]
    lines = [ln for ln in Path(path).read_text().splitlines() if ln.strip()]
    out = []
    for i, ln in enumerate(lines, 1):
        try:
            out.append(loads(ln, f"{path} line {i}", constants=True))
        except ValueError as exc:
            raise BenchFileError(path, f"line {i} is not valid JSON ({exc}): truncated?") from None
    return out


def _several(path: str | Path) -> bool:
    text = Path(path).read_text(errors="replace").strip()
    return text.count("\n{") > 0 and text.startswith("{") and '}\n{' in text.replace("\r", "")


def read(path: str | Path, results: list[dict] | None = None) -> BenchFile:
    """One ``vllm bench serve`` result file: one load per result object."""
    p = str(path)
    results = results if results is not None else results_of(path)
    loads_, models, hw = [], set(), set()
    for i, res in enumerate(results):
        if not looks_like(res):
            raise BenchFileError(p, f"result {i + 1} lacks {', '.join(k for k in SIGNATURE if k not in res)}: "
                                 "not a vllm bench serve result")
        reqs = _requests(p, res)
        load = _load_spec(p, res, len(reqs))
        loads_.append(BenchLoad(load, tuple(reqs), duration_of(reqs), _counts(p, res),
                                f"result {i + 1} ({res.get('date', 'undated')})"))
        models.add(str(res.get("model_id")))
        if res.get("gpu") or res.get("hardware"):
            hw.add(str(res.get("gpu") or res.get("hardware")))
    if len(models) > 1 or len(hw) > 1:
        raise BenchFileError(p, f"its results mix models or GPUs ({', '.join(sorted(models | hw))}): one "
                             "deployment per file")
    return BenchFile(p, TOOL, None, None, models.pop() if models else None, hw.pop() if hw else None,
                     tuple(loads_), ("vllm bench serve files carry no vLLM version or command line",))
