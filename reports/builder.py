"""The one page builder: every report page — chains, trees, serving, the published claims — is drawn here.

A kind of run contributes an ordered list of :class:`Section` s (HTML fragments — headings, prose, tables — and
:class:`Figure` s, in reading order); :func:`write_report` turns them into pages: the skeleton and its style
sheet (:func:`page_html`), each figure inline as SVG (the page renders without network or JavaScript) and saved
beside the page as interactive HTML and PNG, the closing line naming the calibration the page was drawn from,
and the files. What each kind contributes is its own module's (:mod:`reports.page` for chains and head sweeps,
:mod:`reports.trees`, :mod:`reports.serving`, :mod:`reports.race`, :mod:`reports.published`); which kind a
source is, :mod:`reports.kinds`.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import altair as alt
import pandas as pd

from measure.runkinds import RunKind
from reports import charts

_CSS = """
body{font-family:system-ui,sans-serif;margin:20px 24px;max-width:1352px;color:#222;line-height:1.4}
h1{font-size:24px;margin:0 0 10px} h2{font-size:19px;margin:22px 0 8px}
.answer{border:2px solid #1a7f37;border-radius:8px;padding:10px 16px;background:#f6fbf7;margin:10px 0 16px}
.answer p{margin:6px 0} .answer .big{font-size:19px;font-weight:600} .answer ol{margin:6px 0 4px 20px;padding:0}
.answer li{margin:3px 0} .caveat{color:#9a6700} code{font-size:12px;overflow-wrap:anywhere}
.grid{display:flex;flex-wrap:wrap;gap:16px} .chart{border:1px solid #ddd;border-radius:6px;padding:8px;
  max-width:100%;overflow-x:auto} .chart h2{font-size:15px;margin:4px 0 8px}
table.tbl{border-collapse:collapse;font-size:13px;margin:8px 0 16px;max-width:100%}
table.tbl td,table.tbl th{padding:3px 8px;border-bottom:1px solid #eee;text-align:left;vertical-align:top;
  overflow-wrap:anywhere} table.tbl th{overflow-wrap:normal} table.tbl td.n{text-align:right;white-space:nowrap}
table.setup th{width:120px;color:#555;font-weight:600}
table.claims td{max-width:420px} table.claims td:last-child{min-width:360px}
table.claims td.n{text-align:right;white-space:nowrap}
.small{font-size:11px;color:#555;margin-top:2px} .unverified{font-size:11px;color:#cf222e;font-weight:600}
.verdict{color:#fff;border-radius:3px;padding:1px 5px;font-size:11px;font-weight:600;white-space:nowrap}
td.label{white-space:nowrap} .key{font-size:12px;color:#555;margin:-4px 0 6px;max-width:560px}
.flag{color:#9a6700;font-weight:600} .ok{color:#1a7f37} .bad{color:#cf222e} details{margin:10px 0}
"""


# -- what a kind contributes -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Figure:
    """A chart a page shows: inline as SVG, saved beside the page as ``<name>.html`` (interactive) and
    ``<name>.png``.

    With a ``title`` it is drawn as a card (``section.chart``: the title as its heading, the ``key`` saying how
    to read it, the chart, and — ``links`` — its interactive HTML and PNG); without, bare (``div.chart``) inside
    the HTML around it, its links a :class:`Links` of their own where the section wants them."""

    name: str
    chart: alt.TopLevelMixin
    title: str = ""
    key: str = ""
    links: bool = True


@dataclass(frozen=True)
class Links:
    """The links to a figure's interactive HTML and PNG, as a line of their own."""

    name: str


Part = str | Figure | Links


@dataclass(frozen=True)
class Section:
    """One block of a page, in reading order: HTML fragments (headings, prose, tables, already escaped) and the
    figures and links the builder draws between them."""

    parts: tuple[Part, ...] = ()


@dataclass(frozen=True)
class Page:
    """A page: its title (the ``<title>`` and the ``<h1>``), its sections, the calibration it was drawn from (named
    in its closing line, with ``closing`` after it; None: no closing line), the text between its blocks and its
    file name."""

    title: str
    sections: tuple[Section, ...]
    source: Path | None = None
    closing: str = ""
    sep: str = ""
    file: str = "report.html"


@dataclass(frozen=True)
class ReportResult:
    """Where the report went (``claims_path``: the page of published claims, linked from the report)."""

    html_path: Path
    png_paths: tuple[Path, ...]
    charts: tuple[str, ...]
    calibration_dir: Path
    claims_path: Path | None = None


@dataclass(frozen=True)
class KindReport:
    """How the report of some kinds of run is made: ``find`` its calibration in a source directory (the
    calibration itself, or a run holding one; None: not of these kinds; a run without its calibration is one
    ``ValueError`` line), ``read`` it whole and checked before anything is drawn, then its ``pages`` from what was
    read (the report first, then the pages it links to). Its folder is ``report/`` in the calibration, or, with
    ``report_in_source``, in the directory given (a chain run's ``report/`` beside its ``calibration/``)."""

    kinds: tuple[RunKind, ...]
    find: Callable[[Path], Path | None]
    read: Callable[[Path], Any]
    pages: Callable[[Path, Any], tuple[Page, ...]]
    report_in_source: bool = False

    def out_dir(self, src: Path, cal_dir: Path, out: str | Path | None) -> Path:
        """Where the report of ``src`` (its calibration ``cal_dir``) goes: ``out``, else its default folder."""
        return Path(out) if out else (src if self.report_in_source else cal_dir) / "report"


# -- drawing -----------------------------------------------------------------------------------------------------
def page_html(title: str, body: str) -> str:
    """A whole page: ``body`` under the report's style sheet."""
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{_CSS}</style></head><body>\n{body}\n</body></html>\n")


def table_html(df: pd.DataFrame, floatfmt: str = "{:.3g}") -> str:
    """``df`` as the page's HTML table (no index; floats as ``floatfmt``; missing values as a dash)."""
    return df.to_html(index=False, border=0, classes="tbl", na_rep="—",
                      float_format=lambda v: floatfmt.format(v))


def number_or_dash(v: object, fmt: str) -> str:
    """``v`` as ``fmt``, a dash when it is missing (None or NaN), as the page's tables show a missing value."""
    return "—" if v is None or (isinstance(v, float) and pd.isna(v)) else fmt.format(v)


def make_out_dir(out: Path) -> Path:
    """Create the report's output directory ``out``; one-line ``ValueError`` when it cannot be made."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot create output directory {str(out)!r}: {exc.strerror or exc}") from None
    return out


@dataclass(frozen=True)
class Drawn:
    """Sections as HTML, with the figures drawn (their names, in order) and the PNGs saved."""

    html: str
    figures: tuple[str, ...]
    pngs: tuple[Path, ...]


def _figure_html(fig: Figure, svg: str, png: bool) -> str:
    if not fig.title:
        return f"<div class='chart'>{svg}</div>"
    key = f'<p class="key">{html.escape(fig.key)}</p>' if fig.key else ""
    links = (f'<p><a href="{fig.name}.html">interactive</a>' + (f' · <a href="{fig.name}.png">PNG</a>' if png else "")
             + "</p>") if fig.links else ""
    return f'<section class="chart" id="{fig.name}"><h2>{html.escape(fig.title)}</h2>{key}{svg}{links}</section>'


def _links_html(name: str, png: bool) -> str:
    return f"<p><a href='{name}.html'>interactive chart</a>" + (f" · <a href='{name}.png'>PNG</a>" if png else "") \
        + "</p>"


def draw(sections: Sequence[Section], out: Path | None = None, png: bool = False, sep: str = "") -> Drawn:
    """``sections`` as HTML, joined by ``sep``; with ``out``, each figure saved there as ``<name>.html`` (and, with
    ``png``, ``<name>.png``, which its links then name). Without ``out`` nothing is written: a fragment to embed."""
    blocks, names, pngs = [], [], []
    for section in sections:
        text = ""
        for part in section.parts:
            if isinstance(part, Figure):
                svg = charts.chart_svg(part.chart, f"{part.name}.html")
                if out is not None:
                    charts.save_chart(part.chart, out / f"{part.name}.html")
                    if png:
                        pngs.append(charts.save_chart(part.chart, out / f"{part.name}.png"))
                names.append(part.name)
                text += _figure_html(part, svg, png)
            elif isinstance(part, Links):
                text += _links_html(part.name, png)
            else:
                text += part
        blocks.append(text)
    return Drawn(sep.join(blocks), tuple(names), tuple(pngs))


def write_page(out: Path, page: Page, png: bool) -> tuple[Path, Drawn]:
    """Write ``page`` into ``out`` (its figures beside it); its path and what was drawn."""
    drawn = draw(page.sections, out, png, page.sep)
    closing = () if page.source is None else (
        f"<p>Calibration: <code>{html.escape(str(page.source.resolve()))}</code>.{page.closing}</p>",)
    body = page.sep.join((f"<h1>{html.escape(page.title)}</h1>", *((drawn.html,) if page.sections else ()),
                          *closing))
    path = out / page.file
    path.write_text(page_html(page.title, body), encoding="utf-8")
    return path, drawn


def write_report(out: Path, pages: Sequence[Page], png: bool = True) -> ReportResult:
    """Write the report ``pages[0]`` and the pages it links to (``pages[1:]``: the published claims) into ``out``
    (made here), each figure beside them."""
    make_out_dir(out)
    report, *linked = pages
    path, drawn = write_page(out, report, png)
    others = [write_page(out, p, png) for p in linked]
    assert report.source is not None, "a report names the calibration it was drawn from"
    return ReportResult(path, drawn.pngs + tuple(p for _, d in others for p in d.pngs),
                        drawn.figures + tuple(n for _, d in others for n in d.figures), report.source,
                        others[0][0] if others else None)


def build(report: KindReport, src: str | Path, out: str | Path | None = None, png: bool = True,
          check_out: Callable[[Path], object] | None = None) -> ReportResult:
    """The report of ``src`` (a calibration of ``report``'s kinds, or a run holding one) into ``out`` (default:
    :meth:`KindReport.out_dir`), the calibration read and checked whole before ``check_out`` (``out`` given) and
    anything drawn; one ``ValueError`` line when ``src`` is not such a directory."""
    src = Path(src)
    cal_dir = report.find(src)
    if cal_dir is None:
        kind = report.kinds[0]
        raise ValueError(f"{str(src)!r} is not a {kind.title.split()[0]} calibration ({kind.calibration_file}) or a "
                         f"{kind.title}")
    files = report.read(cal_dir)
    out_dir = report.out_dir(src, cal_dir, out)
    if check_out is not None:
        check_out(out_dir)
    return write_report(out_dir, report.pages(cal_dir, files), png)


__all__ = ["Drawn", "Figure", "KindReport", "Links", "Page", "ReportResult", "Section", "build", "draw",
           "make_out_dir", "number_or_dash", "page_html", "table_html", "write_page", "write_report"]
