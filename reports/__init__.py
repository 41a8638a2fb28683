"""reports — Altair charts and the HTML report page (torch-free; the only plotting code).

:mod:`reports.charts` holds pure builders (DataFrame in, chart out) and
:func:`reports.charts.save_chart`; :mod:`reports.page` assembles the report
from a run directory or a calibration directory; ``python -m reports`` is the CLI.
"""
