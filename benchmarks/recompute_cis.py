"""Re-derive a run's speedup CIs with today's estimator, from its saved generations, into a copy of the run.

A run directory keeps every generation's tokens/s (``generations.csv``), so
the CI of each cell can be recomputed offline when the interval changes (as
it did from the paired BCa bootstrap to Fieller's interval, see
:mod:`measure.stats`). The run is copied to ``OUT`` and the copy's
``cells.csv`` gets the new ``speedup_lo``/``speedup_hi`` (the point value is
checked to be unchanged); the original is not touched. Then ``python -m
calibrate OUT`` and ``benchmarks/compare_runs.py`` read the copy.

    python benchmarks/recompute_cis.py RUN_DIR /tmp/run-fieller
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import pandas as pd

from measure import stats


def recompute(src: Path, out: Path) -> int:
    """Copy ``src`` to ``out`` and rewrite the copy's speedup CIs; the number of cells rewritten."""
    if not (src / "cells.csv").is_file() or not (src / "generations.csv").is_file():
        raise ValueError(f"{src}: not a run directory with cells.csv and generations.csv")
    if out.exists():
        raise ValueError(f"{out}: exists; give a new directory")
    shutil.copytree(src, out)
    gens = pd.read_csv(out / "generations.csv")
    cells = pd.read_csv(out / "cells.csv")
    for i, row in cells.iterrows():
        sub = gens[gens["cell_id"] == row["cell_id"]]
        base = sub[sub["mode"] == "baseline"].set_index(["prompt_id", "repeat"])["tokens_per_s"]
        spec = sub[sub["mode"] == "speculative"].set_index(["prompt_id", "repeat"])["tokens_per_s"].reindex(base.index)
        est = stats.speedup_ci(base.to_numpy(float), spec.to_numpy(float))
        if est.value is None or abs(est.value - float(row["speedup"])) > 1e-9 * max(1.0, abs(est.value)):
            raise ValueError(f"{row['cell_id']}: speedup {est.value} from generations.csv, {row['speedup']} in "
                             "cells.csv; the run's pairs are not what this estimator expects")
        cells.loc[i, ["speedup_lo", "speedup_hi"]] = [est.lo, est.hi]
    cells.to_csv(out / "cells.csv", index=False)
    return len(cells)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path)
    p.add_argument("out", type=Path)
    a = p.parse_args(argv)
    try:
        n = recompute(a.run, a.out)
    except ValueError as e:
        p.error(str(e))
    print(f"{a.out}: {n} cells with the speedup CI of measure.stats (the original {a.run} is unchanged)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
