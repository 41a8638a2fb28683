"""inference-perf (Kubernetes SIG, ``kubernetes-sigs/inference-perf``) report directories.

Read as its writer lays them out (inference-perf 0.5.0, commit ``7de5ef2ed6f7``:
``inference_perf/reportgen/base.py`` ``ReportGenerator.generate_reports``,
``inference_perf/client/filestorage/local.py``): a directory with ``per_request_lifecycle_metrics.json``
(a list of ``{start_time, end_time, request, response, info, error}``; ``info`` is ``InferenceInfo``:
``request_metrics.text.input_tokens`` (and its deprecated mirror ``input_tokens``),
``response_metrics.output_tokens``, ``server_usage`` (the server's ``usage``, ``completion_tokens``) and for
streamed requests ``chunk_times`` (``time.perf_counter()`` of each content chunk, as ``start_time`` and
``end_time``)), one ``stage_<i>_lifecycle_metrics.json`` per load stage (``load_summary``: ``count``,
``requested_rate``, ``concurrency`` for a concurrency stage) and the run's ``config.yaml``. The per-request
records carry no stage id: stages run one after the other, so the requests sorted by start time are cut into
the stages by each stage's ``count``. A stage with a ``concurrency`` is a closed loop of that many clients;
otherwise an open loop at ``requested_rate`` (the simulator replays the measured send times). The model is
``config.yaml``'s ``server.model_name``; the files carry no inference-perf version or command line.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from calibrate.benchfiles.rows import (
    BenchFile,
    BenchFileError,
    BenchLoad,
    BenchRequest,
    count,
    duration_of,
    number,
    read_json_file,
)
from measure.serve.units import LoadSpec
from toolkit.files import read_text

TOOL = "inference-perf"
PER_REQUEST = "per_request_lifecycle_metrics.json"
STAGE = re.compile(r"stage_(\d+)_lifecycle_metrics\.json")


def looks_like(path: Path) -> bool:
    return path.is_dir() and (path / PER_REQUEST).is_file()


def _request(path: str, i: int, rec: Any) -> BenchRequest:
    if not isinstance(rec, dict) or "start_time" not in rec or "end_time" not in rec:
        raise BenchFileError(path, f"request {i} is not an inference-perf lifecycle record (no start_time/end_time)")
    start = number(path, f"request {i} start_time", rec["start_time"], False) or 0.0
    end = number(path, f"request {i} end_time", rec["end_time"], False) or 0.0
    info = rec.get("info") or {}
    rm = info.get("response_metrics") or {}
    usage = rm.get("server_usage") or {}
    text = (info.get("request_metrics") or {}).get("text") or {}
    prompt = count(path, f"request {i} input_tokens", text.get("input_tokens", info.get("input_tokens")))
    out = count(path, f"request {i} completion_tokens", usage.get("completion_tokens", rm.get("output_tokens")))
    chunks = [number(path, f"request {i} chunk_times", t, False) or 0.0 for t in rm.get("chunk_times") or []]
    err = rec.get("error")
    ok = err is None and end > start and bool(chunks)
    return BenchRequest(
        send_s=start, ttft_ms=(chunks[0] - start) * 1000.0 if ok else None,
        e2e_ms=(end - start) * 1000.0 if ok else None,
        itl_ms=tuple((b - a) * 1000.0 for a, b in zip(chunks, chunks[1:])), prompt_tokens=prompt,
        completion_tokens=out if ok else None,
        error=None if ok else (f"{err.get('error_type')}: {err.get('error_msg')}" if isinstance(err, dict)
                               else "not streamed (no chunk_times): TTFT unknown"))


def _stages(path: Path) -> list[tuple[int, dict]]:
    out = []
    for f in sorted(path.iterdir()):
        m = STAGE.fullmatch(f.name)
        if m:
            doc = read_json_file(f, TOOL)
            if not isinstance(doc, dict) or not isinstance(doc.get("load_summary"), dict):
                raise BenchFileError(f, "no load_summary: not an inference-perf stage report")
            out.append((int(m.group(1)), doc["load_summary"]))
    return sorted(out)


def _model(path: Path) -> str | None:
    """``server.model_name`` of the run's ``config.yaml`` (read line by line: the project needs no YAML
    library for one key of a file ``yaml.dump`` wrote with block style); None without one."""
    cfg = path / "config.yaml"
    if not cfg.is_file():
        return None
    section = None
    for line in read_text(cfg, "inference-perf config").splitlines():
        if line and not line[0].isspace():
            section = line.split(":", 1)[0].strip()
            continue
        m = re.fullmatch(r"\s+model_name:\s*(.+?)\s*", line)
        if section == "server" and m:
            return m.group(1).strip("'\"") or None
    return None


def read(path: str | Path) -> BenchFile:
    """One inference-perf report directory: one load per stage."""
    d = Path(path)
    recs = read_json_file(d / PER_REQUEST, TOOL)
    if not isinstance(recs, list) or not recs:
        raise BenchFileError(d / PER_REQUEST, "not a non-empty list of per-request lifecycle records")
    reqs = sorted((_request(str(d / PER_REQUEST), i, r) for i, r in enumerate(recs)), key=lambda r: r.send_s)
    stages = _stages(d)
    if not stages:
        raise BenchFileError(d, "no stage_<i>_lifecycle_metrics.json: enable per_stage in the report config "
                             "(report.request_lifecycle.per_stage), which tells the stages' loads")
    total = sum(int(s.get("count") or 0) for _, s in stages)
    if total != len(reqs):
        raise BenchFileError(d, f"the stage reports count {total} requests, the per-request file {len(reqs)}: "
                             "files of different runs?")
    loads_, at = [], 0
    for sid, s in stages:
        n = int(s["count"])
        chunk = reqs[at: at + n]
        at += n
        t0 = min(r.send_s for r in chunk)
        chunk = [BenchRequest(r.send_s - t0, r.ttft_ms, r.e2e_ms, r.itl_ms, r.prompt_tokens, r.completion_tokens,
                              r.error) for r in chunk]
        conc = count(str(d), f"stage {sid} concurrency", s.get("concurrency"))
        if conc:
            load = LoadSpec(concurrency=conc)
        else:
            rate = number(str(d), f"stage {sid} requested_rate", s.get("requested_rate"))
            if not rate or rate <= 0:
                raise BenchFileError(d, f"stage {sid} has neither a concurrency nor a requested_rate > 0")
            load = LoadSpec(rate_per_s=rate)
        loads_.append(BenchLoad(load, tuple(chunk), duration_of(chunk), None, f"stage {sid}"))
    return BenchFile(str(d), TOOL, None, None, _model(d), None, tuple(loads_),
                     ("inference-perf reports carry no tool version or command line",))
