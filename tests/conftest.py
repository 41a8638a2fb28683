"""Shared test settings.

Hypothesis: the per-example deadline (200 ms) measures wall time, which on a
shared 2-core CI machine says more about the neighbours than about the code;
the property tests here check values, never speed (speed is benchmarked in
``benchmarks/``), so the deadline is off. ``derandomize`` makes every run draw
the same examples (seeded from each test), so a CI failure reproduces.
"""

from hypothesis import settings

settings.register_profile("specscope", deadline=None, derandomize=True)
settings.load_profile("specscope")
