"""measure — real speculative decoding with PyTorch + transformers.

Importing the package must stay torch-free: :mod:`measure.records` (the run
directory format) and :mod:`measure.analysis` (what is computed from its
tables) are read by ``calibrate`` and ``reports`` on machines without torch.
Everything that needs torch lives in submodules.

Layout, in one-way layers (each imports only its own layer and those below;
``tests/project/test_import_graph.py`` holds the list, ``docs/ARCHITECTURE.md`` draws it):
the run format (``records``, ``stats``, ``analysis``: torch-free) → the
machine and the inputs (``timing``, ``system``, ``prompts``, ``devices``) →
the seam (``seam``: every protocol that crosses layers) → the loops, drafts
and heads written against it (``decoding``, ``drafts``, ``head``) → the engine
adapters (``engines/``) → the sweep (``sweep``) → executors and experiments
(``executors``, ``head.head_sweep``, ``head.head_recall``) → the command lines
(``cli``, ``head.cli``, ``__main__``).
"""
