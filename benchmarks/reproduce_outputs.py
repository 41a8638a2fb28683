"""Re-run every committed calibration into one folder, and compare two such folders file by file.

The proof that a refactor of ``calibrate`` changes no output (issue 40): run the
committed calibrations again with one version of the code, then with another,
and compare the two trees. Each calibration is re-made from its committed run
with the flags it was made with (all defaults: ``results/2026-11-27-refit-calibrations.md``,
``results/2026-11-27-busy-one-prompt-run.md``), into ``OUT/<its committed folder>``::

    PYTHONPATH=/work/main python benchmarks/reproduce_outputs.py run /tmp/cal-main   # main's code
    PYTHONPATH=$PWD python benchmarks/reproduce_outputs.py run /tmp/cal-branch       # this tree's code
    python benchmarks/reproduce_outputs.py compare /tmp/cal-main /tmp/cal-branch

``run`` calls ``python -P -m calibrate`` as a subprocess (the environment's ``PYTHONPATH`` picks the code;
``-P`` keeps the working directory off the path) from this repository's root, on the committed run
directories (one copied under the name it was calibrated by: :data:`RUN_NAMES`); each command's output goes to
``OUT/_logs/``. ``compare`` lists every file of either tree: identical bytes; identical apart from
timestamps (``created_utc``); differing only in the fields that name a calibration's runs (``runs.<label>.path``,
``run``: :data:`PATH_FIELDS`, reported apart with both values); or differing (the first difference named). It
exits 1 when any file differs otherwise or is in one tree only, else 0. ``--only NAME`` runs some of them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]
#: Every committed calibration: its folder under results/, and the calibrate arguments that made it (the output
#: folder is given as --out).
CALIBRATIONS: dict[str, tuple[str, ...]] = {
    "cpu-smollm2-ngram-gammas-calibration": ("results/cpu-smollm2-ngram-gammas",),
    "cpu-smollm2-llamacpp-gammas-calibration": ("results/cpu-smollm2-llamacpp-gammas",),
    "cpu-smollm2-llamacpp-ngram2-calibration": ("results/cpu-smollm2-llamacpp-ngram2",),
    "cpu-busy-one-prompt/calibration": ("results/cpu-busy-one-prompt/run",),
    "cpu-trees-smollm2-int8/calibration": ("trees", "results/cpu-trees-smollm2-int8"),
    "cpu-trees-smollm2-llamacpp-ngram3/calibration": ("trees", "results/cpu-trees-smollm2-llamacpp-ngram3"),
    "cpu-serve-sweep/calibration-serve": ("serve", "results/cpu-serve-sweep"),
}
#: Runs calibrated under another directory name (a chain calibration labels a run by its directory's name): the
#: run is copied to ``OUT/_logs/<name>`` first.
RUN_NAMES = {"cpu-busy-one-prompt/calibration": "busyrun"}  # calibrated as /tmp/busyrun (its note)
#: Keys whose values are timestamps: ignored by compare.
TIMESTAMP_KEYS = frozenset({"created_utc"})
#: Where a calibration names its runs, as (key, ...) paths in its JSON ("*": any key): reported apart.
PATH_FIELDS = (("runs", "*", "path"), ("run",))
LOGS = "_logs"


def run_all(out: Path, only: list[str]) -> int:
    """Each calibration of :data:`CALIBRATIONS` (or of ``only``) re-made into ``out``; 1 if any command failed."""
    status = 0
    (out / LOGS).mkdir(parents=True, exist_ok=True)
    for name, args in CALIBRATIONS.items():
        if only and name not in only:
            continue
        dest = out / name
        if name in RUN_NAMES:
            run = out / LOGS / RUN_NAMES[name]
            shutil.rmtree(run, ignore_errors=True)
            shutil.copytree(ROOT / args[-1], run)
            args = (*args[:-1], str(run))
        cmd = [sys.executable, "-P", "-m", "calibrate", *args, "--out", str(dest)]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        log = out / LOGS / (name.replace("/", "__") + ".txt")
        log.write_text(f"$ {' '.join(cmd)}\n{done.stdout}\n--- stderr\n{done.stderr}", encoding="utf-8")
        print(f"{name}: exit {done.returncode} in {time.perf_counter() - t0:.0f} s ({log})")
        status |= done.returncode != 0
    return int(status)


def _matches(path: tuple[str, ...], pattern: tuple[str, ...]) -> bool:
    return len(path) == len(pattern) and all(p == "*" or p == k for k, p in zip(path, pattern))


def json_diffs(a: Any, b: Any, at: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any, Any]]:
    """Every ``(key path, value in a, value in b)`` where ``a`` and ``b`` differ (timestamps skipped)."""
    if at and at[-1] in TIMESTAMP_KEYS:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            yield at + ("<keys>",), list(a), list(b)
        for k in a:
            if k in b:
                yield from json_diffs(a[k], b[k], at + (str(k),))
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from json_diffs(x, y, at + (str(i),))
    elif a != b or type(a) is not type(b):
        yield at, a, b


def compare_file(a: Path, b: Path) -> tuple[str, list[str]]:
    """``identical``, ``timestamps`` (only those differ), ``paths`` (only timestamps and :data:`PATH_FIELDS`) or
    ``differs``, and the lines that say what differs."""
    ba, bb = a.read_bytes(), b.read_bytes()
    if ba == bb:
        return "identical", []
    if a.suffix == ".json":
        try:
            diffs = list(json_diffs(json.loads(ba), json.loads(bb)))
        except ValueError as exc:
            return "differs", [f"not JSON: {exc}"]
        paths = [d for d in diffs if any(_matches(d[0], p) for p in PATH_FIELDS)]
        other = [d for d in diffs if d not in paths]
        lines = [f"{'.'.join(k)}: {x!r} -> {y!r}" for k, x, y in other[:5] + paths]
        if other:
            return "differs", lines
        return ("paths" if paths else "timestamps"), lines
    la, lb = ba.decode("utf-8", "replace").splitlines(), bb.decode("utf-8", "replace").splitlines()
    first = next((i for i, (x, y) in enumerate(zip(la, lb)) if x != y), min(len(la), len(lb)))
    return "differs", [f"line {first + 1}: {la[first:first + 1]} -> {lb[first:first + 1]} ({len(la)} vs {len(lb)} "
                       "lines)"]


def compare_trees(a: Path, b: Path) -> int:
    """Print every file's verdict and a count per verdict; 1 when a file differs or is in one tree only."""
    files = sorted({p.relative_to(root) for root in (a, b) for p in root.rglob("*")
                    if p.is_file() and p.relative_to(root).parts[0] != LOGS})
    counts: dict[str, int] = {}
    for rel in files:
        if not (a / rel).is_file() or not (b / rel).is_file():
            verdict, lines = "only in one", [f"only in {a if (a / rel).is_file() else b}"]
        else:
            verdict, lines = compare_file(a / rel, b / rel)
        counts[verdict] = counts.get(verdict, 0) + 1
        print(f"{verdict:11s} {rel}")
        for line in lines:
            print(f"    {line}")
    print(f"{len(files)} files: " + ", ".join(f"{n} {v}" for v, n in sorted(counts.items())))
    return int(bool(counts.get("differs") or counts.get("only in one")))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="re-make every committed calibration into OUT")
    r.add_argument("out", type=Path)
    r.add_argument("--only", action="append", default=[], choices=list(CALIBRATIONS), metavar="NAME")
    c = sub.add_parser("compare", help="compare two trees written by run")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = p.parse_args(argv)
    if args.cmd == "run":
        return run_all(args.out, args.only)
    return compare_trees(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
