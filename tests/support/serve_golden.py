"""Golden runs of the serving simulator: every output of a few seeded runs, as digests, to hold rewrites of
:func:`sim.serving.simulate_server` to the same numbers.

The configurations cover each path of the loop: llama-server's scheduler under open and closed loads, prompt
chunks, the lockstep scheduler with a roofline :class:`~sim.serving.LockstepCost`, no speculation, a fixed γ
(pools refilled several times), an adaptive γ, one acceptance model per prompt, a replayed run trace, explicit
send times, a non-integer context, and the benchmark's own model (``benchmarks/bench_serve.py``: the step cost
and k = 4 acceptance ``calibrate serve`` fitted to the real llama-server sweep).

``tests/fixtures/serve_golden.json`` was written by the simulator *before* its loop was made faster (commit
2fdf705, ``--write``: today ``python -m tests.support.serve_golden --write`` from the checkout's root);
``tests/sim/test_serving.py`` checks the current one against it. Each array is digested as SHA-256 of its
bytes as float64 (times) or int64 (counts), so a change of one ulp anywhere shows.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from presets import RooflineForward, get_hardware, get_pair
from sim.acceptance import (
    IIDAcceptance,
    PerPositionAcceptance,
    ProposalAcceptance,
    RunTraceAcceptance,
    acceptance_from_dict,
)
from sim.cost import RooflineCost
from sim.serving import (
    ClosedLoop,
    LinearStepCost,
    LockstepCost,
    OpenLoop,
    ServeRun,
    Workload,
    llama_server,
    lockstep,
    simulate_server,
)

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests/fixtures/serve_golden.json"
CALIBRATION = ROOT / "results/cpu-serve-sweep/calibration-serve/serve_calibration.json"
ARRAYS = {"send_ms": "f8", "first_token_ms": "f8", "finish_ms": "f8", "tokens": "i8", "step_ms": "f8",
          "step_seqs": "i8", "step_emitted": "i8", "request_rounds": "i8", "request_drafted": "i8"}
COUNTS = ("zero_gap_tokens", "drafted", "accepted", "rounds")


class AllTotalsCost:
    """A step cost that depends on every total the simulator keeps, the longest draft included."""

    uses_max_draft = True

    def step_ms(self, seqs: int, tokens: int, max_draft: int, ctx_sum: float, attn: float, prompt_tokens: int,
                prompt_seqs: int, emitted: int) -> float:
        return 3.0 + 0.7 * seqs + 0.9 * tokens + 0.31 * max_draft + 1e-3 * ctx_sum + 2e-5 * attn \
            + 0.05 * prompt_tokens + 1.3 * prompt_seqs + 0.17 * emitted

    def describe(self) -> dict:
        return {"kind": "all-totals"}


def _calibrated() -> tuple[LinearStepCost, ProposalAcceptance]:
    doc = json.loads(CALIBRATION.read_text())
    return LinearStepCost.from_dict(doc["step_cost"]), acceptance_from_dict(doc["acceptance"]["4"])


def _roofline() -> RooflineCost:
    hw, p = get_hardware("h100-sxm"), get_pair("llama3-1b-8b")
    return RooflineCost(RooflineForward(p.draft, hw), RooflineForward(p.target, hw))


def _configs() -> dict[str, Callable[[], ServeRun]]:
    lookup = ProposalAcceptance(0.6, IIDAcceptance(0.7))
    trace = RunTraceAcceptance(((np.array([0, 3, 3, 1, 0, 2, 3, 3, 0]), np.array([0, 2, 1, 1, 0, 0, 3, 1, 0])),), 3)
    prompts = [181, 161, 62, 53, 84, 131]
    sends = np.cumsum(np.random.default_rng(7).exponential(40.0, 600))
    wide = LinearStepCost(6.0, 1.1, 0.9, 0.05, 0.02, 0.4)

    def bench(n: int, rate_per_s: float) -> Callable[[], ServeRun]:  # the benchmark's load is 0.9 requests/s
        def run() -> ServeRun:
            cost, acc = _calibrated()
            return simulate_server(Workload(n, 64, OpenLoop(rate_per_s), prompt_tokens=prompts), llama_server(8),
                                   cost, acc, "fixed:4", seed=0)
        return run

    return {
        "bench-model-open": bench(3000, 0.9),
        "bench-model-saturated": bench(1500, 9.0),
        "llama-open-lookup-k4": lambda: simulate_server(
            Workload(2500, 40, OpenLoop(60.0), prompt_tokens=prompts, request_overhead_ms=1.5), llama_server(6),
            wide, lookup, "fixed:4", seed=5),
        "llama-closed-iid-k3-chunks": lambda: simulate_server(
            Workload(1500, 33, ClosedLoop(5, think_ms=3.0), prompt_tokens=[17, 60, 5, 33], request_overhead_ms=0.7),
            llama_server(4, n_batch_tokens=40), AllTotalsCost(), IIDAcceptance(0.75), "fixed:3",
            context_tokens=7.3, seed=11),
        "llama-open-off": lambda: simulate_server(
            Workload(800, 25, OpenLoop(80.0), prompt_tokens=[30, 90]), llama_server(3), wide, seed=2),
        "llama-closed-off-ctx": lambda: simulate_server(
            Workload(500, 19, ClosedLoop(3), prompt_tokens=12), llama_server(2), AllTotalsCost(),
            context_tokens=100.25, seed=4),
        "llama-adaptive": lambda: simulate_server(
            Workload(300, 30, OpenLoop(20.0), prompt_tokens=[20, 50]), llama_server(3), AllTotalsCost(),
            IIDAcceptance(0.85), "heuristic:4", seed=3),
        "llama-per-prompt": lambda: simulate_server(
            Workload(900, 30, ClosedLoop(4), prompt_tokens=[20, 70, 45]), llama_server(4), wide,
            [IIDAcceptance(0.95), PerPositionAcceptance((0.9, 0.5)), lookup], "fixed:4", seed=1),
        "llama-trace-sends": lambda: simulate_server(
            Workload(600, 28, OpenLoop(1.0), prompt_tokens=[40, 9], request_overhead_ms=2.0, arrivals_ms=sends),
            llama_server(5), AllTotalsCost(), trace, "fixed:3", context_tokens=3.0, seed=8),
        "lockstep-roofline": lambda: simulate_server(
            Workload(1200, 96, OpenLoop(40.0), request_overhead_ms=0.0), lockstep(16), LockstepCost(_roofline()),
            IIDAcceptance(0.75), "fixed:4", context_tokens=512.0, seed=6),
        "lockstep-roofline-off": lambda: simulate_server(
            Workload(400, 64, OpenLoop(40.0)), lockstep(8), LockstepCost(_roofline(), draft=False),
            context_tokens=512.5, seed=6),
        "lockstep-all-totals": lambda: simulate_server(
            Workload(700, 41, ClosedLoop(6, think_ms=1.0), prompt_tokens=[10, 3]), lockstep(4), AllTotalsCost(),
            PerPositionAcceptance((0.9, 0.6, 0.3)), "fixed:5", context_tokens=0.7, seed=9),
    }


def digest(run: ServeRun) -> dict:
    """SHA-256 of every array of ``run`` (as float64 / int64 bytes), its counts, and a few readable numbers."""
    out: dict = {}
    for name, dtype in ARRAYS.items():
        a = np.ascontiguousarray(np.asarray(getattr(run, name)).astype(dtype))
        out[name] = hashlib.sha256(a.tobytes()).hexdigest()
    for name in COUNTS:
        out[name] = int(getattr(run, name))
    out["steps"] = int(run.step_ms.size)
    out["step_ms_sum"] = repr(float(np.sum(run.step_ms)))
    out["finish_ms_max"] = repr(float(np.nanmax(run.finish_ms)))
    return out


def golden() -> dict[str, dict]:
    """Every configuration's digest, by name."""
    return {name: digest(make()) for name, make in _configs().items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write {FIXTURE.relative_to(ROOT)}")
    args = ap.parse_args()
    doc = golden()
    text = json.dumps(doc, indent=1, sort_keys=True) + "\n"
    if args.write:
        FIXTURE.write_text(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
