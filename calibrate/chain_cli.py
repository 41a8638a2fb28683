"""``python -m calibrate RUN_DIR [RUN_DIR ...] [--holdout auto|gamma|domain|k|none] [--out DIR]`` of chain sweeps
(``python -m measure``) and head sweeps: the calibrator of those kinds of run (:mod:`calibrate.kinds`).

Fits the simulator's cost and acceptance models to the run directories,
predicts every measured configuration (closed form, trace replay, event
simulator), prints a per-configuration error table and the MAPE (in-sample
and held-out), writes ``calibration.json`` + CSV tables + per-draft model
files for ``python -m sim --cost-model/--acceptance``, and ends with one
JSON line. Bad input: one-line error, exit status 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

from toolkit.cli import OneLineParser, check_output_dir, choice_arg, fail, int_arg, nonempty_arg
from toolkit.jsonio import strict_dumps
from toolkit.track import TRACKERS, usable_tracker

# the same names as calibrate.folds.HOLDOUT_MODES (a test checks), here so a bad value fails before
# pandas and scipy are imported
HOLDOUT_CHOICES = ("auto", "gamma", "domain", "k", "none")
PROG = "python -m calibrate"


def _fmt(v) -> str:
    return "   n/a" if v is None or v != v else f"{v:6.2f}"


def check_run_dirs(runs: list[str]) -> None:
    """Each RUN_DIR exists and is a directory holding ``run.json``; otherwise one line naming it."""
    for run in runs:
        p = Path(run)
        if not p.exists():
            fail(PROG, f"run directory not found: {run!r}")
        if not p.is_dir():
            fail(PROG, f"{run!r} is a file, not a run directory (a directory written by python -m measure)")
        if not (p / "run.json").is_file():
            fail(PROG, f"{run!r} is not a run directory (no run.json); write one with python -m measure")


def print_report(res) -> None:
    """The per-configuration error table and the MAPE lines of a :class:`calibrate.calibration.CalibrationResult`."""
    table = res.held_out if len(res.held_out) else res.in_sample
    split = "held-out" if len(res.held_out) else "in-sample"
    print(f"per-configuration error ({split}, speedup; predicted vs measured):")
    print(f"  {'configuration':58s} {'method':11s} {'meas':>6s} {'95% CI':>13s} {'pred':>6s} {'err%':>6s} in CI")
    for _, r in table.iterrows():
        ci = (f"[{r['measured_speedup_lo']:.2f},{r['measured_speedup_hi']:.2f}]"
              if r.get("measured_speedup_lo") == r.get("measured_speedup_lo") and r.get("measured_speedup_lo")
              is not None else "-")
        inside = {True: "yes", False: "no"}.get(r.get("inside_ci"), "-")
        flag = "  (unstable: not in MAPE)" if r.get("unstable") else ""
        print(f"  {r['run'] + '/' + r['cell_id']:58.58s} {r['method']:11s} {_fmt(r['measured_speedup'])} "
              f"{ci:>13s} {_fmt(r['predicted_speedup'])} {_fmt(r['ape_speedup_pct'])} {inside:>5s}{flag}")
    for name, m in (("in-sample", res.mape_in_sample), ("held-out", res.mape_held_out)):
        for method, v in m.items():
            share = (f"{v['n_inside_ci']}/{v['n_with_ci']} ({100 * v['share_inside_ci']:.0f}%)"
                     if v.get("share_inside_ci") is not None else "n/a")
            print(f"MAPE {name:9s} {method:11s} speedup {_fmt(v['speedup_mape_pct'])}%  "
                  f"tokens/s {_fmt(v['tokens_per_s_mape_pct'])}%  ({v['n_cells']} stable cells); "
                  f"inside the measured 95% CI: {share}")
    if res.unstable_cells:
        print(f"{len(res.unstable_cells)} unstable cell(s) weighted by their variance in the cost fit, "
              "left out of the MAPE: " + ", ".join(res.unstable_cells))


def main(argv: list[str] | None = None) -> int:
    """``python -m calibrate RUN_DIR...`` of chain sweeps and head sweeps: 0 on success, 2 with one line on bad
    input."""
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR", type=nonempty_arg("run directory"),
                    help="run directories written by python -m measure")
    ap.add_argument("--holdout", default="auto", type=choice_arg("--holdout", HOLDOUT_CHOICES), metavar="MODE",
                    help=f"what to hold out for validation: {'|'.join(HOLDOUT_CHOICES)} (default auto: gamma when "
                         "the runs have two or more γ, else domain, then k, else none; one line says which)")
    ap.add_argument("--out", default=None, type=nonempty_arg("directory"),
                    help="output directory (default: <first RUN_DIR>/calibration)")
    ap.add_argument("--seed", type=int_arg(0, 2**63 - 1), default=0, help="event-simulator seed (default 0)")
    ap.add_argument("--pool-hardware", action="store_true",
                    help="fit cells measured on different machines together (refused otherwise; noted when pooled)")
    ap.add_argument("--allow-incomplete", action="store_true",
                    help="use runs that are not complete (interrupted, failed, still running)")
    ap.add_argument("--exclude-damaged", action="store_true",
                    help="leave out (and name) finished cells whose rows on disk are incomplete or written twice, "
                         "instead of refusing the run")
    ap.add_argument("--track", default=None, type=choice_arg("--track", TRACKERS), metavar="wandb|mlflow",
                    help="also log the calibration (MAPE, per-cell predictions, the report's charts) to Weights & "
                         "Biases or MLflow (the track extra; a tracker that fails costs one warning line)")
    args = ap.parse_args(argv)
    check_run_dirs(args.runs)
    args.track = usable_tracker(args.track, PROG)
    out = Path(args.out) if args.out else Path(args.runs[0]) / "calibration"
    try:
        check_output_dir("--out", out)
        from calibrate.calibration import calibrate
        from calibrate.outputs import write_outputs

        res = calibrate(args.runs, holdout=args.holdout, seed=args.seed,
                        allow_incomplete=args.allow_incomplete,
                        pool_hardware=args.pool_hardware, exclude_damaged=args.exclude_damaged)
        summary = write_outputs(res, out)
    except ValueError as exc:
        print(f"{PROG}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    if res.holdout_choice is not None:  # calibrate() always says how it held out
        print(res.holdout_choice.note)
    print_report(res)
    for note in res.data.notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"calibration written to {out / 'calibration.json'}")
    if args.track:
        from calibrate.tracking import track_calibration

        track_calibration(args.track, out, {k: v for k, v in vars(args).items() if k != "track"}, PROG)
    print(strict_dumps(summary))
    return 0
