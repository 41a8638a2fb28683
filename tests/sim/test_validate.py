"""``python -m sim validate`` on a small table written by the test."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim import kernels
from sim.validate import is_held_out, main

ROW = '''
[[result]]
id = "{id}"
target = "{target}"
draft_kind = "{draft}"
hardware = "{hw}"
engine = "sglang"
batch = 1
gamma = 3
acceptance = 2.9
acceptance_kind = "tau_incl_bonus"
baseline_tok_s = 190.0
spec_tok_s = 404.0
tok_s_kind = "total"
source = "a test"
cells = "written by the test"
'''


@pytest.fixture()
def table(tmp_path: Path) -> Path:
    rows = [ROW.format(id=f"row-{i}", target="Llama-3.2-1B", draft="eagle3", hw="l4") for i in range(4)]
    rows.append(ROW.format(id="tree-row", target="Llama-3.2-1B", draft="eagle3", hw="l4").replace(
        "gamma = 3", "gamma = 3\ntree_topk = 4\ntree_num_draft_tokens = 8"))
    rows.append(ROW.format(id="lookahead-row", target="Llama-3.2-1B", draft="lookahead", hw="l4"))
    path = tmp_path / "published.toml"
    path.write_text("".join(rows))
    return path


def test_validate_prints_rows_medians_and_skips(table: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--table", str(table)]) == 0
    out = capsys.readouterr().out
    assert "6 published rows: 4 expressed, 2 not" in out
    assert "median |error|, held-out rows, fitted overhead: kernels" in out
    assert "tree-row: a tree draft" in out and "lookahead-row: draft kind lookahead" in out
    assert "roofline (roofline)" in out  # l4 has no kernel tables: both sources are the roofline there


def test_split_is_fixed_by_id() -> None:
    assert [is_held_out(f"row-{i}") for i in range(4)] == [is_held_out(f"row-{i}") for i in range(4)]


def test_bad_table_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[result]]\nid = "x"\n')
    assert main(["--table", str(bad)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_runs_without_the_extra(table: Path, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(kernels, "kernels_unavailable", lambda: "not installed")
    assert main(["--table", str(table)]) == 0
    assert "4 expressed" in capsys.readouterr().out
