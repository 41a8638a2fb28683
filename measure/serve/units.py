"""What a serving run is made of, torch-free: identities, typed rows, the run writer, the summary.

A *configuration* is what the server was started with: speculation off, or
an n-gram draft (llama-server ``--spec-type ngram-simple``: lookup n-gram of
``n`` tokens, draft of ``k``), possibly with synthetic acceptance (the step-cost
units); a *load* is a closed-loop concurrency ``c4`` or an open-loop Poisson
rate ``r2.5`` (requests/s). A *unit* is one load on one configuration in one
repeat: ``config=ngram:3:k4|slots=4|load=c4|repeat=0`` in the ``cell_id``
column of every serve table (``docs/RUN_FORMAT.md``). Its ``serve_units`` row
is written last, so a unit is finished exactly when that row exists.

``calibrate`` reads serving runs through the run format and the typed
identities here (it imports no torch and starts no server).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from measure.records import RunWriter
from measure.rows import RequestRow, StepCostRow, TokenRow, UnitRow  # noqa: F401 — the serve tables' rows
from measure.stats import CONFIDENCE, Estimate

if TYPE_CHECKING:
    import pandas as pd

@dataclass(frozen=True)
class ServeConfig:
    """How the server was started: ``off``, ``ngram:N:kK`` or, with synthetic acceptance, ``synth:kK:pP``.

    ``ngram:N:kK``: llama-server ``--spec-type ngram-simple --spec-ngram-simple-size-n N
    --spec-ngram-simple-size-m K`` (for the n-gram types llama.cpp drafts ``size_m`` tokens;
    ``--spec-draft-n-max`` only limits drafts of a draft *model*). ``synth:kK``: the same n-gram draft on a
    prompt it always matches (the alphabet over and over, about ``P`` tokens, lookup n-gram 1), with
    ``--spec-synth-rates 0,...,0`` so every step verifies ``K + 1`` tokens per slot and emits one: what a
    step costs, apart from acceptance. ``synth:off:pP``: speculation off on the same prompts.
    """

    kind: str  # "off" | "ngram" | "synth" | "url" (a running server measured as it is)
    k: int = 0
    ngram_n: int = 0
    prompt_tokens: int = 0  # synth: the length of its repetitive prompts

    def __post_init__(self) -> None:
        if self.kind not in ("off", "ngram", "synth", "url"):
            raise ValueError(f"configuration kind {self.kind!r}; valid: off, ngram, synth, url")
        if self.kind == "ngram" and (self.k < 1 or self.ngram_n < 1):
            raise ValueError(f"an n-gram configuration needs n >= 1 and k >= 1, got n={self.ngram_n}, k={self.k}")
        if self.kind in ("off", "url") and (self.k or self.ngram_n):
            raise ValueError(f"a configuration {self.kind!r} has no k")
        if (self.kind == "synth") != (self.prompt_tokens > 0):
            raise ValueError("a synthetic configuration (and only one) has a prompt length")

    @property
    def speculative(self) -> bool:
        return self.k > 0

    @property
    def synthetic(self) -> bool:
        return self.kind == "synth"

    def to_str(self) -> str:
        if self.kind in ("off", "url"):
            return self.kind
        if self.kind == "synth":
            return f"synth:{f'k{self.k}' if self.k else 'off'}:p{self.prompt_tokens}"
        return f"ngram:{self.ngram_n}:k{self.k}"

    @classmethod
    def parse(cls, text: str) -> "ServeConfig":
        t = str(text).strip()
        if t in ("off", "url"):
            return cls(t)
        m = re.fullmatch(r"synth:(?:k(\d+)|off):p(\d+)", t)
        if m:
            return cls("synth", int(m.group(1) or 0), 0, int(m.group(2)))
        m = re.fullmatch(r"ngram:(\d+):k(\d+)", t)
        if m:
            return cls("ngram", int(m.group(2)), int(m.group(1)))
        raise ValueError(f"configuration {text!r}; expected off, url, ngram:N:kK, synth:kK:pP or synth:off:pP")

    def server_args(self, slots: int) -> list[str]:
        """llama-server flags for this configuration (``--spec-synth-rates`` for the synthetic ones)."""
        if not self.speculative:
            return []
        n = self.ngram_n if self.kind == "ngram" else 1
        args = ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(n),
                "--spec-ngram-simple-size-m", str(self.k)]
        if self.synthetic:
            args += ["--spec-synth-rates", ",".join(["0"] * self.k)]
        return args


@dataclass(frozen=True)
class LoadSpec:
    """A load: closed-loop ``concurrency`` clients (``c4``) or Poisson arrivals at ``rate_per_s`` (``r2.5``)."""

    concurrency: int = 0
    rate_per_s: float = 0.0

    def __post_init__(self) -> None:
        closed, open_ = self.concurrency > 0, self.rate_per_s > 0
        if closed == open_:
            raise ValueError(f"a load is a concurrency >= 1 or a rate > 0, not both or neither "
                             f"(concurrency={self.concurrency}, rate={self.rate_per_s})")
        if open_ and not math.isfinite(self.rate_per_s):
            raise ValueError(f"arrival rate must be finite, got {self.rate_per_s}")

    @property
    def closed(self) -> bool:
        return self.concurrency > 0

    def to_str(self) -> str:
        return f"c{self.concurrency}" if self.closed else f"r{self.rate_per_s:g}"

    @classmethod
    def parse(cls, text: str) -> "LoadSpec":
        t = str(text).strip()
        try:
            if t.startswith("c"):
                return cls(concurrency=int(t[1:]))
            if t.startswith("r"):
                return cls(rate_per_s=float(t[1:]))
        except ValueError:
            pass
        raise ValueError(f"load {text!r}; expected cN (concurrency) or rX (requests/s)")


@dataclass(frozen=True)
class UnitId:
    """One load on one configuration in one repeat: ``config=..|slots=..|load=..|repeat=..``."""

    config: ServeConfig
    slots: int
    load: LoadSpec
    repeat: int

    def to_str(self) -> str:
        return f"config={self.config.to_str()}|slots={self.slots}|load={self.load.to_str()}|repeat={self.repeat}"

    @classmethod
    def parse(cls, text: str) -> "UnitId":
        parts = dict(p.partition("=")[::2] for p in str(text).split("|"))
        if list(parts) != ["config", "slots", "load", "repeat"]:
            raise ValueError(f"unit id {text!r}: expected config=..|slots=..|load=..|repeat=..")
        try:
            return cls(ServeConfig.parse(parts["config"]), int(parts["slots"]), LoadSpec.parse(parts["load"]),
                       int(parts["repeat"]))
        except ValueError as e:
            raise ValueError(f"unit id {text!r}: {e}") from None


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
