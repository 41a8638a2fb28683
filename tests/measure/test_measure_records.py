"""Tests of measure.records: the run directory writer/reader, resume, torch-freeness."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from measure import records
from measure.rows import ROW_TYPES, CellRow, GenerationRow, RoundRow

#: The columns of every table as schema 2 wrote them before the row types (docs/RUN_FORMAT.md): the row types
#: (measure.rows) must give exactly these, in this order.
WRITTEN_COLUMNS: dict[str, tuple[str, ...]] = {
    "cells": (
        "cell_id", "draft", "gamma_policy", "gamma", "temperature", "domain", "head_k",
        "n_prompts", "new_tokens", "tokens_per_s_baseline", "tokens_per_s_speculative",
        "tokens_per_s_peer", "speedup", "acceptance_rate", "mean_accepted_per_round",
        "n_rounds", "outputs_identical", "synthetic",
        # schema 2: repeats, 95% CIs, noise flags, the peer's own counts
        "repeats", "speedup_lo", "speedup_hi", "tokens_per_s_baseline_lo", "tokens_per_s_baseline_hi",
        "tokens_per_s_speculative_lo", "tokens_per_s_speculative_hi", "tokens_per_s_peer_lo",
        "tokens_per_s_peer_hi", "speedup_peer", "speedup_peer_lo", "speedup_peer_hi",
        "peer_acceptance_rate", "baseline_cv", "baseline_drift", "unstable", "unstable_reason", "attempts",
        # the machine that measured the cell (:func:`hardware_label`); a Ray sweep's cells may differ
        "hardware",
        # greedy generations of the cell that diverged within the engine's near-tie tolerance, or beyond it
        "n_near_tie", "n_lossless_failures",
        # the engine's own plain decoding in the same visits, and our baseline over it (with 95% CIs)
        "tokens_per_s_library", "tokens_per_s_library_lo", "tokens_per_s_library_hi",
        "baseline_vs_library", "baseline_vs_library_lo", "baseline_vs_library_hi",
    ),
    "generations": (
        "cell_id", "prompt_id", "domain", "mode", "prompt_tokens", "new_tokens", "wall_s",
        "tokens_per_s", "ttft_ms", "peak_mem_bytes", "outputs_identical",
        "repeat", "order", "drafted", "accepted", "n_rounds", "tokens",
        # greedy: identical | near_tie | failure against the baseline (measure.engines.lossless)
        "lossless", "divergence_position", "divergence_margin",
    ),
    "rounds": (
        "cell_id", "prompt_id", "round", "gamma", "context_tokens", "drafted", "accepted",
        "draft_ms", "verify_ms", "overhead_ms", "repeat",
    ),
    "token_latency": ("cell_id", "prompt_id", "mode", "token_index", "latency_ms", "repeat"),
    "traces": ("cell_id", "draft", "temperature", "domain", "prompt_id", "position", "value", "proposed", "accept_run"),
    "cost_target": ("n_tokens", "context_tokens", "repeat", "ms"),
    "cost_draft": ("draft", "head_k", "context_tokens", "repeat", "ms"),
    "profile": ("model", "role", "component", "ms", "share"),
    "head_sweep": (
        "variant", "head_k", "head_ms", "draft_step_ms", "acceptance_rate", "tokens_per_s",
        "speedup", "head_fast_ms", "tokens_per_s_baseline", "e2e_acceptance_rate",
        "mean_accepted_per_round", "kept_recall", "n_eval_tokens", "outputs_identical", "model",
        "draft", "vocab_size", "gamma", "synthetic",
    ),
    # python -m measure serve (measure/serve)
    "serve_units": (
        "cell_id", "config", "spec_type", "spec_k", "spec_ngram_n", "slots", "load", "concurrency",
        "rate_per_s", "repeat", "block", "synthetic", "n_requests", "n_errors", "new_tokens", "duration_s",
        "completion_tokens", "throughput_tokens_per_s", "ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "tpot_p50_ms",
        "tpot_p95_ms", "tpot_p99_ms", "itl_p50_ms", "itl_p95_ms", "itl_p99_ms", "e2e_p50_ms", "e2e_p95_ms",
        "e2e_p99_ms", "metrics", "drafts", "draft_tokens", "accepted_tokens", "accepted_per_pos",
        "tokens_predicted", "n_decode", "prompt_tokens", "client_cpu_s", "client_cpu_share",
        "send_lag_p99_ms", "hardware", "other_cpu_share", "steal_share",
    ),
    "serve_requests": (
        "cell_id", "request_index", "prompt_id", "domain", "send_s", "ttft_ms", "e2e_ms", "tpot_ms",
        "completion_tokens", "events", "prompt_tokens", "draft_n", "draft_n_accepted", "predicted_ms", "prompt_ms",
        "error",
    ),
    "serve_tokens": ("cell_id", "request_index", "event_index", "t_ms", "gap_ms"),
    "serve_step_cost": (
        "cell_id", "seqs", "tokens_per_seq", "context_tokens", "n_steps", "step_ms", "step_ms_lo", "step_ms_hi",
        "prompt_tokens", "ttft_ms",
    ),
    # python -m measure tree (measure/trees): tree_cells marks a cell finished
    "tree_cells": (
        "cell_id", "draft", "loop", "shape", "depth", "topk", "budget", "domain", "n_prompts", "repeats",
        "new_tokens", "tokens_per_s_baseline", "tokens_per_s_speculative", "speedup", "speedup_lo", "speedup_hi",
        "mean_accepted_per_round", "mean_nodes_per_round", "n_rounds", "outputs_identical", "synthetic", "hardware",
        "n_near_tie", "n_lossless_failures",
    ),
    "tree_nodes": ("cell_id", "prompt_id", "repeat", "round", "node", "parent", "depth", "rank", "token", "accepted"),
    "tree_ranks": ("cell_id", "prompt_id", "repeat", "round", "depth", "rank", "candidates"),
}


def _cell(cid: str, speedup: float = 1.5, **kw) -> CellRow:
    return CellRow(cell_id=cid, draft="ngram:3", gamma_policy="fixed:4", gamma=4, temperature=0.0, domain="code",
                   head_k=None, n_prompts=2, new_tokens=10, tokens_per_s_baseline=10.0,
                   tokens_per_s_speculative=10.0 * speedup, tokens_per_s_peer=None, speedup=speedup,
                   acceptance_rate=0.5, mean_accepted_per_round=1.2, n_rounds=kw.pop("n_rounds", 5),
                   outputs_identical=True, synthetic=False, **kw)


def _round(cid: str, i: int, **kw) -> RoundRow:
    return RoundRow(cid, "p", i, 4, 10 + i, 4, i % 5, 1.0, 2.0, 0.1, **kw)


def test_cell_id_is_stable():
    assert records.cell_id("int8", "fixed:4", 0.0, "code") == "draft=int8|gamma=fixed:4|temp=0|domain=code"
    assert records.cell_id("int8", "fixed:4", 0.7, "code", head_k=512).endswith("temp=0.7|domain=code|head_k=512")


def test_cell_id_round_trips():
    from sim.policies import GammaSpec

    for text in ("draft=int8|gamma=fixed:4|temp=0|domain=code",
                 "draft=ngram:3:first|gamma=heuristic:2|temp=0.7|domain=docs|head_k=512"):
        cid = records.CellId.parse(text)
        assert cid.to_str() == text and records.CellId.parse(cid.to_str()) == cid
    assert records.CellId.parse("draft=d|gamma=fixed:2|temp=0|domain=code|head_k=64") == \
        records.CellId("d", GammaSpec("fixed", 2), 0.0, "code", 64)
    for bad in ("draft=d|temp=0", "gamma=fixed:2|draft=d|temp=0|domain=code", "draft=d|gamma=x:1|temp=0|domain=c"):
        with pytest.raises(ValueError, match="cell id"):
            records.CellId.parse(bad)


def test_write_read_roundtrip(tmp_path):
    w = records.RunWriter(tmp_path / "r", meta={"command": "x", "config": {"seed": 0}})
    cid = records.cell_id("ngram:3", "fixed:4", 0, "code")
    w.append("rounds", [_round(cid, i) for i in range(3)])
    w.finish_cell(_cell(cid))
    w.update(summary={"speedup": 1.5})
    w.close("complete")
    run = records.load_run(tmp_path / "r")
    assert run.status == "complete" and run.summary["speedup"] == 1.5
    assert run.meta["schema_version"] == records.SCHEMA_VERSION and run.meta["config"] == {"seed": 0}
    cells = run.table("cells")
    assert list(cells.columns) == list(records.TABLE_COLUMNS["cells"])
    assert cells["outputs_identical"].tolist() == [True]
    assert len(run.table("rounds")) == 3
    assert len(run.table("traces")) == 0 and list(run.table("traces").columns) == list(records.TABLE_COLUMNS["traces"])


def test_bad_rows_and_tables_are_rejected(tmp_path):
    w = records.RunWriter(tmp_path / "r")
    with pytest.raises(ValueError, match="unknown table 'nope'"):
        w.append("nope", [])
    with pytest.raises(ValueError, match="rounds.csv takes RoundRow rows"):  # a dict, or another table's row
        w.append("rounds", [{"cell_id": "x"}])
    with pytest.raises(ValueError, match="rounds.csv takes RoundRow rows"):
        w.append("rounds", [_cell("x")])
    with pytest.raises(ValueError, match="unknown status"):
        w.update(status="weird")
    with pytest.raises(ValueError, match="run directory not found"):
        records.load_run(tmp_path / "empty")


def test_resume_keeps_finished_and_drops_unfinished(tmp_path):
    path = tmp_path / "r"
    w = records.RunWriter(path)
    a, b = records.cell_id("d", "fixed:1", 0, "code"), records.cell_id("d", "fixed:2", 0, "code")
    w.append("rounds", [_round(a, 0), _round(a, 1)])
    w.finish_cell(_cell(a, n_rounds=2))
    w.append("rounds", [_round(b, 0)])  # b never finished: the run was interrupted here
    w.close("interrupted")
    assert json.loads((path / "run.json").read_text())["status"] == "interrupted"

    w2 = records.RunWriter(path)
    assert w2.resumed and w2.finished_cells == {a} and w2.is_finished(a) and not w2.is_finished(b)
    rounds = records.load_run(path).table("rounds")
    assert set(rounds["cell_id"]) == {a} and len(rounds) == 2
    assert len(records.load_run(path).meta["resumed_utc"]) == 1


def test_unwritable_directory_is_a_value_error(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match="not writable"):
        records.RunWriter(f / "sub")


def test_records_imports_no_torch():
    code = "import sys, measure, measure.records; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("exc,status", [(None, "complete"), (KeyboardInterrupt, "interrupted"),
                                        (RuntimeError, "failed")])
def test_recording_closes_with_status(tmp_path, exc, status):
    w = records.RunWriter(tmp_path / "r")
    try:
        with w.recording():
            if exc is not None:
                raise exc("boom")
    except BaseException as e:  # re-raised by recording()
        assert isinstance(e, exc)
    run = records.load_run(tmp_path / "r")
    assert run.status == status
    assert ("error" in run.meta) == (status == "failed")


# -- schema 2: crash safety, validation, identity ----------------------------------------------
def _cell_row(cid: str, **kw) -> CellRow:
    row = dict(cell_id=cid, draft="ngram:3", gamma_policy="fixed:2", gamma=2, temperature=0.0, domain="code",
               head_k=None, n_prompts=1, new_tokens=8, tokens_per_s_baseline=10.0, tokens_per_s_speculative=12.0,
               tokens_per_s_peer=None, speedup=1.2, acceptance_rate=None, mean_accepted_per_round=None,
               n_rounds=None, speedup_lo=1.1, speedup_hi=1.3, unstable=False, outputs_identical=True, synthetic=False)
    return CellRow(**{**row, **kw})


def _two_cell_run(path) -> None:
    w = records.RunWriter(path, meta={"config": {}})
    for cid in ("a", "b"):
        w.append("rounds", [RoundRow(cid, "p", 0, 2, 5, 2, 1, 1.0, 2.0, 0.1, repeat=0)])
        w.finish_cell(_cell_row(cid))
    w.close("complete")


def test_torn_last_cells_line_drops_that_cell_on_resume(tmp_path):
    """A kill mid-write leaves a torn last line: resume drops it and its cell's rows; the rest stays."""
    _two_cell_run(tmp_path / "r")
    f = tmp_path / "r" / "cells.csv"
    data = f.read_bytes()
    f.write_bytes(data[:-25])  # tear the last row (cell "b")
    with pytest.raises(ValueError, match=r"cells.csv: line 3 has \d+ fields"):
        records.load_run(tmp_path / "r").table("cells")
    w = records.RunWriter(tmp_path / "r")
    assert w.finished_cells == {"a"}
    w.close("interrupted")
    run = records.load_run(tmp_path / "r")
    assert list(run.table("cells")["cell_id"]) == ["a"]
    assert list(run.table("rounds")["cell_id"]) == ["a"]  # cell b's rows went with it
    w = records.RunWriter(tmp_path / "r")
    w.finish_cell(_cell_row("b"))  # the redone cell appends onto a clean line
    w.close("complete")
    assert list(records.load_run(tmp_path / "r").table("cells")["cell_id"]) == ["a", "b"]


def test_bad_files_name_file_line_and_column(tmp_path):
    _two_cell_run(tmp_path / "r")
    f = tmp_path / "r" / "cells.csv"
    lines = f.read_text().splitlines()
    header = lines[0].split(",")
    fields = lines[1].split(",")
    fields[header.index("speedup")] = "abc"
    f.write_text("\n".join([lines[0], ",".join(fields), *lines[2:]]) + "\n")
    with pytest.raises(ValueError, match=r"cells.csv: line 2, column speedup: 'abc' is not a number"):
        records.load_run(tmp_path / "r").table("cells")
    f.write_text(lines[0].replace("speedup,", "") + "\n")
    with pytest.raises(ValueError, match="missing column"):
        records.load_run(tmp_path / "r").table("cells")
    meta = tmp_path / "r" / "run.json"
    doc = json.loads(meta.read_text())
    meta.write_text(json.dumps({**doc, "schema_version": 99}))
    with pytest.raises(ValueError, match="schema_version 99 is newer than this specscope reads"):
        records.load_run(tmp_path / "r")
    meta.write_text(json.dumps({"schema_version": 2}))
    with pytest.raises(ValueError, match="missing key 'status'"):
        records.load_run(tmp_path / "r")
    meta.write_text('{"schema_version": 2, "status": ')
    with pytest.raises(ValueError, match="run.json: not valid JSON"):
        records.load_run(tmp_path / "r")


def test_schema1_runs_still_load():
    run = records.load_run(Path(__file__).resolve().parents[2] / "results" / "cpu-smollm2-ngram-gammas")
    assert run.schema_version == 1 and run.status == "complete"
    cells = run.table("cells")
    assert len(cells) == 18 and "speedup_lo" in cells and cells["speedup_lo"].isna().all()


def _drop_column(csv_path: Path, column: str) -> None:
    rows = [ln.split(",") for ln in csv_path.read_text().splitlines()]
    i = rows[0].index(column)
    csv_path.write_text("".join(",".join(r[:i] + r[i + 1:]) + "\n" for r in rows))


def test_a_column_added_within_schema_2_is_optional_there_and_required_in_schema_3(tmp_path):
    _two_cell_run(tmp_path / "r")
    _drop_column(tmp_path / "r" / "cells.csv", "hardware")
    with pytest.raises(ValueError, match=r"cells.csv: missing column\(s\) hardware"):
        records.load_run(tmp_path / "r").table("cells")
    meta = tmp_path / "r" / "run.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "schema_version": 2}))
    cells = records.load_run(tmp_path / "r").table("cells")
    assert len(cells) == 2 and cells["hardware"].isna().all()


def test_a_schema_2_run_resumes_as_schema_2_and_a_schema_1_run_is_refused(tmp_path):
    w = records.RunWriter(tmp_path / "r", meta={"config": {}})
    w.close("interrupted")
    meta = tmp_path / "r" / "run.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "schema_version": 2}))
    records.RunWriter(tmp_path / "r").close("complete")
    assert records.load_run(tmp_path / "r").schema_version == 2
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "schema_version": 1}))
    with pytest.raises(ValueError, match="written with schema_version 1; resuming needs schema 2 or 3"):
        records.RunWriter(tmp_path / "r")


#: Every committed run directory: each must still load (``run.json`` and every table) and name its kind.
COMMITTED_RUNS = sorted(p.parent for p in (Path(__file__).resolve().parents[2] / "results").rglob("run.json"))


@pytest.mark.slow
@pytest.mark.parametrize("run_dir", COMMITTED_RUNS, ids=lambda p: p.name if p.parent.name == "results" else
                         f"{p.parent.name}/{p.name}")
def test_every_committed_run_still_loads(run_dir: Path) -> None:
    from measure.runkinds import kind_of

    run = records.load_run(run_dir)
    kind = kind_of(run.meta)
    assert run.schema_version in records.READABLE_SCHEMAS
    tables = run.tables()  # every table on disk, validated (one-line ValueError naming file, line, column)
    assert kind.finish_table in tables and all(set(records.TABLE_COLUMNS[n]) <= set(df.columns)
                                               for n, df in tables.items())
    assert len(run.rows(kind.rows[0])) == len(tables[kind.finish_table])


def test_strict_json_never_nan(tmp_path):
    w = records.RunWriter(tmp_path / "r", meta={"config": {}})
    w.update(summary={"x": float("nan"), "y": [float("inf"), 1.0]})
    text = (tmp_path / "r" / "run.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text)["summary"] == {"x": None, "y": [None, 1.0]}


def test_dead_writer_reads_as_interrupted(tmp_path):
    import subprocess
    import sys

    code = ("import sys; from measure import records; "
            "records.RunWriter(sys.argv[1], meta={'config': {}})")  # exits without closing: a killed writer
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "r")], check=True,
                   env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    run = records.load_run(tmp_path / "r")
    assert json.loads((tmp_path / "r" / "run.json").read_text())["status"] == "running"
    assert run.status == "interrupted" and "is gone" in run.status_note


def test_resume_with_a_different_fingerprint_is_refused_and_writes_nothing(tmp_path):
    w = records.RunWriter(tmp_path / "r", meta={"config": {}}, fingerprint={"max_new_tokens": 64, "seed": 0})
    w.close("complete")
    before = (tmp_path / "r" / "run.json").read_text()
    with pytest.raises(records.FingerprintMismatch, match="max_new_tokens 64 -> 32"):
        records.RunWriter(tmp_path / "r", fingerprint={"max_new_tokens": 32, "seed": 0})
    assert (tmp_path / "r" / "run.json").read_text() == before


def test_row_types_give_the_written_columns_in_order():
    assert records.TABLE_COLUMNS == WRITTEN_COLUMNS
    assert {t: r.columns() for t, r in ROW_TYPES.items()} == WRITTEN_COLUMNS


def test_a_row_round_trips_through_its_text(tmp_path):
    """to_csv / from_csv (and to_json / from_json) are each other's inverse; an Estimate fills x, x_lo, x_hi."""
    from measure.stats import Estimate

    row = CellRow.make(cell=records.CellId.parse("draft=d|gamma=fixed:2|temp=0|domain=code|head_k=64"), n_prompts=1,
                       new_tokens=8, tokens_per_s_baseline=Estimate(10.0, 9.0, 11.0),
                       tokens_per_s_speculative=Estimate(12.0, None, None), tokens_per_s_peer=Estimate(None, None, None),
                       speedup=Estimate(1.2, 1.1, 1.3), acceptance_rate=0.5, mean_accepted_per_round=float("nan"),
                       n_rounds=3, outputs_identical=True, synthetic=False, unstable=False)
    assert row.speedup_lo == 1.1 and row.estimate("speedup") == Estimate(1.2, 1.1, 1.3) and row.head_k == 64
    assert row.mean_accepted_per_round is None  # non-finite: empty, as on disk
    assert row.cell == records.CellId.parse(row.cell_id)
    text = dict(zip(CellRow.columns(), (str(v) for v in row.to_csv())))
    assert CellRow.from_csv(text) == row and CellRow.from_json(row.to_json()) == row
    gen = GenerationRow("c", "p", "code", "baseline", 5, 3, 0.5, 6.0, 1.0, None, None, repeat=0, tokens=(7, 8, 9))
    assert gen.to_csv()[GenerationRow.columns().index("tokens")] == "7 8 9"
    assert GenerationRow.from_json(gen.to_json()) == gen
    with pytest.raises(ValueError, match="generations.csv column new_tokens: 'x' is not an integer"):
        GenerationRow.from_csv({**dict(zip(GenerationRow.columns(), map(str, gen.to_csv()))), "new_tokens": "x"})
    with pytest.raises(ValueError, match="wall_s 'slow' is not a float"):
        GenerationRow.from_json({**gen.to_json(), "wall_s": "slow"})
