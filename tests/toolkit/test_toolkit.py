"""toolkit: the argument toolkit every CLI shares, the text and JSON readers, strict JSON out, the environment."""

from __future__ import annotations

import ast
import json
import math
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from toolkit import cli, env, files, jsonio

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("presets", "sim", "measure", "calibrate", "reports")


# -- numbers, lists, addresses ---------------------------------------------------------------
@pytest.mark.parametrize("text, kw, needle", [
    ("nan", dict(lo=0.0), "'nan' is not a finite number"),
    ("inf", dict(lo=0.0), "'inf' is not a finite number"),
    ("-inf", dict(), "'-inf' is not a finite number"),
    ("abc", dict(), "'abc' is not a number"),
    ("1e308", dict(lo=0.0, hi=100.0), "'1e308' is out of range; valid: a finite number in [0, 100]"),
    ("0", dict(lo=0.0, lo_open=True), "valid: a finite number > 0"),
    ("-1", dict(lo=0.0), "valid: a finite number >= 0"),
])
def test_parse_float_refuses_with_the_value_and_the_range(text, kw, needle):
    with pytest.raises(ValueError, match=None) as exc:
        cli.parse_float(text, **kw)
    assert needle in str(exc.value)


def test_parse_float_and_int_accept_the_edges():
    assert cli.parse_float("0", 0.0, 1.0) == 0.0 and cli.parse_float("1", 0.0, 1.0) == 1.0
    assert cli.parse_float(" 2.5 ", 0.0, lo_open=True) == 2.5
    assert cli.parse_int("1", 1, 64) == 1 and cli.parse_int("64", 1, 64) == 64


@pytest.mark.parametrize("text, needle", [
    ("0", "'0' is out of range; valid: an integer in 1..1,000,000"),
    ("1000001", "'1000001' is out of range"),
    ("2.5", "'2.5' is not an integer"),
    ("1e6", "'1e6' is not an integer"),
    ("", "'' is not an integer"),
])
def test_parse_int_refuses(text, needle):
    with pytest.raises(ValueError) as exc:
        cli.parse_int(text, 1, 1_000_000)
    assert needle in str(exc.value)


@pytest.mark.parametrize("text, needle", [
    ("1,,2", "'1,,2': empty item at position 2"),
    ("1,", "'1,': empty item at position 2"),
    (",1", "empty item at position 1"),
    ("  ", "empty list"),
])
def test_comma_lists_refuse_empty_items(text, needle):
    with pytest.raises(ValueError) as exc:
        cli.split_list(text)
    assert needle in str(exc.value)
    assert cli.split_list(" a , b ") == ["a", "b"]


def test_float_list_bounds_each_item_and_the_count():
    assert cli.parse_float_list("1,4.5", 0.0, 10.0, lo_open=True) == [1.0, 4.5]
    with pytest.raises(ValueError, match="'0' is out of range; valid: a finite number > 0"):
        cli.parse_float_list("1,0", 0.0, lo_open=True)
    with pytest.raises(ValueError, match="3 values in '1,2,3'; at most 2"):
        cli.parse_float_list("1,2,3", max_items=2)


@pytest.mark.parametrize("text, needle", [
    ("bogus:99999", "'bogus:99999': port 99999 is out of range; valid: a TCP port in 1..65,535"),
    ("host:0", "port 0 is out of range"),
    ("host:abc", "'host:abc' is not HOST:PORT"),
    ("http://x", "'http://x' is not HOST:PORT"),
    ("host", "'host' is not HOST:PORT"),
    (":6379", "':6379' is not HOST:PORT"),
    ("a b:6379", "is not HOST:PORT"),
])
def test_host_port_needs_a_port_in_1_65535(text, needle):
    with pytest.raises(ValueError) as exc:
        cli.parse_host_port(text)
    assert needle in str(exc.value)
    assert cli.parse_host_port("10.0.0.1:6379") == ("10.0.0.1", 6379)
    assert cli.parse_host_port("head-node.local:65535") == ("head-node.local", 65535)


def _parser() -> cli.OneLineParser:
    p = cli.OneLineParser(prog="prog")
    p.add_argument("--gamma", type=cli.int_arg(1, 64))
    p.add_argument("--alpha", type=cli.float_arg(0.0, 1.0))
    p.add_argument("--mode", type=cli.choice_arg("mode", ("a", "b")))
    return p


@pytest.mark.parametrize("argv, needle", [
    (["--gamma", "0"], "prog: error: argument --gamma: '0' is out of range; valid: an integer in 1..64"),
    (["--alpha", "nan"], "prog: error: argument --alpha: 'nan' is not a finite number"),
    (["--mode", "c"], "prog: error: argument --mode: unknown mode 'c'; valid: a, b"),
    (["--gama", "3"], "prog: error: unknown option '--gama'; did you mean --gamma?"),
    (["--gam", "3"], "prog: error: unknown option '--gam'"),  # abbreviations are refused, not guessed
    (["extra"], "prog: error: unexpected argument 'extra'"),
])
def test_one_line_parser_errors_are_one_line_exit_2(argv, needle, capsys):
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "usage:" not in err
    assert err.startswith(needle), err


def test_fail_and_csv_items_print_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.csv_items("--gamma", "1,,2", "prog")
    assert exc.value.code == 2
    assert capsys.readouterr().err == "prog: error: --gamma '1,,2': empty item at position 2; give comma-separated " \
                                      "values with none left empty\n"


def test_output_dir_probe_leaves_nothing(tmp_path):
    cli.check_output_dir("--out", tmp_path / "a" / "b")
    assert list((tmp_path / "a" / "b").iterdir()) == []
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="is a file, not a directory"):
        cli.check_output_dir("--out", tmp_path / "f")


def test_output_dir_probes_at_once_never_collide(tmp_path):
    # issue 32: two measure runs released together both wrote and unlinked ".write-probe"; the loser was told
    # "output directory ... is not writable". Each probe now has a name of its own (4 x 300 probes at once).
    errors: list[ValueError] = []

    def probe() -> None:
        for _ in range(300):
            try:
                cli.check_output_dir("--out", tmp_path)
            except ValueError as exc:
                errors.append(exc)

    threads = [threading.Thread(target=probe) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and list(tmp_path.iterdir()) == []


CTRL_C_SCRIPT = """
import atexit, os, sys, time
from toolkit.cli import exit_on_next_interrupt
atexit.register(time.sleep, 2)  # a slow shutdown hook, as torch's library finalizers can be
try:
    print("ready", flush=True)
    time.sleep(60)
except KeyboardInterrupt:
    if sys.argv[1] == "fixed":
        exit_on_next_interrupt(130)
    print("interrupted: one line", file=sys.stderr)
    sys.exit(130)
"""


@pytest.mark.parametrize("mode", ["fixed", "plain"])
@pytest.mark.slow
def test_a_second_ctrl_c_in_the_shutdown_is_quiet(mode):
    # plain Python: the second Ctrl-C lands in the atexit hook, "Exception ignored in atexit callback" and a
    # traceback; with exit_on_next_interrupt it is ignored there and the process ends with the status given
    import signal
    import time

    p = subprocess.Popen([sys.executable, "-c", CTRL_C_SCRIPT, mode], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGINT)
    time.sleep(1.0)  # the first is handled; the process sits in its 2 s atexit hook
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    if mode == "fixed":
        assert p.returncode == 130 and err == "interrupted: one line\n", (p.returncode, err)
    else:  # what issue 32 saw: the test above would fail without the fix
        assert "Exception ignored in atexit callback" in err and "KeyboardInterrupt" in err


def test_every_cli_uses_the_toolkit_parser():
    # one argument toolkit: no package builds a plain ArgumentParser or defines its own one-line parser
    plain = []
    for pkg in PRODUCT:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == \
                        "ArgumentParser":
                    plain.append(str(path.relative_to(ROOT)))
                if isinstance(node, ast.ClassDef) and any(getattr(b, "attr", "") == "ArgumentParser"
                                                          for b in node.bases):
                    plain.append(f"{path.relative_to(ROOT)}:{node.name}")
    assert not plain, f"use toolkit.cli.OneLineParser: {plain}"


# -- text files ------------------------------------------------------------------------------
@pytest.mark.parametrize("content, needle", [
    (b"\x00" * 4096, "not a text file (a NUL byte at character 0)"),
    (b"a prompt\x07 with a bell", "control character U+0007 at character 8"),
    (b"caf\xe9", "not UTF-8 text (byte 3)"),
    (b"", "the file is empty"),
])
def test_read_text_refuses_what_is_not_text(tmp_path, content, needle):
    p = tmp_path / "f.txt"
    p.write_bytes(content)
    with pytest.raises(ValueError) as exc:
        files.read_text(p, "--prompts-file")
    assert str(exc.value).startswith(f"--prompts-file {str(p)!r}") and needle in str(exc.value)


def test_read_text_paths_and_size(tmp_path):
    p = tmp_path / "f.txt"
    p.write_text("tab\tand\r\nnewlines\f are text\n")
    assert files.read_text(p, "x") == "tab\tand\r\nnewlines\f are text\n"
    with pytest.raises(ValueError, match="over the 10 byte limit"):
        files.read_text(p, "x", max_bytes=10)
    with pytest.raises(ValueError, match="no such file"):
        files.read_text(tmp_path / "missing", "x")
    with pytest.raises(ValueError, match="is a directory"):
        files.read_text(tmp_path, "x")
    with pytest.raises(ValueError, match="empty file name"):
        files.read_text("", "x")


# -- JSON ------------------------------------------------------------------------------------
def test_loads_bounds_the_nesting_before_parsing():
    deep = "[" * 100_000 + "]" * 100_000  # json.loads alone: RecursionError
    with pytest.raises(jsonio.JSONTooDeep, match="nests deeper than 100 levels"):
        jsonio.loads(deep, "f.json")
    ok = "[" * 100 + "]" * 100
    assert jsonio.loads(ok) == json.loads(ok)
    # brackets inside strings (escaped quotes too) do not count
    assert jsonio.loads(json.dumps({"s": "[" * 500 + '\\"' + "{" * 500})) == {"s": "[" * 500 + '\\"' + "{" * 500}
    assert not jsonio.nests_deeper('[["[[[["]]', 2) and jsonio.nests_deeper("[[[]]]", 2)


def test_nesting_scan_is_linear_on_an_unterminated_string():
    # one quote, then escaped quotes and no closing quote: with the closing quote required every quote
    # started a scan to the end of the text (200,000 of them: about 20 minutes); now a fraction of a second
    code = ("from toolkit.jsonio import nests_deeper; "
            "print(nests_deeper(chr(34) + (chr(92) + chr(34)) * 200_000 + '[' * 101))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr  # the brackets are in the string
    with pytest.raises(json.JSONDecodeError):
        jsonio.loads('["' + '\\"' * 1000 + "[" * 101)


def test_loads_constants_refused_unless_asked():
    with pytest.raises(ValueError, match="f.json holds Infinity, which is not JSON"):
        jsonio.loads('{"a": Infinity}', "f.json")
    assert math.isnan(jsonio.loads('{"a": NaN}', constants=True)["a"])
    with pytest.raises(json.JSONDecodeError):
        jsonio.loads('{"a": 1', "f.json")


def test_read_json_names_the_file_and_the_problem(tmp_path):
    p = tmp_path / "c.json"
    p.write_text('{"a": 1,\n "b" 2}')
    with pytest.raises(ValueError, match=r"cost model file '.*c.json' is not valid JSON: .* at line 2 column 6"):
        jsonio.read_json(p, "cost model file")
    p.write_text("[" * 1000 + "]" * 1000)
    with pytest.raises(ValueError, match="nests deeper than 100 levels"):
        jsonio.read_json(p, "cost model file")


def test_strict_dumps_writes_standard_json():
    obj = {"nan": float("nan"), "inf": [float("inf"), -float("inf")], "np": np.float32(0.5), 1: np.int64(3),
           "b": np.bool_(True), "t": (1, 2), "f64": np.float64(0.1)}
    text = jsonio.strict_dumps(obj)
    assert json.loads(text) == {"nan": None, "inf": [None, None], "np": 0.5, "1": 3, "b": True, "t": [1, 2],
                                "f64": 0.1}
    assert "NaN" not in text and "Infinity" not in text


# -- environment -----------------------------------------------------------------------------
def test_environment_readers():
    assert env.package_version("pytest") == pytest.__version__
    assert env.package_version("no-such-distribution-specscope") is None
    assert isinstance(env.cpu_name(), str) and env.cpu_name()


def test_deferred_signals_deliver_after_the_block():
    import signal

    from toolkit.signals import deferred_signals

    inside: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        with deferred_signals():
            signal.raise_signal(signal.SIGINT)
            inside.append("after the signal")  # not reached if Ctrl-C were handled at once
    assert inside == ["after the signal"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

    got: list[int] = []
    prev = signal.signal(signal.SIGTERM, lambda s, f: got.append(s))
    try:
        with deferred_signals():
            signal.raise_signal(signal.SIGTERM)
            signal.raise_signal(signal.SIGTERM)
            assert got == []
        assert got == [signal.SIGTERM]  # delivered once, to the handler that was in place
    finally:
        signal.signal(signal.SIGTERM, prev)



def test_write_dict_rows_and_write_json(tmp_path):
    import csv

    from toolkit.files import write_dict_rows
    from toolkit.jsonio import write_json

    write_dict_rows(tmp_path / "t.csv", [{"a": 1, "b": None}, {"b": 2.5, "c": "x"}])
    with (tmp_path / "t.csv").open() as f:
        assert list(csv.reader(f)) == [["a", "b", "c"], ["1", "", ""], ["", "2.5", "x"]]
    write_json(tmp_path / "t.json", {"x": float("nan"), "y": [1, float("inf")]})
    text = (tmp_path / "t.json").read_text()
    assert text.endswith("\n") and json.loads(text) == {"x": None, "y": [1, None]}


def test_entry_point_ends_a_broken_pipe_quietly(capsys):
    """A reader that stopped early (`| head -1`) is the status a shell gives SIGPIPE, not a traceback (issue 43);
    anything else passes through."""

    @cli.entry_point
    def stopped(argv=None) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    @cli.entry_point
    def fine(argv=None) -> int:
        print("ok")
        return 3

    assert stopped([]) == cli.BROKEN_PIPE_STATUS == 141
    assert fine([]) == 3 and capsys.readouterr().out == "ok\n"
    assert fine.__name__ == "fine"


def test_a_path_recorded_relative_to_its_file_reads_back_from_there(tmp_path, monkeypatch):
    from toolkit.files import path_from, resolve_from

    run, cal = tmp_path / "runs" / "r1", tmp_path / "runs" / "r1" / "calibration"
    cal.mkdir(parents=True)
    (run / "run.json").write_text("{}")
    assert path_from(cal, run) == ".." and path_from(tmp_path / "cal", run) == "../runs/r1"
    assert resolve_from(cal, "..") == run.resolve()  # a path that would end in "..": made absolute
    assert resolve_from(tmp_path / "cal", "../runs/r1") == tmp_path / "runs" / "r1"
    assert resolve_from(tmp_path / "cal", str(run)) == run  # an older file's absolute path
    monkeypatch.chdir(tmp_path)  # an older file's path relative to the working directory it was written from
    assert resolve_from(cal, "runs/r1", "run.json") == Path("runs/r1")
    assert resolve_from(cal, "runs/r1") == cal / "runs" / "r1"  # without the marker: relative to the folder
