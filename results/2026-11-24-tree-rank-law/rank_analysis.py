"""What the power rank law's error does to a tree: E[tau] of optimal trees under the measured ranks vs the law's.

Reads the JSON line of rank_measure.py. Per draft: p_r from the measured top-1..10 recall (every depth the same,
as a teacher-forced measurement gives), the law's p_r from the measured top-1; for budgets 4, 8, 16 (depth <= 5):
E[tau] of the best tree under the measured p, the law's prediction for its own best tree, and the measured-p
E[tau] of the law's best tree (what following the law's advice would give).
"""
import json
import sys
import numpy as np
from sim.rank_law import RankLaw
from sim.trees import PositionalAcceptance, expected_accepted_length
from sim.tree_search import optimal_tree

doc = json.loads([ln for ln in open(sys.argv[1]) if ln.startswith("{")][-1])
print("| draft | top-1 | budget | E[tau] best tree, measured ranks | E[tau] law's best tree, law | law error | E[tau] law's best tree, measured ranks | regret |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
rows = []
for spec, d in doc["drafts"].items():
    recall = np.array(d["recall"])
    measured = PositionalAcceptance((tuple(np.diff(np.concatenate([[0.0], recall]))),))
    law = RankLaw().extend(PositionalAcceptance.from_chain([recall[0]]))
    for n in (4, 8, 16):
        best_m = optimal_tree(measured, n, 5)
        best_l = optimal_tree(law, n, 5)
        e_m = expected_accepted_length(best_m, measured)
        e_l = expected_accepted_length(best_l, law)
        e_lm = expected_accepted_length(best_l, measured)
        rows.append({"draft": spec, "alpha": recall[0], "budget": n, "measured": e_m, "law": e_l, "law_on_measured": e_lm})
        print(f"| {spec} | {recall[0]:.3f} | {n} | {e_m:.3f} | {e_l:.3f} | {100 * (e_l / e_m - 1):+.1f}% | {e_lm:.3f} | {100 * (e_lm / e_m - 1):+.2f}% |")
print(json.dumps(rows))
