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
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import pandas as pd
import torch
from torch import nn

from measure.head.clusters import ClusterConfig, load_or_build_clusters
from measure.drafts import ModelDraft, make_draft
from measure.head.head_sweep import _calibration_counts, draft_moment, head_inputs
from measure.head.lowrank import HiddenMoment, fit_lowrank
from measure.models import load_model
from measure.prompts import DOMAINS, load_prompts
from measure.records import strict_dumps
from measure.head.pruned_head import PrunedLMHead

__all__ = ["recall_table", "main"]

DEFAULT_KS = (500, 1000, 3000, 10000, 30000)


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
def recall_table(heads: dict[str, PrunedLMHead], dense: nn.Linear, hidden: torch.Tensor, domains: list[str],
                 chunk: int = 256) -> pd.DataFrame:
    """One row per (selector, K, domain or 'all'): positions whose dense argmax is kept."""
    argmax = torch.cat([dense(hidden[s:s + chunk]).argmax(-1) for s in range(0, hidden.shape[0], chunk)])
    dom = pd.Series(domains)
    rows = []
    for name, head in heads.items():
        hit = torch.cat([(head.select(hidden[s:s + chunk]) == argmax[s:s + chunk, None]).any(1)
                         for s in range(0, hidden.shape[0], chunk)]).numpy()
        for d in ["all"] + sorted(set(domains)):
            m = slice(None) if d == "all" else (dom == d).to_numpy()
            n, k = int(hit[m].size), int(hit[m].sum())
            lo, hi = _wilson(k, n)
            rows.append({"selector": name.rsplit("@", 1)[0], "head_k": head.head_k, "domain": d, "positions": n,
                         "recall": k / n if n else float("nan"), "ci95_low": lo, "ci95_high": hi})
    return pd.DataFrame(rows)


def _ints(text: str, option: str) -> list[int]:
    out = []
    for t in (x.strip() for x in str(text).split(",")):
        if not t:
            continue
        try:
            out.append(int(t))
        except ValueError:
            raise ValueError(f"{option} value {t!r} is not an integer (comma-separated integers expected)") from None
    return out


# long: a CLI entry: argument checks (one-line errors before any model loads), then the recall table
def main(argv: list[str] | None = None) -> int:
    """``python -m measure head-recall``: one-line errors (exit 2) before any model loads."""
    from toolkit.cli import OneLineParser, csv_items, int_arg
    from measure.head.head_sweep import MAX_HEAD_K, check_model_draft

    prog = "python -m measure head-recall"
    ap = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma3-270m", help="target model spec (default %(default)s)")
    ap.add_argument("--draft", default="bf16", help="model-backed draft whose head is pruned (default %(default)s)")
    ap.add_argument("--ks", default=",".join(map(str, DEFAULT_KS)), help="head sizes K (comma list, each >= 1)")
    ap.add_argument("--ranks", default="32,64", help="ranks of the low-rank scorer (comma list, each >= 1)")
    ap.add_argument("--domains", default="code,conversation")
    ap.add_argument("--prompts-per-domain", type=int_arg(1, 10_000), default=40)
    ap.add_argument("--max-tokens", type=int_arg(2, 1_000_000), default=256,
                    help="tokens of held-out text per prompt (>= 2: one position is predicted from the one before)")
    ap.add_argument("--n-clusters", type=int_arg(1, MAX_HEAD_K), default=3000)
    ap.add_argument("--moment-texts", type=int_arg(1, 100_000), default=64)
    ap.add_argument("--calibration-texts", type=int_arg(1, 100_000), default=300)
    ap.add_argument("--seed", type=int_arg(0, 2**31 - 1), default=0)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--out", required=True, help="directory for recall.csv and recall.json")
    args = ap.parse_args(argv)
    out = Path(args.out)
    try:
        ks = _ints(",".join(csv_items("--ks", args.ks, prog)), "--ks")
        ranks = _ints(",".join(csv_items("--ranks", args.ranks, prog)), "--ranks")
        for k in ks:
            if not 1 <= k <= MAX_HEAD_K:
                raise ValueError(f"--ks {k}: each K must be in 1..{MAX_HEAD_K} (below the vocabulary size)")
        for r in ranks:
            if not 1 <= r <= 65_536:
                raise ValueError(f"--ranks {r}: each rank must be in 1..65536")
        check_model_draft(args.draft)
        domains = tuple(csv_items("--domains", args.domains, prog))
        for d in domains:
            if d not in DOMAINS:
                raise ValueError(f"--domains {d!r}: unknown domain; valid: {', '.join(DOMAINS)}")
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {str(out)!r} is a file, not a directory; choose a directory path")
        try:  # create and probe the output directory first, so results are never lost at the end
            out.mkdir(parents=True, exist_ok=True)
            (out / ".write_probe").write_text("")
            (out / ".write_probe").unlink()
        except OSError as e:
            raise ValueError(f"--out {str(out)!r} is not writable: {e.strerror or e}") from None
    except ValueError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    try:
        t0 = time.perf_counter()
        target = load_model(args.model, dtype="float32", seed=args.seed)
        draft = make_draft(args.draft, target, seed=args.seed + 1)
        if not isinstance(draft, ModelDraft) or not isinstance(getattr(draft.model, "lm_head", None), nn.Linear):
            raise ValueError(f"draft {args.draft!r} has no nn.Linear lm_head to prune")
        dmodel, dense = draft.model, draft.model.lm_head
        vocab, hsize = (int(x) for x in dense.weight.shape)
        for k in ks:
            if not 1 <= k < vocab:
                raise ValueError(f"--ks {k}: must be in 1..{vocab - 1} (the dense head is the reference)")
        eos = tuple(int(e) for e in target.eos_token_ids if 0 <= int(e) < vocab)
        counts, n_cal = _calibration_counts(target.tokenizer, args.calibration_texts, vocab)
        clusters, _ = load_or_build_clusters(dense.weight.detach().float(),
                                             ClusterConfig(n_clusters=min(args.n_clusters, vocab), seed=args.seed),
                                             args.cache_dir)
        moment, _, _ = draft_moment(dmodel, target.tokenizer, args.moment_texts, 256, args.cache_dir)
        hidden, doms = _held_out_states(dmodel, target.tokenizer, domains, args.prompts_per_domain,
                                        args.max_tokens, args.seed)
        w = dense.weight.detach().float()
        scorers = {}
        for r in ranks:
            scorers[f"lowrank-{r}"] = fit_lowrank(w, moment, min(r, hsize))
            scorers[f"lowrank-plain-{r}"] = fit_lowrank(w, HiddenMoment(torch.eye(hsize, dtype=torch.float64), 1),
                                                        min(r, hsize))
        heads: dict[str, PrunedLMHead] = {}
        for k in ks:
            heads[f"frequency@{k}"] = PrunedLMHead.frequency(dense, counts, k, always_keep=eos)
            for sc in ("cosine", "mean"):
                heads[f"clustered-{sc}@{k}"] = PrunedLMHead.clustered(dense, clusters, k, always_keep=eos, scoring=sc)
            for name, scorer in scorers.items():
                heads[f"{name}@{k}"] = PrunedLMHead.lowrank(dense, scorer, k, always_keep=eos)
        table = recall_table(heads, dense, hidden, doms)
    except ValueError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    table.to_csv(out / "recall.csv", index=False)
    meta = {"command": "python -m measure head-recall " + " ".join(sys.argv[1:] if argv is None else argv),
            "model": args.model, "draft": args.draft, "vocab_size": vocab, "positions": int(hidden.shape[0]),
            "calibration_tokens": n_cal, "moment_positions": moment.n,
            "logit_energy": {n: s.logit_energy for n, s in scorers.items()},
            "seconds": time.perf_counter() - t0}
    (out / "recall.json").write_text(strict_dumps(meta, indent=2))
    wide = table[table.domain == "all"].pivot(index="selector", columns="head_k", values="recall")
    print(wide.sort_values(wide.columns[len(wide.columns) // 2], ascending=False).to_string(float_format="%.4f"))
    print(strict_dumps(meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
