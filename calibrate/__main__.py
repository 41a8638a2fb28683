"""``python -m calibrate RUN_DIR [RUN_DIR ...] [--holdout gamma|domain|k|none] [--out DIR]``.

``python -m calibrate ingest FILE...`` reads an engine's metrics instead (see
:mod:`calibrate.ingest.cli`).

Fits the simulator's cost and acceptance models to the run directories,
predicts every measured configuration (closed form, trace replay, event
simulator), prints a per-configuration error table and the MAPE (in-sample
and held-out), writes ``calibration.json`` + CSV tables + per-draft model
files for ``python -m sim --cost-model/--acceptance``, and ends with one
JSON line. Bad input: one-line error, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from calibrate.calibration import HOLDOUT_MODES, calibrate
from calibrate.outputs import write_outputs


def _fmt(v) -> str:
    return "   n/a" if v is None or v != v else f"{v:6.2f}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["ingest"]:  # subcommand: an engine's spec-decode metrics and llama-bench costs -> sim
        from calibrate.ingest.cli import main as ingest_main

        return ingest_main(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m calibrate", description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories written by python -m measure")
    ap.add_argument("--holdout", default="gamma",
                    help=f"what to hold out for validation: {'|'.join(HOLDOUT_MODES)} (default gamma)")
    ap.add_argument("--out", default=None, help="output directory (default: <first RUN_DIR>/calibration)")
    ap.add_argument("--seed", type=int, default=0, help="event-simulator seed (default 0)")
    args = ap.parse_args(argv)
    out = Path(args.out) if args.out else Path(args.runs[0]) / "calibration"
    try:
        res = calibrate(args.runs, holdout=args.holdout, seed=args.seed)
        summary = write_outputs(res, out)
    except ValueError as exc:
        print(f"calibrate: error: {exc}", file=sys.stderr)
        return 2
    table = res.held_out if len(res.held_out) else res.in_sample
    split = "held-out" if len(res.held_out) else "in-sample"
    print(f"per-configuration error ({split}, speedup; predicted vs measured):")
    print(f"  {'configuration':58s} {'method':11s} {'meas':>6s} {'pred':>6s} {'err%':>6s}")
    for _, r in table.iterrows():
        print(f"  {r['run'] + '/' + r['cell_id']:58.58s} {r['method']:11s} {_fmt(r['measured_speedup'])} "
              f"{_fmt(r['predicted_speedup'])} {_fmt(r['ape_speedup_pct'])}")
    for name, m in (("in-sample", res.mape_in_sample), ("held-out", res.mape_held_out)):
        for method, v in m.items():
            print(f"MAPE {name:9s} {method:11s} speedup {_fmt(v['speedup_mape_pct'])}%  "
                  f"tokens/s {_fmt(v['tokens_per_s_mape_pct'])}%  ({v['n_cells']} cells)")
    print(f"calibration written to {out / 'calibration.json'}")
    print(json.dumps(json.loads(json.dumps(summary, default=str).replace("NaN", "null"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
