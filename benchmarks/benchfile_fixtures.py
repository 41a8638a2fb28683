"""Make the ``vllm bench serve`` and inference-perf fixtures of ``tests/fixtures/benchfiles/``: real timings
from llama-server, written the way those tools' writers lay them out. Neither vLLM nor inference-perf ran.

    flock -x /tmp/specscope-cpu.lock python benchmarks/benchfile_fixtures.py

For speculation off and prompt lookup k in ``--k`` (llama-server ``--spec-type ngram-simple
--spec-ngram-simple-size-n 2 --spec-ngram-simple-size-m K``, ``-np 8 -t 2``, SmolLM2-135M Q4_1) and each
concurrency, the project's load generator (:func:`measure.serve.client.run_load`: streamed chat
completions, ``temperature`` 0, ``ignore_eos``) sends ``--requests`` requests of the project's prompts,
with ``/metrics`` scraped before and after. One measurement, two layouts:

* ``vllm_bench/<config>.json``: one result object per load, one per line (``--append-result``), with the
  keys ``vllm/benchmarks/serve.py`` writes (vLLM main at commit ``009e6d4a1cd6``: ``main_async()``'s setup
  keys, ``benchmark()``'s result with ``--save-detailed``'s per-request lists, the ``mean/median/std/p99``
  of ttft, tpot, itl and e2el); its ``spec_decode_*`` fields are the deltas of the scrapes computed as
  ``benchmark()`` computes them from ``vllm:spec_decode_*`` (llama-server's ``llamacpp:spec_decode_*``
  counters copy vLLM's names and definitions); ``generated_texts`` are empty (the load generator does
  not keep the text);
* ``inference_perf/<config>/``: ``per_request_lifecycle_metrics.json``, ``stage_<i>_lifecycle_metrics.json``
  (one concurrent stage per load) and ``config.yaml`` as inference-perf 0.5.0 writes them (commit
  ``7de5ef2ed6f7``: ``reportgen/base.py``), the scrapes beside the directory as
  ``<config>.c<C>.before.prom`` / ``.after.prom``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from datetime import datetime
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's packages, run from anywhere
sys.path.insert(0, str(Path(__file__).resolve().parent))

from guidellm_fixtures import MODEL, PROMPT_CHARS, get, prompt_texts, start_server  # noqa: E402

from measure.serve.client import Endpoint, RequestSpec, run_load  # noqa: E402
from measure.serve.binary import checked, server_binary  # noqa: E402
from measure.serve.units import LoadSpec  # noqa: E402
from toolkit.prometheus import counter_delta, parse_scrape  # noqa: E402

MODEL_ID = "SmolLM2-135M-Instruct"


def _stats(name: str, values_s: list[float]) -> dict:
    x = np.asarray(values_s, dtype=float) * 1000.0 if values_s else np.zeros(1)
    return {f"mean_{name}_ms": float(x.mean()), f"median_{name}_ms": float(np.median(x)),
            f"std_{name}_ms": float(x.std()), f"p99_{name}_ms": float(np.percentile(x, 99))}


def _spec(before: str, after: str) -> dict:
    b, a = parse_scrape(before), parse_scrape(after)
    pre = "llamacpp:spec_decode_"
    drafts = counter_delta(b, a, pre + "num_drafts")
    if drafts is None:
        return {}
    dtok = counter_delta(b, a, pre + "num_draft_tokens") or 0.0
    acc = counter_delta(b, a, pre + "num_accepted_tokens") or 0.0
    per = []
    for i in range(64):
        v = counter_delta(b, a, pre + "num_accepted_tokens_per_pos", {"position": str(i)})
        if v is None:
            break
        per.append(v / drafts if drafts > 0 else 0.0)
    if dtok <= 0:  # vLLM writes its spec_decode_* only when something was drafted
        return {}
    return {"spec_decode_acceptance_rate": acc / dtok * 100, "spec_decode_acceptance_length":
            1 + acc / drafts if drafts > 0 else 0.0, "spec_decode_num_drafts": int(drafts),
            "spec_decode_draft_tokens": int(dtok), "spec_decode_accepted_tokens": int(acc),
            "spec_decode_per_position_acceptance_rates": per}


def vllm_result(results: list, c: int, n: int, spec: dict) -> dict:
    """One ``vllm bench serve`` result object (``main_async()`` keys, then ``benchmark()``'s)."""
    ok = [r for r in results if r.error is None and r.event_s]
    t0 = min(r.sent_s for r in results)
    dur = max(r.event_s[-1] for r in ok) - t0
    ttft = [r.event_s[0] - r.sent_s if r in ok else 0.0 for r in results]
    lat = [r.event_s[-1] - r.sent_s if r in ok else 0.0 for r in results]
    itl = [list(np.diff(r.event_s)) if r in ok else [] for r in results]
    out_lens = [r.tokens or len(r.event_s) if r in ok else 0 for r in results]
    in_lens = [r.prompt_tokens or 0 for r in results]
    tpot = [(lat[i] - ttft[i]) / (out_lens[i] - 1) for i, r in enumerate(results) if r in ok and out_lens[i] > 1]
    res = {"date": datetime.now().strftime("%Y%m%d-%H%M%S"), "endpoint_type": "openai-chat",
           "backend": "openai-chat", "label": None, "model_id": MODEL_ID, "tokenizer_id": MODEL_ID,
           "num_prompts": n, "request_rate": "inf", "burstiness": 1.0, "max_concurrency": c,
           "duration": dur, "completed": len(ok), "failed": len(results) - len(ok),
           "total_input_tokens": sum(in_lens), "total_output_tokens": sum(out_lens),
           "request_throughput": len(ok) / dur, "request_goodput": None, "output_throughput": sum(out_lens) / dur,
           "total_token_throughput": (sum(in_lens) + sum(out_lens)) / dur, "input_lens": in_lens,
           "output_lens": out_lens, "ttfts": ttft, "itls": itl, "latencies": lat,
           "start_times": [r.sent_s for r in results], "queue_times": [0.0] * len(results),
           "generated_texts": [""] * len(results), "errors": [r.error or "" for r in results],
           "max_output_tokens_per_s": 0.0, "max_concurrent_requests": c, "rtfx": 0.0}
    res.update(spec)
    for name, vals in (("ttft", [ttft[i] for i, r in enumerate(results) if r in ok]), ("tpot", tpot),
                       ("itl", [g for x in itl for g in x]), ("e2el", [lat[i] for i, r in enumerate(results)
                                                                        if r in ok])):
        res.update(_stats(name, vals))
    return res


def _summary(values: list[float]) -> dict | None:
    if not values:
        return None
    x = np.asarray(values, dtype=float)
    return {"mean": float(x.mean()), "min": float(x.min()), "p0.1": float(np.percentile(x, 0.1)),
            "p1": float(np.percentile(x, 1)), "p5": float(np.percentile(x, 5)), "p10": float(np.percentile(x, 10)),
            "p25": float(np.percentile(x, 25)), "median": float(np.median(x)), "p75": float(np.percentile(x, 75)),
            "p90": float(np.percentile(x, 90)), "p95": float(np.percentile(x, 95)),
            "p99": float(np.percentile(x, 99)), "p99.9": float(np.percentile(x, 99.9)), "max": float(x.max())}


def ip_records(results: list, stage: int) -> list[dict]:
    """``per_request_lifecycle_metrics.json`` records (``{start_time, end_time, request, response, info,
    error}``, ``info`` = ``InferenceInfo.model_dump()``)."""
    out = []
    for r in results:
        ok = r.error is None and bool(r.event_s)
        usage = {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.tokens,
                 "total_tokens": (r.prompt_tokens or 0) + (r.tokens or 0)} if ok else None
        info = {"request_metrics": {"text": {"input_tokens": r.prompt_tokens or 0}, "image": None, "video": None,
                                    "audio": None},
                "response_metrics": {"output_tokens": r.tokens or 0, "server_usage": usage,
                                     "response_chunks": [], "chunk_times": list(r.event_s),
                                     "output_token_times": list(r.event_s)} if ok else None,
                "extra_info": {}, "lora_adapter": None, "labels": {}, "input_tokens": r.prompt_tokens or 0}
        out.append({"start_time": r.sent_s, "end_time": r.event_s[-1] if ok else r.done_s,
                    "request": json.dumps({"model": MODEL_ID, "stream": True}), "response": None, "info": info,
                    "error": None if ok else {"error_type": "client", "error_msg": r.error}})
    return out


def ip_stage(results: list, c: int) -> dict:
    """``stage_<i>_lifecycle_metrics.json`` (``ResponsesSummary``: a concurrent stage's load_summary)."""
    ok = [r for r in results if r.error is None and r.event_s]
    starts = [r.sent_s for r in results]
    send = max(starts) - min(starts)
    total = max(r.event_s[-1] for r in ok) - min(starts)
    lat = [r.event_s[-1] - r.sent_s for r in ok]
    ttft = [r.event_s[0] - r.sent_s for r in ok]
    itl = [g for r in ok for g in np.diff(r.event_s)]
    out_tok = [float(r.tokens or 0) for r in ok]
    return {"benchmark_time_seconds": total,
            "load_summary": {"count": len(results), "schedule_delay": _summary([0.0] * len(results)),
                             "send_duration": send, "requested_rate": len(results) / total,
                             "achieved_rate": len(results) / send if send > 0 else 0.0, "concurrency": c},
            "successes": {"count": len(ok), "latency": {"request_latency": _summary(lat),
                                                        "time_to_first_token": _summary(ttft),
                                                        "inter_token_latency": _summary(itl)},
                          "throughput": {"output_tokens_per_sec": sum(out_tok) / total,
                                         "requests_per_sec": len(ok) / total},
                          "prompt_tokens": _summary([float(r.prompt_tokens or 0) for r in ok]),
                          "output_tokens": _summary(out_tok), "token_count_mismatches": 0},
            "failures": {"count": len(results) - len(ok), "request_latency": None, "prompt_tokens": None,
                         "by_label": {}}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="tests/fixtures/benchfiles")
    p.add_argument("--k", default="2,4")
    p.add_argument("--concurrency", default="1,2,4,8")
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    out = Path(a.out)
    (out / "commands.txt").write_text(f"# {' '.join([sys.executable, *sys.argv])}\n")
    (out / "vllm_bench").mkdir(parents=True, exist_ok=True)
    (out / "inference_perf").mkdir(parents=True, exist_ok=True)
    texts = prompt_texts(PROMPT_CHARS)
    specs = [RequestSpec(i, f"p{i % len(texts)}", "benchfile", texts[i % len(texts)]) for i in range(a.requests)]
    binary = checked(server_binary(), MODEL).path  # the CPU backend that runs here, as measure serve does
    logs = Path(tempfile.gettempdir()) / "specscope-benchfile-logs"  # not committed
    logs.mkdir(exist_ok=True)
    loads = [int(c) for c in a.concurrency.split(",")]
    for k in [0] + [int(x) for x in a.k.split(",")]:
        name = f"k{k}" if k else "off"
        proc, port, server_cmd = start_server(binary, k, 8, a.threads, logs / f"bench-{name}.server.log")
        try:
            ep = Endpoint(f"http://127.0.0.1:{port}", extra=(("temperature", 0.0), ("ignore_eos", True)))
            run_load(ep, specs[:1], LoadSpec(1), 8)
            lines, recs, ipd = [], [], out / "inference_perf" / name
            ipd.mkdir(exist_ok=True)
            for i, c in enumerate(loads):
                before = get(f"{ep.base_url}/metrics")
                res = run_load(ep, specs, LoadSpec(concurrency=c), a.max_tokens).results
                after = get(f"{ep.base_url}/metrics")
                (out / "inference_perf" / f"{name}.c{c}.before.prom").write_text(before)
                (out / "inference_perf" / f"{name}.c{c}.after.prom").write_text(after)
                lines.append(json.dumps(vllm_result(res, c, a.requests, _spec(before, after))))
                recs.extend(ip_records(res, i))
                (ipd / f"stage_{i}_lifecycle_metrics.json").write_text(json.dumps(ip_stage(res, c), indent=2))
                print(f"{name} c{c}: done", flush=True)
            (out / "vllm_bench" / f"{name}.json").write_text("\n".join(lines) + "\n")
            with (out / "commands.txt").open("a") as f:
                f.write(f"# server {name}: {server_cmd}\n")
            (ipd / "per_request_lifecycle_metrics.json").write_text(json.dumps(recs, indent=2))
            stages = "".join(f"  - num_requests: {a.requests}\n    concurrency_level: {c}\n" for c in loads)
            (ipd / "config.yaml").write_text(
                f"api:\n  type: chat\n  streaming: true\nserver:\n  type: vllm\n  model_name: {MODEL_ID}\n"
                f"  base_url: http://127.0.0.1:{port}\nload:\n  type: concurrent\n  stages:\n{stages}")
        finally:
            proc.terminate()
            proc.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
