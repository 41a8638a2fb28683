"""A CLI's ``main(argv)`` run in the test's own process and read back like a finished ``python -m ...``.

A subprocess per call costs 2-4 s on the 2-core CI machine (a fresh interpreter importing torch and
transformers) before the CLI checks its first flag; the tests of what a CLI does with its arguments (a bad
value is one line and exit status 2 before any model loads, a resume refused, a run measured) need the CLI's
code, not a new interpreter. :func:`run_main` calls ``main`` with stdout and stderr captured, turns
``SystemExit`` into the exit status as the interpreter would, and puts back what a CLI may change in its
process (environment variables, warning filters, transformers' log level, signal handlers, the working
directory), so the next test starts as this one did. An exception ``main`` lets out propagates: the test
fails on it, where a subprocess would have printed a traceback.

What only a real process shows (the ``python -m`` entry point, output while modules import, the interpreter's
shutdown, signals) is tested by the tests that still spawn one, for every CLI (``test_*_cli.py``).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Callable, Sequence

ROOT = Path(__file__).resolve().parents[2]


def _exit_status(exc: SystemExit, err: io.StringIO) -> int:
    """The status ``sys.exit(code)`` gives a process: an int as is, None 0, anything else printed and 1."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=err)
    return 1


@contextlib.contextmanager
def _process_state_kept():
    """Restore the environment, warning filters, transformers' verbosity, signal handlers and cwd on exit."""
    env = dict(os.environ)
    cwd = os.getcwd()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    hf = sys.modules.get("transformers.utils.logging")
    verbosity = hf.get_verbosity() if hf is not None else None
    try:
        with warnings.catch_warnings():
            yield
    finally:
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        for s, h in handlers.items():
            signal.signal(s, h)
        if hf is not None and verbosity is not None:
            hf.set_verbosity(verbosity)


def run_main(main: Callable[[Sequence[str]], int | None], argv: Sequence[str],
             cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``main(argv)`` in this process, in ``cwd``: its exit status, stdout and stderr as a ``CompletedProcess``."""
    out, err = io.StringIO(), io.StringIO()
    args = [str(a) for a in argv]
    with _process_state_kept(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        os.chdir(cwd)
        try:
            code = main(args) or 0
        except SystemExit as exc:
            code = _exit_status(exc, err)
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


#: the module whose ``main`` ``python -m PACKAGE`` calls (``specscope/__main__.py`` calls it at import)
_ENTRY = {"specscope": "specscope.cli"}


def run_module(package: str, argv: Sequence[str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``python -m PACKAGE ARGV`` in this process: :func:`run_main` of the ``main`` its ``__main__`` runs."""
    entry = importlib.import_module(_ENTRY.get(package, f"{package}.__main__"))
    return run_main(entry.main, argv, cwd)
