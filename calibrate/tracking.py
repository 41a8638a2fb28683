"""``--track wandb|mlflow`` for ``python -m calibrate`` and ``python -m calibrate ingest``.

Each is called by its CLI after the files are written, reads them back and
hands :mod:`toolkit.track` what to log (one tracker run per invocation; a
tracker that fails costs one warning line, never the calibration):

:func:`track_calibration` (a calibration directory)
    parameters: the calibrate options, and per input run its ``run_id``,
    ``command``, ``config`` and ``fingerprint`` (``runs.<label>.…``);
    metrics: per cell the measured ``speedup`` with ``speedup_lo``/``speedup_hi``,
    tokens/s and the ``unstable`` flag, per method ``predicted_speedup``,
    ``ape_speedup_pct`` and ``inside_ci`` (``<metric>/<method>/<cell>``, the
    held-out split when there is one), the MAPE table
    (``speedup_mape_pct/held_out/trace``, ``share_inside_ci/…``, ``n_inside_ci/…``),
    and the fitted per-position acceptance ``alpha_<i>`` with its Wilson CI per
    acceptance group; tables ``predictions`` and ``mape``; the calibration
    directory as an artifact, and the report's charts (``python -m reports``,
    drawn into ``<calibration>/report`` unless an up-to-date one is there) as
    images with the page itself.
:func:`track_ingest` (an ``ingest`` answer)
    parameters: the options, the engine, its inputs, the acceptance and cost
    models; metrics: ``alpha_<i>`` with ``alpha_<i>_lo``/``_hi``, acceptance
    rate, tokens per round, ``speedup/k-<k>`` and the rest of each k's row,
    ``optimal_k``, ``optimal_speedup``, the batch and serving answers;
    tables ``predictions``, ``by_batch``, ``serving``; ``--out``'s files.

Cells are named as ``python -m measure --track`` names them (the same
``speedup/<cell>`` in both), with ``run-<label>/`` in front when several runs
were calibrated together.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, TextIO

from toolkit.track import TrackedRun, Tracker, metric_name, number, start_tracker

__all__ = ["calibration_label", "calibration_metrics", "track_calibration", "ingest_metrics", "track_ingest"]

#: measured per cell (``predictions.csv`` column → metric), logged once per cell
MEASURED = {"measured_speedup": "speedup", "measured_speedup_lo": "speedup_lo",
            "measured_speedup_hi": "speedup_hi", "measured_tokens_per_s": "tokens_per_s",
            "measured_tokens_per_s_baseline": "tokens_per_s_baseline", "unstable": "unstable"}
#: predicted per cell and method
PREDICTED = ("predicted_speedup", "ape_speedup_pct", "inside_ci", "predicted_tokens_per_s", "ape_tokens_per_s_pct")
#: per arrival rate of ``ingest --mode serve`` (``<metric>/rate-<requests per s>``)
SERVING = ("mean_batch_baseline", "best_k", "speedup")
#: the fields of a run.json logged as parameters of the calibration, per run
RUN_FIELDS = ("path", "run_id", "command", "git_commit", "config", "fingerprint")


def _put(out: dict[str, float], name: str, value: Any) -> None:
    v = number(value)
    if v is not None:
        out[name] = v


def calibration_metrics(doc: Mapping[str, Any], predictions) -> dict[str, float]:
    """Every metric of a calibration: ``calibration.json`` (``doc``) and ``predictions.csv`` (a DataFrame)."""
    out: dict[str, float] = {}
    for split, table in [*(doc.get("mape") or {}).items(), ("unstable_held_out", doc.get("unstable_held_out") or {})]:
        for method, values in table.items():
            for key, v in values.items():
                _put(out, metric_name(key, split, method), v)
    if len(predictions):
        split = "held_out" if (predictions["split"] == "held_out").any() else "in_sample"
        pred = predictions[predictions["split"] == split]
        several = pred["run"].nunique() > 1
        for r in pred.to_dict("records"):
            cell = f"run={r['run']}|{r['cell_id']}" if several else str(r["cell_id"])
            for col, name in MEASURED.items():
                _put(out, metric_name(name, cell), r.get(col))
            for col in PREDICTED:
                _put(out, metric_name(col, str(r["method"]), cell), r.get(col))
    for group, fit in (doc.get("acceptance") or {}).items():
        name = str(group).replace(" (all cells)", "|cells=all")
        for p in fit.get("per_position") or []:
            for key, field in (("", "alpha"), ("_lo", "ci_low"), ("_hi", "ci_high")):
                _put(out, metric_name(f"alpha_{p['position']}{key}", name), p.get(field))
    return out


def _run_params(doc: Mapping[str, Any], cal_dir: Path) -> dict[str, Any]:
    """Per calibrated run: what run.json says about it (run_id, command, config, fingerprint); its path as
    ``calibration.json`` in ``cal_dir`` records it."""
    from measure.records import RUN_JSON
    from toolkit.files import resolve_from

    from measure.records import load_run

    out: dict[str, Any] = {}
    for label, info in (doc.get("runs") or {}).items():
        entry: dict[str, Any] = {"path": info.get("path"), "status": info.get("status")}
        try:
            meta = load_run(resolve_from(cal_dir, info["path"], RUN_JSON)).meta
        except (ValueError, KeyError, OSError):  # moved since: the calibration's own record stands
            meta = {}
        entry.update({k: meta[k] for k in RUN_FIELDS if meta.get(k) is not None})
        out[str(label)] = entry
    return out


def _report(cal_dir: Path, prog: str, stream: TextIO | None) -> Path | None:
    """The report directory of ``cal_dir``: ``<cal>/report`` if newer than ``calibration.json``, else drawn now.

    ``reports`` runs in its own process (``calibrate`` never imports it); if it
    fails, one line says so and the charts are left out.
    """
    out = cal_dir / "report"
    page = out / "report.html"
    if page.exists() and page.stat().st_mtime >= (cal_dir / "calibration.json").stat().st_mtime:
        return out
    proc = subprocess.run([sys.executable, "-m", "reports", str(cal_dir), "--out", str(out)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"]
        print(f"{prog}: warning: --track: the report's charts are left out: {lines[-1]}", file=stream or sys.stderr)
        return None
    return out


def _log_table(t: Tracker, name: str, rows: list[Mapping[str, Any]]) -> None:
    if rows:
        cols = list(dict.fromkeys(c for r in rows for c in r))
        t.log_table(name, cols, [[r.get(c) for c in cols] for r in rows])


def _announce(tracked: TrackedRun | None, stream: TextIO | None) -> TrackedRun | None:
    if tracked is not None:
        print(tracked.describe(), file=stream or sys.stderr, flush=True)
    return tracked


def calibration_label(cal_dir: Path) -> str:
    """A calibration's name in the tracker: its directory's, or its run's for the default ``<run>/calibration``."""
    return cal_dir.parent.name if cal_dir.name == "calibration" and cal_dir.parent.name else cal_dir.name


def track_calibration(kind: str, cal_dir: str | Path, options: Mapping[str, Any], prog: str,
                      stream: TextIO | None = None, charts: bool = True) -> TrackedRun | None:
    """Log the calibration directory ``cal_dir`` (written by ``python -m calibrate`` with ``options``)."""
    cal_dir = Path(cal_dir)
    label = calibration_label(cal_dir)
    with start_tracker(kind, run_name=f"calibrate {label}", job_type="calibrate", prog=prog,
                       tags=("calibrate",), stream=stream) as t:
        if t.active:
            import pandas as pd

            doc = json.loads((cal_dir / "calibration.json").read_text())
            pred = pd.read_csv(cal_dir / "predictions.csv")
            t.log_params({"calibrate": dict(options), "holdout": (doc.get("holdout") or {}).get("mode"),
                          "runs": _run_params(doc, cal_dir)})
            t.log_metrics(calibration_metrics(doc, pred))
            t.log_table("predictions", list(pred.columns), pred.to_numpy().tolist())
            _log_table(t, "mape", [{"split": s, "method": m, **v} for s, table in (doc.get("mape") or {}).items()
                                   for m, v in table.items()])
            report = _report(cal_dir, prog, stream) if charts else None
            if report is not None:
                for png in sorted(report.glob("*.png")):
                    t.log_image(png, f"charts/{png.stem}")
                t.log_html(report / "report.html", "report/report")
            t.log_files(cal_dir, f"calibration-{label}", "calibration")
    return _announce(t.tracked, stream)


def ingest_metrics(doc: Mapping[str, Any]) -> dict[str, float]:
    """Every metric of an ``ingest`` answer (its ``ingest.json`` document)."""
    out: dict[str, float] = {}
    acc = doc.get("acceptance") or {}
    for p in acc.get("alpha_per_position") or []:
        for key, field in (("", "alpha"), ("_lo", "ci95_low"), ("_hi", "ci95_high")):
            _put(out, f"alpha_{p['position']}{key}", p.get(field))
    for key in ("acceptance_rate", "mean_tokens_per_round", "iid_alpha", "k", "drafts", "draft_tokens",
                "accepted_tokens"):
        _put(out, key if key != "k" else "engine_k", acc.get(key))
    for key in ("optimal_k", "optimal_speedup", "context_tokens"):
        _put(out, key, doc.get(key))
    for r in doc.get("predictions") or []:
        for key, v in r.items():
            if key == "tokens_per_s_baseline":
                _put(out, key, v)
            elif key != "k":
                _put(out, metric_name(key, f"k={r['k']}"), v)
    for r in doc.get("by_batch") or []:
        for key in ("best_k", "speedup"):
            _put(out, metric_name(f"{key}_by_batch", f"batch={r['batch']}"), r.get(key))
    for r in doc.get("serving") or []:
        rate = f"rate={r['arrival_rate_per_s']:g}"
        for key in SERVING:
            _put(out, metric_name(key, rate), r.get(key))
    return out


def track_ingest(kind: str, doc: Mapping[str, Any], options: Mapping[str, Any], prog: str,
                 out_dir: str | Path | None = None, stream: TextIO | None = None) -> TrackedRun | None:
    """Log an ``ingest`` answer ``doc`` (:func:`calibrate.ingest.answer.summary`) and ``--out``'s files."""
    acc = doc.get("acceptance") or {}
    with start_tracker(kind, run_name=f"ingest {acc.get('engine', '')}".strip(), job_type="ingest", prog=prog,
                       tags=("ingest",), stream=stream) as t:
        if t.active:
            t.log_params({"ingest": dict(options), "engine": acc.get("engine"), "sources": acc.get("sources"),
                          "formats": acc.get("formats"), "inputs": doc.get("inputs"),
                          "acceptance_model": doc.get("acceptance_model"), "cost_model": doc.get("cost_model"),
                          "cost_measured": doc.get("cost_measured")})
            t.log_metrics(ingest_metrics(doc))
            for name in ("predictions", "by_batch", "serving"):
                _log_table(t, name, list(doc.get(name) or []))
            if out_dir is not None:
                t.log_files(out_dir, f"ingest-{Path(out_dir).name}", "ingest")
    return _announce(t.tracked, stream)
