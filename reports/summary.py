"""The answer a report leads with: what was measured, the best measured speedup, how well it was predicted,
what was left out and why, and what to do next.

Pure functions over what ``calibrate`` wrote and the run directories it names
(files only, nothing fitted): :func:`measured_setups` (models, engine,
hardware), :func:`cell_results` (every cell, measured and predicted, with the
reason it is or is not in the error figures), :func:`predicted_optima` (the γ
the calibrated model likes best, and whether it was measured) and
:func:`headline` (the few lines the page opens with). :mod:`reports.page`
renders them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from measure.records import extension_status
from sim.policies import GammaSpec

#: Prediction methods in the order the page lists them, with the names it uses.
METHOD_NAMES: dict[str, str] = {"trace": "trace replay", "closed_form": "closed form", "event_sim": "event sim"}
#: A predicted best γ beyond the measured ones is worth a measurement when it promises this much more speedup.
EXTRAPOLATION_GAIN = 0.05
#: Held-out error above which the page says predictions are rough.
ROUGH_MAPE_PCT = 10.0


def _f(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def _gamma_of(policy: str) -> int | None:
    """The γ of a fixed policy (``fixed:4`` gives 4), None for an adaptive one."""
    spec = GammaSpec.parse(str(policy))
    return spec.gamma if spec.is_fixed else None


# -- what was measured -------------------------------------------------------------------------
@dataclass(frozen=True)
class MeasuredSetup:
    """One run in words: its models, engine and machine, and how it was measured."""

    label: str
    target: str
    drafts: tuple[str, ...]
    engine: str
    hardware: str
    workload: str
    command: str
    status: str


def _draft_text(name: str, info: Mapping[str, Any]) -> str:
    kind = info.get("kind")
    if kind == "ngram":
        return f"{name} (prompt lookup: the last ≤ {info.get('max_ngram', '?')} tokens matched in the context)"
    if kind == "quant":
        return f"{name} (the target quantised to {info.get('quant_type', '?')})"
    params = _f(info.get("params"))
    size = f", {params / 1e6:.0f}M parameters" if params else ""
    return f"{name} ({kind or 'model'}{size})"


def _setup(label: str, meta: Mapping[str, Any], hardware: Mapping[str, Any] | None,
           domains_measured: tuple[str, ...]) -> MeasuredSetup:
    models = meta.get("models") or {}
    t = models.get("target") or {}
    params = _f(t.get("params"))
    src = str(t.get("source") or "")
    target = (f"{t.get('name', '?')}" + (f" ({params / 1e6:.1f}M parameters" if params else " (")
              + f", {t.get('dtype', '?')}" + (f", {Path(src.split(':', 1)[-1]).name}" if src else "") + ")")
    drafts = tuple(_draft_text(n, i) for n, i in (models.get("drafts") or {}).items())
    cfg = meta.get("config") or {}
    v = meta.get("versions") or {}
    engine = str(cfg.get("engine") or t.get("engine") or "transformers")
    lib = {"transformers": f"transformers {v.get('transformers', '?')} (torch {v.get('torch', '?')}"
                           f", {cfg.get('cache', 'static')} cache)",
           "llamacpp": f"llama.cpp (llama-cpp-python {v.get('engine_llama_cpp_python', '?')})"}.get(engine, engine)
    threads = cfg.get("threads") or (hardware or meta.get("hardware") or {}).get("torch_threads")
    if threads:
        lib += f", {threads} threads"
    hw = hardware or meta.get("hardware") or {}
    device = hw.get("gpu") or hw.get("device_name") or hw.get("device") or "?"
    cores = f", {hw['cores']} cores" if hw.get("cores") else ""
    exts = meta.get("extensions") or []  # cells added later (--extend): the run's config is its first command's
    added = [g for e in exts for g in (e.get("added") or {}).get("gammas", ())]
    gammas = ", ".join(str(g) for g in [*(cfg.get("gammas") or ()), *added]) or str(cfg.get("gamma", "?"))
    domains = "domains " + (", ".join(domains_measured or cfg.get("domains") or ()) or "?")
    workload = (f"γ policies {gammas}; {domains}; {cfg.get('prompts_per_domain', '?')} prompt(s) per domain × "
                f"{cfg.get('repeats', '?')} repeats × {cfg.get('max_new_tokens', '?')} new tokens; temperature "
                f"{', '.join(f'{x:g}' for x in cfg.get('temperatures') or (0.0,))}")
    when = str(meta.get("created_utc") or "")[:10]
    command = "; then ".join(str(c) for c in [meta.get("command"), *(e.get("command") for e in exts)] if c)
    status = str(meta.get("status") or "?") + (f", {when}" if when else "")
    if exts:
        status += f"; {len(exts)} extension(s), the last {extension_status(meta)[0]}"
    return MeasuredSetup(label, target, drafts, lib, f"{device}{cores}", workload, command, status)


def measured_setups(doc: Mapping[str, Any], run_meta: Mapping[str, Mapping[str, Any]],
                    cells: pd.DataFrame | None = None) -> list[MeasuredSetup]:
    """Per run of a calibration (``calibration.json`` ``runs``), its setup; ``run_meta`` is each run's run.json,
    ``cells`` (with a ``run`` column) the cells, whose domains are the ones measured."""
    def domains(label: str) -> tuple[str, ...]:
        if cells is None or cells.empty or "run" not in cells:
            return ()
        return tuple(dict.fromkeys(cells.loc[cells["run"] == label, "domain"].astype(str)))

    return [_setup(label, run_meta.get(label, {}), info.get("hardware"), domains(label))
            for label, info in doc["runs"].items()]


# -- every cell ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Prediction:
    """One method's prediction of one cell."""

    speedup: float | None
    error_pct: float | None
    inside_ci: bool | None


@dataclass(frozen=True)
class CellResult:
    """One measured cell: what it measured, what was predicted, and whether it counts in the error figures."""

    key: str
    label: str
    draft: str
    domain: str
    gamma: int | None
    speedup: float
    lo: float | None
    hi: float | None
    unstable: bool
    unstable_reason: str
    predictions: Mapping[str, Prediction]
    split: str  # "held_out", "in_sample" or "" (nothing predicted)

    @property
    def left_out(self) -> str:
        """Why the cell is not in the MAPE ("" when it is)."""
        if self.unstable:
            return f"unstable: {self.unstable_reason}" if self.unstable_reason else "unstable"
        if not self.predictions:
            return "not predicted"
        if all(p.error_pct is None for p in self.predictions.values()):
            return "no prediction (the model could not price it)"
        return ""

    def ci_text(self) -> str:
        if self.lo is None or self.hi is None:
            return f"{self.speedup:.2f}×"
        return f"{self.speedup:.2f}× [{self.lo:.2f}, {self.hi:.2f}]"

    def against_one(self) -> str:
        """``faster``, ``slower`` or ``not distinguishable`` from plain decoding, by the 95% CI."""
        if self.lo is None or self.hi is None:  # measure writes both bounds or neither
            return "no interval"
        if self.lo > 1.0:
            return "faster"
        if self.hi < 1.0:
            return "slower"
        return "not distinguishable"

    def against_one_short(self) -> str:
        """:meth:`against_one` for a table cell."""
        return {"not distinguishable": "CI includes 1×"}.get(self.against_one(), self.against_one())


def cell_label(draft: str, domain: str, policy: str, head_k: Any = None, temperature: Any = None,
               run: str | None = None) -> str:
    """A cell in a few words: ``ngram:3 · code · γ 2`` (plus K, temperature, run where they vary)."""
    g = _gamma_of(policy)
    parts = [str(draft), str(domain), f"γ {g}" if g is not None else str(policy)]
    k = _f(head_k)
    if k is not None:
        parts.append(f"K {int(k)}")
    t = _f(temperature)
    if t:
        parts.append(f"T {t:g}")
    if run:
        parts.insert(0, run)
    return " · ".join(parts)


def cell_results(cells: pd.DataFrame, pred: pd.DataFrame) -> list[CellResult]:
    """Every cell of the runs (``cells`` with a ``run`` column), with the held-out predictions (in-sample ones
    when nothing was held out)."""
    several = cells["run"].nunique() > 1 if "run" in cells else False
    split = ""
    if len(pred) and "split" in pred:
        split = "held_out" if (pred["split"] == "held_out").any() else "in_sample"
        use = pred[pred["split"] == split]
    else:
        use = pred.iloc[0:0] if len(pred.columns) else pd.DataFrame(columns=["run", "cell_id", "method"])
    out = []
    for _, c in cells.iterrows():
        run = str(c.get("run", ""))
        rows = use[(use["run"] == run) & (use["cell_id"] == c["cell_id"])] if len(use) else use
        preds = {str(r["method"]): Prediction(_f(r["predicted_speedup"]), _f(r.get("ape_speedup_pct")),
                                              None if pd.isna(r.get("inside_ci")) else bool(r.get("inside_ci")))
                 for _, r in rows.iterrows()}
        reason = c.get("unstable_reason")
        out.append(CellResult(
            key=f"{run}/{c['cell_id']}", label=cell_label(c["draft"], c["domain"], c["gamma_policy"], c.get("head_k"),
                                                          c.get("temperature"), run if several else None),
            draft=str(c["draft"]), domain=str(c["domain"]), gamma=_gamma_of(c["gamma_policy"]),
            speedup=float(c["speedup"]), lo=_f(c.get("speedup_lo")), hi=_f(c.get("speedup_hi")),
            unstable=bool(c.get("unstable") is True or str(c.get("unstable")).lower() == "true"),
            unstable_reason="" if reason is None or pd.isna(reason) else str(reason), predictions=preds,
            split=split if preds else ""))
    return out


# -- predictions beyond what was measured ---------------------------------------------------------
@dataclass(frozen=True)
class PredictedOptimum:
    """Per series (draft/domain), the γ the calibrated closed form likes best, against the γ measured."""

    series: str
    gamma: int
    speedup: float
    measured_gammas: tuple[int, ...]  # every γ measured for the series, stable or not
    speedup_at_best_measured: float | None  # the model's own prediction at the best (stable) measured γ

    @property
    def measured(self) -> bool:
        return self.gamma in self.measured_gammas

    @property
    def gain(self) -> float | None:
        """Predicted speedup at the predicted best γ over that at the best measured γ, minus one."""
        if self.speedup_at_best_measured is None:
            return None
        return self.speedup / self.speedup_at_best_measured - 1.0


def predicted_optima(curves: pd.DataFrame, results: list[CellResult]) -> list[PredictedOptimum]:
    """For each series of ``speedup_curves.csv`` (closed form), its predicted best γ and the measured γ."""
    if curves.empty:
        return []
    cf = curves[curves["method"] == "closed_form"].dropna(subset=["predicted_speedup"])
    out = []
    for series, sub in cf.groupby("series", sort=False):
        draft, _, rest = str(series).partition("/")
        domain = rest.split("/")[0]
        meas = [r for r in results if r.draft == draft and r.domain == domain and r.gamma is not None]
        stable = [r for r in meas if not r.unstable] or meas
        best = sub.loc[sub["predicted_speedup"].idxmax()]
        at_best = None
        if stable:
            g_best = max(stable, key=lambda r: r.speedup).gamma
            row = sub[sub["gamma"] == g_best]
            at_best = float(row["predicted_speedup"].iloc[0]) if len(row) else None
        out.append(PredictedOptimum(str(series), int(best["gamma"]), float(best["predicted_speedup"]),
                                    tuple(sorted({r.gamma for r in meas if r.gamma is not None})), at_best))
    return out


# -- the headline -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    """One thing to do next, and the command that does it (``""`` when there is none)."""

    text: str
    command: str = ""


@dataclass(frozen=True)
class Headline:
    """The lines a report opens with."""

    answer: str
    caveat: str
    error: str
    left_out: tuple[str, ...]
    next_steps: tuple[Step, ...]


def _mape_text(mape: Mapping[str, Mapping[str, Any]]) -> str:
    parts = [f"{v['speedup_mape_pct']:.1f}% ({METHOD_NAMES.get(m, m)})" for m, v in
             sorted(mape.items(), key=lambda kv: list(METHOD_NAMES).index(kv[0]) if kv[0] in METHOD_NAMES else 9)
             if v.get("speedup_mape_pct") is not None]
    return ", ".join(parts)


def _best_mape(mape: Mapping[str, Mapping[str, Any]]) -> tuple[str, Mapping[str, Any]] | None:
    ok = [(m, v) for m, v in mape.items() if v.get("speedup_mape_pct") is not None]
    return min(ok, key=lambda mv: mv[1]["speedup_mape_pct"]) if ok else None


def _sim_command(doc: Mapping[str, Any], cal_dir: Path) -> str | None:
    files = doc.get("files") or {}
    cost = next(iter((files.get("cost_models") or {}).values()), None)
    acc = next((v for k, v in (files.get("acceptance") or {}).items() if k.startswith("draft=") and "|" not in k),
               None)
    if not cost or not acc:
        return None
    return (f"python -m sim --cost-model {cal_dir / cost} --acceptance {cal_dir / acc} --gamma-max 10")


# long: the page's headline sentence is assembled from each case (no stable cell, best cell, held-out error, what
#   next) in order
def headline(results: list[CellResult], doc: Mapping[str, Any], optima: list[PredictedOptimum],
             cal_dir: Path) -> Headline:
    """The best measured speedup with its CI, the held-out error, every cell left out and why, what to do next."""
    stable = [r for r in results if not r.unstable]
    best = max(stable, key=lambda r: r.speedup) if stable else None
    top = max(results, key=lambda r: r.speedup) if results else None
    if best is None:
        answer = ("No stable cell: every configuration was measured while the machine was unsteady, so no "
                  "speedup is reported as the answer.")
    else:
        verdict = {"faster": "faster than plain decoding (the 95% CI excludes 1×)",
                   "slower": "slower than plain decoding (the 95% CI lies below 1×)",
                   "not distinguishable": "not distinguishable from plain decoding (the 95% CI includes 1×)",
                   "no interval": "(no interval: too few samples)"}[best.against_one()]
        answer = f"Best measured speedup: {best.ci_text()} (95% CI) with {best.label}: {verdict}."
    caveat = ""
    if top is not None and best is not None and top.key != best.key:
        caveat = (f"{top.label} measured more, {top.ci_text()}, but it is flagged unstable "
                  f"({top.unstable_reason or 'the machine was unsteady'}), so it is not the answer.")
    held = doc.get("mape", {}).get("held_out") or {}
    mape = held or doc.get("mape", {}).get("in_sample") or {}
    n_in = max((v.get("n_cells", 0) for v in mape.values()), default=0)
    inside = _best_mape(mape)
    share = ""
    if inside and inside[1].get("n_with_ci"):
        v = inside[1]
        share = (f"; {v['n_inside_ci']}/{v['n_with_ci']} of the {METHOD_NAMES.get(inside[0], inside[0])} predictions "
                 "inside the measured 95% CI")
    mode = (doc.get("holdout") or {}).get("mode", "?")
    by = {"gamma": "γ", "k": "kept vocabulary K"}.get(mode, mode)
    kind = f"held out by {by}" if held else "in-sample: nothing was held out"
    error = (f"Prediction error ({kind}): speedup MAPE {_mape_text(mape)} over {n_in} of {len(results)} cells"
             f"{share}." if mape else "No prediction error: nothing could be predicted.")
    left = tuple(f"{r.label}: {r.left_out}" for r in results if r.left_out)
    steps: list[Step] = []
    if best is not None and best.against_one() == "faster":
        steps.append(Step(f"Use {best.draft} at γ = {best.gamma} for {best.domain} text: it measured "
                          f"{best.ci_text()}."))
    elif stable and all(r.against_one() == "slower" for r in stable):
        steps.append(Step("Speculative decoding measured slower in every stable configuration: leave it off for "
                          "this pair on this machine, or try a cheaper draft."))
    elif best is not None:
        steps.append(Step(f"No stable configuration is measurably faster than plain decoding (the best one's 95% "
                          f"CI, {best.ci_text()}, includes 1×): more prompts or repeats narrow the intervals.",
                          "--prompts N --repeats N"))
    flagged = [r for r in results if r.unstable]
    if flagged:
        steps.append(Step(f"{len(flagged)} of {len(results)} cells were flagged unstable: re-measure them on a quiet "
                          "machine, or let measure repeat flagged cells:", "--until-stable 2"))
    far = sorted((o for o in optima if not o.measured and o.measured_gammas and (o.gain or 0) > EXTRAPOLATION_GAIN),
                 key=lambda o: -(o.gain or 0))
    for o in far[:2]:
        g = sorted(set(o.measured_gammas) | {o.gamma})
        steps.append(Step(f"The calibrated model predicts {o.speedup:.2f}× for {o.series.replace('/', ' · ')} at "
                          f"γ = {o.gamma}, beyond the measured γ {', '.join(map(str, o.measured_gammas))}: an "
                          "extrapolation; measure it before relying on it:", f"--gamma {','.join(map(str, g))}"))
    bm = _best_mape(held)
    if bm and bm[1]["speedup_mape_pct"] > ROUGH_MAPE_PCT:
        steps.append(Step(f"Even the best method misses held-out cells by {bm[1]['speedup_mape_pct']:.1f}%: treat "
                          "predictions beyond the measured configurations as rough."))
    if not held and mape:
        steps.append(Step("Nothing was held out: the error above is in-sample; measure a second γ for a held-out "
                          "check."))
    cmd = _sim_command(doc, cal_dir)
    if cmd:
        steps.append(Step("Ask other γ, contexts or batch sizes of this calibration without measuring:", cmd))
    return Headline(answer, caveat, error, left, tuple(steps))


__all__ = ["CellResult", "Headline", "MeasuredSetup", "METHOD_NAMES", "PredictedOptimum", "Prediction", "Step",
           "cell_label", "cell_results", "headline", "measured_setups", "predicted_optima"]
