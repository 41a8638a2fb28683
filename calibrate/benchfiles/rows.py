"""What every benchmark-file reader returns: typed rows, the same for GuideLLM, ``vllm bench serve`` and
inference-perf (torch-free, no pandas).

A :class:`BenchFile` is one file (or one tool's output directory) as its tool wrote it: the tool, its
version and command line where the file carries them, the model and the loads it holds. A
:class:`BenchLoad` is one load (closed-loop concurrency or open-loop rate) run once: its requests as the
client saw them and, where the file or the ``/metrics`` scrapes beside it give them, the server's
speculative-decoding counters (:class:`SpecCounts`) over that load.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from measure.serve.units import LoadSpec
from toolkit.files import read_text
from toolkit.jsonio import loads

#: Largest benchmark file read (a GuideLLM report of thousands of requests is tens of MB).
MAX_FILE_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class BenchRequest:
    """One request: times from its send (``send_s`` from the load's first send), tokens, error."""

    send_s: float
    ttft_ms: float | None
    e2e_ms: float | None
    itl_ms: tuple[float, ...]  # gaps between streamed chunks after the first (empty when the file has none)
    prompt_tokens: int | None
    completion_tokens: int | None
    error: str | None = None
    draft_tokens: int | None = None  # per-request speculative metrics, where the server reported them
    accepted_tokens: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.e2e_ms is not None and self.ttft_ms is not None

    @property
    def tpot_ms(self) -> float | None:
        """(last − first token) / (tokens − 1), as ``measure serve`` computes it."""
        if not self.ok or not self.completion_tokens or self.completion_tokens < 2:
            return None
        assert self.e2e_ms is not None and self.ttft_ms is not None
        return (self.e2e_ms - self.ttft_ms) / (self.completion_tokens - 1)


@dataclass(frozen=True)
class SpecCounts:
    """The server's speculative-decoding counters over one load (deltas), and where they came from."""

    drafts: int
    draft_tokens: int
    accepted_tokens: int
    accepted_per_pos: tuple[int, ...] | None  # vLLM's unconditional definition; None when not reported
    source: str  # "file" (the benchmark file's own fields), "scrape" (/metrics before/after), "requests"

    def __post_init__(self) -> None:
        for name in ("drafts", "draft_tokens", "accepted_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} {getattr(self, name)}: a counter delta must be >= 0 (counters went "
                                 "backwards: the server restarted between the scrapes, or they are swapped)")
        if self.accepted_tokens > self.draft_tokens:
            raise ValueError(f"accepted tokens ({self.accepted_tokens}) exceed drafted tokens ({self.draft_tokens})")


@dataclass(frozen=True)
class BenchLoad:
    """One load run once: its requests (in send order), wall time and counters."""

    load: LoadSpec
    requests: tuple[BenchRequest, ...]
    duration_s: float  # first send to last token of the successful requests
    counts: SpecCounts | None
    label: str  # where in the file it is (``benchmark 2``, ``stage 0``)

    @property
    def ok_requests(self) -> list[BenchRequest]:
        return [r for r in self.requests if r.ok]


@dataclass(frozen=True)
class BenchFile:
    """One benchmark file (or tool output directory) as read: tool, version, command, model, loads."""

    path: str
    tool: str  # "guidellm", "vllm-bench-serve", "inference-perf"
    tool_version: str | None
    command: str | None
    model: str | None
    hardware: str | None
    loads: tuple[BenchLoad, ...]
    notes: tuple[str, ...] = ()

    def describe(self) -> dict:
        """For ``run.json``'s ``sources``."""
        return {"path": self.path, "tool": self.tool, "tool_version": self.tool_version, "command": self.command,
                "model": self.model, "hardware": self.hardware,
                "loads": [ld.load.to_str() for ld in self.loads], "notes": list(self.notes)}


class BenchFileError(ValueError):
    """A benchmark file that cannot be read: one line naming the file and what is wrong."""

    def __init__(self, path: str | Path, why: str) -> None:
        super().__init__(f"{path}: {why}")


def read_json_file(path: str | Path, tool: str = "benchmark") -> Any:
    """A JSON file's content (NaN/Infinity allowed, as Python's ``json.dump`` writes them); one line when the
    file is missing, empty, not text, or malformed or truncated JSON."""
    text = read_text(path, f"{tool} file", MAX_FILE_BYTES)
    try:
        return loads(text, str(path), constants=True)
    except json.JSONDecodeError as exc:
        end = " (the file ends there: truncated?)" if exc.pos >= len(text.rstrip()) - 1 else ""
        raise BenchFileError(path, f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}{end}") \
            from None


def number(path: str | Path, where: str, v: Any, allow_none: bool = True) -> float | None:
    """``v`` as a finite float (None passes when allowed); a one-line :class:`BenchFileError` otherwise."""
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
        raise BenchFileError(path, f"{where} is {v!r}, not a finite number")
    return float(v)


def count(path: str | Path, where: str, v: Any, allow_none: bool = True) -> int | None:
    """``v`` as a count >= 0 (None passes when allowed)."""
    x = number(path, where, v, allow_none)
    if x is None:
        return None
    if x < 0 or x != int(x):
        raise BenchFileError(path, f"{where} is {v!r}, not a count (an integer >= 0)")
    return int(x)


def duration_of(requests: list[BenchRequest]) -> float:
    """Seconds from the first send to the last token of the successful ``requests`` (0 when none)."""
    ok = [r for r in requests if r.ok]
    if not ok:
        return 0.0
    return max(r.send_s + (r.e2e_ms or 0.0) / 1000.0 for r in ok) - min(r.send_s for r in ok)
