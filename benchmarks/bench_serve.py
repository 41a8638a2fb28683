"""The serving simulation of 10^6 requests, timed: median wall time of a few runs against the 60 s target.

    flock -x /tmp/specscope-cpu.lock python benchmarks/bench_serve.py
    python benchmarks/bench_serve.py --requests 100000 --repeats 5      (shorter; the target scales with it)

The model is the one ``python -m calibrate serve`` fitted to the real llama-server
sweep (``--calibration``, default ``results/cpu-serve-sweep/calibration-serve/
serve_calibration.json``): its step cost (``sim.serving.step_cost_from_dict``) and its
acceptance at ``--k`` (default 4: prompt lookup, drafting in about a fifth of
rounds), 8 slots, the sweep's 64 new tokens a request after its prompts' lengths,
Poisson arrivals at 90% of the capacity a saturated probe finds (so the batch
stays full and every step is a mixed one). Each repeat simulates the whole run
afresh (``bench_sim.bench_serve_llama``: one core, the probe not counted). Prints
every repeat's seconds, the median, 60 s scaled to the requests and their ratio
(>= 1 meets the target), and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's packages, run from anywhere

from bench_sim import SERVE_REQUESTS, SERVE_SECONDS, bench_serve_llama

from sim.acceptance import acceptance_from_dict
from sim.serving import step_cost_from_dict

DEFAULT_CALIBRATION = Path(__file__).resolve().parents[1] / "results/cpu-serve-sweep/calibration-serve/serve_calibration.json"
#: The sweep's prompt lengths in tokens, in the order its requests used them (results/cpu-serve-sweep/
#: serve_requests.csv: six prompts in turn).
SWEEP_PROMPTS = (181, 161, 62, 53, 84, 131)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=SERVE_REQUESTS, help=f"requests (default {SERVE_REQUESTS:,})")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs (default 3; the median is reported)")
    ap.add_argument("--calibration", type=Path, default=DEFAULT_CALIBRATION, help="serve_calibration.json")
    ap.add_argument("--k", type=int, default=4, help="draft length (default 4)")
    args = ap.parse_args()
    if args.requests < 1 or args.repeats < 1:
        print(f"bench_serve.py: error: --requests {args.requests} and --repeats {args.repeats} must be >= 1",
              file=sys.stderr)
        return 2
    try:
        doc = json.loads(args.calibration.read_text())
        cost = step_cost_from_dict(doc["step_cost"])
        acc = acceptance_from_dict(doc["acceptance"][str(args.k)])
    except (OSError, KeyError, ValueError) as exc:
        print(f"bench_serve.py: error: --calibration {str(args.calibration)!r}: {exc} (write one with python -m "
              "calibrate serve RUN_DIR)", file=sys.stderr)
        return 2
    budget = SERVE_SECONDS * args.requests / SERVE_REQUESTS
    times, batch = [], 0.0
    for i in range(args.repeats):
        s, batch = bench_serve_llama(args.requests, cost, acc, args.k, 64, SWEEP_PROMPTS, 8)
        times.append(s)
        print(f"repeat {i}: {args.requests:,} requests in {s:.2f} s (mean batch {batch:.2f} of 8 slots)")
    med = statistics.median(times)
    print(f"median {med:.2f} s (min {min(times):.2f}, max {max(times):.2f}) against {budget:.1f} s: "
          f"ratio {budget / med:.2f}x (>= 1 meets the target)")
    print(json.dumps({"requests": args.requests, "repeats": args.repeats, "seconds": times, "median_s": med,
                      "target_s": budget, "ratio_to_target": budget / med, "mean_batch": batch, "k": args.k,
                      "calibration": str(args.calibration)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
