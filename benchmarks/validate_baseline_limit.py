"""How ``python -m sim validate`` depends on its baseline check, and what the excluded rows' baselines imply.

``python benchmarks/validate_baseline_limit.py [--limits 1.5,2,2.5,3.5,inf]`` runs the whole validation once per
limit (:data:`sim.validate.BASELINE_LIMIT` set for the run; the overhead model is chosen anew each time) and
prints the expressed rows, the adopted kernels model, the held-out medians and the slowdown count; then, for every
row the shipped limit excludes, the average number of sequences its published baseline throughput implies were
decoding: the b that solves tokens/s = 1000 · b / step(b) on the kernels column's own lockstep step.
(results/2026-11-27-overhead-models.md.)
"""

from __future__ import annotations

import argparse

import sim.validate as v
from sim.published import load_published


def effective_sequences(p: v.Priced) -> int:
    """The batch whose lockstep throughput on the priced step is nearest the row's published baseline."""
    tok_s = 1000.0 * p.batch / float(p.row.baseline_step_ms or 1)
    cost = p.costs["kernels"]
    return min(range(1, p.batch + 1),
               key=lambda b: abs(1000.0 * b / cost.target_step_ms(p.context_tokens, b) - tok_s))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limits", default="1.5,2,2.5,3.5,inf")
    args = ap.parse_args()
    rows = load_published()
    shipped = v.BASELINE_LIMIT
    print("limit | expressed | adopted kernels model | held-out kernels (batch-1) | slowdowns at batch > 1")
    for text in args.limits.split(","):
        v.BASELINE_LIMIT = float(text)
        out = v.report(rows).splitlines()
        adopted = next(line for line in out if line.startswith("adopted per source"))
        held = {line.split(": ")[0]: line.split("kernels ")[1].split(",")[0] for line in out
                if line.startswith("median |error|, held-out rows")}
        slow = next(line for line in out if line.startswith("published slowdowns at batch > 1:"))
        print(f"{text} | {out[0].split(': ')[1].split(',')[0]} | "
              f"{adopted.split('consulted: ')[1].split(';')[0]} | "
              f"{held['median |error|, held-out rows, adopted overhead']} "
              f"({held['median |error|, held-out rows, batch-1, adopted']}) | {slow.split(': ', 1)[1]}")
    v.BASELINE_LIMIT = shipped
    run = v.price_all(rows, v.DEFAULT_MOE_ROUTING)
    print(f"\nrows beyond the shipped limit ({shipped:g}x): sequences decoding on average, implied by the baseline")
    for p in run.gated:
        print(f"  {p.row.id}: batch {p.batch}, baseline {v.baseline_ratio(p):.2f}x the lockstep step, "
              f"~{effective_sequences(p)} sequences")


if __name__ == "__main__":
    main()
