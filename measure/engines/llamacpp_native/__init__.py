"""llama.cpp as its users run it: a portable build, a check before trusting it, and its own process.

Nothing in this package imports torch. Its modules run in three places:

* :mod:`.build` — ``python -m measure.engines.llamacpp_native.build``: builds the
  llama.cpp that llama-cpp-python pins (its vendored source) with runtime CPU
  dispatch (one CPU backend library per instruction-set level) into a
  project-owned cache keyed by version and flags, installs llama-cpp-python's
  Python package over it, and builds ``llama-server`` and ``llama-bench`` from
  the same source;
* :mod:`.probe` — the check before trusting a build: a tiny decode in a child
  process, per CPU variant, best first; a variant that crashes is never used;
* :mod:`.worker` — the llama.cpp engine's child process: every model, context
  and decode of ours runs there (the greedy baseline's token loop too), in
  llama.cpp's default runtime, with no torch in the process. :mod:`.client` is
  the parent's side of that conversation, and :mod:`.runtime` what the worker
  does with llama-cpp-python;
* :mod:`.reference` — a user's own llama-cpp-python process, started fresh
  beside the worker: the peer (``LlamaPromptLookupDecoding``) and the library
  baseline (plain ``Llama.generate``) run there, with the library's defaults.
"""
