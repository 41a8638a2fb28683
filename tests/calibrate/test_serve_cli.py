"""``python -m calibrate serve`` on benchmark files: bad input is one line, exit status 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibrate.serve_cli import main


def _result(c: int, model: str = "m") -> dict:
    n = 6
    return {"date": "20261127-080000", "backend": "openai-chat", "model_id": model, "request_rate": "inf",
            "max_concurrency": c, "duration": 3.0, "completed": n, "start_times": [0.4 * i for i in range(n)],
            "ttfts": [0.1] * n, "itls": [[0.02] * 15] * n, "latencies": [0.4] * n, "input_lens": [30] * n,
            "output_lens": [16] * n, "errors": [""] * n}


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
