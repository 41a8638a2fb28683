"""calibrate trees: positional acceptance and the tree round cost recovered from synthetic records with known
values (seeded), held-out errors, and ``python -m calibrate trees`` on the committed tree run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibrate.errors import add_errors
from calibrate.trees import RankCounts, error_summary, fit_positional, fit_tree_cost, rank_counts, shape_kind
from sim.cost import TabulatedCost
from sim.trees import PositionalAcceptance, TokenTree, expected_accepted_length

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "results" / "cpu-trees-smollm2-int8"

P_TRUE = ((0.5, 0.15, 0.08, 0.05), (0.6, 0.12, 0.05, 0.03), (0.65, 0.1, 0.04, 0.02))


def _sample_ranks(tree: TokenTree, p: tuple, rounds: int, seed: int) -> pd.DataFrame:
    """``tree_ranks`` rows of ``rounds`` tree rounds under positional acceptance ``p`` (what the measure side
    records: every position the target decided whose parent the draft ranked, with the token's rank there)."""
    rng = np.random.default_rng(seed)
    nodes = set(tree.paths)
    rows = []
    for i in range(rounds):
        node: tuple[int, ...] = ()
        for d in range(1, tree.depth + 2):
            if not any(q[:-1] == node for q in nodes):  # a leaf: the draft never ranked its children
                break
            row = p[min(d, len(p)) - 1]
            u = rng.random()
            cum = np.cumsum(row)
            rank = int(np.searchsorted(cum, u, side="right"))
            rows.append({"cell_id": "c", "prompt_id": f"p{i % 7}", "repeat": i // 7, "round": i, "depth": d,
                         "rank": rank if rank < len(row) else -1, "candidates": 8})
            if rank >= len(row) or node + (rank,) not in nodes:
                break
            node = node + (rank,)
    return pd.DataFrame(rows)


def _sample_chain_rounds(alphas: tuple[float, ...], gamma: int, rounds: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(rounds):
        acc = 0
        while acc < gamma and rng.random() < alphas[min(acc, len(alphas) - 1)]:
            acc += 1
        out.append({"cell_id": "g", "prompt_id": "p", "repeat": 0, "round": i, "gamma": gamma, "drafted": gamma,
                    "accepted": acc})
    return pd.DataFrame(out)


def test_positional_acceptance_is_recovered_from_the_counterfactual_record():
    tree = TokenTree.from_branching((3, 2, 1))  # rank 2 at depth 1 is a leaf's sibling; depth 3 has rank 0 only
    ranks = _sample_ranks(tree, P_TRUE, 6000, seed=1)
    acc = fit_positional(rank_counts(ranks, ranks.iloc[:0]), "synthetic")
    assert acc.depths == 3 and all(len(row) == 8 for row in acc.p)  # every rank the record holds, not only drafted
    for d, row in enumerate(P_TRUE):
        counts = rank_counts(ranks, ranks.iloc[:0])
        n = counts.trials[d]
        for r, p in enumerate(row):
            se = math.sqrt(p * (1 - p) / n)
            assert abs(acc.p[d][r] - p) < 4 * se + 1e-9, (d, r, acc.p[d][r], p, n)
    # E[tau] of a tree never drafted (a different shape) comes out as the true model says, within a few percent
    other = TokenTree.parse("[[0],[1],[0,0],[0,1],[1,0],[0,0,0]]")
    truth = expected_accepted_length(other, PositionalAcceptance(P_TRUE))
    assert abs(expected_accepted_length(other, acc) - truth) / truth < 0.02


def test_chain_rounds_add_rank_zero_trials():
    alphas = (0.7, 0.6, 0.5)
    chains = _sample_chain_rounds(alphas, 4, 5000, seed=2)
    counts = rank_counts(chains.iloc[:0].assign(depth=[], rank=[], candidates=[]), chains)
    acc = fit_positional(counts, "chains")
    assert all(len(row) == 1 for row in acc.p)  # chains rank nothing past the top candidate
    for d, a in enumerate((0.7, 0.6, 0.5, 0.5)):
        n = counts.trials[d]
        assert abs(acc.p[d][0] - a) < 4 * math.sqrt(a * (1 - a) / n), (d, acc.p[d][0], a)


def test_too_few_positions_is_one_line():
    with pytest.raises(ValueError, match="fewer than 20 ranked positions"):
        fit_positional(RankCounts((5,), ((3, 1, 0, 0, 0, 0, 0, 0),), (True,)), "x")


def _base_cost() -> TabulatedCost:
    return TabulatedCost(verify_ms_by_tokens={1: 20.0, 2: 24.0, 4: 30.0, 8: 42.0, 16: 70.0}, draft_step_ms_ref=8.0,
                         reference_context_tokens=200.0, target_context_ms_per_token=0.01,
                         draft_context_ms_per_token=0.004)


def test_tree_cost_factors_are_recovered_from_rounds():
    """Rounds generated from known in-loop factors (with noise, seeded) give the factors back, and the folded
    cost model prices a tree round as the generating formula does."""
    rng = np.random.default_rng(3)
    base = _base_cost()
    truth = {"s_draft": 1.3, "c_draft": 0.4, "s_verify": 1.1, "a_verify": 2.0, "a_overhead": 0.5, "c_overhead": 0.1}
    shapes = {"a": (3, 5), "b": (4, 9), "c": (2, 2), "d": (5, 12)}  # cell -> (depth, nodes)
    rounds, nodes = [], []
    for cell, (depth, n) in shapes.items():
        for i in range(200):
            ctx = float(rng.uniform(100, 300))
            draft = truth["s_draft"] * depth * base.draft_step_ms(ctx) + truth["c_draft"] * n
            verify = truth["s_verify"] * base.verify_ms(n + 1, ctx) + truth["a_verify"]
            over = truth["a_overhead"] + truth["c_overhead"] * n
            rounds.append({"cell_id": cell, "prompt_id": "p", "repeat": 0, "round": i, "context_tokens": ctx,
                           "draft_ms": draft * rng.normal(1, 0.02), "verify_ms": verify * rng.normal(1, 0.02),
                           "overhead_ms": over * rng.normal(1, 0.02)})
            nodes += [{"cell_id": cell, "prompt_id": "p", "repeat": 0, "round": i, "node": j,
                       "depth": min(j + 1, depth)} for j in range(n)]
    fit = fit_tree_cost(base, pd.DataFrame(rounds), pd.DataFrame(nodes), {c: d for c, (d, _) in shapes.items()})
    for k, v in truth.items():
        assert fit.factors[k] == pytest.approx(v, rel=0.15, abs=0.1), (k, fit.factors[k], v)
    tree = TokenTree.parse("[[0],[1],[0,0],[1,0],[0,0,0]]")  # 5 nodes, depth 3: a shape the fit never saw
    from sim.trees import tree_round_cost

    rc = tree_round_cost(tree, fit.model, 250.0)
    want = (truth["s_draft"] * 3 * base.draft_step_ms(250.0) + truth["c_draft"] * 5
            + truth["s_verify"] * base.verify_ms(6, 250.0) + truth["a_verify"] + truth["a_overhead"]
            + truth["c_overhead"] * 5)
    assert rc.draft_ms + rc.verify_ms + rc.overhead_ms == pytest.approx(want, rel=0.03)
    assert fit.model.target_step_ms(250.0) == base.target_step_ms(250.0)  # the baseline step is not rescaled


def test_error_summary_keeps_beams_apart_and_says_the_targets():
    rows = []
    for kind, meas, pred in (("chain", 1.0, 1.02), ("tree", 1.1, 1.0), ("beam", 1.2, 0.6)):
        rows.append({"kind": kind, "split": "held_out", "measured_speedup": meas, "predicted_speedup": pred,
                     "measured_speedup_lo": meas - 0.05, "measured_speedup_hi": meas + 0.05,
                     "measured_tokens_per_s": 10 * meas, "predicted_tokens_per_s": 10 * pred})
    s = error_summary(add_errors(pd.DataFrame(rows)))
    head = s["held_out"]["all"]
    assert head["n_cells"] == 2 and head["speedup_mape_pct"] == pytest.approx((2.0 + 100 * 0.1 / 1.1) / 2)
    assert head["n_inside_ci"] == 1 and s["held_out"]["beam"]["n_cells"] == 1
    assert s["targets"]["mape_met"] is False and s["targets"]["inside_met"] is False


def test_shape_kinds():
    def cell(loop, shape, depth, topk, budget):
        return pd.Series({"loop": loop, "shape": shape, "depth": depth, "topk": topk, "budget": budget})

    assert shape_kind(cell("chain", "gamma=3", 3, 1, 3)) == "chain"
    assert shape_kind(cell("tree", "[[0],[0,0]]", 2, 1, 2)) == "chain"
    assert shape_kind(cell("tree", "[[0],[1],[0,0]]", 2, 2, 3)) == "tree"
    assert shape_kind(cell("tree", "depth=3,topk=1,budget=3", 3, 1, 3)) == "chain"
    assert shape_kind(cell("tree", "depth=3,topk=2,budget=5", 3, 2, 5)) == "beam"


# -- the command line, on the committed tree run ----------------------------------------------------------
def test_calibrate_trees_cli_on_the_committed_run(tmp_path, capsys):
    from calibrate.__main__ import main

    assert (RUN / "run.json").is_file(), "the committed tree run (results/cpu-trees-smollm2-int8)"
    out = tmp_path / "cal"
    assert main([str(RUN), "--out", str(out), "--bootstrap", "20"]) == 0  # a tree run is recognised as such
    text = capsys.readouterr().out
    assert "held-out chains + trees" in text and "--speculative-num-steps" in text and "speculative_token_tree" in text
    summary = json.loads(text.strip().splitlines()[-1])["summary"]
    assert {"chain", "tree"} <= set(summary["held_out"])
    pred = pd.read_csv(out / "tree_predictions.csv")
    assert set(pred["split"]) == {"in_sample", "held_out"} and (pred["predicted_speedup"] > 0).all()
    curves = pd.read_csv(out / "tree_curves.csv")
    assert {"chain (tree loop)", "best tree"} <= set(curves["series"])
    run = json.loads((out / "tree_calibration.json").read_text())["run"]
    assert not Path(run).is_absolute() and (out / run).resolve() == RUN.resolve()  # relative to the calibration
    from sim.tree_cli import main as sim_tree

    assert sim_tree(["--budget", "6", "--max-depth", "4", "--advise", "--acceptance", str(out / "positional.json"),
                     "--cost-model", str(out / "cost_model-tree.json"), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] in ("pays", "marginal", "does not pay")


@pytest.mark.parametrize("argv, needle", [
    (["trees", "/no/such/run"], "not a run directory"),
    (["trees", str(ROOT / "results" / "cpu-small-run-fresh-1")], "not a tree run"),
    (["trees", str(RUN), "--max-budget", "0"], "--max-budget"),
])
def test_calibrate_trees_bad_input_is_one_line(argv, needle, capsys):
    from calibrate.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err
