"""Benchmark: our decoding loop against transformers' own, and against the loop it replaced.

Every ratio is measured side by side in one process: for each prompt and
repeat, every variant of a section runs once, in an order rotated from run to
run (so drift hits all alike), timed by the wall clock around the whole call
(``perf_counter``; on CUDA after a synchronize). Warm-ups — and with
``--compile`` the compilation of the decode steps, reported apart — run
before the counted repeats and are never counted. A ratio is the median of
the per-run ratios of tokens/s, with its spread (min–max over runs).

Sections:

* ``baseline`` — greedy autoregressive decoding of ``--model``: ours (static
  cache; dynamic cache; static + compiled) ÷ ``model.generate`` (same tokens).
* ``lookup`` — speculative decoding with prompt lookup: ours with
  ``ngram:N:first`` (transformers' earliest-match rule) at γ ÷ transformers'
  ``prompt_lookup_num_tokens=γ, max_matching_ngram_size=N``; plus the
  per-round overhead (round − draft − verify) of our loop and of the loop
  before this change (``ngram:N``, the rule both loops have).
* ``selfdraft`` — ``--gemma`` target with its bf16 copy as the draft: ours ÷
  assisted generation (constant schedule, same γ, no confidence early stop),
  and the per-round overhead before and after.
* ``pruned`` — the same Gemma pair with the draft's head pruned to ``K``
  tokens by the low-rank selector: end-to-end tokens/s against the dense
  self-draft, with our loop (the head's greedy fast path) and the loop before
  (the drop-in ``forward``: −inf logits over V, scatter, upcast, argmax).

"Before" is the loop of git commit ``--before`` (default: the commit this
change started from), imported from git's object store at run time
(``git show COMMIT:measure/decoding.py`` etc.), so nothing of the old code is
copied into the tree.

    flock /tmp/specscope-cpu.lock python benchmarks/bench_engine.py --out results/cpu-bench-engine.json
    python benchmarks/bench_engine.py --sections baseline --repeats 2 --prompts 1     # a quick look

Prints a table for people, then one JSON line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from measure.decoding import autoregressive_generate, speculative_generate  # noqa: E402
from measure.engines.transformers import peer_generate  # noqa: E402
from measure.engines.transformers.drafts import make_draft  # noqa: E402
from measure.engines.transformers.models import load_model  # noqa: E402
from measure.seam import EngineOptions  # noqa: E402
from measure.prompts import encode_prompt, load_prompts  # noqa: E402
from measure.head.pruned_head import PrunedLMHead  # noqa: E402
from sim.policies import FixedGamma  # noqa: E402
from toolkit.env import cpu_name  # noqa: E402

SECTIONS = ("baseline", "lookup", "selfdraft", "pruned")
#: the commit this change started from (main when the engine work began)
BEFORE_COMMIT = "9ebbff8"


# -- the loop before this change, from git ---------------------------------------------------
def load_before(commit: str) -> types.SimpleNamespace:
    """Main's ``decoding``, ``drafts`` and ``pruned_head`` modules at ``commit``, imported from git objects."""
    mods: dict[str, types.ModuleType] = {}
    for name in ("decoding", "drafts", "pruned_head"):
        try:
            src = subprocess.run(["git", "show", f"{commit}:measure/{name}.py"], cwd=ROOT, check=True,
                                 capture_output=True, text=True).stdout
        except (OSError, subprocess.CalledProcessError) as e:
            raise SystemExit(f"--before {commit}: cannot read measure/{name}.py from git ({e}); "
                             "run inside the repository's git checkout") from None
        for other in mods:
            src = src.replace(f"from measure.{other} import", f"from _before_{other} import")
        # the pruned head's helpers moved into measure/head/ after that commit
        src = src.replace("from measure import triton_head", "from measure.head import triton_head")
        for moved in ("clusters", "lowrank", "triton_head"):
            src = src.replace(f"from measure.{moved} import", f"from measure.head.{moved} import")
        mod = types.ModuleType(f"_before_{name}")
        mod.__file__ = f"<git {commit}:measure/{name}.py>"
        sys.modules[mod.__name__] = mod
        exec(compile(src, mod.__file__, "exec"), mod.__dict__)
        mods[name] = mod
    return types.SimpleNamespace(**mods)


# -- timing helpers ----------------------------------------------------------------------------
def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@dataclasses.dataclass(frozen=True)
class Run:
    """One counted generation of one variant."""

    variant: str
    prompt: int
    repeat: int
    tokens: tuple[int, ...]
    wall_s: float
    rounds: tuple = ()

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.wall_s


def interleave(variants: dict[str, Callable[[torch.Tensor], Any]], prompts: list[torch.Tensor], repeats: int,
               warmup: int, device: str, say: Callable[[str], None]) -> list[Run]:
    """Run every variant on every prompt ``repeats`` times, order rotated per run; warm-ups not returned."""
    names = list(variants)
    for w in range(warmup):
        for name in names:
            variants[name](prompts[w % len(prompts)])
    runs: list[Run] = []
    for pi, ids in enumerate(prompts):
        for r in range(repeats):
            shift = (pi * repeats + r) % len(names)
            for name in names[shift:] + names[:shift]:
                _sync(device)
                t0 = time.perf_counter()
                out = variants[name](ids)
                _sync(device)
                wall = time.perf_counter() - t0
                toks = tuple(out.tokens) if hasattr(out, "tokens") else tuple(out)
                runs.append(Run(name, pi, r, toks, wall, tuple(getattr(out, "rounds", ()) or ())))
        say(f"  prompt {pi + 1}/{len(prompts)} done")
    return runs


def ratio(runs: list[Run], num: str, den: str) -> dict:
    """tokens/s of ``num`` ÷ tokens/s of ``den``, per (prompt, repeat) pair: median and min–max."""
    by = {(r.variant, r.prompt, r.repeat): r for r in runs}
    vals = [by[(num, p, k)].tokens_per_s / by[(den, p, k)].tokens_per_s
            for (v, p, k) in by if v == num and (den, p, k) in by]
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def rate(runs: list[Run], name: str) -> float:
    rs = [r for r in runs if r.variant == name]
    return sum(len(r.tokens) for r in rs) / sum(r.wall_s for r in rs)


def same_tokens(runs: list[Run], a: str, b: str) -> bool:
    by = {(r.variant, r.prompt, r.repeat): r.tokens for r in runs}
    return all(by[(a, p, k)] == t for (v, p, k), t in by.items() if v == b and (a, p, k) in by)


def overhead(runs: list[Run], name: str) -> dict:
    """Per-round overhead (round − draft − verify): mean ms, and share of round time; from the RoundRecords."""
    rr = [x for r in runs if r.variant == name for x in r.rounds]
    if not rr:
        return {}
    tot = sum(x.draft_ms + x.verify_ms + x.overhead_ms for x in rr)
    ovh = [x.overhead_ms for x in rr]
    return {"rounds": len(rr), "overhead_ms_mean": statistics.fmean(ovh),
            "overhead_ms_median": statistics.median(ovh), "overhead_share": sum(ovh) / tot,
            "round_ms_mean": tot / len(rr)}


# -- sections -------------------------------------------------------------------------------
def _hf_generate(target: Any, max_new: int) -> Callable[[torch.Tensor], tuple[int, ...]]:
    eos = list(target.eos_token_ids)

    def run(ids: torch.Tensor) -> tuple[int, ...]:
        with torch.inference_mode():
            out = target.model.generate(ids, max_new_tokens=max_new, do_sample=False,
                                        attention_mask=torch.ones_like(ids), eos_token_id=eos or None,
                                        pad_token_id=eos[0] if eos else 0)
        return tuple(int(t) for t in out[0, ids.shape[1]:].tolist())
    return run


def _with_options(target: Any, **kw: Any) -> Any:
    return dataclasses.replace(target, engine_options=EngineOptions(**kw))


def _warm(dec: Any, *drafts: Any, k_tokens: int) -> None:
    """Compile the decode steps of the target's decoder ``dec`` and the model drafts before anything is timed."""
    dec.warmup(k_tokens)
    for d in drafts:
        dec = getattr(d, "decoder", None)
        if dec is not None:
            dec.warmup(2)


def _compile_s(*objs: Any) -> float:
    """Seconds spent compiling by decoders and the decoders of model drafts."""
    total = 0.0
    for o in objs:
        dec = getattr(o, "decoder", None) or o
        total += float(getattr(dec, "compile_s", 0.0))
    return total


def section_baseline(target: Any, prompts: list, args: argparse.Namespace, say: Callable) -> dict:
    max_len = max(int(p.shape[1]) for p in prompts) + args.max_new_tokens + 16
    static = _with_options(target, max_len_tokens=max_len).new_decoder()
    dynamic = _with_options(target, cache="dynamic", max_len_tokens=max_len).new_decoder()
    v: dict[str, Callable] = {
        "transformers_generate": _hf_generate(target, args.max_new_tokens),
        "ours_static": lambda ids: autoregressive_generate(static, ids, 0.0, args.max_new_tokens,
                                                           eos_token_ids=target.eos_token_ids),
        "ours_dynamic": lambda ids: autoregressive_generate(dynamic, ids, 0.0, args.max_new_tokens,
                                                            eos_token_ids=target.eos_token_ids),
    }
    compiled = None
    if args.compile:
        compiled = _with_options(target, compile=True, max_len_tokens=max_len).new_decoder()
        _warm(compiled, k_tokens=2)
        v["ours_static_compiled"] = lambda ids: autoregressive_generate(compiled, ids, 0.0, args.max_new_tokens,
                                                                        eos_token_ids=target.eos_token_ids)
    runs = interleave(v, prompts, args.repeats, args.warmup, args.device, say)
    out = {"tokens_per_s": {k: rate(runs, k) for k in v},
           "same_tokens": all(same_tokens(runs, "transformers_generate", k) for k in v),
           "ratios": {k: ratio(runs, k, "transformers_generate") for k in v if k.startswith("ours")}}
    if compiled is not None:
        out["compile_s"] = _compile_s(compiled)
    return out


def section_lookup(target: Any, prompts: list, args: argparse.Namespace, before: Any, say: Callable) -> dict:
    g, n = args.gamma_lookup, args.ngram
    max_len = max(int(p.shape[1]) for p in prompts) + args.max_new_tokens + g + 16
    static_target = _with_options(target, max_len_tokens=max_len)
    static = static_target.new_decoder()
    first = make_draft(f"ngram:{n}:first", static_target)
    recent = make_draft(f"ngram:{n}", static_target)
    old = before.drafts.make_draft(f"ngram:{n}", target)
    eos = target.eos_token_ids
    v: dict[str, Callable] = {
        "transformers_prompt_lookup": lambda ids: peer_generate(target, first, ids, g, 0.0, args.max_new_tokens,
                                                                 0).tokens,
        "ours_first": lambda ids: speculative_generate(static, first, ids, FixedGamma(g), 0.0, args.max_new_tokens,
                                                       eos_token_ids=eos),
        "ours_recent": lambda ids: speculative_generate(static, recent, ids, FixedGamma(g), 0.0,
                                                        args.max_new_tokens, eos_token_ids=eos),
        "before_recent": lambda ids: before.decoding.speculative_generate(target, old, ids, FixedGamma(g), 0.0,
                                                                          args.max_new_tokens, eos_token_ids=eos),
    }
    compiled = None
    if args.compile:
        compiled_target = _with_options(target, compile=True, max_len_tokens=max_len)
        compiled = compiled_target.new_decoder()
        cfirst = make_draft(f"ngram:{n}:first", compiled_target)
        _warm(compiled, k_tokens=g + 1)
        v["ours_first_compiled"] = lambda ids: speculative_generate(compiled, cfirst, ids, FixedGamma(g), 0.0,
                                                                    args.max_new_tokens, eos_token_ids=eos)
    runs = interleave(v, prompts, args.repeats, args.warmup, args.device, say)
    out = {"gamma": g, "ngram": n, "tokens_per_s": {k: rate(runs, k) for k in v},
           "same_tokens": all(same_tokens(runs, "ours_recent", k) for k in v),
           "ratios": {k: ratio(runs, k, "transformers_prompt_lookup") for k in v if k.startswith("ours")},
           "recent_after_vs_before": ratio(runs, "ours_recent", "before_recent"),
           "overhead": {k: overhead(runs, k) for k in v if k != "transformers_prompt_lookup"}}
    if compiled is not None:
        out["compile_s"] = _compile_s(compiled)
    return out


def section_selfdraft(target: Any, prompts: list, args: argparse.Namespace, before: Any, say: Callable) -> dict:
    g = args.gamma_model
    max_len = max(int(p.shape[1]) for p in prompts) + args.max_new_tokens + g + 16
    static_target = _with_options(target, max_len_tokens=max_len)
    static = static_target.new_decoder()
    draft = make_draft("bf16", static_target)
    old = before.drafts.make_draft("bf16", target)
    eos = target.eos_token_ids
    v: dict[str, Callable] = {
        "transformers_assisted": lambda ids: peer_generate(target, draft, ids, g, 0.0, args.max_new_tokens,
                                                            0).tokens,
        "ours": lambda ids: speculative_generate(static, draft, ids, FixedGamma(g), 0.0, args.max_new_tokens,
                                                 eos_token_ids=eos),
        "before": lambda ids: before.decoding.speculative_generate(target, old, ids, FixedGamma(g), 0.0,
                                                                   args.max_new_tokens, eos_token_ids=eos),
    }
    compiled = cdraft = None
    if args.compile and not args.no_compile_gemma:
        compiled_target = _with_options(target, compile=True, max_len_tokens=max_len)
        compiled = compiled_target.new_decoder()
        cdraft = make_draft("bf16", compiled_target)
        _warm(compiled, cdraft, k_tokens=g + 1)
        v["ours_compiled"] = lambda ids: speculative_generate(compiled, cdraft, ids, FixedGamma(g), 0.0,
                                                              args.max_new_tokens, eos_token_ids=eos)
    runs = interleave(v, prompts, args.repeats, args.warmup, args.device, say)
    out = {"gamma": g, "draft": "bf16", "tokens_per_s": {k: rate(runs, k) for k in v},
           "same_tokens": all(same_tokens(runs, "ours", k) for k in v),
           "ratios": {k: ratio(runs, k, "transformers_assisted") for k in v if k.startswith("ours")},
           "after_vs_before": ratio(runs, "ours", "before"),
           "overhead": {k: overhead(runs, k) for k in v if k != "transformers_assisted"}}
    if compiled is not None:
        out["compile_s"] = _compile_s(compiled, cdraft)
    return out


def _lowrank_scorer(draft_model: Any, tokenizer: Any, args: argparse.Namespace) -> Any:
    """The head sweep's low-rank scorer for ``draft_model`` (moment cached under ~/.cache/specscope)."""
    from measure.head.head_sweep import draft_moment
    from measure.head.lowrank import fit_lowrank

    dense = draft_model.lm_head
    moment, _, _ = draft_moment(draft_model, tokenizer, args.moment_texts, 256)
    return fit_lowrank(dense.weight, moment, min(args.rank, int(dense.weight.shape[1])))


def section_pruned(target: Any, prompts: list, args: argparse.Namespace, before: Any, say: Callable) -> dict:
    g = args.gamma_model
    max_len = max(int(p.shape[1]) for p in prompts) + args.max_new_tokens + g + 16
    static_target = _with_options(target, max_len_tokens=max_len)
    static = static_target.new_decoder()
    eos = target.eos_token_ids
    new_d = make_draft("bf16", static_target)
    old_d = before.drafts.make_draft("bf16", target)
    new_dense, old_dense = new_d.model.lm_head, old_d.model.lm_head
    ks = [int(k) for k in args.head_ks.split(",")]
    say(f"  low-rank scorer (rank {args.rank}, {args.moment_texts} calibration texts)")
    scorer = _lowrank_scorer(new_d.model, target.tokenizer, args)
    new_heads = {k: PrunedLMHead.lowrank(new_dense, scorer, k, always_keep=eos) for k in ks}
    old_heads = {k: before.pruned_head.PrunedLMHead.lowrank(old_dense, scorer, k, always_keep=eos) for k in ks}

    def ours(head: Any) -> Callable:
        def run(ids: torch.Tensor) -> Any:
            new_d.model.lm_head = head
            return speculative_generate(static, new_d, ids, FixedGamma(g), 0.0, args.max_new_tokens,
                                        eos_token_ids=eos)
        return run

    def bef(head: Any) -> Callable:
        def run(ids: torch.Tensor) -> Any:
            old_d.model.lm_head = head
            return before.decoding.speculative_generate(target, old_d, ids, FixedGamma(g), 0.0,
                                                        args.max_new_tokens, eos_token_ids=eos)
        return run

    v: dict[str, Callable] = {"ours_dense": ours(new_dense), "before_dense": bef(old_dense)}
    for k in ks:
        v[f"ours_lowrank_{k}"] = ours(new_heads[k])
        v[f"before_lowrank_{k}"] = bef(old_heads[k])
    runs = interleave(v, prompts, args.repeats, args.warmup, args.device, say)
    new_d.model.lm_head, old_d.model.lm_head = new_dense, old_dense
    out = {"gamma": g, "rank": args.rank, "tokens_per_s": {k: rate(runs, k) for k in v},
           "same_tokens": all(same_tokens(runs, "ours_dense", k) for k in v),
           "speedup_vs_dense": {}}
    for k in ks:
        out["speedup_vs_dense"][str(k)] = {"after": ratio(runs, f"ours_lowrank_{k}", "ours_dense"),
                                           "before": ratio(runs, f"before_lowrank_{k}", "before_dense"),
                                           "after_vs_before": ratio(runs, f"ours_lowrank_{k}",
                                                                    f"before_lowrank_{k}")}
    return out


# -- main -------------------------------------------------------------------------------------
def _prompts(target: Any, n: int, domains: list[str], max_prompt: int, device: str) -> list[torch.Tensor]:
    out = []
    for dom in domains:
        out += [encode_prompt(p, target, max_prompt, device) for p in load_prompts(dom, n, 0)]
    return out


def _fmt(r: dict) -> str:
    return f"{r['median']:.2f}x [{r['min']:.2f}-{r['max']:.2f}]"


def print_table(res: dict) -> None:
    print(f"\nEngine benchmark — {res['meta']['cpu']}, {res['meta']['threads']} threads, torch {res['meta']['torch']}, "
          f"transformers {res['meta']['transformers']}; ratio = median [min-max] of per-run tokens/s ratios")
    for sec, body in res["sections"].items():
        print(f"\n[{sec}]  " + ", ".join(f"{k}={v}" for k, v in body.items() if k in ("gamma", "ngram", "draft", "rank")))
        for k, tps in body["tokens_per_s"].items():
            print(f"  {k:<28} {tps:8.2f} tok/s")
        for k, r in body.get("ratios", {}).items():
            print(f"  ratio {k:<22} {_fmt(r)}")
        for key in ("recent_after_vs_before", "after_vs_before"):
            if key in body:
                print(f"  {key:<28} {_fmt(body[key])}")
        for k, o in body.get("overhead", {}).items():
            if o:
                print(f"  overhead {k:<19} {o['overhead_ms_mean']:.3f} ms/round ({100 * o['overhead_share']:.1f}% of "
                      f"{o['round_ms_mean']:.1f} ms)")
        for k, d in body.get("speedup_vs_dense", {}).items():
            print(f"  K={k:<6} vs dense: after {_fmt(d['after'])}, before {_fmt(d['before'])}; "
                  f"after/before {_fmt(d['after_vs_before'])}")
        if "compile_s" in body:
            print(f"  compile + warm-up of the compiled steps: {body['compile_s']:.1f} s (not counted)")
        print(f"  greedy outputs identical across variants: {body['same_tokens']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    p.add_argument("--model", default="smollm2-135m", help="target of the baseline and lookup sections")
    p.add_argument("--gemma", default="gemma3-270m", help="target of the selfdraft and pruned sections")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--domains", default="code,conversation")
    p.add_argument("--prompts", type=int, default=2, help="prompts per domain")
    p.add_argument("--max-prompt-tokens", type=int, default=192)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--gamma-lookup", type=int, default=8)
    p.add_argument("--ngram", type=int, default=3)
    p.add_argument("--gamma-model", type=int, default=4)
    p.add_argument("--head-ks", default="1000,3000")
    p.add_argument("--rank", type=int, default=64)
    p.add_argument("--moment-texts", type=int, default=64)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                   help="add the torch.compile'd rows (default on)")
    p.add_argument("--no-compile-gemma", action="store_true", help="skip the compiled Gemma row (compile is slow)")
    p.add_argument("--before", default=BEFORE_COMMIT, help="git commit whose loop is 'before'")
    p.add_argument("--out", default=None, help="write the results JSON here")
    args = p.parse_args(argv)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    bad = [s for s in sections if s not in SECTIONS]
    if bad:
        print(f"--sections {','.join(bad)}: unknown; valid: {', '.join(SECTIONS)}", file=sys.stderr)
        return 2
    for name in ("prompts", "repeats", "max_new_tokens", "gamma_lookup", "gamma_model", "ngram"):
        if getattr(args, name) < 1:
            print(f"--{name.replace('_', '-')} {getattr(args, name)}: must be >= 1", file=sys.stderr)
            return 2
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    import transformers

    before = load_before(args.before)
    domains = [d.strip() for d in args.domains.split(",") if d.strip()]
    res: dict = {"meta": {"cpu": cpu_name(), "threads": torch.get_num_threads(), "torch": torch.__version__,
                          "transformers": transformers.__version__, "device": args.device, "before": args.before,
                          "command": " ".join([Path(sys.argv[0]).name] + (argv if argv is not None else sys.argv[1:])),
                          "args": vars(args)},
                 "sections": {}}
    t_start = time.perf_counter()
    if {"baseline", "lookup"} & set(sections):
        say(f"loading {args.model}")
        target = load_model(args.model, device=args.device)
        prompts = _prompts(target, args.prompts, domains, args.max_prompt_tokens, args.device)
        if "baseline" in sections:
            say("[baseline]")
            res["sections"]["baseline"] = section_baseline(target, prompts, args, say)
        if "lookup" in sections:
            say("[lookup]")
            code = _prompts(target, args.prompts * len(domains), ["code"], args.max_prompt_tokens, args.device)
            res["sections"]["lookup"] = section_lookup(target, code, args, before, say)
        del target
    if {"selfdraft", "pruned"} & set(sections):
        say(f"loading {args.gemma}")
        target = load_model(args.gemma, device=args.device)
        prompts = _prompts(target, args.prompts, domains, args.max_prompt_tokens, args.device)
        if "selfdraft" in sections:
            say("[selfdraft]")
            res["sections"]["selfdraft"] = section_selfdraft(target, prompts, args, before, say)
        if "pruned" in sections:
            say("[pruned]")
            res["sections"]["pruned"] = section_pruned(target, prompts, args, before, say)
    res["meta"]["total_s"] = time.perf_counter() - t_start
    print_table(res)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
