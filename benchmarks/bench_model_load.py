"""Loading a packaged GGUF model: dequantising the GGUF file against reading the kept float32 copy.

``measure.engines.transformers.models`` dequantises a GGUF file once (transformers' GGUF reader,
tens of seconds on CPU) and keeps the float32 copy in the cache; later loads
read the copy. This times the two side by side in one process, alternating
(GGUF, copy, GGUF, copy, …) so a slow spell of the machine hits both, and
prints the median seconds of each with their min–max and the median of the
per-pair ratios. The copy is made first if the cache has none (not timed).

    python benchmarks/bench_model_load.py --model smollm2-135m --repeats 3 [--out results/x.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from measure.engines.transformers import models as M


def bench(model: str, repeats: int) -> dict:
    """Median/min/max seconds of a GGUF load and of a copy load, and the median per-pair ratio."""
    if model not in M.PACKAGED:
        raise ValueError(f"--model {model!r}: unknown; valid: {', '.join(M.PACKAGED)}")
    path = M.PACKAGED[model]()
    cached = M.dequantised_dir(path)
    M.load_model(model)  # makes the copy when the cache has none
    gguf_s, copy_s = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        M._from_gguf(path)
        gguf_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        if M._from_dequantised(cached) is None:
            raise RuntimeError(f"no readable copy in {cached}")
        copy_s.append(time.perf_counter() - t0)
    ratios = [g / c for g, c in zip(gguf_s, copy_s)]

    def summary(xs: list[float]) -> dict:
        return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "values": xs}

    return {"model": model, "gguf": str(path), "copy": str(cached), "repeats": repeats,
            "gguf_load_s": summary(gguf_s), "copy_load_s": summary(copy_s), "gguf_over_copy": summary(ratios)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m", help=f"one of {', '.join(M.PACKAGED)}")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", help="also write the result as JSON here")
    a = p.parse_args(argv)
    if a.repeats < 1:
        p.error(f"--repeats {a.repeats}: need at least 1")
    try:
        r = bench(a.model, a.repeats)
    except ValueError as e:
        p.error(str(e))
    g, c, q = r["gguf_load_s"], r["copy_load_s"], r["gguf_over_copy"]
    print(f"{a.model}: GGUF {g['median']:.2f} s ({g['min']:.2f}-{g['max']:.2f}), "
          f"kept copy {c['median']:.2f} s ({c['min']:.2f}-{c['max']:.2f}); "
          f"GGUF / copy {q['median']:.1f}x ({q['min']:.1f}-{q['max']:.1f}), {a.repeats} pairs")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
