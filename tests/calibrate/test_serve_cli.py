"""``python -m calibrate serve`` on benchmark files: bad input is one line, exit status 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibrate.serve_cli import main


def _result(c: int, model: str = "m", **extra: object) -> dict:
    n = 6
    return {"date": "20261127-080000", "backend": "openai-chat", "model_id": model, "request_rate": "inf",
            "max_concurrency": c, "duration": 3.0, "completed": n, "start_times": [0.4 * i for i in range(n)],
            "ttfts": [0.1] * n, "itls": [[0.02] * 15] * n, "latencies": [0.4] * n, "input_lens": [30] * n,
            "output_lens": [16] * n, "errors": [""] * n, **extra}


#: A k = 4 run's spec-decode counter deltas (recent vllm bench serve): 20 drafts, 30 of 80 tokens accepted.
SPEC4 = {"spec_decode_num_drafts": 20, "spec_decode_draft_tokens": 80, "spec_decode_accepted_tokens": 30,
         "spec_decode_per_position_acceptance_rates": [0.6, 0.5, 0.3, 0.1]}


def _write(p: Path, *results: dict) -> str:
    p.write_text("\n".join(json.dumps(r) for r in results) + "\n")
    return str(p)


def _fails(argv: list[str], msg: str, capsys: pytest.CaptureFixture[str], out: Path) -> None:
    try:
        rc = main([*argv, "--out", str(out), "--seeds", "1"])
    except SystemExit as e:
        rc = int(e.code or 0)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and msg in err[0], err
    assert not out.exists()


def test_bad_benchmark_input_is_one_line_and_nothing_written(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    off = _write(tmp_path / "off.json", _result(1), _result(2))
    k4 = _write(tmp_path / "k4.json", _result(1), _result(2))
    other = _write(tmp_path / "other.json", _result(1, "another-model"))
    trunc = tmp_path / "trunc.json"
    trunc.write_text(json.dumps(_result(1))[:150])
    out = tmp_path / "cal"
    _fails(["--spec", f"k=4:{k4}"], "no speculation-off configuration", capsys, out)
    _fails(["--off", off], "no speculative configuration", capsys, out)
    _fails(["--off", off, "--spec", f"k=4:{other}"], "mixed models across configurations", capsys, out)
    _fails(["--off", off, "--spec", f"k=4:{trunc}"], "trunc.json: not valid JSON", capsys, out)
    _fails(["--off", off, "--spec", f"k=4:{tmp_path / 'missing.json'}"], "missing.json: no such file", capsys, out)
    _fails(["--off", off, "--spec", "k4.json"], "expected k=K:FILE", capsys, out)
    _fails([str(tmp_path), "--off", off, "--spec", f"k=4:{k4}"], "not both", capsys, out)
    (tmp_path / "m.json").write_text(json.dumps({"off": "off.json", "spec": {"4": "k4.json"}, "gpu": "h100"}))
    _fails(["--manifest", str(tmp_path / "m.json")], "unknown key 'gpu'", capsys, out)


def test_bad_deployment_flags_are_one_line_before_any_fit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    off = _write(tmp_path / "off.json", _result(1), _result(2))
    k4 = _write(tmp_path / "k4.json", _result(1), _result(2))
    files = ["--off", off, "--spec", f"k=4:{k4}"]
    out = tmp_path / "cal"
    _fails([*files, "--target", "Llama-3.2-1B"], "--target needs --hardware GPU", capsys, out)
    _fails([*files, "--hardware", "h900"], "unknown hardware 'h900'; valid: h100-sxm", capsys, out)
    _fails([*files, "--hardware", "h100-sxm", "--engine", "tgi"], "unknown engine 'tgi'; valid: vllm, sglang",
           capsys, out)
    _fails([*files, "--hardware", "h100-sxm", "--engine", "vllm", "--cost-source", "roofline"],
           "--engine vllm has no effect with --cost-source roofline", capsys, out)
    _fails([str(tmp_path), "--hardware", "h100-sxm"], "applies to benchmark files", capsys, out)
    # the files' model ("m") is no model sim knows; an unknown --target; NVFP4 on Hopper; a TP the heads refuse
    _fails([*files, "--hardware", "h100-sxm"], "the model the benchmark files name; give --target MODEL", capsys, out)
    _fails([*files, "--hardware", "h100-sxm", "--target", "no/such-model"], "'no/such-model': unknown model",
           capsys, out)
    _fails([*files, "--hardware", "h100-sxm", "--target", "Llama-3.2-1B", "--dtype", "nvfp4"],
           "--dtype nvfp4 needs FP4 tensor cores", capsys, out)
    _fails([*files, "--hardware", "h100-sxm", "--target", "Llama-3.2-1B", "--tp", "3"], "--tp 3:", capsys, out)
    # calibrate serve fits its own per-step overhead: sim's fitted engine overhead is not a flag here
    _fails([*files, "--hardware", "h100-sxm", "--engine-overhead", "none"], "unknown option '--engine-overhead'",
           capsys, out)


def test_the_files_model_is_the_target_when_none_is_given(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            llama_config_dir: str) -> None:
    # a vllm bench file names its model_id: a local directory with a config.json is a model sim can price
    off = _write(tmp_path / "off.json", _result(1, llama_config_dir), _result(2, llama_config_dir))
    k4 = _write(tmp_path / "k4.json", _result(1, llama_config_dir, **SPEC4), _result(2, llama_config_dir, **SPEC4))
    out = tmp_path / "cal"
    rc = main(["--off", off, "--spec", f"k=4:{k4}", "--hardware", "t4", "--cost-source", "roofline", "--seeds", "1",
               "--advice-draws", "1", "--holdout-loads", "none", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert f"model: {llama_config_dir} (named by the benchmark files" in text
    assert "cost source: target roofline (asked: --cost-source roofline)" in text
    doc = json.loads((out / "serve_calibration.json").read_text())
    assert doc["step_cost"]["kind"] == "forward_step" and doc["step_cost"]["setup"]["target"] == llama_config_dir


GUIDELLM = Path(__file__).resolve().parents[1] / "fixtures" / "benchfiles" / "guidellm"


def _guidellm(out: Path, *extra: str) -> list[str]:
    return ["--off", str(GUIDELLM / "off"), "--spec", f"k=2:{GUIDELLM / 'k2'}", "--spec", f"k=4:{GUIDELLM / 'k4'}",
            "--slots", "8", "--seeds", "1", "--advice-draws", "1", "--out", str(out), *extra]


@pytest.mark.slow
@pytest.mark.parametrize("source", ["kernels", "roofline"])
def test_the_guidellm_files_calibrate_from_a_forward(source: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from sim import kernels

    if source == "kernels" and kernels.kernels_unavailable():
        pytest.skip(f"the costs extra is absent: {kernels.kernels_unavailable()}")
    out = tmp_path / "cal"
    engine = ["--engine", "sglang"] if source == "kernels" else []
    assert main(_guidellm(out, "--hardware", "h100-sxm", "--target", "Llama-3.2-1B", "--cost-source", source,
                          *engine)) == 0
    text = capsys.readouterr().out
    assert f"cost source: target {source} (" in text and "draft not priced apart" in text
    assert "deployment: Llama-3.2-1B (preset Llama-3.2-1B) on 1 x h100-sxm at bf16" in text
    assert "step cost: efficiency " in text and "held-out MAPE throughput_tokens_per_s" in text
    doc = json.loads((out / "serve_calibration.json").read_text())
    cost = doc["step_cost"]
    assert cost["kind"] == "forward_step" and cost["setup"]["source"] == source and cost["efficiency"] > 0
    if source == "kernels":
        assert "sglang" in cost["setup"]["why"] and cost["forward"]["engine"] == "sglang"
    from sim.serving import step_cost_from_dict

    assert step_cost_from_dict(cost).describe() == cost  # the written calibration reads back, same forward
