"""Token trees in ``measure``: tree drafts and one-forward tree verification, the tree experiment, its command.

* :mod:`measure.trees.loop` — the ``--tree`` option, tree drafters, :func:`~measure.trees.loop.verify_tree` and
  the decoding loop :func:`~measure.trees.loop.tree_generate` (a loop, written against the seam);
* :mod:`measure.trees.run` — the experiment: trees and chains against the baseline into a run directory;
* :mod:`measure.trees.cli` — ``python -m measure tree``.
"""
