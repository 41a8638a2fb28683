"""``python -m sim validate`` on a small table written by the test."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from sim import kernels
from sim.published import PublishedResult
from sim.stepcost import EngineOverheads, EngineRoundOverhead
from sim.validate import (BASELINE_LIMIT, OVERHEAD_MODELS, ModelScore, Priced, RoutingRun, TreeFlags,
                          _leave_one_out_medians, choose_model, choose_routing, fit_engine_overheads,
                          fit_round_overhead, is_held_out, main, baseline_mismatch, slowdown_lines)

HAS_KERNELS = kernels.kernels_unavailable() is None
needs_kernels = pytest.mark.skipif(not HAS_KERNELS, reason="aiconfigurator-core (the costs extra) not installed")

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
speedup = 2.126
speedup_metric = "throughput"
source = "a test"
cells = "written by the test"
'''


@pytest.fixture()
def table(tmp_path: Path) -> Path:
    rows = [ROW.format(id=f"row-{i}", target="Llama-3.2-1B", draft="eagle3", hw="l4") for i in range(4)]
    rows.append(ROW.format(id="tree-row", target="Llama-3.2-1B", draft="eagle3", hw="l4").replace(
        "gamma = 3", "gamma = 3\ntree_topk = 4\ntree_num_draft_tokens = 8"))
    rows.append(ROW.format(id="vllm-tree-row", target="Llama-3.2-1B", draft="eagle3", hw="l4").replace(
        "gamma = 3", "gamma = 3\ntree_topk = 4\ntree_num_draft_tokens = 8").replace('"sglang"', '"vllm"'))
    rows.append(ROW.format(id="lookahead-row", target="Llama-3.2-1B", draft="lookahead", hw="l4"))
    path = tmp_path / "published.toml"
    path.write_text("".join(rows))
    return path


def test_validate_prints_rows_medians_and_skips(table: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--table", str(table)]) == 0
    out = capsys.readouterr().out
    assert "7 published rows: 5 expressed, 2 not" in out
    assert "median |error|, held-out rows, adopted overhead: kernels" in out
    assert "tree topk 4, 8 tokens" in out  # an SGLang EAGLE tree is priced as SGLang's round
    assert "vllm-tree-row: a eagle3 tree in vllm (the seam prices SGLang's EAGLE trees" in out
    assert "lookahead-row: draft kind lookahead" in out
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
    assert "5 expressed" in capsys.readouterr().out


def test_slowdowns_at_batch_above_1_are_reported_with_borrowed_acceptance(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A batch-64 slowdown borrowing a low batch-1 acceptance is expressed and predicted below 1; a request-rate
    slowdown without acceptance is listed with its reason; the borrowing is printed."""
    lender = ROW.format(id="b1", target="Llama-3.2-1B", draft="eagle3", hw="l4").replace("acceptance = 2.9",
                                                                                         "acceptance = 1.1")
    borrower = (ROW.format(id="b64", target="Llama-3.2-1B", draft="eagle3", hw="l4")
                .replace("batch = 1", "batch = 64").replace("speedup = 2.126", "speedup = 0.789")
                .replace('acceptance = 2.9\nacceptance_kind = "tau_incl_bonus"\n', 'acceptance_from = "b1"\n'))
    by_rate = (ROW.format(id="qps8", target="Llama-3.2-1B", draft="eagle3", hw="l4")
               .replace("batch = 1", 'batch_kind = "request_rate"\nrequest_rate_qps = 8.0')
               .replace('acceptance = 2.9\nacceptance_kind = "tau_incl_bonus"\n', "")
               .replace("speedup = 2.126", "speedup = 0.526"))
    path = tmp_path / "published.toml"
    path.write_text(lender + borrower + by_rate)
    assert main(["--table", str(path)]) == 0
    out = capsys.readouterr().out
    assert "acceptance borrowed from a batch-1 row of the same source (1 rows):\n  b64 <- b1 (tau_incl_bonus 1.1)" in out
    assert "published slowdowns at batch > 1 (request-rate rows included): 2" in out
    assert "  b64: published 0.79x, predicted kernels " in out and "(a slowdown), roofline " in out
    assert "  qps8: published 0.53x, not expressed: no published acceptance" in out
    assert "published slowdowns at batch > 1: 1 expressed, 1 predicted as slowdowns (kernels; roofline: 1)" in out
    assert "(false alarms): 0 of 0 (kernels; roofline: 0)" in out
    assert any(line.startswith("  kernels  SGLang's from its source ") and "; sglang 1.96 ms/round" in line
               for line in out.splitlines())
    assert "held-out rows are not consulted: kernels per draft step; roofline per draft step;" in out


LLAMA_LIKE = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 16, "hidden_size": 2048,
              "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 8192,
              "vocab_size": 128256, "tie_word_embeddings": True, "max_position_embeddings": 131072,
              "model_type": "llama", "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5, "hidden_act": "silu"}


@pytest.fixture()
def h100_table(tmp_path: Path) -> Path:
    """On one H100 (kernel tables): a batch-1 row, a batch-64 slowdown borrowing its low acceptance, and a
    batch-8 speedup with a high acceptance (a false alarm if predicted below 1)."""
    model = tmp_path / "my-llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA_LIKE))
    row = ROW.replace('engine = "sglang"', 'engine = "sglang"\ntp = 1')
    lender = row.format(id="b1", target=model, draft="eagle3", hw="h100").replace("acceptance = 2.9", "acceptance = 1.1")
    slow = (row.format(id="b64", target=model, draft="eagle3", hw="h100").replace("batch = 1", "batch = 64")
            .replace("speedup = 2.126", "speedup = 0.789")
            .replace('acceptance = 2.9\nacceptance_kind = "tau_incl_bonus"\n', 'acceptance_from = "b1"\n'))
    fast = (row.format(id="b8", target=model, draft="eagle3", hw="h100").replace("batch = 1", "batch = 8")
            .replace("speedup = 2.126", "speedup = 1.579").replace('"a test"', '"another test"'))
    path = tmp_path / "published.toml"
    path.write_text(lender + slow + fast)
    return path


@pytest.mark.slow  # loads the h100 tables: seconds
@needs_kernels
def test_slowdown_count_with_the_extra(h100_table: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--table", str(h100_table)]) == 0
    out = capsys.readouterr().out
    assert "kernels (kernels)" in out
    assert "MoE routing of the kernel tables (kernel median |error| under each routing's own" in out
    assert "the routing changes the kernel costs of 0 rows (targets: none); the other 3 are priced identically " \
           "under each; no dense row changed" in out
    assert len({line.split("ms/step")[1] for line in out.splitlines() if line.startswith("  power_law_1.")}) == 1
    assert "held-out rows are not consulted: balanced;" in out  # a dense table: every routing ties, the first wins
    assert "published slowdowns at batch > 1: 1 expressed, 1 predicted as slowdowns (kernels; roofline: 1); " \
           "published speedups at batch > 1 predicted as slowdowns (false alarms): 0 of 1 (kernels; roofline: 0)" in out
    assert "engine overhead models, each fitted on the fit rows" in out


def test_slowdown_count_without_the_extra(h100_table: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Without aiconfigurator-core the kernels column falls back to the roofline, says so, and still counts."""
    monkeypatch.setattr(kernels, "kernels_unavailable", lambda: "not installed")
    assert main(["--table", str(h100_table)]) == 0
    out = capsys.readouterr().out
    assert "roofline (roofline)" in out and "kernels (kernels)" not in out
    assert "published slowdowns at batch > 1: 1 expressed, 1 predicted as slowdowns (kernels; roofline: 1)" in out
    assert "(false alarms): 0 of 1 (kernels; roofline: 0)" in out


def _priced(row_id: str, batch: int, truth: EngineRoundOverhead) -> Priced:
    """A priced row whose published speedup is what ``truth`` gives on fixed parts (no cost model needed)."""
    gamma, tokens, round_ms, base_ms = 3, 2.5, 6.0, 4.0 + 0.1 * batch
    speedup = tokens * base_ms / (round_ms + truth.round_ms(gamma, batch))
    row = PublishedResult(id=row_id, target="t", draft_kind="eagle3", engine="sglang", source="a test",
                          cells="written by the test", batch=batch, gamma=gamma, speedup=speedup,
                          speedup_metric="throughput")
    p = Priced(row, 0.7, gamma, batch, 1024.0, {}, False)
    p.__dict__["parts"] = {"kernels": (tokens, round_ms, base_ms)}  # the cached property, set by hand
    return p


def test_round_terms_are_recovered_from_the_fit_rows() -> None:
    """Rows made from a known overhead give it back: the round's total at batch 1 (per step and per round are one
    sum when every row drafts 3 steps) and the per-sequence term from the rows at batch > 1."""
    truth = EngineRoundOverhead(per_draft_step_ms=0.2, per_round_ms=0.5, per_extra_sequence_ms=0.02)
    rows = [_priced(f"r{i}-b{b}", b, truth) for i, b in enumerate((1, 1, 1, 2, 8, 16, 32, 64))]
    fitted = fit_round_overhead(rows, "kernels")
    assert fitted.per_extra_sequence_ms == pytest.approx(0.02)
    assert fitted.round_ms(3, 1) == pytest.approx(truth.round_ms(3, 1), abs=1e-6)



def test_a_tree_row_is_priced_as_sglangs_round(known_cost) -> None:
    """A tree row's parts: the published τ, the SGLang round of its flags (known costs), the target step; the
    per-step overhead is charged once per step."""
    row = PublishedResult(id="t", target="t", draft_kind="eagle3", engine="sglang", source="a test",
                          cells="written by the test", batch=2, gamma=4, tree_topk=3, tree_num_draft_tokens=16,
                          acceptance=2.5, acceptance_kind="tau_incl_bonus", speedup=1.0, speedup_metric="throughput")
    p = Priced(row, None, 4, 2, 512.0, {"kernels": known_cost}, False, TreeFlags(3, 16, 2.5))
    tokens, round_ms, base_ms = p.parts["kernels"]
    assert (tokens, base_ms) == (2.5, 10.5)
    assert round_ms == pytest.approx((1.2 + 3 * 1.6) + (10.0 + 0.5 * 16 * 2 + 0.2 * 5 * 2))
    assert p.speedup("kernels", 0.25) == pytest.approx(2.5 * 10.5 / (round_ms + 4 * 0.25))


def _rows_of(truth: EngineOverheads, kinds: tuple[tuple[str, bool], ...]) -> list[Priced]:
    """Rows of each (engine, tree) kind at 1, 3 and 5 draft steps whose published speedups ``truth`` gives."""
    rows = []
    for i, ((engine, tree), gamma) in enumerate(itertools.product(kinds, (1, 3, 5))):
        tokens, round_ms, base_ms = 1.0 + 0.4 * gamma, 5.0 + gamma, 4.0
        speedup = tokens * base_ms / (round_ms + truth.for_engine(engine, tree).round_ms(gamma))
        row = PublishedResult(id=f"r{i}", target="t", draft_kind="eagle3", engine=engine, source="a test",
                              cells="written by the test", gamma=gamma, speedup=speedup, speedup_metric="throughput")
        p = Priced(row, 0.7, gamma, 1, 1024.0, {}, False, TreeFlags(4, 16, tokens) if tree else None)
        p.__dict__["parts"] = {"kernels": (tokens, round_ms, base_ms)}  # the cached property, set by hand
        rows.append(p)
    return rows


def test_engine_round_terms_are_recovered_and_one_can_be_fixed() -> None:
    """Rows made from a known per-step overhead and per-round ones give them back: per engine, per engine and draft
    shape (an engine's trees apart from its chains); an engine's term held at a given value leaves the per-step
    one to the fit. (The median |error| only sees a kind that at least half the rows need: two kinds a table.)"""
    truth = EngineOverheads(0.2, (("sglang", 1.6), ("sglang tree", 3.0), ("trtllm", 0.4)))
    chains = _rows_of(truth, (("sglang", False), ("trtllm", False)))
    fitted = fit_engine_overheads(chains, "kernels")
    assert fitted.per_draft_step_ms == pytest.approx(0.2)
    assert dict(fitted.per_round_ms) == pytest.approx({"sglang": 1.6, "trtllm": 0.4})
    held = fit_engine_overheads(chains, "kernels", {"sglang": 1.6})
    assert held.per_draft_step_ms == pytest.approx(0.2) and dict(held.per_round_ms)["trtllm"] == pytest.approx(0.4)
    shapes = _rows_of(truth, (("sglang", False), ("sglang", True)))
    by_shape = fit_engine_overheads(shapes, "kernels", by_shape=True)
    assert dict(by_shape.per_round_ms) == pytest.approx({"sglang": 1.6, "sglang tree": 3.0})
    assert all(p.speedup("kernels", by_shape) == pytest.approx(p.row.speedup) for p in shapes)
    assert dict(fit_engine_overheads(shapes, "kernels").per_round_ms).keys() == {"sglang"}  # one term for both


def _run(routing: str, fit_off: float, held_off: float) -> RoutingRun:
    """Rows under one routing whose kernel prediction misses the published speedup by ``fit_off`` on the fit rows
    and ``held_off`` on the held-out ones."""
    kernels_side = SimpleNamespace(target_side=SimpleNamespace(source="kernels"))
    rows = []
    for i, (held, off) in enumerate([(False, fit_off)] * 3 + [(True, held_off)] * 3):
        row = PublishedResult(id=f"r{i}", target="t", draft_kind="eagle3", engine="sglang", source="a test",
                              cells="written by the test", batch=1 + 3 * (i % 2), gamma=3, speedup=2.0,
                              speedup_metric="throughput")
        p = Priced(row, 0.7, 3, row.batch or 1, 1024.0, {"kernels": kernels_side}, held)  # type: ignore[dict-item]
        p.__dict__["parts"] = {"kernels": (2.0 * (1 + off), 4.0, 4.0)}  # tokens x base / round = 2 (1 + off)
        rows.append(p)
    return RoutingRun(routing, rows, [], {"kernels": 0.0, "roofline": 0.0})


def test_the_routing_is_chosen_on_the_fit_rows_only() -> None:
    """The held-out rows favour the other routing, as much as one likes: the fit rows' choice stands."""
    runs = [_run("balanced", 0.10, 0.0), _run("power_law_1.2", 0.02, 0.50)]
    assert choose_routing(runs).routing == "power_law_1.2"
    assert runs[1].error(False) == pytest.approx(0.02) and runs[1].error(True) == pytest.approx(0.5)
    assert runs[1].error(True, "1") == pytest.approx(0.5)
    assert choose_routing([_run("balanced", 0.10, 0.9), _run("power_law_1.2", 0.02, 0.0)]).routing == "power_law_1.2"
    assert choose_routing([_run("power_law_1.2", 0.05, 0.0), _run("balanced", 0.05, 0.3)]).routing == "balanced"


def test_leave_one_out_medians_match_recomputing() -> None:
    """Each column is the median of its row without that element, ties and even or odd lengths alike."""
    rng = np.random.default_rng(7)
    for n in (2, 3, 4, 9, 10):
        a = rng.random((20, n))
        a[:, 1] = a[:, 0]
        want = np.array([[np.median(np.delete(row, j)) for j in range(n)] for row in a])
        assert np.allclose(_leave_one_out_medians(a), want)


def test_leave_one_out_fits_are_refits_without_the_row() -> None:
    """A model's leave-one-out fits (one sort per grid point) equal fitting it again without each row."""
    truth = EngineOverheads(0.2, (("sglang", 1.6), ("sglang tree", 3.0), ("trtllm", 0.4)))
    rows = _rows_of(truth, (("sglang", False), ("trtllm", False)))
    for i, p in enumerate(rows):  # noise, so that leaving a row out moves the fit
        p.__dict__["parts"] = {"kernels": (p.parts["kernels"][0] * (1 + 0.03 * ((i * 7) % 5 - 2)),
                                           *p.parts["kernels"][1:])}
    for model in OVERHEAD_MODELS:
        loo = model.leave_one_out(rows, "kernels")
        assert [repr(o) for o in loo] == [repr(model.fit(rows[:i] + rows[i + 1:], "kernels")) for i in range(len(rows))]
    assert len({repr(o) for o in OVERHEAD_MODELS[3].leave_one_out(rows, "kernels")}) > 1


def test_the_model_is_chosen_by_leave_one_out_ties_to_the_simpler() -> None:
    scores = [ModelScore(m, "kernels", 0.0, e) for m, e in zip(OVERHEAD_MODELS, (0.08, 0.05, 0.05, None, 0.09, 0.2))]
    assert choose_model(scores).model is OVERHEAD_MODELS[1]
    assert choose_model(scores[3:]).model is OVERHEAD_MODELS[4]


def _with_baseline(tok_s: float, batch: int = 8) -> Priced:
    """A batch-``batch`` slowdown whose plain decoding published ``tok_s`` tokens/s in all, priced at a 10.5 ms
    lockstep step (known costs)."""
    row = PublishedResult(id=f"b{batch}-{tok_s:g}", target="t", draft_kind="eagle3", engine="sglang",
                          source="a test", cells="written by the test", batch=batch, gamma=3, baseline_tok_s=tok_s,
                          spec_tok_s=0.9 * tok_s, tok_s_kind="total")
    cost = SimpleNamespace(target_step_ms=lambda context, batch: 10.5, target_side=SimpleNamespace(source="kernels"))
    p = Priced(row, 0.7, 3, batch, 1024.0, {"kernels": cost, "roofline": cost}, False)  # type: ignore[dict-item]
    p.__dict__["parts"] = {s: (2.0, 12.0, 10.5) for s in ("kernels", "roofline")}  # a 1.75x speedup as lockstep
    return p


def test_a_row_whose_baseline_is_not_lockstep_is_not_expressed() -> None:
    """8 sequences at a published 8000 / (3 x 10.5) tokens/s imply a 31.5 ms step, 3x the 10.5 ms priced: beyond
    :data:`BASELINE_LIMIT`, named with the ratio; at 1.5x (and at 1/1.5x) the row stays; in the slowdown list the
    gated row says what lockstep pricing would predict, and is not counted."""
    assert BASELINE_LIMIT == 2.0
    far = _with_baseline(8000 / 31.5)
    assert far.row.baseline_step_ms == pytest.approx(31.5)
    why = baseline_mismatch(far)
    assert why is not None and "31.5 ms per decode step at batch 8, 3.00x the step priced (kernels) for 8 " \
        "sequences in lockstep, 10.5 ms (beyond 2x either way)" in why
    assert baseline_mismatch(_with_baseline(8000 / (1.5 * 10.5))) is None
    assert baseline_mismatch(_with_baseline(8000 * 1.5 / 10.5)) is None
    lines = slowdown_lines([far.row], [], {far.row.id: why}, {"kernels": 0.0, "roofline": 0.0}, [far])
    assert f"  {far.row.id}: published 0.90x, not expressed: its published baseline implies" in lines[1]
    assert lines[1].endswith("; priced as lockstep decoding it would be kernels 1.75x (not a slowdown), roofline "
                             "1.75x (not a slowdown)")
    assert lines[-1].startswith("published slowdowns at batch > 1: 0 expressed, 0 predicted as slowdowns")
