"""Synthetic run directories (``docs/RUN_FORMAT.md``) with known ground truth.

``make_run(path, truth, seed=...)`` plays speculative decoding out of a known
cost model and known acceptance rates, with multiplicative timing noise from
a seeded generator, and writes every table through
:class:`measure.records.RunWriter` — so the files are exactly what ``measure``
writes, and a calibration can be checked against the parameters that made
them. Greedy decoding: each (draft, domain, prompt) gets one 0/1 match-flag
trace (i.i.d. Bernoulli(α)); rounds at every γ replay that same trace, as
real greedy speculative decoding does (first round after the prefill token,
γ capped at the tokens still to generate — as ``measure`` does). A draft
named in ``SyntheticTruth.propose_prob`` behaves like a lookup draft: at each
position it proposes (up to 16 tokens) only with that probability, else
nothing, and a round that proposes nothing is a 1-token verify.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np

from measure.analysis import TRACE_GAMMA_MAX
from measure.records import RunWriter, cell_id
from measure.runkinds import CHAIN
from measure.rows import (CellRow, CostDraftRow, CostTargetRow, GenerationRow, HeadSweepRow, RoundRow,
                          TokenLatencyRow, TraceRow)


@dataclass(frozen=True)
class SyntheticTruth:
    """The parameters a synthetic run is generated from (times in ms)."""

    verify_ms_by_tokens: Mapping[int, float] = field(
        default_factory=lambda: {n: 20.0 + 1.2 * n + (5.0 if n in (2, 3) else 0.0) for n in range(1, 17)}
    )
    target_ms_per_context_token: float = 0.02
    draft_step_ms: Mapping[str, float] = field(default_factory=lambda: {"small": 4.0, "tiny": 2.0})
    draft_ms_per_context_token: float = 0.004
    draft_ms_per_head_k: float = 0.0002  # pruned heads: + this × K
    overhead_ms: float = 1.5
    prefill_ms_per_token: float = 0.3
    alpha: Mapping[tuple[str, str], float] = field(
        default_factory=lambda: {("small", "code"): 0.8, ("small", "chat"): 0.65,
                                 ("tiny", "code"): 0.6, ("tiny", "chat"): 0.5}
    )
    head_k_alpha: Mapping[int, float] = field(default_factory=lambda: {1024: 0.55, 4096: 0.68, 16384: 0.75})
    propose_prob: Mapping[str, float] = field(default_factory=dict)  # lookup-style drafts
    noise_rel: float = 0.03

    def verify_ms(self, n: int, ctx: float) -> float:
        return self.verify_ms_by_tokens[n] + self.target_ms_per_context_token * ctx

    def draft_ms(self, draft: str, ctx: float, head_k: int | None = None) -> float:
        base = self.draft_step_ms[draft] + self.draft_ms_per_context_token * ctx
        if head_k is not None:
            base += self.draft_ms_per_head_k * head_k
        return base

    def alpha_of(self, draft: str, domain: str, head_k: int | None) -> float:
        if head_k is not None:
            return self.head_k_alpha[head_k]
        return self.alpha[(draft, domain)]


def proposal_runs(flags: np.ndarray, proposes: np.ndarray, n: int) -> tuple[list[int], list[int]]:
    """(proposed, run) per position, as ``measure.decoding.proposal_runs`` records them."""
    proposed, runs = [], []
    for t in range(n):
        k = min(TRACE_GAMMA_MAX, n - t) if proposes[t] else 0
        r = 0
        while r < k and flags[t + r]:
            r += 1
        proposed.append(int(k))
        runs.append(int(r))
    return proposed, runs


def make_run(
    path: str | Path,
    truth: SyntheticTruth | None = None,
    seed: int = 0,
    drafts: tuple[str, ...] = ("small", "tiny"),
    gammas: tuple[int, ...] = (1, 2, 4, 6),
    domains: tuple[str, ...] = ("code", "chat"),
    prompts_per_domain: int = 3,
    max_new_tokens: int = 96,
    head_ks: tuple[int, ...] = (),
    pruned_draft: str = "small",
    with_head_sweep: bool = False,
    context_grid: tuple[int, ...] = (32, 96, 192),
    repeats: int = 3,
) -> SyntheticTruth:
    """Write a complete synthetic run directory at ``path`` and return its truth.

    With ``head_ks`` the cells use draft ``pruned_draft`` with each kept
    vocabulary K (domain ``domains[0]``) instead of the plain drafts.
    """
    truth = truth or SyntheticTruth()
    rng = np.random.default_rng(seed)

    def noisy(x: float) -> float:
        return float(x * np.exp(rng.normal(0.0, truth.noise_rel)))

    w = RunWriter(path, meta={
        "command": "tests/support/fixtures_runs.py make_run",
        "git_commit": None,
        "hardware": {"device": "cpu", "device_name": "synthetic", "cpu": "synthetic", "cores": 2,
                     "memory_bytes": 0, "gpu": None},
        "versions": {"python": "3.11", "torch": None, "transformers": None, "specscope": "0.1.0"},
        "models": {
            "target": {"name": "synthetic-target", "source": "synthetic:fixture", "synthetic": False,
                       "vocab_size": 32768, "params": 0, "dtype": "float32"},
            "drafts": {d: {"kind": "pruned" if head_ks and d == pruned_draft else "model", "synthetic": False}
                       for d in (drafts if not head_ks else (pruned_draft,))},
        },
        "config": CHAIN.stamp({"gammas": list(gammas), "temperatures": [0.0], "domains": list(domains),
                               "prompts_per_domain": prompts_per_domain, "max_new_tokens": max_new_tokens,
                               "seed": seed, "warmup": 0, "head_ks": list(head_ks)}),
    })
    # cost tables: timed forwards, independent of γ
    w.append("cost_target", [
        CostTargetRow(n_tokens=n, context_tokens=c, repeat=r, ms=noisy(truth.verify_ms(n, c)))
        for n in range(1, 17) for c in context_grid for r in range(repeats)
    ])
    draft_rows = []
    for d in (drafts if not head_ks else (pruned_draft,)):
        for k in (head_ks or (None,)):
            for c in context_grid:
                for r in range(repeats):
                    draft_rows.append(CostDraftRow(draft=d, head_k=k, context_tokens=c, repeat=r,
                                       ms=noisy(truth.draft_ms(d, c, k))))
    w.append("cost_draft", draft_rows)

    # one match-flag trace per (draft, domain, head_k, prompt), shared by every γ
    prompt_len = {(dom, p): int(rng.integers(24, 64)) for dom in domains for p in range(prompts_per_domain)}
    configs = ([(pruned_draft, domains[0], k) for k in head_ks] if head_ks
               else [(d, dom, None) for d in drafts for dom in domains])
    traces = {}
    for d, dom, k in configs:
        a = truth.alpha_of(d, dom, k)
        for p in range(prompts_per_domain):
            flags = (rng.random(max_new_tokens + 20) < a).astype(int)
            proposes = (rng.random(max_new_tokens) < truth.propose_prob.get(d, 1.0)).astype(int)
            traces[(d, dom, k, p)] = (flags, *proposal_runs(flags, proposes, max_new_tokens))

    best = None
    for d, dom, k in configs:
        for g in gammas:
            cid = cell_id(d, f"fixed:{g}", 0.0, dom, k)
            gen_rows, round_rows, lat_rows, trace_rows = [], [], [], []
            tot = {"base_tok": 0, "base_s": 0.0, "spec_tok": 0, "spec_s": 0.0, "acc": 0, "drafted": 0, "rounds": 0}
            for p in range(prompts_per_domain):
                pid = f"{dom}-{p}"
                plen = prompt_len[(dom, p)]
                flags, proposed, runs = traces[(d, dom, k, p)]
                trace_rows += [TraceRow(cell_id=cid, draft=d, temperature=0.0, domain=dom, prompt_id=pid,
                                position=i, value=int(v), proposed=proposed[i], accept_run=runs[i])
                               for i, v in enumerate(flags[:max_new_tokens])]
                # baseline: prefill (first token) then one target step per token
                ttft = noisy(truth.prefill_ms_per_token * plen + truth.verify_ms(1, plen))
                steps = [noisy(truth.verify_ms(1, plen + i)) for i in range(1, max_new_tokens)]
                wall_ms = ttft + sum(steps)
                gen_rows.append(GenerationRow(cell_id=cid, prompt_id=pid, domain=dom, mode="baseline",
                                 prompt_tokens=plen, new_tokens=max_new_tokens, wall_s=wall_ms / 1e3,
                                 tokens_per_s=max_new_tokens / (wall_ms / 1e3), ttft_ms=ttft,
                                 peak_mem_bytes=0, outputs_identical=True))
                lat_rows += [TokenLatencyRow(cell_id=cid, prompt_id=pid, mode="baseline", token_index=i,
                              latency_ms=v) for i, v in enumerate([ttft] + steps)]
                # speculative: same prefill, then rounds replaying the trace
                ttft_s = noisy(truth.prefill_ms_per_token * plen + truth.verify_ms(1, plen))
                lat_rows.append(TokenLatencyRow(cell_id=cid, prompt_id=pid, mode="speculative", token_index=0,
                                 latency_ms=ttft_s))
                produced, rnd, spec_ms = 1, 0, ttft_s
                while produced < max_new_tokens:
                    ctx = plen + produced
                    t = produced  # the next token's position; position 0 came from the prefill
                    dr = min(proposed[t], g, max_new_tokens - produced - 1)
                    acc = min(runs[t], dr)
                    dms = sum(noisy(truth.draft_ms(d, ctx + i, k)) for i in range(dr))
                    vms = noisy(truth.verify_ms(dr + 1, ctx))
                    oms = noisy(truth.overhead_ms)
                    round_rows.append(RoundRow(cell_id=cid, prompt_id=pid, round=rnd, gamma=g,
                                       context_tokens=ctx, drafted=dr, accepted=acc,
                                       draft_ms=dms, verify_ms=vms, overhead_ms=oms))
                    emitted = acc + 1
                    rt = dms + vms + oms
                    lat_rows += [TokenLatencyRow(cell_id=cid, prompt_id=pid, mode="speculative",
                                  token_index=produced + j, latency_ms=rt if j == 0 else 0.0)
                                 for j in range(emitted)]
                    spec_ms += rt
                    produced += emitted
                    rnd += 1
                    tot["acc"] += acc
                    tot["drafted"] += dr
                gen_rows.append(GenerationRow(cell_id=cid, prompt_id=pid, domain=dom, mode="speculative",
                                 prompt_tokens=plen, new_tokens=max_new_tokens, wall_s=spec_ms / 1e3,
                                 tokens_per_s=max_new_tokens / (spec_ms / 1e3), ttft_ms=ttft_s,
                                 peak_mem_bytes=0, outputs_identical=True))
                tot["base_tok"] += max_new_tokens
                tot["base_s"] += wall_ms / 1e3
                tot["spec_tok"] += max_new_tokens
                tot["spec_s"] += spec_ms / 1e3
                tot["rounds"] += rnd
            w.append("generations", gen_rows)
            w.append("rounds", round_rows)
            w.append("token_latency", lat_rows)
            w.append("traces", trace_rows)
            tps_b = tot["base_tok"] / tot["base_s"]
            tps_s = tot["spec_tok"] / tot["spec_s"]
            row = CellRow(cell_id=cid, draft=d, gamma_policy=f"fixed:{g}", gamma=g, temperature=0.0,
                   domain=dom, head_k=k, n_prompts=prompts_per_domain,
                   new_tokens=tot["spec_tok"], tokens_per_s_baseline=tps_b,
                   tokens_per_s_speculative=tps_s, tokens_per_s_peer=None, speedup=tps_s / tps_b,
                   acceptance_rate=tot["acc"] / tot["drafted"],
                   mean_accepted_per_round=tot["acc"] / tot["rounds"], n_rounds=tot["rounds"],
                   outputs_identical=True, synthetic=False)
            w.finish_cell(row)
            if best is None or row.speedup > best.speedup:
                best = row
    if with_head_sweep:
        sweep = []
        for variant, shift in (("dense", 0.0), ("clustered", 0.03), ("frequency", -0.02)):
            for kk in (1024, 4096, 16384, 32768):
                a = min(0.95, 0.5 + 0.06 * np.log2(kk / 1024) + shift)
                dms = truth.draft_ms("small", 64, kk)
                head = truth.draft_ms_per_head_k * kk
                tps = 1000.0 / (dms + 10)
                speedup = 1 + a - dms / 20
                sweep.append(HeadSweepRow(variant=variant, head_k=kk, head_ms=head, draft_step_ms=dms,
                              acceptance_rate=a, tokens_per_s=tps, speedup=speedup,
                              head_fast_ms=0.9 * head, tokens_per_s_baseline=tps / speedup,
                              e2e_acceptance_rate=a, mean_accepted_per_round=4 * a, kept_recall=a,
                              n_eval_tokens=128, outputs_identical=True, model="target",
                              draft=pruned_draft, vocab_size=32768, gamma=4, synthetic=True))
        w.append("head_sweep", sweep)
    w.update(summary={"tokens_per_s_baseline": best.tokens_per_s_baseline,
                      "tokens_per_s_speculative": best.tokens_per_s_speculative,
                      "speedup": best.speedup, "acceptance_rate": best.acceptance_rate,
                      "mean_accepted_per_round": best.mean_accepted_per_round,
                      "outputs_identical": True, "best_cell": best.cell_id})
    w.close("complete")
    return truth
