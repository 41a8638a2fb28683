"""A serving run directory whose truth is known: written from the serving simulator, for calibrate's tests.

:func:`make_serve_run` writes what ``python -m measure serve`` writes (run.json with config.kind = serve,
serve_units, serve_requests, serve_step_cost) for a server that *is* :func:`sim.serving.simulate_server` with a
given :class:`~sim.serving.LinearStepCost` (or :class:`~sim.serving.ForwardStepCost`), request overhead and acceptance per k, measurement noise drawn
per unit. The counters per unit are those llama-server would report for the unit's rounds (drafts, drafted
tokens, accepted per position), simulated with the same acceptance and the same draft cap.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from calibrate.serve import simulate_counters, unit_stats
from measure.runkinds import SERVE, open_run_dir
from measure.serve.units import LoadSpec, RequestRow, ServeConfig, StepCostRow, UnitId, UnitRow
from sim.acceptance import AcceptanceModel
from sim.serving import ClosedLoop, ForwardStepCost, LinearStepCost, OpenLoop, Workload, llama_server, simulate_server

TRUE_COST = LinearStepCost(base_ms=9.0, per_seq_ms=1.2, per_token_ms=1.6, per_prompt_token_ms=0.08, per_attn_ms=0.01)
TRUE_OVERHEAD_MS = 2.5


# long: writes every table of a run: the step-cost rows, then each unit's requests and row
def make_serve_run(path: Path, acceptance: dict[int, AcceptanceModel | list], loads: list[LoadSpec], slots: int = 4,
                   new_tokens: int = 48, n_requests: int = 12, repeats: int = 3, noise: float = 0.03,
                   prompts: tuple[int, ...] = (60, 140, 90), seed: int = 0,
                   true_cost: LinearStepCost | ForwardStepCost = TRUE_COST,
                   request_overhead_ms: float = TRUE_OVERHEAD_MS) -> Path:
    rng = np.random.default_rng(seed)
    n_ids = max([len(prompts)] + [len(a) for a in acceptance.values() if isinstance(a, list)])
    configs = [ServeConfig("off")] + [ServeConfig("ngram", k, 3) for k in sorted(acceptance)]
    meta = {"config": {"kind": "serve", "slots": slots, "max_new_tokens": new_tokens, "batch_tokens": 2048,
                       "requests": n_requests, "configs": [c.to_str() for c in configs]}, "command": "test"}
    w = open_run_dir(SERVE, path, meta=meta, fingerprint={"kind": "serve"})
    with w.recording():
        cid0 = "config=synth:k1:p64|slots=4|load=c1|repeat=0"
        cid_off = "config=synth:off:p64|slots=4|load=c1|repeat=0"
        rows = []
        for seqs in range(1, slots + 1):
            for t in (1, 2, 3, 5, 9):
                for ctx in (64.0, 192.0):
                    # synthetic acceptance: every slot drafts t - 1 tokens and emits one
                    attn = seqs * t * (ctx + 0.5 * (t + 1))
                    ms = true_cost.step_ms(seqs, seqs * t, t - 1, seqs * ctx, attn, 0, 0, seqs)
                    rows.append(StepCostRow(cid0 if t > 1 else cid_off, seqs, t, ctx, 20,
                                            ms * float(rng.lognormal(0, noise / 3)), None, None))
        for p in (32, 256):
            ms = request_overhead_ms + true_cost.step_ms(0, p, 0, 0.0, 0.5 * p * (p + 1), p, 1)
            rows.append(StepCostRow(cid0, 1, 1, float(p), 4, None, None, None, p, ms))
        w.append("serve_step_cost", rows)
        w.finish_cell(UnitRow(cid0, "synth:k1:p64", "ngram-simple", 1, 1, slots, "c1", 1, None, 0, 0, True,
                              0, 0, new_tokens, 0.0, 0, None, *([None] * 12), False, *([None] * 7),
                              0.0, 0.0, None, "test"))
        block = 0
        for r in range(repeats):
            for cfg in configs:
                for ld in loads:
                    uid = UnitId(cfg, slots, ld, r)
                    n_prompt = [prompts[i % len(prompts)] for i in range(n_requests)]
                    wl = Workload(n_requests, new_tokens, ClosedLoop(ld.concurrency) if ld.closed
                                  else OpenLoop(ld.rate_per_s), prompt_tokens=n_prompt,
                                  request_overhead_ms=request_overhead_ms)
                    # the machine's pace this unit: every step a little slower or faster
                    pace = float(rng.lognormal(0, noise))
                    cost = (true_cost.fitted(pace * true_cost.efficiency, pace * true_cost.overhead_ms)
                            if isinstance(true_cost, ForwardStepCost)
                            else LinearStepCost(*(pace * getattr(true_cost, f) for f in LinearStepCost.FIELDS)))
                    acc = acceptance.get(cfg.k)  # one model, or one per prompt
                    per_req = None if acc is None else ([acc[i % len(acc)] for i in range(n_requests)]
                                                        if isinstance(acc, list) else acc)
                    run = simulate_server(wl, llama_server(slots), cost, per_req, f"fixed:{cfg.k}" if acc else None,
                                          seed=int(rng.integers(2**31)))
                    st = unit_stats(run)
                    acc_req = run.tokens - 1 - run.request_rounds
                    reqs = [RequestRow(uid.to_str(), i, f"p{i % n_ids}", "code", float(run.send_ms[i]) / 1000,
                                       float(run.ttft_ms[i]), float(run.e2e_ms[i]), None, int(run.tokens[i]),
                                       int(run.tokens[i]), n_prompt[i], int(run.request_drafted[i]) if acc else None,
                                       int(acc_req[i]) if acc else None,
                                       None, None, None) for i in range(n_requests)]
                    w.append("serve_requests", reqs)
                    drafts = drafted = 0
                    pos = np.zeros(0, dtype=int)
                    if acc is not None:
                        models = acc if isinstance(acc, list) else [acc]
                        parts = [simulate_counters(m, cfg.k, new_tokens, max(n_requests, 50), rng) for m in models]
                        c = parts[0].__class__(cfg.k, sum(x.rounds for x in parts), sum(x.drafts for x in parts),
                                               sum(x.draft_tokens for x in parts),
                                               tuple(int(v) for v in np.sum([x.accepted_per_pos for x in parts], 0)))
                        drafts, drafted, pos = c.drafts, c.draft_tokens, np.asarray(c.accepted_per_pos)
                    e2e = run.e2e_ms
                    row = UnitRow(
                        uid.to_str(), cfg.to_str(), "ngram-simple" if acc else "none", cfg.k, cfg.ngram_n, slots,
                        ld.to_str(), ld.concurrency or None, ld.rate_per_s or None, r, block, False, n_requests, 0,
                        new_tokens, float(run.finish_ms.max() - run.send_ms.min()) / 1000, int(run.tokens.sum()),
                        st["throughput_tokens_per_s"], st["ttft_p50_ms"], None, None, st["tpot_p50_ms"], None, None,
                        None, None, None, st["e2e_p50_ms"], st["e2e_p95_ms"], float(np.percentile(e2e, 99)), True,
                        drafts if acc else 0, drafted if acc else 0, int(pos.sum()) if acc else 0,
                        " ".join(map(str, pos)) if acc else None, None, None, None, 0.01, 0.001, None, "test")
                    w.finish_cell(row)
                block += 1
    return path
