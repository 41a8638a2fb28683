"""Where ``calibrate ingest``'s cost model comes from is said truthfully (issue #45).

Before: a cost JSON written by hand was printed as ``costs: measured: FILE (a cost-model file)`` and
``cost_measured`` was true; only the files specscope writes (``calibrate``'s fits, llama-bench's timings) are
measured or fitted, anything else is supplied by the user.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim import kernels
from sim.cost import TabulatedCost
from tests.support.cli_inprocess import run_module

LINE = ("SpecDecoding metrics: Mean acceptance length: 3.03, Accepted throughput: 3.87 tokens/s, Drafted "
        "throughput: 5.72 tokens/s, Accepted: 337 tokens, Drafted: 498 tokens, Per-position acceptance rate: "
        "0.837, 0.669, 0.524, Avg Draft acceptance rate: 67.7%\n")


@pytest.mark.parametrize("metadata, said, measured", [
    ({}, "costs: supplied by the user (it records no source): taken as given, not measured: ", False),
    ({"source": "calibrate", "draft": "ngram:3"}, "costs: fitted by python -m calibrate to measured timings: ", True),
])
def test_the_cost_files_source_is_what_is_printed(tmp_path: Path, metadata, said, measured):
    log = tmp_path / "vllm.log"
    log.write_text(LINE)
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps(TabulatedCost({1: 20.0, 4: 26.0}, draft_step_ms_ref=2.0,
                                             metadata=metadata).describe()))
    r = run_module("calibrate", ["ingest", str(log), "--cost-model", str(cost)])
    assert r.returncode == 0, r.stderr
    assert said in r.stdout and "costs: measured: " not in r.stdout
    assert json.loads(r.stdout.strip().splitlines()[-1])["cost_measured"] is measured


HAS_KERNELS = kernels.kernels_unavailable() is None
SERVE = ["--mode", "serve", "--max-batch", "4096", "--arrival-rates", "1", "--requests", "10", "--new-tokens", "16",
         "--gamma-max", "3"]


def _ingest(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    log = tmp_path / "vllm.log"
    log.write_text(LINE)
    r = run_module("calibrate", ["ingest", str(log), *args])
    return r.returncode, r.stdout, r.stderr


def test_a_local_config_is_priced_by_the_seam_with_the_extra_absent(tmp_path: Path, model_dir: Path,
                                                                    no_kernels: None) -> None:
    """--target/--draft through sim/stepcost.py: the source of each side named, memory from the model's KV cache."""
    code, out, err = _ingest(tmp_path, "--target", str(model_dir), "--draft", "eagle3", "--hardware", "h100-sxm",
                             *SERVE, "--out", str(tmp_path / "o"))
    assert code == 0, err
    assert ("cost source: target roofline (fallback: aiconfigurator-core==0.12.0 is not installed); draft roofline "
            "(fallback: aiconfigurator-core==0.12.0 is not installed)") in out
    mem = json.loads((tmp_path / "o" / "ingest.json").read_text())["memory"]
    # 16 layers x 8 KV heads x 64 dims x 2 (K, V) x 2 bytes = 32 KiB a token for the target, one layer for the head
    per_token = 16 * 2 * 8 * 64 * 2 + 1 * 2 * 8 * 64 * 2
    assert mem["kv_bytes_per_sequence"] == pytest.approx(per_token * (512 + 16 + 3))
    assert mem["max_batch"] == int((0.9 * 80e9 - mem["weights_bytes"]) // mem["kv_bytes_per_sequence"])
    assert f"batch {mem['max_batch'] + 1} and above do not fit: memory binds below --max-batch 4096" in out
    assert "reproduce: python -m sim" in out and "--target" in out.split("reproduce: ")[1]


def test_kernels_asked_without_the_extra_is_one_line(tmp_path: Path, model_dir: Path, no_kernels: None) -> None:
    code, out, err = _ingest(tmp_path, "--target", str(model_dir), "--draft", "eagle3", "--cost-source", "kernels")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "not installed" in err and "valid: --cost-source auto or roofline" in err


@pytest.mark.skipif(not HAS_KERNELS, reason="aiconfigurator-core (the costs extra) not installed")
def test_a_local_config_is_priced_by_the_kernel_tables_of_the_ingested_engine(tmp_path: Path,
                                                                                model_dir: Path) -> None:
    code, out, err = _ingest(tmp_path, "--target", str(model_dir), "--draft", "eagle3", "--hardware", "h200", *SERVE)
    assert code == 0, err
    assert "cost source: target kernels (aiconfigurator-core 0.12.0, h200_sxm vllm " in out  # a vLLM log: vLLM's
    assert "batches that fit h200 (127 of 141 GB usable)" in out


def test_a_preset_that_outgrows_one_gpu_is_refused_and_a_tp_that_fits_runs(tmp_path: Path, no_kernels: None) -> None:
    code, out, err = _ingest(tmp_path, "--preset", "llama3-8b-70b", "--hardware", "h100-sxm")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "does not fit 1 x h100-sxm at bf16" in err and "valid: --tp 4" in err and "--batch" not in err
    code, out, err = _ingest(tmp_path, "--preset", "llama3-8b-70b", "--hardware", "h100-sxm", "--tp", "4", *SERVE)
    assert code == 0, err
    assert "cost source: target roofline (asked: --cost-source roofline)" not in out  # auto, fallen back
    assert "target roofline (fallback: " in out and "batches that fit 4 x h100-sxm (72 of 80 GB usable)" in out


def test_a_preset_without_gpu_flags_keeps_its_roofline(tmp_path: Path) -> None:
    code, out, err = _ingest(tmp_path, "--preset", "llama3-1b-8b", "--hardware", "h100-sxm")
    assert code == 0, err
    assert "cost source: roofline (presets/hardware.py datasheet numbers), target and draft" in out
    assert "costs: assumed: roofline of Llama-3.2-1B -> Llama-3.1-8B on h100-sxm" in out


def test_a_bad_moe_routing_is_one_line(tmp_path: Path, model_dir: Path) -> None:
    code, out, err = _ingest(tmp_path, "--target", str(model_dir), "--draft", "eagle3", "--moe-routing", "zipf")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "zipf" in err and "balanced, power_law_1.01, power_law_1.2" in err


@pytest.mark.skipif(not HAS_KERNELS, reason="aiconfigurator-core (the costs extra) not installed")
@pytest.mark.slow  # loads the h200 tables: seconds
def test_the_moe_routing_reaches_the_kernel_tables_and_the_reproduce_line(tmp_path: Path) -> None:
    from tests.support.model_configs import MOE_LIKE, write_model_dir

    moe = write_model_dir(tmp_path / "moe", MOE_LIKE)
    code, out, err = _ingest(tmp_path, "--target", str(moe), "--draft", "eagle3", "--hardware", "h200",
                             "--moe-routing", "power_law_1.01", "--out", str(tmp_path / "o"))
    assert code == 0, err
    assert "h200_sxm vllm 0.24.0 tables, MoE routing power_law_1.01)" in out
    assert "--moe-routing power_law_1.01" in out.split("reproduce: ")[1]
