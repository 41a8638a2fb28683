"""Our llama.cpp decoding against a user's own llama-cpp-python process: the same decode both ways, interleaved.

    python benchmarks/llamacpp_baseline.py [--target smollm2-135m] [--prompts-file FILE] [--rounds 3]
        [--max-new-tokens 64] [--threads T] [--lookup N --gamma 2,4,8] [--out FILE.json]
    python benchmarks/llamacpp_baseline.py --runs RUN_DIR [RUN_DIR ...]   # summarise finished sweeps

Every mode is a greedy generation of the same prompt ids (the user message through the GGUF's chat template,
as the sweep encodes it), until ``--max-new-tokens`` or an end-of-generation id:

* ``ours`` — the sweep's baseline: our loop (:func:`measure.decoding.autoregressive_generate`), whose greedy
  token loop runs in the engine's worker (one message per generation); ``ours-per-token`` — the same loop
  with one message to the worker per token, as before issue 44;
* ``reference`` — the sweep's in-run reference: llama-cpp-python's plain ``Llama.generate`` in the engine's
  reference process (:mod:`measure.engines.llamacpp_native.reference`), started once;
* ``fresh`` — a new Python process per (round, prompt) that imports ``llama_cpp`` only and runs
  ``Llama(model_path=..., n_ctx=..., n_threads=..., verbose=False)`` with the library's defaults otherwise:
  three generations from an empty cache (``fresh`` is their median, as a user who times three runs), then
  one more of the same prompt without emptying the cache (``fresh-cached``: the library reuses the cached
  prompt, so the prompt is *not* processed inside the timed span — what a user who calls ``generate`` again on
  the same prompt times);
* with ``--lookup N``: ``ours-lookup:γ`` (our speculative loop with ``ngram:N:first``) and ``fresh-lookup:γ``
  (``Llama(..., draft_model=LlamaPromptLookupDecoding(max_ngram_size=N, num_pred_tokens=γ))`` in the fresh
  process, from an empty cache).

The three blocks (ours, reference, fresh) run back to back per (round, prompt) in a rotating order, so a
machine that slows down hurts each alike. Per mode: tokens/s with the prompt (new tokens ÷ the wall time from
the call to the last token, the sweep's measure) and the decode rate without it ((new − 1) ÷ (wall − time to
the first token)). Per pair of modes: the median of the paired ratios with their min–max, and the sweep's
estimator (ratio of the means, Fieller's 95% CI); for prompt lookup, each side's speedup over its own plain
decoding. Prints a table, then one JSON line (``--out`` writes it too).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from measure.stats import speedup_ci  # noqa: E402

#: The fresh process: llama_cpp and the standard library only. Reads a JSON job on stdin, prints JSON results.
FRESH = r'''
import json, sys, time
from llama_cpp import Llama
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
job = json.loads(sys.stdin.read())
eos = set(job["eos"])

def run(llm, reset=True):
    if reset:
        llm.reset()
    toks, ttft = [], None
    t0 = time.perf_counter()
    for tok in llm.generate(job["prompt"], temp=0.0):
        toks.append(int(tok))
        if ttft is None:
            ttft = time.perf_counter() - t0
        if len(toks) >= job["n_new"] or tok in eos:
            break
    return {"tokens": toks, "wall_s": time.perf_counter() - t0, "ttft_s": ttft}

out = {}
llm = Llama(model_path=job["path"], n_ctx=job["n_ctx"], n_threads=job["threads"], verbose=False)
plain = [run(llm) for _ in range(3)]
out["fresh"] = sorted(plain, key=lambda r: len(r["tokens"]) / r["wall_s"])[1]
out["fresh-cached"] = run(llm, reset=False)
del llm
if job["gammas"]:
    llm = Llama(model_path=job["path"], n_ctx=job["n_ctx"], n_threads=job["threads"], verbose=False,
                draft_model=LlamaPromptLookupDecoding())
    for g in job["gammas"]:
        llm.draft_model = LlamaPromptLookupDecoding(max_ngram_size=job["ngram"], num_pred_tokens=g)
        out[f"fresh-lookup:{g}"] = run(llm)
print(json.dumps(out))
'''


def record(tokens: Any, wall_s: float, ttft_s: float) -> dict:
    """One generation's numbers: tokens, tokens/s with the prompt, the decode rate without it."""
    n = len(tokens)
    return {"tokens": list(tokens), "n": n, "wall_s": wall_s, "ttft_s": ttft_s, "tps": n / wall_s,
            "decode_tps": (n - 1) / (wall_s - ttft_s) if n > 1 and wall_s > ttft_s else float("nan")}


class PerTokenMessages:
    """Our decoder without its own greedy loop: one message to the worker per token (the baseline before issue 44)."""

    def __init__(self, decoder: Any) -> None:
        self._decoder = decoder

    def greedy_generate(self, input_ids: Any, max_new_tokens: int, eos_token_ids: Any = ()) -> None:
        """None: no token loop of its own (the seam's default), so the caller's loop runs, a message per token."""
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._decoder, name)


class Paths:
    """Our engine (worker and reference process) on one model, and the fresh process's job."""

    def __init__(self, a: argparse.Namespace) -> None:
        from measure.engines.llamacpp import LlamaCppEngine
        from measure.seam import EngineOptions

        self.a = a
        self.n_ctx = a.max_prompt_tokens + a.max_new_tokens + max(a.gamma or [0]) + 1
        self.engine = LlamaCppEngine(EngineOptions(threads=a.threads, max_len_tokens=self.n_ctx, quiet=True))
        self.target = self.engine.load_target(a.target)
        self.decoder = self.target.new_decoder()

    def ours(self, ids: Any) -> dict[str, dict]:
        from measure.decoding import autoregressive_generate, speculative_generate
        from measure.drafts import ngram_draft
        from sim.policies import GammaSpec

        t, n = self.target, self.a.max_new_tokens
        r = autoregressive_generate(self.decoder, ids, 0.0, n, None, t.eos_token_ids)
        out = {"ours": record(r.tokens, r.wall_s, r.ttft_ms / 1e3)}
        r = autoregressive_generate(PerTokenMessages(self.decoder), ids, 0.0, n, None, t.eos_token_ids)
        out["ours-per-token"] = record(r.tokens, r.wall_s, r.ttft_ms / 1e3)
        for g in self.a.gamma or []:
            draft = ngram_draft(f"ngram:{self.a.lookup}:first", t.vocab_size, t.eos_token_ids)
            s = speculative_generate(self.decoder, draft, ids, GammaSpec.parse(f"fixed:{g}").policy(), 0.0, n, None,
                                     t.eos_token_ids)
            out[f"ours-lookup:{g}"] = record(s.tokens, s.wall_s, s.ttft_ms / 1e3)
        return out

    def reference(self, ids: Any) -> dict[str, dict]:
        r = self.engine.library_generate(self.target, ids, 0.0, self.a.max_new_tokens, 0)
        return {"reference": record(r.tokens, r.wall_s, (r.ttft_ms or 0.0) / 1e3)}

    def fresh(self, ids: Any) -> dict[str, dict]:
        job = {"path": str(self.target.path), "n_ctx": self.n_ctx, "threads": self.engine.threads,
               "n_new": self.a.max_new_tokens, "prompt": ids.reshape(-1).tolist(), "eos": list(self.target.eos_token_ids),
               "ngram": self.a.lookup, "gammas": self.a.gamma or []}
        p = subprocess.run([sys.executable, "-c", FRESH], input=json.dumps(job), capture_output=True, text=True,
                           check=True)
        got = json.loads(p.stdout.strip().splitlines()[-1])
        return {k: record(v["tokens"], v["wall_s"], v["ttft_s"]) for k, v in got.items()}


def pair(rows: list[dict], num: str, den: str, key: str) -> dict:
    """``num`` ÷ ``den`` over the (round, prompt) pairs: median and min–max of the paired ratios, ratio of means
    with Fieller's 95% CI."""
    a = [r[num][key] for r in rows]
    b = [r[den][key] for r in rows]
    ratios = [x / y for x, y in zip(a, b)]
    est = speedup_ci(b, a)
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "mean_ratio": est.value,
            "lo": est.lo, "hi": est.hi, "n": len(ratios)}


def measure(a: argparse.Namespace) -> dict:
    from measure.prompts import load_prompts, load_prompts_file

    paths = Paths(a)
    if a.prompts_file:
        prompts = load_prompts_file(a.prompts_file)[0]
    else:
        prompts = [p for d in ("code", "conversation") for p in load_prompts(d, 2, 0)]
    enc = [paths.engine.encode(paths.target, p.message, a.max_prompt_tokens) for p in prompts]
    blocks = [paths.ours, paths.reference, paths.fresh]
    for block in blocks:  # warm-up, not counted
        block(enc[0])
    rows = []
    for rnd in range(a.rounds):
        for pi, ids in enumerate(enc):
            k = (rnd * len(enc) + pi) % len(blocks)
            row: dict[str, Any] = {"round": rnd, "prompt": prompts[pi].prompt_id, "prompt_tokens": int(ids.shape[1])}
            for block in blocks[k:] + blocks[:k]:
                row.update(block(ids))
            rows.append(row)
            print(f"round {rnd} {row['prompt']}: " + ", ".join(f"{m} {v['tps']:.1f}" for m, v in row.items()
                                                               if isinstance(v, dict)), file=sys.stderr)
    paths.engine.close()
    return summarise(a, paths, rows)


def summarise(a: argparse.Namespace, paths: Paths, rows: list[dict]) -> dict:
    modes = [m for m, v in rows[0].items() if isinstance(v, dict)]
    res: dict[str, Any] = {
        "target": a.target, "threads": paths.engine.threads, "n_ctx": paths.n_ctx, "max_new_tokens": a.max_new_tokens,
        "rounds": a.rounds, "prompts": sorted({r["prompt"] for r in rows}),
        "tps": {m: statistics.median(r[m]["tps"] for r in rows) for m in modes},
        "decode_tps": {m: statistics.median(r[m]["decode_tps"] for r in rows) for m in modes},
        "same_tokens_ours_fresh": sum(r["ours"]["tokens"] == r["fresh"]["tokens"] for r in rows),
        "pairs": {f"{n}/{d}": {k: pair(rows, n, d, k) for k in ("tps", "decode_tps")}
                  for n, d in (("ours", "fresh"), ("ours", "reference"), ("ours-per-token", "reference"),
                               ("reference", "fresh"), ("fresh", "fresh-cached"))},
        "rows": [{k: ({kk: vv for kk, vv in v.items() if kk != "tokens"} if isinstance(v, dict) else v)
                  for k, v in r.items()} for r in rows]}
    for g in a.gamma or []:
        res["pairs"][f"lookup:{g}"] = {"ours": pair(rows, f"ours-lookup:{g}", "ours", "tps"),
                                       "fresh": pair(rows, f"fresh-lookup:{g}", "fresh", "tps")}
    return res


def show(res: dict) -> None:
    print(f"{'mode':<18}{'tok/s (with prompt)':>21}{'decode tok/s':>14}   medians over {len(res['rows'])} pairs")
    for m in res["tps"]:
        print(f"{m:<18}{res['tps'][m]:>21.2f}{res['decode_tps'][m]:>14.2f}")
    print(f"\n{'pair':<27}{'measure':<12}{'median [min, max]':<26}ratio of means [95% CI]")
    for name, by in res["pairs"].items():
        for key, p in by.items():
            ci = f"{p['mean_ratio']:.3f} [{p['lo']:.3f}, {p['hi']:.3f}]" if p["lo"] is not None else "-"
            print(f"{name:<27}{key:<12}{p['median']:.3f} [{p['min']:.3f}, {p['max']:.3f}]      {ci}")
    print(f"\nours and fresh emitted the same tokens in {res['same_tokens_ours_fresh']} of {len(res['rows'])} pairs")


def runs_summary(run_dirs: list[Path]) -> dict:
    """Across finished llama.cpp sweeps: each run's ``ours ÷ the reference`` (geometric mean over its cells, with
    its CI) and how many cells' speedups overlap the peer's; the median of the runs' ratios with their min–max."""
    from toolkit.jsonio import read_json

    runs = []
    for d in run_dirs:
        s = read_json(d / "run.json", "run.json").get("summary") or {}
        lib, peer = s.get("baseline_vs_library"), s.get("speedup_vs_peer") or {}
        if not lib:
            raise ValueError(f"{d}: its summary has no baseline_vs_library (not a llama.cpp sweep with the library)")
        runs.append({"run_dir": str(d), "ratio": lib["geomean"], "lo": lib["lo"], "hi": lib["hi"],
                     "cells_outside": [c["cell_id"] for c in lib.get("outside") or []],
                     "peer_overlap": f"{peer.get('n_overlap', 0)}/{peer.get('n_cells', 0)}"})
    ratios = [r["ratio"] for r in runs]
    return {"runs": runs, "median_ratio": statistics.median(ratios), "min_ratio": min(ratios),
            "max_ratio": max(ratios), "within_0.95_1.05": 0.95 <= statistics.median(ratios) <= 1.05}


def show_runs(res: dict) -> None:
    for r in res["runs"]:
        print(f"{r['run_dir']}: ours ÷ llama-cpp-python {r['ratio']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}], "
              f"{len(r['cells_outside'])} cell(s) outside 0.95–1.05; speedup CIs overlap the peer's in "
              f"{r['peer_overlap']} cells")
    print(f"median of {len(res['runs'])} runs {res['median_ratio']:.3f} (min {res['min_ratio']:.3f}, max "
          f"{res['max_ratio']:.3f}): {'within' if res['within_0.95_1.05'] else 'outside'} 0.95–1.05")


def main(argv: list[str] | None = None) -> int:
    from toolkit.cli import OneLineParser, int_arg, parse_int, split_list

    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--prompts-file", default=None)
    p.add_argument("--rounds", type=int_arg(1, 100), default=3)
    p.add_argument("--max-new-tokens", type=int_arg(2, 1024), default=64)
    p.add_argument("--max-prompt-tokens", type=int_arg(1, 4096), default=256)
    p.add_argument("--threads", type=int_arg(1, 1024), default=None)
    p.add_argument("--lookup", type=int_arg(1, 8), default=None, help="n-gram size N of the prompt lookup pairs")
    p.add_argument("--gamma", default=None, help="draft lengths, comma-separated (with --lookup)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--runs", type=Path, nargs="+", default=None, metavar="RUN_DIR",
                   help="measure nothing: summarise finished llama.cpp sweeps (ours ÷ the reference, median of runs)")
    a = p.parse_args(argv)
    from toolkit.jsonio import strict_dumps, write_json

    if a.runs:
        try:
            res = runs_summary(a.runs)
        except (OSError, ValueError) as e:
            p.error(str(e))
        show_runs(res)
        print(strict_dumps(res))
        return 0
    if bool(a.lookup) != bool(a.gamma):
        p.error("--lookup and --gamma go together")
    try:
        a.gamma = [parse_int(g, 1, 16) for g in split_list(a.gamma)] if a.gamma else None
    except ValueError as e:
        p.error(f"--gamma {e}")
    t0 = time.time()
    res = measure(a)
    res["wall_s"] = time.time() - t0
    show(res)
    if a.out:
        write_json(a.out, res, indent=None)
    print(strict_dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
