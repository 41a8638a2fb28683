"""``python -m reports.prediction_chart --out FILE < DATA.json`` — draw the simulator's prediction charts.

``python -m sim --chart FILE`` computes the data (speedup against α per γ,
and speedup against γ for its rows) and pipes it here as JSON, so the
simulator imports no plotting code; this module owns the drawing, with the
chart builders of :mod:`reports.charts`. Input::

    {"title": str,
     "speedup_vs_alpha": [{"alpha": float, "gamma": int, "speedup": float}, ...],
     "speedup_vs_gamma": [{"gamma": int, "speedup": float, "source": str, "optimal": bool}, ...]}

Bad input: one line, exit status 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from toolkit.cli import OneLineParser, nonempty_arg

KEYS = {"speedup_vs_alpha": ("alpha", "gamma", "speedup"), "speedup_vs_gamma": ("gamma", "speedup", "source",
                                                                              "optimal")}


def render(data: dict, path: Path) -> Path:
    """Write the side-by-side speedup-vs-α and speedup-vs-γ charts of ``data`` to ``path`` (.html/.png/.svg)."""
    import pandas as pd

    from reports.charts import save_chart, speedup_vs_alpha_chart, speedup_vs_gamma_chart

    for key, cols in KEYS.items():
        rows = data.get(key)
        if not isinstance(rows, list) or not rows or any(not isinstance(r, dict) or set(cols) - set(r) for r in rows):
            raise ValueError(f"chart data: {key!r} must be a non-empty list of objects with {', '.join(cols)}")
    title = str(data.get("title", "custom"))
    chart = speedup_vs_alpha_chart(pd.DataFrame(data["speedup_vs_alpha"])).properties(
        title=f"{title}: speedup vs alpha") | speedup_vs_gamma_chart(pd.DataFrame(data["speedup_vs_gamma"])).properties(
        title=f"{title}: speedup vs gamma")
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_chart(chart, path)


def main(argv: list[str] | None = None) -> int:
    """Read the chart data (JSON) from stdin and write the chart file."""
    ap = OneLineParser(prog="python -m reports.prediction_chart", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=nonempty_arg("file name"), help="chart file (.html, .png, .svg)")
    args = ap.parse_args(argv)
    try:
        data = json.loads(sys.stdin.read())
        if not isinstance(data, dict):
            raise ValueError("chart data must be a JSON object")
        render(data, Path(args.out))
    except (ValueError, OSError) as exc:
        print(f"{ap.prog}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
