"""``python -m calibrate trees RUN_DIR`` — fit token-tree acceptance and cost to a tree run, predict held-out
shapes, say whether branching pays.

Examples::

    python -m calibrate trees runs/trees          # also: python -m calibrate runs/trees (a tree run is recognised)
    python -m calibrate trees runs/trees --max-budget 12 --max-depth 4 --out runs/trees-cal

Prints the fitted positional acceptance ``p[d][r]`` (95% Wilson intervals) and
the round cost's in-loop factors, every cell measured (95% CI) beside its
held-out prediction (leave one shape out: :mod:`calibrate.trees`), the
held-out speedup MAPE and the share inside the measured CIs for chains and
trees side by side against the targets (5%, 80%), then the advice for the
measured pair — the best chain and the best tree per verify budget, whether
branching pays, SGLang's three flags and a vLLM ``speculative_token_tree``
(:mod:`sim.tree_advice`), each with the 95% interval of its predicted speedup
over bootstrap refits of the acceptance. Writes into the calibration directory
(default ``RUN_DIR/calibration``): ``tree_calibration.json``,
``tree_predictions.csv``, ``tree_acceptance.csv``, ``tree_curves.csv`` (speedup
against verify budget, for the report), ``positional.json`` and
``cost_model-tree.json`` (``python -m sim tree --acceptance FILE --cost-model
FILE`` reads them) and ``advice.json``; ends with one JSON line. Bad input —
and a run whose tables its writer could not have written
(:func:`calibrate.checks.check_tree_run`: a row written twice, torn or lost, a
missing file or column, a value out of range) — is one line naming the file,
exit status 2, and nothing written.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Sequence

from measure.runkinds import TREES
from toolkit.cli import OneLineParser, check_output_dir, fail, int_arg, nonempty_arg
from toolkit.files import path_from

PROG = "python -m calibrate trees"
ADVICE_BUDGET_LIMIT = 64


def build_parser() -> OneLineParser:
    """The options of ``python -m calibrate trees``."""
    p = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("run", metavar="RUN_DIR", type=nonempty_arg("run directory"),
                   help="a run directory written by python -m measure tree")
    p.add_argument("--max-budget", type=int_arg(1, ADVICE_BUDGET_LIMIT), default=None,
                   help="largest verify budget the advice searches (default: the cost curves' largest token count "
                        "less the root, at most 16)")
    p.add_argument("--max-depth", type=int_arg(1, 64), default=None,
                   help="deepest tree the advice searches (default: the deepest depth the acceptance was fitted at)")
    p.add_argument("--bootstrap", type=int_arg(2, 10_000), default=200,
                   help="acceptance refits behind each advised speedup's 95%% interval (default 200)")
    p.add_argument("--seed", type=int_arg(0, 2**31 - 1), default=0, help="seed of the bootstrap (default 0)")
    p.add_argument("--out", default=None, type=nonempty_arg("directory"),
                   help="output directory (default: RUN_DIR/calibration)")
    p.add_argument("--allow-incomplete", action="store_true", help="use a run that is not complete")
    return p


def _f(v: float | None, nd: int = 2) -> str:
    return "-" if v is None or v != v else f"{v:.{nd}f}"


def print_acceptance(table) -> None:
    """``p[d][r]`` per depth, each with its 95% Wilson interval."""
    for d, sub in table.groupby("depth"):
        cells = "  ".join(f"r{int(r.rank)} {r.p:.3f} [{r.p_lo:.3f},{r.p_hi:.3f}]" for r in sub.itertuples())
        print(f"  depth {d} ({int(sub['trials'].iloc[0])} positions): {cells}")


def print_predictions(pred) -> None:
    """Every cell: measured speedup [95% CI] beside its held-out prediction."""
    held = pred[pred["split"] == "held_out"]
    print(f"  {'kind':5s} {'loop':5s} {'shape':30s} {'nodes':>5s} {'meas':>6s} {'95% CI':>13s} {'pred':>6s} "
          f"{'err%':>6s} in CI")
    for r in held.itertuples():
        ci = f"[{_f(r.measured_speedup_lo)},{_f(r.measured_speedup_hi)}]"
        inside = {True: "yes", False: "no"}.get(r.inside_ci, "-")
        print(f"  {r.kind:5s} {r.loop:5s} {str(r.shape)[:30]:30s} {int(r.n_nodes):5d} {_f(r.measured_speedup, 3):>6s} "
              f"{ci:>13s} {_f(r.predicted_speedup, 3):>6s} {_f(r.ape_speedup_pct, 1):>6s} {inside:>5s}")


def print_summary(summary: dict) -> None:
    """The held-out error per kind (chains and trees side by side), against the targets."""
    names = {"all": "chains + trees", "chain": "chains", "tree": "trees", "beam": "beams (apart)"}
    for name, v in summary.get("held_out", {}).items():
        share = (f"{v['n_inside_ci']}/{v['n_with_ci']} ({100 * v['share_inside_ci']:.0f}%)"
                 if v["share_inside_ci"] is not None else "n/a")
        print(f"held-out {names[name]:15s} speedup MAPE {v['speedup_mape_pct']:5.2f}% (max {v['max_ape_pct']:.1f}%, "
              f"{v['n_cells']} cells); inside the measured 95% CI: {share}")
    t = summary.get("targets")
    if t:
        print(f"targets: MAPE <= {t['speedup_mape_pct']:g}%: {'met' if t['mape_met'] else 'MISSED'}; "
              f">= {100 * t['share_inside_ci']:.0f}% inside: {'met' if t['inside_met'] else 'MISSED'}")


def advise(res, args, context_tokens: float) -> tuple[dict, str, dict]:
    """The advice document (:func:`sim.tree_cli.run_advice` on the all-cell fit), its text, and the 95% interval
    of each advised tree's predicted speedup."""
    from calibrate.trees import advice_intervals, bootstrap_acceptance
    from sim.tree_cli import TreeSetup, format_advice, run_advice

    m = res.models
    assert m.tree_cost is not None
    cost = m.tree_cost.model
    budget = args.max_budget or max(1, min(max(cost.verify_ms_by_tokens) - 1, 16))
    depth = min(args.max_depth or m.acceptance.depths, budget)
    setup = TreeSetup(None, budget, depth, True, m.acceptance, None, cost, None, None, context_tokens, 1, "analytic",
                      1, args.seed, ("fitted by python -m calibrate trees to " + str(res.data.path),))
    doc = run_advice(setup)
    draws = bootstrap_acceptance(res.data, res.data.cells, m.acceptance, args.bootstrap, args.seed)
    ci = advice_intervals(doc, cost, draws, context_tokens)
    return doc, format_advice(doc), ci


def _check_run(run: Path) -> None:
    from calibrate.trees import is_tree_run

    if not (run / "run.json").is_file():
        fail(PROG, f"{str(run)!r} is not a run directory (no run.json); write one with python -m measure tree")
    if not is_tree_run(run):
        fail(PROG, f"{str(run)!r} is not a tree run; write one with python -m measure tree, or calibrate a sweep "
                   "with python -m calibrate RUN_DIR")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m calibrate trees``: 0 on success, 2 with one line on bad input."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    run = Path(args.run)
    _check_run(run)
    out = Path(args.out) if args.out else run / TREES.calibration_dir
    try:
        from calibrate.trees import acceptance_table, calibrate_trees, curve_rows, load_trees, mean_context

        data = load_trees(run, allow_incomplete=args.allow_incomplete)  # checked before --out is made: on bad
        check_output_dir("--out", out)  # tables nothing is written, not even the directory
        res = calibrate_trees(data)
        if res.models.tree_cost is None:
            raise ValueError(f"{run}: no tree cell (only chains): nothing to advise on trees")
        ctx = mean_context(res.data)
        doc, text, ci = advise(res, args, ctx)
        acc_table = acceptance_table(res.models.counts)
        curves = curve_rows(res.models, doc["budget"], doc["max_depth"], ctx)
    except ValueError as exc:
        print(f"{PROG}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    m = res.models
    print(f"{PROG}: {run} — draft {res.data.cells['draft'].iloc[0]}, {len(res.data.cells)} cells")
    print("positional acceptance p[d][r] (95% Wilson interval), fitted on every cell:")
    print_acceptance(acc_table)
    print("tree round cost, in-loop factors on the cost curves: "
          + ", ".join(f"{k} {v:.4g}" for k, v in (m.tree_cost.factors if m.tree_cost else {}).items()))
    print("every cell, measured against its held-out prediction (leave one shape out):")
    print_predictions(res.predictions)
    print_summary(res.summary)
    print()
    print(text)
    for name, (lo, hi) in ci.items():
        print(f"95% interval of the predicted speedup, {name.replace('_', ' ')}: [{_f(lo, 3)}, {_f(hi, 3)}] "
              f"({args.bootstrap} bootstrap refits of the acceptance, cost held fixed)")
    if doc["best_tree"]["speedup"] < 1 and doc["best_chain"]["speedup"] < 1:
        print(f"note: no chain or tree beats the baseline here (best {doc['best_tree']['speedup']:.3f}x): this draft "
              "costs more than its accepted tokens save on this machine; decode without speculation")
    for note in res.notes:
        print(f"note: {note}", file=sys.stderr)
    advice = {**doc, "speedup_intervals": {k: list(v) for k, v in ci.items()}, "context_tokens": ctx}
    cal = {"run": path_from(out, run), "draft": str(res.data.cells["draft"].iloc[0]), "summary": res.summary,
           "acceptance": m.acceptance.to_dict(), "tree_cost": m.tree_cost.as_dict() if m.tree_cost else None,
           "chain_cost": m.chain_cost.as_dict() if m.chain_cost else None, "notes": list(res.notes),
           "advice": {"answer": doc["answer"], "verdict": doc["verdict"], "sglang": doc["sglang"]["command"],
                      "vllm": doc["vllm"]["command"]}}
    from calibrate.written import CalibrationFiles, write_calibration  # each model checked as python -m sim reads it

    try:
        write_calibration(out, CalibrationFiles(
            {TREES.calibration_file: cal, "advice.json": advice, "positional.json": m.acceptance.to_dict(),
             **({"cost_model-tree.json": m.tree_cost.model.describe()} if m.tree_cost else {})},
            {"tree_predictions.csv": res.predictions, "tree_acceptance.csv": acc_table, "tree_curves.csv": curves}))
    except ValueError as exc:
        fail(PROG, exc)
    print(f"written to {out}")
    print(json.dumps({"out": str(out), "summary": res.summary, "verdict": doc["verdict"]}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
