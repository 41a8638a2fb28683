"""The calibrator of each kind of run, and the one dispatch of ``python -m calibrate RUN_DIR...`` by kind.

A run's kind is read with :func:`measure.runkinds.read_kind` (the registry is its only reader);
:data:`CALIBRATORS` gives each kind of :data:`measure.runkinds.RUN_KINDS` its calibrator: the subcommand that
names it (``python -m calibrate trees``; none for chain sweeps and head sweeps, which one calibration fits
together) and the command line that fits it (``main(argv) -> status``, imported when it runs, so a bad
argument fails before pandas and scipy load). :func:`calibrator_for` picks it for a command line: the
subcommand it starts with, else the kind of the run directories it names — runs of kinds that different
calibrators fit, given together, are one line naming each run's kind.

A fifth kind of run adds one entry here (and its ``RunKind.calibrate_command`` says the same subcommand).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from measure.runkinds import CHAIN, HEAD_SWEEP, SERVE, TREES, RunKind, read_kind


def _chains(argv: list[str]) -> int:
    from calibrate.chain_cli import main

    return main(argv)


def _trees(argv: list[str]) -> int:
    from calibrate.trees_cli import main

    return main(argv)


def _serve(argv: list[str]) -> int:
    from calibrate.serve_cli import main

    return main(argv)


@dataclass(frozen=True)
class Calibrator:
    """How a kind of run is calibrated: the subcommand that names it (None: none, ``python -m calibrate
    RUN_DIR``) and the command line that fits it."""

    subcommand: str | None
    command: Callable[[list[str]], int]

    @property
    def prog(self) -> str:
        """The command, as :attr:`measure.runkinds.RunKind.calibrate_command` names it."""
        return "python -m calibrate" + (f" {self.subcommand}" if self.subcommand else "")


CHAINS = Calibrator(None, _chains)
#: The calibrator of every kind of run (a test checks each kind of the registry has one).
CALIBRATORS: Mapping[RunKind, Calibrator] = {CHAIN: CHAINS, HEAD_SWEEP: CHAINS, TREES: Calibrator("trees", _trees),
                                             SERVE: Calibrator("serve", _serve)}
#: The subcommands that name a calibrator.
SUBCOMMANDS: Mapping[str, Calibrator] = {c.subcommand: c for c in CALIBRATORS.values() if c.subcommand}


def calibrator_for(argv: Sequence[str]) -> tuple[Calibrator, list[str]]:
    """The calibrator ``argv`` (``python -m calibrate``'s arguments) asks for, and the arguments it takes.

    A leading subcommand (``trees``, ``serve``) names it; else the kind of every argument that is a run
    directory (:func:`measure.runkinds.read_kind`; the calibrator reports what is not one), chains when none is.
    One-line ``ValueError`` for a run of a kind this specscope does not know, or runs of kinds that different
    calibrators fit, given together."""
    argv = list(argv)
    if argv and argv[0] in SUBCOMMANDS:
        return SUBCOMMANDS[argv[0]], argv[1:]
    found: list[tuple[str, RunKind]] = []
    for arg in argv:
        kind = None if arg.startswith("-") else read_kind(arg)
        if kind is not None:
            found.append((arg, kind))
    chosen = {CALIBRATORS[k] for _, k in found}
    if len(chosen) > 1:
        raise ValueError("the run directories are of different kinds: "
                         + ", ".join(f"{arg} ({kind.title})" for arg, kind in found)
                         + "; calibrate each kind on its own: "
                         + ", ".join(dict.fromkeys(f"{c.prog} RUN_DIR" for c in chosen)))
    return (chosen.pop() if chosen else CHAINS), argv


__all__ = ["CALIBRATORS", "CHAINS", "Calibrator", "SUBCOMMANDS", "calibrator_for"]
