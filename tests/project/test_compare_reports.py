"""benchmarks/compare_reports.py: two report folders compared file by file, timestamps masked (the script loaded
from its file, benchmarks/ is no package; the folders hand-made, no report written)."""

from __future__ import annotations

from pathlib import Path

from tests.support.scripts import load_benchmark


def _write(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def test_files_equal_but_for_a_timestamp_match_and_the_rest_are_named(tmp_path: Path) -> None:
    cmp = load_benchmark("compare_reports")
    before = _write(tmp_path / "a", {"report.html": b"<p>made 2026-11-27T13:00:00Z</p>", "x.png": b"\x89PNG1",
                                     "same.json": b"{}", "gone.csv": b"a\n"})
    after = _write(tmp_path / "b", {"report.html": b"<p>made 2026-11-28T09:30:05.25+00:00</p>", "x.png": b"\x89PNG2",
                                    "same.json": b"{}", "new/c.svg": b"<svg/>"})
    r = cmp.compare_dirs("src", before, after, (0, 0))
    assert (r.files, r.identical_bytes, r.identical_masked) == (3, 1, 2)
    assert r.differing == ("x.png",) and r.only_before == ("gone.csv",) and r.only_after == ("new/c.svg",)
    assert not r.same
    assert cmp.compare_dirs("src", before, before, (0, 0)).same
    assert not cmp.compare_dirs("src", before, before, (0, 2)).same, "one side failed"


def test_the_diff_shows_the_changed_tags(tmp_path: Path) -> None:
    cmp = load_benchmark("compare_reports")
    a = _write(tmp_path / "a", {"p.html": b"<title>old</title><h1>old</h1><p>same</p>"})
    b = _write(tmp_path / "b", {"p.html": b"<title>new</title><h1>old</h1><p>same</p>"})
    assert cmp.diff_lines(a / "p.html", b / "p.html") == ["-<title>old</title>", "+<title>new</title>"]
