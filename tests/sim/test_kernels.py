"""The aiconfigurator-core adapter: quiet loading, the attention rule, cached handles, the envelope."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim import kernels
from tests.support.model_configs import MOE_LIKE, write_model_dir

needs_kernels = pytest.mark.skipif(kernels.kernels_unavailable() is not None, reason="the costs extra is absent")


def test_the_kv_once_rule_stays_in_the_bracket() -> None:
    fwd = kernels.KernelForward("m", "m", "h200_sxm", "sglang", heads_per_kv=4, ridge_flops_per_byte=206.0)
    assert fwd._attention_ms(1.0, 3.0, 4) == 1.0  # 16 FLOP/byte: under the ridge, the KV read once
    assert fwd._attention_ms(1.0, 3.0, 64) == pytest.approx(256 / 206)  # past the ridge: compute-bound
    assert fwd._attention_ms(1.0, 1.1, 64) == 1.1  # never above the upper bound


def test_an_unknown_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="valid: kv-once, lower, upper"):
        kernels.KernelForward("m", "m", "h200_sxm", "sglang", attention_rule="middle")


@needs_kernels
@pytest.mark.slow  # loads the h200 tables: seconds
def test_handles_are_cached_and_loading_is_quiet(capsys: pytest.CaptureFixture[str]) -> None:
    a = kernels.compile_handle("meta-llama/Meta-Llama-3.1-8B", "h200_sxm", "sglang", 1, 1, "bf16")
    assert kernels.compile_handle("meta-llama/Meta-Llama-3.1-8B", "h200_sxm", "sglang", 1, 1, "bf16") is a
    out = capsys.readouterr()
    assert "low-fidelity" not in out.out + out.err
    assert kernels.engine_version("h200_sxm", "sglang") == "0.5.14"


@needs_kernels
@pytest.mark.slow
def test_a_missing_table_is_kernels_unavailable() -> None:
    with pytest.raises(kernels.KernelsUnavailable):
        kernels.compile_handle("meta-llama/Meta-Llama-3.1-8B", "h200_sxm", "sglang", 1, 1, "nvfp4")


def test_fallback_rows_are_one_line_only_when_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "_PROVENANCE", set())
    monkeypatch.setattr(kernels, "CAPTURED", ["Loading low-fidelity fallback rows for mla_bmm_perf.parquet from x."])
    assert kernels.fallback_note() is None  # loaded, but no estimate used transferred rows
    kernels._PROVENANCE.add("xshape")
    note = kernels.fallback_note()
    assert note is not None and "\n" not in note and "xshape" in note and "1 table(s)" in note


def test_an_unknown_moe_routing_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^unknown MoE routing 'zipf'; valid: balanced, power_law_1.01, "
                                         r"power_law_1.2$"):
        kernels.KernelForward("m", "m", "h200_sxm", "sglang", moe_routing="zipf")
    assert kernels.check_moe_routing("balanced") == "balanced"


@needs_kernels
@pytest.mark.slow  # loads the h100 tables: seconds
def test_the_moe_routing_reaches_the_tables(tmp_path: Path) -> None:
    """A tiny MoE config (Qwen3-30B-A3B's expert shape, 16 layers): balanced routing prices 16 tokens dearer than
    the power law; the routing is in the handle's cache key and the description; ``None`` is the library's own
    compile (power_law_1.2 for Qwen3-MoE), so the handle built here from its pieces matches it."""
    path = str(write_model_dir(tmp_path / "moe", MOE_LIKE))

    def fwd(routing: str | None) -> kernels.KernelForward:
        return kernels.KernelForward(path, "moe", "h100_sxm", "sglang", 2, 2, moe_routing=routing)
    ms = {r: fwd(r).forward_ms(16, 1024) for r in (*kernels.MOE_ROUTINGS, None)}
    assert ms["balanced"] > 1.2 * ms["power_law_1.2"]
    assert ms[None] == pytest.approx(ms["power_law_1.2"])
    assert fwd("balanced").handle() is not fwd("power_law_1.2").handle()
    assert fwd("balanced").describe()["moe_routing"] == "balanced" and "moe_routing" not in fwd(None).describe()
