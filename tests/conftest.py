"""Shared test settings.

Hypothesis: the per-example deadline (200 ms) measures wall time, which on a
shared 2-core CI machine says more about the neighbours than about the code;
the property tests here check values, never speed (speed is benchmarked in
``benchmarks/``), so the deadline is off. ``derandomize`` makes every run draw
the same examples (seeded from each test), so a CI failure reproduces.

Ctrl-C: a shell without job control starts a background command with SIGINT
ignored, and an ignored signal stays ignored in every child, so the tests that
interrupt a child (``measure`` closing a run ``interrupted``) would see the
interrupt do nothing. The suite gives SIGINT its usual handler back, here in the
controller and in every xdist worker, so those tests test the code, not how the
suite was launched.
"""

import signal

from hypothesis import settings

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

settings.register_profile("specscope", deadline=None, derandomize=True)
settings.load_profile("specscope")
