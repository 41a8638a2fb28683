"""The fixed design against the tuned one on the same question, side by side in one session.

Runs ``python -m measure ARGS --out DIR/fixed`` (every cell, every repeat), then ``python -m measure ARGS
--until-decided [--time-budget S] --out DIR/tuned`` (a race per domain, measure/racing.py), one after the other on
the same machine, and prints per domain the decision of each (the best draft/γ, or plain decoding), the measuring
time of each (the sum of the counted generations' wall time, and the whole command's), and the regret of the
tuned decision in the fixed design's own measurement: ``1 − speedup(tuned choice) ÷ speedup(fixed best)``, with
the interval the two cells' 95% CIs allow. The tuned run's decision is its race's leader at the last look; its
``--time-budget`` (``--budget-share``) is that share of the fixed run's measuring time (counted generations). A
table for people, then one JSON line.

    python benchmarks/bench_tune.py --out runs/bench-tune -- --prompts 2 --gamma 2,4 --repeats 3
    python benchmarks/bench_tune.py --budget-share 0.33 --out runs/bench-tune -- --gamma 1,2,4,8 --repeats 6

Timing: run it alone on the machine (no other heavy process): the two designs are measured one after the other,
so a disturbance of one is not shared by the other.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from measure import records  # noqa: E402
from toolkit.cli import OneLineParser, float_arg  # noqa: E402


@dataclass(frozen=True)
class Decision:
    """One domain's answer in one run: the chosen cell (None = plain decoding) and its speedup with its CI."""

    domain: str
    cell_id: str | None
    speedup: float
    lo: float | None
    hi: float | None


def decisions(run_dir: Path) -> dict[str, Decision]:
    """Per domain, the cell with the highest measured speedup, or plain decoding when none beats 1."""
    cells = records.load_run(run_dir).rows("cells")
    out: dict[str, Decision] = {}
    for c in cells:
        if c.speedup is None:
            continue
        best = out.get(c.domain)
        if best is None or c.speedup > best.speedup:
            out[c.domain] = Decision(c.domain, c.cell_id, c.speedup, c.speedup_lo, c.speedup_hi)
    return {d: (v if v.speedup > 1.0 else Decision(d, None, 1.0, 1.0, 1.0)) for d, v in out.items()}


def race_decisions(run_dir: Path) -> dict[str, Decision]:
    """Per domain, the tuned run's answer: the leader at the race's last look (``run.json`` ``race``), which is
    what the race decided or, stopped by its budget, would choose — not the best of its cells' raw speedups,
    which for a candidate stopped early rest on a few visits."""
    run = records.load_run(run_dir)
    cells = {c.cell_id: c for c in run.rows("cells")}
    looks = run.meta.get("race", {}).get("looks") or []
    out: dict[str, Decision] = {}
    for group in (looks[-1]["groups"].values() if looks else ()):
        leader = group["leader"]
        c = cells.get(leader)
        if c is None:  # "off": plain decoding; its domain from the group's other candidates
            dom = next(cells[e["cell_id"]].domain for e in group["comparisons"] + group["eliminated"]
                       if e["cell_id"] in cells)
            out[dom] = Decision(dom, None, 1.0, 1.0, 1.0)
        else:
            out[c.domain] = Decision(c.domain, c.cell_id, c.speedup, c.speedup_lo, c.speedup_hi)
    return out


def measured_s(run_dir: Path) -> float:
    """Seconds spent in counted generations (every mode of every visit)."""
    return float(sum(r.wall_s for r in records.load_run(run_dir).rows("generations")))


def regret(fixed: Path, choice: Decision) -> tuple[float, float | None, float | None]:
    """The tuned choice's regret in the fixed run: ``1 − s(choice)/s(best)``, and the bounds its CIs allow."""
    cells = {c.cell_id: c for c in records.load_run(fixed).rows("cells")}
    best = decisions(fixed)[choice.domain]
    if choice.cell_id is None:
        mine = (1.0, 1.0, 1.0)
    else:
        c = cells[choice.cell_id]
        mine = (c.speedup, c.speedup_lo, c.speedup_hi)
    b = (best.speedup, best.lo, best.hi)
    value = 1.0 - mine[0] / b[0]
    lo = 1.0 - mine[2] / b[1] if mine[2] and b[1] else None
    hi = 1.0 - mine[1] / b[2] if mine[1] and b[2] else None
    return value, lo, hi


def _run(args: list[str], out: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "measure", *args, "--quiet", "--out", str(out)], check=True)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    p = OneLineParser(prog="bench_tune.py", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="directory for the two runs")
    p.add_argument("--budget-share", type=float_arg(0, 1, lo_open=True), default=None,
                   help="give the tuned run a --time-budget of this share of the fixed run's measuring time")
    p.add_argument("--fixed", type=Path, default=None, metavar="DIR",
                   help="a finished fixed-design run of the same arguments (measured earlier on this machine, "
                        "nothing else running) instead of measuring it again; its wall time is then unknown")
    a = p.parse_args(own)
    tuned_dir = a.out / "tuned"
    if a.fixed is not None:
        fixed_dir, wall_fixed = a.fixed, float("nan")
    else:
        fixed_dir = a.out / "fixed"
        wall_fixed = _run([*rest, "--force-new"], fixed_dir)
    extra = ["--time-budget", f"{a.budget_share * measured_s(fixed_dir):.0f}"] if a.budget_share else []
    wall_tuned = _run([*rest, "--force-new", "--until-decided", *extra], tuned_dir)
    fixed_d, tuned_d = decisions(fixed_dir), race_decisions(tuned_dir)
    race = records.load_run(tuned_dir).meta.get("race", {})
    rows = []
    for dom, f in fixed_d.items():
        t = tuned_d.get(dom)
        r = regret(fixed_dir, t) if t is not None else (None, None, None)
        rows.append({"domain": dom, "fixed": f.cell_id or "off", "tuned": (t.cell_id or "off") if t else None,
                     "regret": r[0], "regret_lo": r[1], "regret_hi": r[2]})
    ms_fixed, ms_tuned = measured_s(fixed_dir), measured_s(tuned_dir)
    print(f"{'domain':<14}{'fixed design':<34}{'tuned':<34}regret in the fixed run [bounds]")
    for r in rows:
        bounds = f"[{r['regret_lo']:+.3f}, {r['regret_hi']:+.3f}]" if r["regret_lo"] is not None else ""
        print(f"{r['domain']:<14}{r['fixed']:<34}{str(r['tuned']):<34}{r['regret']:+.3f} {bounds}")
    print(f"measuring time (counted generations): fixed {ms_fixed:.1f} s, tuned {ms_tuned:.1f} s "
          f"({ms_tuned / ms_fixed:.2f} of it); wall: fixed {wall_fixed:.1f} s, tuned {wall_tuned:.1f} s; "
          f"the tuned run stopped: {race.get('stopped_by')}")
    print(json.dumps({"rows": rows, "measured_s": {"fixed": ms_fixed, "tuned": ms_tuned},
                      "wall_s": {"fixed": wall_fixed, "tuned": wall_tuned}, "stopped_by": race.get("stopped_by"),
                      "decisions": {"fixed": {k: asdict(v) for k, v in fixed_d.items()},
                                    "tuned": {k: asdict(v) for k, v in tuned_d.items()}}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
