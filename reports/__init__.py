"""reports — Altair charts and the HTML report page (torch-free; the only plotting code).

:mod:`reports.charts` holds pure builders (DataFrame in, chart out) and
:func:`reports.charts.save_chart`; :mod:`reports.builder` is the one page builder,
fed sections by each kind of run (:mod:`reports.page` for chains and head sweeps,
:mod:`reports.trees`, :mod:`reports.serving`, with :mod:`reports.race` and
:mod:`reports.published`); :mod:`reports.kinds` picks a source's kind;
``python -m reports`` is the CLI.
"""
