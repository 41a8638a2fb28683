"""The parent's side of the llama.cpp worker and of the reference process: start one, ask it, notice when it dies.

:class:`LlamaCppWorker` starts ``python -m measure.engines.llamacpp_native.worker``
(or, with ``module="reference"``, the user's own llama-cpp-python process of
:mod:`.reference`) with one end of a socket pair and sends it ``(op, args)``
messages (:mod:`.worker` and :mod:`.reference` list them). A crash in native code kills only the worker: the
next call finds the socket closed, waits for the process and raises
:class:`WorkerDied` naming the signal, the operation and the pid — a
:class:`measure.records.RunInterrupted`, so a sweep keeps every finished visit,
closes its run ``interrupted`` and resumes.

The worker gets this process's environment unchanged (a user's own
``OMP_WAIT_POLICY`` or thread settings reach llama.cpp as they would in their
own ``Llama(...)``) and the directory this package is imported from on its
``PYTHONPATH``, so it runs the same code as the parent.
"""

from __future__ import annotations

import os
import subprocess
import sys
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from measure.engines.llamacpp_native.probe import outcome_of
from measure.records import RunInterrupted

_SOURCE_ROOT = Path(__file__).resolve().parents[3]  # the directory holding the ``measure`` package
WAIT_S = 10.0


class WorkerDied(RunInterrupted):
    """The llama.cpp worker process ended while a request was in flight (a native crash, a kill)."""

    def __init__(self, message: str, outcome: str, op: str) -> None:
        super().__init__(message)
        self.outcome, self.op = outcome, op


#: The processes this client starts: the engine's worker, and the reference (a user's own llama-cpp-python).
MODULES = ("worker", "reference")


class LlamaCppWorker:
    """One llama.cpp worker (or reference) process (see module docstring); ``close()`` ends it."""

    def __init__(self, quiet: bool = True, module: str = "worker") -> None:
        if module not in MODULES:
            raise ValueError(f"module {module!r}: valid: {', '.join(MODULES)}")
        self.module = module
        parent, child = Pipe(duplex=True)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_SOURCE_ROOT), env.get("PYTHONPATH")) if p)
        cmd = [sys.executable, "-m", f"measure.engines.llamacpp_native.{module}", str(child.fileno())]
        if quiet:
            cmd.append("--quiet")
        self._proc = subprocess.Popen(cmd, pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, env=env)
        child.close()
        self._conn: Connection | None = parent
        self.pid = self._proc.pid
        self.hello: dict = self.call("hello")

    def call(self, op: str, **args: Any) -> Any:
        """The worker's answer to ``op``; its ``ValueError`` re-raised as ``ValueError``, other errors as
        ``RuntimeError``; :class:`WorkerDied` if it dies meanwhile."""
        if self._conn is None:
            raise RuntimeError(f"the llama.cpp {self.module} (pid {self.pid}) was closed; no {op!r}")
        try:
            self._conn.send((op, args))
            reply = self._conn.recv()
        except (EOFError, OSError):
            raise self._died(op) from None
        if reply[0] == "ok":
            return reply[1]
        _, kind, message = reply
        raise (ValueError if kind == "ValueError" else RuntimeError)(message)

    def _died(self, op: str) -> WorkerDied:
        try:
            code = self._proc.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            code = self._proc.wait()
        self._conn = None
        outcome = outcome_of(code)
        return WorkerDied(f"the llama.cpp {self.module} process (pid {self.pid}) died ({outcome}) during {op!r}",
                          outcome, op)

    @property
    def alive(self) -> bool:
        return self._conn is not None and self._proc.poll() is None

    def close(self) -> None:
        """Ask the worker to exit (killed if it does not within a few seconds)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.send(("exit", {}))
                conn.recv()
            except (EOFError, OSError):
                pass
            conn.close()
        try:
            self._proc.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def __del__(self) -> None:
        if getattr(self, "_conn", None) is not None:
            self.close()
