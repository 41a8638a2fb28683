"""Compare two measurement runs cell by cell: do their speedup CIs overlap?

The repeatability check of the README ("Measured twice"): two run directories
written by ``python -m measure`` (e.g. two ``make run``), matched by cell id.
For every cell in both, the two speedups with their 95% CIs, whether the CIs
overlap, and whether either run flagged the cell unstable. Prints a table and
one summary line; with ``--json`` the same as one JSON object.

    python benchmarks/compare_runs.py runs/quiet1/measure runs/quiet2/measure
"""
from __future__ import annotations

import argparse
import json
import sys

from measure import stats
from measure.records import load_run
from measure.rows import CellRow


def compare(run_a: str, run_b: str) -> dict:
    """Per-cell overlap of the two runs' speedup CIs, and a summary over stable cells."""
    cells = []
    a = {r.cell_id: r for r in load_run(run_a).rows(CellRow)}
    b = {r.cell_id: r for r in load_run(run_b).rows(CellRow)}
    for cid in [c for c in a if c in b]:
        ra, rb = a[cid], b[cid]
        ea, eb = ra.estimate("speedup"), rb.estimate("speedup")
        unstable = ra.is_unstable or rb.is_unstable
        cells.append({"cell_id": cid, "a": [ea.value, ea.lo, ea.hi], "b": [eb.value, eb.lo, eb.hi],
                      "overlap": stats.overlaps(ea, eb), "unstable": unstable})
    stable = [c for c in cells if not c["unstable"]]
    return {"run_a": run_a, "run_b": run_b, "cells": cells, "n_common": len(cells),
            "n_stable": len(stable), "n_stable_overlapping": sum(1 for c in stable if c["overlap"]),
            "n_stable_without_ci": sum(1 for c in stable if c["overlap"] is None),
            "n_unstable": len(cells) - len(stable)}


def _fmt(e: list) -> str:
    v, lo, hi = e
    if v is None:
        return "-"
    return f"{v:.3f} [{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else f"{v:.3f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_a")
    p.add_argument("run_b")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = p.parse_args(argv)
    try:
        res = compare(args.run_a, args.run_b)
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(res))
        return 0
    for c in res["cells"]:
        flag = ("unstable" if c["unstable"] else "no CI" if c["overlap"] is None
                else "overlap" if c["overlap"] else "NO OVERLAP")
        print(f"{c['cell_id']:<55} {_fmt(c['a']):>24} {_fmt(c['b']):>24}  {flag}")
    print(f"{res['n_stable_overlapping']}/{res['n_stable']} stable cells overlap "
          f"({res['n_stable_without_ci']} without a CI); {res['n_unstable']} unstable of {res['n_common']} common cells")
    return 0 if res["n_stable_overlapping"] == res["n_stable"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
