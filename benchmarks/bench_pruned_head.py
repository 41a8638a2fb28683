"""Benchmark: dense vs pruned vocabulary head latency on a 262k-vocabulary head (Gemma-3 shape).

For K in {500, 1000, 3000, 10000, 30000} it times, side by side in one process
with the one timer (:class:`measure.timing.Timer`, warm-ups discarded, median
of counted repeats):

* ``dense``        — ``F.linear(h, W)``: the full head, ``[1, V]`` logits;
* ``select``       — the cluster selector alone (centroid scores + top clusters → K ids);
* ``fast``         — selector + gather + projection, kept ids and logits only;
* ``greedy``       — ``fast`` + argmax (on CUDA: the fused Triton argmax kernel);
* ``dropin``       — ``fast`` + scatter into full-vocabulary logits with ``-inf``
  (what the common decoding loop sees when the head is swapped in);
* ``frequency``    — the static FR-Spec subset (rows sliced once), fast path;
* ``lowrank_*``    — the low-rank selector (:mod:`measure.head.lowrank`, rank ``--rank``):
  approximate logits ``(h P) F^T`` + ``topk`` → K ids, then the same gather +
  projection (+ argmax / scatter). Its latency depends on shapes only, so the
  benchmark fits the scorer to an identity second moment (no model forward).

On CUDA it also times the torch backend against the Triton backend, and the
Triton greedy path replayed from a CUDA graph (no host sync anywhere in the
selector, so the whole step is capturable). Prints a table, then one JSON line.

    python benchmarks/bench_pruned_head.py                 # CPU, real Gemma-3-270M head if installed
    python benchmarks/bench_pruned_head.py --device cuda --head random --out $OUT/bench.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from measure.head.clusters import ClusterConfig, load_or_build_clusters  # noqa: E402
from measure.head.lowrank import HiddenMoment, fit_lowrank  # noqa: E402
from measure.head.pruned_head import PrunedLMHead, torch_gather_project  # noqa: E402
from measure.timing import Timer  # noqa: E402
from measure.head.triton_head import triton_available  # noqa: E402

KS = (500, 1000, 3000, 10000, 30000)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _load_head(kind: str, device: str, dtype: torch.dtype, seed: int) -> tuple[torch.nn.Linear, str, torch.Tensor]:
    """(lm_head, description, a hidden state [1, H]) — real Gemma-3-270M head or a random one of its shape."""
    if kind in ("auto", "gemma3-270m"):
        try:
            from measure.engines.transformers.models import load_model

            lm = load_model("gemma3-270m", device="cpu", dtype="float32")
            tok = lm.tokenizer
            ids = torch.tensor([tok("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.")["input_ids"]])
            got: list[torch.Tensor] = []
            h = lm.model.lm_head.register_forward_pre_hook(lambda _m, a: got.append(a[0].detach()))
            with torch.inference_mode():
                lm.model(input_ids=ids)
            h.remove()
            head = torch.nn.Linear(640, lm.vocab_size, bias=False)
            head.weight = torch.nn.Parameter(lm.model.lm_head.weight.detach().clone(), requires_grad=False)
            hidden = got[0][:, -1].clone()
            del lm
            return head.to(device=device, dtype=dtype), "gemma3-270m lm_head (real weights)", hidden.to(device, dtype)
        except Exception as e:  # package missing on a bare GPU box: fall back when 'auto'
            if kind != "auto":
                raise
            print(f"# real head unavailable ({type(e).__name__}: {str(e)[:80]}); using a random head", file=sys.stderr)
    g = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(640, 262144, bias=False).requires_grad_(False)
    head.weight.copy_(torch.randn(262144, 640, generator=g) * 0.05)
    hidden = torch.randn(1, 640, generator=g)
    return head.to(device=device, dtype=dtype), "random 262144 x 640 head (Gemma-3 shape)", hidden.to(device, dtype)


def _cuda_graph(fn, device: str):
    """Capture ``fn`` (fixed shapes, no host sync) in a CUDA graph; returns the replay callable."""
    s = torch.cuda.Stream(device)
    s.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream(device).wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", help="cpu, cuda or auto")
    ap.add_argument("--head", default="auto", choices=("auto", "gemma3-270m", "random"))
    ap.add_argument("--dtype", default=None, help="float32 / bfloat16 / float16 (default: float32 on CPU, bfloat16 on CUDA)")
    ap.add_argument("--ks", default=",".join(map(str, KS)))
    ap.add_argument("--n-clusters", type=int, default=3000)
    ap.add_argument("--rank", type=int, default=64, help="rank of the low-rank selector's scorer")
    ap.add_argument("--repeats", type=int, default=None, help="counted repeats (default 30 CPU, 300 CUDA)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 avoids OpenMP stalls when shared)")
    ap.add_argument("--out", default=None, help="also write the JSON result to this file")
    args = ap.parse_args(argv)

    if args.threads is not None:
        torch.set_num_threads(max(1, args.threads))
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("error: --device cuda but CUDA is not available", file=sys.stderr)
        return 2
    is_cuda = device.startswith("cuda")
    dtype = DTYPES[args.dtype or ("bfloat16" if is_cuda else "float32")]
    repeats = args.repeats or (300 if is_cuda else 30)
    ks = [int(k) for k in args.ks.split(",") if k.strip()]
    timer = Timer(device)

    t0 = time.perf_counter()
    head, desc, hidden = _load_head(args.head, device, dtype, args.seed)
    v, h = head.weight.shape
    # clusters of the float32 rows, built on the device (cached on disk)
    clusters, cached = load_or_build_clusters(head.weight.detach().float(), ClusterConfig(n_clusters=args.n_clusters,
                                                                                           seed=args.seed),
                                              args.cache_dir)
    scorer = fit_lowrank(head.weight.detach().float().cpu(), HiddenMoment(torch.eye(h, dtype=torch.float64), 1),
                         min(args.rank, int(h)))
    setup_s = time.perf_counter() - t0
    g = torch.Generator().manual_seed(args.seed + 1)
    counts = torch.randint(0, 1000, (v,), generator=g)  # static subset: latency does not depend on which ids

    def med(fn) -> float:
        return float(statistics.median(timer.bench(fn, warmup=max(3, repeats // 10), repeats=repeats)))

    results: dict = {"device": device, "device_name": torch.cuda.get_device_name(device) if is_cuda else platform.processor()
                     or platform.machine(), "head": desc, "vocab_size": int(v), "hidden_size": int(h),
                     "dtype": str(dtype).replace("torch.", ""), "n_clusters": clusters.n_clusters,
                     "lowrank_rank": scorer.rank,
                     "clusters_cached": cached, "setup_s": round(setup_s, 1), "repeats": repeats,
                     "torch": torch.__version__, "threads": torch.get_num_threads(), "triton": triton_available(),
                     "rows": []}
    with torch.inference_mode():
        dense_ms = med(lambda: torch.nn.functional.linear(hidden, head.weight))
        dense_argmax_ms = med(lambda: torch.nn.functional.linear(hidden, head.weight).argmax(-1))
        results["dense_ms"], results["dense_argmax_ms"] = dense_ms, dense_argmax_ms
        if is_cuda:
            dense_replay = _cuda_graph(lambda: torch.nn.functional.linear(hidden, head.weight).argmax(-1), device)
            results["dense_graph_ms"] = med(dense_replay)
            results["dense_graph_device_ms"] = float(statistics.median(
                timer.bench_cuda_events(dense_replay, warmup=10, repeats=repeats)))
        for k in ks:
            if k > v:
                continue
            row: dict = {"k": k}
            backends = ("torch", "triton") if is_cuda and triton_available() else ("torch",)
            for be in backends:
                p = PrunedLMHead.clustered(head, clusters, k, backend=be)
                sfx = "" if be == "torch" else "_triton"
                if be == "torch":
                    row["select_ms"] = med(lambda: p.select(hidden))
                    ids = p.select(hidden)
                    row["gather_project_ms"] = med(lambda: torch_gather_project(head.weight, ids, hidden))
                row["fast_ms" + sfx] = med(lambda: p.project(hidden))
                row["greedy_ms" + sfx] = med(lambda: p.greedy(hidden))
                row["dropin_ms" + sfx] = med(lambda: p(hidden))
                if is_cuda:
                    replay = _cuda_graph(lambda: p.greedy(hidden), device)
                    row["greedy_graph_ms" + sfx] = med(replay)
                    row["greedy_graph_device_ms" + sfx] = float(statistics.median(
                        timer.bench_cuda_events(replay, warmup=10, repeats=repeats)))
                    if be == "triton":
                        ids = p.select(hidden)
                        from measure.head.triton_head import triton_gather_project

                        row["kernel_only_ms_triton"] = med(lambda: triton_gather_project(head.weight, ids, hidden))
            for be in backends:
                lr = PrunedLMHead.lowrank(head, scorer, k, backend=be)
                sfx = "" if be == "torch" else "_triton"
                if be == "torch":
                    row["lowrank_select_ms"] = med(lambda: lr.select(hidden))
                row["lowrank_greedy_ms" + sfx] = med(lambda: lr.greedy(hidden))
                row["lowrank_dropin_ms" + sfx] = med(lambda: lr(hidden))
                if is_cuda:
                    replay = _cuda_graph(lambda: lr.greedy(hidden), device)
                    row["lowrank_greedy_graph_ms" + sfx] = med(replay)
            f = PrunedLMHead.frequency(head, counts, k)
            row["frequency_fast_ms"] = med(lambda: f.project(hidden))
            best = "greedy_graph_ms_triton" if "greedy_graph_ms_triton" in row else "greedy_ms"
            row["ratio_fast"] = dense_ms / row["fast_ms"]
            row["ratio_greedy"] = dense_argmax_ms / row["greedy_ms"]
            row["ratio_dropin"] = dense_ms / row["dropin_ms"]
            row["ratio_frequency"] = dense_ms / row["frequency_fast_ms"]
            row["ratio_lowrank_greedy"] = dense_argmax_ms / row["lowrank_greedy_ms"]
            row["ratio_lowrank_dropin"] = dense_ms / row["lowrank_dropin_ms"]
            if "lowrank_greedy_graph_ms_triton" in row:
                row["ratio_lowrank_best_gpu"] = (results.get("dense_graph_ms", dense_argmax_ms)
                                                 / row["lowrank_greedy_graph_ms_triton"])
            if is_cuda:
                row["ratio_best_gpu"] = results.get("dense_graph_ms", dense_argmax_ms) / row[best]
                if "greedy_graph_device_ms_triton" in row:
                    row["ratio_device_triton"] = results["dense_graph_device_ms"] / row["greedy_graph_device_ms_triton"]
                if "greedy_ms_triton" in row:
                    row["ratio_greedy_triton"] = dense_argmax_ms / row["greedy_ms_triton"]
                    row["ratio_triton_vs_torch_greedy"] = row["greedy_ms"] / row["greedy_ms_triton"]
            results["rows"].append(row)

    print(f"# {desc} on {results['device_name']} ({device}, {results['dtype']}, {results['threads']} threads), "
          f"{clusters.n_clusters} clusters, median of {repeats}")
    print(f"# dense head: {dense_ms:.3f} ms (with argmax {dense_argmax_ms:.3f} ms)"
          + (f", CUDA graph {results['dense_graph_ms']:.4f} ms (device {results['dense_graph_device_ms']:.4f} ms)"
             if "dense_graph_ms" in results else ""))
    cols = ["k", "select_ms", "gather_project_ms", "fast_ms", "greedy_ms", "dropin_ms", "frequency_fast_ms",
            "lowrank_select_ms", "lowrank_greedy_ms", "lowrank_dropin_ms",
            "ratio_fast", "ratio_greedy", "ratio_dropin", "ratio_frequency", "ratio_lowrank_greedy",
            "ratio_lowrank_dropin"]
    if is_cuda:
        cols += [c for c in ("fast_ms_triton", "greedy_ms_triton", "greedy_graph_ms", "greedy_graph_ms_triton",
                             "greedy_graph_device_ms_triton", "kernel_only_ms_triton", "ratio_greedy_triton",
                             "ratio_triton_vs_torch_greedy", "ratio_best_gpu", "ratio_device_triton",
                             "lowrank_greedy_graph_ms_triton", "ratio_lowrank_best_gpu") if any(c in r for r in results["rows"])]
    w = [max(len(c), 9) for c in cols]
    print("  ".join(c.rjust(n) for c, n in zip(cols, w)))
    for r in results["rows"]:
        print("  ".join((f"{r[c]:.4f}" if isinstance(r.get(c), float) else str(r.get(c, "-"))).rjust(n)
                        for c, n in zip(cols, w)))
    line = json.dumps(results)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
