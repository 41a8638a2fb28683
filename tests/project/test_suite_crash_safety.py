"""A test that kills its process ends ``make test`` with a failure under its own name, never a hang.

pytest-xdist's ``loadfile``/``loadscope`` schedulers (3.8.0) deadlock once a
worker dies and its file is handed to a replacement (pytest-xdist issues
#784, #1323, #1378): controller and workers then wait on each other at 0% CPU
until CI's time limit. That is what happened when a miscompiled llama.cpp
segfaulted inside a test. ``make test`` uses a scheduler that survives it;
this test runs pytest with the very options of the Makefile's ``test`` recipe
on a small suite whose one test dies of a segmentation fault in native code
(a read of address 0 through ctypes, as llama.cpp's crash did) and checks
that the suite ends, within a time limit, failing that test by name and
running every other test.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CRASHING = '''
import ctypes
import pytest

@pytest.fixture(scope="module")
def engine():
    return "loaded once per module"

def test_before(engine):
    assert engine

def test_native_crash(engine):
    ctypes.string_at(0)  # SIGSEGV inside native code

def test_after(engine):
    assert engine
'''
OTHER = '''
import time

def test_one():
    time.sleep(0.2)

def test_two():
    assert True
'''


def make_test_options() -> list[str]:
    """The pytest options of the Makefile's ``test`` recipe (after ``-m pytest``)."""
    recipe = (ROOT / "Makefile").read_text().split("\ntest:", 1)[1]
    line = next(ln for ln in recipe.splitlines() if "-m pytest" in ln)
    return shlex.split(line.split("-m pytest", 1)[1])


def test_the_makefile_runs_the_suite_in_parallel_with_a_crash_safe_scheduler():
    opts = make_test_options()
    assert "-n" in opts and "--dist" in opts
    assert opts[opts.index("--dist") + 1] in ("load", "worksteal")  # loadfile/loadscope/loadgroup deadlock


@pytest.mark.slow
def test_a_test_that_segfaults_fails_by_name_and_the_suite_goes_on(tmp_path):
    (tmp_path / "test_crashing.py").write_text(CRASHING)
    for i in range(5):
        (tmp_path / f"test_other_{i}.py").write_text(OTHER)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not the project's ini: only the Makefile's options
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *make_test_options(), str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-2000:]
    assert re.search(r"FAILED .*test_crashing\.py::test_native_crash", out), out[-2000:]
    assert "crashed" in out
    summary = r.stdout.strip().splitlines()[-1]
    assert re.search(r"\b1 failed\b", summary) and re.search(r"\b12 passed\b", summary), summary
