"""Entry point: ``python -m sim`` — the prediction (:mod:`sim.cli`), or a subcommand.

``python -m sim check ...`` holds a claimed speedup against the simulator
(:mod:`sim.check_cli`); ``python -m sim tree ...`` answers token-tree questions
(:mod:`sim.tree_cli`); ``python -m sim validate`` predicts the published results (:mod:`sim.validate`). Dispatched here, so that the prediction's own module
imports neither (the subcommands use its helpers: the imports point one way).
"""

from __future__ import annotations

import sys
from typing import Sequence

from toolkit.cli import entry_point


@entry_point
def main(argv: Sequence[str] | None = None) -> int:
    """Run the subcommand ``argv`` names, else the prediction; the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["check"]:
        from sim.check_cli import main as check_main

        return check_main(argv[1:])
    if argv[:1] == ["tree"]:
        from sim.tree_cli import main as tree_main

        return tree_main(argv[1:])
    if argv[:1] == ["validate"]:
        from sim.validate import main as validate_main

        return validate_main(argv[1:])
    from sim.cli import main as predict_main

    return predict_main(argv)


if __name__ == "__main__":
    sys.exit(main())
