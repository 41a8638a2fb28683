"""The Prometheus text exposition format, read line by line.

A scrape is ``# HELP``/``# TYPE`` comments and samples
``name{label="value",...} number [timestamp]``. Lines that are neither (a
truncated copy, a shell prompt) are counted as skipped, never fatal: that is
why this is a small line parser rather than ``prometheus_client``'s parser,
which rejects the whole file on the first bad line. ``NaN`` and ``±Inf`` values
are kept as read: whoever uses a sample checks it (``calibrate.ingest.records.check_counters``),
so a NaN counter is refused by name instead of vanishing from a sum. ``calibrate
ingest`` reads users' scrapes with it and ``measure serve`` the servers it measures.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)"
    r"(?:\{(?P<labels>[^}]*)\})?"
    r"\s+(?P<value>[-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|NaN|[-+]?Inf))"
    r"(?:\s+-?[0-9]+)?\s*$"
)
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


@dataclass(frozen=True)
class Sample:
    """One sample line: metric name, labels (sorted pairs) and value."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str, default: str = "") -> str:
        return dict(self.labels).get(key, default)


@dataclass(frozen=True)
class Scrape:
    """The samples of one scrape, the number of comment lines and of unreadable lines."""

    samples: tuple[Sample, ...]
    comments: int
    skipped: int

    def named(self, *names: str) -> list[Sample]:
        """Samples whose name is one of ``names``."""
        return [s for s in self.samples if s.name in names]

    def has_prefix(self, prefix: str) -> bool:
        return any(s.name.startswith(prefix) for s in self.samples)


def _labels(text: str) -> tuple[tuple[str, str], ...] | None:
    out = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if m is None:
            return None
        out.append((m.group(1), m.group(2)))
        pos = m.end()
    return tuple(sorted(out))


def parse_scrape(text: str) -> Scrape:
    """Read an exposition; blank lines are ignored, unreadable lines counted in ``skipped``."""
    samples: list[Sample] = []
    comments = skipped = 0
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            comments += 1
            continue
        m = _SAMPLE.match(line)
        labels = _labels(m.group("labels") or "") if m else None
        if m is None or labels is None:
            skipped += 1
            continue
        value = float(m.group("value").replace("Inf", "inf"))
        samples.append(Sample(m.group("name"), labels, value))
    return Scrape(tuple(samples), comments, skipped)


def looks_like_scrape(text: str) -> bool:
    """At least one sample line and more sample/comment lines than anything else."""
    s = parse_scrape(text)
    return len(s.samples) > 0 and len(s.samples) + s.comments > s.skipped


def sample_text(s: Sample) -> str:
    """A sample as the exposition writes it: ``name{label="value",...}``."""
    return s.name + ("{" + ",".join(f'{k}="{v}"' for k, v in s.labels) + "}" if s.labels else "")


def counter_delta(before: Scrape, after: Scrape, base: str, where: dict[str, str] | None = None) -> float | None:
    """A counter's increase between two scrapes of one server (None when either lacks it)."""
    a, b = counter_total(before, base, where), counter_total(after, base, where)
    return None if a is None or b is None else b - a


def counter_total(scrape: Scrape, base: str, where: dict[str, str] | None = None) -> float | None:
    """Sum of a counter over its label sets (engines, models), under ``base`` or ``base_total``.

    ``where`` restricts to samples carrying those label values. None when absent.
    """
    hits = [s for s in scrape.named(base, base + "_total")
            if not where or all(s.label(k) == v for k, v in where.items())]
    if not hits:
        return None
    return float(sum(s.value for s in hits))
