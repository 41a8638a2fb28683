"""Offline recall of the pruned-head selectors: is the dense head's argmax among the K kept tokens?

With greedy drafting, a pruned head changes the draft's token exactly when the
dense head's argmax falls outside the kept set, so this recall bounds the
acceptance a pruned head can keep (the head sweep measures acceptance itself,
end to end, on far fewer positions). Here every position of held-out text is
scored by one teacher-forced draft forward, and every selector is run on the
same hidden states through :meth:`measure.head.pruned_head.PrunedLMHead.select`:

* ``frequency``         — the static FR-Spec subset (ShareGPT counts, records >= 3,000);
* ``clustered-<scoring>`` — best token clusters (``cosine``, ``mean``);
* ``lowrank-<r>``       — the data-aware low-rank scorer (:mod:`measure.head.lowrank`);
* ``lowrank-plain-<r>`` — the same rank from the SVD of ``W`` alone (no hidden-state
  statistics): the ablation that shows why the fit uses the draft's hidden states.

Held-out text: the evaluation prompts of :func:`measure.prompts.load_prompts`
(HumanEval, the first ShareGPT turns of records < 3,000, stdlib docstrings),
``max_tokens`` tokens each. The frequency table and the hidden-state moment are
estimated on ShareGPT records from 3,000 on, so never on this text. Human text
is harder to predict than the model's own greedy output, so these recalls are
conservative for a self-draft.

    python -m measure head-recall --model gemma3-270m --draft bf16 --out runs/head_recall

(the command line: :mod:`measure.head.cli`; here :class:`HeadRecallConfig` in, :func:`run_head_recall` out).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from measure.head.clusters import ClusterConfig, load_or_build_clusters
from measure.drafts import ModelDraft
from measure.engines.transformers.drafts import make_draft
from measure.engines.transformers.models import load_model
from measure.head.head_sweep import MAX_HEAD_K, calibration_counts, check_model_draft, draft_moment, head_inputs
from measure.head.lowrank import HiddenMoment, fit_lowrank
from measure.prompts import DOMAINS, load_prompts
from measure.records import strict_dumps
from measure.head.pruned_head import PrunedLMHead

__all__ = ["HeadRecallConfig", "recall_table", "run_head_recall"]

DEFAULT_KS = (500, 1000, 3000, 10000, 30000)


@dataclass(frozen=True)
class HeadRecallConfig:
    """What :func:`run_head_recall` measures; validated on construction (one-line ``ValueError`` naming the flag)."""

    model: str = "gemma3-270m"
    draft: str = "bf16"
    ks: tuple[int, ...] = DEFAULT_KS
    ranks: tuple[int, ...] = (32, 64)
    domains: tuple[str, ...] = ("code", "conversation")
    prompts_per_domain: int = 40
    max_tokens: int = 256
    n_clusters: int = 3000
    moment_texts: int = 64
    calibration_texts: int = 300
    seed: int = 0
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        for k in self.ks:
            if not 1 <= k <= MAX_HEAD_K:
                raise ValueError(f"--ks {k}: each K must be in 1..{MAX_HEAD_K} (below the vocabulary size)")
        for r in self.ranks:
            if not 1 <= r <= 65_536:
                raise ValueError(f"--ranks {r}: each rank must be in 1..65536")
        check_model_draft(self.draft)
        for d in self.domains:
            if d not in DOMAINS:
                raise ValueError(f"--domains {d!r}: unknown domain; valid: {', '.join(DOMAINS)}")


def _wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return float("nan"), float("nan")
    p = hits / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return c - h, c + h


@torch.inference_mode()
def _held_out_states(model: nn.Module, tokenizer, domains: tuple[str, ...], per_domain: int, max_tokens: int,
                     seed: int) -> tuple[torch.Tensor, list[str]]:
    """Hidden states ``[N, H]`` entering ``model.lm_head`` at every position of the held-out prompts."""
    doms: list[str] = []
    device = next(model.parameters()).device
    with head_inputs(model) as got:
        for dom in domains:
            for p in load_prompts(dom, per_domain, seed):
                ids = tokenizer(p.text, return_tensors="pt")["input_ids"][:, :max_tokens].to(device)
                model(input_ids=ids)
                doms += [dom] * int(ids.shape[1])
    return torch.cat([g[0] for g in got]), doms


@torch.inference_mode()
def recall_table(heads: dict[tuple[str, int], PrunedLMHead], dense: nn.Linear, hidden: torch.Tensor,
                 domains: list[str], chunk: int = 256) -> pd.DataFrame:
    """One row per (selector, K, domain or 'all'): positions whose dense argmax is kept. ``heads``: by
    ``(selector, K)``."""
    argmax = torch.cat([dense(hidden[s:s + chunk]).argmax(-1) for s in range(0, hidden.shape[0], chunk)])
    dom = pd.Series(domains)
    rows = []
    for (name, _k), head in heads.items():
        hit = torch.cat([(head.select(hidden[s:s + chunk]) == argmax[s:s + chunk, None]).any(1)
                         for s in range(0, hidden.shape[0], chunk)]).numpy()
        for d in ["all"] + sorted(set(domains)):
            m = slice(None) if d == "all" else (dom == d).to_numpy()
            n, k = int(hit[m].size), int(hit[m].sum())
            lo, hi = _wilson(k, n)
            rows.append({"selector": name, "head_k": head.head_k, "domain": d, "positions": n,
                         "recall": k / n if n else float("nan"), "ci95_low": lo, "ci95_high": hi})
    return pd.DataFrame(rows)


def run_head_recall(config: HeadRecallConfig, out: Path, command: str = "") -> tuple[pd.DataFrame, dict[str, Any]]:
    """Measure the selectors' recall; write ``recall.csv`` and ``recall.json`` into ``out`` (which must exist and be
    writable); returns the table and the ``recall.json`` record. Bad input found once the model is loaded (a K at
    or above its vocabulary, a draft without an ``nn.Linear`` head): one-line ``ValueError``."""
    t0 = time.perf_counter()
    target = load_model(config.model, dtype="float32", seed=config.seed)
    draft = make_draft(config.draft, target, seed=config.seed + 1)
    if not isinstance(draft, ModelDraft) or not isinstance(getattr(draft.model, "lm_head", None), nn.Linear):
        raise ValueError(f"draft {config.draft!r} has no nn.Linear lm_head to prune")
    dmodel, dense = draft.model, draft.model.lm_head
    vocab, hsize = (int(x) for x in dense.weight.shape)
    for k in config.ks:
        if not 1 <= k < vocab:
            raise ValueError(f"--ks {k}: must be in 1..{vocab - 1} (the dense head is the reference)")
    eos = tuple(int(e) for e in target.eos_token_ids if 0 <= int(e) < vocab)
    counts, n_cal = calibration_counts(target.tokenizer, config.calibration_texts, vocab)
    clusters, _ = load_or_build_clusters(dense.weight.detach().float(),
                                         ClusterConfig(n_clusters=min(config.n_clusters, vocab), seed=config.seed),
                                         config.cache_dir)
    moment, _, _ = draft_moment(dmodel, target.tokenizer, config.moment_texts, 256, config.cache_dir)
    hidden, doms = _held_out_states(dmodel, target.tokenizer, config.domains, config.prompts_per_domain,
                                    config.max_tokens, config.seed)
    w = dense.weight.detach().float()
    scorers = {}
    for r in config.ranks:
        scorers[f"lowrank-{r}"] = fit_lowrank(w, moment, min(r, hsize))
        scorers[f"lowrank-plain-{r}"] = fit_lowrank(w, HiddenMoment(torch.eye(hsize, dtype=torch.float64), 1),
                                                    min(r, hsize))
    heads: dict[tuple[str, int], PrunedLMHead] = {}
    for k in config.ks:
        heads["frequency", k] = PrunedLMHead.frequency(dense, counts, k, always_keep=eos)
        for sc in ("cosine", "mean"):
            heads[f"clustered-{sc}", k] = PrunedLMHead.clustered(dense, clusters, k, always_keep=eos, scoring=sc)
        for name, scorer in scorers.items():
            heads[name, k] = PrunedLMHead.lowrank(dense, scorer, k, always_keep=eos)
    table = recall_table(heads, dense, hidden, doms)
    table.to_csv(out / "recall.csv", index=False)
    meta = {"command": command, "model": config.model, "draft": config.draft, "vocab_size": vocab,
            "positions": int(hidden.shape[0]), "calibration_tokens": n_cal, "moment_positions": moment.n,
            "logit_energy": {n: s.logit_energy for n, s in scorers.items()},
            "seconds": time.perf_counter() - t0}
    (out / "recall.json").write_text(strict_dumps(meta, indent=2))
    return table, meta
