"""benchmarks/gpu_costs_vs_measured.py: a gpu-check roofline.csv priced again with the kernel tables.

The script is loaded from its file (benchmarks/ is no package)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.scripts import load_benchmark

from sim import kernels

ROOT = Path(__file__).resolve().parents[2]
HEADER = ("run,role,model_preset,batch,n_tokens,context_tokens,dtype,n,ms_median,ms_p10,ms_p90,hardware_preset,"
          "roofline_ms,measured_over_roofline")
ROWS = ("pair,target,Llama-3.2-1B,1,1,128,float32,3,14.4,13.0,15.0,h100-sxm,2.0,7.2",
        "pair,draft,gpt2,1,1,128,float32,3,11.0,10.0,12.0,h100-sxm,0.5,22.0")


@pytest.fixture(scope="module")
def script() -> ModuleType:
    return load_benchmark("gpu_costs_vs_measured")


@pytest.mark.slow  # compiles a 1B model for the kernel tables (about 3 s)
def test_ratios_per_shape_and_the_csv(script: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    if kernels.kernels_unavailable():
        pytest.skip(kernels.kernels_unavailable() or "")
    src, out = tmp_path / "roofline.csv", tmp_path / "out.csv"
    src.write_text("\n".join((HEADER, *ROWS)) + "\n")
    assert script.main([str(src), "--csv", str(out)]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["rows"] == 2 and last["engine"] == "vllm"
    rows = {r["model_preset"]: r for r in csv.DictReader(out.open())}
    llama, gpt2 = rows["Llama-3.2-1B"], rows["gpt2"]
    assert 0.5 < float(llama["kernels_ms"]) < 5.0  # a bf16 1B decode step on an H100
    assert float(llama["measured_over_kernels"]) == pytest.approx(14.4 / float(llama["kernels_ms"]))
    assert float(llama["measured_over_roofline"]) == pytest.approx(7.2)
    assert gpt2["kernels_ms"] == "" and "GPT2LMHeadModel" in gpt2["kernels_source"]


def test_bad_input_is_one_line(script: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(SystemExit) as exc:
        script.main([str(bad)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "missing column(s)" in err
