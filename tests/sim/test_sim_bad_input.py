"""Bad inputs through the CLIs (``python -m sim``, ``calibrate``, ``reports``).

Every case must end with exit status 2 and exactly one stderr line (no
traceback, no argparse usage block) that names the bad value and says what is
valid. None of them loads a model or runs a simulation: each case runs the
CLI's ``main`` in this process (:func:`cli_inprocess.run_module`, a
millisecond where a subprocess took 0.3 s); a few run as ``python -m`` too, and
must print exactly what ``main`` printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli_inprocess import run_module

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Bad (and one good) cost/acceptance files, a plain file and a run directory, in one folder."""
    d = tmp_path_factory.mktemp("bad")
    good_cost = {"kind": "tabulated", "schema_version": 1, "verify_ms_by_tokens": {"1": 10.0, "5": 12.0},
                 "draft_step_ms_ref": 1.0}
    docs = {
        "list.json": [1, 2],
        "cost_future.json": {**good_cost, "schema_version": 99},
        "cost_wrong_type.json": {**good_cost, "draft_step_ms_ref": "abc"},
        "cost_table_type.json": {**good_cost, "verify_ms_by_tokens": {"1": "abc"}},
        "cost_no_table.json": {"kind": "tabulated", "draft_step_ms_ref": 1.0},
        "cost_kind.json": {"kind": "magic"},
        "cost_unknown_field.json": {**good_cost, "draft_step_ms": 1.0},
        "cost_negative.json": {**good_cost, "draft_step_ms_ref": -1.0},
        "acc_future.json": {"kind": "iid", "alpha": 0.5, "schema_version": 2},
        "acc_str.json": {"kind": "iid", "alpha": "abc"},
        "acc_range.json": {"kind": "iid", "alpha": 2.0},
        "acc_alphas_type.json": {"kind": "per_position", "alphas": 5},
        "acc_no_alpha.json": {"kind": "iid"},
        "acc_trace4.json": {"kind": "run_trace", "gamma_max": 4, "proposed": [[4, 4, 4, 4, 4, 4]],
                            "run": [[1, 2, 0, 4, 3, 1]]},
        "tree_ok.json": {"p": [[0.6, 0.2], [0.5]]},
        "tree_sum.json": {"p": [[0.6, 0.2], [0.7, 0.4]]},
        "tree_range.json": {"p": [[0.6, 1.5]]},
        "tree_rows.json": {"p": [[0.6], []]},
    }
    for name, doc in docs.items():
        (d / name).write_text(json.dumps(doc))
    (d / "corrupt.json").write_text('{"kind": "iid",\n "alpha": 0.5 "x": 1}')
    (d / "nan.json").write_text('{"kind": "leviathan", "cost_ratio": NaN}')
    (d / "deep.json").write_text("[" * 100_000 + "]" * 100_000)  # json.loads alone: RecursionError
    (d / "latin1.json").write_bytes(b'{"kind": "iid", "alpha": "\xe9"}')
    (d / "plain.txt").write_text("not a directory\n")
    (d / "subdir").mkdir()
    (d / "run").mkdir()
    (d / "run" / "run.json").write_text(json.dumps({"schema_version": 1}))
    return d


SIM = [
    # non-finite, absurd and out-of-range numbers: the flag, the value and the range
    (["--context-tokens", "nan"], ["--context-tokens", "'nan'", "finite"]),
    (["--context-tokens", "inf"], ["--context-tokens", "'inf'"]),
    (["--context-tokens", "1e12"], ["--context-tokens", "'1e12'", "10,000,000"]),
    (["--context-tokens", "-1"], ["--context-tokens", "'-1'"]),
    (["--context-tokens", "abc"], ["--context-tokens", "'abc'", "not a number"]),
    (["--preset", "gpt2-small-large", "--context-tokens", "2000"], ["--context-tokens", "2000", "1024 positions"]),
    (["--gamma", "1,,2"], ["--gamma", "'1,,2'", "1..64"]),
    (["--gamma", "0"], ["--gamma", "'0'", "1..64"]),
    (["--gamma", "1000000000"], ["--gamma", "'1000000000'", "1..64", "0.9^64"]),
    (["--gamma", "2.5"], ["--gamma", "'2.5'", "not an integer"]),
    (["--gamma-max", "1000000000"], ["--gamma-max", "'1000000000'", "1..64"]),
    (["--gamma-max", "0"], ["--gamma-max", "'0'"]),
    (["--gamma", "4", "--gamma-max", "8"], ["--gamma-max", "not allowed with", "--gamma"]),
    (["--alpha", "nan"], ["--alpha", "'nan'", "[0, 1]"]),
    (["--alpha", "inf"], ["--alpha", "'inf'"]),
    (["--alpha", "1.5"], ["--alpha", "'1.5'", "[0, 1]"]),
    (["--alpha", "-0.1"], ["--alpha", "'-0.1'", "[0, 1]"]),
    (["--alpha-per-position", "0.5,,0.6"], ["--alpha-per-position", "'0.5,,0.6'", "empty item"]),
    (["--alpha-per-position", "0.5,"], ["--alpha-per-position", "'0.5,'", "empty item"]),
    (["--alpha-per-position", ""], ["--alpha-per-position", "empty list"]),
    (["--alpha-per-position", "0.5,abc"], ["--alpha-per-position", "'abc'", "not a number"]),
    (["--alpha-per-position", "0.5,1.2"], ["--alpha-per-position", "'1.2'", "[0, 1]"]),
    (["--alpha-per-position", ",".join(["0.5"] * 65)], ["--alpha-per-position", "65 values", "at most 64"]),
    (["--tau", "3"], ["--tau", "needs --gamma"]),
    (["--tau", "9", "--gamma", "4"], ["--tau 9", "[1, 5]"]),
    (["--tau", "nan", "--gamma", "4"], ["--tau", "'nan'"]),
    (["--cost-ratio", "inf", "--alpha", "0.5"], ["--cost-ratio", "'inf'", "[0, 100]"]),
    (["--cost-ratio", "nan", "--alpha", "0.5"], ["--cost-ratio", "'nan'"]),
    (["--cost-ratio", "1e308", "--alpha", "0.5"], ["--cost-ratio", "'1e308'", "[0, 100]", "c >= 1"]),
    (["--cost-ratio", "-1", "--alpha", "0.5"], ["--cost-ratio", "'-1'", "[0, 100]"]),
    (["--usd-per-hour", "nan"], ["--usd-per-hour", "'nan'"]),
    (["--usd-per-hour", "-2"], ["--usd-per-hour", "'-2'", ">= 0"]),
    (["--seed", "-1"], ["--seed", "'-1'"]),
    (["--seed", "abc"], ["--seed", "'abc'"]),
    # serve / event sizes that would hang, and flags the mode would ignore
    (["--mode", "serve", "--arrival-rate", "inf"], ["--arrival-rate", "'inf'", "[0.001, 1,000,000]"]),
    (["--mode", "serve", "--arrival-rate", "0"], ["--arrival-rate", "'0'", "[0.001, 1,000,000]"]),
    # issue 43: a rate whose horizon is infinite divided by zero; a context of no token was accepted
    (["--mode", "serve", "--arrival-rate", "1e-300"], ["--arrival-rate", "'1e-300'", "[0.001, 1,000,000]",
                                                        "can finish"]),
    (["--context-tokens", "0"], ["--context-tokens", "'0'", "[1, 10,000,000]", "attends at least"]),
    (["--mode", "serve", "--requests", "1000000000"], ["--requests", "'1000000000'", "1..1,000,000"]),
    (["--mode", "serve", "--requests", "0"], ["--requests", "'0'"]),
    (["--mode", "serve", "--requests", "1000000"], ["simulated tokens", "--requests", "1e+07"]),
    (["--mode", "serve", "--max-batch", "0"], ["--max-batch", "'0'"]),
    (["--mode", "serve", "--max-batch", "100000"], ["--max-batch", "'100000'", "1..4,096"]),
    (["--mode", "event", "--new-tokens", "1000000000"], ["--new-tokens", "'1000000000'", "1..1,000,000"]),
    (["--mode", "event", "--new-tokens", "0"], ["--new-tokens", "'0'"]),
    (["--mode", "event", "--new-tokens", "1000000", "--gamma-max", "16"], ["simulated tokens", "--new-tokens"]),
    (["--arrival-rate", "5"], ["--arrival-rate", "--mode serve only", "analytic"]),
    (["--mode", "event", "--requests", "5"], ["--requests", "--mode serve only", "event"]),
    (["--new-tokens", "100"], ["--new-tokens", "analytic"]),
    (["--policy", "heuristic"], ["--policy heuristic", "event or serve", "analytic"]),
    (["--mode", "event", "--policy", "greedy"], ["--policy", "'greedy'", "fixed, heuristic, threshold"]),
    # names: exact, listed when wrong, never an empty fallback
    (["--mode", "fast"], ["--mode", "'fast'", "analytic, event, serve"]),
    (["--format", "xml"], ["--format", "'xml'", "table, json, csv"]),
    (["--preset", "nope"], ["--preset", "'nope'", "llama3-1b-3b"]),
    (["--preset", ""], ["--preset", "''", "llama3-1b-3b"]),
    (["--hardware", ""], ["--hardware", "''", "h100-sxm"]),
    (["--hardware", "tpu"], ["--hardware", "'tpu'", "h100-sxm"]),
    (["--draft", "", "--target", "gpt2"], ["--draft", "''", "gpt2-large"]),
    (["--draft", "gpt2"], ["--draft and --target go together"]),
    (["--preset", "llama3-1b-3b", "--target", "gpt2"], ["--draft and --target go together"]),
    (["--draft", "gpt2", "--target", "Llama-3.2-3B"], ["gpt2", "Llama-3.2-3B", "shared tokenizer"]),
    (["--preset", "llama3-1b-3b", "--draft", "gpt2", "--target", "gpt2-large"], ["--preset", "--draft/--target"]),
    (["--alpha", "0.5", "--cost-ratio", "0.1", "--hardware", "h200"], ["--hardware h200", "--cost-ratio"]),
    (["--pair", "x", "--target", "gpt2"], ["'--pair'", "unknown option"]),
    (["--gama", "3"], ["'--gama'", "did you mean --gamma"]),
    (["--pre", "llama3-1b-3b"], ["'--pre'", "--preset"]),
    (["chek"], ["unknown command 'chek'", "--help"]),
    # output paths, probed before any work
    (["--chart", "x.jpg"], ["--chart", "'.jpg'", ".html, .png, .svg"]),
    (["--out", "{d}/subdir"], ["--out", "subdir", "is a directory"]),
    (["--out", "{d}/plain.txt/x.txt"], ["--out", "plain.txt/x.txt", "cannot be written"]),
    (["--out", "{d}/o.html", "--chart", "{d}/o.html"], ["--out and --chart", "o.html"]),
    (["--out", ""], ["--out", "empty file name"]),
    # cost-model files: the file named, the key and the problem
    (["--alpha", "0.5", "--cost-model", "{d}/missing.json"], ["cost model file", "missing.json", "no such file"]),
    (["--alpha", "0.5", "--cost-model", "{d}/subdir"], ["cost model file", "subdir", "is a directory"]),
    (["--alpha", "0.5", "--cost-model", "{d}/list.json"], ["list.json", "JSON object", "got list"]),
    (["--alpha", "0.5", "--cost-model", "{d}/cost_wrong_type.json"], ["cost_wrong_type.json", "'draft_step_ms_ref'",
                                                                      "'abc'"]),
    (["--alpha", "0.5", "--cost-model", "{d}/cost_table_type.json"], ["cost_table_type.json", "'1'", "'abc'"]),
    (["--alpha", "0.5", "--cost-model", "{d}/cost_no_table.json"], ["cost_no_table.json", "'verify_ms_by_tokens'"]),
    (["--alpha", "0.5", "--cost-model", "{d}/cost_kind.json"], ["cost_kind.json", "'magic'", "'tabulated'"]),
    (["--alpha", "0.5", "--cost-model", "{d}/cost_unknown_field.json"], ["cost_unknown_field.json",
                                                                         "'draft_step_ms'", "draft_step_ms_ref"]),
    (["--alpha", "0.5", "--cost-model", "{d}/cost_negative.json"], ["cost_negative.json", "-1"]),
    (["--alpha", "0.5", "--cost-model", "{d}/cost_future.json"], ["cost_future.json", "schema_version 99",
                                                                  "up to 1"]),
    (["--alpha", "0.5", "--cost-model", "{d}/corrupt.json"], ["corrupt.json", "not valid JSON", "line 2"]),
    (["--alpha", "0.5", "--cost-model", "{d}/nan.json"], ["nan.json", "NaN"]),
    (["--alpha", "0.5", "--cost-model", "{d}/deep.json"], ["deep.json", "nests deeper than 100 levels"]),
    (["--acceptance", "{d}/deep.json"], ["acceptance file", "deep.json", "nests deeper than 100 levels"]),
    (["--alpha", "0.5", "--cost-model", "{d}/latin1.json"], ["latin1.json", "UTF-8"]),
    (["--alpha", "0.5", "--cost-model", ""], ["--cost-model", "empty file name"]),
    # acceptance files
    (["--acceptance", "{d}/missing.json"], ["acceptance file", "missing.json", "no such file"]),
    (["--acceptance", "{d}/list.json"], ["acceptance file", "list.json", "got list"]),
    (["--acceptance", "{d}/acc_future.json"], ["acc_future.json", "schema_version 2", "up to 1"]),
    (["--acceptance", "{d}/acc_str.json"], ["acc_str.json", "'alpha'", "'abc'"]),
    (["--acceptance", "{d}/acc_range.json"], ["acc_range.json", "[0, 1]", "2.0"]),
    (["--acceptance", "{d}/acc_alphas_type.json"], ["acc_alphas_type.json", "'alphas'", "5"]),
    (["--acceptance", "{d}/acc_no_alpha.json"], ["acc_no_alpha.json", "lacks the field 'alpha'"]),
    (["--acceptance", "{d}/corrupt.json"], ["acceptance file", "corrupt.json", "not valid JSON"]),
    (["--acceptance", "{d}/acc_trace4.json", "--gamma", "8"], ["acc_trace4.json", "gamma=4", "gamma=5..8", "1..4"]),
    (["--acceptance", "{d}/acc_trace4.json", "--gamma", "2", "--mode", "serve", "--policy", "heuristic"],
     ["--policy heuristic", "64", "acc_trace4.json", "gamma=4"]),
    (["--list-presets", "--preset", "llama3-1b-3b"], ["--list-presets", "--preset llama3-1b-3b"]),
    # python -m sim tree: malformed trees, budgets and depths out of range, bad acceptance files, ranks
    (["tree"], ["sim tree: error", "--paths PATHS", "--budget N"]),
    (["tree", "--paths", "[[0],[0,0,0]]"], ["--paths", "path [0, 0, 0] skips depth 2"]),
    (["tree", "--paths", "[[0],[0]]"], ["--paths", "path [0] appears twice"]),
    (["tree", "--paths", "[[0],[1,0]]"], ["--paths", "path [1, 0] has no parent", "not a tree"]),
    (["tree", "--paths", "[[0],[-1]]"], ["--paths", "path [-1]", "negative rank"]),
    (["tree", "--paths", "[[0],[1.5]]"], ["--paths", "rank 1.5", "integers >= 0"]),
    (["tree", "--paths", "[[0], [1"], ["--paths", "not a path list", "[[0],[1],[0,0]]"]),
    (["tree", "--paths", "[]"], ["--paths", "non-empty list of paths"]),
    (["tree", "--paths", "[" * 100_000], ["--paths", "nests lists too deeply"]),
    (["tree", "--paths", "[[0]]", "--acceptance", "{d}/deep.json"], ["acceptance file", "deep.json", "nests deeper than 100 levels"]),
    (["tree", "--paths", ""], ["--paths", "empty path list"]),
    (["tree", "--paths", json.dumps([[r] for r in range(257)])], ["--paths has 257 nodes", "at most 256"]),
    (["tree", "--paths", json.dumps([[0] * d for d in range(1, 66)])], ["--paths is 65 deep", "at most 64"]),
    # issue 43: sim tree bounds what sim bounds (sim/limits.py): the cost ratio overflowed, a context of none
    (["tree", "--paths", "[[0]]", "--alpha", "0.5", "--cost-ratio", "1e308"], ["--cost-ratio", "'1e308'", "[0, 100]",
                                                                             "c >= 1"]),
    (["tree", "--paths", "[[0]]", "--alpha", "0.5", "--context-tokens", "0"], ["--context-tokens", "'0'",
                                                                             "[1, 10,000,000]"]),
    (["tree", "--budget", "0"], ["--budget", "'0'", "1..256"]),
    (["tree", "--budget", "-3"], ["--budget", "'-3'", "1..256"]),
    (["tree", "--budget", "100000"], ["--budget", "'100000'", "1..256"]),
    (["tree", "--budget", "8", "--max-depth", "0"], ["--max-depth", "'0'", "1..64"]),
    (["tree", "--budget", "8", "--max-depth", "65"], ["--max-depth", "'65'", "1..64"]),
    (["tree", "--budget", "100", "--advise"], ["--budget 100", "--advise", "1..64"]),
    (["tree", "--paths", "[[0]]", "--budget", "3"], ["--budget", "not allowed with", "--paths"]),
    (["tree", "--paths", "[[0]]", "--max-depth", "3"], ["--max-depth limits", "--budget"]),
    (["tree", "--paths", "[[0]]", "--advise"], ["--advise", "give --budget N"]),
    (["tree", "--budget", "8", "--advise", "--mode", "event"], ["--mode event", "--advise"]),
    (["tree", "--paths", "[[0]]", "--new-tokens", "10"], ["--new-tokens", "--mode event only"]),
    (["tree", "--paths", "[[0]]", "--mode", "serve"], ["--mode", "'serve'", "analytic, event"]),
    (["tree", "--paths", "[[0]]", "--format", "table"], ["--format", "'table'", "text, json"]),
    (["tree", "--paths", "[[0]]", "--rank-law", "zipf"], ["--rank-law", "'zipf'", "power, geometric, none"]),
    (["tree", "--paths", "[[0]]", "--batch", "0"], ["--batch", "'0'", "1..4,096"]),
    (["tree", "--paths", "[[0]]", "--cost-ratio", "0.1"], ["no acceptance given", "--acceptance FILE"]),
    (["tree", "--paths", "[[0]]", "--alpha", "0.5", "--cost-ratio", "0.1", "--hardware", "h200"],
     ["--hardware h200", "--cost-ratio"]),
    (["tree", "--paths", "[[0]]", "--preset", "gpt2-small-large", "--context-tokens", "2000"],
     ["--context-tokens 2000", "1024 positions"]),
    (["tree", "--paths", "[[0],[60000]]", "--preset", "smollm2-135m-360m"],
     ["--paths uses rank 60000", "vocabulary of 49152", "0..49151"]),
    (["tree", "--paths", "[[0],[40000]]", "--preset", "eagle3-llama3.1-8b"],
     ["rank 40000", "eagle3-head(Llama-3.1-8B)'s own draft vocabulary of 32000 tokens", "0..31999"]),
    (["tree", "--paths", "[[0]]", "--acceptance", "{d}/missing.json"], ["acceptance file", "missing.json", "no such file"]),
    (["tree", "--paths", "[[0]]", "--acceptance", "{d}/corrupt.json"], ["corrupt.json", "not valid JSON"]),
    (["tree", "--paths", "[[0]]", "--acceptance", "{d}/tree_sum.json"], ["tree_sum.json", "depth 2 sums to 1.1",
                                                                        "<= 1"]),
    (["tree", "--paths", "[[0]]", "--acceptance", "{d}/tree_range.json"], ["tree_range.json", "rank 1", "1.5",
                                                                          "[0, 1]"]),
    (["tree", "--paths", "[[0]]", "--acceptance", "{d}/tree_rows.json"], ["tree_rows.json", "depth 2"]),
    (["tree", "--paths", "[[0]]", "--acceptance", "{d}/acc_trace4.json"], ["acc_trace4.json", "'run_trace'",
                                                                         "'positional'"]),
    (["tree", "--paths", "[[0]]", "--acceptance", "{d}/list.json"], ["list.json", "JSON object"]),
    (["tree", "--paths", "[[0],[1],[2]]", "--acceptance", "{d}/tree_ok.json"],
     ["--paths", "path [2] needs the rank-2 acceptance at depth 1", "ranks 0..1"]),
    (["tree", "--paths", "[[0],[1]]", "--acceptance", "{d}/tree_ok.json", "--rank-law", "power"],
     ["--rank-law power", "top-1-only", "tree_ok.json"]),
    (["tree", "--paths", "[[0],[1]]", "--alpha", "0.7", "--cost-ratio", "0.1", "--rank-law", "none"],
     ["path [1] needs the rank-1 acceptance at depth 1", "rank 0 only"]),
    (["tree", "--budget", "4", "--max-depth", "1", "--alpha", "0.7", "--cost-ratio", "0.1", "--rank-law", "none"],
     ["no tree of 4 nodes fits depth <= 1"]),
    (["tree", "--paths", "[[0]]", "--out", "{d}/subdir"], ["--out", "subdir", "is a directory"]),
    (["tree", "--pats", "[[0]]"], ["'--pats'", "did you mean --paths"]),
]

OTHER = [
    (["calibrate"], ["required", "RUN_DIR"]),
    (["calibrate", "{d}/run", "--holdout", "bogus"], ["--holdout", "'bogus'", "valid: auto, gamma, domain, k, none"]),
    (["calibrate", "{d}/run", "--holdout", ""], ["--holdout", "''"]),
    (["calibrate", "{d}/nope"], ["run directory not found", "nope"]),
    (["calibrate", "{d}/plain.txt"], ["plain.txt", "is a file"]),
    (["calibrate", "{d}/subdir"], ["subdir", "(no run.json)"]),
    (["calibrate", "{d}/run", "--out", "{d}/plain.txt"], ["--out", "plain.txt", "is a file"]),
    (["calibrate", "{d}/run", "--seed", "-3"], ["--seed", "'-3'"]),
    (["calibrate", "{d}/run", "--hold", "k"], ["'--hold'", "--holdout"]),
    (["reports"], ["required", "RUN_DIR_OR_CALIBRATION_DIR"]),
    (["reports", "{d}/nope"], ["directory not found", "nope"]),
    (["reports", "{d}/plain.txt"], ["plain.txt", "is a file"]),
    (["reports", "{d}/subdir"], ["subdir", "neither a calibration directory"]),
    (["reports", "{d}/run", "--out", "{d}/plain.txt"], ["--out", "plain.txt", "is a file"]),
    (["reports", "{d}/run", "--no-pgn"], ["'--no-pgn'", "did you mean --no-png"]),
    (["reports", ""], ["empty directory"]),
]


def _run(module: str, argv: list[str], d: Path) -> subprocess.CompletedProcess:
    """``python -m module argv`` in this process, in ``d``."""
    return run_module(module, [a.replace("{d}", str(d)) for a in argv], cwd=d)


def _spawn(module: str, argv: list[str], d: Path) -> subprocess.CompletedProcess:
    """``python -m module argv`` in a subprocess, in ``d``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's code, whatever the venv has installed
    return subprocess.run([sys.executable, "-m", module, *[a.replace("{d}", str(d)) for a in argv]], cwd=d,
                          capture_output=True, text=True, timeout=60, env=env)


def _check(r: subprocess.CompletedProcess, needles: list[str], d: Path) -> None:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr and "usage:" not in r.stderr, r.stderr
    assert ": error: " in lines[0]
    for n in needles:
        assert n.replace("{d}", str(d)) in lines[0], (n, lines[0])
    assert r.stdout == "", r.stdout


@pytest.mark.parametrize("argv,needles", SIM, ids=[" ".join(a)[:60] or "(empty)" for a, _ in SIM])
def test_sim_bad_input_is_one_line(argv: list[str], needles: list[str], files: Path) -> None:
    _check(_run("sim", argv, files), needles, files)


@pytest.mark.parametrize("argv,needles", OTHER, ids=[" ".join(a)[:60] for a, _ in OTHER])
def test_calibrate_reports_bad_input_is_one_line(argv: list[str], needles: list[str], files: Path) -> None:
    _check(_run(argv[0], argv[1:], files), needles, files)


@pytest.mark.parametrize("argv", [["sim", "--gamma", "0"], ["sim", "tree", "--paths", "[[0],[1,0]]"],
                                  ["sim", "--alpha", "0.5", "--cost-model", "{d}/deep.json"],
                                  ["calibrate", "{d}/run", "--holdout", "bogus"], ["reports", "{d}/subdir"]])
def test_python_m_prints_what_main_prints(argv: list[str], files: Path) -> None:
    """The cases above run ``main`` in this process; ``python -m`` gives the same status and the same line."""
    proc, inproc = _spawn(argv[0], argv[1:], files), _run(argv[0], argv[1:], files)
    assert proc.returncode == inproc.returncode == 2
    assert (proc.stdout, proc.stderr) == (inproc.stdout, inproc.stderr)


def test_holdout_choices_match_calibrate() -> None:
    # the CLI checks --holdout before importing calibrate.folds; the two lists must stay one list
    from calibrate.chain_cli import HOLDOUT_CHOICES
    from calibrate.folds import HOLDOUT_MODES

    assert HOLDOUT_CHOICES == HOLDOUT_MODES


def test_help_still_shows_usage() -> None:
    r = subprocess.run([sys.executable, "-m", "sim", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("usage: python -m sim") and "--gamma-max" in r.stdout


def test_bad_output_path_fails_before_the_work(files: Path) -> None:
    # a serve run that would take seconds fails at once when --out cannot be written
    r = _spawn("sim", ["--mode", "serve", "--gamma", "4", "--requests", "20000", "--out", "{d}/plain.txt/x"], files)
    _check(r, ["--out", "cannot be written"], files)
