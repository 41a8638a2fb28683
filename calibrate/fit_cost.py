"""Fit the cost model (``sim.cost.TabulatedCost``) to timed forwards and rounds.

Linear models, solved by least squares (``scipy.linalg.lstsq``), with
ordinary-least-squares standard errors ``sqrt(diag(σ² (XᵀX)⁻¹))`` and the
residual RMS reported for each fit. Timings are first reduced to the median
of their repeats (CPU timing noise is heavy-tailed; the median of repeats is
what is fitted).

* Target forward (``cost_target.csv``)::

      ms(n, ctx) = b_n + (s_0 + s_1 · n) · (ctx − ctx_ref)

  one free intercept ``b_n`` per number of tokens ``n`` (no linearity in n is
  assumed: on CPU 2–3 tokens can cost more than 4–8) and a context slope
  that grows linearly with ``n`` — reading the cached keys and values costs
  the same for any ``n`` (``s_0``), attention adds ``n`` queries' worth per
  cached token (``s_1``). On a committed CPU run a 1-token forward was flat
  in context from 64 to 256 tokens while a 6-token one gained 30 ms, so one
  slope shared by every ``n`` put a 10% error on the baseline of long
  prompts; one free slope per ``n`` (16 of them, each from three noisy
  contexts) put its noise into every held-out prediction instead (mean
  held-out speedup MAPE over eleven committed runs, event simulator: 6.61%
  per-n, 5.68% shared, 5.59% linear; trace 5.74 / 5.27 / 5.04%).
  ``fit_target(slopes="per_n" | "shared")`` fits the other two. ``b_n``
  becomes ``TabulatedCost.verify_ms_by_tokens``, ``s_0 + s_1 n``
  ``TabulatedCost.context_ms_per_token_by_tokens``.
* Draft step (``cost_draft.csv``, one draft)::

      ms(ctx, K) = d + s_draft · (ctx − ctx_ref) [+ d_K · (K − K_ref)]

  the ``K`` term only when the draft has a pruned head with several kept
  vocabulary sizes.
* Per-round overhead (``rounds.csv``): the mean ``overhead_ms`` of the
  training rounds, with its standard error.
* In-loop scale factors (``rounds.csv``): a forward timed inside the decoding
  loop need not cost what the isolated micro-benchmark says (cache state,
  allocator, thread pools). ``draft_scale`` = Σ measured draft_ms / Σ
  micro-benchmark draft_ms over the training rounds that drafted tokens (a
  round is charged for the ``drafted`` tokens it actually drafted, which a
  lookup draft may make fewer than γ), ``verify_scale`` the same for
  verification of ``drafted + 1`` tokens, ``baseline_scale`` the same for the baseline decode steps
  (from ``generations.csv``). They multiply the tabulated times; each is
  reported with a standard error, and a value far from 1 says the
  micro-benchmark misrepresents the loop. With rows of several cells, each
  cell's ratio (its standard error across the cell's generations) is
  combined by inverse variance (:func:`cell_weighted_ratio`): a cell whose
  generations disagree — an unstable cell, timed while the machine was
  busy — counts for less instead of being dropped.

**Physical values only.** Every linear fit is bounded least squares
(:func:`bounded_ols`: ``scipy.optimize.lsq_linear``, BVLS), solved in the
parameters a physical model bounds: a forward's time at context 0 is
positive (at least :data:`MIN_STEP_MS`), every cost per context token (and
per kept vocabulary entry) is non-negative. Where the data fit them without
the bounds the result is the ordinary least-squares one; where they cannot
support a parameter — its unconstrained estimate is negative (a busy
machine: a few slow timings at short context make a longer context look
cheaper), or the table has too few contexts to fit it at all — the
parameter is held at its bound, which is a stated simpler model (a slope
held at 0: a forward flat in context), and a :class:`Fallback` says so in
one line (``python -m calibrate`` prints it as a note) and names it in the
cost model's metadata (``fit_fallbacks``). A parameter held at its bound has
no standard error (``null``).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, replace
import numpy as np
import pandas as pd
from scipy import linalg, optimize

from measure.analysis import drafted_counts
from sim.cost import TabulatedCost


@dataclass(frozen=True)
class ParamName:
    """The identity of a fitted parameter: a base name and, for per-token-count ones, ``n`` (``verify_ms_n4``)."""

    base: str
    n_tokens: int | None = None

    def to_str(self) -> str:
        return self.base if self.n_tokens is None else f"{self.base}_n{self.n_tokens}"

    @classmethod
    def parse(cls, text: str) -> "ParamName":
        m = re.fullmatch(r"(.+)_n(\d+)", text)
        return cls(m.group(1), int(m.group(2))) if m else cls(text)


#: Per-n intercepts and context slopes of the target fit.
VERIFY_MS, TARGET_SLOPE = "verify_ms", "target_ms_per_context_token"


@dataclass(frozen=True)
class Param:
    """A fitted parameter with its standard error (NaN when not identifiable)."""

    name: str
    value: float
    stderr: float
    unit: str

    def as_dict(self) -> dict:
        return asdict(self)


#: The least time a fitted forward takes at context 0 (ms): a step cost is positive, never zero or negative.
MIN_STEP_MS = 1e-6


@dataclass(frozen=True)
class Fallback:
    """A parameter the data could not support: held at its physical bound, the simpler model fitted, and why.

    ``unconstrained`` is the parameter's ordinary least-squares estimate
    (None when there were too few points to estimate it at all).
    """

    fit: str  # which fit: "target forward", "draft 'ngram:3' step", "round overhead"
    parameter: str
    unconstrained: float | None
    held_at: float
    unit: str
    model: str  # the model fitted instead
    why: str

    def held_text(self) -> str:
        est = "" if self.unconstrained is None else f" (unconstrained {self.unconstrained:.4g} {self.unit})"
        return f"{self.parameter}{est} held at {self.held_at:g}"

    def as_dict(self) -> dict:
        return asdict(self)


def fallback_lines(fallbacks: tuple[Fallback, ...] | list[Fallback]) -> list[str]:
    """One line per fit that held parameters at their bounds: which, why, and the simpler model fitted."""
    by_fit: dict[tuple[str, str, str], list[Fallback]] = {}
    for f in fallbacks:
        by_fit.setdefault((f.fit, f.model, f.why), []).append(f)
    return [f"{fit}: the data cannot support {', '.join(f.held_text() for f in fs)} ({why}); fitted the simpler "
            f"model {model}" for (fit, model, why), fs in by_fit.items()]


@dataclass(frozen=True)
class LinearFit:
    """Result of one least-squares fit (and the parameters it held at their physical bounds)."""

    params: tuple[Param, ...]
    residual_rms_ms: float
    n_points: int
    formula: str
    fallbacks: tuple[Fallback, ...] = ()

    def value(self, name: str | ParamName) -> float:
        name = name.to_str() if isinstance(name, ParamName) else name
        for p in self.params:
            if p.name == name:
                return p.value
        raise KeyError(name)

    def has(self, name: str) -> bool:
        return any(p.name == name for p in self.params)

    def by_tokens(self, base: str) -> dict[int, float]:
        """``{n: value}`` of the per-token-count parameters ``<base>_n<n>``."""
        out = {}
        for p in self.params:
            pn = ParamName.parse(p.name)
            if pn.base == base and pn.n_tokens is not None:
                out[pn.n_tokens] = p.value
        return out

    def as_dict(self) -> dict:
        return {"formula": self.formula, "n_points": self.n_points, "residual_rms_ms": self.residual_rms_ms,
                "params": [p.as_dict() for p in self.params], "fallbacks": [f.as_dict() for f in self.fallbacks]}


def ols(x: np.ndarray, y: np.ndarray, names: list[str], units: list[str], formula: str) -> LinearFit:
    """Least squares ``y ≈ x @ β`` with OLS standard errors."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.shape[0] < x.shape[1]:
        raise ValueError(f"cannot fit {formula}: {x.shape[0]} points for {x.shape[1]} parameters")
    beta, _, rank, _ = linalg.lstsq(x, y)
    resid = y - x @ beta
    dof = x.shape[0] - x.shape[1]
    sigma2 = float(resid @ resid / dof) if dof > 0 else float("nan")
    if rank == x.shape[1] and dof > 0:
        cov = sigma2 * linalg.pinv(x.T @ x)
        se = np.sqrt(np.clip(np.diag(cov), 0, None))
    else:
        se = np.full(x.shape[1], float("nan"))
    params = tuple(Param(n, float(b), float(s), u) for n, b, s, u in zip(names, beta, se, units))
    return LinearFit(params, float(np.sqrt(np.mean(resid**2))), int(x.shape[0]), formula)


def _restricted_ols(x: np.ndarray, y: np.ndarray, lower: np.ndarray,
                    held: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Least squares with the ``held`` parameters fixed at ``lower``: (θ, covariance of θ, residuals).

    The held parameters have no variance; the free ones the OLS covariance
    (NaN when the free design is rank deficient or has no residual degree of freedom).
    """
    free = ~held
    theta = np.where(held, lower, 0.0)
    cov = np.zeros((x.shape[1], x.shape[1]))
    if free.any():
        xf = x[:, free]
        beta, _, rank, _ = linalg.lstsq(xf, y - x[:, held] @ lower[held])
        theta[free] = beta
    resid = y - x @ theta
    dof = x.shape[0] - int(free.sum())
    if free.any():
        ok = rank == int(free.sum()) and dof > 0
        cov[np.ix_(free, free)] = (float(resid @ resid / dof) * linalg.pinv(xf.T @ xf) if ok
                                   else np.full((int(free.sum()),) * 2, float("nan")))
    return theta, cov, resid


@dataclass(frozen=True)
class Bounds:
    """The physical bounds of a linear fit, in the parameters they bound.

    ``x`` is the design in those parameters (a time at context 0, costs per
    token), ``lower`` their lower bounds and ``names`` how a held one is
    named; the fitted parameters are reported in the caller's design (a time
    at the reference context), the same model: ``x = x_report @ T``.
    """

    x: np.ndarray
    lower: np.ndarray
    names: tuple[str, ...]
    units: tuple[str, ...]


def bounded_ols(x_report: np.ndarray, y: np.ndarray, names: list[str], units: list[str], formula: str,
                bounds: Bounds, fit: str, noise: tuple[np.ndarray, np.ndarray] | None = None) -> LinearFit:
    """Least squares under lower bounds (``scipy.optimize.lsq_linear``, BVLS), reported like :func:`ols`.

    Where the unconstrained solution respects ``bounds`` it is the answer
    (identical to :func:`ols`); otherwise the bounded solution's active
    parameters are held at their bounds, the others refitted by OLS (their
    standard errors), and each held parameter is a :class:`Fallback` of
    the returned fit (``fit`` names it). ``noise``: the same bounded design
    on every repeat, ``(x, y)``; when given, the standard errors and the
    residual RMS come from it (the values stay those of ``x_report``, ``y``).
    """
    x = np.asarray(bounds.x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.shape[0] < x.shape[1]:
        raise ValueError(f"cannot fit {formula}: {x.shape[0]} points for {x.shape[1]} parameters")
    lower = np.asarray(bounds.lower, dtype=float)
    unconstrained = linalg.lstsq(x, y)[0]
    held = np.zeros(x.shape[1], dtype=bool)
    if np.any(unconstrained < lower):
        held = optimize.lsq_linear(x, y, bounds=(lower, np.full_like(lower, np.inf)), method="bvls").active_mask < 0
    theta, cov, resid = _restricted_ols(x, y, lower, held)
    theta = np.maximum(theta, lower)  # BVLS's active set makes the free values feasible; this is rounding only
    n_points = x.shape[0]
    if noise is not None:
        _, cov, resid = _restricted_ols(np.asarray(noise[0], float), np.asarray(noise[1], float), lower, held)
        n_points = len(noise[1])
    to_report = linalg.lstsq(np.asarray(x_report, dtype=float), x)[0]  # x = x_report @ T: reported = T θ
    to_report[np.abs(to_report) < 1e-12] = 0.0
    values = to_report @ theta
    se = np.full(len(values), np.nan)
    for j, row in enumerate(to_report):
        nz = (row != 0) & ~held  # a held parameter has no variance
        if nz.any():  # else only held parameters: not estimated, no standard error
            se[j] = math.sqrt(max(float(row[nz] @ cov[np.ix_(nz, nz)] @ row[nz]), 0.0))
    rms = float(np.sqrt(np.mean(resid ** 2)))
    simpler = formula.split("  [")[0] + (
        " with " + ", ".join(f"{n} = {lo:g}" for n, lo, h in zip(bounds.names, lower, held) if h) if held.any() else "")
    why = (f"unbounded, the fit crosses a physical bound: noisy timings, e.g. a busy machine; residual RMS "
           f"{rms:.3g} ms over {n_points} points")
    fallbacks = tuple(Fallback(fit, name, float(u), float(lo), unit, simpler, why)
                      for name, unit, u, lo, h in zip(bounds.names, bounds.units, unconstrained, lower, held) if h)
    params = tuple(Param(n, float(v), float(s), u) for n, v, s, u in zip(names, values, se, units))
    return LinearFit(params, rms, int(n_points), formula, fallbacks)


def _medians(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    return df.groupby(keys, as_index=False, dropna=False)["ms"].median()


#: How ``fit_target`` models the context slope of an ``n``-token forward (:func:`fit_target`).
SLOPE_MODELS: tuple[str, ...] = ("linear", "per_n", "shared")
#: The two parameters of the ``linear`` slope model: ``s_n = s_0 + s_1 · n``.
SLOPE_BASE, SLOPE_PER_TOKEN = "target_ms_per_context_token_base", "target_ms_per_context_token_per_query"


def _too_few(fit: str, parameter: str, unit: str, model: str, why: str) -> Fallback:
    """A parameter the table has too few points to fit: held at 0, the simpler ``model`` fitted."""
    return Fallback(fit, parameter, None, 0.0, unit, model, why)


# long: chooses the slope model the table supports (each simpler choice a Fallback), then one bounded design
def fit_target(cost_target: pd.DataFrame, slopes: str = "linear") -> tuple[LinearFit, float]:
    """Per-n intercepts + a context slope model; returns (fit, reference context).

    ``slopes``: ``linear`` (the default) — ``s_n = s_0 + s_1 · n``;
    ``per_n`` — one free slope per ``n``; ``shared`` — one slope for every
    ``n`` (module docstring: why linear). Values come from the medians of
    the repeats (CPU timing noise is heavy tailed). With per-n or linear
    slopes the standard errors and the residual RMS come from the same
    design fitted on every repeat (with per-n slopes and two contexts the
    medians determine the fit exactly): the repeats' spread is the noise.
    Bounded (module docstring): every forward positive at context 0, every
    slope non-negative; a slope model the table cannot support (one context,
    one token count) falls back to a simpler one, and says so
    (:attr:`LinearFit.fallbacks`).
    """
    if slopes not in SLOPE_MODELS:
        raise ValueError(f"slopes {slopes!r}: unknown; valid: {', '.join(SLOPE_MODELS)}")
    if cost_target.empty:
        raise ValueError("cost_target.csv has no rows: cannot fit the target forward time")
    med = _medians(cost_target, ["n_tokens", "context_tokens"])
    ns = sorted(int(n) for n in med["n_tokens"].unique())
    if 1 not in ns:
        raise ValueError("cost_target.csv has no n_tokens=1 rows: cannot fit the baseline step")
    ctx_ref = float(med["context_tokens"].mean())
    varies = med["context_tokens"].nunique() > 1
    per_n = slopes == "per_n" and varies and bool((med.groupby("n_tokens")["context_tokens"].nunique() > 1).all())
    linear = slopes == "linear" and varies and len(ns) > 1
    names = [ParamName(VERIFY_MS, n).to_str() for n in ns]
    units = ["ms"] * len(ns)
    too_few: list[Fallback] = []
    if per_n:
        names += [ParamName(TARGET_SLOPE, n).to_str() for n in ns]
        units += ["ms/token"] * len(ns)
        formula = "ms = b_n + s_n * (context_tokens - ctx_ref)"
    elif linear:
        names += [SLOPE_BASE, SLOPE_PER_TOKEN]
        units += ["ms/token", "ms/token"]
        formula = "ms = b_n + (s_0 + s_1 * n) * (context_tokens - ctx_ref)"
    elif varies:
        names.append(TARGET_SLOPE)
        units.append("ms/token")
        formula = "ms = b_n + s_target * (context_tokens - ctx_ref)"
        if slopes != "shared":
            too_few.append(_too_few("target forward", "a context slope per token count", "ms/token", formula,
                                    "cost_target.csv times " + ("one token count" if slopes == "linear" else
                                                                "some token counts at one context") +
                                    ": too few points for a slope that depends on n"))
    else:
        formula = "ms = b_n"
        too_few.append(_too_few("target forward", "the context slope", "ms/token", formula + " (flat in context)",
                                f"cost_target.csv times one context ({ctx_ref:g} tokens): a slope needs two"))

    def design(df: pd.DataFrame, centre: float) -> np.ndarray:
        n_col = df["n_tokens"].to_numpy()
        dctx = df["context_tokens"].to_numpy(dtype=float) - centre
        cols = [(n_col == n).astype(float) for n in ns]
        if per_n:
            cols += [(n_col == n).astype(float) * dctx for n in ns]
        elif linear:
            cols += [dctx, n_col.astype(float) * dctx]
        elif varies:
            cols.append(dctx)
        return np.column_stack(cols)

    n_slopes = len(names) - len(ns)
    bounds = Bounds(design(med, 0.0), np.array([MIN_STEP_MS] * len(ns) + [0.0] * n_slopes),
                    tuple(f"{n} at context 0" for n in names[:len(ns)]) + tuple(names[len(ns):]), tuple(units))
    repeats = (per_n or linear) and len(cost_target) > len(med)
    noise = (design(cost_target, 0.0), cost_target["ms"].to_numpy(dtype=float)) if repeats else None
    fit = bounded_ols(design(med, ctx_ref), med["ms"].to_numpy(dtype=float), names, units,
                      formula + ("  [values: medians of repeats; SE: repeats]" if repeats else ""), bounds,
                      "target forward", noise)
    return replace(fit, fallbacks=tuple(too_few) + fit.fallbacks), ctx_ref


def fit_draft(cost_draft: pd.DataFrame, ctx_ref: float, label: str = "draft step") -> tuple[LinearFit, float | None]:
    """Draft step against context (and kept vocabulary K when several are timed).

    Bounded like :func:`fit_target`: the step positive at context 0 (and
    K = 0), its costs per context token and per kept vocabulary entry
    non-negative; one timed context is a step flat in context, and says so.
    ``label`` names the fit in its fallbacks. Returns (fit, K_ref or None).
    """
    if cost_draft.empty:
        raise ValueError("no cost_draft.csv rows for this draft")
    df = cost_draft.copy()
    has_k = "head_k" in df.columns and df["head_k"].notna().any() and df["head_k"].nunique() > 1
    keys = ["context_tokens"] + (["head_k"] if has_k else [])
    med = _medians(df, keys)
    ctx = med["context_tokens"].to_numpy(dtype=float)
    cols, fit_cols = [np.ones(len(med))], [np.ones(len(med))]
    names, units, held_names = ["draft_step_ms"], ["ms"], ["draft_step_ms at context 0"]
    formula = "ms = d"
    too_few: list[Fallback] = []
    if med["context_tokens"].nunique() > 1:
        cols.append(ctx - ctx_ref)
        fit_cols.append(ctx)
        names.append("draft_ms_per_context_token")
        units.append("ms/token")
        held_names.append("draft_ms_per_context_token")
        formula += " + s_draft * (context_tokens - ctx_ref)"
    else:
        too_few.append(_too_few(label, "the context slope", "ms/token", "ms = d (flat in context)",
                                f"cost_draft.csv times one context ({ctx[0]:g} tokens): a slope needs two"))
    k_ref = None
    if has_k:
        k_ref = float(med["head_k"].mean())
        cols.append(med["head_k"].to_numpy(dtype=float) - k_ref)
        fit_cols.append(med["head_k"].to_numpy(dtype=float))
        names.append("draft_ms_per_head_k")
        units.append("ms/vocab entry")
        held_names.append("draft_ms_per_head_k")
        formula += " + d_K * (head_k - K_ref)"
    bounds = Bounds(np.column_stack(fit_cols), np.array([MIN_STEP_MS] + [0.0] * (len(names) - 1)),
                    tuple(held_names), tuple(units))
    fit = bounded_ols(np.column_stack(cols), med["ms"].to_numpy(dtype=float), names, units, formula, bounds, label)
    return replace(fit, fallbacks=tuple(too_few) + fit.fallbacks), k_ref


def _ratio_param(name: str, measured: np.ndarray, modelled: np.ndarray) -> Param:
    """Σ measured / Σ modelled, with the standard error of that ratio estimator."""
    measured = np.asarray(measured, dtype=float)
    modelled = np.asarray(modelled, dtype=float)
    ok = np.isfinite(measured) & np.isfinite(modelled) & (modelled > 0)
    measured, modelled = measured[ok], modelled[ok]
    if measured.size == 0:
        return Param(name, 1.0, float("nan"), "×")
    r = measured.sum() / modelled.sum()
    if measured.size < 2:
        return Param(name, float(r), float("nan"), "×")
    # delta-method SE of a ratio estimator
    resid = measured - r * modelled
    se = math.sqrt(float(np.sum(resid**2)) / (measured.size - 1) / measured.size) / float(modelled.mean())
    return Param(name, float(r), se, "×")


def cell_weighted_ratio(name: str, measured: np.ndarray, modelled: np.ndarray, rows: pd.DataFrame) -> Param:
    """Σ measured / Σ modelled per cell, the cells combined by the inverse variance of their ratios.

    ``rows`` (aligned with the arrays) names each value's cell (``key``, else
    ``cell_id``) and generation (``prompt_id``, ``repeat``): a cell's
    standard error is that of its ratio across its generations. Falls back to
    the pooled ratio (:func:`_ratio_param`) when a cell's standard error is
    unknown (one generation) or zero, or there is one cell.
    """
    cell_col = "key" if "key" in rows else "cell_id" if "cell_id" in rows else None
    if cell_col is None or rows[cell_col].nunique() < 2 or not {"prompt_id", "repeat"} <= set(rows):
        return _ratio_param(name, measured, modelled)
    df = pd.DataFrame({"m": np.asarray(measured, float), "mod": np.asarray(modelled, float),
                       "cell": rows[cell_col].to_numpy(), "prompt": rows["prompt_id"].to_numpy(),
                       "rep": rows["repeat"].to_numpy()})
    per_cell = []
    for _, sub in df.groupby("cell", sort=True):
        gen = sub.groupby(["prompt", "rep"])[["m", "mod"]].sum()
        per_cell.append(_ratio_param(name, gen["m"].to_numpy(), gen["mod"].to_numpy()))
    se = np.array([p.stderr for p in per_cell])
    if not np.all(np.isfinite(se) & (se > 0)):
        return _ratio_param(name, measured, modelled)
    w = 1.0 / se**2
    v = np.array([p.value for p in per_cell])
    return Param(name, float((w * v).sum() / w.sum()), float(1.0 / math.sqrt(w.sum())), "×")


#: What a cost model written by ``calibrate`` is (its metadata ``provenance``; ``calibrate ingest`` prints it).
FITTED_PROVENANCE = ("fitted by python -m calibrate to the timings a python -m measure run recorded "
                     "(cost_target.csv, cost_draft.csv, rounds.csv, generations.csv)")
#: How it was fitted (its metadata ``fit``).
BOUNDED_FIT = ("bounded least squares: every forward > 0 ms at context 0, every cost per context token and per "
               "kept vocabulary entry >= 0, round overhead >= 0")


@dataclass(frozen=True)
class CostFit:
    """The fitted cost model of one draft and how it was obtained."""

    draft: str
    head_k: float | None
    model: TabulatedCost
    target: LinearFit
    draft_fit: LinearFit | None
    overhead: Param
    scales: tuple[Param, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: every parameter held at its physical bound (target, draft, overhead): the metadata's ``fit_fallbacks``
    fallbacks: tuple[Fallback, ...] = ()

    def as_dict(self) -> dict:
        return {
            "draft": self.draft,
            "head_k": self.head_k,
            "target_fit": self.target.as_dict(),
            "draft_fit": self.draft_fit.as_dict() if self.draft_fit else None,
            "round_overhead": self.overhead.as_dict(),
            "in_loop_scales": [s.as_dict() for s in self.scales],
            "notes": list(self.notes),
            "fit_fallbacks": [f.as_dict() for f in self.fallbacks],
            "cost_model": self.model.describe(),
        }


@dataclass(frozen=True)
class TargetCurve:
    """The fitted target forward: per-n intercepts (and context slopes) at the reference context."""

    fit: LinearFit
    ctx_ref: float
    slope_ms_per_token: float  # shared context slope (0 when the slope depends on n, or none)
    slopes_by_tokens: dict[int, float] | None  # the context slope of each n (linear or per-n model)
    verify_ms_by_tokens: dict[int, float]


def target_curve(cost_target: pd.DataFrame, slopes: str = "linear") -> TargetCurve:
    """Fit ``cost_target.csv`` once (it is shared by every draft, K and fold of a run)."""
    tfit, ctx_ref = fit_target(cost_target, slopes)
    table = tfit.by_tokens(VERIFY_MS)
    if any(v <= 0 for v in table.values()):
        raise ValueError(f"fitted target forward times are not positive: {table}")
    by_n = tfit.by_tokens(TARGET_SLOPE) or None
    if tfit.has(SLOPE_BASE):
        s0, s1 = tfit.value(SLOPE_BASE), tfit.value(SLOPE_PER_TOKEN)
        by_n = {n: s0 + s1 * n for n in table}
    return TargetCurve(tfit, ctx_ref, tfit.value(TARGET_SLOPE) if tfit.has(TARGET_SLOPE) else 0.0, by_n, table)


@dataclass(frozen=True)
class DraftStep:
    """The draft's step time at the reference context, and its context slope."""

    fit: LinearFit
    ms_ref: float
    ms_per_context_token: float


def _draft_step(draft: str, cost_draft: pd.DataFrame, train_rounds: pd.DataFrame, ctx_ref: float,
                head_k: float | None, notes: list[str]) -> DraftStep:
    """From the ``cost_draft.csv`` micro-benchmark, else from the rounds' ``draft_ms / drafted``."""
    dd = cost_draft[cost_draft["draft"].astype(str) == str(draft)] if not cost_draft.empty else cost_draft
    if len(dd):
        dfit, k_ref = fit_draft(dd, ctx_ref, f"draft {draft!r} step")
        d_ref = dfit.value("draft_step_ms")
        if k_ref is not None and head_k is not None:
            d_ref += dfit.value("draft_ms_per_head_k") * (float(head_k) - k_ref)
        slope_d = dfit.value("draft_ms_per_context_token") if dfit.has("draft_ms_per_context_token") else 0.0
    elif len(train_rounds):
        notes.append(f"no cost_draft.csv rows for draft {draft!r}: draft step from rounds.csv draft_ms / drafted")
        dr = train_rounds[drafted_counts(train_rounds) > 0]
        if dr.empty:
            raise ValueError(f"no timing for draft {draft!r}: no cost_draft.csv rows and no round drafted a token")
        per_step = dr["draft_ms"] / drafted_counts(dr)
        ctx = dr["context_tokens"].to_numpy(float)
        bounds = Bounds(np.column_stack([np.ones(len(ctx)), ctx]), np.array([MIN_STEP_MS, 0.0]),
                        ("draft_step_ms at context 0", "draft_ms_per_context_token"), ("ms", "ms/token"))
        dfit = bounded_ols(np.column_stack([np.ones(len(ctx)), ctx - ctx_ref]), per_step.to_numpy(),
                           ["draft_step_ms", "draft_ms_per_context_token"], ["ms", "ms/token"],
                           "draft_ms/drafted = d + s_draft * (context_tokens - ctx_ref)  [from rounds.csv]", bounds,
                           f"draft {draft!r} step")
        d_ref, slope_d = dfit.value("draft_step_ms"), dfit.value("draft_ms_per_context_token")
    else:
        raise ValueError(f"no timing for draft {draft!r}: neither cost_draft.csv rows nor training rounds")
    return DraftStep(dfit, d_ref, slope_d)  # bounded: positive at every context >= 0


def _round_overhead(train_rounds: pd.DataFrame, notes: list[str]) -> tuple[Param, Fallback | None]:
    """Mean per-round overhead of the training rounds, with its standard error; a negative mean (a round's
    parts timed longer than the round: a busy machine) is held at 0, the returned :class:`Fallback`."""
    if not len(train_rounds):
        notes.append("no training rounds: round overhead set to 0")
        return Param("round_overhead_ms", 0.0, float("nan"), "ms"), None
    ov = train_rounds["overhead_ms"].to_numpy(float)
    ov = ov[np.isfinite(ov)]
    mean = float(ov.mean()) if ov.size else 0.0
    param = Param("round_overhead_ms", mean, float(ov.std(ddof=1) / math.sqrt(ov.size)) if ov.size > 1
                  else float("nan"), "ms")
    if mean >= 0:
        return param, None
    return replace(param, value=0.0), Fallback(
        "round overhead", "round_overhead_ms", mean, 0.0, "ms", "no per-round overhead",
        f"the mean of {ov.size} rounds' overhead_ms is negative (their draft and verify parts timed longer "
        "than the round: a busy machine)")


def _in_loop_scales(base_model: TabulatedCost, train_rounds: pd.DataFrame,
                    train_baseline: pd.DataFrame) -> list[Param]:
    """``draft_scale``, ``verify_scale`` (rounds) and ``baseline_scale`` (baseline generations)."""
    scales: list[Param] = []
    if len(train_rounds):
        # only rounds that drafted something: a round that drafts nothing is one 1-token target
        # step, the entry the baseline scale (below) already covers
        r = train_rounds[drafted_counts(train_rounds) > 0]
        g = drafted_counts(r)
        ctx = r["context_tokens"].to_numpy(float)
        mod_draft = np.array([sum(base_model.draft_step_ms(c + i) for i in range(gi)) for gi, c in zip(g, ctx)])
        mod_verify = np.array([base_model.verify_ms(gi + 1, c) for gi, c in zip(g, ctx)])
        scales.append(cell_weighted_ratio("draft_scale", r["draft_ms"].to_numpy(float), mod_draft, r))
        scales.append(cell_weighted_ratio("verify_scale", r["verify_ms"].to_numpy(float), mod_verify, r))
    if len(train_baseline):
        b = train_baseline
        steps = (b["new_tokens"].to_numpy(float) - 1).clip(min=1)
        decode_ms = b["wall_s"].to_numpy(float) * 1e3 - b["ttft_ms"].to_numpy(float)
        mean_ctx = b["prompt_tokens"].to_numpy(float) + b["new_tokens"].to_numpy(float) / 2
        modelled = np.array([base_model.target_step_ms(c) for c in mean_ctx]) * steps
        scales.append(cell_weighted_ratio("baseline_scale", decode_ms, modelled, b))
    return scales


def fit_cost(
    draft: str,
    cost_target: pd.DataFrame,
    cost_draft: pd.DataFrame,
    train_rounds: pd.DataFrame,
    train_baseline: pd.DataFrame,
    head_k: float | None = None,
    use_in_loop_scales: bool = True,
    target: TargetCurve | None = None,
) -> CostFit:
    """Fit the cost model of ``draft`` (at kept vocabulary ``head_k`` for pruned heads).

    ``train_rounds``: the ``rounds.csv`` rows of the training cells of this
    draft; ``train_baseline``: ``generations.csv`` baseline rows of training
    cells (columns ``prompt_tokens, new_tokens, wall_s, ttft_ms``). ``target``:
    the run's :func:`target_curve` if already fitted (else fitted from ``cost_target``).
    """
    notes: list[str] = []
    tc = target if target is not None else target_curve(cost_target)
    ctx_ref, table, slopes = tc.ctx_ref, tc.verify_ms_by_tokens, tc.slopes_by_tokens
    step = _draft_step(draft, cost_draft, train_rounds, ctx_ref, head_k, notes)
    overhead, held_overhead = _round_overhead(train_rounds, notes)
    fallbacks = (*tc.fit.fallbacks, *step.fit.fallbacks, *([held_overhead] if held_overhead else []))
    notes += fallback_lines(fallbacks)
    base_model = TabulatedCost(verify_ms_by_tokens=table, draft_step_ms_ref=step.ms_ref,
                               reference_context_tokens=ctx_ref, target_context_ms_per_token=tc.slope_ms_per_token,
                               draft_context_ms_per_token=step.ms_per_context_token,
                               round_overhead_ms_base=overhead.value, context_ms_per_token_by_tokens=slopes)
    scales = _in_loop_scales(base_model, train_rounds, train_baseline) if use_in_loop_scales else []
    s = {p.name: p.value for p in scales}
    ds, vs, bs = s.get("draft_scale", 1.0), s.get("verify_scale", 1.0), s.get("baseline_scale", 1.0)
    meta = {
        "source": "calibrate",
        "provenance": FITTED_PROVENANCE,
        "draft": draft,
        "head_k": head_k,
        "in_loop_scales": s,
        "stderr": {p.name: p.stderr for p in (*tc.fit.params, *step.fit.params, overhead, *scales)},
        "target_residual_rms_ms": tc.fit.residual_rms_ms,
        "draft_residual_rms_ms": step.fit.residual_rms_ms,
        "note": "n=1 entry scaled by baseline_scale, n>=2 by verify_scale, draft times by draft_scale",
        "fit": BOUNDED_FIT,
        # every parameter the data could not support, the simpler model fitted instead and why ([] when none)
        "fit_fallbacks": [f.as_dict() for f in fallbacks],
    }
    model = TabulatedCost(
        verify_ms_by_tokens={n: v * (bs if n == 1 else vs) for n, v in table.items()},
        draft_step_ms_ref=step.ms_ref * ds,
        reference_context_tokens=ctx_ref,
        target_context_ms_per_token=tc.slope_ms_per_token * vs,
        draft_context_ms_per_token=step.ms_per_context_token * ds,
        round_overhead_ms_base=overhead.value,
        metadata=meta,
        context_ms_per_token_by_tokens=(None if slopes is None else
                                        {n: v * (bs if n == 1 else vs) for n, v in slopes.items()}),
    )
    return CostFit(draft, head_k, model, tc.fit, step.fit, overhead, tuple(scales), tuple(notes), fallbacks)


__all__ = ["BOUNDED_FIT", "Bounds", "CostFit", "DraftStep", "FITTED_PROVENANCE", "Fallback", "LinearFit", "MIN_STEP_MS",
           "Param", "ParamName", "SLOPE_MODELS", "TargetCurve", "bounded_ols", "cell_weighted_ratio", "fallback_lines", "fit_cost",
           "fit_draft", "fit_target", "ols", "target_curve"]
