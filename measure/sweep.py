"""The measurement sweep: cells of (draft [× head K], γ policy, temperature, domain) into one run directory.

One pipeline for every cell, whatever the draft or engine (:func:`run_cell`):

* **Interleaving and repeats.** A *visit* is one (prompt, repeat) of a
  cell: the baseline, our speculative loop and the peer (the engine's own
  speculative decoding) back to back in a rotating order (ABC, BCA, CAB, …,
  continuing across prompts and repeats). The visits of all the sweep's
  cells are interleaved (``interleave="sweep"``, the default): prompt 1 of
  repeat 1 of every cell, then prompt 2 of every cell, …, then repeat 2, so
  a cell's pairs are spread over the whole measurement, not bunched into one
  minute in which this machine may sit in a slow or fast mode for one
  forward shape (``"cell"``: one cell's visits back to back, then the next
  cell). Every mode of every cell is warmed up first; warm-ups are never
  recorded.
* **One estimator** (:mod:`measure.stats`): speedup = mean tokens/s of the
  method / mean tokens/s of the baseline over the cell's (prompt, repeat)
  pairs, with Fieller's paired 95% CI; every tokens/s has its Student-t CI.
* **Noise.** A cell whose baseline (normalised per prompt, in measured order;
  interleaved, also by the machine's pace in each pass,
  :func:`measure.stats.normalise_by_pace`) varies or drifts beyond the
  thresholds is flagged ``unstable`` with the reason in words; ``until_stable`` re-measures such a cell up to N times.
* **Records.** Each finished visit is staged on disk at once
  (``visits.partial.jsonl``); a cell's rows go to its tables when its last
  visit is done (its ``cells.csv`` row last), so an interruption loses at
  most the visit that was running, and a resume measures only the missing
  visits. Every generation's token ids are saved (``generations.csv``
  ``tokens``), so losslessness and acceptance recompute from the files.
* **Identity.** The run's fingerprint (models and file hashes, dtype, device,
  engine and options, prompts and their selection, max tokens, seed,
  versions, hardware) decides whether a resume may append
  (:class:`measure.records.RunWriter`).

The sweep reaches models only through an engine (:func:`measure.engines.make_engine`).
The pruned-head K sweep (:mod:`measure.head.head_sweep`) calls :func:`measure_cells` too,
with a pruned draft and its ``head_k``; a Ray worker measures one cell with :func:`run_cell`.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import json
import os
import math
import platform
import random
import subprocess
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import torch

from measure import costpoints, records, runplan, stats
from measure.decoding import acceptance_trace, autoregressive_generate, proposal_runs, speculative_generate
from measure.engines import check_specs, make_engine
from measure.engines.base import CACHES, EngineOptions
from measure.engines.lossless import LosslessCheck, baseline_logits_at, check_greedy_lossless
from measure.models import resolve_device, resolve_dtype
from measure.prompts import DOMAINS, Prompt, file_sha256, load_prompts, load_prompts_file
from measure.timing import Timer
from sim.policies import GammaSpec

#: Upper bounds (a larger value is a typo, not an experiment on this tool's scale).
MAX_REPEATS = 1000
MAX_NEW_TOKENS = 100_000
MAX_PROMPT_TOKENS = 1_000_000
MAX_GAMMA = 64
#: The modes of a visit: our baseline and speculative loop, the engine's own speculative decoding (the peer) and
#: the engine's own plain decoding (the library baseline ours is held against), where the engine has them.
MODES = ("baseline", "speculative", "peer", "library")
#: How a sweep orders its cells' visits: ``sweep`` — in passes over every cell (each cell's pairs spread over
#: the whole measurement); ``cell`` — each cell's visits back to back, one cell after the other.
INTERLEAVE = ("sweep", "cell")
#: Our baseline's tokens/s over the engine's own plain decoding's, same prompts in the same visits: the range in
#: which our loop measures the engine as its users run it (outside it, the harness disturbs the engine).
LIBRARY_RATIO_TARGET = (0.95, 1.05)


@dataclass(frozen=True)
class SweepConfig:
    """Everything a sweep needs; validated on construction (``ValueError`` names the bad value)."""

    target: str = "smollm2-135m"
    drafts: tuple[str, ...] = ("ngram:3",)
    gammas: tuple[str, ...] = ("fixed:4",)
    temperatures: tuple[float, ...] = (0.0,)
    domains: tuple[str, ...] | None = None
    prompts_per_domain: int | None = 2
    max_new_tokens: int = 64
    max_prompt_tokens: int = 256
    device: str = "auto"
    dtype: str = "float32"
    seed: int = 0
    warmup: int = 1
    peer: bool = True
    library: bool = True
    traces: bool = True
    cost_curves: bool = True
    #: the cost points: None sizes each to the run (measure.costpoints: token counts 1..γ_max + 1, contexts over
    #: the cells' prompts, repeats in proportion to a cell's pairs); a value is used as given
    cost_max_tokens: int | None = None
    cost_contexts: tuple[int, ...] | None = None
    cost_repeats: int | None = None
    #: repeats of the token counts the cells verify (1..γ_max + 1): the held-out predictions of a run are as
    #: good as those points (single timings vary 10-17% here). Re-fitting runs g-j with only the first 5, 10
    #: or all 20 repeats gave a mean held-out speedup MAPE (event simulator) of 8.0%, 6.9%, 5.7%: about one
    #: point per doubling, so 40 at the default run's 6 pairs per cell (300 more forwards at a median 70 ms:
    #: ≈ 21 s more on the default run), fewer for smaller cells (measure.costpoints)
    cost_repeats_verified: int | None = None
    repeats: int = 2
    cv_threshold: float = stats.CV_THRESHOLD
    drift_threshold: float = stats.DRIFT_THRESHOLD
    until_stable: int = 0
    engine: str = "transformers"
    threads: int | None = None
    cache: str = "static"
    compile: bool = False
    prompts_file: str | None = None
    interleave: str = "sweep"

    def __post_init__(self) -> None:
        if not self.drafts:
            raise ValueError("--draft: need at least one draft")
        check_specs(self.engine, self.target, self.drafts)  # --engine and its own draft forms; no weights
        if not self.gammas:
            raise ValueError("--gamma: need at least one γ")
        for g, spec in zip(self.gammas, self.gamma_specs):
            if not 1 <= spec.gamma <= MAX_GAMMA:
                raise ValueError(f"--gamma {g!r}: γ must be in 1..{MAX_GAMMA}")
        for t in self.temperatures:
            if not (math.isfinite(float(t)) and float(t) >= 0):
                raise ValueError(f"--temperature {t}: must be a finite number >= 0")
        if self.prompts_file is None:
            for d in self.domains or DOMAINS:
                if d not in DOMAINS:
                    raise ValueError(f"--domains {d!r}: unknown domain; valid: {', '.join(DOMAINS)}")
        bounds = {"max_new_tokens": MAX_NEW_TOKENS, "max_prompt_tokens": MAX_PROMPT_TOKENS, "cost_max_tokens": 1024,
                  "cost_repeats": MAX_REPEATS, "cost_repeats_verified": MAX_REPEATS,
                  "repeats": MAX_REPEATS}
        for name, hi in bounds.items():
            v = getattr(self, name)
            if v is not None and not 1 <= v <= hi:
                raise ValueError(f"--{name.replace('_', '-')} {v}: must be an integer in 1..{hi}")
        if self.prompts_per_domain is not None and not 1 <= self.prompts_per_domain <= 10_000:
            raise ValueError(f"--prompts {self.prompts_per_domain}: must be an integer in 1..10000")
        if not 0 <= self.warmup <= 100:
            raise ValueError(f"--warmup {self.warmup}: must be an integer in 0..100")
        if not 0 <= self.until_stable <= 100:
            raise ValueError(f"--until-stable {self.until_stable}: must be an integer in 0..100")
        for name in ("cv_threshold", "drift_threshold"):
            v = getattr(self, name)
            if not (math.isfinite(v) and 0 < v <= 10):
                raise ValueError(f"--{name.replace('_', '-')} {v}: must be a number in (0, 10] (a fraction, "
                                 "0.1 = 10%)")
        if self.cost_contexts is not None and (not self.cost_contexts or
                                               any(not 1 <= c <= MAX_PROMPT_TOKENS for c in self.cost_contexts)):
            raise ValueError(f"--cost-contexts {self.cost_contexts}: need integers in 1..{MAX_PROMPT_TOKENS}")
        if self.interleave not in INTERLEAVE:
            raise ValueError(f"--interleave {self.interleave!r}: unknown; valid: {', '.join(INTERLEAVE)}")
        if self.cache not in CACHES:
            raise ValueError(f"--cache {self.cache!r}: unknown; valid: {', '.join(CACHES)}")
        if self.threads is not None and not 1 <= self.threads <= 1024:
            raise ValueError(f"--threads {self.threads}: must be an integer in 1..1024")
        resolve_dtype(self.dtype)

    def as_dict(self) -> dict:
        return asdict(self)

    @functools.cached_property
    def gamma_specs(self) -> tuple[GammaSpec, ...]:
        """``gammas`` (the strings ``run.json`` records) parsed once."""
        return tuple(GammaSpec.parse(g) for g in self.gammas)

    @property
    def gamma_max(self) -> int:
        return max(spec.gamma for spec in self.gamma_specs)


def select_prompts(config: SweepConfig) -> tuple[dict[str, list[Prompt]], dict]:
    """The evaluation prompts by domain, and what selected them (for ``run.json`` and the fingerprint)."""
    if config.prompts_file:
        prompts, fmt = load_prompts_file(config.prompts_file)
        doms = list(dict.fromkeys(p.domain for p in prompts))
        if config.domains:
            unknown = [d for d in config.domains if d not in doms]
            if unknown:
                raise ValueError(f"--domains {','.join(unknown)}: not in --prompts-file (its domains: "
                                 f"{', '.join(doms)})")
            doms = list(config.domains)
        by = {d: [p for p in prompts if p.domain == d][:config.prompts_per_domain or None] for d in doms}
        sel = {"source": "file", "file": str(config.prompts_file), "format": fmt,
               "sha256": file_sha256(config.prompts_file)}
    else:
        doms = list(config.domains or DOMAINS)
        by = {d: load_prompts(d, config.prompts_per_domain or 2, config.seed) for d in doms}
        sel = {"source": "builtin", "seed": config.seed}
    texts = hashlib.sha256("\n\x00".join(p.prompt_id + "\x00" + p.message for ps in by.values()
                                         for p in ps).encode()).hexdigest()
    sel.update(prompt_ids=[p.prompt_id for ps in by.values() for p in ps], texts_sha256=texts)
    return by, sel


# -- environment ----------------------------------------------------------------------------
def environment(device: str) -> tuple[dict, dict, dict]:
    """(hardware, versions, source) for ``run.json``; ``source``: :func:`source_state`."""
    import importlib.metadata as md
    import os

    def ver(pkg: str) -> str | None:
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return None

    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else None
    hardware = {"device": "cuda" if gpu else "cpu", "device_name": gpu or cpu, "cpu": cpu,
                "cores": os.cpu_count(), "memory_bytes": int(mem), "gpu": gpu,
                "torch_threads": torch.get_num_threads()}
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": ver("transformers"), "specscope": ver("specscope"),
                "cuda": torch.version.cuda}
    return hardware, versions, source_state()


def source_state() -> dict:
    """``git_commit`` (HEAD of this checkout, None outside git) and ``git_dirty`` (tracked files changed since
    it, None when unknown): a run measured from uncommitted code says so."""
    here = Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            r = subprocess.run(["git", *args], capture_output=True, text=True, timeout=5, cwd=here)
        except (OSError, subprocess.SubprocessError):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    commit = git("rev-parse", "HEAD") or None
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"git_commit": commit, "git_dirty": None if status is None else bool(status)}


# -- cost curves ----------------------------------------------------------------------------
@dataclass(frozen=True)
class CostPoint:
    """One point of the cost curves: a target forward of ``n`` tokens after ``context`` cached, or (``draft``
    set, the index of a draft) one draft step after ``context``. ``repeat`` -1 is the untimed warm-up."""

    repeat: int
    context: int
    n: int = 0
    draft: int | None = None


class CostCurves:
    """The cost-curve micro-benchmark as a queue of points, timed all at once or a few between a sweep's visits.

    Target forward ms per (tokens verified 1..max_tokens, context) and draft
    step ms per context, timed through the engine seam
    (``target.new_decoder()``: forward ``n`` tokens after ``c`` cached, roll
    back to ``c``; a draft's ``propose`` of one token after ``start``). Every
    repeat visits all points in a fresh seeded random order, after one
    untimed warm-up pass. Timed a few points after each visit of the
    interleaved sweep (:func:`measure_cells` ``between``), the curves see the
    machine in the same slow and fast modes as the cells they are compared
    with: timed in one block before the cells, a run's 2- and 3-token
    forwards once cost what its 1-token forward did for the whole block
    (3 tokens: 1.03x) and 1.27x inside the loop (``results/2026-11-24-readme-evidence.md`` §3.4).
    ``verified`` ``(n_max, r)``: the token counts 1..n_max (those the
    sweep's cells verify) get ``max(repeats, r)`` repeats. ``done_target`` / ``done_draft``: keys ``(n_tokens,
    context_tokens, repeat)`` / ``(draft, context_tokens, repeat)`` already
    on disk (a resumed run), not timed again. ``plan``: the sizing these points came from, when a sweep
    made them (:func:`cost_curves_for`).
    """

    plan: costpoints.CostPlan | None = None

    def __init__(self, target: Any, drafts: list[Any], timer: Timer, contexts: tuple[int, ...], max_tokens: int,
                 repeats: int, seed: int, done_target: set[tuple[int, int, int]] = frozenset(),
                 done_draft: set[tuple[str, int, int]] = frozenset(), verified: tuple[int, int] = (0, 0)) -> None:
        self.target, self.drafts, self.timer = target, drafts, timer
        g = torch.Generator().manual_seed(seed)
        rng = random.Random(seed)
        self.ids = torch.randint(0, target.vocab_size, (1, max(contexts) + max_tokens + 1),
                                 generator=g).to(target.device)  # [1, C+K]
        points = ([CostPoint(0, c, n) for c in contexts for n in range(1, max_tokens + 1)]
                  + [CostPoint(0, c, draft=i) for i in range(len(drafts)) for c in contexts])
        todo: list[CostPoint] = []
        n_verified, rep_verified = verified
        for rep in range(max(repeats, rep_verified)):
            order = [replace(p, repeat=rep) for p in points
                     if rep < repeats or (p.draft is None and p.n <= n_verified)]
            rng.shuffle(order)
            todo.extend(p for p in order if not self._done(p, done_target, done_draft))
        self.warm_up = [replace(p, repeat=-1) for p in points] if todo else []
        self.pending = collections.deque(todo)
        self._decs: dict[int, Any] = {}

    def _done(self, p: CostPoint, done_target: set, done_draft: set) -> bool:
        if p.draft is None:
            return (p.n, p.context, p.repeat) in done_target
        return (self.drafts[p.draft].name, p.context, p.repeat) in done_draft

    def __len__(self) -> int:
        """Points still to time (the warm-up not counted)."""
        return len(self.pending)

    @torch.inference_mode()
    def _time(self, p: CostPoint) -> float:
        if p.draft is None:
            dec = self._decs.get(p.context)
            if dec is None:
                dec = self._decs[p.context] = self.target.new_decoder()
                dec.forward(self.ids[:, :p.context], last_only=True)
            x = self.ids[:, p.context:p.context + p.n]  # [1, n]
            with self.timer.span() as s:
                dec.forward(x)
            dec.rollback(p.context)
            return s.ms
        d = self.drafts[p.draft]
        d.start(self.ids[:, :p.context])
        tokens = self.ids[:, :p.context + 1]  # one uncached token -> one draft step
        with self.timer.span() as s:
            d.propose(tokens, 1, 0.0, None)
        d.rollback(p.context)
        return s.ms

    def measure(self, count: int | None = None) -> tuple[list[dict], list[dict]]:
        """Time the next ``count`` points (every pending one when None), the warm-up pass first.

        Returns the ``cost_target`` and ``cost_draft`` rows of the timed points.
        """
        while self.warm_up:
            self._time(self.warm_up.pop(0))
        t_rows: list[dict] = []
        d_rows: list[dict] = []
        n = len(self.pending) if count is None else min(count, len(self.pending))
        for _ in range(n):
            p = self.pending.popleft()
            ms = self._time(p)
            if p.draft is None:
                t_rows.append({"n_tokens": p.n, "context_tokens": p.context, "repeat": p.repeat, "ms": ms})
            else:
                d_rows.append({"draft": self.drafts[p.draft].name, "head_k": None, "context_tokens": p.context,
                               "repeat": p.repeat, "ms": ms})
        if not self.pending:
            self._decs.clear()  # the decoders' KV caches are not needed any more
        return t_rows, d_rows


# -- one cell ---------------------------------------------------------------------------------
@dataclass
class CellContext:
    """What every cell of a sweep shares: where it writes, the engine and target, the prompts."""

    writer: records.RunWriter
    engine: Any
    target: Any
    config: SweepConfig
    timer: Timer
    prompts: dict[str, list[Prompt]]
    enc: dict[str, torch.Tensor]
    bar: Any = None
    peer_ok: dict = field(default_factory=dict)
    hardware: str | None = None  # records.hardware_label of the machine measuring the cells


def _gen(seed: int, index: int, device: str) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed * 1_000_003 + index)


def rotation(index: int, modes: tuple[str, ...]) -> tuple[str, ...]:
    """The order of the ``index``-th (prompt, repeat) visit: ABC, BCA, CAB, ABC, …"""
    k = index % len(modes)
    return modes[k:] + modes[:k]


def _ids_text(tokens: tuple[int, ...] | list[int]) -> str:
    return " ".join(str(int(t)) for t in tokens)


def parse_tokens(text: Any) -> tuple[int, ...]:
    """Token ids from a ``generations.csv`` ``tokens`` field (space-separated)."""
    if text is None or (isinstance(text, float) and math.isnan(text)):
        return ()
    return tuple(int(t) for t in str(text).split())


def _warm(ctx: CellContext, draft: Any, spec: GammaSpec, temp: float, modes: tuple[str, ...]) -> set[str]:
    """Warm ``modes`` up (never recorded); returns the modes that generated (an engine without a peer for this
    pair, or without a library baseline, returns None there)."""
    cfg, t = ctx.config, ctx.target
    ids = ctx.enc[next(iter(ctx.enc))]
    n = min(8, cfg.max_new_tokens)
    ran: set[str] = set()
    for _ in range(cfg.warmup):
        for mode in modes:
            g = _gen(cfg.seed, -1, t.device)
            if mode == "baseline":
                autoregressive_generate(t, ids, temp, n, g, t.eos_token_ids, ctx.timer)
            elif mode == "speculative":
                speculative_generate(t, draft, ids, spec.policy(), temp, n, g, t.eos_token_ids, ctx.timer)
            elif mode == "peer":
                if ctx.engine.peer_generate(t, draft, ids, spec.gamma, temp, n, cfg.seed) is None:
                    continue
            elif ctx.engine.library_generate(t, ids, temp, n, cfg.seed) is None:
                continue
            ran.add(mode)
    return ran if cfg.warmup else set(modes)


def _lossless(ctx: CellContext, ids: torch.Tensor, baseline: Sequence[int], other: Sequence[int]) -> LosslessCheck:
    """A greedy generation judged against the baseline, with the engine's near-tie tolerance.

    Identical outputs cost nothing; at a divergence the target's logits along the
    baseline's token-by-token path are recomputed once (a fresh decoder) for the margin.
    """
    if tuple(other) == tuple(baseline):
        return LosslessCheck("identical", tolerance=ctx.engine.near_tie_tolerance)
    logits_at = baseline_logits_at(ctx.target.new_decoder(), ids, baseline)
    return check_greedy_lossless(baseline, other, logits_at, ctx.engine.near_tie_tolerance)


@dataclass(frozen=True)
class Generation:
    """One counted generation of a cell: one mode, one prompt, one repeat."""

    tokens: Sequence[int]
    wall_s: float
    ttft_ms: float | None
    latency_ms: Sequence[float]
    rounds: Sequence[Any]
    drafted: int | None
    accepted: int | None
    n_rounds: int | None
    order: int  # position of this mode in the visit's rotation
    peak_mem_bytes: int | None

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.wall_s if self.wall_s > 0 else float("nan")


@dataclass
class CellSeries:
    """Per (prompt, repeat) visit of a cell: tokens/s of each mode, and the peer's own counts."""

    prompt: list[str] = field(default_factory=list)
    repeat: list[int] = field(default_factory=list)
    base: list[float] = field(default_factory=list)
    spec: list[float] = field(default_factory=list)
    peer: list[float] = field(default_factory=list)
    library: list[float] = field(default_factory=list)
    peer_drafted: int = 0
    peer_accepted: int = 0


@dataclass(frozen=True)
class CellMeasurement:
    """The counted generations of a cell: the rows of its tables, and the series its statistics use."""

    gen_rows: list[dict]
    round_rows: list[dict]
    lat_rows: list[dict]
    series: CellSeries


def _generate(ctx: CellContext, mode: str, draft: Any, spec: GammaSpec, temp: float, ids: torch.Tensor,
              seed_i: int, rep: int, order: int) -> Generation | None:
    """One generation of ``mode``; None when the peer cannot run this pair."""
    cfg, t, timer = ctx.config, ctx.target, ctx.timer
    timer.reset_peak_memory()
    if mode == "baseline":
        r = autoregressive_generate(t, ids, temp, cfg.max_new_tokens, _gen(seed_i, rep, t.device),
                                    t.eos_token_ids, timer)
        return Generation(r.tokens, r.wall_s, r.ttft_ms, r.token_latency_ms, (), None, None, None, order,
                          timer.peak_memory_bytes())
    if mode == "speculative":
        r = speculative_generate(t, draft, ids, spec.policy(), temp, cfg.max_new_tokens,
                                 _gen(seed_i, rep, t.device), t.eos_token_ids, timer)
        return Generation(r.tokens, r.wall_s, r.ttft_ms, r.token_latency_ms, r.rounds, r.drafted, r.accepted,
                          len(r.rounds), order, timer.peak_memory_bytes())
    if mode == "library":
        pr = ctx.engine.library_generate(t, ids, temp, cfg.max_new_tokens, seed_i + rep)
    else:  # the peer gets the initial γ only: it runs its engine's constant schedule whatever the policy
        pr = ctx.engine.peer_generate(t, draft, ids, spec.gamma, temp, cfg.max_new_tokens, seed_i + rep)
    if pr is None:
        return None
    return Generation(pr.tokens, pr.wall_s, pr.ttft_ms, (), (), pr.drafted, pr.accepted, pr.rounds, order,
                      timer.peak_memory_bytes())


def _generation_rows(ctx: CellContext, cid: str, prompt: Prompt, domain: str, ids: torch.Tensor, rep: int,
                     temp: float, res: dict[str, Generation]) -> tuple[list[dict], list[dict]]:
    """``generations.csv`` and ``token_latency.csv`` rows of one visit (greedy outputs judged against the baseline)."""
    gen_rows: list[dict] = []
    lat_rows: list[dict] = []
    base_toks = res["baseline"].tokens
    for mode, r in res.items():
        same = None if temp != 0 or mode == "baseline" else tuple(r.tokens) == tuple(base_toks)
        check = _lossless(ctx, ids, base_toks, r.tokens) if same is not None else None
        n = len(r.tokens)
        gen_rows.append({"cell_id": cid, "prompt_id": prompt.prompt_id, "domain": domain, "mode": mode,
                         "prompt_tokens": int(ids.shape[1]), "new_tokens": n, "wall_s": r.wall_s,
                         "tokens_per_s": n / r.wall_s if r.wall_s > 0 else None, "ttft_ms": r.ttft_ms,
                         "peak_mem_bytes": r.peak_mem_bytes, "outputs_identical": same, "repeat": rep,
                         "order": r.order, "drafted": r.drafted, "accepted": r.accepted,
                         "n_rounds": r.n_rounds, "tokens": _ids_text(r.tokens),
                         "lossless": check.status if check else None,
                         "divergence_position": check.position if check else None,
                         "divergence_margin": check.margin if check else None})
        lat_rows += [{"cell_id": cid, "prompt_id": prompt.prompt_id, "mode": mode, "token_index": i,
                      "latency_ms": v, "repeat": rep} for i, v in enumerate(r.latency_ms)]
    return gen_rows, lat_rows


@dataclass(frozen=True)
class CellPlan:
    """A cell to measure: its identity and the draft object that runs it."""

    cell: records.CellId
    draft: Any

    @property
    def cell_id(self) -> str:
        return self.cell.to_str()


@dataclass(frozen=True)
class Visit:
    """One (repeat, prompt) of a cell: the modes back to back in rotated order, as rows of its tables.

    The unit an interleaved sweep stages on disk (``visits.partial.jsonl``) as soon as it is measured.
    """

    cell_id: str
    attempt: int
    repeat: int
    prompt_index: int
    gen_rows: tuple[dict, ...]
    lat_rows: tuple[dict, ...]
    round_rows: tuple[dict, ...]

    def to_record(self) -> dict:
        return {"cell_id": self.cell_id, "attempt": self.attempt, "repeat": self.repeat,
                "prompt_index": self.prompt_index, "generations": list(self.gen_rows),
                "token_latency": list(self.lat_rows), "rounds": list(self.round_rows)}

    @classmethod
    def from_record(cls, rec: dict) -> "Visit":
        """The visit a staged record holds; ``ValueError`` naming the field that is missing or of the wrong type."""
        for key in ("attempt", "repeat", "prompt_index"):
            v = rec.get(key)
            if not isinstance(v, int) or isinstance(v, bool):
                raise ValueError(f"{key} {v!r} is not an integer")
        for key in ("generations", "token_latency", "rounds"):
            rows = rec.get(key)
            if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
                raise ValueError(f"{key} is not a list of rows")
        if not isinstance(rec.get("cell_id"), str):
            raise ValueError(f"cell_id {rec.get('cell_id')!r} is not a string")
        return cls(rec["cell_id"], rec["attempt"], rec["repeat"], rec["prompt_index"],
                   tuple(rec["generations"]), tuple(rec["token_latency"]), tuple(rec["rounds"]))

    def problem(self, repeats: int, n_prompts: int, modes: Sequence[str]) -> str | None:
        """Why this visit cannot belong to a cell measured with ``repeats`` repeats of ``n_prompts`` prompts in
        ``modes`` (None if it can): indices out of range, rows of another cell, a generation per mode."""
        if not 0 <= self.repeat < repeats:
            return f"repeat {self.repeat} is outside the run's {repeats} repeats"
        if not 0 <= self.prompt_index < n_prompts:
            return f"prompt_index {self.prompt_index} is outside the cell's {n_prompts} prompts"
        if self.attempt < 1:
            return f"attempt {self.attempt} is not >= 1"
        rows = (*self.gen_rows, *self.lat_rows, *self.round_rows)
        if any(r.get("cell_id") != self.cell_id for r in rows):
            return "it holds rows of another cell"
        got = sorted(str(r.get("mode")) for r in self.gen_rows)
        if got != sorted(modes) or any(not isinstance(r.get("tokens_per_s"), (int, float, type(None)))
                                       for r in self.gen_rows):
            return f"its generations are {got}, the cell measures {sorted(modes)}"
        return None


def _tps(row: dict | None) -> float:
    v = None if row is None else row.get("tokens_per_s")
    return float(v) if v is not None else float("nan")


def measurement_of(visits: Sequence[Visit]) -> CellMeasurement:
    """A cell's tables and series from its visits, in the order they were measured (repeat, then prompt)."""
    out = CellMeasurement([], [], [], CellSeries())
    series = out.series
    for v in sorted(visits, key=lambda v: (v.repeat, v.prompt_index)):
        out.gen_rows.extend(v.gen_rows)
        out.lat_rows.extend(v.lat_rows)
        out.round_rows.extend(v.round_rows)
        by_mode = {r["mode"]: r for r in v.gen_rows}
        peer = by_mode.get("peer")
        if peer is not None and peer.get("drafted") is not None and peer.get("accepted") is not None:
            series.peer_drafted += int(peer["drafted"])
            series.peer_accepted += int(peer["accepted"])
        series.prompt.append(str(by_mode["baseline"]["prompt_id"]))
        series.repeat.append(v.repeat)
        series.base.append(_tps(by_mode["baseline"]))
        series.spec.append(_tps(by_mode["speculative"]))
        series.peer.append(_tps(peer))
        series.library.append(_tps(by_mode.get("library")))
    return out


def _visit(ctx: CellContext, plan: CellPlan, modes: tuple[str, ...], rep: int, pi: int, attempt: int) -> Visit:
    """Measure one (repeat, prompt) of a cell: every mode back to back, in the visit's rotated order."""
    cfg, cell = ctx.config, plan.cell
    cid = plan.cell_id
    p = ctx.prompts[cell.domain][pi]
    ids = ctx.enc[p.prompt_id]  # [1, S]
    seed_i = cfg.seed * 7919 + pi
    visit = rep * len(ctx.prompts[cell.domain]) + pi
    res: dict[str, Generation] = {}
    for pos, mode in enumerate(rotation(visit, modes)):
        g = _generate(ctx, mode, plan.draft, cell.gamma, cell.temperature, ids, seed_i, rep, pos)
        if g is not None:
            res[mode] = g
    gen_rows, lat_rows = _generation_rows(ctx, cid, p, cell.domain, ids, rep, cell.temperature, res)
    round_rows = [{"cell_id": cid, "prompt_id": p.prompt_id, **asdict(rr), "repeat": rep}
                  for rr in res["speculative"].rounds]
    return Visit(cid, attempt, rep, pi, tuple(gen_rows), tuple(lat_rows), tuple(round_rows))


def _warm_modes(ctx: CellContext, draft: Any, spec: GammaSpec, temp: float, name: str) -> tuple[str, ...]:
    """Warm every mode up; the modes the cell is measured in. A peer that fails on this pair is recorded
    (``peer_errors``) and dropped; a peer or library baseline the engine does not have for it is dropped."""
    cfg = ctx.config
    modes = ["baseline", "speculative"]
    _warm(ctx, draft, spec, temp, tuple(modes))
    if cfg.peer and ctx.peer_ok.get(name, True):
        try:
            modes += sorted(_warm(ctx, draft, spec, temp, ("peer",)))
        except records.RunInterrupted:
            raise
        except Exception as e:  # a peer that cannot run this pair is recorded, not fatal
            errs = dict(ctx.writer.meta.get("peer_errors", {}))
            errs[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            ctx.writer.update(peer_errors=errs)
            ctx.peer_ok[name] = False
    if cfg.library:
        modes += sorted(_warm(ctx, draft, spec, temp, ("library",)))
    return tuple(modes)


def _cell_row(ctx: CellContext, draft: Any, cell: records.CellId, m: CellMeasurement, modes: tuple[str, ...],
              stab: stats.Stability, attempt: int) -> dict:
    """The ``cells.csv`` row of a measured cell: means and 95% CIs, acceptance, lossless verdicts, noise flags."""
    cfg, t, series = ctx.config, ctx.target, m.series
    sp = stats.speedup_ci(series.base, series.spec)
    pe = stats.speedup_ci(series.base, series.peer) if "peer" in modes else stats.Estimate(None, None, None)
    tb, ts = stats.mean_ci(series.base), stats.mean_ci(series.spec)
    tp = stats.mean_ci(series.peer) if "peer" in modes else stats.Estimate(None, None, None)
    none = stats.Estimate(None, None, None)
    tl = stats.mean_ci(series.library) if "library" in modes else none
    bl = stats.speedup_ci(series.library, series.base) if "library" in modes else none  # baseline ÷ library
    spec_rows = [r for r in m.gen_rows if r["mode"] == "speculative"]
    drafted = sum(r["drafted"] or 0 for r in spec_rows)
    accepted = sum(r["accepted"] or 0 for r in spec_rows)
    n_rounds = sum(r["n_rounds"] or 0 for r in spec_rows)
    same = [r["outputs_identical"] for r in spec_rows if r["outputs_identical"] is not None]
    verdicts = [r["lossless"] for r in spec_rows if r["lossless"] is not None]
    peer_d, peer_a = series.peer_drafted, series.peer_accepted
    return {"cell_id": cell.to_str(), "draft": cell.draft, "gamma_policy": cell.gamma.to_str(),
            "gamma": cell.gamma.gamma, "temperature": cell.temperature, "domain": cell.domain,
            "head_k": cell.head_k, "n_prompts": len(ctx.prompts[cell.domain]),
            "new_tokens": sum(r["new_tokens"] for r in spec_rows),
            "tokens_per_s_baseline": tb.value, "tokens_per_s_speculative": ts.value, "tokens_per_s_peer": tp.value,
            "speedup": sp.value, "acceptance_rate": accepted / drafted if drafted else None,
            "mean_accepted_per_round": accepted / n_rounds if n_rounds else None, "n_rounds": n_rounds,
            "outputs_identical": all(same) if same else None,
            "n_near_tie": verdicts.count("near_tie") if verdicts else None,
            "n_lossless_failures": verdicts.count("failure") if verdicts else None,
            "synthetic": bool(t.synthetic or getattr(draft, "synthetic", False)),
            "repeats": cfg.repeats, "speedup_lo": sp.lo, "speedup_hi": sp.hi,
            "tokens_per_s_baseline_lo": tb.lo, "tokens_per_s_baseline_hi": tb.hi,
            "tokens_per_s_speculative_lo": ts.lo, "tokens_per_s_speculative_hi": ts.hi,
            "tokens_per_s_peer_lo": tp.lo, "tokens_per_s_peer_hi": tp.hi,
            "speedup_peer": pe.value, "speedup_peer_lo": pe.lo, "speedup_peer_hi": pe.hi,
            "peer_acceptance_rate": peer_a / peer_d if peer_d else None,
            "baseline_cv": stab.cv, "baseline_drift": stab.drift, "unstable": stab.unstable,
            "unstable_reason": stab.reason or None, "attempts": attempt, "hardware": ctx.hardware,
            "tokens_per_s_library": tl.value, "tokens_per_s_library_lo": tl.lo, "tokens_per_s_library_hi": tl.hi,
            "baseline_vs_library": bl.value, "baseline_vs_library_lo": bl.lo, "baseline_vs_library_hi": bl.hi}


def _trace_rows(ctx: CellContext, draft: Any, cell: records.CellId, gen_rows: list[dict]) -> list[dict]:
    """``traces.csv`` rows: per prompt, the (γ-independent) acceptance trace along the baseline's output.

    Every cell records the trace of its prompts, so a calibration that holds a
    cell out still has the trace from the cells it trains on.
    """
    t, temp, cid = ctx.target, cell.temperature, cell.to_str()
    rows: list[dict] = []
    for p in ctx.prompts[cell.domain]:
        ids = ctx.enc[p.prompt_id]
        base = next(parse_tokens(r["tokens"]) for r in gen_rows
                    if r["mode"] == "baseline" and r["prompt_id"] == p.prompt_id and r["repeat"] == 0)
        full = torch.cat([ids, torch.tensor([list(base)], device=ids.device)], dim=1)  # [1, S+n]
        vals = acceptance_trace(t, draft, full, int(ids.shape[1]), temp)
        if temp == 0:
            proposed, runs = proposal_runs(draft, full, int(ids.shape[1]), vals)
        else:  # sampled outputs depend on γ: no γ-free proposal runs
            proposed = runs = [None] * len(vals)
        rows += [{"cell_id": cid, "draft": cell.draft, "temperature": temp, "domain": cell.domain,
                  "prompt_id": p.prompt_id, "position": i, "value": v, "proposed": proposed[i],
                  "accept_run": runs[i]} for i, v in enumerate(vals)]
    return rows


def _finish(ctx: CellContext, plan: CellPlan, m: CellMeasurement, modes: tuple[str, ...],
            stab: stats.Stability, attempt: int) -> dict:
    """Write a measured cell (its tables, then its ``cells.csv`` row last); returns the row."""
    row = _cell_row(ctx, plan.draft, plan.cell, m, modes, stab, attempt)
    trace_rows = _trace_rows(ctx, plan.draft, plan.cell, m.gen_rows) if ctx.config.traces else []
    w = ctx.writer
    w.append("generations", m.gen_rows)
    w.append("token_latency", m.lat_rows)
    w.append("rounds", m.round_rows)
    w.append("traces", trace_rows)
    w.finish_cell(row)
    return row


@contextlib.contextmanager
def _naming(what: str) -> Iterator[None]:
    """A :class:`measure.records.RunInterrupted` (an engine's process died) raised inside says what was running."""
    try:
        yield
    except records.RunInterrupted as e:
        raise records.RunInterrupted(f"{e} while {what}; every finished visit is kept: re-run with the same "
                                     "--out to resume") from None


# long: the interleaving schedule (passes over repeat, prompt, cell), resume of staged visits and the
#   until-stable re-measurement are one loop; each visit and each finished cell is a call
def measure_cells(ctx: CellContext, plans: Sequence[CellPlan], on_attempt: Callable[[str], None] | None = None,
                  on_row: Callable[[dict], None] | None = None,
                  between: Callable[[], None] | None = None) -> list[dict]:
    """Measure ``plans`` (module docstring) and write each; returns their ``cells.csv`` rows in plan order.

    With ``interleave="sweep"`` the cells are visited in passes — repeat 1 of
    prompt 1 of every cell, then prompt 2 of every cell, …, then repeat 2 —
    so each cell's pairs are spread over the whole measurement and a machine
    that sits in a slow or fast mode for a minute biases no cell; with
    ``"cell"`` each cell's visits run back to back. Every finished visit is
    staged on disk (:meth:`measure.records.RunWriter.stage`) and read back on
    resume, so an interruption loses at most the visit that was running.
    ``on_row`` sees each cell's row as it is written; ``between`` is called
    after each visit (the sweep times a few cost-curve points there, :class:`CostCurves`).
    """
    cfg = ctx.config
    wanted = {p.cell_id for p in plans}
    staged: dict[str, dict[tuple[int, int], Visit]] = {cid: {} for cid in wanted}
    attempts = {cid: 1 for cid in wanted}
    modes = {}
    for p in plans:
        with _naming(f"warming up cell {p.cell_id}"):
            modes[p.cell_id] = _warm_modes(ctx, p.draft, p.cell.gamma, p.cell.temperature, p.cell.draft)
    n_prompts = {p.cell_id: len(ctx.prompts[p.cell.domain]) for p in plans}
    n_repairs = len(ctx.writer.repairs)
    for rec in ctx.writer.staged():
        try:
            v = Visit.from_record(rec)
        except ValueError as e:
            ctx.writer.quarantine(rec, str(e))
            continue
        if v.cell_id not in wanted:
            continue
        why = v.problem(cfg.repeats, n_prompts[v.cell_id], modes[v.cell_id])
        if why is not None:
            ctx.writer.quarantine(rec, why)
            continue
        if v.attempt < attempts[v.cell_id]:
            continue
        if v.attempt > attempts[v.cell_id]:  # a later attempt supersedes the visits of an earlier one
            attempts[v.cell_id], staged[v.cell_id] = v.attempt, {}
        staged[v.cell_id][(v.repeat, v.prompt_index)] = v
    for note in ctx.writer.repairs[n_repairs:]:
        if on_attempt:
            on_attempt(note)
    if ctx.bar is not None:
        ctx.bar.update(sum(len(vs) for vs in staged.values()))
    rows: dict[str, dict] = {}
    active = list(plans)
    while active:
        n_prompts = max(len(ctx.prompts[p.cell.domain]) for p in active)
        groups = ([active] if cfg.interleave == "sweep" else [[p] for p in active])
        for group in groups:
            for rep in range(cfg.repeats):
                for pi in range(n_prompts):
                    for plan in group:
                        cid = plan.cell_id
                        if pi >= len(ctx.prompts[plan.cell.domain]) or (rep, pi) in staged[cid]:
                            continue
                        if ctx.bar is not None:
                            ctx.bar.set_description(f"repeat {rep + 1}/{cfg.repeats} {plan.cell.draft} "
                                                    f"{plan.cell.gamma.to_str()} {plan.cell.domain}")
                        with _naming(f"measuring cell {cid} (repeat {rep + 1}, prompt {pi + 1})"):
                            v = _visit(ctx, plan, modes[cid], rep, pi, attempts[cid])
                        ctx.writer.stage(v.to_record())
                        staged[cid][(rep, pi)] = v
                        if ctx.bar is not None:
                            ctx.bar.update(1)
                        if between is not None:
                            with _naming("timing cost-curve points between the visits"):
                                between()
        ms = {p.cell_id: measurement_of(list(staged[p.cell_id].values())) for p in active}
        if cfg.interleave == "sweep" and len(active) > 1:  # each cell spans the run: against the pass's pace
            what = "baseline (against the machine's pace in its pass)"
            normed = stats.normalise_by_pace({cid: (m.series.prompt, m.series.repeat, m.series.base)
                                              for cid, m in ms.items()})
        else:
            what = "baseline"
            normed = {cid: stats.normalise_per_prompt(m.series.prompt, m.series.base) for cid, m in ms.items()}
        again = []
        for plan in active:
            cid = plan.cell_id
            m = ms[cid]
            stab = stats.stability(normed[cid], cfg.cv_threshold, cfg.drift_threshold, what)
            if stab.unstable and attempts[cid] <= cfg.until_stable:
                if on_attempt:
                    on_attempt(f"cell {cid} unstable ({stab.reason}); re-measuring (attempt {attempts[cid] + 1} of "
                               f"{cfg.until_stable + 1})")
                attempts[cid] += 1
                staged[cid] = {}
                if ctx.bar is not None:
                    ctx.bar.total += len(ctx.prompts[plan.cell.domain]) * cfg.repeats
                again.append(plan)
                continue
            with _naming(f"writing cell {cid} (its acceptance traces)"):
                rows[cid] = _finish(ctx, plan, m, modes[cid], stab, attempts[cid])
            if on_row:
                on_row(rows[cid])
        active = again
    return [rows[p.cell_id] for p in plans]


def run_cell(ctx: CellContext, draft: Any, spec: GammaSpec | str, temp: float, domain: str,
             head_k: int | None = None, draft_label: str | None = None,
             on_attempt: Callable[[str], None] | None = None) -> dict:
    """Measure one cell with :func:`measure_cells` and write it; returns its ``cells.csv`` row.

    ``draft_label`` names the draft in the records (the head sweep's
    ``<draft>+<variant>``); ``head_k`` the kept vocabulary of a pruned head.
    """
    cell = records.CellId(draft_label or draft.name, GammaSpec.parse(spec), temp, domain, head_k)
    return measure_cells(ctx, [CellPlan(cell, draft)], on_attempt=on_attempt)[0]


# -- summary ----------------------------------------------------------------------------------
def _num(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def cell_estimate(c: dict) -> stats.Estimate:
    """The speedup of a ``cells.csv`` row with its CI."""
    return stats.Estimate(_num(c.get("speedup")), _num(c.get("speedup_lo")), _num(c.get("speedup_hi")))


def _is_true(v: Any) -> bool:
    return v is True or str(v).lower() == "true"


def unstable_message(c: dict) -> str:
    """``cell … unstable: <reason>; re-run on a quiet machine or with --repeats``."""
    return (f"cell {c['cell_id']} unstable: {c.get('unstable_reason') or 'baseline noisy'}; re-run on a quiet "
            "machine or with more --repeats")


def summarize(cells: list[dict], synthetic: bool) -> dict:
    """``run.json`` summary: per draft the geometric-mean speedup with its CI, the best cell with its CI
    (and a note when that CI includes 1.0 or overlaps the runner-up's), and the unstable cells in words.

    No headline maximum: the best of several noisy cells is reported only with its interval.
    """
    if not cells:
        return {}
    per_draft: dict[str, dict] = {}
    for draft in dict.fromkeys(str(c["draft"]) for c in cells):
        mine = [c for c in cells if str(c["draft"]) == draft]
        gm = stats.geomean_ci([cell_estimate(c) for c in mine])
        ranked = sorted((c for c in mine if cell_estimate(c).value is not None),
                        key=lambda c: -cell_estimate(c).value)  # type: ignore[operator]
        entry: dict[str, Any] = {"n_cells": len(mine), "geomean_speedup": gm.value, "geomean_speedup_lo": gm.lo,
                                 "geomean_speedup_hi": gm.hi,
                                 "n_unstable": sum(_is_true(c.get("unstable")) for c in mine)}
        if ranked:
            best = ranked[0]
            be = cell_estimate(best)
            notes = []
            if be.contains(1.0):
                notes.append("its 95% CI includes 1.0 (no measurable speedup)")
            if len(ranked) > 1:
                ov = stats.overlaps(be, cell_estimate(ranked[1]))
                if ov:
                    notes.append(f"its CI overlaps the runner-up's ({ranked[1]['cell_id']}): not distinguishable")
            if _is_true(best.get("unstable")):
                notes.append("it is flagged unstable")
            entry.update(best_cell=best["cell_id"], best_speedup=be.value, best_speedup_lo=be.lo,
                         best_speedup_hi=be.hi, best_note="; ".join(notes) or None)
        per_draft[draft] = entry
    greedy = [c for c in cells if float(c["temperature"]) == 0]
    unstable = [c for c in cells if _is_true(c.get("unstable"))]
    vs_lib = [stats.Estimate(_num(c.get("baseline_vs_library")), _num(c.get("baseline_vs_library_lo")),
                             _num(c.get("baseline_vs_library_hi"))) for c in cells]
    vs_lib = [e for e in vs_lib if e.value is not None]
    out: dict[str, Any] = {
        "estimator": "speedup = mean tokens/s (method) / mean tokens/s (baseline) over (prompt, repeat) pairs; "
                     "95% CI: Fieller's interval for a ratio of paired means, Student t (n - 1 df)",
        "drafts": per_draft, "n_cells": len(cells), "n_unstable": len(unstable),
        "unstable": [unstable_message(c) for c in unstable], "synthetic": synthetic,
        "all_greedy_outputs_identical": all(_is_true(c["outputs_identical"]) for c in greedy) if greedy else None}
    if vs_lib:
        gm = stats.geomean_ci(vs_lib)
        out["baseline_vs_library"] = {"geomean": gm.value, "lo": gm.lo, "hi": gm.hi, "n_cells": len(vs_lib),
                                      "target": list(LIBRARY_RATIO_TARGET)}
    if synthetic:
        out["note"] = "synthetic (random-weight) models: timing only; acceptance is not a measurement"
    return out


def summary_lines(summary: dict) -> list[str]:
    """The summary in words, one line per draft plus one per unstable cell."""
    lines = []
    for draft, e in (summary.get("drafts") or {}).items():
        gm = stats.Estimate(e.get("geomean_speedup"), e.get("geomean_speedup_lo"), e.get("geomean_speedup_hi"))
        line = f"{draft}: geometric-mean speedup {gm.as_text(3)} over {e['n_cells']} cells"
        if e.get("best_cell"):
            be = stats.Estimate(e.get("best_speedup"), e.get("best_speedup_lo"), e.get("best_speedup_hi"))
            line += f"; best cell {e['best_cell']} {be.as_text(3)}"
            if e.get("best_note"):
                line += f" — {e['best_note']}"
        line += f"; {e['n_unstable']} unstable"
        lines.append(line)
    lib = summary.get("baseline_vs_library")
    if lib:
        est = stats.Estimate(lib.get("geomean"), lib.get("lo"), lib.get("hi"))
        lo, hi = lib.get("target") or LIBRARY_RATIO_TARGET
        lines.append(f"our baseline ÷ the engine's own plain decoding, same prompts in the same visits: geometric "
                     f"mean {est.as_text(3)} over {lib['n_cells']} cells (expected {lo:g}–{hi:g})")
    lines += summary.get("unstable") or []
    return lines


# -- run identity -----------------------------------------------------------------------------
def _model_files_sha256(source: str) -> str | None:
    """SHA-256 of a model's local weight file (``gguf:/path`` or a file path), None for hub ids / synthetic."""
    path = Path(str(source).split(":", 1)[1] if ":" in str(source) else str(source))
    try:
        return file_sha256(path) if path.is_file() else None
    except OSError:
        return None


def fingerprint(config: SweepConfig, device: str, selection: dict, hardware: dict, versions: dict) -> dict:
    """Everything known before loading that changes a measured number (the run's identity, part 1)."""
    return {"target": config.target, "dtype": config.dtype, "device": device,
            "engine": {"name": config.engine, "threads": config.threads, "cache": config.cache,
                       "compile": config.compile},
            "prompts": {k: v for k, v in selection.items() if k != "file"},
            "max_new_tokens": config.max_new_tokens, "max_prompt_tokens": config.max_prompt_tokens,
            "seed": config.seed, "repeats": config.repeats, "warmup": config.warmup,
            "interleave": config.interleave, "peer": config.peer, "library": config.library,
            "versions": {k: versions.get(k) for k in ("python", "torch", "transformers", "cuda")},
            "hardware": {k: hardware.get(k) for k in ("device", "cpu", "cores", "gpu")}}


def target_fingerprint(target: Any, engine: Any) -> dict:
    """The loaded target's identity (part 2 of the fingerprint, known after loading)."""
    d = target.describe()
    return {"model": {"name": d.get("name"), "source": d.get("source"), "params": d.get("params"),
                      "vocab_size": d.get("vocab_size"), "file_sha256": _model_files_sha256(str(d.get("source")))},
            "engine_versions": {k: v for k, v in dict(engine.versions()).items()}}


def set_aside(path: Path) -> Path | None:
    """``--force-new``: move an existing run directory to ``<path>.replaced-<UTC>`` (nothing is deleted).

    Holds the directory's lock while it renames it: a run another process is writing is refused
    (:class:`measure.records.RunLocked`), never moved away under it.
    """
    if not path.is_dir() or not ((path / records.RUN_JSON).exists() or records.has_measured_data(path)):
        return None
    fd = records.acquire_run_lock(path)
    try:
        dest = path.with_name(f"{path.name}.replaced-{records.utc_now().replace(':', '')}")
        path.rename(dest)
    finally:
        os.close(fd)
    return dest


# -- the sweep --------------------------------------------------------------------------------
@contextlib.contextmanager
def silenced(quiet: bool) -> Iterator[None]:
    """With ``quiet``: third-party output while loading (weight and GGUF conversion bars, which some
    libraries write straight to stderr with their own tqdm) goes to /dev/null."""
    if not quiet:
        yield
        return
    with open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull), contextlib.redirect_stdout(devnull):
        yield


def prompts_meta(prompts: dict[str, list[Prompt]], enc: dict[str, torch.Tensor]) -> dict:
    """``run.json`` ``prompts``: per prompt id its source, domain and encoded token ids."""
    return {p.prompt_id: {"source": p.source, "domain": p.domain, "prompt_tokens": int(enc[p.prompt_id].shape[1]),
                          "tokens": _ids_text(enc[p.prompt_id][0].tolist())}
            for ps in prompts.values() for p in ps}


class PendingCell(NamedTuple):
    """A cell of the sweep not finished yet."""

    draft_index: int
    temperature: float
    domain: str
    gamma: GammaSpec

    def cell(self, draft_names: Sequence[str]) -> records.CellId:
        return records.CellId(draft_names[self.draft_index], self.gamma, float(self.temperature), self.domain)

    def cell_id(self, draft_names: Sequence[str]) -> str:
        return self.cell(draft_names).to_str()


def pending_cells(config: SweepConfig, draft_names: list[str], domains: list[str],
                  writer: records.RunWriter) -> list[PendingCell]:
    """The unfinished cells, in sweep order."""
    plan = [PendingCell(i, t, dom, g) for i in range(len(draft_names)) for t in config.temperatures
            for dom in domains for g in config.gamma_specs]
    return [c for c in plan if not writer.is_finished(c.cell_id(draft_names))]


def engine_options(config: SweepConfig, device: str, threads: int | None, quiet: bool) -> EngineOptions:
    """The engine settings of a sweep (its static cache sized for the longest sequence it will see)."""
    return EngineOptions(device=device, threads=threads, cache=config.cache, compile=config.compile,
                         max_len_tokens=max(config.max_prompt_tokens + config.max_new_tokens + config.gamma_max,
                                            costpoints.context_bound(config)) + 1,
                         quiet=quiet)


# long: a long docstring; the body (set up, record, load, measure the pending cells) reads top to bottom
def run_sweep(config: SweepConfig, out_dir: str | Path, command: str = "",
              progress: Callable[[str], None] | None = None, show_bar: bool = True,
              on_cell: Callable[[dict], None] | None = None, force_new: bool = False,
              system_check: dict | None = None, quiet: bool = False, engine: Any = None,
              executor: Any = None, extend: bool = False) -> records.Run:
    """Run (or resume) the sweep into ``out_dir``; returns the run read back.

    ``on_cell`` sees each finished cell's row (the CLI prints the table as
    cells finish). A resume with a different fingerprint, or asking for other
    cells than the run holds, raises :class:`measure.records.FingerprintMismatch`
    (nothing written); ``extend`` (``--extend``) lets a complete run gain γ
    policies, drafts or domains, recorded as an extension (:mod:`measure.runplan`).
    ``engine``: an engine object to use instead of ``make_engine(config.engine, ...)`` (tests).
    ``executor`` (:class:`measure.executors.ExecutorConfig`; None: local) may
    send the cells to a Ray cluster (:func:`measure.executors.run_distributed`);
    this process stays the only writer of the run directory either way.
    """
    say = progress or (lambda _m: None)
    distributed = executor is not None and executor.kind != "local"
    device = config.device if distributed else resolve_device(config.device)  # a cluster's workers resolve it
    prompts, selection = select_prompts(config)
    out = Path(out_dir)
    if force_new:
        moved = set_aside(out)
        if moved is not None:
            say(f"--force-new: the previous run is kept in {moved}")
    hardware, versions, source = environment("cpu" if distributed else device)
    if distributed:  # each cell records its worker's hardware (cells.csv hardware), not the driver's
        from measure.executors import CLUSTER_HARDWARE, run_distributed

        hardware = CLUSTER_HARDWARE
    fp = fingerprint(config, device, selection, hardware, versions)
    asked = runplan.PlanRequest(runplan.Plan.of(config.drafts, config.gammas, config.temperatures, list(prompts)),
                                extend, {p.prompt_id: p.message for ps in prompts.values() for p in ps})
    # refuses a different fingerprint, or other cells than the run holds (unless --extend adds them), before writing
    writer = records.RunWriter(out, fingerprint=fp, plan=asked.opener(out, fp))
    for note in writer.repairs:
        say(note)
    if writer.opening is not None:
        say(runplan.opening_text(writer.opening, len(writer.finished_cells)))
    meta = dict(command=command, **source, hardware=hardware, versions=versions, config=config.as_dict(),
                prompt_selection=selection, **({"system_check": system_check} if system_check is not None else {}))
    if distributed:
        return run_distributed(config, executor, writer, meta, prompts, selection, progress=say, show_bar=show_bar,
                               on_cell=on_cell, quiet=quiet)
    with writer.recording():
        writer.update(**meta)
        engine = engine if engine is not None else make_engine(config.engine,
                                                               engine_options(config, device, config.threads, quiet))
        target, drafts = _load_models(engine, config, device, writer, versions, quiet, say)
        synthetic = bool(target.synthetic or any(d.synthetic for d in drafts))
        timer = Timer(device)
        enc = {p.prompt_id: engine.encode(target, p.message, config.max_prompt_tokens)
               for ps in prompts.values() for p in ps}
        writer.update(prompts=prompts_meta(prompts, enc))
        on_disk = records.load_run(writer.path)
        done_cells = on_disk.table("cells").to_dict("records")
        for c in done_cells:
            if on_cell:
                on_cell(c)
        todo = pending_cells(config, [d.name for d in drafts], list(prompts), writer)
        cost = _cost_curves(config, target, drafts, timer, on_disk, prompt_lengths(prompts, enc))
        if cost is not None:
            writer.update(cost_plan=cost.plan.describe(len(drafts)))
        if cost is not None and (config.interleave == "cell" or not todo):
            say(f"timing cost curves ({cost.plan.summary(len(drafts))}, sized to the run; repeats interleaved "
                "across token counts and contexts)")
            _record_cost(writer, cost.measure())
        elif cost is not None:
            say(f"timing the cost curves' {len(cost)} points a few at a time between the visits "
                f"({cost.plan.summary(len(drafts))}, sized to the run)")
        bar = None
        if show_bar:
            from tqdm import tqdm

            bar = tqdm(total=sum(len(prompts[c.domain]) * config.repeats for c in todo), desc="measure",
                       unit="prompt×repeat", file=sys.stderr, dynamic_ncols=True)
        ctx = CellContext(writer, engine, target, config, timer, prompts, enc, bar,
                          hardware=records.hardware_label({**hardware, "torch_threads": torch.get_num_threads()}))
        try:
            _run_cells(ctx, drafts, todo, done_cells, synthetic, on_cell, say, cost)
        finally:
            if bar is not None:
                bar.close()
        if config.cost_curves and (cost is not None or "cost_screening" not in writer.meta):
            screen_cost(writer, cost, say)
        writer.update(summary=summarize(done_cells, synthetic))
    return records.load_run(writer.path)


def _load_models(engine: Any, config: SweepConfig, device: str, writer: records.RunWriter, versions: dict,
                 quiet: bool, say: Callable[[str], None]) -> tuple[Any, list[Any]]:
    """Load the target (checked against the run's fingerprint) and the drafts; record them in ``run.json``."""
    say(f"loading {config.target} ({config.engine})")
    with silenced(quiet):
        target = engine.load_target(config.target, device=device, dtype=config.dtype, seed=config.seed)
    writer.check_fingerprint(target_fingerprint(target, engine))
    with silenced(quiet):
        drafts = [engine.make_draft(d, target, seed=config.seed + 1) for d in config.drafts]
    writer.update(models={"target": target.describe(), "drafts": {d.name: d.describe() for d in drafts}},
                  versions={**versions, **{f"engine_{k}": v for k, v in dict(engine.versions()).items()}})
    return target, drafts


def _cost_curves(config: SweepConfig, target: Any, drafts: list[Any], timer: Timer,
                 run: records.Run, prompt_tokens: dict[str, list[int]]) -> CostCurves | None:
    """The cost-curve points ``run`` (as on disk) still has to time (None: none, or no cost curves asked for)."""
    if not config.cost_curves:
        return None
    cost = cost_curves_for(config, target, drafts, timer, *cost_points_done(run), prompt_tokens=prompt_tokens)
    return cost if len(cost) else None


def prompt_lengths(prompts: dict[str, list[Prompt]], enc: dict[str, torch.Tensor]) -> dict[str, list[int]]:
    """Per domain, the token counts of its encoded prompts (what sizes the cost points)."""
    return {d: [int(enc[p.prompt_id].shape[1]) for p in ps] for d, ps in prompts.items()}


def cost_points_done(run: records.Run) -> tuple[set[tuple[int, int, int]], set[tuple[str, int, int]]]:
    """Keys of the cost-curve points ``run`` has on disk: ``(n_tokens, context, repeat)`` of the target's,
    ``(draft, context, repeat)`` of the drafts' (what :class:`CostCurves` leaves out on a resume)."""
    ct, cd = run.table("cost_target"), run.table("cost_draft")
    done_t = {(int(r.n_tokens), int(r.context_tokens), int(r.repeat)) for r in ct.itertuples()} if len(ct) else set()
    done_d = {(str(r.draft), int(r.context_tokens), int(r.repeat)) for r in cd.itertuples()} if len(cd) else set()
    return done_t, done_d


def cost_curves_for(config: SweepConfig, target: Any, drafts: list[Any], timer: Timer,
                    done_target: set[tuple[int, int, int]] = frozenset(),
                    done_draft: set[tuple[str, int, int]] = frozenset(), *,
                    prompt_tokens: dict[str, list[int]]) -> CostCurves:
    """The cost curves a sweep's config asks for, sized to the run (:func:`measure.costpoints.plan_cost_points`:
    the token counts its cells verify with more repeats); ``prompt_tokens``: :func:`prompt_lengths`."""
    plan = costpoints.plan_cost_points(config, prompt_tokens)
    cost = CostCurves(target, drafts, timer, plan.contexts, plan.max_tokens, plan.repeats, config.seed,
                      done_target=done_target, done_draft=done_draft, verified=(plan.n_verified, plan.repeats_verified))
    cost.plan = plan
    return cost


def _record_cost(writer: records.RunWriter, rows: tuple[list[dict], list[dict]]) -> None:
    """Append timed cost points (:meth:`CostCurves.measure`) to ``cost_target.csv`` / ``cost_draft.csv``."""
    t_rows, d_rows = rows
    writer.append("cost_target", t_rows)
    writer.append("cost_draft", d_rows)


def screen_cost(writer: records.RunWriter, cost: CostCurves | None, say: Callable[[str], None]) -> None:
    """Screen the run's target cost points against their neighbours (:func:`measure.costpoints.screen_and_retime`):
    an out-of-line point is re-timed once with ``cost`` (None: dropped), what was done said in words and recorded
    in ``run.json`` ``cost_screening``."""
    import pandas as pd

    retime = None
    if cost is not None:
        def retime(keys: list[tuple[int, int, int]]) -> pd.DataFrame:
            cost.warm_up = [CostPoint(-1, c, n) for n, c in dict.fromkeys((n, c) for n, c, _ in keys)]
            cost.pending.extend(CostPoint(r, c, n) for n, c, r in keys)
            rows = cost.measure()
            _record_cost(writer, rows)
            return pd.DataFrame(rows[0], columns=records.TABLE_COLUMNS["cost_target"])

    table = records.load_run(writer.path).table("cost_target")
    screening = costpoints.screen_and_retime(table, writer.meta.get("cost_screening"), retime)
    writer.update(cost_screening=screening)
    for note in screening["notes"]:
        say(note)


def _run_cells(ctx: CellContext, drafts: list[Any], todo: list[PendingCell], done_cells: list[dict],
               synthetic: bool, on_cell: Callable[[dict], None] | None, say: Callable[[str], None],
               cost: CostCurves | None = None) -> None:
    """Measure the pending cells (interleaved, :func:`measure_cells`); the run's summary is rewritten after
    each finished cell. ``cost``: cost-curve points still to time, spread evenly over the visits (the
    points left over timed after the last visit)."""
    bar = ctx.bar
    names = [d.name for d in drafts]

    def finished(row: dict) -> None:
        done_cells.append(row)
        ctx.writer.update(summary=summarize(done_cells, synthetic))
        if on_cell:
            if bar is not None:
                bar.clear()
            on_cell(row)
            if bar is not None:
                bar.refresh()

    plans = [CellPlan(c.cell(names), drafts[c.draft_index]) for c in todo]
    between = None
    if cost is not None and len(cost):
        visits = sum(len(ctx.prompts[c.domain]) for c in todo) * ctx.config.repeats
        per_visit = math.ceil(len(cost) / max(visits, 1))

        def between() -> None:
            if len(cost):
                _record_cost(ctx.writer, cost.measure(per_visit))

    measure_cells(ctx, plans, on_attempt=say, on_row=finished, between=between)
    if cost is not None and len(cost):
        _record_cost(ctx.writer, cost.measure())
    ctx.writer.clear_staged()
