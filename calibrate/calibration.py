"""Calibrate the simulator against run directories and validate it on held-out cells.

Pipeline (:func:`calibrate`):

1. Load every run directory (``measure.records.load_run``) and stack their
   cells; a cell is keyed by ``run`` + ``cell_id``.
2. Split the cells into folds by the ``holdout`` mode — leave one group out:

   * ``gamma``: one fold per γ policy (e.g. ``fixed:4``); a fold's cells are
     predicted from models fitted on every *other* γ's cells only.
   * ``domain``: one fold per domain (acceptance of the held-out domain comes
     from the same draft's rounds in the other domains).
   * ``k``: one fold per kept-vocabulary K of pruned heads (acceptance
     interpolated in log K between the neighbouring training K; draft step
     time from the K-term of the draft fit on the other K's timings).
   * ``none``: no fold; only in-sample numbers.
   * ``auto`` (the default): ``gamma`` when the cells have two or more γ
     policies; otherwise ``domain`` (two or more domains), then ``k`` (two
     or more kept-vocabulary K), else ``none``; :func:`choose_holdout` says
     in one line what it chose and why. A mode named explicitly that the
     cells cannot support is refused in one line naming the modes they can.

   **What is held out and what is not:** acceptance (rounds and traces),
   per-round overhead, the in-loop scale factors and the prefill (TTFT) fit
   come from training cells only (acceptance from every training cell, the
   timing fits from the stable ones only). The micro-benchmark tables
   ``cost_target.csv`` / ``cost_draft.csv`` are measured once per run,
   independently of γ and domain, so they are shared by every fold (for
   ``k`` the held-out K's ``cost_draft`` rows are dropped).
3. For each cell predict speedup and tokens/s three ways: closed form with
   the BIC-chosen acceptance model (``closed_form``), closed form replaying
   the recorded traces (``trace``), and the SimPy event simulator with the
   chosen model (``event_sim``, seeded).
4. Report per-cell absolute percentage errors and MAPE, in-sample (models
   fitted on every cell) and held-out.
5. The all-cell fit is what is written for ``python -m sim``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.fit_acceptance import AcceptanceFit, fit_acceptance, interpolate_models, trace_model
from calibrate.checks import curve_jumps
from calibrate.fit_cost import CostFit, LinearFit, TargetCurve, fit_cost, ols, target_curve
from measure.costpoints import screen_target
from measure.records import Run, damaged_cells, hardware_label, load_run
from sim.acceptance import AcceptanceModel, RunTraceAcceptance
from sim.analytic import predict_row
from sim.cost import CostModel
from sim.events import simulate_request
from sim.policies import GammaSpec

#: Hold-out modes that split the cells into folds (``auto`` resolves to one of them).
FOLD_MODES: tuple[str, ...] = ("gamma", "domain", "k", "none")
HOLDOUT_MODES: tuple[str, ...] = ("auto", *FOLD_MODES)
METHODS: tuple[str, ...] = ("closed_form", "trace", "event_sim")
CALIBRATION_SCHEMA_VERSION = 1
#: Seeded event-simulator requests averaged per prompt.
SIM_REPEATS = 4
#: γ values of the predicted speedup curves.
CURVE_GAMMAS = range(1, 11)


def _f(v) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return float("nan")
    return x


def _k_key(v) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) or pd.isna(v) else float(v)


@dataclass(frozen=True)
class Dataset:
    """Every run's tables stacked, with a ``run`` column naming the run directory."""

    runs: dict[str, Run]
    cells: pd.DataFrame
    rounds: pd.DataFrame
    generations: pd.DataFrame
    traces: pd.DataFrame
    notes: tuple[str, ...] = ()


# long: a long docstring of the refusals; the body checks each run in turn, one refusal per check
def load_runs(paths: list[str | Path], allow_incomplete: bool = False, pool_hardware: bool = False,
              exclude_damaged: bool = False) -> Dataset:
    """Load run directories (validated by :func:`measure.records.load_run`).

    One-line ``ValueError`` for a missing directory, a bad file, or a run
    that is not ``complete`` (running, interrupted, failed — a dead writer
    reads as interrupted) unless ``allow_incomplete``; for a run with a
    finished cell whose rows are incomplete or written twice
    (:func:`measure.records.damaged_cells`, the check a resume makes) unless
    ``exclude_damaged``, which leaves those cells out and names them. The
    same run given twice (same directory, or a copy with the same
    ``run_id``) is counted once, with a note in ``Dataset.notes``.
    """
    if not paths:
        raise ValueError("give at least one run directory")
    runs: dict[str, Run] = {}
    seen: dict[str, str] = {}
    notes: list[str] = []
    excluded: dict[str, set[str]] = {}
    for p in paths:
        p = Path(p)
        run = load_run(p)
        ident = f"{p.resolve()}"
        if ident in seen or run.run_id in seen:
            notes.append(f"{p} given twice (same run as {seen.get(ident) or seen.get(run.run_id)}): counted once")
            continue
        status = run.status
        if status != "complete":
            why = f" ({run.status_note})" if run.status_note else ""
            if not allow_incomplete:
                raise ValueError(f"{p}: run is {status}{why}, not complete; finish it (re-run measure with the same "
                                 "--out) or pass --allow-incomplete")
            notes.append(f"{p}: run is {status}{why}; used as is (--allow-incomplete)")
        if run.extension_status[1]:  # an unfinished extension: the run's cells are complete, some added ones missing
            notes.append(f"{p}: {run.extension_status[1]}; its finished cells are used")
        if not (p / "generations.csv").exists():
            raise ValueError(f"{p}: no generations.csv (a run written before measure recorded every generation); "
                             "calibrate needs it for prompt lengths and prefill times: re-measure with python -m measure")
        damage = damaged_cells(p, run.meta.get("config"))
        if damage:
            named = "; ".join(f"{d.cell_id}: {d.reason}" for d in damage[:3]) + (" ..." if len(damage) > 3 else "")
            if not exclude_damaged or any(d.cell_id == "*" for d in damage):
                raise ValueError(f"{p}: {len(damage)} finished cell(s) have damaged rows ({named}); re-run measure "
                                 "with the same --out to re-measure them" +
                                 ("" if any(d.cell_id == "*" for d in damage) else ", or pass --exclude-damaged"))
            notes.append(f"{p}: left out {len(damage)} damaged cell(s) (--exclude-damaged): {named}")
        label = p.resolve().name or "run"
        base, i = label, 2
        while label in runs:
            label = f"{base}-{i}"
            i += 1
        runs[label] = run
        excluded[label] = {d.cell_id for d in damage}
        seen[ident] = seen[run.run_id] = str(p)

    def stack(name: str) -> pd.DataFrame:
        frames = [r.table(name).assign(run=label) for label, r in runs.items()]
        frames = [f[~f["cell_id"].isin(excluded[label])] if excluded[label] else f
                  for f, label in zip(frames, runs)]
        frames = [f for f in frames if len(f)]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    cells = stack("cells")
    if cells.empty:
        raise ValueError(f"no finished cells (cells.csv) in {', '.join(str(p) for p in paths)}")
    cells["head_k"] = cells["head_k"].map(_k_key)
    cells["temperature"] = cells["temperature"].astype(float)
    cells["unstable"] = cells["unstable"].map(lambda v: v is True) if "unstable" in cells else False
    notes += _check_hardware(cells, runs, pool_hardware)
    return Dataset(runs, with_key(cells), with_key(stack("rounds")), with_key(stack("generations")),
                   with_key(stack("traces")), tuple(notes))


def with_key(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with its rows' cell ``key`` (``<run>/<cell_id>``, unique across runs), computed once on load."""
    if table.empty:
        return table
    return table.assign(key=table["run"] + "/" + table["cell_id"].astype(str))


def rows_of(table: pd.DataFrame, keys) -> pd.DataFrame:
    """The rows of a keyed table (:func:`with_key`) that belong to the cells ``keys``, in table order."""
    return table if table.empty else table[table["key"].isin(set(keys))]


def _check_hardware(cells: pd.DataFrame, runs: dict[str, Run], pool: bool) -> list[str]:
    """Fill ``cells["hardware"]`` (a cell's own, else its run's) and refuse cells from several machines.

    Timings from different hardware do not belong in one fit (a Ray sweep's
    cells may come from different nodes): one-line ``ValueError`` listing the
    machines, unless ``pool`` (``--pool-hardware``), which is noted instead.
    """
    run_hw = {label: hardware_label(r.meta.get("hardware")) for label, r in runs.items()}
    own = cells["hardware"] if "hardware" in cells else pd.Series([None] * len(cells), index=cells.index)
    cells["hardware"] = [h if isinstance(h, str) and h else run_hw[r] for h, r in zip(own, cells["run"])]
    counts = cells["hardware"].value_counts()
    if len(counts) < 2:
        return []
    listing = "; ".join(f"{hw} ({n} cells)" for hw, n in counts.items())
    if not pool:
        raise ValueError(f"cells measured on {len(counts)} different machines ({listing}): calibrate the cells of one "
                         "machine at a time, or pass --pool-hardware to fit them together anyway")
    return [f"cells of {len(counts)} different machines pooled in one fit (--pool-hardware): {listing}"]


_FOLD_COLUMN = {"gamma": "gamma_policy", "domain": "domain", "k": "head_k"}
_FOLD_NOUN = {"gamma": "γ policies", "domain": "domains", "k": "kept-vocabulary K values"}


def _fold_values(cells: pd.DataFrame, mode: str) -> list:
    values = cells[_FOLD_COLUMN[mode]].dropna().unique()
    return sorted(values, key=lambda v: (str(type(v)), v))


@dataclass(frozen=True)
class HoldoutChoice:
    """The hold-out mode a calibration uses and, when ``auto`` chose it, the one line saying why."""

    mode: str
    requested: str
    note: str

    @property
    def adapted(self) -> bool:
        """True when ``auto`` fell back from the usual leave-one-γ-out (the note then goes into calibration.json)."""
        return self.requested == "auto" and self.mode != "gamma"


def _list(values: list) -> str:
    return ", ".join(str(int(v)) if isinstance(v, float) and v.is_integer() else str(v) for v in values)


def choose_holdout(cells: pd.DataFrame, requested: str = "auto") -> HoldoutChoice:
    """Resolve ``requested`` (``auto`` or a mode of :data:`FOLD_MODES`) against the cells.

    ``auto``: leave one γ policy out when there are two or more; otherwise one
    domain, then one K; else nothing (in-sample only). A mode named explicitly
    that the cells cannot support raises ``ValueError`` naming the modes that
    would work.
    """
    if requested not in HOLDOUT_MODES:
        raise ValueError(f"unknown --holdout {requested!r}; valid: {', '.join(HOLDOUT_MODES)}")
    counts = {m: _fold_values(cells, m) for m in _FOLD_COLUMN}
    possible = [m for m in _FOLD_COLUMN if len(counts[m]) >= 2]
    if requested != "auto":
        if requested != "none" and requested not in possible:
            found = counts[requested]
            fix = " or ".join(f"--holdout {m} ({len(counts[m])} {_FOLD_NOUN[m]})" for m in possible)
            raise ValueError(
                f"--holdout {requested}: need at least 2 distinct {_FOLD_COLUMN[requested]} values to hold one "
                f"out, found {len(found)} ({_list(found) or 'none'}); use {fix + ' or ' if fix else ''}"
                "--holdout none (in-sample only), or leave --holdout out to let calibrate choose")
        return HoldoutChoice(requested, requested, f"hold-out: {requested} (--holdout {requested})")
    if "gamma" in possible:
        return HoldoutChoice("gamma", "auto", f"hold-out: gamma (the default: each of the {len(counts['gamma'])} "
                                              "γ policies predicted from the others)")
    gammas = _list(counts["gamma"]) or "none"
    for mode in ("domain", "k"):
        if mode in possible:
            return HoldoutChoice(mode, "auto", (
                f"hold-out: {mode}, not gamma (the run has one γ policy, {gammas}): each of the "
                f"{len(counts[mode])} {_FOLD_NOUN[mode]} predicted from the others; measure a second γ "
                "(--gamma 2,4) to hold out by γ"))
    return HoldoutChoice("none", "auto", (
        f"hold-out: none (one γ policy, {gammas}, one domain, {_list(counts['domain']) or 'none'}: nothing to hold "
        "out); the errors below are in-sample only; measure a second γ (--gamma 2,4) for a held-out check"))


def holdout_folds(cells: pd.DataFrame, mode: str) -> list[tuple[str, pd.Series]]:
    """Leave-one-group-out folds: (label, boolean mask of the held-out cells); ``mode`` may be ``auto``."""
    mode = choose_holdout(cells, mode).mode
    if mode == "none":
        return []
    col = _FOLD_COLUMN[mode]
    return [(f"{col}={v}", cells[col] == v) for v in _fold_values(cells, mode)]


@dataclass(frozen=True)
class AcceptanceGroup:
    """Cells whose rounds share one acceptance fit: ``draft=..|temp=..|domain=..[|head_k=..]`` on disk."""

    draft: str
    temperature: float
    domain: str
    head_k: int | None = None

    @classmethod
    def of_cell(cls, row: pd.Series) -> "AcceptanceGroup":
        k = row["head_k"]
        return cls(str(row["draft"]), float(row["temperature"]), str(row["domain"]),
                   None if k is None or pd.isna(k) else int(k))

    def to_str(self) -> str:
        k = "" if self.head_k is None else f"|head_k={self.head_k}"
        return f"draft={self.draft}|temp={self.temperature:g}|domain={self.domain}{k}"

    @classmethod
    def parse(cls, text: str) -> "AcceptanceGroup":
        parts = dict(p.partition("=")[::2] for p in str(text).split("|"))
        if not {"draft", "temp", "domain"} <= set(parts) or set(parts) - {"draft", "temp", "domain", "head_k"}:
            raise ValueError(f"acceptance group {text!r}: expected draft=..|temp=..|domain=..[|head_k=..]")
        hk = parts.get("head_k")
        return cls(parts["draft"], float(parts["temp"]), parts["domain"], None if hk is None else int(hk))

    def file_name(self, suffix: str = "") -> str:
        """``acceptance-<draft>-<domain>-t<temp>[-k<K>]<suffix>.json``."""
        k = "" if self.head_k is None else f"-k{self.head_k}"
        return f"acceptance-{slug(self.draft)}-{slug(self.domain)}-t{slug(f'{self.temperature:g}')}{k}{suffix}.json"


def acceptance_groups(cells: pd.DataFrame) -> list[tuple[AcceptanceGroup, pd.DataFrame]]:
    """``cells`` split by acceptance group, in the order of the groups' strings."""
    labels = cells.apply(lambda r: AcceptanceGroup.of_cell(r).to_str(), axis=1)
    return [(AcceptanceGroup.parse(str(label)), sub) for label, sub in cells.groupby(labels)]


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
        "measured_speedup_lo": _f(cell.get("speedup_lo")), "measured_speedup_hi": _f(cell.get("speedup_hi")),
        "unstable": bool(cell.get("unstable", False)),
        "measured_tokens_per_s": float(cell["tokens_per_s_speculative"]),
        "measured_tokens_per_s_baseline": float(cell["tokens_per_s_baseline"]),
    }


def _mean_tokens_per_s(walls: list[tuple[float, float, float]]) -> tuple[float, float]:
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
                self._targets[run_label] = target_curve(screened.kept)
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
                cd = cd[cd["head_k"].map(_k_key) != drop_k]
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
                hk = _k_key(hk)
                tr = cost_run[cost_run["draft"] == draft]
                cd_k = cd
                if hk is not None:
                    same_k = tr[tr["head_k"] == hk]
                    if len(same_k):
                        tr = same_k  # in-loop scales from this K's own training rounds
                    if not cd.empty and (cd["head_k"].map(_k_key) == hk).any():
                        cd_k = cd[cd["head_k"].map(_k_key) == hk]  # this K was timed: no K-term needed
                try:
                    cost[(run_label, draft, hk)] = fit_cost(
                        str(draft), run.table("cost_target"), cd_k, self._rounds_of(tr["key"]),
                        self._gens_of(tr["key"], "baseline"), head_k=hk, target=self._target_curve(run_label))
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
                tps_s, tps_b = _mean_tokens_per_s(walls)
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


def add_errors(pred: pd.DataFrame) -> pd.DataFrame:
    """Absolute percentage errors of speedup and tokens/s (in %)."""
    p = pred.copy()
    p["ape_speedup_pct"] = 100 * (p["predicted_speedup"] - p["measured_speedup"]).abs() / p["measured_speedup"]
    p["ape_tokens_per_s_pct"] = (100 * (p["predicted_tokens_per_s"] - p["measured_tokens_per_s"]).abs()
                                 / p["measured_tokens_per_s"])
    if "measured_speedup_lo" in p:
        lo, hi, pr = p["measured_speedup_lo"], p["measured_speedup_hi"], p["predicted_speedup"]
        known = lo.notna() & hi.notna() & pr.notna()
        p["inside_ci"] = ((pr >= lo) & (pr <= hi)).where(known, None)
    else:
        p["inside_ci"] = None
    return p


def mape_table(pred: pd.DataFrame) -> dict:
    """{method: {speedup_mape_pct, tokens_per_s_mape_pct, n_cells, n_inside_ci, n_with_ci, share_inside_ci}}.

    Over stable cells only (NaN predictions skipped); unstable cells are in :func:`unstable_table`.
    """
    out = {}
    if "unstable" in pred:
        pred = pred[~pred["unstable"].astype(bool)]
    for m, sub in pred.groupby("method"):
        ok = sub.dropna(subset=["ape_speedup_pct"])
        ci = ok[ok["inside_ci"].notna()] if "inside_ci" in ok else ok.iloc[0:0]
        n_in = int(ci["inside_ci"].astype(bool).sum()) if len(ci) else 0
        out[str(m)] = {
            "speedup_mape_pct": float(ok["ape_speedup_pct"].mean()) if len(ok) else None,
            "tokens_per_s_mape_pct": float(ok["ape_tokens_per_s_pct"].mean()) if len(ok) else None,
            "n_cells": int(len(ok)),
            "n_inside_ci": n_in, "n_with_ci": int(len(ci)),
            "share_inside_ci": n_in / len(ci) if len(ci) else None,
        }
    return out


def unstable_table(pred: pd.DataFrame) -> dict:
    """The same numbers as :func:`mape_table` over the unstable cells only (reported apart, never fitted)."""
    if "unstable" not in pred or not pred["unstable"].astype(bool).any():
        return {}
    sub = pred[pred["unstable"].astype(bool)].assign(unstable=False)
    return mape_table(sub)


@dataclass(frozen=True)
class CalibrationResult:
    """Everything a calibration produced (written to disk by :func:`write_outputs`)."""

    data: Dataset
    holdout: str  # the mode used (never "auto")
    models: FoldModels  # fitted on every cell
    in_sample: pd.DataFrame
    held_out: pd.DataFrame  # empty for holdout "none"
    mape_in_sample: dict
    mape_held_out: dict
    folds: tuple[dict, ...]
    curves: pd.DataFrame  # predicted speedup against γ per series (all-cell models)
    unstable_held_out: dict = field(default_factory=dict)  # mape_table of the unstable cells, reported apart
    unstable_cells: tuple[str, ...] = ()
    #: per draft, the acceptance fit on all of its cells' rounds (what ``acceptance-<draft>.json`` holds)
    pooled_acceptance: dict[str, AcceptanceFit] = field(default_factory=dict)
    #: per acceptance group, its greedy proposal-run trace (exact replay in ``python -m sim``), where recorded
    group_traces: dict[AcceptanceGroup, RunTraceAcceptance] = field(default_factory=dict)
    #: what ``--holdout`` resolved to, and the one line saying so
    holdout_choice: HoldoutChoice | None = None


def pooled_acceptance(data: Dataset) -> dict[str, AcceptanceFit]:
    """Per draft, the acceptance fit on every one of its cells' rounds."""
    out = {}
    for draft, sub in data.cells.groupby("draft"):
        rounds = rows_of(data.rounds, sub["key"])
        if len(rounds):
            out[str(draft)] = fit_acceptance(rounds, f"draft={draft} (all cells)")
    return out


def group_traces(data: Dataset) -> dict[AcceptanceGroup, RunTraceAcceptance]:
    """Per acceptance group, the proposal-run trace of its cells (greedy runs that recorded one)."""
    tr = data.traces
    if tr.empty or not {"proposed", "accept_run"} <= set(tr.columns):
        return {}
    out = {}
    for grp, sub in acceptance_groups(data.cells):
        model = trace_model(rows_of(tr, sub["key"]))
        if isinstance(model, RunTraceAcceptance):
            out[grp] = model
    return out


def calibrate(paths: list[str | Path], holdout: str = "auto", seed: int = 0,
              allow_incomplete: bool = False, pool_hardware: bool = False,
              exclude_damaged: bool = False) -> CalibrationResult:
    """Fit on the run directories and validate on held-out cells (see module docstring).

    Unstable cells (``cells.csv`` ``unstable``) stay in the cost fit with the
    weight of their variance (the in-loop scales combine cells by inverse
    variance, :func:`calibrate.fit_cost.cell_weighted_ratio`), are left out
    of the prefill fit, and are predicted like the others, but their errors
    are reported apart (``CalibrationResult.unstable_held_out``), never in the
    MAPE. Their acceptance (rounds, traces) is kept in the fits: which tokens
    were accepted does not depend on how fast the machine was. ``holdout``
    ``auto`` is resolved by :func:`choose_holdout`.
    """
    if holdout not in HOLDOUT_MODES:
        raise ValueError(f"unknown --holdout {holdout!r}; valid: {', '.join(HOLDOUT_MODES)}")
    data = load_runs(paths, allow_incomplete=allow_incomplete, pool_hardware=pool_hardware,
                     exclude_damaged=exclude_damaged)
    choice = choose_holdout(data.cells, holdout)
    holdout = choice.mode
    folds = holdout_folds(data.cells, holdout)
    cal = Calibrator(data, seed=seed)
    flagged = data.cells["unstable"].astype(bool)
    stable = ~flagged  # the cells the timing fits use
    if not stable.any():  # a busy machine touches every interleaved cell: fit on all of them, and say so
        stable = flagged
        data = replace(data, notes=data.notes + (
            "every cell is flagged unstable: the prefill fit uses all of them and is as noisy as they are; "
            "re-measure on a quiet machine (measure --until-stable N or more --repeats)",))
    all_models = cal.fit(data.cells[stable], "all", acceptance_train=data.cells, cost_train=data.cells)
    in_sample = add_errors(cal.predict(data.cells, all_models, data.cells))
    held = []
    fold_info = []
    for label, mask in folds:
        train_all, test = data.cells[~mask], data.cells[mask]
        train = train_all[stable[~mask]]
        prefill_train = train if len(train) else train_all
        drop_k = float(test["head_k"].iloc[0]) if holdout == "k" else None
        models = cal.fit(prefill_train, label, drop_k=drop_k, acceptance_train=train_all, cost_train=train_all)
        held.append(cal.predict(test, models, train_all))
        fold_notes = list(models.notes) + ([] if len(train) else [
            "no stable training cell in this fold: the prefill fit uses the unstable ones"])
        fold_info.append({"fold": label, "train_cells": list(prefill_train["key"]),
                          "cost_train_cells": list(train_all["key"]),
                          "acceptance_train_cells": list(train_all["key"]), "test_cells": list(test["key"]),
                          "notes": fold_notes})
    held_out = add_errors(pd.concat(held, ignore_index=True)) if held else pd.DataFrame()
    curves = cal.curves(data.cells, all_models, CURVE_GAMMAS)
    data = replace(data, notes=data.notes + tuple(dict.fromkeys(cal.notes)) + tuple(curve_jumps(curves)))
    return CalibrationResult(data, holdout, all_models, in_sample, held_out, mape_table(in_sample),
                             mape_table(held_out) if len(held_out) else {}, tuple(fold_info), curves,
                             unstable_table(held_out) if len(held_out) else unstable_table(in_sample),
                             tuple(data.cells.loc[flagged, "key"]), pooled_acceptance(data), group_traces(data),
                             choice)


def slug(text: str) -> str:
    """File-name-safe form of a draft or run name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(text)).strip("_") or "x"


HOLDOUT_EXPLANATION = {
    "gamma": "leave-one-γ-policy-out: each γ's cells predicted from acceptance, overhead, in-loop scales and "
             "prefill fitted on the other γ's cells; cost_target/cost_draft micro-benchmarks (γ-independent) shared",
    "domain": "leave-one-domain-out: acceptance of the held-out domain pooled from the same draft's other domains; "
              "cost micro-benchmarks (domain-independent) shared",
    "k": "leave-one-K-out: acceptance interpolated in log K between training K's; the held-out K's cost_draft rows "
         "dropped, its draft step from the K-term of the draft fit",
    "none": "no held-out cells; in-sample only",
}
