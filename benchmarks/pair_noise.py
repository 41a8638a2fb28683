"""How noisy one paired speedup is in a run: the spread of each repeat's speculative ÷ baseline tokens/s.

For every (cell, prompt), each repeat's ratio of speculative to baseline
tokens/s (``generations.csv``) is divided by that (cell, prompt)'s mean
ratio; the standard deviation of those relative values over the run is the
noise of one pair (prompt differences, which are real, are taken out). Also
the baseline's own spread around its prompt's mean. Reads files only::

    python benchmarks/pair_noise.py runs/a/measure runs/b/measure

Prints one line per run for people, then one JSON line for machines.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from measure.records import load_run  # noqa: E402


def pair_noise(run_dir: str) -> dict:
    """``{"run", "pairs", "pair_ratio_sd", "baseline_sd"}`` of one run directory."""
    g = load_run(run_dir).table("generations")
    p = g.pivot_table(index=["cell_id", "prompt_id", "repeat"], columns="mode", values="tokens_per_s").reset_index()
    ratio = p["speculative"] / p["baseline"]
    rel = ratio / ratio.groupby([p["cell_id"], p["prompt_id"]]).transform("mean")
    base = p["baseline"] / p.groupby("prompt_id")["baseline"].transform("mean")
    return {"run": run_dir, "pairs": int(len(p)), "pair_ratio_sd": float(rel.std()), "baseline_sd": float(base.std())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="measure run directories")
    args = ap.parse_args(argv)
    try:
        rows = [pair_noise(r) for r in args.runs]
    except ValueError as e:
        print(f"pair_noise: {e}", file=sys.stderr)
        return 2
    for r in rows:
        print(f"{r['run']}: one pair's speedup sd {100 * r['pair_ratio_sd']:.1f}% over {r['pairs']} pairs; "
              f"baseline sd {100 * r['baseline_sd']:.1f}%")
    print(json.dumps({"pair_noise": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
