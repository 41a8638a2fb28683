"""The ``specscope`` command: every subcommand through a subprocess, its --help, its examples, one real call each.

``python -m specscope`` is what the console script runs (``[project.scripts]``
``specscope = "specscope.cli:main"``); the installed script itself is run too
where the package is installed. A command still being built (its module
missing) must say so in one line, exit 2; the tests follow the table, so they
hold the moment such a command's module lands.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from specscope.cli import BY_NAME, COMMANDS

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "results" / "cpu-make-run-fresh3"
VLLM = ROOT / "tests" / "fixtures" / "engines" / "vllm" / "metrics-after.prom"
NAMES = ("predict", "check", "measure", "tune", "serve", "calibrate", "ingest", "report", "advise")


def specscope(*args: str, env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specscope", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_help_lists_every_subcommand_and_what_it_runs() -> None:
    out = specscope("--help")
    assert out.returncode == 0 and out.stderr == ""
    listed = re.findall(r"^  (\w+) ", out.stdout, flags=re.M)
    assert tuple(listed) == NAMES == tuple(c.name for c in COMMANDS)
    for c in COMMANDS:
        assert f"= {c.same_as}" in out.stdout
    assert specscope().stdout == out.stdout  # no arguments: the same list
    assert specscope("help").stdout == out.stdout
    assert specscope("help", "check").stdout == specscope("check", "--help").stdout


def test_the_console_script_is_declared_and_runs() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"specscope": "specscope.cli:main"}
    module, func = scripts["specscope"].split(":")
    code = f"import sys; from {module} import {func}; sys.exit({func}())"  # what the generated script does
    out = subprocess.run([sys.executable, "-c", code, "--help"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and "predict" in out.stdout


def test_the_installed_script_runs_where_the_package_is_installed() -> None:
    script = Path(sys.executable).with_name("specscope")
    if not script.exists():
        pytest.skip("the specscope script is not installed in this environment (pip install -e .)")
    out = subprocess.run([str(script), "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and all(n in out.stdout for n in NAMES)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.slow
def test_each_subcommand_help_lists_its_examples(name: str) -> None:
    cmd = BY_NAME[name]
    out = specscope(name, "--help")
    if cmd.missing():
        assert out.returncode == 2 and "not available yet" in out.stdout
        return
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"specscope {name}: {cmd.summary}")
    assert f"runs `{cmd.same_as}`" in out.stdout and "usage:" in out.stdout
    examples = out.stdout.split("\nexamples:\n", 1)[1]
    assert cmd.examples and all(f"  {e}" in examples for e in cmd.examples)
    options = set(re.findall(r"(--[a-z][a-z0-9-]*)", out.stdout.split("\nexamples:\n", 1)[0]))
    for example in cmd.examples:  # every flag an example uses is one the module knows
        assert example.startswith(f"specscope {name}")
        words = example.split()
        if len(words) > 2 and not words[2].startswith("-") and words[2] in ("head-sweep", "head-recall",
                                                                            *cmd.subcommands):
            continue  # a subcommand of the module: its own --help
        unknown = {w for w in words if w.startswith("--")} - options
        assert not unknown, f"{example!r} uses options {name} does not have: {sorted(unknown)}"


@pytest.mark.parametrize("name", [c.name for c in COMMANDS if c.requires])
def test_a_command_being_built_says_so_in_one_line(name: str) -> None:
    cmd = BY_NAME[name]
    out = specscope(name, "--anything")
    if not cmd.missing():  # landed: the module answers instead (a bad option: its own one-line error)
        assert out.returncode == 2 and "not available yet" not in out.stderr
        return
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip() == (f"specscope: error: {name}: not available yet: `{cmd.same_as}` is still being "
                                  f"built (no module {cmd.requires})")


def test_an_unknown_command_is_one_line_with_a_suggestion() -> None:
    out = specscope("mesure", "--gamma", "2")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "specscope: error: unknown command 'mesure'; did you mean 'measure'? (valid: predict, check, measure, tune, "
        "serve, calibrate, ingest, report, advise; see specscope --help)"]


def test_predict_is_python_m_sim() -> None:
    args = ("--preset", "llama3-1b-3b", "--gamma-max", "6", "--format", "json")
    out = specscope("predict", *args)
    ref = subprocess.run([sys.executable, "-m", "sim", *args], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == ref.stdout
    assert json.loads(out.stdout)["optimal_gamma"] in range(1, 7)
    bad = specscope("predict", "--gamma", "0")
    assert bad.returncode == 2 and bad.stderr.startswith("python -m sim: error: argument --gamma")


@pytest.mark.slow
def test_check_checks_the_published_claims() -> None:
    out = specscope("check", "--claims", "--format", "json")
    assert out.returncode == 0, out.stderr
    claims = json.loads(out.stdout)
    assert len(claims) > 5 and {"verdict"} <= set(claims[0])


@pytest.mark.slow
def test_measure_reaches_the_sweep_cli() -> None:
    # a real model run of `specscope measure` is in tests/project/test_track_cli.py (slow); here its checks, no model
    out = specscope("measure", "--gamma", "0", "--domains", "code")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip() == "python -m measure: error: --gamma 0: must be an integer in 1..64 (or fixed:G, " \
                                 "heuristic:G, threshold:G)"


@pytest.mark.slow  # three specscope processes (about 5 s)
def test_tune_serve_is_measure_serve_until_decided() -> None:
    tune = BY_NAME["tune"]
    assert tune.module_args(["serve", "--concurrency", "1"]) == ["serve", "--until-decided", "--concurrency", "1"]
    assert tune.module_args(["--gamma", "2"]) == ["--until-decided", "--gamma", "2"]
    out = specscope("tune", "serve", "--concurrency", "1", "--regret", "1.5")
    assert out.returncode == 2 and out.stdout == ""
    err = out.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m measure serve: error: argument --regret"), err
    shown = specscope("tune", "serve", "--help")
    assert shown.returncode == 0 and "--until-decided" in shown.stdout and "--concurrency" in shown.stdout
    assert "tune serve = python -m measure serve --until-decided" in specscope("--help").stdout


def test_ingest_answers_from_an_engine_file() -> None:
    out = specscope("ingest", str(VLLM), "--preset", "llama3-1b-8b")
    assert out.returncode == 0, out.stderr
    last = json.loads(out.stdout.strip().splitlines()[-1])
    assert last["optimal_k"] in range(1, 9) and len(last["alpha_per_position"]) == 3


@pytest.mark.slow
def test_calibrate_then_report(tmp_path: Path) -> None:
    cal = tmp_path / "cal"
    out = specscope("calibrate", str(RUN), "--out", str(cal))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["n_cells"] == 6
    rep = specscope("report", str(cal), "--out", str(tmp_path / "report"), "--no-png")
    assert rep.returncode == 0, rep.stderr
    assert (tmp_path / "report" / "report.html").stat().st_size > 10_000


def test_version() -> None:
    out = specscope("--version")
    assert out.returncode == 0 and out.stdout.startswith("specscope ")


def _complete(line: str, tmp_path: Path) -> list[str]:
    pytest.importorskip("argcomplete")
    target = tmp_path / "completions"
    env = {**os.environ, "_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line)),
           "_ARGCOMPLETE_STDOUT_FILENAME": str(target)}
    out = specscope(env=env)
    assert out.returncode == 0, out.stderr
    return [w.strip() for w in target.read_text().split("\013") if w.strip()]


def test_shell_completion_of_commands_and_their_options(tmp_path: Path) -> None:
    assert _complete("specscope me", tmp_path) == ["measure"]
    assert set(_complete("specscope c", tmp_path)) == {"check", "calibrate"}
    assert _complete("specscope predict --pres", tmp_path) == ["--preset"]
    assert "--explain" in _complete("specscope ingest --ex", tmp_path)


@pytest.mark.slow
def test_python_m_forms_keep_working() -> None:
    for module in ("sim", "measure", "calibrate", "reports"):
        out = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True)
        assert out.returncode == 0 and out.stdout.startswith("usage: python -m"), (module, out.stderr)


def test_help_with_extra_words_is_one_line() -> None:
    """``specscope help predict extra`` printed the general help, rc 0, the extra words ignored (issue 43)."""
    out = specscope("help", "predict", "extra")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip() == ("specscope: error: help takes one command name, got 2 words ('predict extra'); "
                                  "e.g. specscope help predict")


@pytest.mark.parametrize("args", [("predict", "--help"), ("help", "predict"), ("predict", "--gamma-max", "8")])
def test_a_reader_that_stops_early_ends_it_quietly(args: tuple[str, ...]) -> None:
    """``specscope predict --help | head -1``: a BrokenPipeError traceback before (issue 43); now no word on stderr
    and the status a shell gives a process SIGPIPE ended. The read end is closed before the command writes, so
    every write meets the closed pipe (a reader that stopped after its first line, without the race)."""
    from toolkit.cli import BROKEN_PIPE_STATUS

    p = subprocess.Popen([sys.executable, "-m", "specscope", *args], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=60) == BROKEN_PIPE_STATUS == 141
    assert err == ""
