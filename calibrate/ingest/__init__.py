"""calibrate.ingest — bring your own engine's numbers.

Reads the speculative-decoding metrics that serving engines already print or
export (vLLM, SGLang, llama.cpp, TGI) and llama-bench timings, converts every
figure to the project's definitions and hands the result to :mod:`sim`.

Modules:

* :mod:`calibrate.ingest.records` — the small frozen records: an engine
  figure as printed, one observation (a log line, a scrape, a request), the
  normalised acceptance record (conditional α_i with counts and Wilson
  intervals, acceptance rate, mean tokens per round including the bonus token,
  conversion notes).
* :mod:`toolkit.prometheus` — the Prometheus text exposition, line by line (shared with ``measure serve``).
* :mod:`calibrate.ingest.vllm`, :mod:`~calibrate.ingest.sglang`,
  :mod:`~calibrate.ingest.llamacpp`, :mod:`~calibrate.ingest.tgi` — one parser
  module per engine; :mod:`calibrate.ingest.llamabench` — llama-bench output as
  a cost model.
* :mod:`calibrate.ingest.normalise` — the conversions (unconditional →
  conditional, bonus token in or out, i.i.d. α implied by τ or by a rate) and
  the aggregation of observations into one record.
* :mod:`calibrate.ingest.detect` — which engine and format a file is.
* :mod:`calibrate.ingest.answer` — the record plus a cost model through
  :mod:`sim`: speedup per k, optimal k, break-even α, serving sweep.
* :mod:`calibrate.ingest.cli` — ``python -m calibrate ingest FILE...``.
"""
