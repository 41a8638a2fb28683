"""``python -m reports RUN_DIR_OR_CALIBRATION_DIR [--out DIR] [--no-png]``.

Writes ``report.html`` (charts inline as SVG), one PNG and one interactive
HTML per chart, prints where the report is, and ends with one JSON line.
Bad input: one-line error, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from reports.page import build_report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m reports", description=__doc__.splitlines()[0])
    ap.add_argument("src", metavar="RUN_DIR_OR_CALIBRATION_DIR")
    ap.add_argument("--out", default=None, help="output directory (default: <src>/report)")
    ap.add_argument("--no-png", action="store_true", help="skip the PNG files (faster)")
    ap.add_argument("--allow-incomplete", action="store_true",
                    help="report a run that is not complete (interrupted, failed, still running)")
    args = ap.parse_args(argv)
    try:
        res = build_report(args.src, args.out, png=not args.no_png, allow_incomplete=args.allow_incomplete)
    except ValueError as exc:
        print(f"reports: error: {exc}", file=sys.stderr)
        return 2
    print(f"report written to {res.html_path.resolve()}")
    print(json.dumps({"report": str(res.html_path.resolve()), "charts": list(res.charts),
                      "pngs": [str(p) for p in res.png_paths], "calibration": str(res.calibration_dir.resolve())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
