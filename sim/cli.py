"""``python -m sim`` — predict the speedup of speculative decoding before measuring anything.

Examples::

    python -m sim --preset llama3-1b-3b
    python -m sim --preset llama3-8b-70b --hardware a100-80gb --tp 4 --alpha 0.7 --format json
    python -m sim --cost-ratio 0.05 --alpha 0.8 --gamma-max 12
    python -m sim --preset gpt2-small-large --mode event --seed 1
    python -m sim --preset llama3-1b-8b --mode serve --arrival-rate 20
    python -m sim --cost-model runs/cal/cost_model-ngram.json --acceptance runs/cal/acceptance-ngram.json
    python -m sim --list-presets
    python -m sim --target meta-llama/Llama-3.1-8B-Instruct --draft eagle3 --hardware h200 --engine sglang \
        --tau 2.9 --gamma 3                                  # any model, GPU step costs (sim/stepcost.py)
    python -m sim tree --budget 16 --advise --preset llama3-8b-70b --tp 4   # token trees: sim/tree_cli.py

Every bad value exits with status 2 and one line naming it, its flag and the
valid choices or range — before any simulation runs. Flags that would be
ignored (``--policy heuristic`` in analytic mode, ``--requests`` outside serve
mode, ``--hardware`` with a fitted cost model) are refused, not dropped.

Bounds, and why (:mod:`sim.limits`, shared with ``sim tree``, ``sim check`` and
``calibrate ingest``): γ ≤ 64 (the chance that 64 draft tokens in a row are all
accepted is 0.9^64 ≈ 0.001 even at α = 0.9: longer drafts cannot pay);
context ≥ 1 token and ≤ the pair's shortest position window, or 10^7 tokens
without a pair; ``--new-tokens`` and ``--requests`` ≤ 10^6, and at most 10^7
simulated tokens per run (requests × new tokens × number of γ), about a minute
of simulation; ``--arrival-rate`` from 10^-3 to 10^6 per second (a run of
10^6 requests must finish on the simulator's clock); ``--cost-ratio`` ≤ 100
(from 1 on no speedup is possible).

``--chart`` keeps ``sim`` free of plotting: sim computes the chart data and
hands it, as JSON on stdin, to ``python -m reports.prediction_chart`` (the
package that owns every chart), which writes the file.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from presets import HARDWARE, HEAD_KINDS, HEAD_PAIRS, MODELS, PAIRS, Pair, get_hardware, get_pair, make_pair
from sim.acceptance import (
    AcceptanceModel,
    IIDAcceptance,
    PerPositionAcceptance,
    implied_alpha_from_tau,
    load_acceptance,
)
from sim.cost import CostModel, LeviathanCost, load_cost_model, pair_roofline_cost
from sim.kernels import DEFAULT_MOE_ROUTING, ENGINES, MOE_ROUTINGS
from sim.engine_overheads import ENGINE_OVERHEAD_HELP, ENGINE_OVERHEADS, engine_cost
from sim.stepcost import COST_SOURCES, DRAFT_KINDS, DTYPES, GpuSetup, build_step_cost, check_fits, source_lines
from sim.limits import (
    ARRIVAL_RATE_ARG,
    CONTEXT_TOKENS_ARG,
    COST_RATIO_ARG,
    GAMMA_LIMIT,
    GAMMA_WHY,
    MAX_BATCH_LIMIT,
    NEW_TOKENS_LIMIT,
    REQUESTS_LIMIT,
    SEED_LIMIT,
    SIMULATED_TOKENS_LIMIT,
)
from sim.policies import POLICY_KINDS, FixedGamma, GammaSpec
from toolkit.cli import (
    OneLineParser,
    check_output_file,
    choice_arg,
    fail,
    float_arg,
    float_list_arg,
    int_arg,
    nonempty_arg,
)

PROG = "python -m sim"
MODES = ("analytic", "event", "serve")
FORMATS = ("table", "json", "csv")
CHART_SUFFIXES = (".html", ".png", ".svg")
DEFAULT_PRESET = "llama3-1b-3b"
# Subcommands, dispatched by ``python -m sim`` (sim/__main__.py) before these options are parsed; an unknown word
# lists these.
COMMANDS: tuple[str, ...] = ("check", "tree", "validate")

GAMMA_MAX_DEFAULT = 8  # not argparse's default: "--gamma 4 --gamma-max 8" must still be seen as a conflict
NEW_TOKENS_DEFAULT = {"event": 4096, "serve": 256}


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


def _model_arg(what: str, presets: list[str]) -> Any:
    """A ``type=`` converter for --target/--draft: any non-blank name (resolved later, sim/modelref.py); a blank
    one lists the preset names."""
    def convert(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"empty {what} {text!r}; valid: {', '.join(presets)}, a Hugging Face "
                                             "id or a local directory holding config.json")
        return text

    return convert


def _add_gpu_flags(p: argparse.ArgumentParser, batch: bool = True, overhead: bool = True) -> None:
    """The GPU step-cost flags (sim/stepcost.py): engine, parallelism, dtype, cost source, lockstep batch (``sim
    tree`` has its own ``--batch``), the engine's fitted overhead (``sim validate`` fits it; not where a tool fits
    its own, ``overhead``)."""
    p.add_argument("--engine", type=choice_arg("engine", ENGINES),
                   help=f"serving engine whose kernel tables price the steps: {', '.join(ENGINES)} (default vllm)")
    p.add_argument("--tp", type=int_arg(1, 64), help="tensor-parallel GPUs (default 1)")
    p.add_argument("--ep", type=int_arg(1, 64), help="expert-parallel GPUs of an MoE model (default: --tp)")
    p.add_argument("--dtype", type=choice_arg("dtype", DTYPES), help=f"weight dtype: {', '.join(DTYPES)} "
                   "(default bf16)")
    p.add_argument("--cost-source", type=choice_arg("cost source", COST_SOURCES),
                   help="auto (kernel tables where the GPU, engine and model are covered, else the roofline), "
                   "kernels or roofline; default auto with --target/--draft beyond the presets or any GPU flag")
    p.add_argument("--moe-routing", type=choice_arg("MoE routing", MOE_ROUTINGS),
                   help=f"token routing the kernel tables' MoE op is measured under, for an MoE model: "
                   f"{', '.join(MOE_ROUTINGS)} (default {DEFAULT_MOE_ROUTING}, the one python -m sim validate "
                   "prefers on its fit rows)")
    if batch:
        p.add_argument("--batch", type=int_arg(1, MAX_BATCH_LIMIT), help="analytic mode: B sequences decoding in "
                       "lockstep (default 1)")
    if overhead:
        p.add_argument("--engine-overhead", type=choice_arg("engine overhead", ENGINE_OVERHEADS), default="fitted",
                       help=ENGINE_OVERHEAD_HELP)


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m sim`` options; every ``type=`` refuses NaN, ±inf, empty items and out-of-range values."""
    p = OneLineParser(
        prog=PROG,
        description="Predict speculative-decoding speedup from acceptance, draft length and a cost model.",
    )
    p.add_argument("--list-presets", action="store_true", help="list pairs, models and hardware, then exit")
    p.add_argument("--preset", type=choice_arg("preset", [*PAIRS, *HEAD_PAIRS]),
                   help=f"draft/target pair or draft head by exact name (default {DEFAULT_PRESET})")
    p.add_argument("--draft", type=_model_arg("draft", [*MODELS, *DRAFT_KINDS]),
                   help=f"draft: a model (as --target takes), or {', '.join(DRAFT_KINDS)} (with --target)")
    p.add_argument("--target", type=_model_arg("model", list(MODELS)), help="target model (with --draft): a preset name, a "
                   "Hugging Face id of a shipped config, or a local directory holding config.json")
    _add_gpu_flags(p)
    p.add_argument("--hardware", type=choice_arg("hardware", list(HARDWARE)), help="hardware profile "
                   "(default: the pair's)")
    a = p.add_mutually_exclusive_group()
    a.add_argument("--alpha", type=float_arg(0.0, 1.0), help="i.i.d. acceptance rate in [0, 1] "
                   "(default: the preset's)")
    a.add_argument("--alpha-per-position", type=float_list_arg(0.0, 1.0, max_items=GAMMA_LIMIT),
                   metavar="A1,A2,...", help="conditional acceptance per draft position; the last repeats")
    a.add_argument("--tau", type=float_arg(1.0, GAMMA_LIMIT + 1.0), help="mean tokens per round measured at "
                   "--gamma (vLLM/Spec-Bench tau); the implied i.i.d. alpha is used")
    a.add_argument("--acceptance", metavar="FILE", type=nonempty_arg("file name"),
                   help="acceptance model JSON (as written by calibrate)")
    c = p.add_mutually_exclusive_group()
    c.add_argument("--cost-ratio", type=COST_RATIO_ARG, metavar="C",
                   help="pure Leviathan cost model: draft step = C x target step, verify = target step")
    c.add_argument("--cost-model", metavar="FILE", type=nonempty_arg("file name"),
                   help="cost model JSON (as written by calibrate)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--gamma", type=int_arg(1, GAMMA_LIMIT, GAMMA_WHY), help="evaluate one draft length (1..64)")
    g.add_argument("--gamma-max", type=int_arg(1, GAMMA_LIMIT, GAMMA_WHY),
                   help="evaluate draft lengths 1..N (default 8, at most 64)")
    p.add_argument("--context-tokens", type=CONTEXT_TOKENS_ARG, default=512.0,
                   help="context length the costs use (default 512; at most the pair's window)")
    p.add_argument("--mode", default="analytic", type=choice_arg("mode", MODES),
                   help=f"one of {', '.join(MODES)} (default analytic)")
    p.add_argument("--policy", type=choice_arg("policy", POLICY_KINDS),
                   help=f"gamma policy for event/serve: {', '.join(POLICY_KINDS)} (default fixed)")
    p.add_argument("--new-tokens", type=int_arg(1, NEW_TOKENS_LIMIT), help="tokens per simulated request "
                   "(default 4096 in event mode, 256 in serve mode)")
    p.add_argument("--requests", type=int_arg(1, REQUESTS_LIMIT), help="requests in serve mode (default 200)")
    p.add_argument("--arrival-rate", type=ARRIVAL_RATE_ARG,
                   help="Poisson arrivals per second in serve mode (default 5)")
    p.add_argument("--max-batch", type=int_arg(1, MAX_BATCH_LIMIT), help="largest batch in serve mode (default 32)")
    p.add_argument("--seed", type=int_arg(0, SEED_LIMIT), default=0, help="seed of every random draw (default 0)")
    p.add_argument("--usd-per-hour", type=float_arg(0.0), help="device price: adds cost per 1M generated tokens")
    p.add_argument("--format", default="table", type=choice_arg("format", FORMATS),
                   help=f"one of {', '.join(FORMATS)} (default table)")
    p.add_argument("--out", metavar="FILE", type=nonempty_arg("file name"),
                   help="write the output here instead of stdout")
    p.add_argument("--chart", metavar="FILE", type=nonempty_arg("file name"),
                   help="write charts (.html, .png or .svg): speedup vs alpha and vs gamma")
    return p


@dataclass(frozen=True)
class ServeLoad:
    """Serve mode's requests, Poisson arrival rate and largest batch (the defaults where a flag is not given)."""

    requests: int = 200
    arrival_rate_per_s: float = 5.0
    max_batch: int = 32

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServeLoad:
        given = {"requests": args.requests, "arrival_rate_per_s": args.arrival_rate, "max_batch": args.max_batch}
        return cls(**{k: v for k, v in given.items() if v is not None})


@dataclass(frozen=True)
class TauAt:
    """A measured mean of tokens per round (``--tau``) and the γ it was measured at (``--gamma``)."""

    tokens_per_round: float
    gamma: int


@dataclass(frozen=True)
class Setup:
    """Everything a prediction needs, validated; built from the arguments by :func:`resolve`."""

    preset: str | None
    hardware: str | None
    acceptance: AcceptanceModel
    cost: CostModel
    cost_ratio: float
    gammas: list[int]
    pair: Pair | None
    mode: str
    policy: str
    context_tokens: float
    new_tokens: int
    requests: int
    arrival_rate_per_s: float
    max_batch: int
    seed: int
    usd_per_hour: float | None
    alpha_source: str | None
    tau: TauAt | None
    batch: int = 1


def _check_mode_flags(args: argparse.Namespace) -> None:
    """Refuse flags the chosen mode would ignore."""
    if args.mode == "analytic" and args.policy not in (None, "fixed"):
        raise CliError(f"--policy {args.policy} applies to --mode event or serve; the analytic mode is the "
                       "closed form for a fixed gamma")
    only = {"new_tokens": ("event", "serve"), "requests": ("serve",), "arrival_rate": ("serve",),
            "max_batch": ("serve",)}
    for name, modes in only.items():
        if getattr(args, name) is not None and args.mode not in modes:
            raise CliError(f"--{name.replace('_', '-')} applies to --mode {' or '.join(modes)} only, "
                           f"not --mode {args.mode}")
    if args.hardware is not None and (args.cost_ratio is not None or args.cost_model is not None):
        flag = "--cost-ratio" if args.cost_ratio is not None else "--cost-model"
        raise CliError(f"--hardware {args.hardware} has no effect with {flag}: the costs come from {flag}")
    if args.batch is not None and args.mode != "analytic":
        raise CliError(f"--batch applies to --mode analytic only (serve mode batches by --max-batch), not --mode "
                       f"{args.mode}")
    gpu_flags = [f"--{k.replace('_', '-')}" for k in GPU_FLAGS if getattr(args, k) is not None]
    if gpu_flags and (args.cost_ratio is not None or args.cost_model is not None):
        flag = "--cost-ratio" if args.cost_ratio is not None else "--cost-model"
        raise CliError(f"{gpu_flags[0]} has no effect with {flag}: the costs come from {flag}")
    conflict = engine_source_conflict(args)
    if conflict:
        raise CliError(conflict)
    if args.tau is not None and args.gamma is None:
        raise CliError("--tau needs --gamma: the draft length the mean tokens per round was measured at")
    if args.out and args.chart and Path(args.out).resolve() == Path(args.chart).resolve():
        raise CliError(f"--out and --chart name the same file {args.out!r}")


GPU_FLAGS = ("engine", "tp", "ep", "dtype", "cost_source", "moe_routing")


def engine_source_conflict(args: argparse.Namespace) -> str | None:
    """The one line refusing ``--engine`` with ``--cost-source roofline`` (only the kernel tables are per engine);
    None when the GPU flags agree (``calibrate serve`` shares the check)."""
    if args.engine is not None and args.cost_source == "roofline":
        return (f"--engine {args.engine} has no effect with --cost-source roofline: only the kernel tables are per "
                "engine")
    return None


def gpu_setup(args: argparse.Namespace, hardware: str) -> GpuSetup:
    """The :class:`~sim.stepcost.GpuSetup` of ``hardware`` and the GPU flags (``--engine``, ``--tp``, ``--ep``,
    ``--dtype``, ``--moe-routing``), with sim's defaults: vllm, TP 1, EP = TP, bf16, the default MoE routing."""
    tp = args.tp or 1
    return GpuSetup(get_hardware(hardware), args.engine or "vllm", tp, args.ep or tp, args.dtype or "bf16",
                    args.engine is not None, getattr(args, "moe_routing", None) or DEFAULT_MOE_ROUTING)
ROOFLINE_ONLY_HARDWARE = ("h100-sxm", "h200", "a100-80gb", "l4", "t4", "cpu")  # the profiles older than the seam


def _beyond_presets(args: argparse.Namespace) -> bool:
    """--target/--draft name a model or draft the preset pairs do not hold (a hub id, a directory, ngram)."""
    return args.target is not None and (args.target not in MODELS or args.draft not in [*MODELS, *HEAD_KINDS])


def _uses_seam(args: argparse.Namespace) -> bool:
    """Priced by the step-cost seam (sim/stepcost.py): a model or draft beyond the presets, any GPU flag, or a
    GPU profile added with the seam (``sim tree`` shares this: its parser has the same GPU flags)."""
    if any(getattr(args, k, None) is not None for k in GPU_FLAGS):
        return True
    if args.hardware is not None and args.hardware not in ROOFLINE_ONLY_HARDWARE:
        return True
    return _beyond_presets(args)


def _resolve_pair(args: argparse.Namespace) -> Pair | None:
    """A preset, a pair of the user's, or none at all (pure Leviathan / fitted files)."""
    if (args.draft is None) != (args.target is None):
        raise CliError("--draft and --target go together: give both, or --preset")
    if args.draft is not None:
        if args.preset is not None:
            raise CliError("give either --preset or --draft/--target, not both")
        if _beyond_presets(args):
            return None
        return make_pair(args.draft, args.target)
    if args.preset is not None:
        return get_pair(args.preset)
    if args.cost_ratio is None and args.cost_model is None:
        return get_pair(DEFAULT_PRESET)
    return None


def seam_cost(args: argparse.Namespace, pair: Pair | None, gammas: list[int], overhead: bool = False) -> CostModel:
    """The seam's cost for --target/--draft (or a preset's two models) on --hardware with the GPU flags; with
    ``overhead``, on a GPU, plus the engine's fitted overhead (:func:`sim.engine_overheads.with_fitted_overhead`; a
    chain's round kind until :func:`sim.engine_overheads.for_shape` says a tree's)."""
    target, draft = args.target, args.draft
    if pair is not None:
        target = pair.target.name
        draft = pair.head.kind if pair.head is not None else pair.draft.name
    setup = gpu_setup(args, args.hardware or (pair.default_hardware if pair else "h100-sxm"))
    batch = getattr(args, "batch", None) or 1
    cost = build_step_cost(target, draft, setup, args.cost_source or "auto", batch, args.context_tokens, max(gammas))
    return engine_cost(cost, "fitted" if overhead else "none", setup.engine, batch)


def _head_only_pair(args: argparse.Namespace) -> Pair | None:
    """For a draft head on any target: a preset pair of that head kind, whose published acceptance (a property of
    the kind, :func:`sim.typical.default_alpha`) is the default α; ``None`` for other drafts."""
    if args.draft in HEAD_KINDS:
        from presets import head_pair

        return head_pair(args.draft, "Llama-3.1-8B")
    return None


def check_preset_fits(pair: Pair | None, hardware: str | None, context_tokens: float, gamma_max: int,
                      batch: int = 1) -> None:
    """A preset pair priced on one GPU that cannot hold its weights and KV cache is refused in one line naming the
    setups that fit (a --tp, a --dtype, a --hardware), as the seam refuses one (``sim tree`` shares this)."""
    if pair is None or hardware is None:
        return
    check_fits(pair.target, float(pair.draft.params), GpuSetup(get_hardware(hardware)),
               batch, context_tokens + gamma_max + 1)


def _resolve_acceptance(args: argparse.Namespace, pair: Pair | None, gammas: list[int]) -> AcceptanceModel:
    if args.alpha is not None:
        return IIDAcceptance(args.alpha)
    if args.alpha_per_position is not None:
        return PerPositionAcceptance(tuple(args.alpha_per_position))
    if args.tau is not None:
        try:
            return IIDAcceptance(implied_alpha_from_tau(args.tau, args.gamma))
        except ValueError as exc:
            raise CliError(f"--tau {args.tau:g}: {exc}") from None
    if args.acceptance is not None:
        model = load_acceptance(args.acceptance)
        recorded = model.gamma_max
        if recorded is not None and max(gammas) > recorded:
            asked = f"{recorded + 1}..{max(gammas)}" if max(gammas) > recorded + 1 else str(max(gammas))
            raise CliError(f"--acceptance {args.acceptance!r} was recorded up to gamma={recorded}; cannot replay "
                           f"gamma={asked} (--gamma/--gamma-max {max(gammas)}); valid: 1..{recorded}")
        if recorded is not None and args.policy not in (None, "fixed"):
            pol = GammaSpec(args.policy, 1).policy()
            reach = pol.gamma if isinstance(pol, FixedGamma) else pol.gamma_max  # the highest γ it can draft
            if reach > recorded:
                raise CliError(f"--policy {args.policy} can raise gamma to {reach}, but --acceptance "
                               f"{args.acceptance!r} was recorded up to gamma={recorded}; use --policy fixed")
        return model
    if pair is not None:
        from sim.typical import default_alpha

        return IIDAcceptance(default_alpha(pair)[0])
    raise CliError("no acceptance given: use --alpha, --alpha-per-position, --tau or --acceptance")


def _resolve_hardware(args: argparse.Namespace, pair: Pair | None) -> str | None:
    """The hardware profile the roofline costs use (``--hardware``, else the pair's); ``None`` with
    ``--cost-ratio`` or ``--cost-model``, whose costs name no device."""
    if args.cost_ratio is not None or args.cost_model is not None:
        return None
    if args.hardware is not None or pair is None:
        return args.hardware
    return pair.default_hardware


def _resolve_cost(args: argparse.Namespace, pair: Pair | None, hardware: str | None) -> CostModel:
    if args.cost_ratio is not None:
        return LeviathanCost(args.cost_ratio)
    if args.cost_model is not None:
        return load_cost_model(args.cost_model)
    if pair is None or hardware is None:  # _resolve_pair gives the default pair when no cost flag is given
        raise CliError("no cost model: use --cost-ratio, --cost-model or a pair (--preset, or --draft and --target)")
    return pair_roofline_cost(pair, get_hardware(hardware))


def _check_workload(args: argparse.Namespace, pair: Pair | None, gammas: list[int], new_tokens: int,
                    requests: int, max_batch: int, policy: str) -> None:
    """Context within the models' window; simulated work bounded so no run hangs."""
    if pair is not None and args.context_tokens > pair.context_window_tokens:
        raise CliError(f"--context-tokens {args.context_tokens:g} is out of range for {pair.name}: "
                       f"{pair.shorter_window_model.name} has {pair.context_window_tokens} positions; "
                       f"valid: 0..{pair.context_window_tokens}")
    if args.mode == "analytic":
        return
    per_gamma = new_tokens if args.mode == "event" else requests * new_tokens
    if args.mode == "serve" and policy != "fixed":
        per_gamma += 3 * max_batch * new_tokens  # the saturated queue that measures an adaptive policy's capacity
    total = per_gamma * len(gammas)
    if total > SIMULATED_TOKENS_LIMIT:
        knobs = "--new-tokens" if args.mode == "event" else "--requests, --new-tokens" + (
            ", --max-batch" if policy != "fixed" else "")
        raise CliError(f"{total:.3g} simulated tokens ({len(gammas)} gamma value(s) x {per_gamma:,} each) is "
                       f"over the limit of {SIMULATED_TOKENS_LIMIT:.0e} (about a minute of simulation); "
                       f"lower {knobs} or pick one --gamma")


def resolve(args: argparse.Namespace) -> Setup:
    """Turn CLI arguments into a validated :class:`Setup`; raise ``CliError``/``ValueError`` on any bad value.

    Nothing is computed before every check has passed; output files are probed first.
    """
    _check_mode_flags(args)
    gammas = [args.gamma] if args.gamma is not None else list(range(1, (args.gamma_max or GAMMA_MAX_DEFAULT) + 1))
    new_tokens = args.new_tokens if args.new_tokens is not None else NEW_TOKENS_DEFAULT.get(args.mode, 0)
    serve = ServeLoad.from_args(args)
    policy = args.policy or "fixed"
    pair = _resolve_pair(args)
    _check_workload(args, pair, gammas, new_tokens, serve.requests, serve.max_batch, policy)
    if args.chart and Path(args.chart).suffix not in CHART_SUFFIXES:
        raise CliError(f"--chart {args.chart!r}: unknown suffix {Path(args.chart).suffix!r}; "
                       f"valid: {', '.join(CHART_SUFFIXES)}")
    for flag, path in (("--out", args.out), ("--chart", args.chart)):
        if path:
            check_output_file(flag, path)
    seam = _uses_seam(args) or args.batch is not None
    hardware = _resolve_hardware(args, pair) if not seam else (args.hardware or (
        pair.default_hardware if pair else "h100-sxm"))
    if not seam:
        check_preset_fits(pair, hardware, args.context_tokens, max(gammas))
    # the seam checks the models and the GPU setup first
    cost = seam_cost(args, pair, gammas, args.engine_overhead == "fitted") if seam else None
    acceptance = _resolve_acceptance(args, pair or _head_only_pair(args), gammas)
    cost = cost or _resolve_cost(args, pair, hardware)
    cost_ratio = cost.draft_step_ms(args.context_tokens) / cost.target_step_ms(args.context_tokens)
    from_cli = any(getattr(args, k) is not None for k in ("alpha", "alpha_per_position", "tau", "acceptance"))
    known = pair or _head_only_pair(args)
    if known is None or from_cli:
        alpha_source = None if known is None else "command line"
    else:
        from sim.typical import default_alpha

        alpha_source = default_alpha(known)[1]
    return Setup(pair.name if pair else None, hardware, acceptance, cost, cost_ratio, gammas, pair, args.mode,
                 policy, args.context_tokens, new_tokens, serve.requests, serve.arrival_rate_per_s, serve.max_batch,
                 args.seed, args.usd_per_hour, alpha_source, None if args.tau is None else TauAt(args.tau, args.gamma),
                 args.batch or 1)


def _analytic_rows(s: Setup) -> list[dict]:
    from sim.analytic import break_even_alpha, predict

    rows = []
    for r in predict(s.acceptance, s.cost, s.gammas, s.context_tokens, s.batch):
        rows.append({
            "gamma": r.gamma,
            "expected_tokens_per_round": r.expected_tokens_per_round,
            "round_time_ms": r.round_time_ms,
            "speedup": r.speedup,
            "tokens_per_s": r.tokens_per_s_speculative,
            "tokens_per_s_baseline": r.tokens_per_s_baseline,
            # accepted/drafted is what many tools print; it is NOT alpha.
            "accepted_over_drafted": (r.expected_tokens_per_round - 1.0) / r.gamma,
            "break_even_alpha": break_even_alpha(r.gamma, s.cost, context_tokens=s.context_tokens, batch=s.batch),
        })
    return rows


def _event_rows(s: Setup) -> list[dict]:
    from sim.events import simulate_request

    analytic = {r["gamma"]: r for r in _analytic_rows(s)}
    rows = []
    for g in s.gammas:
        res = simulate_request(s.acceptance, s.cost, f"{s.policy}:{g}", s.new_tokens, s.context_tokens, seed=s.seed)
        base_ms_per_token = res.baseline_time_ms / res.n_tokens
        rows.append({
            "gamma": g,
            "policy": f"{s.policy}:{g}",
            "expected_tokens_per_round": res.tokens_per_round,
            "round_time_ms": res.time_ms / res.rounds,
            "speedup": res.speedup,
            "tokens_per_s": 1000.0 * res.n_tokens / res.time_ms,
            "tokens_per_s_baseline": 1000.0 / base_ms_per_token,
            "accepted_over_drafted": res.accepted / res.drafted if res.drafted else None,
            "rounds": res.rounds,
            "closed_form_speedup": analytic[g]["speedup"],
        })
    return rows


def _serve_rows(s: Setup) -> list[dict]:
    """One row per γ; ``speedup`` (p50 latency ratio) is ``None`` when arrivals exceed either side's capacity."""
    from sim.events import simulate_serving

    rows = []
    for g in s.gammas:
        r = simulate_serving(s.acceptance, s.cost, f"{s.policy}:{g}", n_requests=s.requests,
                             arrival_rate_per_s=s.arrival_rate_per_s, n_tokens=s.new_tokens,
                             context_tokens=s.context_tokens, max_batch=s.max_batch, seed=s.seed)
        sp, b, sc, bc = r.speculative, r.baseline, r.speculative_capacity, r.baseline_capacity
        rows.append({
            "gamma": g,
            "policy": r.policy,
            "speedup": r.latency_speedup_p50,
            "overloaded": r.overloaded,
            "capacity_speedup": r.capacity_speedup,
            "throughput_speedup": r.throughput_speedup,
            "tokens_per_s": sp.throughput_tokens_per_s,
            "tokens_per_s_baseline": b.throughput_tokens_per_s,
            "capacity_requests_per_s": sc.requests_per_s,
            "capacity_tokens_per_s": sc.tokens_per_s,
            "baseline_capacity_requests_per_s": bc.requests_per_s,
            "baseline_capacity_tokens_per_s": bc.tokens_per_s,
            "utilization": r.speculative_utilization,
            "baseline_utilization": r.baseline_utilization,
            "capacity_method": sc.method,
            "latency_p50_ms": sp.latency_p50_ms,
            "latency_p95_ms": sp.latency_p95_ms,
            "latency_p99_ms": sp.latency_p99_ms,
            "baseline_latency_p50_ms": b.latency_p50_ms,
            "baseline_latency_p95_ms": b.latency_p95_ms,
            "baseline_latency_p99_ms": b.latency_p99_ms,
            "mean_batch": sp.mean_batch,
            "expected_tokens_per_round": s.acceptance.expected_tokens(g),
        })
    return rows


def _best_row(rows: list[dict]) -> tuple[dict, str]:
    """The optimal row and what it is optimal by: speedup, or (serve mode, all overloaded) capacity."""
    ranked = [r for r in rows if r["speedup"] is not None]
    if ranked:
        return max(ranked, key=lambda r: (r["speedup"], -r["gamma"])), "speedup"
    return max(rows, key=lambda r: (r["capacity_requests_per_s"], -r["gamma"])), "capacity"


def run(s: Setup) -> dict:
    """Predict for every γ of the setup; the JSON-able document every output format is drawn from."""
    rows = {"analytic": _analytic_rows, "event": _event_rows, "serve": _serve_rows}[s.mode](s)
    if s.usd_per_hour is not None:
        from sim.analytic import cost_per_million_tokens

        for r in rows:
            r["usd_per_1m_tokens"] = cost_per_million_tokens(r["tokens_per_s"], s.usd_per_hour)
            r["usd_per_1m_tokens_baseline"] = cost_per_million_tokens(r["tokens_per_s_baseline"], s.usd_per_hour)
    best, basis = _best_row(rows)
    doc: dict[str, Any] = {
        "preset": s.preset,
        "hardware": s.hardware,
        "mode": s.mode,
        "cost_ratio": s.cost_ratio,
        "context_tokens": s.context_tokens,
        "acceptance_model": s.acceptance.describe(),
        "cost_model": s.cost.describe(),
        "cost_source": source_lines(s.cost.describe()),
        "batch": s.batch,
        "optimal_gamma": best["gamma"],
        "optimal_speedup": best["speedup"],
        "optimal_by": basis,
        "seed": s.seed,
        "rows": rows,
    }
    # a preset without a GPU flag keeps its datasheet roofline; on a GPU the kernel tables cover, say how to ask
    if s.hardware and s.cost.describe().get("kind") == "roofline" and get_hardware(s.hardware).kernel_system:
        doc["cost_source"].append(f"note: {s.hardware} has kernel tables: add --engine vllm|sglang|trtllm to price "
                                  "with them and the fitted engine overhead")
    if s.mode == "serve":
        doc.update(arrival_rate_per_s=s.arrival_rate_per_s, requests=s.requests, new_tokens=s.new_tokens,
                   max_batch=s.max_batch)
    if isinstance(s.acceptance, PerPositionAcceptance):
        doc["alpha_per_position"] = list(s.acceptance.alphas)
    else:
        doc["alpha"] = s.acceptance.alpha if isinstance(s.acceptance, IIDAcceptance) else None
    if s.alpha_source is not None:
        doc["alpha_source"] = s.alpha_source
    if s.tau is not None:
        doc["tau"] = s.tau.tokens_per_round
        doc["note"] = ("alpha implied from tau at gamma=%d; accepted/drafted = (tau-1)/gamma = %.3f is not alpha"
                       % (s.tau.gamma, (s.tau.tokens_per_round - 1) / s.tau.gamma))
    return doc


def chart_data(s: Setup, doc: dict) -> dict:
    """What the prediction charts show: speedup against α (γ = 1..8, closed form) and against γ (the rows)."""
    from sim.analytic import predict

    alphas = np.linspace(0.0, 1.0, 51)
    by_alpha = [{"alpha": float(a), "gamma": g, "speedup": r.speedup}
                for g in range(1, 9) for a in alphas
                for r in predict(IIDAcceptance(float(a)), s.cost, [g], s.context_tokens)]
    by_gamma = [{"gamma": r["gamma"], "speedup": r["speedup"], "source": "predicted",
                 "optimal": r["gamma"] == doc["optimal_gamma"]} for r in doc["rows"] if r["speedup"] is not None]
    return {"title": doc["preset"] or "custom", "speedup_vs_alpha": by_alpha, "speedup_vs_gamma": by_gamma}


def write_charts(data: dict, path: Path) -> None:
    """Have ``reports`` draw ``data`` into ``path`` (a separate process: sim imports no plotting code)."""
    proc = subprocess.run([sys.executable, "-m", "reports.prediction_chart", "--out", str(path)],
                          input=json.dumps(data), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"]
        raise CliError(f"--chart {str(path)!r}: the chart writer failed: {lines[-1]}")


def _serve_tail(doc: dict) -> list[str]:
    """Serve mode in words: demand, each side's capacity, and whether either side is overloaded."""
    best = next(r for r in doc["rows"] if r["gamma"] == doc["optimal_gamma"])
    rate, n = doc["arrival_rate_per_s"], doc["new_tokens"]
    base_cap, spec_cap = best["baseline_capacity_requests_per_s"], best["capacity_requests_per_s"]
    g = doc["optimal_gamma"]
    lines = [f"arrivals: {rate:g} requests/s x {n} tokens = {rate * n:.0f} tok/s demanded",
             f"capacity (highest sustainable arrival rate, batch <= {doc['max_batch']}): autoregressive "
             f"{base_cap:.3g} requests/s ({best['baseline_capacity_tokens_per_s']:.0f} tok/s); speculative at "
             f"gamma = {g} {spec_cap:.3g} requests/s ({best['capacity_tokens_per_s']:.0f} tok/s, "
             f"{best['capacity_method']}); each saturates at that arrival rate"]
    caps = {"autoregressive": (base_cap, best["baseline_utilization"]), "speculative": (spec_cap, best["utilization"])}
    over = {name: cap for name, (cap, u) in caps.items() if u >= 1.0}
    if over:
        sides = " and the ".join(f"{name} side ({cap:.3g} requests/s)" for name, cap in over.items())
        lines.append(f"OVERLOADED: {rate:g} requests/s arrive, more than the {sides} can serve: its queue grows "
                     "without bound, its latency grows with --requests, and a latency ratio is not a speedup")
        if doc["optimal_by"] == "capacity":
            lines.append(f"optimal gamma = {g} by capacity: speculative decoding sustains "
                         f"{best['capacity_speedup']:.3f}x the arrival rate of the autoregressive baseline")
        else:
            lines.append(f"optimal gamma = {g}, among the gammas where neither side is overloaded: p50 request "
                         f"latency {doc['optimal_speedup']:.3f}x lower")
        return lines
    near = [name for name, (cap, u) in caps.items() if u >= 0.9]
    if near:
        lines.append(f"note: the {' and the '.join(near)} side runs at >= 90% of its capacity; its latency is "
                     "mostly queueing and sensitive to --requests")
    lines.append(f"optimal gamma = {g}: p50 request latency {doc['optimal_speedup']:.3f}x lower, throughput "
                 f"{best['throughput_speedup']:.3f}x of the autoregressive {best['tokens_per_s_baseline']:.1f} "
                 f"tok/s under the same arrivals; capacity {best['capacity_speedup']:.3f}x")
    return lines


def format_table(doc: dict) -> str:
    """The human-readable table with a closing line (or, in serve mode, lines) in words."""
    head = [f"preset: {doc['preset'] or '-'}   hardware: {doc['hardware'] or '-'}   mode: {doc['mode']}"]
    acc = doc["acceptance_model"]
    acc_txt = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in acc.items())
    head.append(f"acceptance: {acc_txt}   cost ratio c = {doc['cost_ratio']:.4g}   "
                f"context = {doc['context_tokens']:.0f} tokens")
    head.extend(doc.get("cost_source", []))
    if doc.get("batch", 1) > 1:
        head.append(f"batch: {doc['batch']} sequences in lockstep")
    if doc.get("alpha_source"):
        head.append(f"alpha source: {doc['alpha_source']}")
    if doc.get("note"):
        head.append(f"note: {doc['note']}")
    cols = [c for c in ("gamma", "expected_tokens_per_round", "round_time_ms", "tokens_per_s", "speedup")
            if c in doc["rows"][0]]
    extra = [c for c in ("closed_form_speedup", "break_even_alpha", "latency_p50_ms", "baseline_latency_p50_ms",
                         "throughput_speedup", "capacity_requests_per_s", "usd_per_1m_tokens")
             if c in doc["rows"][0]]
    cols += extra
    names = {"expected_tokens_per_round": "tokens/round", "round_time_ms": "round ms",
             "tokens_per_s": "tok/s", "closed_form_speedup": "closed form", "break_even_alpha": "break-even a",
             "latency_p50_ms": "p50 ms", "baseline_latency_p50_ms": "base p50 ms",
             "throughput_speedup": "thru x", "capacity_requests_per_s": "cap req/s", "usd_per_1m_tokens": "$/1M tok"}

    def fmt(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 1000 else f"{v:.0f}"
        return str(v)

    table = [[names.get(c, c) for c in cols] + [""]]
    for r in doc["rows"]:
        table.append([fmt(r.get(c)) for c in cols] + ["<- optimal" if r["gamma"] == doc["optimal_gamma"] else ""])
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) + "  " + row[-1] for row in table]
    base = doc["rows"][0]["tokens_per_s_baseline"]
    if doc["mode"] == "serve":
        tail = _serve_tail(doc)
    else:
        tail = [f"optimal gamma = {doc['optimal_gamma']}: speedup {doc['optimal_speedup']:.3f}x "
                f"over {base:.1f} tok/s autoregressive"]
    if doc["optimal_speedup"] is not None and doc["optimal_speedup"] < 1.0:
        tail[-1] += "  (speculative decoding is SLOWER here at every gamma)"
    return "\n".join(head + [""] + lines + [""] + tail)


def format_csv(doc: dict) -> str:
    """One CSV row per γ with an ``optimal`` column."""
    buf = io.StringIO()
    keys = list(doc["rows"][0].keys())
    w = csv.DictWriter(buf, fieldnames=keys + ["optimal"])
    w.writeheader()
    for r in doc["rows"]:
        w.writerow({**r, "optimal": r["gamma"] == doc["optimal_gamma"]})
    return buf.getvalue()


def list_presets() -> str:
    """Every pair, model and hardware profile by the exact name the flags take."""
    lines = ["pairs (draft -> target, default alpha):"]
    for p in PAIRS.values():
        lines.append(f"  {p.name:24s} {p.draft.name} -> {p.target.name}  alpha={p.default_alpha}  "
                     f"hardware={p.default_hardware}")
    lines.append("models:")
    for m in MODELS.values():
        lines.append(f"  {m.name:16s} {m.params / 1e6:9.1f}M params  vocab {m.vocab_size}  layers {m.n_layers}")
    lines.append("hardware:")
    for h in HARDWARE.values():
        lines.append(f"  {h.name:10s} {h.description}")
    lines.append("draft heads on their target (--preset NAME, or --draft KIND --target MODEL):")
    for p in HEAD_PAIRS.values():
        head = p.head
        assert head is not None, "HEAD_PAIRS holds draft heads only"
        lines.append(f"  {p.name:24s} {head.head_kind.title} on {p.target.name}  hardware={p.default_hardware}")
    for k in HEAD_KINDS.values():
        lines.append(f"  kind {k.name:8s} {k.architecture}")
    return "\n".join(lines)


def _write_output(text: str, out: str | None) -> None:
    if out is None:
        print(text)  # a reader that stops early (`| head`): toolkit.cli.entry_point, around sim's main
        return
    try:
        Path(out).write_text(text + ("" if text.endswith("\n") else "\n"))
    except OSError as exc:
        raise CliError(f"--out {out!r} cannot be written: {exc.strerror or exc}") from None
    print(f"wrote {out}")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sim``: 0 on success, 2 with one ``python -m sim: error: ...`` line on any bad input."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:
        fail(PROG, f"unknown command {argv[0]!r}; valid commands: {', '.join(COMMANDS) or 'none'} "
                   f"(the prediction itself takes options only: {PROG} --help)")
    args = build_parser().parse_args(argv)
    if args.list_presets and len(argv) > 1:
        fail(PROG, f"--list-presets takes no other options, got {' '.join(a for a in argv if a != '--list-presets')}")
    if args.list_presets:
        print(list_presets())
        return 0
    try:
        setup = resolve(args)
        doc = run(setup)
        if args.chart:
            write_charts(chart_data(setup, doc), Path(args.chart))
            doc["chart"] = args.chart
        text = {"json": lambda d: json.dumps(d, indent=2), "csv": format_csv,
                "table": format_table}[args.format](doc)
        _write_output(text, args.out)
    except (CliError, ValueError) as exc:
        print(f"{PROG}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
