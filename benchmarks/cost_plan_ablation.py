"""Does sizing the cost points to the run cost the calibration anything? Held-out error with and without them.

For each committed run (a complete run with two or more γ and cost curves),
``python -m calibrate``'s held-out speedup MAPE (leave one γ out) is computed
twice: on the run as committed, and on a copy whose ``cost_target.csv`` keeps
only the token counts :mod:`measure.costpoints` now times (1..γ_max + 1 of
the run, i.e. without the 6-16-token forwards the default plan used to time).
Also the closed-form speedup curve's largest change at any γ 1..10 (beyond
γ_max + 1 the cost table is then extrapolated). Files only: no model, no
timing, no seed beyond calibrate's own (0).

    python benchmarks/cost_plan_ablation.py results/cpu-make-run-* results/cpu-smollm2-*-gammas --out x.json
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from calibrate.calibration import calibrate  # noqa: E402
from calibrate.prediction import METHODS  # noqa: E402
from measure.records import load_run  # noqa: E402
from sim.policies import GammaSpec  # noqa: E402


def usable(path: Path) -> bool:
    """A complete run with cost curves and two or more γ policies (a leave-one-γ-out fold to predict)."""
    try:
        run = load_run(path)
        cells, ct = run.table("cells"), run.table("cost_target")
    except ValueError:
        return False
    return run.status == "complete" and len(ct) > 0 and cells["gamma_policy"].nunique() >= 2


def restricted_copy(path: Path, into: Path) -> tuple[Path, int, int]:
    """A copy of the run whose cost_target.csv keeps n_tokens <= γ_max + 1; (copy, rows kept, rows before)."""
    dst = into / path.name
    shutil.copytree(path, dst, ignore=shutil.ignore_patterns("calibration*", ".specscope.lock"))
    gamma_max = max(GammaSpec.parse(str(g)).gamma for g in load_run(path).table("cells")["gamma_policy"])
    ct = pd.read_csv(dst / "cost_target.csv")
    kept = ct[ct["n_tokens"] <= gamma_max + 1]
    kept.to_csv(dst / "cost_target.csv", index=False)
    return dst, len(kept), len(ct)


def held_out(path: Path) -> tuple[dict[str, float], pd.DataFrame]:
    res = calibrate([path], holdout="gamma")
    mape = {m: float("nan") for m in METHODS}
    mape.update({m: v["speedup_mape_pct"] for m, v in res.mape_held_out.items()})
    return (mape,
            res.curves[res.curves["method"] == "closed_form"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--out", type=Path, help="also write the rows as JSON here")
    a = p.parse_args(argv)
    runs = [r for r in a.runs if (r / "run.json").exists() and usable(r)]
    if not runs:
        p.error("no usable run (complete, with cost curves and two or more γ) among the arguments")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for run in runs:
            full, full_curve = held_out(run)
            copy, kept, before = restricted_copy(run, Path(tmp))
            sized, sized_curve = held_out(copy)
            both = full_curve.merge(sized_curve, on=["series", "gamma"], suffixes=("_full", "_sized"))
            change = float((both["predicted_speedup_sized"] / both["predicted_speedup_full"] - 1).abs().max() * 100)
            rows.append({"run": run.name, "cost_rows": before, "cost_rows_sized": kept,
                         **{f"{m}_full": v for m, v in full.items()}, **{f"{m}_sized": v for m, v in sized.items()},
                         "curve_max_change_pct": change})
            r = rows[-1]
            print(f"{run.name:36s} cost rows {before:4d} -> {kept:4d}  held-out speedup MAPE (closed form / trace / "
                  f"event sim) {r['closed_form_full']:5.2f} {r['trace_full']:5.2f} {r['event_sim_full']:5.2f}% -> "
                  f"{r['closed_form_sized']:5.2f} {r['trace_sized']:5.2f} {r['event_sim_sized']:5.2f}%; curve "
                  f"γ 1-10 changes by up to {change:.1f}%", flush=True)
    df = pd.DataFrame(rows)
    for m in ("closed_form", "trace", "event_sim"):
        d = (df[f"{m}_sized"] - df[f"{m}_full"]).dropna()
        print(f"{m:12s} mean held-out MAPE {df[f'{m}_full'].mean():.2f}% -> {df[f'{m}_sized'].mean():.2f}% "
              f"(change per run: median {np.median(d):+.2f}, min {d.min():+.2f}, max {d.max():+.2f} points; worse "
              f"in {int((d > 0).sum())} of {len(d)} runs)")
    if a.out:
        a.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
