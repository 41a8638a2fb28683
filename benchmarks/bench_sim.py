"""Simulator throughput: closed-form configurations/s and event-simulated rounds/s.

    python benchmarks/bench_sim.py        (or: make bench)

Targets: >= 1,000,000 closed-form (alpha, c, gamma) configurations per second
and >= 50,000 event-simulated speculation rounds per second. Prints a table for
people and ends with one JSON line for machines.
"""

from __future__ import annotations

import json
import time

import numpy as np

from sim.acceptance import IIDAcceptance
from sim.analytic import sweep
from sim.cost import LeviathanCost
from sim.events import simulate_request

CLOSED_FORM_TARGET = 1_000_000
EVENT_TARGET = 50_000


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


def main() -> None:
    cf = bench_closed_form()
    ev = bench_events()
    rows = [
        ("closed-form configurations/s", cf, CLOSED_FORM_TARGET),
        ("event-simulated rounds/s (gamma=4)", ev, EVENT_TARGET),
    ]
    print(f"{'benchmark':38s} {'measured':>14s} {'target':>12s} {'ratio':>8s}")
    for name, v, t in rows:
        print(f"{name:38s} {v:14,.0f} {t:12,d} {v / t:7.1f}x")
    print(json.dumps({"closed_form_configs_per_s": cf, "event_rounds_per_s": ev,
                      "closed_form_ratio_to_target": cf / CLOSED_FORM_TARGET,
                      "event_ratio_to_target": ev / EVENT_TARGET}))


if __name__ == "__main__":
    main()
