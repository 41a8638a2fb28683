"""``python -m measure serve``: a real server under load, with and without speculative decoding.

Starts llama.cpp's own ``llama-server`` on loopback for each configuration
(speculation off; an n-gram draft with draft length k; slots), or measures an
already-running OpenAI-compatible server (``--url``), and drives it with a
closed-loop concurrency or seeded Poisson arrivals, streaming. Per request:
TTFT, every inter-token time, end-to-end latency, tokens and the server's
``timings``; per unit (one load on one configuration in one repeat) the
``/metrics`` counter deltas. Baseline and speculative configurations
alternate in blocks and are repeated, so throughput and the latency
percentiles each get a 95% CI. Synthetic-acceptance units
(``--step-cost``) time what one server step costs by batch composition.

Modules, one way down: ``cli`` (argv, printing) → ``runner`` (blocks, resume)
→ ``server`` (the llama-server process), ``client`` (the load generator),
``binary`` (where llama-server is) → ``units`` (torch-free: identities,
typed rows, the run writer, summaries; what ``calibrate`` reads).
"""
