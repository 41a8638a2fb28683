"""Tests of sim.published: the shipped table of published results loads and is well formed, and bad
files are refused with one line naming the row and the field."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sim.published import ACCEPTANCE_KINDS, PUBLISHED_FILE, PublishedResult, load_published

GOOD_ROW = """
[[result]]
id = "r1"
target = "meta-llama/Llama-3.1-8B-Instruct"
draft_kind = "eagle3"
hardware = "h200"
engine = "sglang"
gamma = 3
acceptance = 2.9
acceptance_kind = "tau_incl_bonus"
baseline_tok_s = 190.0
spec_tok_s = 404.0
tok_s_kind = "total"
source = "a source"
cells = "| 190 | 404 |"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "published.toml"
    path.write_text(text, encoding="utf-8")
    return path


# -- the shipped table ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def rows() -> list[PublishedResult]:
    return load_published()


def test_shipped_table_loads_from_the_package(rows):
    assert PUBLISHED_FILE.name == "published.toml" and PUBLISHED_FILE.parent.name == "data"
    assert rows == load_published(PUBLISHED_FILE)


def test_shipped_table_has_enough_rows_and_batched_rows(rows):
    assert len(rows) >= 30
    assert sum((r.batch or 0) > 1 for r in rows) >= 10


def test_every_row_names_its_source_and_cells(rows):
    for r in rows:
        assert len(r.source) > 20, r.id
        assert r.cells.strip(), r.id


def test_ids_are_unique(rows):
    ids = [r.id for r in rows]
    assert len(ids) == len(set(ids))


def test_every_row_has_a_published_speedup_or_acceptance(rows):
    for r in rows:
        assert r.published_speedup is not None or r.acceptance is not None, r.id
        if r.acceptance is not None:
            assert r.acceptance_kind in ACCEPTANCE_KINDS, r.id


def test_stated_speedups_agree_with_their_own_throughputs(rows):
    """Where a source gives both a speedup and the two throughputs, they agree to its rounding."""
    for r in rows:
        if r.speedup is not None and r.baseline_tok_s is not None and r.spec_tok_s is not None:
            assert r.spec_tok_s / r.baseline_tok_s == pytest.approx(r.speedup, abs=0.02), r.id


def test_tau_conversions():
    base = dict(id="x", target="t", draft_kind="eagle", hardware="h100", engine="sglang", source="s", cells="c",
                speedup=2.0, speedup_metric="throughput")
    assert PublishedResult(**base, acceptance=2.5, acceptance_kind="tau_excl_bonus").tau_incl_bonus == 3.5
    r = PublishedResult(**base, gamma=3, acceptance=0.5, acceptance_kind="alpha_per_token")
    assert r.tau_incl_bonus == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    r = PublishedResult(**base, gamma=1, acceptance=0.85, acceptance_max=0.9, acceptance_kind="alpha_per_token")
    assert r.tau_incl_bonus_range == pytest.approx((1.85, 1.9)) and r.tau_incl_bonus == pytest.approx(1.875)
    assert PublishedResult(**base, acceptance=0.5, acceptance_kind="alpha_per_token").tau_incl_bonus is None
    assert PublishedResult(**base, acceptance=3.0, acceptance_kind="unknown").tau_incl_bonus is None
    ms = dict(base, speedup=None, speedup_metric=None, baseline_ms_per_token=10.0, spec_ms_per_token=4.0)
    assert math.isclose(PublishedResult(**ms).published_speedup or 0.0, 2.5)


def test_shipped_deepseek_v3_row_is_a_range_of_alpha(rows):
    (r,) = [r for r in rows if r.id == "deepseek-v3-report-mtp-second-token"]
    assert r.acceptance_kind == "alpha_per_token" and r.gamma == 1
    assert r.tau_incl_bonus_range == pytest.approx((1.85, 1.9))


def test_published_slowdowns_are_in_the_table(rows):
    """The table holds speculative decoding made slower at load, as the sources publish it (at batch > 1 or by
    request rate, and at batch 1 where a weak draft on a small-active MoE target lost: SpecForge issue #339)."""
    slow = [r for r in rows if (r.published_speedup or 1.0) < 1.0]
    at_load = [r for r in slow if r.batch_kind == "request_rate" or (r.batch or 1) > 1]
    assert len(at_load) >= 2
    assert all(r.target == "Qwen/Qwen3-30B-A3B" for r in slow if r not in at_load)


# -- bad files ------------------------------------------------------------------------------
def test_a_good_small_file_loads(tmp_path):
    (row,) = load_published(write(tmp_path, GOOD_ROW))
    assert row.batch == 1 and row.batch_kind == "batch" and row.gamma == 3 and row.hardware == "h200"
    assert row.published_speedup == pytest.approx(404 / 190)


def test_a_request_rate_row_has_no_batch(tmp_path):
    text = GOOD_ROW.replace("gamma = 3", 'gamma = 3\nbatch_kind = "request_rate"\nrequest_rate_qps = 8')
    (row,) = load_published(write(tmp_path, text))
    assert row.batch is None and row.request_rate_qps == 8.0 and isinstance(row.request_rate_qps, float)


@pytest.mark.parametrize(("old", "new", "names"), [
    ('gamma = 3', 'gamma = 3\ncolour = "red"', ("'r1'", "'colour'", "unknown")),
    ('gamma = 3', 'gamma = "3"', ("'r1'", "'gamma'", "int")),
    ('gamma = 3', 'gamma = true', ("'r1'", "'gamma'", "int")),
    ('acceptance = 2.9', 'acceptance = 0.5', ("'r1'", "'acceptance'", "[1,")),
    ('acceptance = 2.9', 'acceptance = 4.5', ("'r1'", "'acceptance'", "gamma + 1")),
    ('spec_tok_s = 404.0', 'spec_tok_s = -1.0', ("'r1'", "'spec_tok_s'", "> 0")),
    ('hardware = "h200"', 'hardware = "H200"', ("'r1'", "'hardware'", "h100")),
    ('engine = "sglang"', 'engine = "tgi"', ("'r1'", "'engine'", "vllm")),
    ('acceptance_kind = "tau_incl_bonus"', 'acceptance_kind = "tau"', ("'r1'", "'acceptance_kind'", "unknown")),
    ('tok_s_kind = "total"\n', '', ("'r1'", "'tok_s_kind'", "required")),
    ('target = "meta-llama/Llama-3.1-8B-Instruct"\n', '', ("'r1'", "'target'", "missing")),
    ('draft_kind = "eagle3"', 'draft_kind = "model"', ("'r1'", "'draft_model'", "required")),
    ('gamma = 3', 'gamma = 3\ntree_topk = 4', ("'r1'", "'tree_topk'", "tree_num_draft_tokens")),
    ('gamma = 3', 'gamma = 3\ngpus = 1\ntp = 2', ("'r1'", "'tp'", "gpus")),
    ('gamma = 3', 'gamma = 3\nbatch_kind = "request_rate"', ("'r1'", "'request_rate_qps'", "request_rate")),
    ('gamma = 3', 'gamma = 3\nrequest_rate_qps = 2.0', ("'r1'", "'request_rate_qps'", "request_rate")),
    ('gamma = 3', 'gamma = 3\nbatch = 4\nbatch_kind = "request_rate"\nrequest_rate_qps = 2.0',
     ("'r1'", "'batch'", "request_rate")),
    ('gamma = 3', 'gamma = 3\nspeedup = 2.1', ("'r1'", "'speedup_metric'", "speedup")),
    ('acceptance = 2.9', 'acceptance = 2.9\nacceptance_max = 2.5', ("'r1'", "'acceptance_max'", "above")),
])
def test_bad_rows_are_one_line_naming_row_and_field(tmp_path, old, new, names):
    assert old in GOOD_ROW
    with pytest.raises(ValueError) as exc:
        load_published(write(tmp_path, GOOD_ROW.replace(old, new)))
    message = str(exc.value)
    assert "\n" not in message
    for name in names:
        assert name in message


def test_duplicate_ids_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"'r1'.*'id'.*more than once"):
        load_published(write(tmp_path, GOOD_ROW + GOOD_ROW))


@pytest.mark.parametrize(("text", "match"), [
    ("", "no \\[\\[result\\]\\] tables"),
    ("[[result]\n", "published results file"),
    ("title = 'x'\n" + GOOD_ROW, "unknown top-level key"),
    ("result = 3\n", "no \\[\\[result\\]\\] tables"),
])
def test_bad_files_are_refused(tmp_path, text, match):
    with pytest.raises(ValueError, match=match):
        load_published(write(tmp_path, text))


def test_a_missing_file_is_one_line(tmp_path):
    with pytest.raises(ValueError, match="published results file"):
        load_published(tmp_path / "nope.toml")


# -- acceptance borrowed from a batch-1 row of the same source ------------------------------
BORROWER = GOOD_ROW.replace('id = "r1"', 'id = "r64"').replace(
    'acceptance = 2.9\nacceptance_kind = "tau_incl_bonus"\n', 'batch = 64\nacceptance_from = "r1"\n').replace(
    "spec_tok_s = 404.0", "spec_tok_s = 180.0")


def test_a_row_borrows_the_acceptance_of_a_batch_1_row(tmp_path):
    lender, row = load_published(write(tmp_path, GOOD_ROW + BORROWER))
    assert row.acceptance_from == "r1" and row.batch == 64 and lender.acceptance_from is None
    assert (row.acceptance, row.acceptance_kind, row.acceptance_max) == (2.9, "tau_incl_bonus", None)
    assert row.tau_incl_bonus == lender.tau_incl_bonus == 2.9
    assert row.published_speedup == pytest.approx(180 / 190)


@pytest.mark.parametrize(("lender_edit", "borrower_edit", "names"), [
    (None, ('acceptance_from = "r1"', 'acceptance_from = "r9"'), ("'r64'", "'acceptance_from'", "names no row")),
    (None, ('acceptance_from = "r1"', 'acceptance_from = "r64"'), ("'r64'", "no acceptance of its own")),
    (('gamma = 3', 'gamma = 3\nbatch = 2'), None, ("'r64'", "'r1'", "batch 2, not batch 1")),
    (('gamma = 3', 'gamma = 5'), None, ("'r64'", "gamma differs (5, here 3)")),
    (('draft_kind = "eagle3"', 'draft_kind = "eagle"'), None, ("'r64'", "draft_kind differs")),
    (('target = "meta-llama/Llama-3.1-8B-Instruct"', 'target = "x/y"'), None, ("'r64'", "target differs")),
    (('source = "a source"', 'source = "another source"'), None, ("'r64'", "source differs;")),
    (('gamma = 3', 'gamma = 3\ndataset = "gsm8k"'), None, ("'r64'", "dataset differs")),
    (None, ('acceptance_from = "r1"', 'acceptance_from = "r1"\nacceptance = 2.0'),
     ("'r64'", "'acceptance'", "not given with acceptance_from")),
])
def test_bad_borrowing_is_one_line_naming_the_rows(tmp_path, lender_edit, borrower_edit, names):
    lender = GOOD_ROW.replace(*lender_edit) if lender_edit else GOOD_ROW
    borrower = BORROWER.replace(*borrower_edit) if borrower_edit else BORROWER
    with pytest.raises(ValueError) as exc:
        load_published(write(tmp_path, lender + borrower))
    message = str(exc.value)
    assert "\n" not in message
    for name in names:
        assert name in message


def test_a_borrower_cannot_lend(tmp_path):
    third = BORROWER.replace('id = "r64"', 'id = "r8"').replace('acceptance_from = "r1"', 'acceptance_from = "r64"')
    with pytest.raises(ValueError, match="'r8'.*'r64', which publishes no acceptance of its own"):
        load_published(write(tmp_path, GOOD_ROW + BORROWER + third))


def test_shipped_borrowers_lend_from_batch_1_rows_of_their_source(rows):
    """Whatever the shipped table borrows, it borrows from a batch-1 row of the same source (the loader's rule)."""
    by_id = {r.id: r for r in rows}
    for r in rows:
        if r.acceptance_from is not None:
            lender = by_id[r.acceptance_from]
            assert lender.batch == 1 and lender.source == r.source and lender.gamma == r.gamma, r.id
