"""Which report a source directory gets: the registry of each kind of run's report, and the one dispatch.

A calibration is recognised by the file its kind's calibration is named by (``RunKind.calibration_file`` in
:mod:`measure.runkinds`), a run directory by its kind (:func:`measure.runkinds.read_kind`, through each report's
``find``); the report then contributes its sections to :func:`reports.builder.build`. Adding a kind of run is one
:class:`reports.builder.KindReport` here (its ``find``, ``read`` and ``pages``).
"""

from __future__ import annotations

from pathlib import Path

from measure.runkinds import RUN_KINDS
from reports import page, serving, trees
from reports.builder import KindReport

#: Every kind's report, in the order a source is tried: a directory holding two kinds' calibrations is reported
#: as the first (serving, then trees, then chains and head sweeps).
REPORTS: tuple[KindReport, ...] = (serving.REPORT, trees.REPORT, page.REPORT)


def find_report(src: Path) -> KindReport:
    """The report of the calibration ``src`` (or the run holding one); a one-line ``ValueError`` when it is
    neither, or a run without its calibration (naming the command that writes it)."""
    for report in REPORTS:
        if report.find(src) is not None:
            return report
    files = ", ".join(dict.fromkeys(k.calibration_file for k in RUN_KINDS.values()))
    raise ValueError(f"{str(src)!r} is neither a calibration directory ({files}) nor a run directory (run.json)")


__all__ = ["REPORTS", "find_report"]
