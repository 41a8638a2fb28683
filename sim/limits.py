"""The bounds every CLI puts on the simulator's inputs, with the reason for each: one list, one set of limits.

``python -m sim``, ``python -m sim tree``, ``python -m sim check`` and
``python -m calibrate ingest`` take the same knobs (draft length, context, the
serving workload, cost ratio, seeds); they check them against these numbers,
and where a quantity is a flag they take its converter from here
(``*_ARG``), so a value refused by one is refused by all.

* γ ≤ 64: the chance that 64 draft tokens in a row are all accepted is
  0.9^64 ≈ 0.001 even at α = 0.9, so longer drafts cannot pay;
* context from 1 token (a decoding step attends at least to the token it
  decodes) to 10^7 tokens (a pair's own window is checked where a pair is known);
* new tokens and requests ≤ 10^6 each, batch ≤ 4,096, at most 10^7 simulated
  tokens per run: about a minute of simulation;
* arrival rate from 10^-3/s to 10^6/s: below one request per 1,000 s the
  simulated horizon of 10^6 requests (10^9 s) outgrows the resolution of the
  simulator's clock, and a rate that rounds the horizon to infinity left every
  latency zero (a division by zero);
* cost ratio c (draft step / target step) ≤ 100: from c ≥ 1 on no speedup is
  possible at all, and far above it the speedup rounds to zero and the
  "what would have to be true" arithmetic overflows;
* bytes per parameter from 1/8 (1-bit weights, the narrowest format there is)
  to 8 (float64, the widest): outside that range the number is a typo.
"""

from __future__ import annotations

from toolkit.cli import float_arg

GAMMA_LIMIT = 64
GAMMA_WHY = "0.9^64 = 0.001: a draft longer than 64 tokens is never accepted whole"
CONTEXT_MIN_TOKENS = 1.0
CONTEXT_LIMIT_TOKENS = 10_000_000
CONTEXT_WHY = "a decoding step attends at least to the token it decodes"
NEW_TOKENS_LIMIT = 1_000_000
REQUESTS_LIMIT = 1_000_000
MAX_BATCH_LIMIT = 4096
ARRIVAL_RATE_MIN_PER_S = 1e-3
ARRIVAL_RATE_LIMIT_PER_S = 1_000_000.0
ARRIVAL_RATE_WHY = "requests per second a simulated run can finish: 10^6 requests over at most 10^9 s"
SIMULATED_TOKENS_LIMIT = 10_000_000
SEED_LIMIT = 2**63 - 1
COST_RATIO_LIMIT = 100.0
COST_RATIO_WHY = "a draft step costing c >= 1 target steps can never speed decoding up"
BYTES_PER_PARAM_MIN = 0.125
BYTES_PER_PARAM_LIMIT = 8.0
BYTES_PER_PARAM_WHY = "from 1-bit weights (1/8 byte) to float64 (8 bytes)"

#: ``--context-tokens`` of every CLI (a pair's own window is checked once the pair is known).
CONTEXT_TOKENS_ARG = float_arg(CONTEXT_MIN_TOKENS, CONTEXT_LIMIT_TOKENS, why=CONTEXT_WHY)
#: ``--cost-ratio`` of every CLI: the Leviathan cost model's draft step / target step.
COST_RATIO_ARG = float_arg(0.0, COST_RATIO_LIMIT, why=COST_RATIO_WHY)
#: ``--arrival-rate`` (Poisson requests per second) of every CLI.
ARRIVAL_RATE_ARG = float_arg(ARRIVAL_RATE_MIN_PER_S, ARRIVAL_RATE_LIMIT_PER_S, why=ARRIVAL_RATE_WHY)
#: ``--bytes-per-param`` (weight precision) of every CLI.
BYTES_PER_PARAM_ARG = float_arg(BYTES_PER_PARAM_MIN, BYTES_PER_PARAM_LIMIT, why=BYTES_PER_PARAM_WHY)
