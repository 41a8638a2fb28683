"""Write a calibration to disk: ``calibration.json``, CSV tables and per-draft model files.

Writes only: every model here was fitted by :func:`calibrate.calibration.calibrate`, and every file is
written by :func:`calibrate.written.write_calibration`, every kind's one writer (each model in each JSON file
read back as ``python -m sim`` reads it — finite, physical — before any file is written).

Files written into the output directory:

* ``calibration.json`` — everything: runs (each by its path relative to this folder, so the two move
  together), hold-out folds and what was held
  out, per-draft cost fits (each with a ``cost_model`` that
  ``sim.cost.cost_model_from_dict`` reads), per-group acceptance fits,
  per-cell predictions and the MAPE tables (in-sample and held-out).
* ``cost_model-<draft>.json`` — ``TabulatedCost.describe()`` of the all-cell
  fit; ``python -m sim --cost-model FILE`` reads it. With several runs the
  run name is included: ``cost_model-<run>-<draft>.json``; pruned heads add
  ``-k<K>``.
* ``acceptance-<draft>.json`` — the BIC-chosen acceptance model of all of that
  draft's rounds (``{"kind": "per_position", "alphas": [...]}`` or
  ``{"kind": "iid", "alpha": ...}``), read by ``sim.acceptance.acceptance_from_dict``
  / ``python -m sim --acceptance FILE``. Per group (draft × domain ×
  temperature) files are ``acceptance-<draft>-<domain>-t<temp>.json``; a draft
  whose rounds sometimes drafted nothing (lookup drafts) gets
  ``{"kind": "proposal", "p_propose": ..., "inner": {...}}``.
* ``acceptance-<draft>-<domain>-t<temp>-trace.json`` — greedy groups whose run
  recorded proposal runs: ``{"kind": "run_trace", "proposed": [...], "run": [...]}``,
  replayed exactly at any γ ≤ ``gamma_max`` by ``python -m sim --acceptance FILE``.
* ``predictions.csv`` — one row per cell × method × split (in_sample / held_out).
* ``speedup_curves.csv`` — predicted speedup at γ = 1..10 per series (draft × domain [× K]),
  from the all-cell fit, so unmeasured γ can be compared with measured ones.
* ``cost_params.csv`` — every fitted cost parameter with its standard error.
* ``acceptance_per_position.csv`` — α_i, counts and 95% Wilson intervals per group.
* ``acceptance_families.csv`` — log-likelihood, AIC and BIC of each acceptance family per group (BIC chooses).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from calibrate.calibration import CALIBRATION_SCHEMA_VERSION, CalibrationResult
from calibrate.folds import HOLDOUT_EXPLANATION
from calibrate.groups import AcceptanceGroup, slug
from calibrate.written import CalibrationFiles, write_calibration
from measure.records import utc_now
from toolkit.files import path_from
from toolkit.jsonio import strict_dumps

if TYPE_CHECKING:
    from calibrate.fit_acceptance import AcceptanceFit


def _cost_file_name(run: str, draft: str, head_k: float | None, several_runs: bool) -> str:
    parts = ["cost_model"] + ([slug(run)] if several_runs else []) + [slug(draft)]
    if head_k is not None:
        parts.append(f"k{int(head_k)}")
    return "-".join(parts) + ".json"


def _cost_files(res: CalibrationResult, docs: dict, files: dict) -> tuple[dict, pd.DataFrame]:
    """``cost_model-*.json`` (into ``docs``) and ``cost_params.csv``; returns the ``cost_models`` section of
    calibration.json and the table."""
    several = len(res.data.runs) > 1
    cost_rows = []
    cost_section = {}
    for (run, draft, hk), fit in res.models.cost.items():
        name = _cost_file_name(run, draft, hk, several)
        docs[name] = fit.model.describe()
        files["cost_models"][f"{run}/{draft}" + (f"/k{int(hk)}" if hk is not None else "")] = name
        cost_section[name.removesuffix(".json")] = {"run": run, **fit.as_dict()}
        for src, params in (("target", fit.target.params), ("draft", fit.draft_fit.params if fit.draft_fit else ()),
                            ("overhead", (fit.overhead,)), ("in_loop", fit.scales)):
            for p in params:
                cost_rows.append({"run": run, "draft": draft, "head_k": hk, "fit": src, **p.as_dict()})
    return cost_section, pd.DataFrame(cost_rows)


def _acceptance_files(res: CalibrationResult, docs: dict, tables: dict, files: dict) -> tuple[dict, set[str]]:
    """``acceptance-*.json`` (per draft, per group, traces; into ``docs``) and the two acceptance CSVs (into
    ``tables``); returns the section and the names of the trace files (written on one line)."""
    pp_rows, fam_rows, acc_section = [], [], {}
    # (label, fit, group or None for a draft's pooled fit)
    groups: list[tuple[str, AcceptanceFit, AcceptanceGroup | None]] = [
        (grp.to_str(), fit, grp) for grp, fit in res.models.acceptance.items()]
    for draft, fit in res.pooled_acceptance.items():
        name = f"acceptance-{slug(draft)}.json"
        docs[name] = fit.describe_model()
        files["acceptance"][f"draft={draft}"] = name
        groups.append((f"draft={draft} (all cells)", fit, None))
    for key, fit, grp in groups:
        acc_section[key] = fit.as_dict()
        pp_rows.append(fit.per_position.assign(group=key, chosen=fit.chosen))
        for f in fit.families:
            fam_rows.append({"group": key, "family": f.name, "n_params": f.n_params, "loglik": f.loglik,
                             "aic": f.aic, "bic": f.bic, "chosen": f.name == fit.chosen, "params": strict_dumps(f.params)})
        if grp is not None:
            name = grp.file_name()
            docs[name] = fit.describe_model()
            files["acceptance"][key] = name
    # greedy proposal-run traces per group: exact replay at any γ up to gamma_max in `python -m sim`
    traces = set()
    for grp, model in res.group_traces.items():
        name = grp.file_name("-trace")
        docs[name] = model.to_dict()
        traces.add(name)
        files["acceptance"][grp.to_str() + "|trace"] = name
    if pp_rows:
        tables["acceptance_per_position.csv"] = pd.concat(pp_rows, ignore_index=True)
    tables["acceptance_families.csv"] = pd.DataFrame(fam_rows)
    return acc_section, traces


def write_outputs(res: CalibrationResult, out: str | Path) -> dict:
    """Write every file (:func:`calibrate.written.write_calibration`: nothing when a model is refused); returns
    the JSON summary (also the CLI's last line)."""
    out = Path(out)
    files: dict[str, dict] = {"cost_models": {}, "acceptance": {}}
    docs: dict[str, Any] = {}
    tables: dict[str, Any] = {}
    cost_section, tables["cost_params.csv"] = _cost_files(res, docs, files)
    acc_section, traces = _acceptance_files(res, docs, tables, files)
    preds = [res.in_sample.assign(split="in_sample")]
    if len(res.held_out):
        preds.append(res.held_out.assign(split="held_out"))
    pred = pd.concat(preds, ignore_index=True)
    tables["predictions.csv"] = pred
    tables["speedup_curves.csv"] = res.curves
    docs["calibration.json"] = _calibration_doc(res, out, files, cost_section, acc_section, pred)
    write_calibration(out, CalibrationFiles(docs, tables, frozenset(traces)))
    return {
        "calibration": str(out / "calibration.json"),
        "holdout": res.holdout,
        "n_cells": int(len(res.data.cells)),
        "mape_held_out": res.mape_held_out,
        "mape_in_sample": res.mape_in_sample,
        "n_unstable_cells": len(res.unstable_cells),
        "unstable_held_out": res.unstable_held_out,
        "notes": list(res.data.notes),
        "cost_model_files": files["cost_models"],
        "acceptance_files": {k: v for k, v in files["acceptance"].items() if k.startswith("draft=") and "|" not in k},
    }


#: How each prediction method of ``predictions.csv`` predicts (calibration.json ``prediction_methods``).
PREDICTION_METHODS = {
    "closed_form": "sim.analytic.predict_row with the fitted cost and the BIC-chosen acceptance model",
    "trace": "sim.analytic.predict_row replaying the training cells' traces: per-position proposal runs "
             "(sim.acceptance.RunTraceAcceptance, exact for greedy) when recorded, else match flags "
             "(sim.acceptance.TraceAcceptance)",
    "event_sim": "sim.events.simulate_request with the chosen acceptance model, seeded per prompt",
    "tokens_per_s": "per prompt new_tokens / (predicted TTFT + (new_tokens - 1) * predicted ms per token), "
                    "averaged over the cell's prompts (the measurement's estimator: ratio of mean "
                    "per-prompt tokens/s); TTFT from a linear fit on training generations",
}
NOISE_FLOOR = ("a prediction is judged against the measured 95% CI of the cell's speedup (Fieller's interval "
               "over the prompt x repeat pairs): inside_ci per prediction, share_inside_ci per method. Unstable "
               "cells (noisy baseline) are weighted by their variance in the cost fit's in-loop scales, left out "
               "of the prefill fit (their acceptance stays in) and out of the MAPE, and reported apart "
               "(unstable_held_out)")


def _calibration_doc(res: CalibrationResult, out: Path, files: dict, cost_section: dict, acc_section: dict,
                     pred: pd.DataFrame) -> dict:
    """The content of ``calibration.json`` (written into ``out``: each run named by its path from there)."""
    data = res.data
    doc = {
        "schema_version": CALIBRATION_SCHEMA_VERSION,
        "created_utc": utc_now(),
        "runs": {label: {"path": path_from(out, r.path), "status": r.status, "hardware": r.meta.get("hardware"),
                         "models": r.meta.get("models")} for label, r in data.runs.items()},
        "holdout": {"mode": res.holdout, "explanation": HOLDOUT_EXPLANATION[res.holdout], "folds": list(res.folds),
                    # only when --holdout auto could not hold out by γ: why it chose this mode
                    **({"note": res.holdout_choice.note} if res.holdout_choice and res.holdout_choice.adapted
                       else {})},
        "prediction_methods": PREDICTION_METHODS,
        "noise_floor": NOISE_FLOOR,
        "mape": {"in_sample": res.mape_in_sample, "held_out": res.mape_held_out},
        "unstable_cells": list(res.unstable_cells),
        "unstable_held_out": res.unstable_held_out,
        "notes": list(data.notes),
        "prefill_fit": {run: f.as_dict() for run, f in res.models.prefill.items()},
        "cost_models": cost_section,
        "acceptance": acc_section,
        "files": files,
        "predictions": pred.to_dict(orient="records"),
    }
    first_cost = next(iter(res.models.cost.values()), None)
    if first_cost is not None and len(res.models.cost) == 1:
        doc["cost_model"] = first_cost.model.describe()  # load_cost_model(calibration.json) works for one draft
    return doc
