"""The bounds every CLI puts on the simulator's inputs, with the reason for each: one list, one set of limits.

``python -m sim``, ``python -m sim check`` and ``python -m calibrate ingest``
take the same knobs (draft length, context, the serving workload, seeds); they
check them against these numbers, so a value refused by one is refused by all.

* γ ≤ 64: the chance that 64 draft tokens in a row are all accepted is
  0.9^64 ≈ 0.001 even at α = 0.9, so longer drafts cannot pay;
* context ≤ 10^7 tokens (a pair's own window is checked where a pair is known);
* new tokens and requests ≤ 10^6 each, batch ≤ 4,096, arrival rate ≤ 10^6/s,
  and at most 10^7 simulated tokens per run: about a minute of simulation;
* cost ratio c (draft step / target step) ≤ 100: from c ≥ 1 on no speedup is
  possible at all, and far above it the speedup rounds to zero and the
  "what would have to be true" arithmetic overflows.
"""

from __future__ import annotations

GAMMA_LIMIT = 64
GAMMA_WHY = "0.9^64 = 0.001: a draft longer than 64 tokens is never accepted whole"
CONTEXT_LIMIT_TOKENS = 10_000_000
NEW_TOKENS_LIMIT = 1_000_000
REQUESTS_LIMIT = 1_000_000
MAX_BATCH_LIMIT = 4096
ARRIVAL_RATE_LIMIT_PER_S = 1_000_000.0
SIMULATED_TOKENS_LIMIT = 10_000_000
SEED_LIMIT = 2**63 - 1
COST_RATIO_LIMIT = 100.0
COST_RATIO_WHY = "a draft step costing c >= 1 target steps can never speed decoding up"
