"""``python -m calibrate RUN_DIR [RUN_DIR ...] [options]`` — calibrate run directories, whatever their kind.

The runs' kind picks the calibrator (:mod:`calibrate.kinds`): chain sweeps and
head sweeps (:mod:`calibrate.chain_cli`: cost and acceptance fits, held-out
MAPE, ``calibration.json``), a tree run (:mod:`calibrate.trees_cli`, also
``python -m calibrate trees RUN_DIR``), a serving run (:mod:`calibrate.serve_cli`,
also ``python -m calibrate serve RUN_DIR`` or benchmark files); runs of
different kinds given together are one line naming each run's kind.
``python -m calibrate ingest FILE...`` reads an engine's metrics instead
(:mod:`calibrate.ingest.cli`). Bad input: one-line error, exit status 2.
"""

from __future__ import annotations

import sys

from toolkit.cli import entry_point, fail

PROG = "python -m calibrate"


@entry_point
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["ingest"]:  # subcommand: an engine's spec-decode metrics and llama-bench costs -> sim
        from calibrate.ingest.cli import main as ingest_main

        return ingest_main(argv[1:])
    from calibrate.kinds import calibrator_for

    try:
        calibrator, args = calibrator_for(argv)
    except ValueError as exc:
        fail(PROG, exc)
    return calibrator.command(args)


if __name__ == "__main__":
    sys.exit(main())
