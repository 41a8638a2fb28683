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


def test_slowdowns_at_batch_above_1_are_reported_with_borrowed_acceptance(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A batch-64 slowdown borrowing a low batch-1 acceptance is expressed and predicted below 1; a request-rate
    slowdown without acceptance is listed with its reason; the borrowing is printed."""
    lender = ROW.format(id="b1", target="Llama-3.2-1B", draft="eagle3", hw="l4").replace("acceptance = 2.9",
                                                                                         "acceptance = 1.1")
    borrower = (ROW.format(id="b64", target="Llama-3.2-1B", draft="eagle3", hw="l4")
                .replace("batch = 1", "batch = 64").replace("spec_tok_s = 404.0", "spec_tok_s = 150.0")
                .replace('acceptance = 2.9\nacceptance_kind = "tau_incl_bonus"\n', 'acceptance_from = "b1"\n'))
    by_rate = (ROW.format(id="qps8", target="Llama-3.2-1B", draft="eagle3", hw="l4")
               .replace("batch = 1", 'batch_kind = "request_rate"\nrequest_rate_qps = 8.0')
               .replace('acceptance = 2.9\nacceptance_kind = "tau_incl_bonus"\n', "")
               .replace("spec_tok_s = 404.0", "spec_tok_s = 100.0"))
    path = tmp_path / "published.toml"
    path.write_text(lender + borrower + by_rate)
    assert main(["--table", str(path)]) == 0
    out = capsys.readouterr().out
    assert "acceptance borrowed from a batch-1 row of the same source (1 rows):\n  b64 <- b1 (tau_incl_bonus 1.1)" in out
    assert "published slowdowns at batch > 1 (request-rate rows included): 2" in out
    assert "  b64: published 0.79x, predicted kernels " in out and "(a slowdown), roofline " in out
    assert "  qps8: published 0.53x, not expressed: no published acceptance" in out
    assert "published slowdowns at batch > 1: 1 expressed, 1 predicted as slowdowns (kernels; roofline: 1)" in out
