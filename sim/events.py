"""SimPy discrete-event simulation of speculative decoding.

Two modes:

* :func:`simulate_request` — one request: a SimPy process drafts γ tokens
  (one timeout per draft step, from the cost model), verifies γ+1 positions
  (one timeout), samples how many drafts were accepted from the acceptance
  model with an explicit seeded ``numpy.random.Generator``, rolls back and
  repeats until ``n_tokens`` are produced. The context grows as tokens are
  produced, so context-dependent costs count. One process on a capacity-1
  ``simpy.Resource`` never waits, so its simulated time *is* the sum of the
  sampled rounds' costs: this mode is a check of the closed forms (and of the
  cost and policy plumbing the serving mode shares), not a model of
  contention — that is :func:`simulate_serving`. With a
  :class:`~sim.policies.TreePolicy` each round drafts a token tree instead:
  one draft forward per level over its parents, a verify of the tree's nodes
  plus the root, and τ drawn from a :class:`~sim.trees.PositionalAcceptance`
  (:class:`~sim.trees.TreeSampler`).
* :func:`simulate_serving` — Poisson arrivals of many requests sharing one
  GPU with batched drafting and verification (iteration-level batching): each
  iteration every running request drafts, the batch drafting as far as its
  longest proposal, then one batched target forward verifies them all. The
  autoregressive baseline is simulated under the same arrivals (same seed)
  for the speedup. It runs on :func:`sim.serving.simulate_server` (a plain
  event loop, no SimPy) with the :func:`sim.serving.lockstep` scheduler; the
  rounds are drawn in pools, so a seed gives other draws than the SimPy
  version this replaced (``docs/design/serving.md``).
  :func:`serving_capacity` gives each side's highest sustainable arrival
  rate; when arrivals exceed either, the result says it is overloaded and
  gives no latency ratio (a queue that grows without bound has no speedup).

Times are in milliseconds of simulated time.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import simpy

from sim.acceptance import AcceptanceModel, drafted_distribution, sample_round
from sim.cost import CostModel, draft_forward_ms
from sim.policies import FixedGamma, GammaPolicy, GammaSpec, TreePolicy, make_policy
from sim.trees import PositionalAcceptance, TreeSampler

from sim.serving import LockstepCost, OpenLoop, ServeRun, Workload, check_count, lockstep, simulate_server


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


def _round_source(acceptance: AcceptanceModel | PositionalAcceptance,
                  pol: GammaPolicy | TreePolicy) -> TreeSampler | AcceptanceModel:
    """What a round's outcome is drawn from: the τ sampler of a tree policy (a chain acceptance model counts as
    its one-rank positional model), or for a γ policy the chain acceptance model itself."""
    if not isinstance(pol, TreePolicy):
        if isinstance(acceptance, PositionalAcceptance):
            raise ValueError("a positional (tree) acceptance needs a TreePolicy; for a gamma policy give its "
                             "chain model (PositionalAcceptance.chain())")
        return acceptance
    acc = acceptance if isinstance(acceptance, PositionalAcceptance) else PositionalAcceptance.from_model(acceptance)
    return TreeSampler(pol.tree, acc)


# long: the SimPy process of one request (draft, verify, accept per round, chain or tree) reads as one loop
def simulate_request(
    acceptance: AcceptanceModel | PositionalAcceptance,
    cost: CostModel,
    policy: GammaPolicy | TreePolicy | GammaSpec | str | int,
    n_tokens: int,
    context_tokens: float = 0.0,
    seed: int = 0,
) -> RequestResult:
    """Simulate one request generating ``n_tokens`` tokens (the last round may overshoot).

    One process on a capacity-1 GPU never waits: ``time_ms`` equals the sum of
    the sampled rounds' draft, verify and overhead times (module docstring).
    A :class:`~sim.policies.TreePolicy` runs tree rounds (``drafted`` counts
    the tree's nodes, ``accepted`` the draft tokens of the accepted path).
    """
    n_tokens = check_count("n_tokens", n_tokens)
    pol = make_policy(policy) if isinstance(policy, (str, int, GammaSpec)) else policy
    pol.reset()
    source = _round_source(acceptance, pol)
    widths = source.tree.frontier_widths if isinstance(source, TreeSampler) else ()
    rng = np.random.default_rng(seed)
    env = simpy.Environment()
    gpu = simpy.Resource(env, capacity=1)
    counts = {"rounds": 0, "drafted": 0, "accepted": 0, "produced": 0}
    totals = {"draft_ms": 0.0, "verify_ms": 0.0, "overhead_ms": 0.0}

    def request() -> simpy.events.ProcessGenerator:
        ctx = float(context_tokens)
        while counts["produced"] < n_tokens:
            if isinstance(source, TreeSampler):  # a tree: one draft forward per level, over that level's parents
                drafted, accepted = source.tree.n_nodes, source.sample(rng) - 1
                forwards = [(w, ctx + level) for level, w in enumerate(widths)]
            else:  # a chain: what the round drafts (a lookup draft may propose fewer than γ) and accepts
                drafted, accepted = sample_round(source, pol.gamma, rng)
                forwards = [(1, ctx + i) for i in range(drafted)]
            with gpu.request() as slot:
                yield slot
                for width, at in forwards:
                    t = draft_forward_ms(cost, width, at)
                    totals["draft_ms"] += t
                    yield env.timeout(t)
                t = cost.verify_ms(drafted + 1, ctx)
                totals["verify_ms"] += t
                yield env.timeout(t)
                t = cost.round_overhead_ms(drafted)
                if t > 0:
                    totals["overhead_ms"] += t
                    yield env.timeout(t)
            counts["rounds"] += 1
            counts["drafted"] += drafted
            counts["accepted"] += accepted
            counts["produced"] += accepted + 1
            ctx += accepted + 1
            if drafted:
                pol.update(drafted, accepted)

    env.process(request())
    env.run()
    produced = counts["produced"]
    return RequestResult(
        n_tokens=produced,
        rounds=counts["rounds"],
        drafted=counts["drafted"],
        accepted=counts["accepted"],
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
class ServingCapacity:
    """The highest arrival rate one side sustains: its throughput with every batch slot busy.

    Above ``requests_per_s`` arrivals outpace service, the queue grows without
    bound and request latency grows with the number of requests simulated.
    """

    requests_per_s: float
    tokens_per_s: float
    batch: int
    tokens_per_request: float  # generated tokens per request, the last round's overshoot included
    method: str  # "closed form" or "saturated simulation"


@dataclass(frozen=True)
class ServingResult:
    """Speculative and baseline serving under the same arrivals, with each side's capacity."""

    speculative: ServingStats
    baseline: ServingStats
    arrival_rate_per_s: float
    policy: str
    speculative_capacity: ServingCapacity
    baseline_capacity: ServingCapacity

    @property
    def speculative_utilization(self) -> float:
        """Arrival rate / speculative capacity; >= 1 means its queue grows without bound."""
        return self.arrival_rate_per_s / self.speculative_capacity.requests_per_s

    @property
    def baseline_utilization(self) -> float:
        """Arrival rate / autoregressive capacity; >= 1 means its queue grows without bound."""
        return self.arrival_rate_per_s / self.baseline_capacity.requests_per_s

    @property
    def overloaded(self) -> bool:
        """True when arrivals exceed either side's capacity: latencies then depend on how many requests ran."""
        return self.speculative_utilization >= 1.0 or self.baseline_utilization >= 1.0

    @property
    def capacity_speedup(self) -> float:
        """Speculative capacity / autoregressive capacity (requests/s): bounded, meaningful under overload."""
        return self.speculative_capacity.requests_per_s / self.baseline_capacity.requests_per_s

    @property
    def throughput_speedup(self) -> float:
        return self.speculative.throughput_tokens_per_s / self.baseline.throughput_tokens_per_s

    @property
    def latency_speedup_p50(self) -> float | None:
        """Baseline p50 latency / speculative p50 latency; ``None`` when :attr:`overloaded` (no bounded ratio)."""
        if self.overloaded:
            return None
        return self.baseline.latency_p50_ms / self.speculative.latency_p50_ms

    def as_dict(self) -> dict:
        return {
            "arrival_rate_per_s": self.arrival_rate_per_s,
            "policy": self.policy,
            "speculative": asdict(self.speculative),
            "baseline": asdict(self.baseline),
            "speculative_capacity": asdict(self.speculative_capacity),
            "baseline_capacity": asdict(self.baseline_capacity),
            "overloaded": self.overloaded,
            "capacity_speedup": self.capacity_speedup,
            "throughput_speedup": self.throughput_speedup,
            "latency_speedup_p50": self.latency_speedup_p50,
        }


def _serve(run: ServeRun) -> ServingStats:
    """The lockstep simulation's stats from a :func:`sim.serving.simulate_server` run."""
    lat = run.e2e_ms
    makespan = float(run.finish_ms.max() - run.send_ms.min())
    tokens = int(run.tokens.sum())
    busy = run.step_seqs > 0
    return ServingStats(
        requests=int(run.tokens.size),
        tokens=tokens,
        makespan_ms=makespan,
        throughput_tokens_per_s=tokens / makespan * 1000.0,
        latency_p50_ms=float(np.percentile(lat, 50)),
        latency_p95_ms=float(np.percentile(lat, 95)),
        latency_p99_ms=float(np.percentile(lat, 99)),
        ms_per_output_token_mean=float(np.mean(lat / run.tokens)),
        mean_batch=float(run.step_seqs[busy].mean()) if busy.any() else 0.0,
    )


def _lockstep_run(arrivals_ms: np.ndarray, n_tokens: int, context_tokens: float, max_batch: int, cost: CostModel,
                  acceptance: AcceptanceModel | None, spec: str | None, seed: int) -> ServeRun:
    """Requests arriving at ``arrivals_ms`` on the lockstep batch (no prompt step; each iteration drafts as far
    as its longest proposal, then one batched verify); ``spec=None``: the autoregressive baseline."""
    work = Workload(len(arrivals_ms), n_tokens, OpenLoop(1.0), arrivals_ms=arrivals_ms)
    return simulate_server(work, lockstep(max_batch), LockstepCost(cost, draft=spec is not None),
                           acceptance if spec is not None else None, spec, context_tokens, seed=seed)


def serving_capacity(
    acceptance: AcceptanceModel,
    cost: CostModel,
    policy: str | int | None,
    n_tokens: int,
    context_tokens: float,
    max_batch: int,
    seed: int = 0,
) -> ServingCapacity:
    """Highest sustainable arrival rate with every one of ``max_batch`` slots busy (``policy=None``: baseline).

    Closed form for the baseline and fixed γ, from the same cost model the
    simulation charges: an iteration at batch B takes the target step (baseline)
    or E over the batch's longest proposal d of d draft steps + a (d + 1)-token
    verify + overhead (P(longest <= d) = P(drafted <= d)^B), and produces B
    tokens (baseline) or B × E[tokens per round]; contexts average the middle of
    a request (context + n_tokens / 2), as in a saturated batch of requests at
    every stage. A request takes n_tokens plus the last round's mean overshoot
    Σ_j j·P(accepted >= j) / E[tokens per round]. Adaptive policies have no
    closed form: their capacity is measured by simulating a saturated queue
    (3 × max_batch requests arriving at once; iterations at full batch only).
    """
    n_tokens, max_batch = check_count("n_tokens", n_tokens), check_count("max_batch", max_batch)
    ctx, b = float(context_tokens) + n_tokens / 2.0, max_batch
    if policy is None:
        tok_per_s = 1000.0 * b / cost.target_step_ms(ctx, b)
        return ServingCapacity(float(tok_per_s / n_tokens), float(tok_per_s), b, float(n_tokens), "closed form")
    pol = make_policy(policy)
    if isinstance(pol, FixedGamma):
        g = pol.gamma
        p_max = np.diff(np.concatenate([[0.0], np.cumsum(drafted_distribution(acceptance, g)) ** b]))
        iter_ms = sum(p * (sum(cost.draft_step_ms(ctx + i, b) for i in range(d)) + cost.verify_ms(d + 1, ctx, b)
                           + cost.round_overhead_ms(d)) for d, p in enumerate(p_max) if p > 0)
        per_round = acceptance.expected_tokens(g)
        overshoot = float(np.arange(1, g + 1) @ acceptance.prefix_accept_probs(g)) / per_round
        tok_per_s = 1000.0 * b * per_round / iter_ms
        return ServingCapacity(float(tok_per_s / (n_tokens + overshoot)), float(tok_per_s), b,
                               float(n_tokens + overshoot), "closed form")
    run = _lockstep_run(np.zeros(3 * b), n_tokens, context_tokens, b, cost, acceptance, pol.spec(), seed)
    full = run.step_seqs == b
    tok_per_s = 1000.0 * float(run.step_emitted[full].sum()) / float(run.step_ms[full].sum())
    per_request = float(run.tokens.sum()) / run.tokens.size
    return ServingCapacity(float(tok_per_s / per_request), float(tok_per_s), b, float(per_request),
                           "saturated simulation")


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
    """Poisson arrivals sharing one GPU, speculative vs autoregressive, same arrivals; each side's capacity."""
    n_requests = check_count("n_requests", n_requests)
    n_tokens = check_count("n_tokens", n_tokens)
    max_batch = check_count("max_batch", max_batch)
    if not 0 < arrival_rate_per_s < math.inf:
        raise ValueError(f"arrival rate must be a finite number > 0 requests/s, got {arrival_rate_per_s}")
    spec = make_policy(policy).spec()
    arrivals_rng, accept_rng, capacity_rng = np.random.default_rng(seed).spawn(3)
    arrivals_ms = np.cumsum(arrivals_rng.exponential(1000.0 / arrival_rate_per_s, size=n_requests))
    spec_seed = int(accept_rng.integers(2**63))
    return ServingResult(
        speculative=_serve(_lockstep_run(arrivals_ms, n_tokens, context_tokens, max_batch, cost, acceptance, spec,
                                         spec_seed)),
        baseline=_serve(_lockstep_run(arrivals_ms, n_tokens, context_tokens, max_batch, cost, None, None, 0)),
        arrival_rate_per_s=float(arrival_rate_per_s),
        policy=spec,
        speculative_capacity=serving_capacity(acceptance, cost, spec, n_tokens, context_tokens, max_batch,
                                              seed=int(capacity_rng.integers(2**63))),
        baseline_capacity=serving_capacity(acceptance, cost, None, n_tokens, context_tokens, max_batch),
    )
