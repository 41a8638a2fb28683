"""Rank of the target's greedy token among a draft's candidates, teacher-forced (depth-1 positional acceptance).

For each draft: the target generates greedily from each prompt; the draft scores the same sequence in one
forward; at every generated position the target's token has rank r in the draft's logits (0 = the draft's
argmax). p_r = share of positions at rank r; top-k recall = share at rank < k. 95% CIs: percentile
bootstrap over sequences (2000 resamples, seed 0). Printed as a table and one JSON line.
"""
import json
import sys
import time
import numpy as np
import torch
from measure.engines.transformers.models import load_model
from measure.engines.transformers.drafts import make_draft
from measure.prompts import DOMAINS, load_prompts, encode_prompt
from measure.decoding import autoregressive_generate
from sim.rank_law import RankLaw, recall_curve

target_spec, drafts, n_prompts, new_tokens = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4])
torch.manual_seed(0)
torch.set_num_threads(2)
t0 = time.time()
target = load_model(target_spec)
seqs = []
for dom in DOMAINS:
    for pr in load_prompts(dom, n_prompts, seed=0):
        ids = encode_prompt(pr, target)
        gen = autoregressive_generate(target.new_decoder(), ids, 0.0, new_tokens, eos_token_ids=target.eos_token_ids)
        seqs.append((ids.shape[1], torch.cat([ids, torch.tensor([gen.tokens])], dim=1)))
K = 10
out = {"target": target_spec, "prompts_per_domain": n_prompts, "new_tokens": new_tokens, "sequences": len(seqs),
       "drafts": {}}
for spec in drafts:
    draft = make_draft(spec, target)
    per_seq = []
    with torch.inference_mode():
        for plen, toks in seqs:
            logits = draft.model(input_ids=toks[:, :-1]).logits[0, plen - 1:].float()  # [n, V]
            tgt = toks[0, plen:]
            score = logits.gather(1, tgt[:, None])
            per_seq.append((logits > score).sum(1).numpy())
    ranks = np.concatenate(per_seq)
    hits = np.array([[np.mean(r < k) for k in range(1, K + 1)] for r in per_seq])  # per-sequence recall
    w = np.array([len(r) for r in per_seq], dtype=float)
    recall = np.array([np.mean(ranks < k) for k in range(1, K + 1)])
    rng = np.random.default_rng(0)
    boot = []
    for _ in range(2000):
        i = rng.integers(len(per_seq), size=len(per_seq))
        boot.append((hits[i] * w[i, None]).sum(0) / w[i].sum())
    lo, hi = np.percentile(boot, [2.5, 97.5], axis=0)
    a = recall[0]
    law = recall_curve(a, RankLaw("power"), K)
    geo = recall_curve(a, RankLaw("geometric"), K)
    out["drafts"][spec] = {"positions": int(ranks.size), "recall": recall.tolist(), "ci_low": lo.tolist(),
                           "ci_high": hi.tolist(), "power_law": law.tolist(), "geometric_law": geo.tolist(),
                           "power_rmse_top2_5": float(np.sqrt(np.mean((law - recall)[1:5] ** 2))),
                           "geometric_rmse_top2_5": float(np.sqrt(np.mean((geo - recall)[1:5] ** 2))),
                           "power_rmse_top2_10": float(np.sqrt(np.mean((law - recall)[1:] ** 2)))}
    print(f"{spec:12s} n={ranks.size}  top-k recall k=1..{K}: " + " ".join(f"{x:.3f}" for x in recall))
    print(f"{'':12s} 95% CI low         " + " ".join(f"{x:.3f}" for x in lo))
    print(f"{'':12s} 95% CI high        " + " ".join(f"{x:.3f}" for x in hi))
    print(f"{'':12s} power law          " + " ".join(f"{x:.3f}" for x in law))
    print(f"{'':12s} geometric law      " + " ".join(f"{x:.3f}" for x in geo))
out["seconds"] = time.time() - t0
print(json.dumps(out))
