"""The step-cost seam: local config files, with the kernel extra present and absent, bad input, the two commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest

from presets.hardware import HARDWARE
from sim import kernels
from sim.cli import main as sim_main
from sim.stepcost import (EngineOverheads, EngineRoundOverhead, GpuSetup, StepCost, build_step_cost, engine_round_overhead_ms,
                          source_lines)
from sim.tree_cli import main as tree_main
from tests.support.model_configs import LLAMA_LIKE, MOE_LIKE

HAS_KERNELS = kernels.kernels_unavailable() is None
needs_kernels = pytest.mark.skipif(not HAS_KERNELS, reason="aiconfigurator-core (the costs extra) not installed")


def test_roofline_from_a_local_config(model_dir: Path) -> None:
    cost = build_step_cost(str(model_dir), "eagle3", GpuSetup(HARDWARE["l4"]), "auto")
    assert isinstance(cost, StepCost)
    assert cost.target_side.source == "roofline" and "no kernel tables for l4" in cost.target_side.why
    assert 0 < cost.draft_step_ms(512) < cost.target_step_ms(512) < cost.verify_ms(4, 512)


def test_auto_falls_back_without_the_extra(model_dir: Path, no_kernels: None) -> None:
    cost = build_step_cost(str(model_dir), "eagle", GpuSetup(HARDWARE["h200"]), "auto")
    assert cost.target_side.source == "roofline" and "not installed" in cost.target_side.why
    assert any("fallback: aiconfigurator-core==0.12.0 is not installed" in line
               for line in source_lines(cost.describe()))


def test_kernels_asked_without_the_extra_is_one_line(model_dir: Path, no_kernels: None,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert sim_main(["--target", str(model_dir), "--draft", "eagle3", "--hardware", "h200",
                     "--cost-source", "kernels", "--alpha", "0.8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not installed" in err[0] and "valid: --cost-source auto or roofline" in err[0]


@needs_kernels
@pytest.mark.slow  # loads the h100 tables: seconds
@pytest.mark.parametrize("config", [LLAMA_LIKE, MOE_LIKE], ids=["dense", "moe"])
def test_kernels_from_a_local_config(tmp_path: Path, config: dict) -> None:
    (tmp_path / "config.json").write_text(json.dumps(config))
    cost = build_step_cost(str(tmp_path), "eagle3", GpuSetup(HARDWARE["h100-sxm"], "vllm"), "kernels")
    assert cost.target_side.source == "kernels" and "h100_sxm vllm" in cost.target_side.why
    t1, t4 = cost.target_step_ms(1024), cost.target.forward_ms(4, 1024)
    assert 0 < cost.draft_step_ms(1024) < t1 <= t4
    # the monotone envelope: more tokens or a larger batch never costs less
    assert all(cost.target.forward_ms(q, 1024, b) <= cost.target.forward_ms(q + 1, 1024, b)
               for q in range(1, 6) for b in (1, 3, 8))
    assert cost.target.forward_ms(4, 1024, 8) <= cost.target.forward_ms(4, 1024, 16)
    assert not [line for line in kernels.CAPTURED if line in source_lines(cost.describe())]


@needs_kernels
@pytest.mark.slow  # loads the h200 tables: seconds
def test_attention_rule_brackets(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_LIKE))
    by_rule = {rule: build_step_cost(str(tmp_path), "ngram", GpuSetup(HARDWARE["h200"], "sglang"), "kernels",
                                     batch=32, rule=rule).target.forward_ms(4, 2048, 32)
               for rule in ("lower", "kv-once", "upper")}
    assert by_rule["lower"] <= by_rule["kv-once"] <= by_rule["upper"]
    assert by_rule["lower"] < by_rule["upper"]


@pytest.mark.parametrize("args,needle", [
    (["--target", "no-such/model", "--draft", "eagle3"], "unknown model; valid: a preset"),
    (["--target", "Llama-3.1-8B", "--draft", "eagle3", "--hardware", "h200", "--dtype", "nvfp4"],
     "--dtype nvfp4 needs FP4 tensor cores"),
    (["--target", "Llama-3.1-8B", "--draft", "eagle3", "--hardware", "h200", "--tp", "3"], "--tp 3:"),
    (["--target", "Llama-3.1-70B", "--draft", "eagle3", "--hardware", "h100-sxm", "--tp", "1"], "does not fit"),
    (["--target", "Llama-3.1-8B", "--draft", "eagle3", "--engine", "tgi"], "engine"),
    (["--target", "Llama-3.1-8B", "--draft", "eagle3", "--dtype", "int3"], "dtype"),
    (["--target", "Llama-3.1-8B", "--draft", "eagle3", "--hardware", "v100"], "hardware"),
    (["--target", "Llama-3.1-8B", "--draft", "eagle3", "--engine", "vllm", "--cost-source", "roofline"],
     "no effect with --cost-source roofline"),
    (["--target", "Llama-3.1-8B", "--draft", "eagle3", "--batch", "4", "--mode", "event"], "--batch applies"),
    (["--target", "Llama-3.1-8B", "--draft", "Gemma-3-1B", "--hardware", "h200"], "vocabulary"),
])
def test_bad_input_is_one_line(args: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        status = sim_main([*args, "--alpha", "0.7"])
    except SystemExit as exc:  # argparse's choices refuse before main's own checks
        status = int(exc.code or 0)
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_roofline_path_checks_memory_too(no_kernels: None, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue #45: a 70B bf16 model on one 80 GB GPU is one line, not a price (roofline source)."""
    assert sim_main(["--target", "Llama-3.1-70B", "--draft", "eagle3", "--hardware", "h100-sxm",
                     "--cost-source", "roofline", "--alpha", "0.7"]) == 2
    assert "does not fit 1 x h100-sxm at bf16" in capsys.readouterr().err


def test_ngram_and_medusa_drafts(model_dir: Path, no_kernels: None) -> None:
    ngram = build_step_cost(str(model_dir), "ngram", GpuSetup(HARDWARE["h100-sxm"]), "auto")
    assert ngram.draft_step_ms(512) == 0.0 and ngram.draft.side.source == "none"
    medusa = build_step_cost(str(model_dir), "medusa", GpuSetup(HARDWARE["h100-sxm"]), "auto")
    assert 0 < medusa.draft_step_ms(512) < medusa.target_step_ms(512)


@needs_kernels
@pytest.mark.slow
@pytest.mark.parametrize("args,source", [
    (["--target", "meta-llama/Llama-3.1-8B-Instruct", "--draft", "eagle3", "--hardware", "h200", "--engine",
      "sglang", "--tau", "2.9", "--gamma", "3"], "h200_sxm sglang 0.5.14 tables"),
    (["--target", "deepseek-ai/DeepSeek-R1", "--draft", "mtp", "--hardware", "b200", "--engine", "trtllm", "--tp",
      "8", "--dtype", "nvfp4", "--tau", "2.82", "--gamma", "3"], "b200_sxm trtllm 1.3.0rc20 tables, MoE routing balanced"),
])
def test_the_issue_commands_name_their_source(args: list[str], source: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert sim_main(args) == 0
    out = capsys.readouterr().out
    assert f"cost source: target kernels (aiconfigurator-core 0.12.0, {source}); draft kernels" in out
    assert "low-fidelity" not in out and "optimal gamma = 3: speedup" in out


def test_prefill_and_batch_on_the_roofline(model_dir: Path) -> None:
    cost = build_step_cost(str(model_dir), "eagle3", GpuSetup(HARDWARE["h100-sxm"]), "roofline", batch=64)
    assert cost.prefill_ms(2048) > cost.target_step_ms(2048)
    assert cost.target_step_ms(2048, 64) > cost.target_step_ms(2048, 1)


def test_batch_changes_the_analytic_answer(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--target", str(model_dir), "--draft", "eagle3", "--hardware", "h100-sxm", "--cost-source", "roofline",
            "--alpha", "0.8", "--gamma", "3", "--format", "json"]
    docs = []
    for batch in ("1", "256"):
        assert sim_main([*base, "--batch", batch]) == 0
        docs.append(json.loads(capsys.readouterr().out))
    assert docs[1]["batch"] == 256 and docs[1]["rows"][0]["speedup"] < docs[0]["rows"][0]["speedup"]


@pytest.mark.parametrize("tool", [sim_main, tree_main])
def test_a_preset_that_outgrows_one_gpu_is_refused(tool: Callable[[list[str]], int],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A 70B target on one 80 GB GPU is one line naming a TP, a dtype or a GPU that fits: no price, no note."""
    on_h100 = ["--preset", "llama3-8b-70b", "--hardware", "h100-sxm"]  # (the preset's own default is a B200)
    args = [*on_h100, "--gamma", "3"] if tool is sim_main else [*on_h100, "--budget", "4"]
    try:
        status = tool(args)
    except SystemExit as exc:  # sim tree exits through toolkit.cli.fail
        status = int(exc.code or 0)
    assert status == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert captured.out == "" and len(err) == 1
    assert "Llama-3.1-70B (70.6B params) does not fit 1 x h100-sxm at bf16" in err[0]
    assert "valid: --tp 4, --hardware b200/b300/gb200" in err[0]


def test_a_first_command_still_runs_on_the_preset_roofline(capsys: pytest.CaptureFixture[str]) -> None:
    assert sim_main(["--preset", "llama3-1b-3b", "--gamma", "3"]) == 0
    out = capsys.readouterr().out
    assert "cost source: roofline (presets/hardware.py datasheet numbers)" in out
    assert "note: h100-sxm has kernel tables: add --engine vllm|sglang|trtllm" in out  # its default GPU


def test_a_preset_on_a_gpu_with_tables_says_how_to_use_them(capsys: pytest.CaptureFixture[str]) -> None:
    """The datasheet roofline is kept for a preset without GPU flags; on a GPU the kernel tables cover, the output
    names the flags that price it with them."""
    assert sim_main(["--preset", "eagle3-llama3.1-8b", "--hardware", "h200", "--tau", "2.9", "--gamma", "3"]) == 0
    out = capsys.readouterr().out
    assert "cost source: roofline (presets/hardware.py datasheet numbers)" in out
    assert "note: h200 has kernel tables: add --engine vllm|sglang|trtllm to price with them" in out
    assert sim_main(["--preset", "eagle3-llama3.1-8b", "--hardware", "l4", "--tau", "2.9", "--gamma", "3"]) == 0
    assert "kernel tables" not in capsys.readouterr().out  # an L4 has none


def test_a_separate_draft_model_from_its_own_config(model_dir: Path, tmp_path: Path, no_kernels: None) -> None:
    small = tmp_path / "my-small"
    small.mkdir()
    (small / "config.json").write_text(json.dumps({**LLAMA_LIKE, "num_hidden_layers": 2, "hidden_size": 512,
                                                   "intermediate_size": 1024}))
    cost = build_step_cost(str(model_dir), str(small), GpuSetup(HARDWARE["h100-sxm"]), "auto")
    assert cost.draft.kind == "model" and cost.draft.name == "my-small"
    assert 0 < cost.draft_step_ms(512) < cost.target_step_ms(512)
    # the round's first draft forward reads the verified positions: verify carries that extra width
    assert cost.verify_ms(4, 512) > cost.target.forward_ms(4, 512)


def test_engine_round_overhead_terms() -> None:
    """γ per-step overheads, one per-round overhead and one per sequence beyond the first (none at batch 1)."""
    o = EngineRoundOverhead(per_draft_step_ms=0.2, per_round_ms=1.0, per_extra_sequence_ms=0.05)
    assert o.round_ms(3) == pytest.approx(1.6)
    assert o.round_ms(3, batch=9) == pytest.approx(1.6 + 8 * 0.05)
    assert EngineRoundOverhead().round_ms(7, 64) == 0.0
    assert engine_round_overhead_ms(2, 4, 0.1) == pytest.approx(0.2)
    per_engine = EngineOverheads(0.1, (("sglang", 2.0),))
    assert per_engine.for_engine("sglang").round_ms(3) == pytest.approx(2.3)
    assert per_engine.for_engine("vllm").round_ms(3) == pytest.approx(0.3)  # an engine not named: none per round
    assert per_engine.for_engine("sglang", tree=True).round_ms(3) == pytest.approx(2.3)  # no tree term: the engine's
    by_shape = EngineOverheads(0.1, (("sglang", 2.0), ("sglang tree", 3.0)))
    assert by_shape.for_engine("sglang", tree=True).round_ms(3) == pytest.approx(3.3)


def test_a_tree_verifies_its_nodes_and_extends_over_the_accepted_path(model_dir: Path, no_kernels: None) -> None:
    """verify_extend_ms: the target over the tree's tokens, the draft's extend pass over the path it names; a chain
    verifies and extends over the same γ + 1 (verify_ms)."""
    cost = build_step_cost(str(model_dir), "eagle3", GpuSetup(HARDWARE["h100-sxm"]), "auto")
    assert cost.verify_extend_ms(4, 4, 512) == cost.verify_ms(4, 512)
    tree = cost.verify_extend_ms(16, 5, 512, batch=4)
    assert tree == pytest.approx(cost.target.forward_ms(16, 512, 4) + cost.draft.round_extra_ms(5, 512, 4))
    assert cost.verify_ms(16, 512, 4) > tree  # an extend over all 16 would charge the draft more


def test_a_bad_moe_routing_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="unknown MoE routing 'uniform'; valid: balanced, power_law_1.01, power_law_1.2"):
        GpuSetup(HARDWARE["h100-sxm"], moe_routing="uniform")
    with pytest.raises(SystemExit) as exit_:
        sim_main(["--preset", "eagle3-llama3.1-8b", "--moe-routing", "uniform", "--alpha", "0.8"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "uniform" in err[0] and "balanced, power_law_1.01, power_law_1.2" in err[0]


def test_the_moe_routing_without_the_extra(tmp_path: Path, no_kernels: None) -> None:
    """Without the extra an MoE model falls back to the roofline under any routing: no routing is claimed."""
    (tmp_path / "config.json").write_text(json.dumps(MOE_LIKE))
    costs = [build_step_cost(str(tmp_path), "eagle3", GpuSetup(HARDWARE["h100-sxm"], moe_routing=r), "auto")
             for r in kernels.MOE_ROUTINGS]
    assert {c.target_step_ms(1024) for c in costs} == {costs[0].target_step_ms(1024)}
    assert not any("MoE routing" in line for c in costs for line in source_lines(c.describe()))


@needs_kernels
@pytest.mark.slow  # loads the h100 tables: seconds
def test_the_moe_routing_is_named_and_leaves_dense_models_alone(tmp_path: Path) -> None:
    for name, config in (("dense", LLAMA_LIKE), ("moe", MOE_LIKE)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    setups = {r: GpuSetup(HARDWARE["h100-sxm"], "sglang", moe_routing=r) for r in kernels.MOE_ROUTINGS}
    dense = {r: build_step_cost(str(tmp_path / "dense"), "eagle3", s, "kernels") for r, s in setups.items()}
    assert len({c.verify_ms(4, 1024, 4) for c in dense.values()}) == 1  # no experts: the same price
    assert not any("MoE routing" in line for line in source_lines(dense["balanced"].describe()))
    moe = {r: build_step_cost(str(tmp_path / "moe"), "eagle3", s, "kernels") for r, s in setups.items()}
    assert moe["balanced"].verify_ms(4, 1024, 4) > moe["power_law_1.2"].verify_ms(4, 1024, 4)
    assert "h100_sxm sglang 0.5.14 tables, MoE routing power_law_1.01)" in source_lines(
        moe["power_law_1.01"].describe())[1]


@needs_kernels
@pytest.mark.slow  # loads the a100 tables: seconds
def test_a_routing_the_tables_lack_is_stood_in_for_and_said(tmp_path: Path) -> None:
    """A100's vllm tables hold no balanced MoE rows: the next routing they hold prices the model, named, rather
    than the whole side falling back to the roofline; sglang's hold them and price it as asked."""
    (tmp_path / "moe").mkdir()
    (tmp_path / "moe" / "config.json").write_text(json.dumps(MOE_LIKE))
    lacking = build_step_cost(str(tmp_path / "moe"), "eagle3", GpuSetup(HARDWARE["a100-80gb"], "vllm",
                                                                        moe_routing="balanced"), "kernels")
    line = source_lines(lacking.describe())[1]
    assert "kernels" in line and "MoE routing power_law_1.01 (these tables hold no balanced rows)" in line
    holding = build_step_cost(str(tmp_path / "moe"), "eagle3", GpuSetup(HARDWARE["a100-80gb"], "sglang",
                                                                        moe_routing="balanced"), "kernels")
    assert "MoE routing balanced)" in source_lines(holding.describe())[1]
