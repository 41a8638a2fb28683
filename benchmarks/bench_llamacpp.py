"""Benchmark: our llama.cpp loops against llama-cpp-python's own, same model, prompts and settings, interleaved.

Two side-by-side comparisons, each a ratio ours / library of tokens/s (median
over prompts × repeats; ≥ 0.95 means our loop adds no overhead of note):

* ``decode`` — plain greedy decoding token by token: our
  :class:`~measure.engines.llamacpp.LlamaCppDecoder` (one ``llama_decode`` of
  one token, logits copied into torch, argmax) against ``Llama.generate``
  with no draft (greedy sampler chain in C). The per-token overhead of our
  Decoder, which every loop of ours pays.
* ``spec`` — speculative decoding with prompt lookup at γ and n-gram size N:
  :func:`measure.decoding.speculative_generate` over the Decoder with
  ``ngram:N:first`` against ``Llama.generate`` with
  ``LlamaPromptLookupDecoding(max_ngram_size=N, num_pred_tokens=γ)`` (the
  engine's peer). Needs the Decoder-based loop of measure.decoding; where
  that is not there yet the ``spec`` part says so in one line and is skipped.

Each prompt's generations alternate the order (ours first, then theirs, then
the other way round), warm-ups are discarded, both run in one process with
the same context size and thread count. Greedy outputs are judged with
:func:`measure.engines.lossless.check_greedy_lossless` against our baseline.
Prints a table, then one JSON line. Timing runs on this machine hold the
shared CPU lock:

    flock /tmp/specscope-cpu.lock python benchmarks/bench_llamacpp.py --threads 2
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from measure.engines.base import EngineOptions  # noqa: E402
from measure.engines.lossless import baseline_logits_at, check_greedy_lossless, count_statuses  # noqa: E402

DOMAINS = ("code", "conversation", "docs")


def our_greedy(target: Any, ids: torch.Tensor, max_new_tokens: int) -> tuple[list[int], float]:
    """Token-by-token greedy decoding on a fresh Decoder → (new tokens, wall seconds from prefill on)."""
    dec = target.new_decoder()
    eos = set(target.eos_token_ids)
    out: list[int] = []
    t0 = time.perf_counter()
    logits = dec.forward(ids, last_only=True)  # [1, V]
    while True:
        tok = int(logits[-1].argmax())
        out.append(tok)
        if len(out) >= max_new_tokens or tok in eos:
            break
        logits = dec.forward(torch.tensor([[tok]]), last_only=True)
    return out, time.perf_counter() - t0


def library_greedy(llm: Any, ids: torch.Tensor, max_new_tokens: int, eos: set[int]) -> tuple[list[int], float]:
    """``Llama.generate`` greedy, no draft, no prefix reuse → (new tokens, wall seconds)."""
    llm.reset()
    out: list[int] = []
    t0 = time.perf_counter()
    for tok in llm.generate(ids[0].tolist(), temp=0.0, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0,
                            repeat_penalty=1.0, reset=True):
        out.append(int(tok))
        if len(out) >= max_new_tokens or tok in eos:
            break
    return out, time.perf_counter() - t0


def interleaved(fns: dict[str, Callable[[], tuple[list[int], float]]], repeats: int, warmup: int,
                flip: bool) -> dict[str, list[tuple[list[int], float]]]:
    """Run each fn ``warmup`` (discarded) then ``repeats`` times, alternating the order every round."""
    names = list(fns)
    for _ in range(warmup):
        for n in names:
            fns[n]()
    got: dict[str, list[tuple[list[int], float]]] = {n: [] for n in names}
    for r in range(repeats):
        order = names if (r % 2 == 0) != flip else names[::-1]
        for n in order:
            got[n].append(fns[n]())
    return got


def spec_loop_ready() -> str | None:
    """None when measure.decoding's speculative loop runs over a TargetModel/Decoder, else why not."""
    import inspect

    from measure import decoding

    src = inspect.getsource(decoding.speculative_generate)
    if "new_decoder" not in src:
        return "measure.decoding.speculative_generate does not run over a Decoder yet (issue #12)"
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="gguf:FILE or a packaged name")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--mode", choices=("decode", "spec", "both"), default="both")
    p.add_argument("--prompts", type=int, default=1, help="prompts per domain (code, conversation, docs)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--ngram", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="also write the JSON line here")
    a = p.parse_args(argv)
    for name in ("threads", "prompts", "max_new_tokens", "gamma", "ngram", "repeats"):
        if getattr(a, name) < 1:
            print(f"error: --{name.replace('_', '-')} {getattr(a, name)}: must be >= 1", file=sys.stderr)
            return 2
    try:
        from measure.engines import make_engine
        from measure.prompts import load_prompts

        options = EngineOptions(threads=a.threads, quiet=True, max_len_tokens=256 + a.max_new_tokens + a.gamma + 2)
        engine = make_engine("llamacpp", options)
        target = engine.load_target(a.model, device="cpu", dtype="float32", seed=a.seed)
    except (ImportError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from llama_cpp import Llama

    o = options
    plain = Llama(model_path=str(target.path), n_ctx=o.max_len_tokens, n_batch=o.max_len_tokens,
                  n_ubatch=min(o.max_len_tokens, 512), n_threads=engine.threads, n_threads_batch=engine.threads,
                  flash_attn=False, swa_full=True, no_perf=True, verbose=False)
    prompts = [pr for d in DOMAINS for pr in load_prompts(d, a.prompts, seed=a.seed)]
    encoded = [(pr.prompt_id, engine.encode(target, pr.message, 256)) for pr in prompts]
    eos = set(target.eos_token_ids)
    rows: list[dict] = []
    results: dict[str, Any] = {"bench": "llamacpp", "model": target.name, "sha256": target.sha256,
                               "threads": engine.threads, "max_new_tokens": a.max_new_tokens,
                               "repeats": a.repeats, "prompts": len(encoded), "machine": platform.machine(),
                               "versions": dict(engine.versions())}
    modes = ("decode", "spec") if a.mode == "both" else (a.mode,)
    for mode in modes:
        if mode == "spec":
            why = spec_loop_ready()
            if why:
                print(f"# spec: skipped: {why}")
                results["spec"] = {"skipped": why}
                continue
            from measure.decoding import speculative_generate
            from sim.policies import make_policy

            draft = engine.make_draft(f"ngram:{a.ngram}:first", target, seed=a.seed)
            if engine.peer_generate(target, draft, encoded[0][1], a.gamma, 0.0, 2, a.seed) is None:
                print("# spec: skipped: the peer does not run for this draft")
                results["spec"] = {"skipped": "no peer for this draft"}
                continue
        checks = []
        ours_tps: list[float] = []
        lib_tps: list[float] = []
        for i, (pid, ids) in enumerate(encoded):
            if mode == "decode":
                fns = {"ours": lambda ids=ids: our_greedy(target, ids, a.max_new_tokens),
                       "library": lambda ids=ids: library_greedy(plain, ids, a.max_new_tokens, eos)}
            else:
                def ours_spec(ids: torch.Tensor = ids) -> tuple[list[int], float]:
                    g = speculative_generate(target, draft, ids, make_policy(f"fixed:{a.gamma}"), 0.0,
                                             a.max_new_tokens, eos_token_ids=target.eos_token_ids)
                    return list(g.tokens), g.wall_s

                def lib_spec(ids: torch.Tensor = ids) -> tuple[list[int], float]:
                    r = engine.peer_generate(target, draft, ids, a.gamma, 0.0, a.max_new_tokens, a.seed)
                    return list(r.tokens), r.wall_s

                fns = {"ours": ours_spec, "library": lib_spec}
            got = interleaved(fns, a.repeats, a.warmup, flip=bool(i % 2))
            base, _ = our_greedy(target, ids, a.max_new_tokens)
            logits_at = baseline_logits_at(target.new_decoder(), ids, base)
            for who in ("ours", "library"):
                checks.append(check_greedy_lossless(base, got[who][0][0], logits_at))
            o_tps = [len(t) / s for t, s in got["ours"]]
            l_tps = [len(t) / s for t, s in got["library"]]
            ours_tps += o_tps
            lib_tps += l_tps
            rows.append({"mode": mode, "prompt": pid, "tokens": len(got["ours"][0][0]),
                         "ours_tok_s": statistics.median(o_tps), "library_tok_s": statistics.median(l_tps),
                         "ratio": statistics.median(o_tps) / statistics.median(l_tps)})
        ratio = statistics.median(ours_tps) / statistics.median(lib_tps)
        results[mode] = {"ours_tok_s_median": statistics.median(ours_tps),
                         "library_tok_s_median": statistics.median(lib_tps), "ratio": ratio,
                         "ratio_min_prompt": min(r["ratio"] for r in rows if r["mode"] == mode),
                         "ratio_max_prompt": max(r["ratio"] for r in rows if r["mode"] == mode),
                         "lossless": count_statuses(checks),
                         "gamma": a.gamma if mode == "spec" else None, "ngram": a.ngram if mode == "spec" else None}
    print(f"# {target.name} ({target.dtype}) llama.cpp, {engine.threads} threads, {a.max_new_tokens} new tokens, "
          f"{a.repeats} repeats after {a.warmup} warm-up, order alternating")
    cols = ("mode", "prompt", "tokens", "ours_tok_s", "library_tok_s", "ratio")
    print("  ".join(f"{c:>22}" if c == "prompt" else f"{c:>13}" for c in cols))
    for r in rows:
        print("  ".join(f"{r[c]:>22}" if c == "prompt" else f"{r[c]:>13.3f}" if isinstance(r[c], float)
                        else f"{r[c]:>13}" for c in cols))
    for mode in modes:
        m = results.get(mode, {})
        if "ratio" in m:
            print(f"# {mode}: ours {m['ours_tok_s_median']:.1f} tok/s, library {m['library_tok_s_median']:.1f} tok/s, "
                  f"ratio {m['ratio']:.3f} (per prompt {m['ratio_min_prompt']:.3f}..{m['ratio_max_prompt']:.3f}); "
                  f"greedy vs baseline: {m['lossless']}")
    line = json.dumps(results)
    if a.out:
        Path(a.out).write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
