"""Entry point: ``python -m measure`` — the sweep (:mod:`measure.cli`), or a subcommand.

``head-sweep`` and ``head-recall`` (:mod:`measure.head.cli`), ``serve``
(:mod:`measure.serve.cli`), ``tree`` (:mod:`measure.trees.cli`), ``build-llamacpp`` (:func:`measure.cli.build_llamacpp_main`) are dispatched here, so that each
command line imports the modules it runs and none imports another's (the
imports point one way).

Nothing of an engine's runtime is set here: llama.cpp runs in a process of its
own (:mod:`measure.engines.llamacpp_native.worker`) with the environment the
user gave, as their own ``Llama(...)`` would.
"""

from __future__ import annotations

import sys
from typing import Sequence

from toolkit.cli import entry_point


@entry_point
def main(argv: Sequence[str] | None = None) -> int:
    """Run the subcommand ``argv`` names, else the sweep; the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["head-sweep"]:  # the pruned draft head's K sweep, cells of the same sweep
        from measure.head.cli import head_sweep_main

        return head_sweep_main(argv[1:])
    if argv[:1] == ["head-recall"]:  # offline recall of the pruned-head selectors
        from measure.head.cli import head_recall_main

        return head_recall_main(argv[1:])
    if argv[:1] == ["serve"]:  # a real server under load
        from measure.serve.cli import main as serve_main

        return serve_main(argv[1:])
    if argv[:1] == ["tree"]:  # token trees (and chains) against the baseline
        from measure.trees.cli import main as tree_main

        return tree_main(argv[1:])
    from measure.cli import build_llamacpp_main, main as sweep_main

    if argv[:1] == ["build-llamacpp"]:  # a portable llama.cpp, its bindings and tools, checked on this CPU
        return build_llamacpp_main(argv[1:])
    return sweep_main(argv)


if __name__ == "__main__":
    sys.exit(main())
