"""Hold Ctrl-C and SIGTERM back for a few statements that must not be cut in two.

``with deferred_signals():`` records SIGINT and SIGTERM instead of handling them, and
on leaving the block delivers each recorded one to the handler that was in place
(so Ctrl-C raises ``KeyboardInterrupt`` and the run writer's SIGTERM handler raises
its exception) — after the block, never inside it. The use: starting a child
process and keeping its handle (``self.proc = Popen(...)``); an interrupt between
the fork and the assignment would leave a live process nobody can stop.

Handlers can only be replaced from the main thread; elsewhere the block runs as is.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

DEFERRED = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def deferred_signals(signals: tuple[signal.Signals, ...] = DEFERRED) -> Iterator[None]:
    """Run the block with ``signals`` recorded, then deliver them (in arrival order, each once)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    seen: list[int] = []

    def record(signum: int, _frame: FrameType | None) -> None:
        if signum not in seen:
            seen.append(signum)

    previous = {sig: signal.signal(sig, record) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: set outside Python
        for signum in seen:
            signal.raise_signal(signum)


def stop_process_group(proc: subprocess.Popen, term_wait_s: float, kill_wait_s: float) -> None:
    """Stop a child started in a process group of its own (``start_new_session``): SIGTERM to the group, then
    SIGKILL if it has not exited within ``term_wait_s``; returns once it exited or ``kill_wait_s`` more passed."""
    for sig, wait_s in ((signal.SIGTERM, term_wait_s), (signal.SIGKILL, kill_wait_s)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
