"""toolkit — the neutral bottom layer: small utilities every specscope package may use.

Nothing here knows about speculative decoding. It holds what would otherwise
be written once per package: the one-line-error argument toolkit every CLI
shares, strict JSON, file hashing, the experiment-tracker adapters. It
imports no other specscope package (``tests/project/test_import_graph.py``), so
``presets``, ``sim``, ``measure``, ``calibrate`` and ``reports`` can all use it.
"""
