"""The serving run: units in alternating blocks, each on a freshly started server, written as they finish.

Order: for each repeat, the configurations in an order rotated by the repeat
(speculation off first in repeat 0, second in repeat 1, ...), so baseline and
speculative blocks alternate and machine drift spreads over all of them; within
a block, one server process serves every load (also rotated). Before a block's
units the server answers one short warm-up request (not recorded). Per unit:
``/metrics`` is scraped before and after (both scrapes kept under
``metrics/``), the load is driven, then its rows go to the tables and its
``serve_units`` row last. A unit already finished in ``--out`` is skipped
(resume); a server that dies mid-unit loses that unit only: the run is closed
``interrupted`` with one line, and the same command resumes it.

A unit is finished only when every request of its load finished
(:mod:`measure.serve.client`: what counts). A unit with a failed request is
not written: it is counted in ``run.json`` ``failed_units`` (requests,
failures, the first reason), :func:`run_units` returns it, and a resume
measures it again; a unit whose every request failed stops the run there (the
server is not answering as one that streams completions).

With ``--until-decided`` (:mod:`measure.serve.race`) the race looks after each
repeat (before the next repeat's first block; recorded in ``run.json``
``race``); a unit its load's race no longer needs is not measured, a block
with no such unit starts no server, and the run stops once every load is
decided, at the time budget (checked before each unit after the first repeat:
a run overshoots it by one unit at most) or after the last repeat.
"""

from __future__ import annotations

import math
import os
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from measure.racing import RaceRule
from measure.records import Terminated, load_run
from measure.system import cpu_sample, other_cpu_shares
from measure.serve.client import STALL_TIMEOUT_S, Endpoint, LoadResult, RequestSpec, get_json, run_load, \
    usage_disagreement
from measure.serve.race import ServeRace
from measure.serve.units import (
    LoadSpec,
    RequestRow,
    ServeConfig,
    ServeRunWriter,
    StepCostRow,
    TokenRow,
    UnitId,
    UnitRow,
    order_stat_ci,
)
from toolkit.prometheus import Scrape, counter_delta, parse_scrape

SPEC_PREFIX = "llamacpp:spec_decode_"
WARMUP_TOKENS = 8


class Interrupted(Terminated):
    """The run stopped before its end and was closed ``interrupted`` (a dead server); ``str`` says why."""


@dataclass(frozen=True)
class Plan:
    """A serving run, validated: what to start (or the URL), which units, which prompts."""

    configs: tuple[ServeConfig, ...]
    loads: tuple[LoadSpec, ...]
    slots: int
    requests: int
    max_new_tokens: int
    repeats: int
    seed: int
    prompts: tuple[RequestSpec, ...]
    threads: int = 0
    ctx_size: int = 0
    batch_tokens: int = 2048
    model_path: Path | None = None
    binary: Path | None = None
    url: str | None = None
    synth_loads: tuple[LoadSpec, ...] = ()
    synth_configs: tuple[ServeConfig, ...] = ()
    synth_requests: int = 0  # requests per step-cost unit (0: as ``requests``)
    synth_repeats: int = 0  # repeats of the step-cost units, in the first repeats' blocks (0: as ``repeats``)
    stall_s: float = STALL_TIMEOUT_S  # a stream with no line for this long fails its request
    #: ``--until-decided``: a race per load (:mod:`measure.serve.race`), its rule (``max_looks``: the repeats)
    race_rule: RaceRule | None = None
    time_budget_s: float | None = None  # with ``race_rule``: no unit after this many seconds of measuring (first repeat whole)

    def race(self) -> ServeRace | None:
        """The race of ``--until-decided`` (None: the fixed design, every unit)."""
        if self.race_rule is None:
            return None
        return ServeRace(self.race_rule, self.configs, self.loads, self.slots, self.time_budget_s)

    def blocks(self) -> list[tuple[int, int, ServeConfig, list[LoadSpec]]]:
        """(block, repeat, configuration, loads in order) for every block, in the order they run."""
        out: list[tuple[int, int, ServeConfig, list[LoadSpec]]] = []
        for r in range(self.repeats):
            for group, loads, repeats in ((self.configs, self.loads, self.repeats),
                                          (self.synth_configs, self.synth_loads, self.synth_repeats or self.repeats)):
                if not group or not loads or r >= repeats:
                    continue
                rot, lrot = r % len(group), r % len(loads)
                for cfg in group[rot:] + group[:rot]:
                    out.append((len(out), r, cfg, list(loads[lrot:] + loads[:lrot])))
        return out

    def unit_ids(self) -> list[str]:
        return [UnitId(cfg, self.slots, ld, r).to_str() for _, r, cfg, loads in self.blocks() for ld in loads]


#: Most k a synthetic unit can draft in full: its prompt repeats 26 tokens that each occur once a period.
SYNTH_K_MAX = 24


def synth_prompt(n_tokens: int) -> str:
    """The alphabet over and over (``a b c ... z a b ...``: 26 tokens a period in SmolLM2's vocabulary, each
    occurring once a period), about ``n_tokens`` tokens: llama-server's ngram-simple lookup of one token finds
    its last occurrence a period back and drafts up to 25 tokens after it, whatever the model generates."""
    letters = [chr(ord("a") + i % 26) for i in range(max(n_tokens, 2 * 26))]
    return " ".join(letters)


def _requests(plan: Plan, config: ServeConfig) -> list[RequestSpec]:
    if config.synthetic:
        text = synth_prompt(config.prompt_tokens)
        return [RequestSpec(i, f"synth/p{config.prompt_tokens}", "synthetic", text)
                for i in range(plan.synth_requests or plan.requests)]
    return [RequestSpec(i, p.prompt_id, p.domain, p.text)
            for i, p in ((i, plan.prompts[i % len(plan.prompts)]) for i in range(plan.requests))]


def _pct(x: np.ndarray, q: float) -> float | None:
    return float(np.percentile(x, q)) if x.size else None


def _scrape(base_url: str) -> tuple[str | None, Scrape | None]:
    status, body = get_json(base_url + "/metrics")
    if status != 200 or not isinstance(body, str):
        return None, None
    s = parse_scrape(body)
    return (body, s) if s.samples else (None, None)


def request_rows(cid: str, load: LoadResult) -> tuple[list[RequestRow], list[TokenRow]]:
    """A unit's ``serve_requests`` and ``serve_tokens`` rows from what the client saw."""
    reqs, toks = [], []
    for r in load.results:
        ev = np.asarray(r.event_s)
        ok = r.error is None and ev.size > 0
        t = r.timings or {}
        ttft = (ev[0] - r.sent_s) * 1000.0 if ok else None
        e2e = (ev[-1] - r.sent_s) * 1000.0 if ok else None
        n = r.tokens if r.tokens is not None else int(ev.size)
        tpot = (ev[-1] - ev[0]) * 1000.0 / (n - 1) if ok and n and n > 1 else None
        reqs.append(RequestRow(cid, r.index, r.prompt_id, r.domain, r.sent_s - load.started_s, ttft, e2e, tpot,
                               n if r.error is None else None, int(ev.size), r.prompt_tokens, t.get("draft_n"),
                               t.get("draft_n_accepted"), t.get("predicted_ms"), t.get("prompt_ms"), r.error))
        prev = r.sent_s
        for j, e in enumerate(ev):
            toks.append(TokenRow(cid, r.index, j, (e - r.sent_s) * 1000.0, None if j == 0 else (e - prev) * 1000.0))
            prev = e
    return reqs, toks


def step_cost_rows(cid: str, config: ServeConfig, load: LoadResult, new_tokens: int,
                   bucket_tokens: int = 64) -> list[StepCostRow]:
    """What a step cost in a synthetic unit (every slot emits one token a step: the steps are the moments the
    slots' tokens arrive together).

    The arrival times of all requests' tokens are merged; tokens within 1 ms of each other belong to one step.
    A step counts when every request that had been sent by then was generating in it (no prompt in the batch)
    and each of its slots' drafts was full (more than k + 1 tokens left); its time is the gap since the step
    before. Rows per (slots generating, context bucket): median, 95% CI. One more row per unit: the TTFT of the
    requests sent at once at its start (a batch of prompts).
    """
    k1 = config.k + 1
    res = [r for r in load.results if r.error is None and r.event_s]
    if not res:
        return []
    events = sorted((e, i, j) for i, r in enumerate(res) for j, e in enumerate(r.event_s))
    steps: list[list[tuple[float, int, int]]] = []
    for ev in events:
        if steps and ev[0] - steps[-1][-1][0] <= 1e-3:
            steps[-1].append(ev)
        else:
            steps.append([ev])
    samples: dict[tuple[int, int], list[float]] = {}
    prompt_len = {i: (r.prompt_tokens or 0) for i, r in enumerate(res)}
    for a, b in zip(steps, steps[1:]):
        t_end = b[0][0]
        gap_ms = (t_end - a[-1][0]) * 1000.0
        gen = {i for _, i, _ in b}
        sent = {i for i, r in enumerate(res) if r.sent_s < t_end and r.event_s[-1] >= t_end}
        if any(j == 0 for _, _, j in b) or gen != sent:
            continue
        if any(new_tokens - j - 1 < k1 for _, _, j in b):
            continue
        ctx = float(np.mean([prompt_len[i] + j for _, i, j in b]))
        samples.setdefault((len(gen), int(ctx // bucket_tokens)), []).append(gap_ms)
    rows = []
    for (seqs, bucket), gaps in sorted(samples.items()):
        v, lo, hi = order_stat_ci(np.asarray(gaps))
        rows.append(StepCostRow(cid, seqs, k1, (bucket + 0.5) * bucket_tokens, len(gaps), v, lo, hi))
    first_wave = [r for r in res if r.sent_s - load.started_s < 0.05]
    if first_wave:
        ttfts = np.array([(r.event_s[0] - r.sent_s) * 1000.0 for r in first_wave])
        rows.append(StepCostRow(cid, len(first_wave), k1, float(np.mean([prompt_len[i] for i in range(len(res))])),
                                len(first_wave), None, None, None,
                                int(sum(r.prompt_tokens or 0 for r in first_wave)), float(np.median(ttfts))))
    return rows


def unit_row(uid: UnitId, block: int, load: LoadResult, before: Scrape | None, after: Scrape | None,
             new_tokens: int, hardware: str) -> UnitRow:
    """The ``serve_units`` row: throughput over the unit, percentiles over its requests and tokens, counters."""
    ok = [r for r in load.results if r.error is None and r.event_s]
    first = min((r.sent_s for r in ok), default=math.nan)
    last = max((r.event_s[-1] for r in ok), default=math.nan)
    tokens = int(sum((r.tokens or 0) for r in ok))
    dur = last - first
    ttft = np.array([(r.event_s[0] - r.sent_s) * 1000.0 for r in ok])
    e2e = np.array([(r.event_s[-1] - r.sent_s) * 1000.0 for r in ok])
    tpot = np.array([(r.event_s[-1] - r.event_s[0]) * 1000.0 / ((r.tokens or len(r.event_s)) - 1)
                     for r in ok if (r.tokens or len(r.event_s)) > 1])
    itl = np.concatenate([np.diff(r.event_s) * 1000.0 for r in ok]) if ok else np.array([])
    counters: dict[str, Any] = {}
    if before is not None and after is not None:
        for key, name in (("drafts", "spec_decode_num_drafts"), ("draft_tokens", "spec_decode_num_draft_tokens"),
                          ("accepted_tokens", "spec_decode_num_accepted_tokens"),
                          ("tokens_predicted", "tokens_predicted"), ("n_decode", "n_decode"),
                          ("prompt_tokens", "prompt_tokens")):
            v = counter_delta(before, after, "llamacpp:" + name)
            counters[key] = None if v is None else int(round(v))
        pos = []
        for i in range(64):
            v = counter_delta(before, after, SPEC_PREFIX + "num_accepted_tokens_per_pos", {"position": str(i)})
            if v is None:
                break
            pos.append(str(int(round(v))))
        counters["accepted_per_pos"] = " ".join(pos) if pos else None
    cfg = uid.config
    return UnitRow(
        cell_id=uid.to_str(), config=cfg.to_str(), spec_type="ngram-simple" if cfg.speculative else "none",
        spec_k=cfg.k, spec_ngram_n=cfg.ngram_n, slots=uid.slots, load=uid.load.to_str(),
        concurrency=uid.load.concurrency or None, rate_per_s=uid.load.rate_per_s or None, repeat=uid.repeat,
        block=block, synthetic=cfg.synthetic, n_requests=len(load.results), n_errors=len(load.results) - len(ok),
        new_tokens=new_tokens, duration_s=float(dur) if ok else 0.0, completion_tokens=tokens,
        throughput_tokens_per_s=tokens / dur if ok and dur > 0 else None,
        ttft_p50_ms=_pct(ttft, 50), ttft_p95_ms=_pct(ttft, 95), ttft_p99_ms=_pct(ttft, 99),
        tpot_p50_ms=_pct(tpot, 50), tpot_p95_ms=_pct(tpot, 95), tpot_p99_ms=_pct(tpot, 99),
        itl_p50_ms=_pct(itl, 50), itl_p95_ms=_pct(itl, 95), itl_p99_ms=_pct(itl, 99),
        e2e_p50_ms=_pct(e2e, 50), e2e_p95_ms=_pct(e2e, 95), e2e_p99_ms=_pct(e2e, 99),
        metrics=before is not None and after is not None,
        drafts=counters.get("drafts"), draft_tokens=counters.get("draft_tokens"),
        accepted_tokens=counters.get("accepted_tokens"), accepted_per_pos=counters.get("accepted_per_pos"),
        tokens_predicted=counters.get("tokens_predicted"), n_decode=counters.get("n_decode"),
        prompt_tokens=counters.get("prompt_tokens"), client_cpu_s=load.client_cpu_s,
        client_cpu_share=load.client_cpu_s / load.wall_s if load.wall_s > 0 else 0.0,
        send_lag_p99_ms=_pct(load.send_lag_ms, 99), hardware=hardware)


def _safe(cid: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", cid)


@dataclass
class Progress:
    """What the runner tells the CLI as units finish (printing is the CLI's)."""

    on_unit: Callable[[UnitRow], None] = lambda row: None
    on_block: Callable[[str], None] = lambda text: None
    on_failed: Callable[["UnitFailure"], None] = lambda failure: None
    on_note: Callable[[str], None] = lambda text: None


@dataclass(frozen=True)
class UnitFailure:
    """A unit measured with failed requests: not finished, not written; ``run.json`` ``failed_units`` holds it."""

    unit: str
    n_requests: int
    n_failed: int
    error: str  # the first failed request's reason

    @property
    def all_failed(self) -> bool:
        return self.n_failed == self.n_requests

    def text(self) -> str:
        return f"{self.unit}: {self.n_failed} of {self.n_requests} requests failed ({self.error})"

    def as_dict(self) -> dict:
        return {"unit": self.unit, "n_requests": self.n_requests, "n_failed": self.n_failed, "error": self.error}


def run_units(plan: Plan, writer: ServeRunWriter, progress: Progress, hardware: str,
              server_factory: Callable[[ServeConfig, Path], Any] | None = None) -> list[UnitFailure]:
    """Measure every unit of ``plan`` not finished in ``writer``'s run; the units that had failed requests
    (not written; the run goes on, except after a unit whose every request failed: it stops there).

    ``server_factory(config, log_path)`` gives a context manager with ``base_url``, ``alive()`` and ``died()``
    (:class:`~measure.serve.server.LlamaServer`); None with ``plan.url``: the server is already running.
    """
    failures: list[UnitFailure] = []
    race, started = plan.race(), time.monotonic()
    for block, r, cfg, loads in plan.blocks():
        if failures and failures[-1].all_failed:
            break
        if race is not None and r == race.n_looks + 1 and not _race_looks(race, writer, progress, started):
            break
        todo = [ld for ld in loads if not writer.is_finished(UnitId(cfg, plan.slots, ld, r).to_str())]
        if race is not None and todo and not any(race.needs(cfg, ld) for ld in todo):
            progress.on_block(f"block {block}: {cfg.to_str()}, repeat {r}: no load needs it (the race), not started")
        todo = [ld for ld in todo if race is None or race.needs(cfg, ld)]
        if not todo:
            continue
        progress.on_block(f"block {block}: {cfg.to_str()}, repeat {r}, {len(todo)} load(s)")
        log = writer.path / "logs" / f"server-block{block:03d}-{_safe(cfg.to_str())}.log"
        ctx = server_factory(cfg, log) if server_factory is not None else None
        srv = ctx.__enter__() if ctx is not None else None
        try:
            if srv is not None:
                _record_slot_context(plan, writer, progress, srv.base_url, log)
            ep = _endpoint(plan, cfg, srv.base_url if srv is not None else str(plan.url))
            run_load(ep, [RequestSpec(0, "warmup", "warmup", _requests(plan, cfg)[0].text)], LoadSpec(1),
                     WARMUP_TOKENS, plan.seed, plan.stall_s)
            for ld in todo:
                if race is not None and r > 0 and race.over_budget(time.monotonic() - started):
                    # (the first repeat always completes: without its look no load has a leader)
                    writer.update(race=race.summary("time budget"))  # a cut repeat is not looked at
                    progress.on_note(f"race: the time budget ({race.time_budget_s:g} s) is spent: the run stops")
                    return failures
                failed = _one_unit(plan, writer, progress, hardware, UnitId(cfg, plan.slots, ld, r), block, ep, srv)
                _record_failure(writer, UnitId(cfg, plan.slots, ld, r).to_str(), failed)
                if failed is not None:
                    failures.append(failed)
                    progress.on_failed(failed)
                    if failed.all_failed:
                        break
        finally:
            if ctx is not None:
                ctx.__exit__(None, None, None)
    else:
        if race is not None and race.n_looks < plan.repeats:
            _race_looks(race, writer, progress, started)  # the look after the last repeat
    return failures


def _race_looks(race: ServeRace, writer: ServeRunWriter, progress: Progress, started: float) -> bool:
    """The race's look after its next repeat, recorded in ``run.json`` ``race``; whether to measure on. No look
    while a unit that repeat needed is not finished (its requests failed): the run stops there."""
    r = race.n_looks
    if any(not writer.is_finished(u.to_str()) for u in race.needed(r)):
        return False
    for note in race.look(load_run(writer.path).table("serve_units")):
        progress.on_note(note)
    reason = race.stop_reason(time.monotonic() - started)
    writer.update(race=race.summary(reason))
    return reason is None


def slot_context(base_url: str, log: Path | None = None) -> int | None:
    """The context a slot of the llama-server at ``base_url`` has: ``/props``
    ``default_generation_settings.n_ctx``, else its log's ``n_ctx_slot = N``; None where neither says."""
    status, body = get_json(base_url + "/props")
    if status == 200 and isinstance(body, dict):
        n = (body.get("default_generation_settings") or {}).get("n_ctx")
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            return n
    try:
        found = re.findall(r"n_ctx_slot\s*=\s*(\d+)", log.read_text(errors="replace")) if log else []
    except OSError:
        found = []
    return int(found[-1]) if found else None


def _record_slot_context(plan: Plan, writer: ServeRunWriter, progress: Progress, base_url: str, log: Path) -> None:
    """``run.json`` records the slot context the server runs (``config.ctx_per_slot``; what was asked as
    ``ctx_per_slot_asked``): llama-server raises a small one (``--ctx-per-slot 64`` runs 256)."""
    asked = plan.ctx_size // max(plan.slots, 1)
    used = slot_context(base_url, log)
    cfg = dict(writer.meta.get("config") or {})
    if cfg.get("ctx_per_slot_asked") == asked and cfg.get("ctx_per_slot") == (used or asked):
        return
    writer.update(config={**cfg, "ctx_per_slot": used or asked, "ctx_per_slot_asked": asked,
                          "ctx_per_slot_source": "server" if used else "asked (the server did not say)"})
    if used is not None and used != asked:
        progress.on_note(f"llama-server runs {used} tokens of context a slot, not the {asked} asked "
                         f"(--ctx-per-slot): run.json records {used}")


def _record_failure(writer: ServeRunWriter, cid: str, failed: UnitFailure | None) -> None:
    """``run.json`` ``failed_units``: the unit's last failure, or none once it finished."""
    old = dict(writer.meta.get("failed_units") or {})
    if failed is None and cid not in old:
        return
    if failed is None:
        del old[cid]
    else:
        old[cid] = failed.as_dict()
    writer.update(failed_units=old)


def _endpoint(plan: Plan, cfg: ServeConfig, base: str) -> Endpoint:
    if plan.url is not None:
        return Endpoint(base, model=_url_model(base), mode="chat", extra=(("ignore_eos", True),))
    extra: tuple[tuple[str, Any], ...] = (("ignore_eos", True),)
    return Endpoint(base, mode="raw" if cfg.synthetic else "chat", extra=extra)


def _url_model(base: str) -> str:
    status, body = get_json(base + "/v1/models")
    try:
        return str(body["data"][0]["id"]) if status == 200 else "default"
    except (KeyError, IndexError, TypeError):
        return "default"


def _one_unit(plan: Plan, writer: ServeRunWriter, progress: Progress, hardware: str, uid: UnitId, block: int,
              ep: Endpoint, srv: Any) -> UnitFailure | None:
    """Measure one unit; written when every request finished, else its failure (nothing written)."""
    cid = uid.to_str()
    raw_before, before = _scrape(ep.base_url)
    pids = [os.getpid(), srv.proc.pid] if srv is not None and getattr(srv, "proc", None) is not None else None
    cpu0 = cpu_sample(pids) if pids else None
    load = run_load(ep, _requests(plan, uid.config), uid.load, plan.max_new_tokens,
                    seed=plan.seed * 1000 + uid.repeat, stall_s=plan.stall_s)
    other, steal = other_cpu_shares(cpu0, cpu_sample(pids) if pids else None)
    raw_after, after = _scrape(ep.base_url)
    if srv is not None and not srv.alive():
        raise Interrupted(str(srv.died()))
    errors = [r.error for r in load.results if r.error]
    if errors:
        return UnitFailure(cid, len(load.results), len(errors), errors[0])
    note = usage_disagreement(load.results)
    if note is not None:
        progress.on_note(f"{cid}: {note}")
        writer.update(usage_notes={**(writer.meta.get("usage_notes") or {}), cid: note})
    if raw_before is not None and raw_after is not None:
        mdir = writer.path / "metrics"
        mdir.mkdir(exist_ok=True)
        (mdir / f"{_safe(cid)}.before.prom").write_text(raw_before)
        (mdir / f"{_safe(cid)}.after.prom").write_text(raw_after)
    reqs, toks = request_rows(cid, load)
    writer.append("serve_requests", reqs)
    writer.append("serve_tokens", toks)
    if uid.config.synthetic:
        writer.append("serve_step_cost", step_cost_rows(cid, uid.config, load, plan.max_new_tokens))
    row = replace(unit_row(uid, block, load, before, after, plan.max_new_tokens, hardware), other_cpu_share=other,
                  steal_share=steal)
    writer.finish_cell(row)
    progress.on_unit(row)
    return None
