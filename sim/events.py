"""SimPy discrete-event simulation of speculative decoding.

Two modes:

* :func:`simulate_request` — one request: a SimPy process drafts γ tokens
  (one timeout per draft step, from the cost model), verifies γ+1 positions
  (one timeout), samples how many drafts were accepted from the acceptance
  model with an explicit seeded ``numpy.random.Generator``, rolls back and
  repeats until ``n_tokens`` are produced. The GPU is a ``simpy.Resource``.
  The context grows as tokens are produced, so context-dependent costs count.
* :func:`simulate_serving` — Poisson arrivals of many requests sharing one
  GPU with batched drafting and verification (iteration-level batching, as
  vLLM schedules it): each iteration every running request drafts, then one
  batched target forward verifies them all. The autoregressive baseline is
  simulated under the same arrivals (same seed) for the speedup.

Times are in milliseconds of simulated time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import simpy

from sim.acceptance import AcceptanceModel, _check_gamma, sample_round
from sim.cost import CostModel
from sim.policies import GammaPolicy, make_policy


def _check_count(name: str, n: int) -> int:
    if int(n) != n or n < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {n}")
    return int(n)


@dataclass(frozen=True)
class RequestResult:
    """Outcome of one simulated request."""

    n_tokens: int
    rounds: int
    drafted: int
    accepted: int
    time_ms: float
    baseline_time_ms: float
    draft_ms: float
    verify_ms: float
    overhead_ms: float

    @property
    def speedup(self) -> float:
        return self.baseline_time_ms / self.time_ms

    @property
    def tokens_per_round(self) -> float:
        return self.n_tokens / self.rounds

    def as_dict(self) -> dict:
        d = asdict(self)
        d["speedup"] = self.speedup
        d["tokens_per_round"] = self.tokens_per_round
        return d


def baseline_time_ms(cost: CostModel, n_tokens: int, context_tokens: float, batch: int = 1) -> float:
    """Autoregressive time for ``n_tokens`` starting at ``context_tokens``."""
    return float(sum(cost.target_step_ms(context_tokens + i, batch) for i in range(n_tokens)))


def simulate_request(
    acceptance: AcceptanceModel,
    cost: CostModel,
    policy: GammaPolicy | str | int,
    n_tokens: int,
    context_tokens: float = 0.0,
    seed: int = 0,
) -> RequestResult:
    """Simulate one request generating ``n_tokens`` tokens (the last round may overshoot)."""
    n_tokens = _check_count("n_tokens", n_tokens)
    pol = make_policy(policy) if isinstance(policy, (str, int)) else policy
    pol.reset()
    rng = np.random.default_rng(seed)
    env = simpy.Environment()
    gpu = simpy.Resource(env, capacity=1)
    totals = {"rounds": 0, "drafted": 0, "accepted": 0, "produced": 0,
              "draft_ms": 0.0, "verify_ms": 0.0, "overhead_ms": 0.0}

    def request() -> simpy.events.ProcessGenerator:
        ctx = float(context_tokens)
        while totals["produced"] < n_tokens:
            gamma = pol.gamma
            # what the round drafts (a lookup draft may propose fewer than γ) and accepts
            drafted, accepted = sample_round(acceptance, gamma, rng)
            with gpu.request() as slot:
                yield slot
                for i in range(drafted):
                    t = cost.draft_step_ms(ctx + i)
                    totals["draft_ms"] += t
                    yield env.timeout(t)
                t = cost.verify_ms(drafted + 1, ctx)
                totals["verify_ms"] += t
                yield env.timeout(t)
                t = cost.round_overhead_ms(drafted)
                if t > 0:
                    totals["overhead_ms"] += t
                    yield env.timeout(t)
            totals["rounds"] += 1
            totals["drafted"] += drafted
            totals["accepted"] += accepted
            totals["produced"] += accepted + 1
            ctx += accepted + 1
            if drafted:
                pol.update(drafted, accepted)

    env.process(request())
    env.run()
    produced = totals["produced"]
    return RequestResult(
        n_tokens=produced,
        rounds=totals["rounds"],
        drafted=totals["drafted"],
        accepted=totals["accepted"],
        time_ms=float(env.now),
        baseline_time_ms=baseline_time_ms(cost, produced, context_tokens),
        draft_ms=totals["draft_ms"],
        verify_ms=totals["verify_ms"],
        overhead_ms=totals["overhead_ms"],
    )


@dataclass(frozen=True)
class ServingStats:
    """Throughput and latency of one serving simulation."""

    requests: int
    tokens: int
    makespan_ms: float
    throughput_tokens_per_s: float
    latency_p50_ms: float
    latency_p95_ms: float
    latency_p99_ms: float
    ms_per_output_token_mean: float
    mean_batch: float


@dataclass(frozen=True)
class ServingResult:
    """Speculative and baseline serving under the same arrivals."""

    speculative: ServingStats
    baseline: ServingStats
    arrival_rate_per_s: float
    policy: str

    @property
    def throughput_speedup(self) -> float:
        return self.speculative.throughput_tokens_per_s / self.baseline.throughput_tokens_per_s

    @property
    def latency_speedup_p50(self) -> float:
        return self.baseline.latency_p50_ms / self.speculative.latency_p50_ms

    def as_dict(self) -> dict:
        return {
            "arrival_rate_per_s": self.arrival_rate_per_s,
            "policy": self.policy,
            "speculative": asdict(self.speculative),
            "baseline": asdict(self.baseline),
            "throughput_speedup": self.throughput_speedup,
            "latency_speedup_p50": self.latency_speedup_p50,
        }


def _serve(
    arrivals_ms: np.ndarray,
    n_tokens: int,
    context_tokens: float,
    max_batch: int,
    iteration,  # (env, batch states) -> generator; mutates produced counts
) -> ServingStats:
    env = simpy.Environment()
    gpu = simpy.Resource(env, capacity=1)
    waiting: list[dict] = []
    done: list[dict] = []
    new_work = [env.event()]
    batches: list[int] = []

    def arrive(i: int, at_ms: float) -> simpy.events.ProcessGenerator:
        yield env.timeout(at_ms)
        waiting.append({"id": i, "arrival": at_ms, "produced": 0, "ctx": float(context_tokens), "policy": None})
        if not new_work[0].triggered:
            new_work[0].succeed()

    def scheduler() -> simpy.events.ProcessGenerator:
        running: list[dict] = []
        while len(done) < len(arrivals_ms):
            while waiting and len(running) < max_batch:
                running.append(waiting.pop(0))
            if not running:
                new_work[0] = env.event()
                yield new_work[0]
                continue
            batches.append(len(running))
            with gpu.request() as slot:
                yield slot
                yield from iteration(env, running)
            finished = [r for r in running if r["produced"] >= n_tokens]
            for r in finished:
                r["finish"] = env.now
                done.append(r)
            running = [r for r in running if r["produced"] < n_tokens]

    for i, t in enumerate(arrivals_ms):
        env.process(arrive(i, float(t)))
    env.process(scheduler())
    env.run()
    lat = np.array([r["finish"] - r["arrival"] for r in done])
    tokens = int(sum(r["produced"] for r in done))
    makespan = float(max(r["finish"] for r in done) - float(np.min(arrivals_ms)))
    return ServingStats(
        requests=len(done),
        tokens=tokens,
        makespan_ms=makespan,
        throughput_tokens_per_s=tokens / makespan * 1000.0,
        latency_p50_ms=float(np.percentile(lat, 50)),
        latency_p95_ms=float(np.percentile(lat, 95)),
        latency_p99_ms=float(np.percentile(lat, 99)),
        ms_per_output_token_mean=float(np.mean(lat / np.array([r["produced"] for r in done]))),
        mean_batch=float(np.mean(batches)) if batches else 0.0,
    )


def simulate_serving(
    acceptance: AcceptanceModel,
    cost: CostModel,
    policy: str | int,
    n_requests: int = 200,
    arrival_rate_per_s: float = 5.0,
    n_tokens: int = 128,
    context_tokens: float = 512.0,
    max_batch: int = 32,
    seed: int = 0,
) -> ServingResult:
    """Poisson arrivals sharing one GPU, speculative vs autoregressive, same arrivals."""
    n_requests = _check_count("n_requests", n_requests)
    n_tokens = _check_count("n_tokens", n_tokens)
    max_batch = _check_count("max_batch", max_batch)
    if not arrival_rate_per_s > 0:
        raise ValueError(f"arrival rate must be > 0 requests/s, got {arrival_rate_per_s}")
    spec = make_policy(policy).spec()
    arrivals_rng, accept_rng = np.random.default_rng(seed).spawn(2)
    arrivals_ms = np.cumsum(arrivals_rng.exponential(1000.0 / arrival_rate_per_s, size=n_requests))

    def spec_iteration(env: simpy.Environment, running: list[dict]) -> simpy.events.ProcessGenerator:
        for r in running:
            if r["policy"] is None:
                r["policy"] = make_policy(spec)
        b = len(running)
        ctx = float(np.mean([r["ctx"] for r in running]))
        # each request's round: how many tokens its draft proposes and how many are accepted;
        # the batch drafts and verifies as many positions as its longest proposal
        rounds = [sample_round(acceptance, r["policy"].gamma, accept_rng) for r in running]
        g_max = max(d for d, _ in rounds)
        for i in range(g_max):
            yield env.timeout(cost.draft_step_ms(ctx + i, b))
        yield env.timeout(cost.verify_ms(g_max + 1, ctx, b))
        ov = cost.round_overhead_ms(g_max)
        if ov > 0:
            yield env.timeout(ov)
        for r, (d, acc) in zip(running, rounds):
            r["produced"] += acc + 1
            r["ctx"] += acc + 1
            if d:
                r["policy"].update(d, acc)

    def base_iteration(env: simpy.Environment, running: list[dict]) -> simpy.events.ProcessGenerator:
        ctx = float(np.mean([r["ctx"] for r in running]))
        yield env.timeout(cost.target_step_ms(ctx, len(running)))
        for r in running:
            r["produced"] += 1
            r["ctx"] += 1

    return ServingResult(
        speculative=_serve(arrivals_ms, n_tokens, context_tokens, max_batch, spec_iteration),
        baseline=_serve(arrivals_ms, n_tokens, context_tokens, max_batch, base_iteration),
        arrival_rate_per_s=float(arrival_rate_per_s),
        policy=spec,
    )


def simulate_mean_speedup(
    acceptance: AcceptanceModel,
    cost: CostModel,
    gamma: int,
    n_tokens: int = 10_000,
    context_tokens: float = 0.0,
    seed: int = 0,
) -> RequestResult:
    """A long fixed-γ request: its speedup estimates the closed form's expectation."""
    return simulate_request(acceptance, cost, f"fixed:{_check_gamma(gamma)}", n_tokens, context_tokens, seed)
