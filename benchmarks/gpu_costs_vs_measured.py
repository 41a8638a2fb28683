"""Measured GPU step times beside the cost model's two GPU sources: the roofline and the kernel tables.

Reads a ``roofline.csv`` written by ``benchmarks/gpu_check.py`` (one row per run, role, model preset, batch,
tokens and context: the measured median, p10, p90 and the roofline prediction at the run's dtype) and prices
every shape again with the ``kernels`` source of :mod:`sim.stepcost` (aiconfigurator-core's measured kernel
tables for a serving engine, bf16) on the same GPU. A model the tables cannot price (GPT-2: an architecture
aiconfigurator does not model; SmolLM2-135M: no attention table for its head layout) gets no kernel column and
the reason. Reads files only, no GPU::

    python benchmarks/gpu_costs_vs_measured.py results/gpu-h100-2026-11-27/call3/roofline.csv \
        --csv results/gpu-h100-2026-11-27/kernels-vs-measured.csv

Prints a table for people (one line per model, role: ratio median and range over its shapes), then one JSON
line for machines. The measured runs are eager Hugging Face transformers (float32 in the gpu-check runs); the
tables time a serving engine's bf16 kernels, so measured ÷ kernels folds together eager launch overhead and
the dtype (a float32 weight is twice the bytes of a bf16 one).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from presets.hardware import HARDWARE  # noqa: E402
from sim import kernels  # noqa: E402
from sim.modelref import resolve_model  # noqa: E402
from sim.stepcost import GpuSetup, target_side  # noqa: E402
from toolkit.cli import choice_arg, check_output_file, entry_point, fail  # noqa: E402
from toolkit.files import read_text, write_dict_rows  # noqa: E402

PROG = "gpu_costs_vs_measured.py"
NEEDED = ("run", "role", "model_preset", "batch", "n_tokens", "context_tokens", "dtype", "ms_median", "ms_p10",
          "ms_p90", "hardware_preset", "roofline_ms")


def read_rows(path: str) -> list[dict]:
    """The rows of a gpu-check ``roofline.csv``; a missing column is one ``ValueError`` line."""
    rows = list(csv.DictReader(io.StringIO(read_text(path, "roofline CSV"))))
    if not rows:
        raise ValueError(f"roofline CSV {path}: no rows")
    missing = [c for c in NEEDED if c not in rows[0]]
    if missing:
        raise ValueError(f"roofline CSV {path}: missing column(s) {', '.join(missing)}; valid: the roofline.csv "
                         "of benchmarks/gpu_check.py")
    return rows


def kernel_pricers(presets: list[str], hardware: str, engine: str) -> dict[str, tuple[object | None, str]]:
    """Per model preset: its kernel-table forward (or ``None``) and the source line or the reason it has none."""
    setup = GpuSetup(HARDWARE[hardware], engine=engine)
    out: dict[str, tuple[object | None, str]] = {}
    for name in presets:
        try:
            fwd, side = target_side(resolve_model(name), setup, "kernels")
            out[name] = (fwd, side.why)
        except ValueError as exc:
            why = str(exc).removeprefix("--cost-source kernels: ").split("; valid:")[0]
            out[name] = (None, why.split(": tried")[0].replace("perf database error: ", ""))
    return out


def compare(rows: list[dict], engine: str) -> list[dict]:
    """One output row per measured shape: measured, roofline and kernel-table ms and the two ratios."""
    hardware = {r["hardware_preset"] for r in rows}
    if len(hardware) != 1 or next(iter(hardware)) not in HARDWARE:
        raise ValueError(f"hardware_preset {sorted(hardware)}: expected one of {', '.join(HARDWARE)}")
    hw = next(iter(hardware))
    pricers = kernel_pricers(sorted({r["model_preset"] for r in rows}), hw, engine)
    out = []
    for r in rows:
        fwd, why = pricers[r["model_preset"]]
        measured = float(r["ms_median"])
        kern = (fwd.forward_ms(int(r["n_tokens"]), float(r["context_tokens"]), int(r["batch"]))  # type: ignore[attr-defined]
                if fwd is not None else None)
        out.append({"run": r["run"], "role": r["role"], "model_preset": r["model_preset"], "batch": int(r["batch"]),
                    "n_tokens": int(r["n_tokens"]), "context_tokens": int(float(r["context_tokens"])),
                    "measured_dtype": r["dtype"], "ms_median": measured, "ms_p10": float(r["ms_p10"]),
                    "ms_p90": float(r["ms_p90"]), "hardware_preset": hw,
                    "roofline_ms": float(r["roofline_ms"]), "measured_over_roofline": measured / float(r["roofline_ms"]),
                    "kernels_engine": engine if fwd is not None else "", "kernels_dtype": "bf16" if fwd else "",
                    "kernels_ms": kern, "measured_over_kernels": measured / kern if kern else None,
                    "kernels_source": why})
    return out


def summary(out: list[dict]) -> list[dict]:
    """Per (model preset, role): shapes, and the median, min and max of both ratios over them."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in out:
        groups.setdefault((r["model_preset"], r["role"]), []).append(r)
    res = []
    for (model, role), rs in groups.items():
        item = {"model_preset": model, "role": role, "shapes": len(rs), "kernels_source": rs[0]["kernels_source"]}
        for key in ("measured_over_roofline", "measured_over_kernels"):
            vals = [r[key] for r in rs if r[key] is not None]
            item[key] = ({"median": round(statistics.median(vals), 2), "min": round(min(vals), 2),
                          "max": round(max(vals), 2)} if vals else None)
        res.append(item)
    return res


def _fmt(d: dict | None) -> str:
    return f"{d['median']:6.2f} [{d['min']:.2f}-{d['max']:.2f}]" if d else "     - (not priced)"


@entry_point
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("roofline_csv", help="roofline.csv of benchmarks/gpu_check.py")
    ap.add_argument("--engine", type=choice_arg("engine", kernels.ENGINES), default="vllm",
                    help="whose kernel tables (default vllm)")
    ap.add_argument("--csv", help="also write every shape's row to this CSV file")
    args = ap.parse_args(argv)
    if kernels.kernels_unavailable():
        fail(PROG, kernels.kernels_unavailable())
    try:
        out_path = check_output_file("--csv", args.csv) if args.csv else None
        out = compare(read_rows(args.roofline_csv), args.engine)
    except ValueError as exc:
        fail(PROG, exc)
    groups = summary(out)
    print(f"{'model':14} {'role':6} {'shapes':>6}  {'measured/roofline':>22}  {'measured/kernels':>22}  kernels")
    for g in groups:
        print(f"{g['model_preset']:14} {g['role']:6} {g['shapes']:6}  {_fmt(g['measured_over_roofline']):>22}  "
              f"{_fmt(g['measured_over_kernels']):>22}  {g['kernels_source']}")
    if out_path is not None:
        write_dict_rows(out_path, out)
    print(json.dumps({"roofline_csv": args.roofline_csv, "engine": args.engine, "rows": len(out),
                      "csv": str(out_path) if out_path else None, "groups": groups}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
