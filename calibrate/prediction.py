"""Fit one fold's models and predict cells: closed form, trace replay and the event simulator.

:class:`Calibrator` fits the cost model (with its in-loop scales), the prefill
line and acceptance on a fold's training cells (:class:`FoldModels`) and
predicts any cell's speedup and tokens/s with each of :data:`METHODS`, by the
measurement's own estimator (mean per-prompt tokens/s of each side).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from calibrate.dataset import Dataset, as_float, k_key, rows_of
from calibrate.fit_acceptance import AcceptanceFit, fit_acceptance, interpolate_models, trace_model
from calibrate.fit_cost import CostFit, LinearFit, TargetCurve, fallback_lines, fit_cost, ols, target_curve
from calibrate.groups import AcceptanceGroup, acceptance_groups
from measure.costpoints import screen_target
from sim.acceptance import AcceptanceModel
from sim.analytic import predict_row
from sim.cost import CostModel
from sim.events import simulate_request
from sim.policies import GammaSpec

METHODS: tuple[str, ...] = ("closed_form", "trace", "event_sim")
#: Seeded event-simulator requests averaged per prompt.
SIM_REPEATS = 4


@dataclass(frozen=True)
class FoldModels:
    """Models fitted on one fold's training cells."""

    label: str
    cost: dict[tuple, CostFit]
    acceptance: dict[AcceptanceGroup, AcceptanceFit]
    prefill: dict[str, LinearFit]
    notes: tuple[str, ...] = field(default_factory=tuple)


_NO_PREDICTION = {"predicted_speedup": float("nan"), "predicted_tokens_per_s": float("nan"),
                  "predicted_tokens_per_s_baseline": float("nan")}


def _measured(cell: pd.Series, fold: str) -> dict:
    """The columns of a prediction row that describe the cell and what was measured."""
    return {
        "run": cell["run"], "cell_id": cell["cell_id"], "draft": cell["draft"],
        "gamma_policy": cell["gamma_policy"], "gamma": cell["gamma"], "domain": cell["domain"],
        "temperature": cell["temperature"], "head_k": cell["head_k"], "fold": fold,
        "measured_speedup": float(cell["speedup"]),
        "measured_speedup_lo": as_float(cell.get("speedup_lo")), "measured_speedup_hi": as_float(cell.get("speedup_hi")),
        "unstable": bool(cell.get("unstable", False)),
        "measured_tokens_per_s": float(cell["tokens_per_s_speculative"]),
        "measured_tokens_per_s_baseline": float(cell["tokens_per_s_baseline"]),
    }


def mean_tokens_per_s(walls: list[tuple[float, float, float]]) -> tuple[float, float]:
    """The measurement's estimator (measure.stats): mean per-prompt tokens/s of each side.

    ``walls``: per prompt ``(new_tokens, speculative wall ms, baseline wall ms)``.
    """
    tps_s = [n / (s / 1e3) for n, s, _ in walls]
    tps_b = [n / (b / 1e3) for n, _, b in walls]
    return float(np.mean(tps_s)), float(np.mean(tps_b))


@dataclass(frozen=True)
class CellInputs:
    """What predicting one cell needs: its fitted models, γ policy and prompts."""

    cost: CostModel
    acceptance: AcceptanceModel
    trace: AcceptanceModel | None  # the training cells' traces (fixed γ only)
    spec: GammaSpec
    prompts: np.ndarray  # [[prompt_tokens, new_tokens], ...]
    prefill: LinearFit | None

    def ttft_ms(self, prompt_tokens: float) -> float:
        pf = self.prefill
        if pf is None:
            return 0.0
        v = pf.value("ttft_ms_0") + (pf.value("ttft_ms_per_prompt_token") * prompt_tokens
                                     if pf.has("ttft_ms_per_prompt_token") else 0.0)
        return max(v, 0.0)

    def event_sim_walls(self, seed: int) -> list[tuple[float, float, float]]:
        """Per prompt: SIM_REPEATS seeded simulated requests averaged, normalised to the n - 1 decoded tokens."""
        walls = []
        for i, (p, n) in enumerate(self.prompts):
            t0 = self.ttft_ms(p)
            spec_ms = base_ms = 0.0
            for rep in range(SIM_REPEATS):
                r = simulate_request(self.acceptance, self.cost, self.spec, int(max(n - 1, 1)), p + 1,
                                     seed=seed + 1000 * i + rep)
                spec_ms += r.time_ms * max(n - 1, 1) / r.n_tokens / SIM_REPEATS
                base_ms += r.baseline_time_ms * max(n - 1, 1) / r.n_tokens / SIM_REPEATS
            walls.append((n, t0 + spec_ms, t0 + base_ms))
        return walls

    def closed_form_walls(self, method: str, round_parts: dict) -> list[tuple[float, float, float]]:
        """Per prompt, the closed form at the prompt's mid-generation context (``closed_form`` or ``trace``).

        ``closed_form`` also fills ``round_parts`` with the first prompt's predicted round components.
        """
        walls = []
        for i, (p, n) in enumerate(self.prompts):
            if not self.spec.is_fixed:
                raise ValueError(f"closed form needs a fixed γ, cell has {self.spec.to_str()}")
            model = self.acceptance if method == "closed_form" else self.trace
            if model is None:
                raise ValueError("no training traces for this draft/domain")
            t0 = self.ttft_ms(p)
            row = predict_row(model, self.cost, self.spec.gamma, p + n / 2)
            if method == "closed_form" and i == 0:
                round_parts.update({"predicted_draft_ms": row.draft_ms, "predicted_verify_ms": row.verify_ms,
                                    "predicted_overhead_ms": row.overhead_ms})
            walls.append((n, t0 + (n - 1) * row.speculative_ms_per_token, t0 + (n - 1) * row.baseline_ms_per_token))
        return walls


class Calibrator:
    """Fits models on a set of training cells and predicts any cell."""

    def __init__(self, data: Dataset, seed: int = 0, sim_prompts: int | None = None) -> None:
        self.data = data
        self.seed = seed
        self.sim_prompts = sim_prompts
        self._targets: dict[str, TargetCurve | ValueError] = {}
        #: what fitting found and the calibration's notes say (cost points left out, in words)
        self.notes: list[str] = []

    def _target_curve(self, run_label: str) -> TargetCurve:
        """The run's target forward fit: ``cost_target.csv`` is shared by every fold, so it is fitted once, on
        the points the run's screening kept (:func:`measure.costpoints.screen_target`: its superseded repeats
        and every point out of line with its neighbours left out, and said)."""
        if run_label not in self._targets:
            run = self.data.runs[run_label]
            screened = screen_target(run.table("cost_target"),
                                     (run.meta.get("cost_screening") or {}).get("superseded", []))
            self.notes += [f"{run_label}: cost curves: {o.as_text()}" for o in screened.outliers]
            try:
                curve = target_curve(screened.kept)
                self._targets[run_label] = curve
                self.notes += [f"{run_label}: {line}" for line in fallback_lines(curve.fit.fallbacks)]
            except ValueError as exc:
                self._targets[run_label] = exc
        found = self._targets[run_label]
        if isinstance(found, ValueError):
            raise found
        return found

    # -- fitting ------------------------------------------------------------------
    def _rounds_of(self, keys) -> pd.DataFrame:
        return rows_of(self.data.rounds, keys)

    def _gens_of(self, keys, mode: str | None = None) -> pd.DataFrame:
        out = rows_of(self.data.generations, keys)
        return out if mode is None or out.empty else out[out["mode"] == mode]

    def fit(self, train: pd.DataFrame, label: str, drop_k: float | None = None, *,
            acceptance_train: pd.DataFrame, cost_train: pd.DataFrame | None = None) -> FoldModels:
        """Prefill from ``train`` (the stable training cells); the cost model and its in-loop scales from
        ``cost_train`` (default ``train``; :func:`calibrate` passes every training cell, weighted by the
        variance of its scales: :func:`calibrate.fit_cost.cell_weighted_ratio`); acceptance from
        ``acceptance_train`` (every training cell, stable or not)."""
        cost_train = train if cost_train is None else cost_train
        cells = self.data.cells
        notes: list[str] = []
        cost: dict[tuple, CostFit] = {}
        prefill: dict[str, LinearFit] = {}
        for run_label, run in self.data.runs.items():
            run_cells = cells[cells["run"] == run_label]
            tr_run = train[train["run"] == run_label]
            cost_run = cost_train[cost_train["run"] == run_label]
            cd = run.table("cost_draft")
            if drop_k is not None and not cd.empty:
                cd = cd[cd["head_k"].map(k_key) != drop_k]
            gens = self._gens_of(tr_run["key"])
            gens = gens[np.isfinite(gens["ttft_ms"].to_numpy(float))]  # the peer run records no TTFT
            if len(gens) >= 2 and gens["prompt_tokens"].nunique() > 1:
                x = np.column_stack([np.ones(len(gens)), gens["prompt_tokens"].to_numpy(float)])
                prefill[run_label] = ols(x, gens["ttft_ms"].to_numpy(float), ["ttft_ms_0", "ttft_ms_per_prompt_token"],
                                         ["ms", "ms/token"], "ttft_ms = a + b * prompt_tokens")
            elif len(gens):
                prefill[run_label] = ols(np.ones((len(gens), 1)), gens["ttft_ms"].to_numpy(float), ["ttft_ms_0"],
                                         ["ms"], "ttft_ms = a")
            configs = run_cells[["draft", "head_k"]].drop_duplicates()
            for draft, hk in configs.itertuples(index=False):
                hk = k_key(hk)
                tr = cost_run[cost_run["draft"] == draft]
                cd_k = cd
                if hk is not None:
                    same_k = tr[tr["head_k"] == hk]
                    if len(same_k):
                        tr = same_k  # in-loop scales from this K's own training rounds
                    if not cd.empty and (cd["head_k"].map(k_key) == hk).any():
                        cd_k = cd[cd["head_k"].map(k_key) == hk]  # this K was timed: no K-term needed
                try:
                    cost[(run_label, draft, hk)] = cf = fit_cost(
                        str(draft), run.table("cost_target"), cd_k, self._rounds_of(tr["key"]),
                        self._gens_of(tr["key"], "baseline"), head_k=hk, target=self._target_curve(run_label))
                    if label == "all":  # the fit written for python -m sim: its fallbacks (the target's are said once)
                        self.notes += [f"{run_label}: {line}" for line in
                                       fallback_lines([f for f in cf.fallbacks if f.fit != "target forward"])]
                except ValueError as exc:
                    notes.append(f"{run_label}/{draft}: {exc}")
        acceptance: dict[AcceptanceGroup, AcceptanceFit] = {}
        for grp, sub in acceptance_groups(acceptance_train):
            rounds = self._rounds_of(sub["key"])
            if len(rounds):
                acceptance[grp] = fit_acceptance(rounds, grp.to_str())
        return FoldModels(label, cost, acceptance, prefill, tuple(notes))

    # -- predicting ---------------------------------------------------------------
    def _acceptance_for(self, cell: pd.Series, models: FoldModels, train: pd.DataFrame) -> tuple[AcceptanceModel | None, str]:
        grp = AcceptanceGroup.of_cell(cell)
        if grp in models.acceptance:
            return models.acceptance[grp].model(), f"fitted on {grp.to_str()}"
        same = train[(train["draft"] == cell["draft"]) & (train["temperature"] == cell["temperature"])]
        if cell["head_k"] is not None and not pd.isna(cell["head_k"]):
            pts = []
            for hk, sub in same[same["head_k"].notna()].groupby("head_k"):
                fit = fit_acceptance(self._rounds_of(sub["key"]), f"head_k={hk}")
                pts.append((math.log(float(hk)), fit.model()))
            if pts:
                return interpolate_models(pts, math.log(float(cell["head_k"]))), "interpolated in log K"
        if len(same):
            rounds = self._rounds_of(same["key"])
            if len(rounds):
                return fit_acceptance(rounds, "pooled").model(), f"pooled over training cells of draft={cell['draft']}"
        return None, "no training rounds for this draft"

    def _trace_for(self, cell: pd.Series, train: pd.DataFrame):
        t = self.data.traces
        if t.empty:
            return None
        same = train[(train["draft"] == cell["draft"]) & (train["temperature"] == cell["temperature"])
                     & (train["domain"] == cell["domain"])]
        if cell["head_k"] is not None and not pd.isna(cell["head_k"]):
            same = same[same["head_k"] == cell["head_k"]]
        return trace_model(rows_of(t, same["key"]))

    def predict_cell(self, cell: pd.Series, models: FoldModels, train: pd.DataFrame,
                     prompts: np.ndarray | None = None, methods: tuple[str, ...] = METHODS) -> list[dict]:
        """One row per method with predicted and measured speedup / tokens per s.

        ``prompts`` (``[[prompt_tokens, new_tokens], ...]``) defaults to the cell's own generations.
        """
        base = _measured(cell, models.label)
        cost_fit = models.cost.get((cell["run"], cell["draft"], cell["head_k"]))
        acc, acc_note = self._acceptance_for(cell, models, train)
        if prompts is None:
            prompts = self.prompts_of(cell["key"])
        if cost_fit is None or acc is None or prompts.size == 0:
            why = "no cost model" if cost_fit is None else acc_note if acc is None else "no generations"
            return [{**base, "method": m, **_NO_PREDICTION, "note": why} for m in methods]
        spec = GammaSpec.parse(str(cell["gamma_policy"]))
        inputs = CellInputs(cost_fit.model, acc, self._trace_for(cell, train) if spec.is_fixed else None, spec,
                            prompts, models.prefill.get(cell["run"]))
        out = []
        round_parts: dict = {}
        for method in methods:
            try:
                if method == "event_sim":
                    walls = inputs.event_sim_walls(self.seed)
                else:
                    walls = inputs.closed_form_walls(method, round_parts)
                tps_s, tps_b = mean_tokens_per_s(walls)
                out.append({**base, "method": method, "predicted_speedup": tps_s / tps_b,
                            "predicted_tokens_per_s": tps_s, "predicted_tokens_per_s_baseline": tps_b,
                            "note": acc_note})
            except ValueError as exc:
                out.append({**base, "method": method, **_NO_PREDICTION, "note": str(exc)})
        rounds = self._rounds_of([cell["key"]])
        meas_parts = ({"measured_draft_ms": float(rounds["draft_ms"].mean()),
                       "measured_verify_ms": float(rounds["verify_ms"].mean()),
                       "measured_overhead_ms": float(rounds["overhead_ms"].mean())} if len(rounds) else {})
        return [{**r, **round_parts, **meas_parts} for r in out]

    def prompts_of(self, key: str) -> np.ndarray:
        """``[[prompt_tokens, new_tokens], ...]`` of a cell's prompts (speculative generations)."""
        gens = self._gens_of([key], "speculative")
        if gens.empty:
            gens = self._gens_of([key])
        return gens.drop_duplicates("prompt_id")[["prompt_tokens", "new_tokens"]].to_numpy(float)

    def curves(self, cells: pd.DataFrame, models: FoldModels, gammas: range) -> pd.DataFrame:
        """Predicted speedup at every γ in ``gammas`` for each (run, draft, domain, temperature, K) series,
        with the prompts of that series' first cell (closed form and trace replay)."""
        rows = []
        fixed = cells[cells["gamma_policy"].map(lambda g: GammaSpec.parse(str(g)).is_fixed)]
        keys = ["run", "draft", "domain", "temperature"]
        for _, sub in fixed.groupby(keys + [fixed["head_k"].fillna(-1.0)]):
            tmpl = sub.iloc[0]
            prompts = self.prompts_of(tmpl["key"])
            k = tmpl["head_k"]
            series = f"{tmpl['draft']}/{tmpl['domain']}" + ("" if k is None or pd.isna(k) else f"/K={int(k)}")
            for g in gammas:
                cell = tmpl.copy()
                cell["gamma_policy"], cell["gamma"] = GammaSpec("fixed", g).to_str(), g
                for r in self.predict_cell(cell, models, cells, prompts, ("closed_form", "trace")):
                    rows.append({"series": series, "run": r["run"], "draft": r["draft"], "domain": r["domain"],
                                 "head_k": k, "gamma": g, "method": r["method"],
                                 "predicted_speedup": r["predicted_speedup"],
                                 "predicted_tokens_per_s": r["predicted_tokens_per_s"]})
        return pd.DataFrame(rows)

    def predict(self, cells: pd.DataFrame, models: FoldModels, train: pd.DataFrame) -> pd.DataFrame:
        rows = []
        for _, c in cells.iterrows():
            rows.extend(self.predict_cell(c, models, train))
        return pd.DataFrame(rows)


