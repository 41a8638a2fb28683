"""Calibrate token trees against a tree run: fit positional acceptance and the round cost, predict held-out shapes.

A tree run (``python -m measure tree``, ``docs/RUN_FORMAT.md`` "Tree runs")
measures cells of several draft shapes — fixed token trees, per-round beams,
chains — against the baseline. This module fits, on the cells of a training
set:

* **Positional acceptance** (:func:`fit_positional`, Sequoia's ``p[d][r]``,
  :class:`sim.trees.PositionalAcceptance`) from the counterfactual record
  ``tree_ranks.csv``: at every position a tree round decided, the rank the
  target's token had among the draft's candidates at its parent. Any tree of
  any shape would have accepted its rank-``r`` child there exactly when that
  rank is ``r``, so ``p[d][r]`` = (positions at depth ``d`` whose rank is
  ``r``) / (positions at depth ``d`` that were ranked); a chain-loop cell's
  rounds add their rank-0 trials (``rounds.csv``: a round that reached depth
  ``d − 1`` and drafted a ``d``-th token). Each ``p`` carries its 95% Wilson
  interval.
* **The round cost** (:func:`fit_tree_cost`): the run's cost curves
  (``cost_target.csv`` / ``cost_draft.csv``, fitted as ``calibrate`` fits every
  run: :func:`calibrate.fit_cost.fit_cost`, which also gives the baseline's
  in-loop scale) priced into a tree round as ``sim.trees`` prices it —
  ``depth`` draft forwards, a verify of ``n + 1`` tokens, an overhead per
  round and per node — with the in-loop factors fitted to the training tree
  rounds by non-negative least squares::

      draft_ms    = s_draft · depth · draft_step(ctx)        + c_draft · n
      verify_ms   = s_verify · target_forward(n + 1, ctx)    + a_verify
      overhead_ms = a_overhead                               + c_overhead · n

  and folded into one :class:`sim.cost.TabulatedCost` (verify table × s_verify,
  draft step × s_draft, round overhead ``a_verify + a_overhead`` plus
  ``c_draft + c_overhead`` per node), so ``sim.trees.predict_tree`` and the
  advice price any tree with it. Chain-loop cells are priced by the chain
  calibration's own cost fit on the training chain cells
  (:func:`calibrate.fit_cost.fit_cost`: draft and verify scales, mean overhead).
* **Prefill**: ``ttft_ms = a + b · prompt_tokens`` on the training generations.

A cell is predicted as ``calibrate`` predicts a chain cell: per prompt, the
closed form at the mid-generation context gives ms per token of each side
(``sim.trees.predict_tree``; E[τ] from the acceptance), the generation's wall
time is ``ttft + (new_tokens − 1) · ms per token``, and the speedup is the
ratio of mean tokens/s, as measured. A fixed tree is evaluated as drafted; a
chain as the one-rank tree; a per-round beam (``depth=D,topk=K,budget=N``) as
the static tree of the same flags under the positional model
(:func:`sim.tree_search.sglang_tree`) — an approximation: the draft picks each
round's tree by its own confidence, which positional acceptance does not
describe, so beam cells are reported apart from the headline error.

Held-out validation (:func:`calibrate_trees`): leave one shape out — every
cell is predicted from acceptance, cost and prefill fitted on the *other*
cells only — and the speedup MAPE and the share of predictions inside the
measured 95% CI are reported for chains and trees side by side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from calibrate.checks import MAX_RANKS, check_tree_run
from calibrate.errors import HeldOutError, add_errors
from calibrate.fit_acceptance import wilson_ci
from calibrate.fit_cost import CostFit, LinearFit, fallback_lines, fit_cost, ols, target_curve
from calibrate.prediction import mean_tokens_per_s
from measure.costpoints import screen_target
from measure.records import Run, load_run
from measure.runkinds import TREES, kind_of, read_kind
from sim.cost import TabulatedCost
from sim.tree_search import sglang_tree
from sim.trees import PositionalAcceptance, TokenTree, TreePrediction, predict_tree

#: Fewest ranked positions at a depth for its row of ``p`` (deeper rows reuse the last one).
MIN_TRIALS = 20
#: Shape kinds, as reported: a fixed token tree, a chain (either loop), a per-round beam.
KINDS = ("tree", "chain", "beam")
#: Targets of the held-out error (issue 30's "done when").
MAPE_TARGET_PCT = 5.0
INSIDE_TARGET = 0.8
#: How ``tree_calibration.json`` ``summary`` names the fields of a :class:`calibrate.errors.HeldOutError`.
TREE_FIELDS = {"n_cells": "n_rows", "speedup_mape_pct": "mape_pct", "max_ape_pct": "max_ape_pct",
               "n_with_ci": "n_with_ci", "n_inside_ci": "n_inside_ci", "share_inside_ci": "share_inside_ci"}


@dataclass(frozen=True)
class TreeData:
    """A tree run's tables, as calibrate uses them (``key`` = ``cell_id``)."""

    path: Path
    run: Run
    cells: pd.DataFrame
    generations: pd.DataFrame
    rounds: pd.DataFrame
    nodes: pd.DataFrame
    ranks: pd.DataFrame
    cost_target: pd.DataFrame
    cost_draft: pd.DataFrame
    notes: tuple[str, ...] = ()


def is_tree_run(path: str | Path) -> bool:
    """Whether ``path`` holds a run written by ``python -m measure tree`` (:data:`measure.runkinds.TREES`)."""
    try:
        return read_kind(path) is TREES
    except ValueError:  # a kind this specscope does not know: not a tree run
        return False


def load_trees(path: str | Path, allow_incomplete: bool = False) -> TreeData:
    """The tree run at ``path``, checked: one-line ``ValueError`` for a run that is not a complete tree run
    (unless ``allow_incomplete``), has no finished cell, or holds tables its writer could not have written
    (:func:`calibrate.checks.check_tree_run`: rows written twice, lost or torn, values out of range)."""
    path = Path(path)
    run = load_run(path)
    kind = kind_of(run.meta)
    if kind is not TREES:
        raise ValueError(f"{str(path)!r} is not a tree run (it is a {kind.title}); write one with {TREES.command}")
    notes = []
    if run.status != "complete":
        if not allow_incomplete:
            raise ValueError(f"{path}: run is {run.status}, not complete; measure it again or pass --allow-incomplete")
        notes.append(f"{path}: run is {run.status}; used as is (--allow-incomplete)")
    cells = run.table("tree_cells")
    if cells.empty:
        raise ValueError(f"{path}: no finished cells (tree_cells.csv)")
    tables = {t: run.table(t) for t in ("generations", "rounds", "tree_nodes", "tree_ranks", "cost_target",
                                        "cost_draft")}
    if tables["cost_target"].empty:
        raise ValueError(f"{path}: no cost curves (cost_target.csv); calibrate prices shapes it did not measure with "
                         "them: measure again without --no-cost-curves")
    check_tree_run(path, run.meta, {"tree_cells": cells, **tables})
    return TreeData(path, run, cells, tables["generations"], tables["rounds"], tables["tree_nodes"],
                    tables["tree_ranks"], tables["cost_target"], tables["cost_draft"], tuple(notes))


def shape_kind(cell: pd.Series) -> str:
    """``chain`` (a chain-loop cell, or a tree that is a chain), ``tree`` (a fixed path list) or ``beam``."""
    if cell["loop"] == "chain":
        return "chain"
    shape = str(cell["shape"])
    if shape.startswith("["):
        return "chain" if TokenTree.parse(shape).is_chain else "tree"
    return "chain" if int(cell["topk"]) == 1 and int(cell["budget"]) == int(cell["depth"]) else "beam"


def cell_tree(cell: pd.Series, acceptance: PositionalAcceptance) -> TokenTree:
    """The tree a cell verifies: its path list, the chain of its depth, or a beam's static tree (module docstring)."""
    shape = str(cell["shape"])
    if cell["loop"] == "chain":
        return TokenTree.chain(int(cell["depth"]))
    if shape.startswith("["):
        return TokenTree.parse(shape)
    depth, topk, budget = int(cell["depth"]), int(cell["topk"]), int(cell["budget"])
    if topk == 1:
        return TokenTree.chain(budget)
    return sglang_tree(acceptance, depth, topk, budget + 1)


# -- acceptance ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class RankCounts:
    """Per depth 1..D: positions ranked (``trials``) and, per rank, how many had the target's token there
    (``hits[d-1][r]``); ``ranked[d-1]``: whether the depth's trials rank beyond the top candidate."""

    trials: tuple[int, ...]
    hits: tuple[tuple[int, ...], ...]
    ranked: tuple[bool, ...]


def rank_counts(ranks: pd.DataFrame, chain_rounds: pd.DataFrame, max_ranks: int = MAX_RANKS) -> RankCounts:
    """The counts behind ``p`` (module docstring): ``tree_ranks.csv`` rows, and ``rounds.csv`` rows of chain-loop
    cells for rank 0."""
    depth_max = max([int(ranks["depth"].max()) if len(ranks) else 0]
                    + [int(chain_rounds["gamma"].max()) if len(chain_rounds) else 0])
    trials = np.zeros(depth_max, dtype=int)
    hits = np.zeros((depth_max, max_ranks), dtype=int)
    ranked = np.zeros(depth_max, dtype=bool)
    if len(ranks):
        d = ranks["depth"].to_numpy(int) - 1
        r = ranks["rank"].to_numpy(int)
        np.add.at(trials, d, 1)
        ok = (r >= 0) & (r < max_ranks)
        np.add.at(hits, (d[ok], r[ok]), 1)
        ranked[np.unique(d)] = True
    if len(chain_rounds):
        acc = chain_rounds["accepted"].to_numpy(int)
        drafted = chain_rounds["drafted"].to_numpy(int)
        gamma = chain_rounds["gamma"].to_numpy(int)
        for i in range(1, depth_max + 1):  # reached depth i − 1 and the tree would have a depth-i node
            reached = (acc >= i - 1) & (gamma >= i)
            trials[i - 1] += int(reached.sum())
            hits[i - 1, 0] += int((reached & (acc >= i) & (drafted >= i)).sum())
    return RankCounts(tuple(int(t) for t in trials), tuple(tuple(int(x) for x in row) for row in hits),
                      tuple(bool(b) for b in ranked))


def fit_positional(counts: RankCounts, source: str, min_trials: int = MIN_TRIALS) -> PositionalAcceptance:
    """``p[d][r]`` = hits / trials per depth with at least ``min_trials`` positions (every rank where the
    counterfactual record ranked that depth, the top one only where only chains reached it); ``ValueError`` when
    no depth has enough."""
    rows = []
    for t, h, ranked in zip(counts.trials, counts.hits, counts.ranked):
        if t < min_trials:
            break
        rows.append(tuple(x / t for x in (h if ranked else h[:1])))
    if not rows:
        raise ValueError(f"fewer than {min_trials} ranked positions at depth 1 ({counts.trials[:1]}): too few to fit "
                         "the acceptance; measure more prompts or tokens")
    return PositionalAcceptance(tuple(rows), source)


def acceptance_table(counts: RankCounts, min_trials: int = MIN_TRIALS) -> pd.DataFrame:
    """``p[d][r]`` with its trials and 95% Wilson interval, one row per depth and rank fitted."""
    out = []
    for d, (t, h, ranked) in enumerate(zip(counts.trials, counts.hits, counts.ranked), start=1):
        if t < min_trials:
            break
        k = np.array(h if ranked else h[:1])
        lo, hi = (np.clip(b, 0.0, 1.0) for b in wilson_ci(k, np.full(k.shape, t)))
        out += [{"depth": d, "rank": r, "trials": t, "hits": int(k[r]), "p": k[r] / t, "p_lo": float(lo[r]),
                 "p_hi": float(hi[r])} for r in range(k.size)]
    return pd.DataFrame(out)


# -- cost ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TreeCostFit:
    """The tree round's cost: the fitted model and the in-loop factors behind it (module docstring)."""

    model: TabulatedCost
    factors: dict[str, float]
    n_rounds: int
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return {"factors": self.factors, "n_rounds": self.n_rounds, "notes": list(self.notes),
                "cost_model": self.model.describe()}


def round_shapes(nodes: pd.DataFrame) -> pd.DataFrame:
    """Per tree round (``cell_id, prompt_id, repeat, round``): its node count ``n`` and its ``depth``."""
    keys = ["cell_id", "prompt_id", "repeat", "round"]
    return nodes.groupby(keys, as_index=False).agg(n=("node", "size"), depth=("depth", "max"))


def _nonneg_fit(x: np.ndarray, y: np.ndarray, names: list[str]) -> dict[str, float]:
    """Non-negative least squares ``y ≈ x β``, as a name → value map."""
    beta, _ = nnls(np.asarray(x, float), np.asarray(y, float))
    return dict(zip(names, (float(b) for b in beta)))


def fit_tree_cost(base: TabulatedCost, rounds: pd.DataFrame, nodes: pd.DataFrame,
                  depth_of: dict[str, int]) -> TreeCostFit:
    """The in-loop factors of the tree loop fitted to training tree ``rounds`` (their ``tree_nodes``; a round
    verifies its own node count ``n``, and drafts ``depth_of[cell]`` levels even when its tree is cut near the
    end of a generation), on ``base`` (the cost curves with the baseline's scale:
    :func:`calibrate.fit_cost.fit_cost`)."""
    keys = ["cell_id", "prompt_id", "repeat", "round"]
    r = rounds.merge(round_shapes(nodes).drop(columns="depth"), on=keys, how="inner")
    r = r.assign(depth=r["cell_id"].map(depth_of))
    notes = []
    if len(r) < 3:
        notes.append(f"{len(r)} training tree rounds: the cost curves are used as timed (no in-loop factors)")
        return TreeCostFit(base, {}, len(r), tuple(notes))
    ctx = r["context_tokens"].to_numpy(float)
    n = r["n"].to_numpy(float)
    step = np.array([base.draft_step_ms(c) for c in ctx]) * r["depth"].to_numpy(float)
    fwd = np.array([base.verify_ms(int(k) + 1, c) for k, c in zip(n, ctx)])  # n + 1 >= 2: the curve as timed
    f = _nonneg_fit(np.column_stack([step, n]), r["draft_ms"].to_numpy(float), ["s_draft", "c_draft"])
    f |= _nonneg_fit(np.column_stack([fwd, np.ones_like(n)]), r["verify_ms"].to_numpy(float),
                     ["s_verify", "a_verify"])
    f |= _nonneg_fit(np.column_stack([np.ones_like(n), n]), r["overhead_ms"].to_numpy(float),
                     ["a_overhead", "c_overhead"])
    if f["s_verify"] <= 0:
        notes.append("the verify time did not grow with the cost curve's forward time: s_verify set to 1")
        f["s_verify"] = 1.0
    table = {k: (v if k == 1 else v * f["s_verify"]) for k, v in base.verify_ms_by_tokens.items()}
    slopes = base.context_ms_per_token_by_tokens or {k: base.target_context_ms_per_token for k in table}
    slopes = {k: (v if k == 1 else v * f["s_verify"]) for k, v in slopes.items()}  # the baseline step stays as fitted
    model = replace(base, verify_ms_by_tokens=table, context_ms_per_token_by_tokens=slopes,
                    draft_step_ms_ref=max(base.draft_step_ms_ref * f["s_draft"], 1e-6),
                    draft_context_ms_per_token=base.draft_context_ms_per_token * f["s_draft"],
                    round_overhead_ms_base=f["a_verify"] + f["a_overhead"],
                    overhead_per_draft_token_ms=f["c_draft"] + f["c_overhead"],
                    metadata={**dict(base.metadata), "tree_in_loop_factors": f, "source": "calibrate trees"})
    return TreeCostFit(model, f, len(r), tuple(notes))


def prefill_fit(gens: pd.DataFrame) -> LinearFit | None:
    """``ttft_ms = a + b · prompt_tokens`` on ``gens`` (``a`` alone with one prompt length; None without rows)."""
    g = gens[np.isfinite(gens["ttft_ms"].to_numpy(float))]
    if g.empty:
        return None
    if g["prompt_tokens"].nunique() > 1:
        x = np.column_stack([np.ones(len(g)), g["prompt_tokens"].to_numpy(float)])
        return ols(x, g["ttft_ms"].to_numpy(float), ["ttft_ms_0", "ttft_ms_per_prompt_token"], ["ms", "ms/token"],
                   "ttft_ms = a + b * prompt_tokens")
    return ols(np.ones((len(g), 1)), g["ttft_ms"].to_numpy(float), ["ttft_ms_0"], ["ms"], "ttft_ms = a")


def ttft_ms(fit: LinearFit | None, prompt_tokens: float) -> float:
    """The prefill fit at ``prompt_tokens`` (0 without a fit)."""
    if fit is None:
        return 0.0
    v = fit.value("ttft_ms_0") + (fit.value("ttft_ms_per_prompt_token") * prompt_tokens
                                  if fit.has("ttft_ms_per_prompt_token") else 0.0)
    return max(v, 0.0)


# -- fitting a fold, predicting a cell ---------------------------------------------------------------------
@dataclass(frozen=True)
class TreeModels:
    """What a fold fitted on its training cells."""

    label: str
    acceptance: PositionalAcceptance
    counts: RankCounts
    tree_cost: TreeCostFit | None
    chain_cost: CostFit | None
    prefill: LinearFit | None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def cost_for(self, cell: pd.Series) -> TabulatedCost:
        """The chain loop's cost for a chain-loop cell (the tree loop's when no chain cell trained), else the
        tree loop's."""
        if cell["loop"] == "chain" and self.chain_cost is not None:
            return self.chain_cost.model
        if self.tree_cost is None:
            assert self.chain_cost is not None
            return self.chain_cost.model
        return self.tree_cost.model


class TreeCalibrator:
    """Fits :class:`TreeModels` on any set of a run's cells and predicts any cell."""

    def __init__(self, data: TreeData) -> None:
        self.data = data
        run = data.run
        screened = screen_target(data.cost_target, (run.meta.get("cost_screening") or {}).get("superseded", []))
        self.notes = [f"cost curves: {o.as_text()}" for o in screened.outliers]
        self.curve = target_curve(screened.kept)
        self.draft = str(data.cells["draft"].iloc[0])

    def _of(self, table: pd.DataFrame, cell_ids) -> pd.DataFrame:
        return table[table["cell_id"].isin(set(cell_ids))] if len(table) else table

    def _base_cost(self, train: pd.DataFrame, chain_ids: list[str]) -> tuple[CostFit, CostFit | None]:
        """The cost curves with the training baselines' scale, and the chain loop's own fit (None: no chain)."""
        d = self.data
        gens = self._of(d.generations, train["cell_id"])
        base_gens = gens[gens["mode"] == "baseline"]
        empty = d.rounds.iloc[:0]
        base = fit_cost(self.draft, d.cost_target, d.cost_draft, empty, base_gens, target=self.curve)
        chain = None
        if chain_ids:
            chain = fit_cost(self.draft, d.cost_target, d.cost_draft, self._of(d.rounds, chain_ids),
                             base_gens[base_gens["cell_id"].isin(chain_ids)], target=self.curve)
        return base, chain

    def fit(self, train: pd.DataFrame, label: str) -> TreeModels:
        """Acceptance, cost and prefill from the cells ``train`` (rows of ``tree_cells``)."""
        d = self.data
        ids = list(train["cell_id"])
        chain_ids = [c for c, loop in zip(train["cell_id"], train["loop"]) if loop == "chain"]
        tree_ids = [c for c in ids if c not in chain_ids]
        counts = rank_counts(self._of(d.ranks, tree_ids), self._of(d.rounds, chain_ids))
        acc = fit_positional(counts, f"calibrate trees: {d.path.name}, cells {label}")
        base, chain = self._base_cost(train, chain_ids)
        depth_of = dict(zip(train["cell_id"], train["depth"].astype(int)))
        tree_cost = (fit_tree_cost(base.model, self._of(d.rounds, tree_ids), self._of(d.nodes, tree_ids), depth_of)
                     if tree_ids else None)
        notes = list(tree_cost.notes) if tree_cost else []
        if label == "all":  # the fit written for python -m sim: every parameter held at its bound, said once
            held = [*base.fallbacks, *(chain.fallbacks if chain is not None else ())]
            notes += list(dict.fromkeys(fallback_lines(held)))  # the base and the chain fit share the target's
        return TreeModels(label, acc, counts, tree_cost, chain, prefill_fit(self._of(d.generations, ids)),
                          tuple(notes))

    def prompts_of(self, cell_id: str) -> np.ndarray:
        """``[[prompt_tokens, new_tokens], ...]`` of a cell's speculative generations, one per prompt."""
        g = self.data.generations
        g = g[(g["cell_id"] == cell_id) & (g["mode"] == "speculative")].drop_duplicates("prompt_id")
        return g[["prompt_tokens", "new_tokens"]].to_numpy(float)

    def predict(self, cell: pd.Series, models: TreeModels, split: str) -> dict:
        """One prediction row: the cell, what was measured (with its CI), what is predicted (module docstring)."""
        tree = cell_tree(cell, models.acceptance)
        cost = models.cost_for(cell)
        walls, first = [], None
        for p, n in self.prompts_of(cell["cell_id"]):
            pred = predict_tree(tree, _covering(models.acceptance, tree), cost, p + n / 2)
            first = first or pred
            t0 = ttft_ms(models.prefill, p)
            walls.append((n, t0 + (n - 1) * pred.speculative_ms_per_token, t0 + (n - 1) * pred.baseline_ms_per_token))
        tps_s, tps_b = mean_tokens_per_s(walls)
        return {**measured_columns(cell), "split": split, "fold": models.label, **_predicted(first, tps_s, tps_b),
                **measured_round(self.data, cell["cell_id"])}


def _covering(acc: PositionalAcceptance, tree: TokenTree) -> PositionalAcceptance:
    """``acc`` if it gives every rank ``tree`` needs; else one line naming the rank (a tree wider than what was
    ranked at that depth)."""
    acc.check_covers(tree)
    return acc


def measured_columns(cell: pd.Series) -> dict:
    """The columns of a prediction row that describe the cell and what was measured."""
    lo, hi = cell.get("speedup_lo"), cell.get("speedup_hi")
    return {"cell_id": cell["cell_id"], "draft": cell["draft"], "loop": cell["loop"], "shape": cell["shape"],
            "kind": shape_kind(cell), "depth": int(cell["depth"]), "topk": int(cell["topk"]),
            "budget": int(cell["budget"]), "measured_speedup": float(cell["speedup"]),
            "measured_speedup_lo": None if lo is None or pd.isna(lo) else float(lo),
            "measured_speedup_hi": None if hi is None or pd.isna(hi) else float(hi),
            "measured_tokens_per_s": float(cell["tokens_per_s_speculative"]),
            "measured_tokens_per_s_baseline": float(cell["tokens_per_s_baseline"]),
            "measured_accepted_per_round": _num(cell.get("mean_accepted_per_round"))}


def _num(v: object) -> float | None:
    try:
        x = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def _predicted(first: TreePrediction | None, tps_s: float, tps_b: float) -> dict:
    assert first is not None, "a cell without speculative generations"
    return {"predicted_speedup": tps_s / tps_b, "predicted_tokens_per_s": tps_s,
            "predicted_tokens_per_s_baseline": tps_b,
            "predicted_accepted_per_round": first.expected_accepted_length - 1.0, "n_nodes": first.n_nodes,
            "predicted_draft_ms": first.draft_ms, "predicted_verify_ms": first.verify_ms,
            "predicted_overhead_ms": first.overhead_ms}


def measured_round(data: TreeData, cell_id: str) -> dict:
    """A cell's mean round: draft, verify and overhead ms as measured."""
    r = data.rounds[data.rounds["cell_id"] == cell_id]
    if r.empty:
        return {}
    return {"measured_draft_ms": float(r["draft_ms"].mean()), "measured_verify_ms": float(r["verify_ms"].mean()),
            "measured_overhead_ms": float(r["overhead_ms"].mean())}


# -- the calibration ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TreeCalibration:
    """Every cell predicted in-sample and held out, the error summary, and the all-cell models."""

    data: TreeData
    predictions: pd.DataFrame
    summary: dict
    models: TreeModels
    notes: tuple[str, ...]


def error_summary(pred: pd.DataFrame) -> dict:
    """Per split and kind (``all``: chains and fixed trees, the headline; beams apart): MAPE and the share inside
    the measured CIs, with the targets."""
    out: dict = {}
    for split, sp in pred.groupby("split"):
        groups = {"all": sp[sp["kind"] != "beam"], **{k: sp[sp["kind"] == k] for k in KINDS}}
        out[split] = {name: HeldOutError.of("speedup", g["ape_speedup_pct"], g["inside_ci"]).as_dict(TREE_FIELDS)
                      for name, g in groups.items() if not g.empty}
    head = out.get("held_out", {}).get("all")
    if head is not None:
        mape = head["speedup_mape_pct"]
        out["targets"] = {"speedup_mape_pct": MAPE_TARGET_PCT, "share_inside_ci": INSIDE_TARGET,
                          "mape_met": mape is not None and mape <= MAPE_TARGET_PCT,
                          "inside_met": (head["share_inside_ci"] or 0.0) >= INSIDE_TARGET}
    return out


def calibrate_trees(data: TreeData) -> TreeCalibration:
    """In-sample (every cell) and leave-one-shape-out predictions of every cell, and their errors."""
    cal = TreeCalibrator(data)
    cells = data.cells
    notes = list(data.notes) + cal.notes
    all_models = cal.fit(cells, "all")
    notes += list(all_models.notes)
    rows = [cal.predict(c, all_models, "in_sample") for _, c in cells.iterrows()]
    if len(cells) < 2:
        notes.append("one cell: nothing to hold out")
    for i, c in cells.iterrows():
        if len(cells) < 2:
            break
        train = cells.drop(index=i)
        try:
            rows.append(cal.predict(c, cal.fit(train, f"without {c['shape']}"), "held_out"))
        except ValueError as exc:
            notes.append(f"held out {c['shape']}: not predicted ({exc})")
    pred = add_errors(pd.DataFrame(rows))
    return TreeCalibration(data, pred, error_summary(pred), all_models, tuple(notes))


# -- uncertainty and advice ----------------------------------------------------------------------------------
def bootstrap_acceptance(data: TreeData, cells: pd.DataFrame, like: PositionalAcceptance, draws: int,
                         seed: int) -> list[PositionalAcceptance]:
    """``draws`` refits of ``like`` (its rows and ranks) on the generations of ``cells`` resampled with replacement
    (a generation: one cell, prompt and repeat; seeded), for the spread of what the acceptance predicts."""
    chain_ids = set(cells.loc[cells["loop"] == "chain", "cell_id"])
    tree_ids = set(cells["cell_id"]) - chain_ids
    keys = ["cell_id", "prompt_id", "repeat"]
    ranks = data.ranks[data.ranks["cell_id"].isin(tree_ids)]
    chains = data.rounds[data.rounds["cell_id"].isin(chain_ids)]
    by_r = dict(list(ranks.groupby(keys))) if len(ranks) else {}
    by_c = dict(list(chains.groupby(keys))) if len(chains) else {}
    per = []
    for unit in sorted(set(by_r) | set(by_c), key=str):
        c = rank_counts(by_r.get(unit, ranks.iloc[:0]), by_c.get(unit, chains.iloc[:0]))
        per.append((np.array(c.trials), np.array(c.hits)))
    depth = len(like.p)
    trials = np.zeros((len(per), depth))
    hits = np.zeros((len(per), depth, MAX_RANKS))
    for i, (t, h) in enumerate(per):
        k = min(depth, t.size)
        trials[i, :k], hits[i, :k] = t[:k], h[:k]
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(draws):
        w = np.bincount(rng.integers(0, len(per), len(per)), minlength=len(per)).astype(float)
        t = w @ trials
        h = np.einsum("u,udr->dr", w, hits)
        rows = tuple(tuple(h[d, r] / max(t[d], 1.0) for r in range(len(like.p[d]))) for d in range(depth))
        out.append(PositionalAcceptance(rows, like.source + " (bootstrap)"))
    return out


def interval(values: list[float]) -> tuple[float | None, float | None]:
    """The 2.5th and 97.5th percentiles (None, None without values)."""
    if not values:
        return None, None
    lo, hi = np.percentile(values, [2.5, 97.5])
    return float(lo), float(hi)


def advice_intervals(doc: dict, cost: TabulatedCost, draws: list[PositionalAcceptance],
                     context_tokens: float) -> dict[str, tuple[float | None, float | None]]:
    """The 95% interval of the predicted speedup of each tree the advice names (best chain, best tree, SGLang's,
    vLLM's) over the bootstrap acceptances ``draws`` (the cost held fixed)."""
    named: dict[str, tuple[list, tuple[int, ...] | None]] = {
        "best_chain": (doc["best_chain"]["paths"], None), "best_tree": (doc["best_tree"]["paths"], None),
        "vllm": (doc["vllm"]["prediction"]["paths"], None)}
    sg = doc["sglang"]["flags"]
    named["sglang"] = (doc["sglang"]["prediction"]["paths"],
                       (1, *[sg["speculative_eagle_topk"]] * (sg["speculative_num_steps"] - 1)))
    out = {}
    for name, (paths, widths) in named.items():
        tree = TokenTree(tuple(tuple(p) for p in paths))
        vals = [predict_tree(tree, a, cost, context_tokens, draft_widths=widths).speedup for a in draws]
        out[name] = interval(vals)
    return out


def mean_context(data: TreeData) -> float:
    """The run's mean mid-generation context (prompt + half the new tokens) of its speculative generations."""
    g = data.generations[data.generations["mode"] == "speculative"]
    return float((g["prompt_tokens"] + g["new_tokens"] / 2).mean())


def curve_rows(models: TreeModels, max_budget: int, max_depth: int, context_tokens: float) -> list[dict]:
    """Predicted speedup against the verify budget (draft tokens): the chain and the best tree of each budget on
    the tree loop (:func:`sim.tree_advice.budget_rows`), and the chain on the chain loop where one was measured."""
    from sim.tree_advice import budget_rows

    assert models.tree_cost is not None
    rows = []
    for r in budget_rows(models.acceptance, models.tree_cost.model, max_budget, max_depth, context_tokens):
        for kind, pred in (("chain (tree loop)", r.chain), ("best tree", r.tree)):
            if pred is not None:
                rows.append({"budget": r.budget, "series": kind, "predicted_speedup": pred.speedup,
                             "expected_accepted_length": pred.expected_accepted_length, "depth": pred.depth,
                             "paths": str([list(p) for p in pred.paths]).replace(" ", "")})
    if models.chain_cost is not None:
        for g in range(1, max_depth + 1):
            pred = predict_tree(TokenTree.chain(g), models.acceptance, models.chain_cost.model, context_tokens)
            rows.append({"budget": g, "series": "chain (chain loop)", "predicted_speedup": pred.speedup,
                         "expected_accepted_length": pred.expected_accepted_length, "depth": g,
                         "paths": str([list(p) for p in pred.paths]).replace(" ", "")})
    return rows


__all__ = ["KINDS", "RankCounts", "advice_intervals", "bootstrap_acceptance", "curve_rows", "interval",
           "mean_context", "TreeCalibration", "TreeCalibrator", "TreeCostFit", "TreeData", "TreeModels",
           "acceptance_table", "calibrate_trees", "cell_tree", "error_summary", "fit_positional",
           "fit_tree_cost", "is_tree_run", "load_trees", "rank_counts", "round_shapes", "shape_kind"]
