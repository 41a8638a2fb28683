"""The one timer of ``measure``: wall-clock spans, repeated benchmarks, peak memory.

On CPU a span is ``time.perf_counter`` around the work. On CUDA the device is
synchronised before the span starts and before it ends, so a span measures
the wall-clock the host waits for the kernels (what a user's tokens/s sees);
:meth:`Timer.bench_cuda_events` times with CUDA events where only device time
is wanted. Warm-ups are run and thrown away before counted repeats, never
mixed with them.

    timer = Timer("cpu")
    with timer.span() as s:
        model(x)
    s.ms                                  # float milliseconds
    a = timer.mark(); work(); b = timer.mark(); timer.elapsed_ms(a, b)   # no sync until read
    timer.bench(lambda: model(x), warmup=1, repeats=5)   # list of counted ms
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch


@dataclass
class Span:
    """A finished (or running) timed span; ``ms`` is set on exit."""

    start_s: float = 0.0
    ms: float = float("nan")


class _SpanCtx:
    def __init__(self, timer: "Timer") -> None:
        self.timer = timer
        self.span = Span()

    def __enter__(self) -> Span:
        self.timer.sync()
        self.span.start_s = time.perf_counter()
        return self.span

    def __exit__(self, *exc: Any) -> None:
        self.timer.sync()
        self.span.ms = (time.perf_counter() - self.span.start_s) * 1e3


class Timer:
    """Times work on one device (``"cpu"`` or ``"cuda"``/``"cuda:N"``)."""

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        self.is_cuda = self.device.type == "cuda"

    def sync(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def now_s(self) -> float:
        """Synchronised ``perf_counter`` reading, seconds."""
        self.sync()
        return time.perf_counter()

    def mark(self) -> Any:
        """A time mark that costs no synchronisation: a recorded CUDA event, or a ``perf_counter`` reading.

        Read marks with :meth:`elapsed_ms` after the work (the decoding loop
        reads a generation's marks once it has finished, so per-phase timing
        adds no host sync to a round).
        """
        if self.is_cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    @staticmethod
    def elapsed_ms(start: Any, end: Any) -> float:
        """Milliseconds between two :meth:`mark` s (waits for ``end``'s event on CUDA)."""
        if isinstance(start, float):
            return (end - start) * 1e3
        end.synchronize()
        return float(start.elapsed_time(end))

    def span(self) -> _SpanCtx:
        """Context manager timing its body; yields a :class:`Span` whose ``ms`` is set on exit."""
        return _SpanCtx(self)

    def bench(self, fn: Callable[[], Any], warmup: int = 1, repeats: int = 5,
              setup: Callable[[], Any] | None = None) -> list[float]:
        """Run ``fn`` ``warmup`` times (discarded) then ``repeats`` times; return counted ms.

        ``setup`` (untimed) runs before every call, e.g. to roll a KV cache back.
        """
        if warmup < 0 or repeats < 1:
            raise ValueError(f"need warmup >= 0 and repeats >= 1, got warmup={warmup}, repeats={repeats}")
        out: list[float] = []
        for i in range(warmup + repeats):
            if setup is not None:
                setup()
            with self.span() as s:
                fn()
            if i >= warmup:
                out.append(s.ms)
        return out

    def bench_cuda_events(self, fn: Callable[[], Any], warmup: int = 1, repeats: int = 5) -> list[float]:
        """Device-side time of ``fn`` with CUDA events (CUDA only)."""
        if not self.is_cuda:
            raise ValueError("bench_cuda_events needs a CUDA device; use bench() on CPU")
        for _ in range(warmup):
            fn()
        out = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(float(start.elapsed_time(end)))
        return out

    # -- memory --------------------------------------------------------------------
    def reset_peak_memory(self) -> None:
        """Start a new peak-memory window (CUDA max allocated; Linux RSS high-water mark)."""
        if self.is_cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:  # writing 5 to clear_refs resets VmHWM (Linux >= 4.0)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass

    def peak_memory_bytes(self) -> int:
        """Peak memory since :meth:`reset_peak_memory`: CUDA max allocated, else process peak RSS."""
        if self.is_cuda:
            return int(torch.cuda.max_memory_allocated(self.device))
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(rss if os.uname().sysname == "Darwin" else rss * 1024)
