"""reports.builder: the one page builder — a made-up kind's sections drawn into one page, in their order, and
a made-up kind's report built through the same path ``python -m reports`` takes."""

from __future__ import annotations

import json
from pathlib import Path

import altair as alt
import pandas as pd
import pytest

from measure.ids import CellId
from measure.rows import CellRow
from measure.runkinds import RunKind
from reports.builder import Figure, KindReport, Links, Page, Section, build, draw, write_report

BEAMS = RunKind("beams", "beam run", "python -m measure beams", (CellRow,), CellId, resumes=True, extends=False,
                calibrate_command="python -m calibrate beams", calibration_file="beam_calibration.json",
                calibration_dir="calibration")


def _chart() -> alt.Chart:
    return alt.Chart(pd.DataFrame({"width": [1, 2, 4], "speedup": [1.1, 1.3, 1.2]})).mark_line().encode(
        x="width:Q", y="speedup:Q")


def _sections() -> tuple[Section, ...]:
    return (Section(("<h2 id='answer'>Beams pay at width 2</h2>",)),
            Section((Figure("speedup_vs_width", _chart(), "Speedup against beam width", key="Line: measured."),)),
            Section(("<p>between</p>", Figure("bare", _chart()), "<p>after the bare chart</p>", Links("bare"))),
            Section(("<p>the last words</p>",)))


def test_a_new_kinds_sections_make_one_page_in_their_order(tmp_path: Path) -> None:
    res = write_report(tmp_path / "rep", [Page("specscope beam report: <w>", _sections(), source=tmp_path)],
                       png=False)
    page = res.html_path.read_text()
    marks = ["<title>specscope beam report: &lt;w&gt;</title>", "<h1>specscope beam report: &lt;w&gt;</h1>",
             "Beams pay at width 2", '<section class="chart" id="speedup_vs_width"><h2>Speedup against beam width',
             '<p class="key">Line: measured.</p><svg', '<a href="speedup_vs_width.html">interactive</a></p>',
             "<p>between</p>", "<div class='chart'><svg", "<p>after the bare chart</p>",
             "<p><a href='bare.html'>interactive chart</a></p>", "<p>the last words</p>",
             f"<p>Calibration: <code>{tmp_path.resolve()}</code>.</p>"]
    at = [page.find(m) for m in marks]
    assert -1 not in at, [m for m, i in zip(marks, at) if i < 0]
    assert at == sorted(at), "the sections in the order given"
    assert page.startswith("<!doctype html>") and page.count("<svg") == 2 and "PNG" not in page
    assert res.charts == ("speedup_vs_width", "bare") and res.png_paths == () and res.claims_path is None
    assert sorted(p.name for p in (tmp_path / "rep").iterdir()) == ["bare.html", "report.html",
                                                                   "speedup_vs_width.html"]


def test_a_fragment_draws_without_writing_and_blocks_join_by_sep() -> None:
    drawn = draw((Section(("<p>a</p>",)), Section(()), Section(("<p>b</p>",))), sep="\n")
    assert drawn.html == "<p>a</p>\n\n<p>b</p>" and drawn.figures == () and drawn.pngs == ()


def _beam_pages(cal: Path, doc: dict) -> tuple[Page, ...]:
    return (Page(f"specscope beam report: width {doc['best_width']}", _sections(), source=cal),
            Page("Linked", (Section(("<p>a page of its own</p>",)),), file="claims.html"))


def _read(cal: Path) -> dict:
    doc = json.loads((cal / BEAMS.calibration_file).read_text())
    if "best_width" not in doc:
        raise ValueError(f"{cal / BEAMS.calibration_file} has no 'best_width'")
    return doc


BEAM_REPORT = KindReport((BEAMS,), lambda src: src if (src / BEAMS.calibration_file).is_file() else None, _read,
                         _beam_pages)


def test_a_made_up_kind_is_reported_by_one_entry(tmp_path: Path) -> None:
    cal = tmp_path / "cal"
    cal.mkdir()
    (cal / BEAMS.calibration_file).write_text(json.dumps({"best_width": 2}))
    res = build(BEAM_REPORT, cal, png=False)
    assert res.html_path == cal / "report" / "report.html" and res.calibration_dir == cal
    assert "<h1>specscope beam report: width 2</h1>" in res.html_path.read_text()
    assert res.claims_path == cal / "report" / "claims.html"
    assert "a page of its own" in res.claims_path.read_text()
    with pytest.raises(ValueError, match=r"is not a beam calibration \(beam_calibration.json\) or a beam run"):
        build(BEAM_REPORT, tmp_path, png=False)


def test_a_calibration_is_read_whole_before_anything_is_made(tmp_path: Path) -> None:
    cal = tmp_path / "cal"
    cal.mkdir()
    (cal / BEAMS.calibration_file).write_text("{}")
    checked: list[Path] = []
    with pytest.raises(ValueError, match="has no 'best_width'"):
        build(BEAM_REPORT, cal, tmp_path / "rep", check_out=checked.append)
    assert not checked and not (tmp_path / "rep").exists()
