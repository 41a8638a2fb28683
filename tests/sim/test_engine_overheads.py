"""The fitted engine overheads: the shipped file, its round trip, and what ``python -m sim`` adds with it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from presets.hardware import HARDWARE
from sim import kernels
from sim.cli import main as sim_main
from sim.engine_overheads import (OVERHEADS_FILE, FittedOverhead, WithEngineOverhead, for_shape, load_overheads,
                                  table_sha256, with_fitted_overhead, write_overheads)
from sim.rank_law import RankLaw
from sim.tree_advice import sglang_advice
from sim.tree_search import sglang_candidates, sglang_tree
from sim.trees import (PositionalAcceptance, TokenTree, predict_tree, sglang_branches, sglang_draft_widths,
                       sglang_round_cost, tree_round_cost)
from sim.published import PUBLISHED_FILE
from sim.stepcost import EngineOverheads, EngineRoundOverhead, GpuSetup, build_step_cost
from sim.tree_cli import main as tree_main
from sim.validate import main as validate_main

HAS_KERNELS = kernels.kernels_unavailable() is None


def test_the_shipped_overheads_were_fitted_on_the_shipped_table() -> None:
    """An edited published table without ``python -m sim validate --write-overheads`` fails here."""
    shipped = load_overheads()
    assert set(shipped) == {"kernels", "roofline"}
    assert {f.table_sha256 for f in shipped.values()} == {table_sha256(PUBLISHED_FILE)}
    assert all(f.fit_rows > 0 and f.leave_one_out_error is not None for f in shipped.values())


@pytest.mark.parametrize("fitted", [0.25, EngineRoundOverhead(0.1, 0.8, 0.02),
                                    EngineOverheads(0.08, (("sglang", 0.6), ("sglang tree", 1.6), ("trtllm", 0.2)))],
                         ids=["per-step", "per-round", "per-engine"])
def test_write_and_load_round_trip(tmp_path: Path, fitted: float | EngineRoundOverhead | EngineOverheads) -> None:
    records = {s: FittedOverhead.of(s, "a model", fitted, fit_rows=7, leave_one_out_error=0.05, held_out_error=None,
                                    table_sha256="ab") for s in ("kernels", "roofline")}
    path = tmp_path / "o.toml"
    write_overheads(path, records)
    assert load_overheads(path) == records


def test_what_a_round_pays_per_engine() -> None:
    f = FittedOverhead.of("kernels", "m", EngineOverheads(0.1, (("sglang", 0.6), ("sglang tree", 1.6))))
    assert f.for_engine("sglang") == EngineRoundOverhead(0.1, 0.6)
    assert f.for_engine("sglang", tree=True) == EngineRoundOverhead(0.1, 1.6)
    assert f.for_engine("vllm") == EngineRoundOverhead(0.1, 0.0) and not f.names_engine("vllm")
    every = FittedOverhead.of("roofline", "m", EngineRoundOverhead(0.04, 0.8))
    assert every.for_engine("vllm") == EngineRoundOverhead(0.04, 0.8) and every.names_engine("vllm")


def test_a_bad_file_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "o.toml"
    bad.write_text("[kernels]\nmodel = 'x'\n")
    with pytest.raises(ValueError, match=r"^engine overheads .*o\.toml: .*rewrite it with python -m sim validate"):
        load_overheads(bad)


def _paid(model_dir: Path, tmp_path: Path, chain_round: float, tree_round: float, engine: str = "sglang"):
    """A roofline seam cost on one H100 plus a written overhead: 0.1 ms per draft step, SGLang's chain and tree
    rounds at the given terms."""
    path = tmp_path / "o.toml"
    o = EngineOverheads(0.1, (("sglang", chain_round), ("sglang tree", tree_round)))
    write_overheads(path, {s: FittedOverhead.of(s, "per engine, trees apart", o, fit_rows=9, held_out_error=0.03)
                           for s in ("kernels", "roofline")})
    cost = build_step_cost(str(model_dir), "eagle3", GpuSetup(HARDWARE["h100-sxm"], "sglang"), "roofline")
    return cost, with_fitted_overhead(cost, engine, path=path)


def test_the_overhead_is_on_the_draft_steps_and_the_round(model_dir: Path, tmp_path: Path) -> None:
    """Per draft forward 0.1 ms, per chain round 0.6 ms; the target's and the verification's prices untouched."""
    cost, paid = _paid(model_dir, tmp_path, 0.6, 1.6)
    assert isinstance(paid, WithEngineOverhead)
    assert paid.draft_step_ms(512) == pytest.approx(cost.draft_step_ms(512) + 0.1)
    assert paid.draft_forward_ms(4, 512) == pytest.approx(cost.draft_forward_ms(4, 512) + 0.1)
    assert paid.round_overhead_ms(3) == pytest.approx(cost.round_overhead_ms(3) + 0.6)
    assert paid.shaped(True).round_overhead_ms(3) == pytest.approx(cost.round_overhead_ms(3) + 1.6)
    assert (paid.target_step_ms(512), paid.verify_ms(4, 512), paid.verify_extend_ms(8, 4, 512)) == (
        cost.target_step_ms(512), cost.verify_ms(4, 512), cost.verify_extend_ms(8, 4, 512))
    assert "0.10 ms per draft step + 0.60 ms per chain round (1.60 per tree round) (sglang, roofline source" \
        in paid.describe()["engine_overhead"]
    assert for_shape(cost, True) is cost  # a cost without an engine overhead is left as it is
    _, other = _paid(model_dir, tmp_path, 0.6, 1.6, engine="vllm")
    assert other.round_overhead_ms(3) == pytest.approx(cost.round_overhead_ms(3))
    assert "no fitted row ran on vllm, so no per-round term of its own" in other.line()


def test_a_tree_round_pays_what_validate_fitted(model_dir: Path, tmp_path: Path) -> None:
    """The round ``sim tree`` charges an SGLang tree (and a chain) with the shipped-style overhead is the one
    ``sim validate`` fitted it on: its per-step term once per step, its tree (or chain) term once per round."""
    cost, paid = _paid(model_dir, tmp_path, 0.6, 1.6)
    fitted = EngineOverheads(0.1, (("sglang", 0.6), ("sglang tree", 1.6)))
    for steps, topk, tokens, tree in ((4, 4, 16, True), (3, 1, 4, False), (1, 3, 3, True), (1, 3, 2, False)):
        assert sglang_branches(steps, topk, tokens) is tree
        bare, with_ = (sglang_round_cost(c, steps, topk, tokens, 1024.0) for c in (cost, paid))
        total = lambda rc: rc.draft_ms + rc.verify_ms + rc.overhead_ms  # noqa: E731
        assert total(with_) == pytest.approx(total(bare) + fitted.for_engine("sglang", tree).round_ms(steps))
    chain, branching = TokenTree.chain(3), TokenTree(((0,), (1,), (0, 0)))
    for t, term in ((chain, 0.6), (branching, 1.6)):
        rc0, rc1 = tree_round_cost(t, cost, 512.0), tree_round_cost(t, paid, 512.0)
        assert rc1.overhead_ms - rc0.overhead_ms == pytest.approx(term)
        assert rc1.draft_ms - rc0.draft_ms == pytest.approx(0.1 * len(t.frontier_widths))


@pytest.mark.parametrize("chain_round,tree_round,topk_one", [(0.0, 30.0, True), (30.0, 0.0, False)],
                         ids=["dear-trees", "dear-chains"])
def test_sglang_advice_charges_each_kind_its_own(model_dir: Path, tmp_path: Path, chain_round: float,
                                                 tree_round: float, topk_one: bool) -> None:
    """The advice is still the best of its flag grid by brute force (predict_tree prices each candidate's kind),
    and a dear tree round steers it to a chain, a dear chain round to a tree."""
    _, paid = _paid(model_dir, tmp_path, chain_round, tree_round)
    acc = RankLaw().extend(PositionalAcceptance.from_chain([0.75]))
    adv = sglang_advice(acc, paid, 8, 4, 512.0)
    best = 0.0
    for steps in range(1, 5):
        for topk in range(1, 11):
            n_cands = len(sglang_candidates(acc, steps, topk))
            for tokens in ([steps + 1] if topk == 1 else range(2, min(n_cands, 8) + 2)):
                if tokens - 1 <= 8:
                    tree = sglang_tree(acc, steps, topk, tokens)
                    best = max(best, predict_tree(tree, acc, paid, 512.0, 1, sglang_draft_widths(steps, topk),
                                                  steps + 1).speedup)
    assert math.isclose(adv.prediction.speedup, best, rel_tol=1e-12)
    assert (adv.flags["speculative_eagle_topk"] == 1) is topk_one


def _round_ms(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[float, dict]:
    assert sim_main([*args, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    return doc["rows"][0]["round_time_ms"], doc


@pytest.mark.parametrize("with_kernels", [False, True], ids=["extra-absent", "extra-present"])
def test_the_cli_adds_the_shipped_overhead_and_says_so(model_dir: Path, with_kernels: bool,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A chain on an H100 in SGLang: the round grows by exactly γ · per step + SGLang's per-round term of the source
    that priced the target, the output names it; ``--engine-overhead none`` leaves it out."""
    if with_kernels and not HAS_KERNELS:
        pytest.skip("aiconfigurator-core (the costs extra) not installed")
    if not with_kernels:
        monkeypatch.setattr(kernels, "kernels_unavailable", lambda: "aiconfigurator-core==0.12.0 is not installed")
        monkeypatch.setattr(kernels, "package_dir", lambda: None)
    args = ["--target", str(model_dir), "--draft", "eagle3", "--hardware", "h100-sxm", "--engine", "sglang",
            "--tau", "2.9", "--gamma", "3"]
    paid, doc = _round_ms(args, capsys)
    bare, bare_doc = _round_ms([*args, "--engine-overhead", "none"], capsys)
    source = "kernels" if with_kernels else "roofline"
    expected = load_overheads(OVERHEADS_FILE)[source].for_engine("sglang").round_ms(3)
    assert expected > 0 and paid - bare == pytest.approx(expected, abs=1e-3)
    assert any(line.startswith("engine overhead: ") and f"(sglang, {source} source;" in line
               for line in doc["cost_source"])
    assert not any(line.startswith("engine overhead") for line in bare_doc["cost_source"])


def test_sim_tree_names_the_overhead_and_leaves_it_out_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--preset", "eagle3-llama3.1-8b", "--hardware", "h100-sxm", "--engine", "sglang", "--cost-source",
            "roofline", "--budget", "4", "--format", "json"]
    docs = []
    for extra in ([], ["--engine-overhead", "none"]):
        assert tree_main([*args, *extra]) == 0
        docs.append(capsys.readouterr().out)
    assert "engine overhead: 0.04 ms per draft step" in docs[0] and "engine overhead" not in docs[1]


def test_validate_writes_what_it_adopted(tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """On a small table: the file names the adopted model per source and the table it came from."""
    row = '''
[[result]]
id = "r{i}"
target = "{target}"
draft_kind = "eagle3"
hardware = "l4"
engine = "sglang"
batch = 1
gamma = {g}
acceptance = 2.4
acceptance_kind = "tau_incl_bonus"
speedup = {s}
speedup_metric = "throughput"
source = "a test"
cells = "written by the test"
'''
    table = tmp_path / "t.toml"
    table.write_text("".join(row.format(i=i, target=model_dir, g=g, s=s)
                             for i, (g, s) in enumerate([(2, 1.8), (3, 1.9), (4, 1.7), (5, 1.6), (3, 2.0), (2, 1.5)])))
    out = tmp_path / "o.toml"
    assert validate_main(["--table", str(table), "--write-overheads", str(out)]) == 0
    text = capsys.readouterr().out
    written = load_overheads(out)
    adopted = text.split("held-out rows are not consulted: ")[-1].split(";")[:2]
    assert [f"{s} {written[s].model}" for s in ("kernels", "roofline")] == [a.strip() for a in adopted]
    assert written["kernels"].table_sha256 == table_sha256(table)
    assert f"engine overheads written to {out}" in text
