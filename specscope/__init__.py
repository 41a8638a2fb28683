"""specscope — the ``specscope`` command: one entry point for predict, check, measure, calibrate and report.

The top layer: :mod:`specscope.cli` maps each subcommand onto a module's own
CLI (``specscope predict`` is ``python -m sim``, ``specscope calibrate`` is
``python -m calibrate``, ...), importing it only when that subcommand runs.
Nothing imports this package (``tests/project/test_import_graph.py``).
"""
