"""Simulator throughput: closed-form configurations/s, event-simulated rounds/s, serving requests in 60 s.

    python benchmarks/bench_sim.py        (or: make bench)
    python benchmarks/bench_sim.py --serve-requests 100000   (a shorter serving run, same ratio printed)

Targets: >= 1,000,000 closed-form (alpha, c, gamma) configurations per second,
>= 50,000 event-simulated speculation rounds per second, and the serving
simulation of 10^6 requests in <= 60 s on one core. The serving run is
llama-server's scheduler (sim.serving) with a linear step cost of the form
calibrate fits, 8 slots, a prompt-lookup draft at k = 4 (proposes in 60% of
rounds, alpha 0.7), 128 new tokens a request after prompts of 30-70 tokens,
Poisson arrivals at 90% of capacity; and, beside it, the same number of
requests through ``python -m sim --mode serve``'s lockstep model
(``sim.events.simulate_serving``: roofline costs of llama3-1b-8b on an H100,
256 tokens, batch <= 32, both the speculative and the baseline side). The
ratio printed is 60 s / the time taken (>= 1 meets the target). Prints a table
for people and ends with one JSON line for machines.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence

import numpy as np

from presets import RooflineForward, get_hardware, get_pair
from sim.acceptance import AcceptanceModel, IIDAcceptance, ProposalAcceptance
from sim.analytic import sweep
from sim.cost import LeviathanCost, RooflineCost
from sim.events import simulate_request, simulate_serving
from sim.serving import OpenLoop, StepCost, Workload, llama_server, simulate_server

CLOSED_FORM_TARGET = 1_000_000
EVENT_TARGET = 50_000
SERVE_REQUESTS = 1_000_000
SERVE_SECONDS = 60.0


def bench_closed_form(repeats: int = 5) -> float:
    alphas = np.linspace(0.0, 1.0, 201)
    costs = np.linspace(0.0, 1.0, 101)
    gammas = np.arange(1, 17)
    n = alphas.size * costs.size * gammas.size
    sweep(alphas, costs, gammas)  # warm-up, not counted
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        s = sweep(alphas, costs, gammas)
        best = min(best, time.perf_counter() - t0)
    assert s.shape == (alphas.size, costs.size, gammas.size)
    return n / best


def bench_events(n_tokens: int = 300_000) -> float:
    acc, cost = IIDAcceptance(0.7), LeviathanCost(0.1)
    simulate_request(acc, cost, "fixed:4", 2_000, seed=0)  # warm-up
    t0 = time.perf_counter()
    r = simulate_request(acc, cost, "fixed:4", n_tokens, seed=0)
    return r.rounds / (time.perf_counter() - t0)


class LinearStep:
    """A step cost of the form calibrate fits for llama-server (ms): fixed + per sequence + per token + context."""

    def step_ms(self, seqs: int, tokens: int, max_draft: int, ctx_sum: float, attn: float, prompt_tokens: int,
                prompt_seqs: int, emitted: int = 0) -> float:
        return 6.0 + 0.9 * seqs + 0.55 * tokens + 2e-3 * ctx_sum + 0.12 * prompt_tokens

    def describe(self) -> dict:
        return {"kind": "linear-bench"}


def bench_serve_llama(n_requests: int, cost: StepCost | None = None, acceptance: AcceptanceModel | None = None,
                      gamma: int = 4, new_tokens: int = 128, prompts: Sequence[int] = (30, 50, 70),
                      slots: int = 8) -> tuple[float, float]:
    """Seconds to simulate ``n_requests`` on llama-server's scheduler (Poisson arrivals at 90% of the capacity a
    saturated probe finds); and the mean batch it ran at."""
    acc = acceptance or ProposalAcceptance(0.6, IIDAcceptance(0.7))
    cost, sched = cost or LinearStep(), llama_server(slots)
    policy = f"fixed:{gamma}"
    probe = simulate_server(Workload(2_000, new_tokens, OpenLoop(1e6), prompt_tokens=list(prompts)), sched, cost, acc,
                            policy).stats()  # saturated: the capacity, and the warm-up
    rate = 0.9 * probe.throughput_tokens_per_s / new_tokens
    t0 = time.perf_counter()
    run = simulate_server(Workload(n_requests, new_tokens, OpenLoop(rate), prompt_tokens=list(prompts)), sched, cost,
                          acc, policy)
    return time.perf_counter() - t0, run.stats().mean_batch


def bench_serve_lockstep(n_requests: int) -> float:
    """Seconds for ``sim --mode serve``'s lockstep model (speculative and baseline sides) of ``n_requests``."""
    hw, p = get_hardware("h100-sxm"), get_pair("llama3-1b-8b")
    cost = RooflineCost(RooflineForward(p.draft, hw), RooflineForward(p.target, hw))
    t0 = time.perf_counter()
    simulate_serving(IIDAcceptance(0.75), cost, "fixed:4", n_requests=n_requests, arrival_rate_per_s=20,
                     n_tokens=256, max_batch=32)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description="simulator benchmarks")
    ap.add_argument("--serve-requests", type=int, default=SERVE_REQUESTS,
                    help=f"requests of the serving runs (default {SERVE_REQUESTS:,}); the target scales with it")
    n = ap.parse_args().serve_requests
    budget = SERVE_SECONDS * n / SERVE_REQUESTS
    cf = bench_closed_form()
    ev = bench_events()
    llama_s, batch = bench_serve_llama(n)
    lock_s = bench_serve_lockstep(n)
    rows = [
        ("closed-form configurations/s", f"{cf:14,.0f}", f"{CLOSED_FORM_TARGET:12,d}", cf / CLOSED_FORM_TARGET),
        ("event-simulated rounds/s (gamma=4)", f"{ev:14,.0f}", f"{EVENT_TARGET:12,d}", ev / EVENT_TARGET),
        (f"serve: {n:,} requests, llama-server (s)", f"{llama_s:14.1f}", f"{budget:12.1f}", budget / llama_s),
        (f"serve: {n:,} requests, lockstep (s)", f"{lock_s:14.1f}", f"{budget:12.1f}", budget / lock_s),
    ]
    print(f"{'benchmark':42s} {'measured':>14s} {'target':>12s} {'ratio':>8s}")
    for name, v, t, ratio in rows:
        print(f"{name:42s} {v} {t} {ratio:7.2f}x")
    print(f"(serving: llama-server model at a mean batch of {batch:.2f} of 8 slots; ratio >= 1 meets the target)")
    print(json.dumps({"closed_form_configs_per_s": cf, "event_rounds_per_s": ev,
                      "closed_form_ratio_to_target": cf / CLOSED_FORM_TARGET,
                      "event_ratio_to_target": ev / EVENT_TARGET, "serve_requests": n,
                      "serve_llama_server_s": llama_s, "serve_lockstep_s": lock_s,
                      "serve_llama_server_ratio_to_target": budget / llama_s,
                      "serve_lockstep_ratio_to_target": budget / lock_s}))


if __name__ == "__main__":
    main()
