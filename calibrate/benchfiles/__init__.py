"""Serving benchmark files users already produce, read into the serving rows a ``measure serve`` run has.

One reader per tool, each returning typed rows (:mod:`calibrate.benchfiles.rows`):
:mod:`~calibrate.benchfiles.guidellm` (GuideLLM 0.8 ``benchmarks.json``),
:mod:`~calibrate.benchfiles.vllm_bench` (``vllm bench serve --save-result --save-detailed``),
:mod:`~calibrate.benchfiles.inference_perf` (inference-perf report directories);
:mod:`~calibrate.benchfiles.detect` tells them apart and reads the ``/metrics`` scrapes beside them;
:mod:`~calibrate.benchfiles.dataset` turns the files of every configuration into a
:class:`calibrate.serve.ServeData`, which ``python -m calibrate serve`` calibrates as it calibrates a run
(:mod:`~calibrate.benchfiles.cli`). Torch-free.
"""
