"""The load generator: streaming chat (or raw) completions against an OpenAI-compatible server.

Closed loop: ``C`` clients, each sending its next request as soon as its last
one finished. Open loop: requests leave at seeded Poisson times
(``numpy.random.default_rng(seed)``), whether or not earlier ones finished.
Every streamed chunk that carries text is timestamped on arrival
(``time.perf_counter``), so a request yields its TTFT, every inter-token
time and its end-to-end latency; the final chunk's ``usage`` and (llama-server)
``timings`` are kept. The generator measures its own cost: the CPU time of
this process over the unit (:func:`run_load` returns it) and, open loop, how
late each request left against its schedule.

**What counts.** A request finished only when its event stream ended with
``data: [DONE]`` after at least one token; anything else is a failed request
with the reason in words (an HTTP error, a 200 answered with a plain body, a
chunk that is not a JSON object, an ``error`` chunk, a stream that stops
before ``[DONE]``, or a *stall*: no line for ``stall_s`` seconds). Its tokens
are the chunks that carried text, as streamed; the server's
``usage.completion_tokens`` is kept beside them only to be checked
(:func:`usage_disagreement`), never used for a throughput.

One ``httpx2.AsyncClient`` on one asyncio loop; no request is retried.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import httpx2
import numpy as np

from measure.serve.units import LoadSpec

REQUEST_TIMEOUT_S = 600.0
#: Seconds without a line from a started stream after which its request fails (``--stall-timeout``).
STALL_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class RequestSpec:
    """One request to send: its index in the unit, the prompt's id/domain, the user message or raw prompt."""

    index: int
    prompt_id: str
    domain: str
    text: str


@dataclass
class RequestResult:
    """What the client saw of one request (times in s from ``time.perf_counter``)."""

    index: int
    prompt_id: str
    domain: str
    sent_s: float = math.nan
    scheduled_s: float = math.nan
    event_s: list[float] = field(default_factory=list)
    done_s: float = math.nan
    tokens: int | None = None  # chunks that carried text, as streamed
    usage_tokens: Any = None  # the server's usage.completion_tokens as it answered (checked, never used)
    prompt_tokens: int | None = None
    timings: dict = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True)
class Endpoint:
    """Where and how to ask: ``chat`` (``/v1/chat/completions``, the message as the user turn) or ``raw``
    (``/v1/completions``, the text as the prompt); ``extra`` goes into every request body."""

    base_url: str
    model: str = "default"
    mode: str = "chat"
    extra: tuple[tuple[str, Any], ...] = ()

    def body(self, text: str, max_tokens: int) -> dict:
        b: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
                             "stream_options": {"include_usage": True}}
        if self.mode == "chat":
            b["messages"] = [{"role": "user", "content": text}]
        else:
            b["prompt"] = text
        b.update(dict(self.extra))
        return b

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.mode == "chat" else "/v1/completions"


def _chunk_text(obj: dict) -> str:
    choices = obj.get("choices") or []
    if not choices:
        return ""
    c = choices[0]
    if "delta" in c:
        return (c.get("delta") or {}).get("content") or ""
    return c.get("text") or ""


def _count(v: Any) -> int | None:
    """A token count the server reported, if it is one (a non-negative integer), else None."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _chunk(res: RequestResult, payload: str, now: float) -> str | None:
    """Take one ``data:`` payload into ``res``; why the request failed, if this chunk fails it."""
    obj = json.loads(payload)
    if not isinstance(obj, dict):
        return f"a stream chunk is not a JSON object ({' '.join(payload.split())[:80]})"
    if obj.get("error"):
        return f"the stream carried an error ({' '.join(json.dumps(obj['error']).split())[:160]})"
    if _chunk_text(obj):
        res.event_s.append(now)
    usage = obj.get("usage")
    if isinstance(usage, dict):
        res.usage_tokens = usage.get("completion_tokens")
        res.prompt_tokens = _count(usage.get("prompt_tokens"))
    if isinstance(obj.get("timings"), dict):
        res.timings = obj["timings"]
    return None


async def _stream(resp: Any, res: RequestResult, stall_s: float) -> str | None:
    """Read an event stream into ``res`` until ``data: [DONE]``; why the request failed (None: it finished)."""
    lines = resp.aiter_lines().__aiter__()
    other: list[str] = []
    while True:
        try:
            line = await asyncio.wait_for(lines.__anext__(), stall_s)
        except StopAsyncIteration:
            break
        except asyncio.TimeoutError:
            return f"the stream stalled: no chunk for {stall_s:g} s after {len(res.event_s)} token(s)"
        if not line.startswith("data:"):
            if line.strip() and len(other) < 3:
                other.append(line.strip())
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return None if res.event_s else "the stream ended with no token"
        why = _chunk(res, payload, time.perf_counter())
        if why is not None:
            return why
    if not res.event_s and other:
        kind = resp.headers.get("content-type", "") or "none"
        return (f"HTTP 200 without an event stream (content-type {kind}: "
                f"{' '.join(' '.join(other).split())[:120]})")
    return f"the stream ended before data: [DONE] after {len(res.event_s)} token(s)"


async def _one(client: Any, ep: Endpoint, spec: RequestSpec, max_tokens: int, res: RequestResult,
               stall_s: float = STALL_TIMEOUT_S) -> None:
    """Send one streaming request and fill ``res`` as its chunks arrive (module docstring: what counts)."""
    res.sent_s = time.perf_counter()
    try:
        async with client.stream("POST", ep.base_url + ep.path, json=ep.body(spec.text, max_tokens)) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode(errors="replace")[:200]
                res.error = f"HTTP {resp.status_code}: {' '.join(body.split())}"
                return
            res.error = await _stream(resp, res, stall_s)
    except (httpx2.HTTPError, ValueError, OSError) as e:
        res.error = f"{type(e).__name__}: {' '.join(str(e).split()) or 'connection failed'}"
    finally:
        res.done_s = time.perf_counter()
        res.tokens = len(res.event_s)


def usage_disagreement(results: Sequence[RequestResult]) -> str | None:
    """In words, the finished requests whose server-reported ``usage.completion_tokens`` is not the streamed
    count (the streamed count is the one used); None when every report agrees or there is none."""
    bad = [r for r in results if r.error is None and r.usage_tokens is not None and r.usage_tokens != r.tokens]
    if not bad:
        return None
    r = bad[0]
    return (f"the server's usage.completion_tokens disagrees with the streamed tokens in {len(bad)} of "
            f"{len(results)} requests (e.g. {str(r.usage_tokens)[:40]} for {r.tokens} streamed); the streamed "
            "count is used")


@dataclass(frozen=True)
class LoadResult:
    """A unit's requests and the generator's own cost: CPU seconds of this process, wall seconds, send lags."""

    results: list[RequestResult]
    started_s: float
    wall_s: float
    client_cpu_s: float
    send_lag_ms: np.ndarray


def arrival_offsets_s(n: int, rate_per_s: float, seed: int) -> np.ndarray:
    """Seeded Poisson arrival times (s from the unit's start) of ``n`` requests at ``rate_per_s``."""
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.exponential(1.0 / rate_per_s, size=n))


async def _run(ep: Endpoint, requests: Sequence[RequestSpec], load: LoadSpec, max_tokens: int,
               seed: int, stall_s: float) -> LoadResult:
    results = [RequestResult(r.index, r.prompt_id, r.domain) for r in requests]
    n_conn = load.concurrency if load.closed else len(requests)
    limits = httpx2.Limits(max_connections=max(n_conn, 1) + 2, max_keepalive_connections=max(n_conn, 1) + 2)
    async with httpx2.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        if load.closed:
            queue = iter(range(len(requests)))

            async def worker() -> None:
                for i in queue:
                    await _one(client, ep, requests[i], max_tokens, results[i], stall_s)

            await asyncio.gather(*(worker() for _ in range(min(load.concurrency, len(requests)))))
        else:
            offsets = arrival_offsets_s(len(requests), load.rate_per_s, seed)

            async def timed(i: int) -> None:
                results[i].scheduled_s = t0 + float(offsets[i])
                delay = results[i].scheduled_s - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                await _one(client, ep, requests[i], max_tokens, results[i], stall_s)

            await asyncio.gather(*(timed(i) for i in range(len(requests))))
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
    lags = np.array([(r.sent_s - r.scheduled_s) * 1000.0 for r in results if not math.isnan(r.scheduled_s)])
    return LoadResult(results, t0, wall, cpu, lags)


def run_load(ep: Endpoint, requests: Sequence[RequestSpec], load: LoadSpec, max_tokens: int,
             seed: int = 0, stall_s: float = STALL_TIMEOUT_S) -> LoadResult:
    """Drive ``requests`` through ``ep`` under ``load``; every request's result, however it ended (a stream
    with no line for ``stall_s`` seconds fails its request)."""
    return asyncio.run(_run(ep, requests, load, max_tokens, seed, stall_s))


def get_json(url: str, timeout_s: float = 10.0) -> tuple[int, Any]:
    """``GET url`` → (status, parsed JSON or text); ``(0, reason)`` when nothing answers."""
    try:
        r = httpx2.get(url, timeout=timeout_s)
    except httpx2.HTTPError as e:
        return 0, f"{type(e).__name__}: {' '.join(str(e).split()) or 'no answer'}"
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, r.text
