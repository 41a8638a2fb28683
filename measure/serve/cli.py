"""``python -m measure serve``: measure a server under load, with and without speculative decoding.

Examples::

    python -m measure serve --target smollm2-135m --draft ngram:3 --gamma 4 --concurrency 1,4 \\
        --requests 8 --max-new-tokens 32 --out runs/serve-small
    python -m measure serve --draft ngram:3 --gamma 2,4,8 --concurrency 1,2,4,8 --rate 2,4 --step-cost
    python -m measure serve --url http://127.0.0.1:8000 --concurrency 1,8 --out runs/my-deployment
    python -m measure serve --draft ngram:2 --gamma 2,4,8 --concurrency 1,4,8 --repeats 10 --until-decided

Every bad value ends in one line naming it, its flag and the valid range, exit
status 2, before any server starts or any request is sent: a missing
``llama-server`` (with how to build it), a missing model file, a URL that does
not answer or is not OpenAI-compatible, a rate <= 0 or NaN, a concurrency of 0.
A server that dies mid-run leaves the run ``interrupted`` with every finished
unit kept (one line; the same command resumes it); Ctrl-C and SIGTERM too.
``--until-decided`` measures until the best configuration at each load is
known (:mod:`measure.serve.race`) and prints, per load, the decision and why
its measuring stopped.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import re
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from toolkit.cli import OneLineParser, csv_items, fail, float_arg, int_arg
from measure.runkinds import SERVE
from measure.serve.units import GroupSummary, LoadSpec, ServeConfig, UnitRow

if TYPE_CHECKING:
    from measure.racing import RaceRule
    from measure.records import Run, RunWriter
    from measure.serve.runner import Plan, UnitFailure

PROG = "python -m measure serve"
MAX_CONCURRENCY = 1024
MAX_RATE_PER_S = 1e6
MAX_GAMMA = 64
MAX_NGRAM = 64
DEFAULT_STEP_COST_GAMMAS = (1, 2, 4, 8)
DEFAULT_STEP_COST_PROMPTS = (32, 512)
#: Other processes' CPU (cores, stolen time included) from which a unit's line says so.
OTHERS_NOTED = 0.1


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--target", default=None, help="GGUF model for llama-server: smollm2-135m (default), "
                   "gemma3-270m or gguf:/path/file.gguf")
    p.add_argument("--draft", default=None, help="comma list of drafts: ngram:N (llama-server ngram-simple, "
                   "lookup n-gram of N tokens; default ngram:3)")
    p.add_argument("--gamma", default=None, help="comma list of draft lengths k, 1..64 (default 4); fixed:K too")
    p.add_argument("--concurrency", default=None, help="comma list of closed-loop concurrencies, 1..1024")
    p.add_argument("--rate", default=None, help="comma list of open-loop Poisson arrival rates, requests/s > 0")
    p.add_argument("--requests", type=int_arg(1, 100_000), default=16, help="requests per unit (default 16)")
    p.add_argument("--max-new-tokens", type=int_arg(1, 8192), default=64, help="tokens per request (default 64)")
    p.add_argument("--repeats", type=int_arg(1, 100), default=3,
                   help="repeats of every (configuration, load), in alternating blocks (default 3)")
    p.add_argument("--slots", type=int_arg(1, 256), default=None,
                   help="llama-server slots -np (default: the largest concurrency, step-cost ones too, else 4)")
    p.add_argument("--threads", type=int_arg(1, 1024), default=None, help="llama-server threads -t (default: "
                   "every core)")
    p.add_argument("--batch-size", type=int_arg(1, 1 << 20), default=2048, help="llama-server -b (default 2048)")
    p.add_argument("--ctx-per-slot", type=int_arg(64, 1 << 20), default=None,
                   help="context per slot (default: room for the longest prompt and the new tokens)")
    p.add_argument("--domains", default=None, help="comma list of prompt domains (default: all)")
    p.add_argument("--prompts", type=int_arg(1, 10_000), default=None, help="prompts per domain (default 2)")
    p.add_argument("--prompts-file", default=None, metavar="FILE", help="your own prompts (as python -m measure)")
    p.add_argument("--seed", type=int_arg(0, 2**31 - 1), default=0, help="prompt selection and arrival times")
    p.add_argument("--step-cost", action="store_true",
                   help="also time what a server step costs: synthetic-acceptance units (every draft rejected) "
                        "at each --step-cost-gamma x --step-cost-concurrency x --step-cost-prompt-tokens")
    p.add_argument("--step-cost-gamma", default=None, help=f"k of the step-cost units, plus off (default "
                   f"{','.join(map(str, DEFAULT_STEP_COST_GAMMAS))})")
    p.add_argument("--step-cost-concurrency", default=None, help="concurrencies of the step-cost units, at most "
                   "--slots (default 1..slots, doubling)")
    p.add_argument("--step-cost-prompt-tokens", default=None, help="prompt lengths of the step-cost units "
                   f"(default {','.join(map(str, DEFAULT_STEP_COST_PROMPTS))})")
    p.add_argument("--llama-server", default=None, metavar="PATH", help="this llama-server binary instead of the "
                   "project's build (python -m measure build-llamacpp); also $SPECSCOPE_LLAMA_SERVER")
    p.add_argument("--step-cost-requests", type=int_arg(1, 100_000), default=None,
                   help="requests per step-cost unit (default: --requests)")
    p.add_argument("--step-cost-repeats", type=int_arg(1, 100), default=None,
                   help="repeats of the step-cost units, at most --repeats (default: --repeats)")
    p.add_argument("--url", default=None, help="measure this running OpenAI-compatible server instead of "
                   "starting llama-server (vLLM, SGLang, TGI, llama-server)")
    p.add_argument("--out", default=None, help="run directory (default runs/serve-<time>); an existing one resumes")
    p.add_argument("--force-new", action="store_true", help="move an existing --out aside and start afresh")
    p.add_argument("--extend", action="store_true",
                   help="add units (configurations, loads, repeats) to an existing run: recorded in run.json")
    p.add_argument("--stall-timeout", type=float_arg(0, 3600, lo_open=True), default=60.0, metavar="S",
                   help="a request whose stream sends nothing for S seconds fails (default 60)")
    p.add_argument("--quiet", action="store_true", help="no per-unit lines, only the table and the JSON line")
    _race_arguments(p)
    return p


def _race_arguments(p: argparse.ArgumentParser) -> None:
    from measure.racing import add_race_arguments

    add_race_arguments(p, "measure until the best configuration at each load (a k, or off) is known within --regret "
                          "at --confidence: a race per load looks after each repeat and stops measuring what it no "
                          "longer needs (measure/serve/race.py); --repeats is then the most repeats",
                       unit="units", step="repeat", defaults=False)


def _race_rule(args: argparse.Namespace) -> RaceRule | None:
    """``--until-decided``'s rule (None without it), its flags checked in one line each."""
    from measure.racing import DEFAULT_CONFIDENCE, DEFAULT_REGRET, RaceRule

    given = [f for f, v in (("--regret", args.regret), ("--confidence", args.confidence),
                            ("--time-budget", args.time_budget)) if v is not None]
    if not args.until_decided:
        if given:
            fail(PROG, f"{given[0]} applies with --until-decided only")
        return None
    for flag, v in (("--url", args.url), ("--step-cost", args.step_cost or None)):
        if v is not None:
            fail(PROG, f"--until-decided races the configurations this command starts (off and each k) at each "
                       f"load; {flag} is not raced: measure it in a run without --until-decided")
    try:
        return RaceRule(confidence=DEFAULT_CONFIDENCE if args.confidence is None else args.confidence,
                        regret=DEFAULT_REGRET if args.regret is None else args.regret, max_looks=args.repeats,
                        min_units=2)
    except ValueError as e:
        fail(PROG, f"--until-decided: {e}")
    raise AssertionError  # unreachable


def _ints(flag: str, text: str | None, lo: int, hi: int) -> list[int]:
    if text is None:
        return []
    out = []
    for t in csv_items(flag, text, PROG):
        t2 = t.removeprefix("fixed:") if flag == "--gamma" else t
        try:
            v = int(t2)
        except ValueError:
            fail(PROG, f"{flag} {t!r} is not an integer (valid: {lo}..{hi})")
        if not lo <= v <= hi:
            fail(PROG, f"{flag} {v} is out of range (valid: {lo}..{hi})")
        out.append(v)
    return list(dict.fromkeys(out))


def _rates(text: str | None) -> list[float]:
    if text is None:
        return []
    out = []
    for t in csv_items("--rate", text, PROG):
        try:
            v = float(t)
        except ValueError:
            fail(PROG, f"--rate {t!r} is not a number (valid: requests/s > 0)")
        if not math.isfinite(v) or v <= 0 or v > MAX_RATE_PER_S:
            fail(PROG, f"--rate {t} is out of range (valid: a finite number of requests/s in (0, {MAX_RATE_PER_S:g}])")
        out.append(v)
    return list(dict.fromkeys(out))


def _drafts(text: str | None) -> list[int]:
    out = []
    for t in csv_items("--draft", text or "ngram:3", PROG):
        kind, _, n = t.partition(":")
        if kind != "ngram":
            fail(PROG, f"--draft {t!r}: llama-server here drafts with ngram:N (its ngram-simple n-gram lookup); "
                       "valid: ngram:1..64")
        try:
            v = int(n or 3)
        except ValueError:
            fail(PROG, f"--draft {t!r}: N must be an integer (valid: ngram:1..{MAX_NGRAM})")
        if not 1 <= v <= MAX_NGRAM:
            fail(PROG, f"--draft {t!r}: N is out of range (valid: 1..{MAX_NGRAM})")
        out.append(v)
    return list(dict.fromkeys(out))


def _check_url(url: str) -> bool:
    """The URL answers as an OpenAI-compatible server (one line and exit 2 if not); whether it has /metrics."""
    from measure.serve.client import get_json

    if not url.startswith(("http://", "https://")):
        fail(PROG, f"--url {url!r}: expected http://host:port")
    status, body = get_json(url.rstrip("/") + "/v1/models")
    if status == 0:
        fail(PROG, f"--url {url}: does not answer ({body})")
    if status != 200 or not isinstance(body, dict) or not isinstance(body.get("data"), list):
        fail(PROG, f"--url {url}: not an OpenAI-compatible server (GET /v1/models answered HTTP {status} without "
                   "a model list)")
    status, body = get_json(url.rstrip("/") + "/metrics")
    return status == 200 and isinstance(body, str) and body.strip() != ""


def _model_path(target: str) -> Path:
    from measure.engines.gguf_files import PACKAGED, check_gguf

    if target in PACKAGED:
        try:
            return PACKAGED[target]()
        except ValueError as e:
            fail(PROG, f"--target {target}: {e}")
    if target.startswith("gguf:"):
        p = Path(target[5:])
        if not p.is_file():
            fail(PROG, f"--target {target!r}: model file missing")
        try:
            check_gguf(p, "--target gguf:")  # its magic bytes, before a server is started on it
        except ValueError as e:
            fail(PROG, str(e))
        return p
    fail(PROG, f"--target {target!r}: llama-server needs a GGUF file; valid: {', '.join(PACKAGED)} or "
               "gguf:/path/file.gguf")
    raise AssertionError  # unreachable


#: GGUF header keys (``<arch>.<key>``) that size llama-server's KV cache.
KV_KEYS = ("block_count", "attention.head_count_kv", "attention.head_count", "embedding_length",
           "attention.key_length", "attention.value_length")
KV_BYTES_PER_VALUE = 2  # llama-server's default cache type, f16


def kv_cache_bytes(model: Path, context_tokens: int) -> tuple[int, str] | None:
    """The bytes of llama-server's KV cache for ``context_tokens`` (every slot's context) of ``model`` and how
    they were counted, from its GGUF header; None where the header does not say (the server then does)."""
    from measure.engines.gguf_files import gguf_arch_values

    v = gguf_arch_values(model, KV_KEYS)

    def count(key: str) -> int | None:
        x = v.get(key)
        return x if isinstance(x, int) and not isinstance(x, bool) and x > 0 else None

    layers, heads = count("block_count"), count("attention.head_count")
    kv_heads = count("attention.head_count_kv") or heads
    width = count("embedding_length")
    k_dim = count("attention.key_length") or (width // heads if width and heads else None)
    v_dim = count("attention.value_length") or k_dim
    if not (layers and kv_heads and k_dim and v_dim):
        return None
    per_token = layers * kv_heads * (k_dim + v_dim) * KV_BYTES_PER_VALUE
    return per_token * context_tokens, (f"f16, {layers} layers x {kv_heads} KV heads x ({k_dim} + {v_dim}) "
                                        f"dims = {per_token / 1024:.1f} KiB a token")


def _check_memory(model: Path, slots: int, ctx_per_slot: int) -> None:
    """Refuse (one line) a server whose KV cache and weights do not fit in the memory available now."""
    from measure.system import available_memory_bytes

    kv, avail = kv_cache_bytes(model, slots * ctx_per_slot), available_memory_bytes()
    if kv is None or avail is None:
        return
    need, how = kv
    weights = model.stat().st_size
    if need + weights > avail:
        fail(PROG, f"--slots {slots} x {ctx_per_slot} tokens of context a slot: llama-server's KV cache needs "
                   f"{need / 2**30:.1f} GiB ({how}) and the model {weights / 2**30:.1f} GiB, this machine has "
                   f"{avail / 2**30:.1f} GiB available; give fewer --slots (or a lower --concurrency), a smaller "
                   "--max-new-tokens or --ctx-per-slot")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _refuse_with_url(args: argparse.Namespace) -> None:
    for flag, v in (("--target", args.target), ("--draft", args.draft), ("--gamma", args.gamma),
                    ("--slots", args.slots), ("--threads", args.threads), ("--ctx-per-slot", args.ctx_per_slot),
                    ("--step-cost", args.step_cost or None), ("--llama-server", args.llama_server)):
        if v is not None:
            fail(PROG, f"{flag} applies to a llama-server this command starts, not to --url (the server there "
                       "runs as it was started)")


# long: every flag checked, in order, before any server starts; the plan built from them
def plan_from_args(args: argparse.Namespace) -> tuple[Plan, dict[str, Any]]:
    """The validated :class:`~measure.serve.runner.Plan` and the run's ``config`` for run.json."""
    from measure.serve.client import RequestSpec
    from measure.serve.runner import Plan

    conc = _ints("--concurrency", args.concurrency, 1, MAX_CONCURRENCY)
    rates = _rates(args.rate)
    if not conc and not rates:
        fail(PROG, "no load: give --concurrency C[,C...] and/or --rate R[,R...]")
    race_rule = _race_rule(args)
    loads = tuple([LoadSpec(concurrency=c) for c in conc] + [LoadSpec(rate_per_s=r) for r in rates])
    url = args.url.rstrip("/") if args.url else None
    if url is not None:
        _refuse_with_url(args)
        configs: tuple[ServeConfig, ...] = (ServeConfig("url"),)  # as the server there runs, speculating or not
        slots = max(conc or [1])
    else:
        ks = _ints("--gamma", args.gamma or "4", 1, MAX_GAMMA)
        ns = _drafts(args.draft)
        configs = (ServeConfig("off"),) + tuple(ServeConfig("ngram", k, n) for n in ns for k in ks)
        for n in ns:
            short = [k for k in ks if k < n]
            if short:
                print(f"note: llama-server's ngram-simple never drafts when k < n (its draft must be at least as "
                      f"long as the lookup n-gram: common/ngram-map.cpp, copy_max < size_n): ngram:{n} with k = "
                      f"{', '.join(map(str, short))} measures speculation configured but idle", file=sys.stderr)
        slots = args.slots or max(conc + (_ints("--step-cost-concurrency", args.step_cost_concurrency, 1,
                                                     MAX_CONCURRENCY) if args.step_cost else []) or [4])
    synth_configs: tuple[ServeConfig, ...] = ()
    synth_loads: tuple[LoadSpec, ...] = ()
    if args.step_cost:
        from measure.serve.runner import SYNTH_K_MAX

        sk = _ints("--step-cost-gamma", args.step_cost_gamma, 1, SYNTH_K_MAX) or list(DEFAULT_STEP_COST_GAMMAS)
        sp = _ints("--step-cost-prompt-tokens", args.step_cost_prompt_tokens, 8, 1 << 16) or \
            list(DEFAULT_STEP_COST_PROMPTS)
        sc = _ints("--step-cost-concurrency", args.step_cost_concurrency, 1, slots) or \
            [c for c in (1, 2, 4, 8, 16, 32, 64, 128, 256) if c <= slots]
        synth_configs = tuple(ServeConfig("synth", k, 0, p) for p in sp for k in [0] + sk)
        synth_loads = tuple(LoadSpec(concurrency=c) for c in sc)
        if args.step_cost_repeats is not None and args.step_cost_repeats > args.repeats:
            fail(PROG, f"--step-cost-repeats {args.step_cost_repeats} is out of range (valid: 1..--repeats "
                       f"{args.repeats})")
    elif any(v is not None for v in (args.step_cost_gamma, args.step_cost_concurrency, args.step_cost_prompt_tokens,
                                     args.step_cost_requests, args.step_cost_repeats)):
        fail(PROG, "--step-cost-gamma/-concurrency/-prompt-tokens/-requests/-repeats apply with --step-cost only")
    over = [ld.concurrency for ld in loads + synth_loads if ld.closed and ld.concurrency > slots]
    if over and url is None:
        print(f"note: concurrency {max(over)} is above the {slots} slots: requests queue in the server",
              file=sys.stderr)
    from measure.sweep import SweepConfig, select_prompts

    try:
        by, selection = select_prompts(SweepConfig(domains=tuple(csv_items("--domains", args.domains, PROG))
                                                   if args.domains else None,
                                                   prompts_per_domain=args.prompts, seed=args.seed,
                                                   prompts_file=args.prompts_file))
    except ValueError as e:
        fail(PROG, str(e))
    prompts = tuple(RequestSpec(i, p.prompt_id, p.domain, p.message)
                    for i, p in enumerate(q for ps in by.values() for q in ps))
    threads = args.threads or os.cpu_count() or 1
    longest = max([256] + [c.prompt_tokens * 2 for c in synth_configs])
    per_slot = args.ctx_per_slot or (-(-(longest + args.max_new_tokens + MAX_GAMMA + 64) // 256) * 256)
    plan = Plan(configs=configs, loads=loads, slots=slots, requests=args.requests,
                max_new_tokens=args.max_new_tokens, repeats=args.repeats, seed=args.seed, prompts=prompts,
                threads=threads, ctx_size=per_slot * slots, batch_tokens=args.batch_size, url=url,
                synth_configs=synth_configs, synth_loads=synth_loads, synth_requests=args.step_cost_requests or 0,
                synth_repeats=args.step_cost_repeats or 0, stall_s=args.stall_timeout, race_rule=race_rule,
                time_budget_s=args.time_budget)
    config = {"configs": [c.to_str() for c in configs], "loads": [ld.to_str() for ld in loads],
              "slots": slots, "threads": threads if url is None else None, "requests": args.requests,
              "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "seed": args.seed,
              "batch_tokens": args.batch_size if url is None else None, "ctx_per_slot": per_slot if url is None
              else None, "url": url, "step_cost": {"configs": [c.to_str() for c in synth_configs],
                                                   "loads": [ld.to_str() for ld in synth_loads],
                                                   "requests": args.step_cost_requests or args.requests,
                                                   "repeats": args.step_cost_repeats or args.repeats},
              "request": {"endpoint": "/v1/chat/completions (step-cost units: /v1/completions)", "temperature": 0,
                          "ignore_eos": True, "stream": True, "prompt_cache": "off (--no-cache-prompt)"
                          if url is None else "the server's"},
              "prompt_selection": selection,
              "race": None if race_rule is None else {"regret": race_rule.regret, "confidence": race_rule.confidence,
                                                      "time_budget_s": args.time_budget}}
    return plan, SERVE.stamp(config)


def _print_unit(row: UnitRow) -> None:
    thr = "-" if row.throughput_tokens_per_s is None else f"{row.throughput_tokens_per_s:7.1f} tok/s"
    acc = ""
    if row.draft_tokens:
        acc = f"  accepted {row.accepted_tokens}/{row.draft_tokens} drafted"
    e2e = "-" if row.e2e_p50_ms is None else f"{row.e2e_p50_ms:.0f}"
    busy = ""
    if (row.other_cpu_share or 0) + (row.steal_share or 0) >= OTHERS_NOTED:
        busy = f"  (other processes {row.other_cpu_share or 0:.2f} cores, stolen {row.steal_share or 0:.2f})"
    print(f"  {row.cell_id}: {thr}  e2e p50 {e2e} ms  errors {row.n_errors}{acc}{busy}", file=sys.stderr)


def format_summary(groups: Sequence[GroupSummary]) -> str:
    """The table of every (configuration, load): throughput and latencies with 95% CIs over the repeats."""
    head = ["config", "load", "n", "tok/s [95% CI]", "speedup [95% CI]", "TTFT p50 ms", "TPOT p50 ms",
            "e2e p50 ms", "e2e p95 ms", "accepted/drafted"]
    rows = [head]
    for g in groups:
        m = g.metrics
        sp = g.throughput_speedup.as_text(3) if g.throughput_speedup is not None else "-"
        if g.repeats < 2:
            sp += " (1 repeat: no CI)" if sp != "-" else ""
        rows.append([g.config, g.load, str(g.repeats), m["throughput_tokens_per_s"].as_text(1), sp,
                     m["ttft_p50_ms"].as_text(0), m["tpot_p50_ms"].as_text(1), m["e2e_p50_ms"].as_text(0),
                     m["e2e_p95_ms"].as_text(0), "-" if g.acceptance_rate is None else f"{g.acceptance_rate:.3f}"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


# long: the command from flags to table: checks, run directory, servers, summary, the one JSON line
def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.extend and args.force_new:
        fail(PROG, "--extend adds units to the run in --out; --force-new starts a new one there: give one of them")
    plan, config = plan_from_args(args)
    has_metrics = True
    binary = version = model = None
    if plan.url is not None:
        has_metrics = _check_url(plan.url)
        if not has_metrics:
            print(f"note: {plan.url} has no /metrics: latency is measured, acceptance is unavailable",
                  file=sys.stderr)
        else:
            print("note: each unit's /metrics scrapes are kept under metrics/: python -m calibrate ingest "
                  "<unit>.before.prom <unit>.after.prom reads the acceptance (vLLM, SGLang, llama.cpp, TGI)",
                  file=sys.stderr)
    else:
        from measure.serve.binary import checked, server_binary, server_version

        try:
            found = server_binary(args.llama_server)
        except ValueError as e:
            fail(PROG, str(e))
        model = _model_path(args.target or "smollm2-135m")
        _check_memory(model, plan.slots, config["ctx_per_slot"])
        try:
            binary = checked(found, model)
            version = server_version(binary.path)
        except ValueError as e:
            fail(PROG, str(e))
    out = Path(args.out) if args.out else Path("runs") / time.strftime("serve-%Y%m%d-%H%M%S")
    if out.exists() and not out.is_dir():
        fail(PROG, f"--out {str(out)!r} is a file, not a directory")
    from measure.records import FingerprintMismatch, hardware_label, load_run
    from measure.runkinds import open_run_dir
    from measure.serve.runner import Interrupted, Progress, run_units
    from measure.serve.units import summarise
    from measure.sweep import environment
    from measure.system import system_check

    hardware, versions, source = environment("cpu")
    hardware = {**hardware, "torch_threads": None, "server_threads": plan.threads if plan.url is None else None}
    label = hardware_label(hardware) + (f", llama-server -t {plan.threads}" if plan.url is None else "")
    check = system_check("cpu")
    for w in check["warnings"]:
        print(f"system check: {w}", file=sys.stderr)
    fingerprint = {
        "kind": "serve", "url": plan.url, "server_version": version,
        "server_build": None if binary is None or binary.build is None else binary.build.get("key"),
        "model": None if model is None else {"path": str(model), "file_sha256": _sha256(model)},
        "slots": plan.slots, "threads": config["threads"], "batch_tokens": config["batch_tokens"],
        "ctx_per_slot": config["ctx_per_slot"], "requests": plan.requests,
        "step_cost_requests": plan.synth_requests or plan.requests, "max_new_tokens": plan.max_new_tokens,
        "seed": plan.seed, "prompts": {k: v for k, v in config["prompt_selection"].items() if k != "file"},
        "hardware": {"cpu": hardware.get("cpu"), "cores": hardware.get("cores")},
    }
    if not args.extend:
        fingerprint["units"] = plan.unit_ids()
    if plan.race_rule is not None:  # a resume looks again only under the same rule
        fingerprint["race"] = {"regret": plan.race_rule.regret, "confidence": plan.race_rule.confidence,
                               "max_looks": plan.race_rule.max_looks}
    meta = {"command": "python -m measure serve " + " ".join(shlex.quote(a) for a in argv), "config": config,
            "hardware": hardware, "versions": {**versions, "llama_server": version}, **source,
            "models": {"target": {"name": args.target or "smollm2-135m", "source": f"gguf:{model}"}}
            if model is not None else {"target": {"name": plan.url, "source": "url"}},
            "server": {**({"binary": None} if binary is None else binary.describe()), "version": version,
                       "metrics": has_metrics},
            "system_check": check}
    try:
        # --force-new sets the run there aside under its lock: a run another process writes is refused, not moved
        writer = open_run_dir(SERVE, out, meta=meta, fingerprint=fingerprint, force_new=args.force_new,
                              extend=args.extend, say=lambda note: print(f"note: {note}", file=sys.stderr))
    except (FingerprintMismatch, ValueError) as e:
        msg = str(e)
        if isinstance(e, FingerprintMismatch) and re.search(r"[(; ]units \[", msg):
            msg += " (to add units to this run on purpose: --extend)"
        fail(PROG, msg)
    if args.extend and writer.resumed:
        writer.update(extended_utc=[*writer.meta.get("extended_utc", []), time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                        time.gmtime())],
                      config=config)
    factory = None
    if binary is not None and model is not None:  # no --url: we start the servers (both found above)
        from measure.serve.server import LlamaServer, ServerSpec

        server_path, model_path = binary.path, model

        def factory(cfg: ServeConfig, log: Path) -> LlamaServer:
            return LlamaServer(ServerSpec(server_path, model_path, cfg, plan.slots, plan.threads, plan.ctx_size,
                                          plan.batch_tokens, ("--no-cache-prompt",)), log)

    progress = Progress(on_unit=(lambda row: None) if args.quiet else _print_unit,
                        on_block=(lambda text: None) if args.quiet else
                        (lambda text: print(text, file=sys.stderr)),
                        on_failed=lambda f: print(f"  {f.text()}: not kept, a resume measures it again",
                                                  file=sys.stderr),
                        on_note=lambda text: print(f"note: {text}", file=sys.stderr))
    failures: list = []
    groups: list = []
    try:
        with writer.recording():
            failures = run_units(plan, writer, progress, label, factory)
            run = load_run(out)
            groups = summarise(run.table("serve_units"))
            writer.update(summary={"groups": [g.as_dict() for g in groups], "load_generator": _overhead(run)})
            _raise_for(failures, len(writer.finished_cells))
    except RequestsFailed as e:
        _print_result(out, groups, writer, failures)
        print(f"{PROG}: failed: {e}", file=sys.stderr)
        return 1
    except Interrupted as e:
        if failures:
            _print_result(out, groups, writer, failures)
        print(f"{PROG}: interrupted: {e}; finished units are kept in {out} (the same command resumes)",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        sig = "SIGTERM" if type(e).__name__ == "Terminated" else "interrupted"
        print(f"{sig}: finished units are kept in {out} (the same command resumes)", file=sys.stderr)
        return 143 if sig == "SIGTERM" else 130
    except ValueError as e:
        fail(PROG, str(e))
    _print_result(out, groups, writer, failures)
    return 0


class RequestsFailed(RuntimeError):
    """Every request a run sent failed, so it measured nothing: closed ``failed`` (never ``complete``)."""


def _raise_for(failures: Sequence[UnitFailure], n_finished: int) -> None:
    """End a run that had units with failed requests: ``failed`` if no unit of it is finished, else
    ``interrupted`` (a resume measures those units again); one line either way."""
    from measure.serve.runner import Interrupted

    if not failures:
        return
    what = f"{failures[0].text()}" + (f", and {len(failures) - 1} more unit(s) with failed requests"
                                       if len(failures) > 1 else "")
    if n_finished == 0:
        raise RequestsFailed(f"no unit finished: {what}")
    raise Interrupted(f"{what}; those units are not kept")


def _print_result(out: Path, groups: Sequence[GroupSummary], writer: RunWriter,
                  failures: Sequence[UnitFailure]) -> None:
    """The table, the load generator's cost and the one JSON line (with the units whose requests failed)."""
    from measure.records import strict_dumps

    print(format_summary(groups))
    if failures:
        print(f"failed units: {len(failures)} (requests failed: {sum(f.n_failed for f in failures)} of "
              f"{sum(f.n_requests for f in failures)}); {failures[0].text()}")
    lg = (writer.meta.get("summary") or {}).get("load_generator") or {"text": "no units"}
    print(f"load generator: {lg['text']}")
    race = writer.meta.get("race") if (writer.meta.get("config") or {}).get("race") else None
    if race:
        from measure.serve.race import describe

        print("\n".join(describe(race, int((writer.meta.get("config") or {}).get("repeats") or 0))))
    print(strict_dumps({"out": str(out), "status": writer.meta.get("status"),
                        "groups": [g.as_dict() for g in groups], "load_generator": lg,
                        "failed_units": [f.as_dict() for f in failures],
                        **({"race": {k: race.get(k) for k in ("stopped_by", "decided")}} if race else {})}))


def _overhead(run: Run) -> dict[str, Any]:
    """The load generator's own cost over the run, in words and numbers."""
    u = run.table("serve_units")
    if not len(u):
        return {"text": "no units", "cpu_share_max": None}
    share = u["client_cpu_share"].astype(float)
    lag = u["send_lag_p99_ms"].dropna().astype(float)
    other = (u["other_cpu_share"].astype(float).fillna(0) + u["steal_share"].astype(float).fillna(0))[
        u["other_cpu_share"].notna()]
    text = (f"used {100 * share.median():.1f}% of one core per unit (median; at most {100 * share.max():.1f}%)"
            + (f"; open-loop sends left at most {lag.max():.1f} ms late (p99 per unit)" if len(lag) else "")
            + (f"; other processes (and the hypervisor) took {other.median():.2f} cores per unit (median; at most "
               f"{other.max():.2f}, in {int((other >= OTHERS_NOTED).sum())} of {len(other)} units >= "
               f"{OTHERS_NOTED})" if len(other) else ""))
    return {"text": text, "cpu_share_median": float(share.median()), "cpu_share_max": float(share.max()),
            "send_lag_p99_ms_max": float(lag.max()) if len(lag) else None,
            "other_cpu_share_median": float(other.median()) if len(other) else None,
            "other_cpu_share_max": float(other.max()) if len(other) else None}
