"""``python -m reports RUN_DIR_OR_CALIBRATION_DIR [--out DIR] [--no-png]``.

The kind of run the source is (its calibration's file, or the run's kind) picks the sections
(:mod:`reports.kinds`): a chain sweep or head sweep gets the chain report (:mod:`reports.page`), a serving run
(``python -m measure serve``) or its calibration (``python -m calibrate serve``) the serving report
(:mod:`reports.serving`), a tree run (``python -m measure tree``) or its calibration (``python -m calibrate
trees``) the token-tree report (:mod:`reports.trees`); one page builder (:mod:`reports.builder`) draws them.

Writes ``report.html`` (the answer first, charts inline as SVG), one PNG and
one interactive HTML per chart, and ``claims.html`` (published claims checked
against the simulator, a page of its own); prints where the report is, and
ends with one JSON line.
Bad input (a missing or wrong source directory, an ``--out`` that is a file or
cannot be created, a calibration that is not whole: a torn or missing table,
column or key, an ``inf``, a model file it names that is gone): one-line error
naming the file, exit status 2, before any chart is drawn or ``--out`` made.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from toolkit.cli import OneLineParser, check_output_dir, entry_point, fail, nonempty_arg

PROG = "python -m reports"


def _done(res) -> int:
    """Print where the report went and its one JSON line (``res``: a :class:`reports.builder.ReportResult`)."""
    print(f"report written to {res.html_path.resolve()}")
    print(json.dumps({"report": str(res.html_path.resolve()), "charts": list(res.charts),
                      "pngs": [str(p) for p in res.png_paths], "calibration": str(res.calibration_dir.resolve()),
                      "claims": str(res.claims_path.resolve()) if res.claims_path else None}))
    return 0


@entry_point
def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("src", metavar="RUN_DIR_OR_CALIBRATION_DIR", type=nonempty_arg("directory"))
    ap.add_argument("--out", default=None, type=nonempty_arg("directory"),
                    help="output directory (default: <src>/report)")
    ap.add_argument("--no-png", action="store_true", help="skip the PNG files (faster)")
    args = ap.parse_args(argv)
    src = Path(args.src)
    if not src.exists():
        fail(PROG, f"directory not found: {args.src!r}")
    if not src.is_dir():
        fail(PROG, f"{args.src!r} is a file; give a calibration directory (calibration.json) or a run directory")
    from measure.runkinds import RUN_KINDS

    if not any((src / f).is_file() for f in ("run.json", *(k.calibration_file for k in RUN_KINDS.values()))):
        fail(PROG, f"{args.src!r} is neither a calibration directory (calibration.json, serve_calibration.json, "
                   "tree_calibration.json) nor a run directory (run.json)")
    try:  # each calibration is checked whole before --out is made: a damaged one draws nothing
        if args.out and Path(args.out).exists() and not Path(args.out).is_dir():  # said first, whatever the source
            check_output_dir("--out", Path(args.out))
        from reports.builder import build
        from reports.kinds import find_report

        res = build(find_report(src), src, args.out, png=not args.no_png,
                    check_out=lambda out: check_output_dir("--out", out))
    except ValueError as exc:
        print(f"{PROG}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    return _done(res)


if __name__ == "__main__":
    sys.exit(main())
