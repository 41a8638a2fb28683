"""llama-cpp-python's own plain decoding and prompt lookup, run outside specscope, held against a sweep's speedups.

    flock -x /tmp/specscope-cpu.lock python benchmarks/llamacpp_outside.py RUN_DIR [--repeats 3]

The measurement path uses llama-cpp-python only, as its users call it: one
``Llama(model_path=..., n_ctx=..., n_threads=..., n_threads_batch=...)``
(the library's defaults otherwise) for plain decoding, one with
``draft_model=LlamaPromptLookupDecoding(max_ngram_size=N, num_pred_tokens=γ)``,
``Llama.generate`` greedy; no specscope code, no torch in the process. From
the llama.cpp sweep in ``RUN_DIR`` (``python -m measure --engine llamacpp
--draft ngram:N:first ...``) it takes the model file, the prompts' token ids,
the number of new tokens, the context size and the thread count, and for
each (domain, γ) of the sweep's ``ngram:N:first`` cells it times plain and
prompt-lookup generations of the same prompts, interleaved (plain, lookup at
every γ; the order rotating each repeat), after one warm-up each. The speedup
uses the sweep's estimator (mean tokens/s of the method ÷ the baseline's over
(prompt, repeat) pairs, Fieller's 95% CI; ``measure.stats``, arithmetic only).

Prints a table — per cell the sweep's speedup of our loop and of its peer
(llama-cpp-python's lookup in the sweep's reference process, a fresh process
of its own) beside this outside speedup,
each with its CI, and whether our CI overlaps the outside one — then one
JSON line.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402

from measure.costpoints import context_bound  # noqa: E402
from measure.stats import Estimate, mean_ci, overlaps, speedup_ci  # noqa: E402 (arithmetic, no measurement)


def generate(llm: object, prompt: list[int], n: int, eos: set[int]) -> tuple[int, float]:
    """Greedy ``Llama.generate`` of ``n`` tokens (from a fresh cache) → (tokens, wall seconds from the call)."""
    llm.reset()
    out = 0
    t0 = time.perf_counter()
    for tok in llm.generate(prompt, temp=0.0, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, repeat_penalty=1.0,
                            reset=True):
        out += 1
        if out >= n or tok in eos:
            break
    return out, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=None, help="write the JSON result here too")
    a = p.parse_args(argv)
    meta = json.loads((a.run_dir / "run.json").read_text())
    cfg = meta["config"]
    cells = pd.read_csv(a.run_dir / "cells.csv")
    cells = cells[cells["draft"].str.match(r"^ngram:\d+:first$")]
    if cells.empty:
        print(f"{a.run_dir}: no ngram:N:first cells (the rule llama-cpp-python's prompt lookup has)", file=sys.stderr)
        return 2
    model = meta["models"]["target"]["source"].removeprefix("gguf:")
    threads = int(meta["versions"]["engine_llamacpp_threads"])
    shape = SimpleNamespace(gamma_max=int(max(cells["gamma"])), **{k: cfg.get(k) for k in (
        "max_new_tokens", "max_prompt_tokens", "cost_contexts", "cost_max_tokens")})
    n_ctx = max(cfg["max_prompt_tokens"] + cfg["max_new_tokens"] + max(cells["gamma"]),
                context_bound(shape)) + 1  # the run's engine cache (measure.sweep.engine_options)
    n_new = int(cfg["max_new_tokens"])
    prompts = {pid: (m["domain"], [int(t) for t in m["tokens"].split()]) for pid, m in meta["prompts"].items()}

    import llama_cpp
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    # what a user writes (the sweep's reference process too): the library's defaults beyond these
    kw = dict(model_path=model, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False)
    plain = Llama(**kw)
    lookup = Llama(**kw, draft_model=LlamaPromptLookupDecoding())
    eos = {i for i in range(plain.n_vocab()) if llama_cpp.llama_vocab_is_eog(plain._model.vocab, i)}
    ngram = int(cells["draft"].iloc[0].split(":")[1])
    gammas = sorted({int(g) for g in cells["gamma"]})
    modes = ["plain"] + [f"lookup:{g}" for g in gammas]

    def run(mode: str, prompt: list[int]) -> float:
        if mode == "plain":
            n, s = generate(plain, prompt, n_new, eos)
        else:
            lookup.draft_model = LlamaPromptLookupDecoding(max_ngram_size=ngram, num_pred_tokens=int(mode[7:]))
            n, s = generate(lookup, prompt, n_new, eos)
        return n / s

    first = next(iter(prompts.values()))[1]
    for mode in modes:  # warm-up, not counted
        run(mode, first)
    tps: dict[tuple[str, str, int], float] = {}
    for rep in range(a.repeats):
        for i, (pid, (_dom, ids)) in enumerate(prompts.items()):
            k = (rep + i) % len(modes)
            for mode in modes[k:] + modes[:k]:
                tps[(mode, pid, rep)] = run(mode, ids)
    rows = []
    for c in cells.itertuples():
        pids = [pid for pid, (dom, _) in prompts.items() if dom == c.domain]
        keys = [(pid, r) for r in range(a.repeats) for pid in pids]
        out = speedup_ci([tps[("plain", *k)] for k in keys], [tps[(f"lookup:{c.gamma}", *k)] for k in keys])
        ours = Estimate(c.speedup, c.speedup_lo, c.speedup_hi)
        peer = Estimate(c.speedup_peer, c.speedup_peer_lo, c.speedup_peer_hi)
        rows.append({"cell_id": c.cell_id, "domain": c.domain, "gamma": int(c.gamma), "ours": ours, "peer": peer,
                     "outside": out, "overlap": overlaps(ours, out),
                     "plain_tps": mean_ci([tps[("plain", *k)] for k in keys]),
                     "base_vs_outside": c.tokens_per_s_baseline / mean_ci([tps[("plain", *k)] for k in keys]).value})
    print(f"{'domain':<13}{'γ':>3}  {'ours (sweep)':<22}{'peer (sweep)':<22}{'outside':<22}{'overlap':<9}"
          "sweep base ÷ outside plain (tok/s, not paired)")
    for r in rows:
        print(f"{r['domain']:<13}{r['gamma']:>3}  {r['ours'].as_text(3):<22}{r['peer'].as_text(3):<22}"
              f"{r['outside'].as_text(3):<22}{str(r['overlap']):<9}{r['base_vs_outside']:.3f}")
    n_ok = sum(bool(r["overlap"]) for r in rows)
    print(f"our speedup's CI overlaps the outside one in {n_ok} of {len(rows)} cells")
    res = {"run_dir": str(a.run_dir), "repeats": a.repeats, "threads": threads, "n_ctx": n_ctx,
           "max_new_tokens": n_new, "ngram": ngram, "machine": platform.processor() or platform.machine(),
           "cells": [{**{k: v for k, v in r.items() if not isinstance(v, Estimate)},
                      **{f"{k}{s}": getattr(r[k], f) for k in ("ours", "peer", "outside", "plain_tps")
                         for s, f in (("", "value"), ("_lo", "lo"), ("_hi", "hi"))}} for r in rows],
           "overlap": f"{n_ok}/{len(rows)}"}
    line = json.dumps(res)
    if a.out:
        a.out.write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
