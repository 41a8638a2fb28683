"""A ``llama-server`` process on loopback: started on a free port, its log kept, stopped cleanly.

:class:`LlamaServer` is a context manager: it starts the server with the
configuration's flags on ``127.0.0.1`` and a free port (another port when the
one it picked was taken meanwhile), waits until ``/health`` answers ``ok``,
and on leaving — normally, on Ctrl-C, on SIGTERM (turned into an exception by
the run writer) or on an error — sends SIGTERM, then SIGKILL after a grace
period. Its output goes to a log file in the run directory. A server that
exits while starting is reported in one line with the last line of its log.
The server runs in its own process group and, on Linux, dies with the process
that started it (``PR_SET_PDEATHSIG``: SIGKILL when its parent dies), so a
harness that SIGKILLs ``measure serve`` leaves no server behind.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Callable

from measure.serve.units import ServeConfig
from toolkit.signals import deferred_signals, stop_process_group

HOST = "127.0.0.1"
START_TIMEOUT_S = 300.0
STOP_GRACE_S = 10.0
PORT_ATTEMPTS = 4
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child SIGKILLed when its parent dies (Linux ``prctl(PR_SET_PDEATHSIG)``),
    resolved here in the parent so the forked child only makes the call; None elsewhere (the process group is
    still stopped on every exit Python sees)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


class ServerDied(RuntimeError):
    """The server process exited while it was measured."""


def free_port() -> int:
    """A TCP port on loopback that nobody listens on now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class ServerSpec:
    """Everything the process is started with (the model, slots, threads, context, batch and configuration)."""

    binary: Path
    model: Path
    config: ServeConfig
    slots: int
    threads: int
    ctx_size: int
    batch_tokens: int = 2048
    extra_args: tuple[str, ...] = field(default=())

    def args(self, port: int) -> list[str]:
        return [str(self.binary), "-m", str(self.model), "--host", HOST, "--port", str(port),
                "-np", str(self.slots), "-c", str(self.ctx_size), "-t", str(self.threads),
                "-b", str(self.batch_tokens), "--metrics", "--no-webui",
                *self.config.server_args(self.slots), *self.extra_args]


def _log_tail(path: Path, n: int = 1) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-n:])


def _log_reason(path: Path) -> str:
    """Why the server stopped, from its log: its first error line that says what went wrong (``error loading
    model: tensor ... data is not within the file bounds``), else its last line."""
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    said = [ln for ln in lines if " E " in f" {ln} " and ("error" in ln.lower() or "failed" in ln.lower())]
    first = next((ln for ln in said if ": error" in ln), said[0] if said else None)
    return first.split(" E ", 1)[-1].strip() if first else (lines[-1] if lines else "")


class LlamaServer:
    """``with LlamaServer(spec, log_path) as srv:`` — ``srv.base_url`` serves until the block ends."""

    def __init__(self, spec: ServerSpec, log_path: Path) -> None:
        self.spec, self.log_path = spec, Path(log_path)
        self.proc: subprocess.Popen | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> "LlamaServer":
        try:
            for _ in range(PORT_ATTEMPTS):
                self.port = free_port()
                if self._start():
                    return self
                if not self._port_taken():
                    break
        except BaseException:  # Ctrl-C or SIGTERM while it starts: no process left behind
            self.stop()
            raise
        raise ValueError(f"llama-server did not start ({_log_reason(self.log_path) or 'no output'}); "
                         f"its log: {self.log_path}")

    def _port_taken(self) -> bool:
        tail = _log_tail(self.log_path, 5).lower()
        return "address already in use" in tail or "couldn't bind" in tail or "failed to bind" in tail

    def _start(self) -> bool:
        import httpx2

        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"# {' '.join(self.spec.args(self.port))}\n".encode())
            log.flush()
            with deferred_signals():  # an interrupt between fork and assignment would orphan the server
                self.proc = subprocess.Popen(self.spec.args(self.port), stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True,
                                             preexec_fn=_die_with_parent())
        deadline = time.monotonic() + START_TIMEOUT_S
        with httpx2.Client(timeout=5.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    return False
                try:
                    r = client.get(f"{self.base_url}/health")
                    if r.status_code == 200 and r.json().get("status") == "ok":
                        return True
                except (httpx2.HTTPError, ValueError):
                    pass
                time.sleep(0.2)
        self.stop()
        raise ValueError(f"llama-server did not answer /health within {START_TIMEOUT_S:.0f} s; its log: "
                         f"{self.log_path}")

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after :data:`STOP_GRACE_S`."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        stop_process_group(proc, STOP_GRACE_S, STOP_GRACE_S)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def died(self) -> ServerDied:
        """The error for a server found dead mid-run (its exit status and last log line)."""
        code = self.proc.poll() if self.proc is not None else None
        return ServerDied(f"llama-server exited{f' with status {code}' if code is not None else ''} during the "
                          f"measurement ({_log_tail(self.log_path) or 'no output'}); its log: {self.log_path}")
