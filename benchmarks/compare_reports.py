"""Write the same reports with two copies of the code and show their files identical (apart from timestamps).

For each calibration (or run directory holding one) given, ``python -m reports SRC --out OUT/<side>/<name>`` runs
once with the ``--before`` code and once with the ``--after`` code (each a checkout of this repository, put first
on ``PYTHONPATH``; ``python -P`` keeps the working directory off the path, so the two sides run in the same
directory, ``--data``, and name the same input paths). Then every file the two wrote is compared: the same
names, and the same bytes once ISO timestamps (``2026-11-27T13:00:00Z``) are masked in text files (HTML, JSON,
CSV, SVG). Prints one line per source and a summary, and ends with one JSON line; exit status 0 when every
file matches, 1 when one differs, 2 on bad input.

    python benchmarks/compare_reports.py --before /work/main --after . --out /tmp/pageone
    python benchmarks/compare_reports.py --before /work/main --after . --out /tmp/pageone --png \\
        results/cpu-serve-sweep/calibration-serve
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The committed calibrations (and runs holding one) whose reports are compared when no SRC is given.
SOURCES = ("results/cpu-smollm2-ngram-gammas-calibration", "results/cpu-smollm2-llamacpp-gammas-calibration",
           "results/cpu-smollm2-llamacpp-ngram2-calibration", "results/cpu-busy-one-prompt/calibration",
           "results/cpu-trees-smollm2-llamacpp-ngram3/calibration", "results/cpu-trees-smollm2-int8/calibration",
           "results/cpu-serve-sweep/calibration-serve")
TIMESTAMP = re.compile(rb"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:?\d{2})?")
TEXT_SUFFIXES = (".html", ".json", ".csv", ".svg", ".txt")


@dataclass(frozen=True)
class Comparison:
    """One source's reports, written by both sides: which files match and which do not."""

    source: str
    files: int
    identical_bytes: int
    identical_masked: int
    differing: tuple[str, ...]
    only_before: tuple[str, ...]
    only_after: tuple[str, ...]
    rc_before: int
    rc_after: int

    @property
    def same(self) -> bool:
        return (not self.differing and not self.only_before and not self.only_after
                and self.rc_before == self.rc_after)


def _name(src: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", src.strip("/")).removeprefix("results_") or "src"


def run_reports(code: Path, src: str, out: Path, data: Path, png: bool) -> int:
    """``python -P -m reports SRC --out OUT`` with ``code`` first on the path, in ``data``; its exit status."""
    cmd = [sys.executable, "-P", "-m", "reports", src, "--out", str(out), *([] if png else ["--no-png"])]
    env = {"PYTHONPATH": str(code), "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    proc = subprocess.run(cmd, cwd=data, env=env, capture_output=True, text=True)
    (out.parent / f"{out.name}.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    return proc.returncode


def code_root(code: Path, data: Path) -> str:
    """Where ``import reports`` lands with ``code`` first on the path (the side really runs that copy)."""
    proc = subprocess.run([sys.executable, "-P", "-c", "import reports; print(reports.__file__)"], cwd=data,
                          env={"PYTHONPATH": str(code), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                          check=True)
    return str(Path(proc.stdout.strip()).parents[1])


def _masked(path: Path) -> bytes:
    raw = path.read_bytes()
    return TIMESTAMP.sub(b"<timestamp>", raw) if path.suffix.lower() in TEXT_SUFFIXES else raw


def compare_dirs(source: str, before: Path, after: Path, rcs: tuple[int, int]) -> Comparison:
    """Every file under ``before`` against the same name under ``after``."""
    a = {p.relative_to(before).as_posix() for p in before.rglob("*") if p.is_file()}
    b = {p.relative_to(after).as_posix() for p in after.rglob("*") if p.is_file()}
    both = sorted(a & b)
    raw = [f for f in both if (before / f).read_bytes() == (after / f).read_bytes()]
    masked = [f for f in both if _masked(before / f) == _masked(after / f)]
    return Comparison(source, len(both), len(raw), len(masked), tuple(f for f in both if f not in masked),
                      tuple(sorted(a - b)), tuple(sorted(b - a)), *rcs)


def diff_lines(before: Path, after: Path, limit: int = 8) -> list[str]:
    """The first ``limit`` changed lines of two text files (split at each tag, timestamps masked), as a diff."""
    a, b = (_masked(p).replace(b"><", b">\n<").decode("utf-8", "replace").splitlines() for p in (before, after))
    out = [line[:160] for line in difflib.unified_diff(a, b, "before", "after", n=0, lineterm="")
           if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    return out[:limit]


def compare(before: Path, after: Path, sources: list[str], out: Path, data: Path, png: bool) -> list[Comparison]:
    """Write each source's report with both sides into ``out/before`` and ``out/after`` and compare them."""
    results = []
    for src in sources:
        name = _name(src)
        dirs = (out / "before" / name, out / "after" / name)
        rcs = (run_reports(before, src, dirs[0], data, png), run_reports(after, src, dirs[1], data, png))
        results.append(compare_dirs(src, *dirs, rcs))
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sources", nargs="*", metavar="SRC", help=f"calibrations to report (default: {len(SOURCES)} "
                   "committed ones)")
    p.add_argument("--before", required=True, help="the code writing the reference reports (a checkout)")
    p.add_argument("--after", required=True, help="the code under test (a checkout)")
    p.add_argument("--out", required=True, help="where the reports go (OUT/before, OUT/after); must not exist")
    p.add_argument("--data", default=str(ROOT), help="the directory both run in (relative SRC and the run paths "
                   "calibrations name resolve there; default: this checkout)")
    p.add_argument("--png", action="store_true", help="write and compare the PNGs too")
    p.add_argument("--diff", action="store_true", help="print the first changed lines of each differing text file")
    args = p.parse_args(argv)
    before, after, data, out = Path(args.before), Path(args.after), Path(args.data), Path(args.out)
    for flag, d in (("--before", before), ("--after", after)):
        if not (d / "reports" / "__main__.py").is_file():
            p.error(f"{flag} {str(d)!r} holds no reports/__main__.py (a checkout of this repository expected)")
    if not data.is_dir():
        p.error(f"--data {str(data)!r} is not a directory")
    if out.exists():
        p.error(f"--out {str(out)!r} exists; give a new directory")
    roots = (code_root(before.resolve(), data), code_root(after.resolve(), data))
    print(f"before: {roots[0]}\nafter:  {roots[1]}\nin:     {data.resolve()}")
    results = compare(before.resolve(), after.resolve(), args.sources or list(SOURCES), out, data, args.png)
    for r in results:
        verdict = "identical" if r.same else "DIFFERENT"
        print(f"{r.source}: {verdict}: {r.identical_masked}/{r.files} files the same ({r.identical_bytes} byte for "
              f"byte), exit {r.rc_before}/{r.rc_after}" + "".join(f"; differs: {f}" for f in r.differing)
              + "".join(f"; only before: {f}" for f in r.only_before)
              + "".join(f"; only after: {f}" for f in r.only_after))
        for f in r.differing if args.diff else ():
            if Path(f).suffix.lower() in TEXT_SUFFIXES:
                name = _name(r.source)
                print("\n".join(f"    {f}: {line}" for line in diff_lines(out / "before" / name / f,
                                                                         out / "after" / name / f)))
    same = sum(r.same for r in results)
    print(f"{same} of {len(results)} sources give identical reports ({sum(r.files for r in results)} files)")
    print(json.dumps({"before": roots[0], "after": roots[1], "identical_sources": same, "sources": len(results),
                      "results": [asdict(r) for r in results]}))
    return 0 if same == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
