"""``python -m measure``: run a measurement sweep, print the table as cells finish and one JSON line.

With no arguments: the packaged SmolLM2-135M target with the default draft
(chosen by measurement on a 2-core CPU, see ``DEFAULT_DRAFTS``) over the three
prompt domains, greedy, ``DEFAULT_REPEATS`` repeats; on a CUDA machine also
the synthetic ``gpt2-small-large`` and ``llama3-1b-3b`` pairs for timing
(each in its own run directory next to the first). Every bad input ends in one
line naming the value, the flag and the valid range, exit status 2, before
any model loads.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Sequence, TextIO

from measure.records import Run
from measure.rows import CellRow
from sim.policies import GammaSpec
from toolkit.cli import OneLineParser, choice_arg, csv_items, exit_on_next_interrupt, fail, float_arg, int_arg
from toolkit.track import TRACKERS, usable_tracker

if TYPE_CHECKING:
    from measure.sweep import SweepConfig

DEFAULT_TARGET = "smollm2-135m"
#: Chosen by measurement on the 2-core CPU (results/2026-11-24-readme-evidence.md §5):
#: ``python -m measure --draft ngram:3,int8,bf16 --gamma 4 --prompts 2 --max-new-tokens 64
#: --no-cost --no-peer`` gave 1.16x / 0.89x / 0.97x (code / conversation / docs) for
#: prompt lookup, 1.17x / 0.85x / 0.84x for an int8 copy and 1.01x / 1.03x / 0.98x for a
#: bf16 copy; prompt lookup ties for the best mean and needs no second copy of the model.
DEFAULT_DRAFTS = ("ngram:3",)
#: Two draft lengths, so that ``calibrate --holdout gamma`` has one to fit and one to predict.
DEFAULT_GAMMAS = ("fixed:2", "fixed:4")
#: Repeats per cell: 3, so each cell has 6 (prompt, repeat) pairs. With the visits interleaved across the
#: cells, one pair's speedup varies by 6.6-8.1% on this 2-core VM (``benchmarks/pair_noise.py`` on
#: the runs interleaved-c, -d of results/2026-11-24-readme-evidence.md §3.5), so 4 pairs left a cell's mean about ±4% from its truth:
#: close to the 5% the calibration is judged by. Each repeat of
#: the default job (6 cells × 2 prompts × 3 modes × 64 tokens) takes about 2.5 min here.
DEFAULT_REPEATS = 3
GPU_DEFAULT_PAIRS = ("gpt2-small-large", "llama3-1b-3b")
SUBCOMMANDS = ("head-sweep", "head-recall", "serve", "tree", "build-llamacpp")


# long: the argparse declarations of every option: a list, not logic
def build_parser() -> argparse.ArgumentParser:
    from measure import stats
    from measure.racing import add_race_arguments
    from measure.seam import CACHES, ENGINES
    from measure.sweep import INTERLEAVE, MAX_NEW_TOKENS, MAX_PROMPT_TOKENS, MAX_REPEATS

    p = OneLineParser(prog="python -m measure", description=__doc__.splitlines()[0],
                      epilog="subcommands: python -m measure head-sweep --help (pruned draft head K sweep, "
                             "cells of the same sweep), python -m measure head-recall --help (selector recall, offline), "
                             "python -m measure serve --help (a server under load)")
    p.add_argument("--target", default=None, help=f"target model spec (default {DEFAULT_TARGET})")
    p.add_argument("--draft", default=None,
                   help="comma list of draft kinds: ngram[:N], early:N, layers:a-b,.. (use ';' between), "
                        "int8, bf16, fp16, model:<spec> (default: %s)" % ",".join(DEFAULT_DRAFTS))
    p.add_argument("--pair", default=None, help="synthetic preset pair (e.g. gpt2-small-large): "
                   "target and draft with random weights, timing only (not with --target/--draft)")
    p.add_argument("--gamma", default=",".join(DEFAULT_GAMMAS),
                   help="comma list of γ: integers 1..64 or policies fixed:G, heuristic:G, threshold:G")
    p.add_argument("--temperature", default="0", help="comma list of temperatures >= 0 (0 = greedy)")
    p.add_argument("--domains", default=None, help="comma list of prompt domains (default: all; with "
                   "--prompts-file: the file's)")
    p.add_argument("--prompts", type=int_arg(1, 10_000), default=None,
                   help="prompts per domain (default 2; with --prompts-file: all of the file's)")
    p.add_argument("--prompts-file", default=None, metavar="FILE",
                   help="your own prompts: JSONL {\"prompt\", \"domain\"}, Spec-Bench question.jsonl, ShareGPT JSON "
                        "or plain text (blank-line-separated); its SHA-256 is recorded")
    p.add_argument("--max-new-tokens", type=int_arg(1, MAX_NEW_TOKENS), default=64)
    p.add_argument("--max-prompt-tokens", type=int_arg(1, MAX_PROMPT_TOKENS), default=256)
    p.add_argument("--repeats", type=int_arg(1, MAX_REPEATS), default=DEFAULT_REPEATS,
                   help=f"repeats of every prompt per cell, in rotating order (default {DEFAULT_REPEATS})")
    p.add_argument("--cv-threshold", type=float_arg(0, 10, lo_open=True), default=stats.CV_THRESHOLD,
                   help="a cell is unstable when its baseline's coefficient of variation exceeds this "
                        f"(fraction; default {stats.CV_THRESHOLD})")
    p.add_argument("--drift-threshold", type=float_arg(0, 10, lo_open=True), default=stats.DRIFT_THRESHOLD,
                   help=f"... or its start-to-end drift exceeds this (fraction; default {stats.DRIFT_THRESHOLD})")
    p.add_argument("--until-stable", type=int_arg(0, 100), default=0, metavar="N",
                   help="re-measure an unstable cell up to N times (default 0)")
    add_race_arguments(p, "measure in passes and stop measuring a cell once its domain's best draft/γ (or plain "
                          "decoding) is known within --regret at --confidence (measure/racing.py); --repeats is then "
                          "the most passes", unit="visits", step="pass")
    p.add_argument("--prior", default=None, metavar="CALIBRATION_DIR",
                   help="with --until-decided: a calibration of this target and engine (python -m calibrate); the "
                        "cells it predicts to lose beyond its held-out error are measured last, each checked at the "
                        "end (measure/prior.py: the error rate still holds; what it saved is in run.json race.prior)")
    p.add_argument("--interleave", default="sweep", choices=INTERLEAVE,
                   help="sweep: visit every cell in passes (prompt by prompt, repeat by repeat), so each cell's "
                        "pairs spread over the whole run (default); cell: one cell's visits back to back")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    p.add_argument("--engine", default="transformers", choices=ENGINES, help="inference engine")
    p.add_argument("--threads", type=int_arg(1, 1024), default=None, help="CPU threads (default: the engine's)")
    p.add_argument("--cache", default=None, type=choice_arg("cache", CACHES),
                   help=f"KV cache kind (transformers engine): {', '.join(CACHES)} (default {CACHES[0]})")
    p.add_argument("--compile", action="store_true", help="torch.compile the decode steps (transformers engine)")
    p.add_argument("--seed", type=int_arg(0, 2**31 - 1), default=0)
    p.add_argument("--warmup", type=int_arg(0, 100), default=1, help="warm-up generations per mode per cell "
                   "(not recorded)")
    p.add_argument("--out", default=None, help="run directory (default runs/measure-<timestamp>); "
                   "an existing run directory is resumed if its fingerprint matches")
    p.add_argument("--force-new", action="store_true", help="start afresh: an existing run in --out is moved "
                   "to <out>.replaced-<time>")
    p.add_argument("--extend", action="store_true", help="add cells to the complete run in --out: this command's "
                   "γ policies, drafts and domains may add to the run's (every recorded one still given); recorded "
                   "in run.json extensions, the run's own config and command kept")
    p.add_argument("--no-peer", action="store_true", help="skip the engine's own speculative decoding")
    p.add_argument("--no-library", action="store_true", help="skip the engine's own plain decoding (llama.cpp: "
                   "llama-cpp-python's Llama.generate), measured in every visit to hold our baseline against")
    p.add_argument("--no-traces", action="store_true", help="skip teacher-forced acceptance traces")
    p.add_argument("--no-cost", action="store_true", help="skip the cost curves")
    p.add_argument("--no-system-check", action="store_true", help="skip the pre-run check of the machine")
    p.add_argument("--cost-contexts", default=None, help="context lengths of the cost curves (default: sized to "
                   "the run, from the shortest prompt to the longest prompt + --max-new-tokens)")
    p.add_argument("--cost-max-tokens", type=int_arg(1, 1024), default=None,
                   help="token counts 1..N of the cost curves (default: γ_max + 1, what the cells verify)")
    p.add_argument("--executor", default="local", choices=("local", "ray"),
                   help="where the cells run: here, or one Ray task per cell on a Ray cluster (the ray extra)")
    p.add_argument("--ray-address", default=None, metavar="auto|HOST:PORT",
                   help="--executor ray: join this cluster (auto: the one started on this machine with ray start); "
                        "default: start a local Ray instance")
    p.add_argument("--cpus-per-cell", type=int_arg(1, 1024), default=None, metavar="N",
                   help="--executor ray on CPU: cores each cell reserves (and torch threads it uses; default 1)")
    p.add_argument("--max-retries", type=int_arg(0, 100), default=None, metavar="N",
                   help="--executor ray: re-runs of a cell whose worker died (default 2)")
    p.add_argument("--quiet", action="store_true", help="silence third-party loading output (weights, GGUF "
                   "conversion); the sweep's own progress bar and table stay")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--track", default=None, choices=TRACKERS, metavar="wandb|mlflow",
                   help="also log the finished run to Weights & Biases or MLflow (the track extra; honours WANDB_MODE, "
                        "WANDB_DIR, WANDB_PROJECT, MLFLOW_TRACKING_URI; a tracker that fails costs one warning line)")
    return p


def _split_drafts(text: str) -> list[str]:
    """Split on ',' except inside a ``layers:`` list (use ';' between drafts there)."""
    if ";" in text:
        parts = [t.strip() for t in text.split(";")]
        if any(not t for t in parts):
            fail("python -m measure", f"--draft {text!r}: empty item in the ';' list")
        return parts
    out: list[str] = []
    for part in csv_items("--draft", text):
        if out and out[-1].startswith("layers:") and part[0].isdigit():
            out[-1] += "," + part
        else:
            out.append(part)
    return out


def _config_from_args(args: argparse.Namespace, target: str, drafts: list[str]):
    from measure.seam import CACHES
    from measure.sweep import SweepConfig

    prog = "python -m measure"
    temps = []
    for t in csv_items("--temperature", args.temperature):
        try:
            v = float(t)
        except ValueError:
            fail(prog, f"--temperature {t!r}: not a number; expected comma-separated numbers >= 0 (0 = greedy)")
        if not (math.isfinite(v) and v >= 0):
            fail(prog, f"--temperature {t}: must be a finite number >= 0")
        temps.append(v)
    gammas = []
    for g in csv_items("--gamma", args.gamma):
        if g.lstrip("-").isdigit():
            if not 1 <= int(g) <= 64:
                fail(prog, f"--gamma {g}: must be an integer in 1..64 (or fixed:G, heuristic:G, threshold:G)")
        gammas.append(g)  # parsed once, below (GammaSpec.parse: a bare G is fixed:G)
    contexts = []
    for c in csv_items("--cost-contexts", args.cost_contexts) if args.cost_contexts is not None else ():
        if not c.isdigit() or int(c) < 1:
            fail(prog, f"--cost-contexts {c!r}: expected comma-separated integers >= 1")
        contexts.append(int(c))
    domains = tuple(csv_items("--domains", args.domains)) if args.domains else None
    prompts = args.prompts if args.prompts is not None else (None if args.prompts_file else 2)
    try:
        cfg = SweepConfig(target=target, drafts=tuple(drafts), gammas=tuple(GammaSpec.parse(g) for g in gammas),
                          temperatures=tuple(temps),
                          domains=domains, prompts_per_domain=prompts, max_new_tokens=args.max_new_tokens,
                          max_prompt_tokens=args.max_prompt_tokens, device=args.device, dtype=args.dtype,
                          seed=args.seed, warmup=args.warmup, peer=not args.no_peer, library=not args.no_library,
                          traces=not args.no_traces,
                          cost_curves=not args.no_cost, cost_contexts=tuple(contexts) or None,
                          cost_max_tokens=args.cost_max_tokens, repeats=args.repeats,
                          cv_threshold=args.cv_threshold, drift_threshold=args.drift_threshold,
                          until_stable=args.until_stable, engine=args.engine, threads=args.threads,
                          cache=args.cache or CACHES[0], compile=args.compile, interleave=args.interleave,
                          prompts_file=str(args.prompts_file) if args.prompts_file else None,
                          until_decided=args.until_decided, regret=args.regret, confidence=args.confidence,
                          time_budget_s=args.time_budget,
                          prior=str(Path(args.prior).resolve()) if args.prior else None)
        if args.prior:
            from measure.prior import load_prior

            load_prior(args.prior, cfg.target, cfg.engine)  # no directory, not a calibration, another pair: one line
    except ValueError as e:
        fail(prog, str(e))
    _check_models(cfg)
    return cfg


def _check_models(cfg: SweepConfig) -> None:
    """Refuse (one line, exit 2, before any weights load and before the run directory) a model spec the
    transformers engine cannot load (:func:`measure.engines.transformers.models.check_model_spec`; llama.cpp's are
    checked by its ``check_specs``) and a sequence longer than the target or a ``model:`` draft was trained for
    (``--max-prompt-tokens 9000`` on a 1,024-position model was accepted, issue 32)."""
    from measure import costpoints
    from measure.engines import context_tokens
    from measure.engines.transformers.models import check_model_spec

    prog = "python -m measure"
    new, gamma = cfg.max_new_tokens, cfg.gamma_max
    longest = cfg.max_prompt_tokens + new + gamma
    models = [("target", cfg.target)] + [(f"draft {d}", d[len("model:"):]) for d in cfg.drafts
                                         if d.startswith("model:")]
    for role, spec in models:
        if cfg.engine == "transformers":
            try:
                check_model_spec(spec, "--target " if role == "target" else "--draft model:")
            except ValueError as e:
                fail(prog, str(e))
        window = context_tokens(cfg.engine, spec)
        if window is None:
            continue
        if longest > window:
            room, new_room = window - new - gamma, window - cfg.max_prompt_tokens - gamma
            fix = (f"valid: --max-prompt-tokens up to {room}" if room >= 1 else
                   f"valid: --max-new-tokens up to {new_room}" if new_room >= 1 else
                   "lower --max-prompt-tokens and --max-new-tokens")
            fail(prog, f"--max-prompt-tokens {cfg.max_prompt_tokens} + --max-new-tokens {new} + γ {gamma} = "
                       f"{longest} positions, more than the {window} the {role} ({spec}) was trained for; {fix}")
        reach = costpoints.context_bound(cfg)  # the cost points' longest sequence (sized to the run, or as given)
        if cfg.cost_curves and reach > window:
            n = costpoints.max_tokens_of(cfg)
            fail(prog, f"--cost-contexts {reach - n} + --cost-max-tokens {n} = {reach} positions, more than the "
                       f"{window} the {role} ({spec}) was trained for; valid: contexts up to {window - n}, "
                       "or --no-cost")


def _fmt(v: object, nd: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


class TablePrinter:
    """The sweep table, printed a row at a time as cells finish (fixed column widths)."""

    HEADS = ("draft", "gamma", "temp", "domain", "tok/s base [95% CI]", "tok/s spec [95% CI]", "tok/s peer",
             "speedup [95% CI]", "accept", "acc/rnd", "same", "base÷lib", "note")
    WIDTHS = (10, 8, 4, 12, 21, 21, 10, 19, 6, 7, 5, 8, 0)

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.started = False

    @staticmethod
    def _ci(row: CellRow, key: str, nd: int = 2) -> str:
        e = row.estimate(key)
        if e.value is None:
            return "-"
        if e.lo is None or e.hi is None:  # no interval: say why (measure.stats: fewer than 2 samples, or too noisy)
            n = (row.n_prompts or 0) * (row.repeats or 0)
            return f"{e.value:.{nd}f} " + (f"(n={n}, no CI)" if 0 < n < 2 else "(noisy, no CI)")
        return f"{e.value:.{nd}f} [{e.lo:.{nd}f},{e.hi:.{nd}f}]"

    def row(self, r: CellRow) -> None:
        """Print ``r`` (the header first, once)."""
        if not self.started:
            print("  ".join(h.ljust(w) for h, w in zip(self.HEADS, self.WIDTHS)).rstrip(), file=self.out)
            self.started = True
        notes = [f"UNSTABLE: {r.unstable_reason}"] if r.is_unstable else []
        near, bad = r.n_near_tie or 0, r.n_lossless_failures or 0
        if bad:
            notes.append(f"NOT LOSSLESS: {bad:g} greedy output(s) diverged beyond the near-tie tolerance")
        elif near:
            notes.append(f"{near:g} near tie(s): diverged where the target's top two logits were within the "
                         "engine's batch noise")
        from measure.sweep import LIBRARY_RATIO_TARGET

        lib_lo, lib_hi = LIBRARY_RATIO_TARGET
        if r.baseline_vs_library is not None and not lib_lo <= r.baseline_vs_library <= lib_hi:
            notes.append(f"OURS ÷ ENGINE'S OWN {self._ci(r, 'baseline_vs_library', 3)}: outside {lib_lo:g}–{lib_hi:g}")
        note = "; ".join(notes)
        vals = (r.draft, r.gamma_policy, _fmt(float(r.temperature), 1), r.domain,
                self._ci(r, "tokens_per_s_baseline"), self._ci(r, "tokens_per_s_speculative"),
                _fmt(r.tokens_per_s_peer), self._ci(r, "speedup", 3), _fmt(r.acceptance_rate),
                _fmt(r.mean_accepted_per_round), _fmt(r.outputs_identical), _fmt(r.baseline_vs_library, 3), note)
        print("  ".join(v.ljust(w) for v, w in zip(vals, self.WIDTHS)).rstrip(), file=self.out, flush=True)


def print_table(run: Run) -> None:
    """The whole run's table (every finished cell) and its summary in words."""
    from measure.sweep import summary_lines

    tp = TablePrinter()
    for r in run.rows(CellRow):
        tp.row(r)
    for line in summary_lines(run.summary):
        print(line)


def quiet_third_party() -> None:
    """Silence third-party loading output (transformers / huggingface_hub logs and progress bars)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass
    try:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    except ImportError:
        pass
    import warnings

    warnings.filterwarnings("ignore")


def _executor(args: argparse.Namespace):
    """The ``--executor`` settings; with ``ray``, Ray must import (one line naming the extra otherwise)."""
    from measure.executors import ExecutorConfig, import_ray

    if args.executor == "local":
        for flag, v in (("--ray-address", args.ray_address), ("--cpus-per-cell", args.cpus_per_cell),
                        ("--max-retries", args.max_retries)):
            if v is not None:
                fail("python -m measure", f"{flag} needs --executor ray (the local executor runs the cells here, "
                                          "one at a time)")
    try:
        ex = ExecutorConfig(kind=args.executor, ray_address=args.ray_address, cpus_per_cell=args.cpus_per_cell or 1,
                            max_retries=2 if args.max_retries is None else args.max_retries)
        if ex.kind == "ray":
            import_ray()
    except ValueError as e:
        fail("python -m measure", str(e))
    return ex


def _one(args, target: str, drafts: list[str], out: Path, command: str, check: dict | None) -> dict:
    from measure.executors import CellsFailed, run_sweep_distributed
    from measure.records import FingerprintMismatch, RunInterrupted
    from measure.sweep import run_sweep, summary_lines

    cfg = _config_from_args(args, target, drafts)
    printer = TablePrinter()
    print(f"\n{target} -> {out}", flush=True)
    executor = _executor(args)
    ui = dict(command=command, progress=lambda m: print(m, file=sys.stderr, flush=True), show_bar=not args.no_progress,
              on_cell=printer.row, force_new=args.force_new, system_check=check, quiet=args.quiet)
    try:
        if executor.kind == "local":
            run = run_sweep(cfg, out, **ui, extend=args.extend)
        else:
            run = run_sweep_distributed(cfg, out, executor, **ui, extend=args.extend)
    except CellsFailed as e:
        print(f"python -m measure: error: {e}", file=sys.stderr)
        raise SystemExit(1)
    except RunInterrupted as e:  # an engine's own process died (a native crash): finished visits are kept
        print(f"python -m measure: interrupted: {' '.join(str(e).split())}", file=sys.stderr)
        raise SystemExit(1)
    except FingerprintMismatch as e:
        fail("python -m measure", str(e))
    except ValueError as e:
        fail("python -m measure", str(e))
    synth = run.summary.get("synthetic")
    if synth:
        print("[SYNTHETIC weights: timing only, acceptance is not a measurement]")
    for line in summary_lines(run.summary):
        print(line)
    print(f"run directory: {run.path}")
    if args.track:  # after the run is on disk: the tracker reads it back, and cannot cost it
        from measure.tracking import track_run

        track_run(args.track, run.path, "python -m measure")
    return {"run_dir": str(run.path), "status": run.status, **run.summary}


def _early_checks(args: argparse.Namespace, out: Path) -> None:
    """Everything that needs no model: paths, the prompts file, contradictory flags."""
    prog = "python -m measure"
    if args.pair and (args.target or args.draft):
        fail(prog, f"--pair {args.pair!r} sets both target and draft; do not combine it with --target/--draft")
    if args.extend and args.force_new:
        fail(prog, "--extend adds cells to the run in --out; --force-new starts a new one there: give one of them")
    ignored = []  # flags the chosen engine or --no-cost would ignore (issue 32: refused, as sim does)
    if args.engine != "transformers":
        ignored += [(f, f"--engine {args.engine} has no such setting (transformers engine only)")
                    for f, given in (("--cache", args.cache is not None), ("--compile", args.compile)) if given]
    if args.no_cost:
        ignored += [(f, "--no-cost skips the cost curves") for f, v in
                    (("--cost-contexts", args.cost_contexts), ("--cost-max-tokens", args.cost_max_tokens))
                    if v is not None]
    if ignored:
        fail(prog, f"{ignored[0][0]} would be ignored: {ignored[0][1]}; drop it")
    if args.pair and args.prompts_file:
        fail(prog, "--pair uses synthetic random-weight models (timing only); --prompts-file is not used there")
    for flag, v in (("--target", args.target), ("--draft", args.draft), ("--pair", args.pair)):
        if v is not None and not str(v).strip():
            fail(prog, f"{flag} '': empty value")
    if out.exists() and not out.is_dir():
        fail(prog, f"--out {str(out)!r} is a file, not a directory; choose a directory path")
    parent = next((p for p in [out, *out.parents] if p.exists()), Path("."))
    if not os.access(parent, os.W_OK):
        fail(prog, f"--out {str(out)!r}: {str(parent)!r} is not writable")
    if args.prompts_file:
        from measure.prompts import load_prompts_file

        try:
            load_prompts_file(args.prompts_file)
        except ValueError as e:
            fail(prog, str(e))


def refuse_subcommand(argv: list[str]) -> None:
    """A leading word that is not an option names a subcommand (:mod:`measure.__main__` runs the known ones):
    one line listing the valid ones, exit 2."""
    if argv and not argv[0].startswith("-"):
        fail("python -m measure", f"unknown subcommand {argv[0]!r}; valid: {', '.join(SUBCOMMANDS)} "
                                  "(or options only: python -m measure --help)")


def build_llamacpp_main(argv: list[str]) -> int:
    """``python -m measure build-llamacpp``: :func:`measure.engines.llamacpp_native.install.install`."""
    from measure.engines.llamacpp_native.build import KINDS

    prog = "python -m measure build-llamacpp"
    p = OneLineParser(prog=prog, description="Build llama.cpp (the source llama-cpp-python pins) into a cache keyed "
                      "by version and flags, install llama-cpp-python over it, build llama-server and llama-bench "
                      "from the same source, and check which CPU variant runs here.")
    p.add_argument("--kind", default="portable", type=choice_arg("kind", KINDS),
                   help="portable: runs on every x86-64 CPU, the best CPU variant that passes a test decode is "
                        "used (default); native: this CPU only; cuda: portable CPU backends plus CUDA offload")
    p.add_argument("--jobs", type=int_arg(1, 1024), default=None, help="parallel compile jobs (default: all cores)")
    p.add_argument("--cmake-arg", action="append", default=[], metavar="-DX=Y",
                   help="an extra CMake flag (it becomes part of the build's cache key); repeatable")
    p.add_argument("--force", action="store_true", help="rebuild and re-check even if the cache has this build")
    p.add_argument("--no-bindings", action="store_true", help="build only; leave the installed llama-cpp-python")
    args = p.parse_args(argv)
    for a in args.cmake_arg:
        if not a.startswith("-D") or "=" not in a:
            fail(prog, f"--cmake-arg {a!r}: expected -DNAME=VALUE")
    from measure.engines.llamacpp_native.install import install
    from measure.records import strict_dumps

    try:
        done = install(args.kind, args.jobs, tuple(args.cmake_arg), args.force, bindings=not args.no_bindings)
    except (RuntimeError, ValueError, OSError) as e:
        print(f"{prog}: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    if done.selection is not None:
        print(done.selection.summary(), file=sys.stderr)
    print(strict_dumps(done.describe()))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m measure [options]``: the sweep; its table as cells finish, then one JSON line."""
    argv = sys.argv[1:] if argv is None else list(argv)
    refuse_subcommand(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    command = "python -m measure " + " ".join(shlex.quote(a) for a in argv)
    out = Path(args.out) if args.out else Path("runs") / time.strftime("measure-%Y%m%d-%H%M%S")
    _early_checks(args, out)
    args.track = usable_tracker(args.track, "python -m measure")  # a missing library: one line now, not after
    _executor(args)  # before any model loads: a bad --ray-address, or Ray missing
    drafts = _split_drafts(args.draft) if args.draft else list(DEFAULT_DRAFTS)
    target = args.target or DEFAULT_TARGET
    if not args.pair:
        _config_from_args(args, target, drafts)  # every flag checked before any model loads
    if args.quiet:
        quiet_third_party()
    from measure.devices import resolve_device

    try:
        device = resolve_device(args.device)
    except ValueError as e:
        fail("python -m measure", f"--device: {e}")
    check = None
    if not args.no_system_check:
        from measure.system import system_check

        check = system_check(device)
        for w in check["warnings"]:
            print(f"system check: {w}", file=sys.stderr)
    jobs: list[tuple[str, list[str], Path]] = []
    if args.pair:
        jobs.append(_pair_job(args.pair, out))
    else:
        jobs.append((target, drafts, out))
        no_model_args = args.target is None and args.draft is None
        if no_model_args and device.startswith("cuda"):
            jobs += [_pair_job(p, out.with_name(f"{out.name}-{p}")) for p in GPU_DEFAULT_PAIRS]
    results = []
    try:
        for target, drafts, o in jobs:
            results.append(_one(args, target, drafts, o, command, check))
    except KeyboardInterrupt as e:
        sig = "SIGTERM" if type(e).__name__ == "Terminated" else "interrupted"
        # a second Ctrl-C while the process winds down: exit now, then ignored in the shutdown; no traceback
        exit_on_next_interrupt(143 if sig == "SIGTERM" else 130)
        print(f"{sig}: finished cells are kept in {jobs[len(results)][2]} (re-run with the same --out "
              "to resume)", file=sys.stderr)
        return 143 if sig == "SIGTERM" else 130
    from measure.records import strict_dumps

    summary = results[0] if len(results) == 1 else {"runs": results}
    print(strict_dumps(summary))
    return 0


def _pair_job(name: str, out: Path) -> tuple[str, list[str], Path]:
    from presets.pairs import PAIRS

    if name not in PAIRS:
        fail("python -m measure", f"--pair {name!r}: unknown pair; valid: {', '.join(PAIRS)}")
    pair = PAIRS[name]
    return f"synthetic:{pair.target.name}", [f"model:synthetic:{pair.draft.name}"], out
