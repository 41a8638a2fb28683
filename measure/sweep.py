"""A measurement sweep: cells of (draft, γ policy, temperature, domain) into one run directory.

Per cell and prompt, the baseline, our speculative loop and the peer
(transformers' assisted generation) run back to back — their order alternating
from prompt to prompt — so drift hits all alike. Warm-ups run before a cell's
counted generations and are never recorded. Each finished cell is on disk
before the next starts; a re-run into the same directory skips finished cells.
"""

from __future__ import annotations

import math
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from measure import records
from measure.decoding import (acceptance_trace, autoregressive_generate, crop_cache, forward_logits, new_cache,
                              proposal_runs, speculative_generate)
from measure.drafts import NGramDraft, draft_kind, make_draft
from measure.models import LoadedModel, load_model, resolve_device, resolve_dtype
from measure.prompts import DOMAINS, encode_prompt, load_prompts
from measure.timing import Timer
from sim.policies import make_policy


@dataclass(frozen=True)
class SweepConfig:
    """Everything a sweep needs; validated on construction (``ValueError`` names the bad value)."""

    target: str = "smollm2-135m"
    drafts: tuple[str, ...] = ("ngram:3",)
    gammas: tuple[str, ...] = ("fixed:4",)
    temperatures: tuple[float, ...] = (0.0,)
    domains: tuple[str, ...] = DOMAINS
    prompts_per_domain: int = 2
    max_new_tokens: int = 64
    max_prompt_tokens: int = 256
    device: str = "auto"
    dtype: str = "float32"
    seed: int = 0
    warmup: int = 1
    peer: bool = True
    traces: bool = True
    cost_curves: bool = True
    cost_max_tokens: int = 16
    cost_contexts: tuple[int, ...] = (64, 160, 256)
    cost_repeats: int = 5

    def __post_init__(self) -> None:
        if not self.drafts:
            raise ValueError("need at least one draft")
        for d in self.drafts:
            draft_kind(d)
        for g in self.gammas:
            make_policy(g)
        if not self.gammas:
            raise ValueError("need at least one gamma")
        for t in self.temperatures:
            if not float(t) >= 0:
                raise ValueError(f"temperature must be >= 0, got {t}")
        for d in self.domains:
            if d not in DOMAINS:
                raise ValueError(f"unknown domain {d!r}; valid: {', '.join(DOMAINS)}")
        for name in ("prompts_per_domain", "max_new_tokens", "max_prompt_tokens", "cost_max_tokens",
                     "cost_repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        if any(c < 1 for c in self.cost_contexts):
            raise ValueError(f"cost contexts must be >= 1, got {self.cost_contexts}")
        resolve_dtype(self.dtype)

    def as_dict(self) -> dict:
        return asdict(self)


# -- environment ----------------------------------------------------------------------------
def environment(device: str) -> tuple[dict, dict, str | None]:
    """(hardware, versions, git commit) for ``run.json``."""
    import importlib.metadata as md
    import os

    def ver(pkg: str) -> str | None:
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return None

    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else None
    hardware = {"device": "cuda" if gpu else "cpu", "device_name": gpu or cpu, "cpu": cpu,
                "cores": os.cpu_count(), "memory_bytes": int(mem), "gpu": gpu,
                "torch_threads": torch.get_num_threads()}
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": ver("transformers"), "specscope": ver("specscope"),
                "cuda": torch.version.cuda}
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                                cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return hardware, versions, commit


# -- cost curves ----------------------------------------------------------------------------
def measure_cost_curves(target: LoadedModel, drafts: list[Any], timer: Timer, contexts: tuple[int, ...],
                        max_tokens: int, repeats: int, seed: int) -> tuple[list[dict], list[dict]]:
    """Target forward ms vs tokens verified (1..max_tokens) and context; draft step ms vs context."""
    g = torch.Generator().manual_seed(seed)
    dev = target.device
    t_rows, d_rows = [], []
    for ctx in contexts:
        ids = torch.randint(0, target.vocab_size, (1, ctx + max_tokens), generator=g).to(dev)  # [1, C+K]
        cache = new_cache()
        forward_logits(target.model, ids[:, :ctx], cache)
        for n in range(1, max_tokens + 1):
            x = ids[:, ctx:ctx + n]  # [1, n]
            ms = timer.bench(lambda: forward_logits(target.model, x, cache), warmup=1, repeats=repeats,
                             setup=lambda: crop_cache(cache, ctx))
            t_rows += [{"n_tokens": n, "context_tokens": ctx, "repeat": i, "ms": m} for i, m in enumerate(ms)]
        for d in drafts:
            if isinstance(d, NGramDraft):
                ms = timer.bench(lambda: d.propose(ids[:, :ctx], 4, 0.0, None), warmup=1, repeats=repeats)
            else:
                dc = new_cache()
                forward_logits(d.model, ids[:, :ctx], dc)
                ms = timer.bench(lambda: forward_logits(d.model, ids[:, ctx:ctx + 1], dc), warmup=1,
                                 repeats=repeats, setup=lambda: crop_cache(dc, ctx))
            d_rows += [{"draft": d.name, "head_k": None, "context_tokens": ctx, "repeat": i, "ms": m}
                       for i, m in enumerate(ms)]
    return t_rows, d_rows


# -- peer: transformers' assisted generation --------------------------------------------------
def peer_generate(target: LoadedModel, draft: Any, input_ids: torch.Tensor, policy_spec: str,
                  temperature: float, max_new_tokens: int, seed: int, timer: Timer) -> tuple[tuple[int, ...], float]:
    """The same pair through ``model.generate(assistant_model=...)`` → (new tokens, wall seconds)."""
    pol = make_policy(policy_spec)
    kw: dict[str, Any] = dict(max_new_tokens=max_new_tokens, do_sample=temperature > 0,
                              attention_mask=torch.ones_like(input_ids))
    if temperature > 0:
        kw.update(temperature=temperature, top_k=0, top_p=1.0)
    eos = list(target.eos_token_ids)
    kw.update(eos_token_id=eos or None, pad_token_id=eos[0] if eos else 0)
    if isinstance(draft, NGramDraft):
        kw.update(prompt_lookup_num_tokens=pol.initial_gamma, max_matching_ngram_size=draft.max_ngram)
    else:
        gc = draft.model.generation_config
        gc.num_assistant_tokens = pol.initial_gamma
        gc.num_assistant_tokens_schedule = "heuristic" if policy_spec.startswith("heuristic") else "constant"
        gc.assistant_confidence_threshold = 0.0
        kw.update(assistant_model=draft.model)
    devices = [torch.device(target.device).index or 0] if target.device.startswith("cuda") else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        t0 = timer.now_s()
        with torch.inference_mode():
            out = target.model.generate(input_ids, **kw)  # [1, S + new]
        wall_s = timer.now_s() - t0
    return tuple(int(t) for t in out[0, input_ids.shape[1]:].tolist()), wall_s


# -- the sweep --------------------------------------------------------------------------------
def _rate(num: float, den: float) -> float | None:
    return num / den if den else None


def summarize(cells: list[dict], synthetic: bool) -> dict:
    """``run.json`` summary: the best cell (highest speedup) plus sweep-wide flags."""
    if not cells:
        return {}
    def _f(x: Any) -> float:
        try:
            v = float(x)
        except (TypeError, ValueError):
            return -math.inf
        return v if not math.isnan(v) else -math.inf
    best = max(cells, key=lambda c: _f(c["speedup"]))
    greedy = [c for c in cells if float(c["temperature"]) == 0]
    keys = ("tokens_per_s_baseline", "tokens_per_s_speculative", "tokens_per_s_peer", "speedup",
            "acceptance_rate", "mean_accepted_per_round", "outputs_identical")
    out = {k: best[k] for k in keys}
    out.update(best_cell=best["cell_id"], n_cells=len(cells), synthetic=synthetic,
               all_greedy_outputs_identical=all(c["outputs_identical"] in (True, "true", "True") for c in greedy)
               if greedy else None)
    if synthetic:
        out["note"] = "synthetic (random-weight) models: timing only; acceptance is not a measurement"
    return out


def _gen(seed: int, index: int, device: str) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed * 1_000_003 + index)


def run_sweep(config: SweepConfig, out_dir: str | Path, command: str = "",
              progress: Callable[[str], None] | None = None, show_bar: bool = True) -> records.Run:
    """Run (or resume) the sweep into ``out_dir``; returns the run read back."""
    device = resolve_device(config.device)
    writer = records.RunWriter(out_dir)  # fails early on an unwritable directory
    hardware, versions, commit = environment(device)
    with writer.recording():
        target = load_model(config.target, device=device, dtype=config.dtype, seed=config.seed)
        drafts = [make_draft(d, target, seed=config.seed + 1) for d in config.drafts]
        writer.update(command=command, git_commit=commit, hardware=hardware, versions=versions,
                      models={"target": target.describe(), "drafts": {d.name: d.describe() for d in drafts}},
                      config=config.as_dict())
        synthetic = target.synthetic or any(d.synthetic for d in drafts)
        timer = Timer(device)
        prompts = {dom: load_prompts(dom, config.prompts_per_domain, config.seed) for dom in config.domains}
        enc = {p.prompt_id: encode_prompt(p, target, config.max_prompt_tokens, device)
               for ps in prompts.values() for p in ps}
        writer.update(prompts={p.prompt_id: {"source": p.source, "prompt_tokens": int(enc[p.prompt_id].shape[1])}
                               for ps in prompts.values() for p in ps})
        if config.cost_curves and not writer.has_rows("cost_target"):
            if progress:
                progress("timing cost curves")
            t_rows, d_rows = measure_cost_curves(target, drafts, timer, config.cost_contexts,
                                                 config.cost_max_tokens, config.cost_repeats, config.seed)
            writer.append("cost_draft", d_rows)
            writer.append("cost_target", t_rows)
        done_cells = records.load_run(writer.path).table("cells").to_dict("records")
        plan = [(d, t, dom, g) for d in drafts for t in config.temperatures for dom in config.domains
                for g in config.gammas]
        todo = [c for c in plan if not writer.is_finished(
            records.cell_id(c[0].name, make_policy(c[3]).spec(), c[1], c[2]))]
        bar = None
        if show_bar:
            from tqdm import tqdm

            bar = tqdm(total=sum(len(prompts[c[2]]) for c in todo), desc="measure", unit="gen", file=sys.stderr)
        for d, temp, dom, g in todo:
            row = _run_cell(writer, target, d, g, float(temp), dom, prompts[dom], enc, config, timer,
                            bar=bar)
            done_cells.append(row)
            writer.update(summary=summarize(done_cells, synthetic))
        if bar is not None:
            bar.close()
        writer.update(summary=summarize(done_cells, synthetic))
    return records.load_run(writer.path)


def _run_cell(writer: records.RunWriter, target: LoadedModel, draft: Any, gamma_spec: str, temp: float,
              domain: str, prompts: list, enc: dict, config: SweepConfig, timer: Timer,
              bar: Any = None) -> dict:
    policy = make_policy(gamma_spec)
    cid = records.cell_id(draft.name, policy.spec(), temp, domain)
    eos = target.eos_token_ids
    dev = target.device
    for w in range(config.warmup):  # not recorded
        ids = enc[prompts[0].prompt_id]
        autoregressive_generate(target, ids, temp, min(8, config.max_new_tokens), _gen(config.seed, -1, dev), eos,
                                timer)
        speculative_generate(target, draft, ids, policy, temp, min(8, config.max_new_tokens),
                             _gen(config.seed, -1, dev), eos, timer)
    totals = {"base": [0, 0.0], "spec": [0, 0.0], "peer": [0, 0.0]}
    n_rounds = drafted = accepted = 0
    identical: list[bool] = []
    peer_ok = config.peer
    for pi, p in enumerate(prompts):
        ids = enc[p.prompt_id]  # [1, S]
        seed_i = config.seed * 7919 + pi
        res: dict[str, Any] = {}
        order = ["base", "spec", "peer"] if pi % 2 == 0 else ["spec", "base", "peer"]
        for mode in order:
            timer.reset_peak_memory()
            if mode == "base":
                r = autoregressive_generate(target, ids, temp, config.max_new_tokens, _gen(seed_i, 0, dev), eos, timer)
                res[mode] = (r.tokens, r.wall_s, r.ttft_ms, r.token_latency_ms, timer.peak_memory_bytes(), r)
            elif mode == "spec":
                r = speculative_generate(target, draft, ids, policy, temp, config.max_new_tokens,
                                         _gen(seed_i, 0, dev), eos, timer)
                res[mode] = (r.tokens, r.wall_s, r.ttft_ms, r.token_latency_ms, timer.peak_memory_bytes(), r)
            elif peer_ok:
                try:
                    toks, wall = peer_generate(target, draft, ids, gamma_spec, temp, config.max_new_tokens,
                                               seed_i, timer)
                    res[mode] = (toks, wall, None, (), timer.peak_memory_bytes(), None)
                except Exception as e:  # a peer that cannot run this pair is recorded, not fatal
                    errs = dict(writer.meta.get("peer_errors", {}))
                    errs[draft.name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                    writer.update(peer_errors=errs)
                    peer_ok = False
        base, spec = res["base"][5], res["spec"][5]
        same = base.tokens == spec.tokens if temp == 0 else None
        if same is not None:
            identical.append(same)
        n_rounds += len(spec.rounds)
        drafted += spec.drafted
        accepted += spec.accepted
        gen_rows, lat_rows = [], []
        for mode, label in (("base", "baseline"), ("spec", "speculative"), ("peer", "peer")):
            if mode not in res:
                continue
            toks, wall, ttft, lat, peak, _ = res[mode]
            totals[mode][0] += len(toks)
            totals[mode][1] += wall
            m_same = same if mode == "spec" else (tuple(toks) == base.tokens if mode == "peer" and temp == 0 else None)
            gen_rows.append({"cell_id": cid, "prompt_id": p.prompt_id, "domain": domain, "mode": label,
                             "prompt_tokens": int(ids.shape[1]), "new_tokens": len(toks), "wall_s": wall,
                             "tokens_per_s": len(toks) / wall if wall > 0 else None, "ttft_ms": ttft,
                             "peak_mem_bytes": peak, "outputs_identical": m_same})
            lat_rows += [{"cell_id": cid, "prompt_id": p.prompt_id, "mode": label, "token_index": i,
                          "latency_ms": v} for i, v in enumerate(lat)]
        writer.append("generations", gen_rows)
        writer.append("token_latency", lat_rows)
        writer.append("rounds", [{"cell_id": cid, "prompt_id": p.prompt_id, **asdict(rr)} for rr in spec.rounds])
        # every cell records the (γ-independent) trace of its prompts, so a calibration that holds
        # a cell out still has the trace from the cells it trains on
        if config.traces:
            full = torch.cat([ids, torch.tensor([list(base.tokens)], device=ids.device)], dim=1)  # [1, S+n]
            vals = acceptance_trace(target, draft, full, int(ids.shape[1]), temp)
            if temp == 0:
                proposed, runs = proposal_runs(draft, full, int(ids.shape[1]), vals)
            else:  # sampled outputs depend on γ: no γ-free proposal runs
                proposed = runs = [None] * len(vals)
            writer.append("traces", [{"cell_id": cid, "draft": draft.name, "temperature": temp, "domain": domain,
                                      "prompt_id": p.prompt_id, "position": i, "value": v,
                                      "proposed": proposed[i], "accept_run": runs[i]}
                                     for i, v in enumerate(vals)])
        if bar is not None:
            bar.update(1)
    tps = {m: _rate(totals[m][0], totals[m][1]) for m in totals}
    row = {"cell_id": cid, "draft": draft.name, "gamma_policy": policy.spec(), "gamma": policy.initial_gamma,
           "temperature": temp, "domain": domain, "head_k": None, "n_prompts": len(prompts),
           "new_tokens": totals["spec"][0], "tokens_per_s_baseline": tps["base"],
           "tokens_per_s_speculative": tps["spec"], "tokens_per_s_peer": tps["peer"],
           "speedup": _rate(tps["spec"] or 0.0, tps["base"] or 0.0), "acceptance_rate": _rate(accepted, drafted),
           "mean_accepted_per_round": _rate(accepted, n_rounds), "n_rounds": n_rounds,
           "outputs_identical": all(identical) if identical else None,
           "synthetic": bool(target.synthetic or draft.synthetic)}
    writer.finish_cell(row)
    return row
