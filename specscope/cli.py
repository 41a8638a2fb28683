"""``specscope COMMAND [ARGS...]``: one command for the loop, each subcommand one module's own CLI.

``specscope predict ARGS`` runs exactly what ``python -m sim ARGS`` runs (the
module's ``__main__``, through :func:`runpy.run_module`), and so on for every
row of :data:`COMMANDS`; the ``python -m`` forms keep working. A subcommand's
module is imported only when it runs, so ``specscope --help`` is instant and
``specscope predict`` never imports torch. A command whose module is still
being built (its ``requires`` module is missing) says so in one line, exit
status 2; it works the moment the module lands.

``specscope COMMAND --help`` prints the module's own options, then the
command's examples. Shell completion (bash/zsh, with the ``argcomplete``
package): ``eval "$(register-python-argcomplete specscope)"``.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.util
import os
import runpy
import sys
from dataclasses import dataclass
from typing import Sequence

from toolkit.cli import entry_point

PROG = "specscope"


@dataclass(frozen=True)
class Command:
    """One subcommand: ``specscope NAME ARGS`` runs ``python -m MODULE PREFIX... ARGS``."""

    name: str
    summary: str
    module: str
    prefix: tuple[str, ...] = ()
    examples: tuple[str, ...] = ()
    #: a module that must exist for the command to work (commands being built); None: always there
    requires: str | None = None
    #: ``module:function`` returning its argparse parser, for shell completion of its options (cheap imports only)
    parser: str | None = None
    #: the module's subcommands that, first in ARGS, come before ``prefix``: ``specscope tune serve ARGS`` runs
    #: ``python -m measure serve --until-decided ARGS``
    subcommands: tuple[str, ...] = ()

    @property
    def same_as(self) -> str:
        """The ``python -m`` form this command runs."""
        return " ".join(("python -m", self.module, *self.prefix))

    def module_args(self, argv: Sequence[str]) -> list[str]:
        """The module's arguments for ``specscope NAME ARGV``: the prefix, after a subcommand that leads ARGV."""
        if argv[:1] and argv[0] in self.subcommands:
            return [argv[0], *self.prefix, *argv[1:]]
        return [*self.prefix, *argv]

    def missing(self) -> str | None:
        """Why the command cannot run yet (one line), or ``None`` when it can."""
        if self.requires is None or importlib.util.find_spec(self.requires) is not None:
            return None
        return f"not available yet: `{self.same_as}` is still being built (no module {self.requires})"


# One row per subcommand; a command being built is enabled by its module landing (``requires``).
COMMANDS: tuple[Command, ...] = (
    Command("predict", "will speculation pay? closed form, event and serving simulation of a pair", "sim",
            examples=("specscope predict --preset llama3-1b-3b",
                      "specscope predict --preset llama3-8b-70b --hardware a100-80gb --tp 4 --alpha 0.7 --format json",
                      "specscope predict --preset llama3-1b-8b --mode serve --arrival-rate 20",
                      "specscope predict --preset llama3-1b-3b --chart predict.html",
                      "specscope predict --cost-model CAL/cost_model-ngram_3.json --acceptance CAL/acceptance-ngram_3.json"),
            parser="sim.cli:build_parser"),
    Command("check", "hold a published speedup claim against what the simulator says is possible", "sim", ("check",),
            examples=("specscope check --preset gpt2-small-large --hardware t4 --gamma 4 --speedup 2.5",
                      "specscope check --cost-ratio 0.02 --gamma 7 --alpha 0.75 --speedup 3.4",
                      "specscope check --claims"),
            parser="sim.check_cli:build_parser"),
    Command("measure", "measure real speculative decoding: a sweep of cells into a run directory", "measure",
            examples=("specscope measure",
                      "specscope measure --prompts 1 --max-new-tokens 16 --gamma 2,4 --domains code --out runs/small",
                      "specscope measure --draft ngram:3,int8 --gamma 1,2,4 --track wandb",
                      "specscope measure head-sweep --help")),
    Command("tune", "measure until the best draft/γ per domain (tune serve: k per load) is known, with a stated "
            "error rate", "measure", ("--until-decided",),
            examples=("specscope tune --gamma 1,2,4,8 --repeats 8",
                      "specscope tune --draft ngram:3,int8 --gamma 2,4 --regret 0.05 --time-budget 600 --out runs/tune",
                      "specscope tune --gamma 1,2,4,8 --prior results/cpu-smollm2-ngram-gammas-calibration",
                      "specscope tune serve --draft ngram:2 --gamma 2,4,8 --concurrency 1,4,8 --repeats 10 "
                      "--out runs/tune-serve"),
            subcommands=("serve",)),
    Command("serve", "measure a real server under load (continuous batching, speculative decoding)", "measure",
            ("serve",), requires="measure.serve",
            examples=("specscope serve --target smollm2-135m --draft ngram:3 --gamma 4 --concurrency 1,4 "
                      "--requests 8 --max-new-tokens 32 --out runs/serve",)),
    Command("calibrate", "fit the simulator to run directories; its error on held-out cells", "calibrate",
            examples=("specscope calibrate runs/small",
                      "specscope calibrate runs/a runs/b --holdout domain --out runs/cal",
                      "specscope calibrate runs/small --track mlflow")),
    Command("ingest", "an engine's own spec-decode metrics (vLLM, SGLang, llama.cpp, TGI) in, the best k out",
            "calibrate", ("ingest",),
            examples=("specscope ingest vllm.log --preset llama3-1b-8b --hardware h100-sxm",
                      "specscope ingest before.prom after.prom --preset llama3-8b-70b --tp 4 --explain",
                      "specscope ingest server.log bench.json --out runs/ingest --track wandb"),
            parser="calibrate.ingest.cli:build_parser"),
    Command("report", "the HTML report: predicted against measured, with charts", "reports",
            examples=("specscope report runs/small/calibration",
                      "specscope report runs/cal --out runs/report --no-png")),
    Command("advise", "engine configs to paste: the best k per load, from a serving run or benchmark files",
            "calibrate", ("serve",), requires="calibrate.serve_cli",
            examples=("specscope advise runs/serve",
                      "specscope advise --off guidellm-off.json --spec k=4:guidellm-k4.json --out runs/advice",
                      "specscope advise runs/serve --holdout-k none --holdout-loads none --out runs/serve/advice"),
            parser="calibrate.serve_cli:build_parser"),
)
BY_NAME = {c.name: c for c in COMMANDS}


def help_text() -> str:
    """``specscope --help``: the commands, what each runs, which are not available yet."""
    width = max(len(c.name) for c in COMMANDS)
    lines = [f"usage: {PROG} COMMAND [ARGS...]", f"       {PROG} COMMAND --help   (its options and examples)", "",
             "Predict, measure and explain the speedup of speculative decoding.", "",
             "commands (each runs the module on the right, which works on its own too):"]
    for c in COMMANDS:
        note = "  [not available yet]" if c.missing() else ""
        lines.append(f"  {c.name:<{width}}  {c.summary}{note}")
        lines.append(f"  {'':<{width}}  = {c.same_as}")
        for sub in c.subcommands:
            lines.append(f"  {'':<{width}}    {c.name} {sub} = python -m {c.module} {' '.join(c.module_args([sub]))}")
    lines += ["", "options:", "  -h, --help  this list", "  --version   the installed version", "",
              "shell completion (bash, zsh; needs argcomplete): eval \"$(register-python-argcomplete specscope)\""]
    return "\n".join(lines)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("specscope")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def _fail(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def run_module(cmd: Command, argv: Sequence[str]) -> int:
    """Run ``cmd``'s module as ``python -m`` would, with ``argv``; its exit status."""
    saved = sys.argv
    sys.argv = [cmd.same_as, *cmd.module_args(argv)]
    try:
        runpy.run_module(cmd.module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else _fail(str(code)))
    finally:
        sys.argv = saved
    return 0


def command_help(cmd: Command) -> int:
    """``specscope COMMAND --help``: what it is, the module's options, then the examples."""
    print(f"{PROG} {cmd.name}: {cmd.summary}")
    missing = cmd.missing()
    if missing:
        print(missing)
        return 2
    print(f"(runs `{cmd.same_as}`; its options follow)\n", flush=True)
    code = run_module(cmd, ["--help"])
    sys.stdout.flush()
    if cmd.examples:
        print("\nexamples:")
        for e in cmd.examples:
            print(f"  {e}")
    return code


def completion_parser(comp_line: str = "") -> argparse.ArgumentParser:
    """The parser shell completion walks: every command's name, and the options of the one being typed."""
    p = argparse.ArgumentParser(prog=PROG, description="Predict, measure and explain speculative decoding.")
    p.add_argument("--version", action="store_true")
    sub = p.add_subparsers(dest="command")
    words = comp_line.split()
    typing = words[1] if len(words) > 1 and (len(words) > 2 or comp_line.endswith(" ")) else None
    for c in COMMANDS:
        parents = []
        if c.name == typing and c.parser and not c.missing():
            module, func = c.parser.split(":")
            parents.append(getattr(importlib.import_module(module), func)())
        sub.add_parser(c.name, help=c.summary, parents=parents, add_help=False, conflict_handler="resolve")
    return p


def _complete() -> None:
    """Answer a shell-completion request (argcomplete sets ``_ARGCOMPLETE``) and exit; no-op otherwise."""
    if "_ARGCOMPLETE" not in os.environ:
        return
    try:
        import argcomplete
    except ImportError:
        sys.exit(1)
    argcomplete.autocomplete(completion_parser(os.environ.get("COMP_LINE", "")))


@entry_point
def main(argv: Sequence[str] | None = None) -> int:
    """``specscope``: dispatch to a subcommand's module; 2 with one line for an unknown command."""
    _complete()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["help"] and len(argv) > 2:  # help names one command; more words were silently dropped
        return _fail(f"help takes one command name, got {len(argv) - 1} words ({' '.join(argv[1:])!r}); e.g. "
                     f"{PROG} help {argv[1]}")
    if argv[:1] == ["help"] and len(argv) == 2:  # specscope help COMMAND = specscope COMMAND --help
        argv = [argv[1], "--help"]
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(help_text())
        return 0
    if argv[0] == "--version":
        print(f"{PROG} {_version()}")
        return 0
    cmd = BY_NAME.get(argv[0])
    if cmd is None:
        close = difflib.get_close_matches(argv[0], list(BY_NAME), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return _fail(f"unknown command {argv[0]!r}{hint} (valid: {', '.join(BY_NAME)}; see {PROG} --help)")
    if argv[1:] in (["-h"], ["--help"]):
        return command_help(cmd)
    missing = cmd.missing()
    if missing:
        return _fail(f"{cmd.name}: {missing}")
    return run_module(cmd, argv[1:])
