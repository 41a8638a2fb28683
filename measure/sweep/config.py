"""The sweep's configuration: :class:`SweepConfig` (validated on construction), its prompts and engine settings."""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass
from typing import Any

from measure import costpoints, stats
from measure.engines import check_specs
from measure.racing import DEFAULT_CONFIDENCE, DEFAULT_REGRET, RaceRule
from measure.prompts import DOMAINS, Prompt, file_sha256, load_prompts, load_prompts_file
from measure.seam import CACHES, EngineOptions
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


def _check_dtype(dtype: str) -> None:
    """``--dtype`` checked (one-line ``ValueError``); torch is imported here, not with this module, whose limits the
    command line reads before any model."""
    from measure.devices import resolve_dtype

    resolve_dtype(dtype)


@dataclass(frozen=True)
class SweepConfig:
    """Everything a sweep needs; validated on construction (``ValueError`` names the bad value)."""

    target: str = "smollm2-135m"
    drafts: tuple[str, ...] = ("ngram:3",)
    #: γ policies (``"fixed:4"`` texts are parsed on construction; ``run.json`` records them as texts)
    gammas: tuple[GammaSpec, ...] = (GammaSpec("fixed", 4),)
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
    #: repeats of the token counts the cells verify (1..γ_max + 1), more than the other points': a run's held-out
    #: predictions are only as good as these points (measure.costpoints sizes them; evidence:
    #: results/2026-11-24-readme-evidence.md)
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
    #: ``--until-decided``: measure in passes (one repeat of every live cell a pass) and stop measuring a cell
    #: once the race of its domain no longer needs it (measure.racing): ``repeats`` becomes the most passes,
    #: ``regret`` the throughput a decision may leave (relative), ``confidence`` its family-wise confidence;
    #: ``time_budget_s`` stops starting passes after that many seconds (None: no budget)
    until_decided: bool = False
    regret: float = DEFAULT_REGRET
    confidence: float = DEFAULT_CONFIDENCE
    time_budget_s: float | None = None
    #: ``--prior``: a calibration directory whose predictions defer the candidates they separate (measure.prior)
    prior: str | None = None

    def __post_init__(self) -> None:
        if not self.drafts:
            raise ValueError("--draft: need at least one draft")
        check_specs(self.engine, self.target, self.drafts)  # --engine and its own draft forms; no weights
        if not self.gammas:
            raise ValueError("--gamma: need at least one γ")
        specs = []
        for g in self.gammas:
            spec = GammaSpec.parse(g)
            if not 1 <= spec.gamma <= MAX_GAMMA:
                raise ValueError(f"--gamma {g if isinstance(g, str) else spec.to_str()!r}: γ must be in 1..{MAX_GAMMA}")
            specs.append(spec)
        object.__setattr__(self, "gammas", tuple(specs))  # texts given: parsed once, here
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
        if self.until_decided:
            if self.interleave != "sweep":
                raise ValueError("--until-decided needs --interleave sweep (a race looks after each pass over "
                                 "every cell)")
            if self.until_stable:
                raise ValueError("--until-decided and --until-stable cannot be combined (a race decides from the "
                                 "visits as measured; re-measuring a cell would change its looks)")
            self.race_rule()  # the regret and confidence checked here, in one line
        if self.prior is not None and not self.until_decided:
            raise ValueError("--prior needs --until-decided (the prior orders a race's measuring)")
        if self.time_budget_s is not None and not (math.isfinite(self.time_budget_s) and self.time_budget_s > 0):
            raise ValueError(f"--time-budget {self.time_budget_s}: must be a number of seconds > 0")
        _check_dtype(self.dtype)

    def race_rule(self) -> RaceRule:
        """The race of ``--until-decided``: one look after each pass, ``repeats`` looks at most."""
        try:
            return RaceRule(confidence=self.confidence, regret=self.regret, max_looks=self.repeats, min_units=2)
        except ValueError as e:
            raise ValueError(f"--until-decided: {e}") from None

    def as_dict(self) -> dict:
        """The config as ``run.json`` records it (γ policies as their texts, ``fixed:4``)."""
        return {**asdict(self), "gammas": tuple(g.to_str() for g in self.gammas)}

    @property
    def gamma_max(self) -> int:
        """The largest initial γ of the sweep's policies."""
        return max(spec.gamma for spec in self.gammas)


def select_prompts(config: SweepConfig) -> tuple[dict[str, list[Prompt]], dict[str, Any]]:
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
        sel: dict[str, Any] = {"source": "file", "file": str(config.prompts_file), "format": fmt,
                               "sha256": file_sha256(config.prompts_file)}
    else:
        doms = list(config.domains or DOMAINS)
        by = {d: load_prompts(d, config.prompts_per_domain or 2, config.seed) for d in doms}
        sel = {"source": "builtin", "seed": config.seed}
    texts = hashlib.sha256("\n\x00".join(p.prompt_id + "\x00" + p.message for ps in by.values()
                                         for p in ps).encode()).hexdigest()
    sel.update(prompt_ids=[p.prompt_id for ps in by.values() for p in ps], texts_sha256=texts)
    return by, sel


def engine_options(config: SweepConfig, device: str, threads: int | None, quiet: bool) -> EngineOptions:
    """The engine settings of a sweep (its static cache sized for the longest sequence it will see)."""
    return EngineOptions(device=device, threads=threads, cache=config.cache, compile=config.compile,
                         max_len_tokens=max(config.max_prompt_tokens + config.max_new_tokens + config.gamma_max,
                                            costpoints.context_bound(config)) + 1,
                         quiet=quiet)
