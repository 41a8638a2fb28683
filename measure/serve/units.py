"""What a serving run is made of, torch-free: identities, typed rows, the run writer, the summary.

A *configuration* is what the server was started with: speculation off, or
an n-gram draft (llama-server ``--spec-type ngram-simple``: lookup n-gram of
``n`` tokens, draft of ``k``), possibly with synthetic acceptance (the step-cost
units); a *load* is a closed-loop concurrency ``c4`` or an open-loop Poisson
rate ``r2.5`` (requests/s). A *unit* is one load on one configuration in one
repeat: ``config=ngram:3:k4|slots=4|load=c4|repeat=0`` in the ``cell_id``
column of every serve table (``docs/RUN_FORMAT.md``). Its ``serve_units`` row
is written last, so a unit is finished exactly when that row exists.

The identities (:class:`~measure.ids.ServeConfig`, :class:`~measure.ids.LoadSpec`,
:class:`~measure.ids.UnitId`) live with the run format's others in :mod:`measure.ids`, each with its one
``to_str``/``parse`` pair, and are named here too. ``calibrate`` reads serving runs through the run format and
these (it imports no torch and starts no server).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from measure.ids import LoadSpec, ServeConfig, UnitId  # noqa: F401 — a serving run's identities (measure.ids)
from measure.records import RunWriter
from measure.rows import RequestRow, StepCostRow, TokenRow, UnitRow  # noqa: F401 — the serve tables' rows
from measure.stats import CONFIDENCE, Estimate

if TYPE_CHECKING:
    import pandas as pd

# -- rows: the serve tables' row types live with every other table's in measure.rows (named here too) --------
#: The run writer of a serving run, as the serving modules name it: a :class:`~measure.records.RunWriter` opened by
#: :func:`measure.runkinds.open_run_dir` with :data:`measure.runkinds.SERVE`, so a unit is finished when its
#: ``serve_units`` row is written (a name for the serving code's annotations: never constructed directly).
ServeRunWriter = RunWriter


# -- statistics ---------------------------------------------------------------------------------------------
METRICS = ("throughput_tokens_per_s", "ttft_p50_ms", "tpot_p50_ms", "tpot_p95_ms", "tpot_p99_ms", "itl_p50_ms",
           "itl_p95_ms", "itl_p99_ms", "e2e_p50_ms", "e2e_p95_ms", "e2e_p99_ms")


def log_interval(values: Sequence[float | None]) -> Estimate:
    """A positive quantity over repeats: the geometric mean of the positive, finite ``values`` with a Student-t
    95% CI of their logs (so it never reaches 0); no interval from fewer than 2 values."""
    from scipy import stats

    x = np.array([v for v in values if v is not None and math.isfinite(v) and v > 0], dtype=float)
    if x.size == 0:
        return Estimate(None, None, None)
    logs = np.log(x)
    m = float(logs.mean())
    if x.size < 2:
        return Estimate(math.exp(m), None, None)
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, x.size - 1)) * float(logs.std(ddof=1)) / math.sqrt(x.size)
    return Estimate(math.exp(m), math.exp(m - half), math.exp(m + half))


def order_stat_ci(x: np.ndarray, q: float = 0.5) -> tuple[float | None, float | None, float | None]:
    """Quantile ``q`` of ``x`` with a distribution-free 95% CI from the order statistics (binomial)."""
    from scipy import stats

    x = np.sort(np.asarray(x, dtype=float))
    n = x.size
    if n == 0:
        return None, None, None
    value = float(np.quantile(x, q))
    lo_i = int(stats.binom.ppf((1 - CONFIDENCE) / 2, n, q))
    hi_i = int(stats.binom.ppf(1 - (1 - CONFIDENCE) / 2, n, q))
    if lo_i < 1 or hi_i >= n:
        return value, None, None
    return value, float(x[lo_i - 1]), float(x[hi_i])


@dataclass(frozen=True)
class GroupSummary:
    """One (configuration, slots, load) over its repeats: each metric's :class:`~measure.stats.Estimate`, the
    acceptance and the
    speedup of throughput against speculation off at the same load (ratio per repeat, log-scale CI)."""

    config: str
    slots: int
    load: str
    repeats: int
    metrics: dict
    acceptance_rate: float | None
    mean_accepted_per_draft: float | None
    throughput_speedup: Estimate | None

    def as_dict(self) -> dict:
        d = asdict(self)
        d["metrics"] = {k: asdict(v) for k, v in self.metrics.items()}
        d["throughput_speedup"] = None if self.throughput_speedup is None else asdict(self.throughput_speedup)
        return d


def summarise(units: pd.DataFrame) -> list[GroupSummary]:
    """Per (configuration, slots, load) of a ``serve_units`` table (a DataFrame), synthetic units left out."""
    real = units[~units["synthetic"].astype(bool)] if len(units) else units
    out = []
    for (config, slots, load), g in real.groupby(["config", "slots", "load"], sort=False):
        metrics = {m: log_interval(g[m].tolist()) for m in METRICS}
        drafted, accepted = g["draft_tokens"].sum(min_count=1), g["accepted_tokens"].sum(min_count=1)
        drafts = g["drafts"].sum(min_count=1)
        rate = float(accepted / drafted) if drafted == drafted and drafted else None
        per = float(accepted / drafts) if drafts == drafts and drafts else None
        speed = None
        if config not in ("off", "url"):
            base = real[(real["config"] == "off") & (real["slots"] == slots) & (real["load"] == load)]
            pairs = g.merge(base, on="repeat", suffixes=("", "_off"))
            if len(pairs):
                speed = log_interval((pairs["throughput_tokens_per_s"] / pairs["throughput_tokens_per_s_off"]).tolist())
        out.append(GroupSummary(str(config), int(slots), str(load), int(len(g)), metrics, rate, per, speed))
    return out
