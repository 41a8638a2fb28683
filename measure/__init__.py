"""measure — real speculative decoding with PyTorch + transformers.

Importing the package must stay torch-free: :mod:`measure.records` (the run
directory format) and :mod:`measure.analysis` (what is computed from its
tables) are read by ``calibrate`` and ``reports`` on machines without torch.
Everything that needs torch lives in submodules.

Layout: the sweep (``sweep``, ``cli``, ``executors``), its records and timer
(``records``, ``analysis``, ``prompts``, ``timing``, ``stats``, ``system``)
at the top; the decoding loops and drafts (``decoding``, ``drafts``,
``models``); ``engines/`` — one module per engine behind the engine seam;
``head/`` — the pruned vocabulary head, its kernels and its sweep.
"""
