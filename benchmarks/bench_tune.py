"""The fixed design against the tuned one on the same question, side by side in one session.

Runs ``python -m measure ARGS --out DIR/fixed`` (every cell, every repeat), then ``python -m measure ARGS
--until-decided [--time-budget S] --out DIR/tuned`` (a race per domain, measure/racing.py), one after the other on
the same machine, and prints per domain the decision of each (the best draft/γ, or plain decoding), the measuring
time of each (the sum of the counted generations' wall time, and the whole command's), and the regret of the
tuned decision in the fixed design's own measurement: ``1 − speedup(tuned choice) ÷ speedup(fixed best)``, with
the interval the two cells' 95% CIs allow. The tuned run's decision is its race's leader at the last look; its
``--time-budget`` (``--budget-share``) is that share of the fixed run's measuring time. ``--fixed DIR`` reuses a
finished fixed run. A table for people, then one JSON line.

``--serve`` asks the serving question the same way: ``python -m measure serve ARGS`` fixed, then with
``--until-decided`` (a race per load, measure/serve/race.py); per load the best k or off, the measuring time as
the sum of the units' measured seconds (and the wall time), the regret from the paired speedups' CIs.

    python benchmarks/bench_tune.py --out runs/bench-tune -- --prompts 2 --gamma 2,4 --repeats 3
    python benchmarks/bench_tune.py --budget-share 0.33 --out runs/bench-tune -- --gamma 1,2,4,8 --repeats 6
    python benchmarks/bench_tune.py --serve --out runs/bench-tune-serve -- --draft ngram:2 --gamma 2,4,8 \
        --concurrency 1,4,8 --requests 8 --max-new-tokens 32 --repeats 8

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
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from measure import records  # noqa: E402
from measure.rows import CellRow, GenerationRow  # noqa: E402
from toolkit.cli import OneLineParser, float_arg  # noqa: E402


#: (speedup, CI low, CI high) of a candidate over plain decoding; plain decoding itself is (1, 1, 1).
Interval = tuple[float, float | None, float | None]
OFF: Interval = (1.0, 1.0, 1.0)


@dataclass(frozen=True)
class Question:
    """What both runs answer and how to read a run of it: the group a decision is made for (a domain, a load),
    the command, every candidate's speedup per group and the measuring time."""

    group: str
    command: tuple[str, ...]
    speedups: Callable[[Path], dict[str, dict[str, Interval]]]
    measured_s: Callable[[Path], float]
    measured_what: str


def _chain_speedups(run_dir: Path) -> dict[str, dict[str, Interval]]:
    out: dict[str, dict[str, Interval]] = {}
    for c in records.load_run(run_dir).rows(CellRow):
        if c.speedup is not None:
            out.setdefault(c.domain, {})[c.cell_id] = (c.speedup, c.speedup_lo, c.speedup_hi)
    return out


def _serve_speedups(run_dir: Path) -> dict[str, dict[str, Interval]]:
    from measure.serve.units import summarise

    out: dict[str, dict[str, Interval]] = {}
    for g in summarise(records.load_run(run_dir).table("serve_units")):
        sp = g.throughput_speedup
        if sp is not None and sp.value is not None:
            out.setdefault(g.load, {})[g.config] = (sp.value, sp.lo, sp.hi)
    return out


CHAIN = Question("domain", ("measure",), _chain_speedups,
                 lambda d: float(sum(r.wall_s for r in records.load_run(d).rows(GenerationRow))),
                 "counted generations")
SERVE = Question("load", ("measure", "serve"), _serve_speedups,
                 lambda d: float(records.load_run(d).table("serve_units")["duration_s"].sum()),
                 "the units' measured seconds")


@dataclass(frozen=True)
class Decision:
    """One group's answer in one run: the chosen candidate (None = plain decoding, off) and its speedup with its
    CI."""

    group: str
    choice: str | None
    speedup: float
    lo: float | None
    hi: float | None


def decisions(speedups: dict[str, dict[str, Interval]]) -> dict[str, Decision]:
    """Per group, the candidate with the highest measured speedup, or plain decoding when none beats 1."""
    out = {}
    for group, cands in speedups.items():
        name, (s, lo, hi) = max(cands.items(), key=lambda kv: kv[1][0])
        out[group] = Decision(group, name, s, lo, hi) if s > 1.0 else Decision(group, None, *OFF)
    return out


def race_decisions(q: Question, run_dir: Path) -> dict[str, Decision]:
    """Per group, the tuned run's answer: the leader at the race's last look (``run.json`` ``race``), which is
    what the race decided or, stopped by its budget, would choose — not the best of its candidates' raw
    speedups, which for a candidate stopped early rest on a few units. A race group is its load (serving), or the
    domain of its cells (the chain sweep's ``domain T=… K=…``)."""
    speedups = q.speedups(run_dir)
    looks = records.load_run(run_dir).meta.get("race", {}).get("looks") or []
    out: dict[str, Decision] = {}
    for key, g in (looks[-1]["groups"].items() if looks else ()):
        names = {g["leader"], *(e["cell_id"] for e in g["comparisons"] + g["eliminated"])} - {"off"}
        group = key if key in speedups else next((k for k, c in speedups.items() if names & set(c)), None)
        if group is None:
            continue
        leader = None if g["leader"] == "off" else speedups[group].get(g["leader"])  # off: plain decoding
        out[group] = Decision(group, None, *OFF) if leader is None else Decision(group, g["leader"], *leader)
    return out


def regret(fixed: dict[str, dict[str, Interval]], choice: Decision) -> tuple[float, float | None, float | None]:
    """The tuned choice's regret in the fixed run: ``1 − s(choice)/s(best)``, and the bounds its CIs allow."""
    best = decisions(fixed)[choice.group]
    mine = OFF if choice.choice is None else fixed[choice.group][choice.choice]
    b = (best.speedup, best.lo, best.hi)
    value = 1.0 - mine[0] / b[0]
    lo = 1.0 - mine[2] / b[1] if mine[2] and b[1] else None
    hi = 1.0 - mine[1] / b[2] if mine[1] and b[2] else None
    return value, lo, hi


def _run(q: Question, args: list[str], out: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", *q.command, *args, "--quiet", "--out", str(out)], check=True)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    p = OneLineParser(prog="bench_tune.py", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="directory for the two runs")
    p.add_argument("--serve", action="store_true", help="the serving question: best k per load, python -m measure "
                   "serve ARGS (its arguments after --)")
    p.add_argument("--budget-share", type=float_arg(0, 1, lo_open=True), default=None,
                   help="give the tuned run a --time-budget of this share of the fixed run's measuring time")
    p.add_argument("--fixed", type=Path, default=None, metavar="DIR",
                   help="a finished fixed-design run of the same arguments (measured earlier on this machine, "
                        "nothing else running) instead of measuring it again; its wall time is then unknown")
    a = p.parse_args(own)
    q = SERVE if a.serve else CHAIN
    tuned_dir = a.out / "tuned"
    if a.fixed is not None:
        fixed_dir, wall_fixed = a.fixed, float("nan")
    else:
        fixed_dir = a.out / "fixed"
        wall_fixed = _run(q, [*rest, "--force-new"], fixed_dir)
    extra = ["--time-budget", f"{a.budget_share * q.measured_s(fixed_dir):.0f}"] if a.budget_share else []
    wall_tuned = _run(q, [*rest, "--force-new", "--until-decided", *extra], tuned_dir)
    fixed_s = q.speedups(fixed_dir)
    fixed_d, tuned_d = decisions(fixed_s), race_decisions(q, tuned_dir)
    race = records.load_run(tuned_dir).meta.get("race", {})
    rows = []
    for group, f in fixed_d.items():
        t = tuned_d.get(group)
        reg = regret(fixed_s, t) if t is not None else (None, None, None)
        rows.append({q.group: group, "fixed": f.choice or "off", "tuned": (t.choice or "off") if t else None,
                     "regret": reg[0], "regret_lo": reg[1], "regret_hi": reg[2]})
    ms_fixed, ms_tuned = q.measured_s(fixed_dir), q.measured_s(tuned_dir)
    print(f"{q.group:<14}{'fixed design':<34}{'tuned':<34}regret in the fixed run [bounds]")
    for r in rows:
        bounds = f"[{r['regret_lo']:+.3f}, {r['regret_hi']:+.3f}]" if r["regret_lo"] is not None else ""
        value = f"{r['regret']:+.3f}" if r["regret"] is not None else "-"
        print(f"{r[q.group]:<14}{r['fixed']:<34}{str(r['tuned']):<34}{value} {bounds}")
    print(f"measuring time ({q.measured_what}): fixed {ms_fixed:.1f} s, tuned {ms_tuned:.1f} s "
          f"({ms_tuned / ms_fixed:.2f} of it); wall: fixed {wall_fixed:.1f} s, tuned {wall_tuned:.1f} s "
          f"({wall_tuned / wall_fixed:.2f}); the tuned run stopped: {race.get('stopped_by')}")
    print(json.dumps({"question": q.group, "rows": rows, "measured_s": {"fixed": ms_fixed, "tuned": ms_tuned},
                      "wall_s": {"fixed": wall_fixed, "tuned": wall_tuned}, "stopped_by": race.get("stopped_by"),
                      "decided": race.get("decided"),
                      "decisions": {"fixed": {k: asdict(v) for k, v in fixed_d.items()},
                                    "tuned": {k: asdict(v) for k, v in tuned_d.items()}}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
