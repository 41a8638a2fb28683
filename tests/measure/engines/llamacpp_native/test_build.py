"""The llama.cpp build says its progress (measure.engines.llamacpp_native.build): cmake's percentage, at most one
line every ~10 % or 30 s (the rarer), the full output still in the log — checked with a fake ``cmake``."""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

import pytest

from measure.engines.llamacpp_native import build as B


def _fake_cmake(bin_dir: Path, lines: list[str], exit_code: int = 0) -> None:
    """A ``cmake`` on ``bin_dir`` that prints ``lines`` (and its own arguments first), then exits ``exit_code``."""
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "cmake"
    script.write_text(f"#!{sys.executable}\nimport sys\nprint('args:', *sys.argv[1:])\n"
                      f"for line in {lines!r}:\n    print(line, flush=True)\nsys.exit({exit_code})\n")
    script.chmod(0o755)


def _percent_lines(step: int) -> list[str]:
    out = []
    for pct in range(0, 101, step):
        out += [f"[{pct:3d}%] Building CXX object ggml/src/f{pct}.cpp.o", "some compiler note"]
    return out


def _clock(seconds_per_call: float):
    ticks = itertools.count()
    return lambda: next(ticks) * seconds_per_call


@pytest.mark.parametrize("seconds_per_line, said", [
    (6.0, [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]),  # 10 points take 30 s: a line every 10 %
    (3.0, [20, 40, 60, 80, 100]),  # 10 points take 15 s: a line every 30 s
    (60.0, [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]),  # slow: never more than one per 10 %
])
def test_the_build_says_its_percentage_every_10_percent_or_30_s_the_rarer(tmp_path, monkeypatch, seconds_per_line,
                                                                           said):
    lines = _percent_lines(2)
    _fake_cmake(tmp_path / "bin", lines)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"), prepend=os.pathsep)
    messages: list[str] = []
    log = tmp_path / "build.log"
    B._compile(tmp_path / "build", 2, log, say=messages.append, clock=_clock(seconds_per_line))
    assert [int(m.split("%")[0].rsplit(" ", 1)[-1]) for m in messages] == said
    assert all(m.startswith("compiling: ") for m in messages) and "min left" in messages[0]
    text = log.read_text()
    assert f"args: --build {tmp_path / 'build'} -j 2 --target llama llama-server llama-bench" in text
    assert all(line in text for line in lines)  # the full output is still in the log


def test_a_failing_build_names_its_log_and_keeps_the_output(tmp_path, monkeypatch):
    _fake_cmake(tmp_path / "bin", ["[ 10%] Building CXX object a.o", "error: no such file"], exit_code=2)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"), prepend=os.pathsep)
    log = tmp_path / "build.log"
    with pytest.raises(RuntimeError, match=r"cmake failed \(exit 2; last line: error: no such file\); full log: "):
        B._compile(tmp_path / "build", 1, log, say=lambda _m: None, clock=_clock(1.0))
    assert "[ 10%] Building CXX object a.o" in log.read_text()


@pytest.mark.parametrize("line, pct", [("[ 42%] Building CXX object x.o", 42), ("[100%] Built target llama", 100),
                                       ("[12/48] Building CXX object x.o", 25), ("[  0%] Generating build details", 0),
                                       ("-- Configuring done", None), ("x.cpp:3: warning: [ 5%] in text", None),
                                       ("[0/0] nothing", None)])
def test_build_percent_reads_make_and_ninja_lines(line, pct):
    assert B.build_percent(line) == pct
