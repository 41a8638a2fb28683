"""``--track wandb|mlflow``: log a finished run directory to an experiment tracker (one tracker run per run).

Called by the CLI after the run directory is written, it reads the run back
through :func:`measure.records.load_run` (so what the tracker holds is what
is on disk) and hands :mod:`toolkit.track` what to log:

* parameters: the run's ``config`` and ``fingerprint`` (nested), and ``run_id``,
  ``command``, ``git_commit``, ``git_dirty``, ``status``, ``hardware``, ``versions``;
* metrics, one step, named ``<metric>/<cell>`` (:func:`toolkit.track.metric_name`,
  e.g. ``speedup/draft-ngram:3/gamma-fixed:4/temp-0/domain-code``): every
  numeric column of ``cells.csv`` in :data:`CELL_METRICS` (``speedup`` with
  ``speedup_lo``/``speedup_hi``, tokens/s with their CIs, acceptance, the
  ``unstable`` flag as 0/1, ...), the per-position acceptance ``alpha_<i>``
  with its 95% Wilson interval ``alpha_<i>_lo``/``_hi`` from ``rounds.csv``,
  and per draft the run summary's ``geomean_speedup`` and its CI; the
  engine's own plain decoding (``tokens_per_s_library``, ``baseline_vs_library``
  per cell, ``geomean_baseline_vs_library`` over the run) where it was run;
* tables: ``cells`` (every column of ``cells.csv``, one row per cell) and
  ``acceptance_per_position`` (cell, position, judged, accepted, α_i, CI);
* the run directory itself as an artifact (less the writer's lock file).

A tracker that fails costs one warning line (:mod:`toolkit.track`), never the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from toolkit.track import TrackedRun, metric_name, number, start_tracker

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CELL_METRICS", "CELL_IDENTITY", "run_params", "cell_metrics", "acceptance_rows", "track_run"]

#: ``cells.csv`` columns logged per cell (those present and numeric; CIs beside their value).
CELL_METRICS = (
    "speedup", "speedup_lo", "speedup_hi",
    "tokens_per_s_baseline", "tokens_per_s_baseline_lo", "tokens_per_s_baseline_hi",
    "tokens_per_s_speculative", "tokens_per_s_speculative_lo", "tokens_per_s_speculative_hi",
    "tokens_per_s_peer", "tokens_per_s_peer_lo", "tokens_per_s_peer_hi",
    "speedup_peer", "speedup_peer_lo", "speedup_peer_hi",
    "acceptance_rate", "peer_acceptance_rate", "mean_accepted_per_round", "n_rounds",
    "baseline_cv", "baseline_drift", "unstable", "outputs_identical", "n_lossless_failures", "n_near_tie",
    "tokens_per_s_library", "tokens_per_s_library_lo", "tokens_per_s_library_hi",
    "baseline_vs_library", "baseline_vs_library_lo", "baseline_vs_library_hi",
)
#: ``cells.csv`` columns that say which cell it is and how it was run: in the ``cells`` table, not metrics.
#: Every column of the format is in exactly one of the two (a test checks), so a new column is a decision.
CELL_IDENTITY = ("cell_id", "draft", "gamma_policy", "gamma", "temperature", "domain", "head_k", "n_prompts",
                 "new_tokens", "repeats", "attempts", "synthetic", "unstable_reason", "hardware")
#: run-summary fields logged per draft (``<metric>/draft-<draft>``)
DRAFT_METRICS = ("geomean_speedup", "geomean_speedup_lo", "geomean_speedup_hi")
#: run.json fields logged as parameters beside ``config`` and ``fingerprint``
RUN_PARAMS = ("run_id", "command", "git_commit", "git_dirty", "status", "created_utc", "schema_version",
              "hardware", "versions", "models")


def run_params(meta: dict) -> dict[str, Any]:
    """The parameters of a run: ``config``, ``fingerprint`` and :data:`RUN_PARAMS` from ``run.json``."""
    out: dict[str, Any] = {k: meta[k] for k in RUN_PARAMS if meta.get(k) is not None}
    for k in ("config", "fingerprint"):
        if meta.get(k):
            out[k] = meta[k]
    return out


def acceptance_rows(rounds: pd.DataFrame | None) -> list[dict[str, Any]]:
    """Per cell and position: rounds that reached it (``n``), ``accepted``, α_i and its 95% Wilson interval."""
    from scipy.stats import binomtest

    from measure.analysis import per_position_acceptance

    out: list[dict[str, Any]] = []
    if rounds is None or not len(rounds):
        return out
    for cid, sub in rounds.groupby("cell_id", sort=False):
        for r in per_position_acceptance(sub).itertuples(index=False):
            lo = hi = None
            if r.n:
                ci = binomtest(int(r.accepted), int(r.n)).proportion_ci(0.95, method="wilson")
                lo, hi = float(ci.low), float(ci.high)
            out.append({"cell_id": str(cid), "position": int(r.position), "n": int(r.n), "accepted": int(r.accepted),
                        "alpha": float(r.alpha) if r.n else None, "alpha_lo": lo, "alpha_hi": hi})
    return out


def cell_metrics(cells: pd.DataFrame, acceptance: list[dict[str, Any]], summary: dict) -> dict[str, float]:
    """Every metric of the run, named ``<metric>/<cell>`` (and ``<metric>/<draft>`` for the summary)."""
    out: dict[str, float] = {}
    for row in cells.to_dict("records"):
        cell = str(row["cell_id"])
        for col in CELL_METRICS:
            v = number(row.get(col))
            if v is not None:
                out[metric_name(col, cell)] = v
    for a in acceptance:
        for key in ("alpha", "alpha_lo", "alpha_hi"):
            if a[key] is not None:
                out[metric_name(key.replace("alpha", f"alpha_{a['position']}"), a["cell_id"])] = a[key]
    for draft, s in (summary.get("drafts") or {}).items():
        for key in DRAFT_METRICS:
            v = number(s.get(key))
            if v is not None:
                out[metric_name(key, f"draft={draft}")] = v
    for key in ("n_cells", "n_unstable"):
        v = number(summary.get(key))
        if v is not None:
            out[key] = v
    lib = summary.get("baseline_vs_library") or {}  # our baseline ÷ the engine's own decoding, over all cells
    for key, field in (("", "geomean"), ("_lo", "lo"), ("_hi", "hi")):
        v = number(lib.get(field))
        if v is not None:
            out[f"geomean_baseline_vs_library{key}"] = v
    return out


def _table(rows: list[dict[str, Any]], columns: list[str]) -> list[list[Any]]:
    return [[r.get(c) for c in columns] for r in rows]


def track_run(kind: str, run_dir: str | Path, prog: str, job_type: str = "measure",
              stream: TextIO | None = None) -> TrackedRun | None:
    """Log the run directory ``run_dir`` to tracker ``kind``; print where it went; ``None`` if the tracker failed."""
    run_dir = Path(run_dir)
    with start_tracker(kind, run_name=f"{job_type} {run_dir.name}", job_type=job_type, prog=prog,
                       tags=(job_type,), stream=stream) as t:
        if t.active:
            from measure.records import LOCK_FILE, load_run

            run = load_run(run_dir)
            cells = run.table("cells")
            acceptance = acceptance_rows(run.table("rounds"))
            t.log_params(run_params(run.meta))
            t.log_metrics(cell_metrics(cells, acceptance, run.summary))
            t.log_table("cells", list(cells.columns), cells.to_numpy().tolist())
            if acceptance:
                cols = list(acceptance[0])
                t.log_table("acceptance_per_position", cols, _table(acceptance, cols))
            t.log_files(run_dir, f"{job_type}-run-{run_dir.name}", "run-directory", exclude=(LOCK_FILE,))
    if t.tracked is not None:
        import sys

        print(t.tracked.describe(), file=stream or sys.stderr, flush=True)
    return t.tracked
