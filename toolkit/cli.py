"""The argument toolkit every specscope CLI shares: one-line errors, exit status 2, typed and bounded values.

:class:`OneLineParser` is an ``argparse.ArgumentParser`` whose errors are a
single line (``PROG: error: argument --gamma: ...``) instead of the usage
block followed by the message; the usage stays in ``--help``. Unknown options
get a "did you mean" from the parser's own option names, and abbreviations
(``--gam`` for ``--gamma``) are refused rather than guessed.

Two layers, so library code and argparse share one set of checks:

* ``parse_*`` functions check one value and raise ``ValueError`` naming it and
  what is valid (a config's ``__post_init__`` may call them);
* ``*_arg`` factories wrap them as ``type=`` converters (argparse prefixes the
  flag): finite floats and integers in a range, comma lists that refuse empty
  items (``1,,2``), a name out of a list, a non-blank string; and
  :func:`parse_host_port` (``HOST:PORT``, a port in 1..65535).

:func:`fail` is the same one line for checks made after parsing;
:func:`entry_point` wraps every command's ``main`` (``python -m PACKAGE``, the
``specscope`` command) so that output piped into a reader that stops early
(``specscope predict --help | head -1``) ends quietly, as a Unix tool does;
:func:`exit_on_next_interrupt` makes a second Ctrl-C, once the first was
handled, end the process at once and quietly;
:func:`check_output_file` and :func:`check_output_dir` probe an output path
before any work, so a bad ``--out`` fails in a second, not after the run.
"""

from __future__ import annotations

import argparse
import atexit
import difflib
import math
import os
import re
import signal
import sys
import tempfile
from pathlib import Path
from typing import Callable, NoReturn, Sequence, TypeVar

T = TypeVar("T")

#: TCP ports a ``HOST:PORT`` may name (0 is "any port" to a server, never an address to join).
PORT_RANGE = (1, 65535)
_HOST_PORT = re.compile(r"^(?P<host>[A-Za-z0-9._-]+):(?P<port>[0-9]+)$")


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line; abbreviations of long options are refused."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> NoReturn:
        """Print ``PROG: error: MESSAGE`` on one line and exit with status 2 (no usage block)."""
        message = " ".join(message.split())
        if message.startswith("unrecognized arguments:"):
            message = self._unknown(message.removeprefix("unrecognized arguments:").split())
        self.exit(2, f"{self.prog}: error: {message}\n")

    def _unknown(self, extras: Sequence[str]) -> str:
        first = extras[0] if extras else ""
        if first.startswith("-"):
            flag = first.split("=", 1)[0]
            close = difflib.get_close_matches(flag, list(self._option_string_actions), n=1)
            hint = f"; did you mean {close[0]}?" if close else f"; see {self.prog} --help for the options"
            return f"unknown option {flag!r}{hint}"
        return f"unexpected argument {first!r}; see {self.prog} --help"


#: The exit status of a command whose reader went away: what a shell reports for a process SIGPIPE ended (128 + 13).
BROKEN_PIPE_STATUS = 128 + int(getattr(signal, "SIGPIPE", 13))
MainFn = TypeVar("MainFn", bound=Callable[..., int])


def entry_point(main: MainFn) -> MainFn:
    """``main`` (a command's ``main(argv) -> status``) made quiet when its reader closes the pipe early.

    Python ignores SIGPIPE, so a write to a pipe ``head -1`` has closed raises
    ``BrokenPipeError`` — a traceback in the middle of the command, or an
    "Exception ignored" line when the interpreter flushes stdout at exit. Here
    the output is flushed inside the call, a broken pipe points stdout at
    ``/dev/null`` (nothing more to write, nothing to flush at exit) and the
    status is :data:`BROKEN_PIPE_STATUS`. Nested entry points (``specscope
    predict`` runs ``python -m sim``'s) each handle it once, where it happens.
    """
    import functools

    @functools.wraps(main)
    def wrapped(*args: object, **kwargs: object) -> int:
        try:
            try:
                return main(*args, **kwargs)
            finally:  # on a SystemExit too (argparse's --help): what is buffered goes now, not at exit
                _flush_stdout()
        except BrokenPipeError:
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
                os.close(devnull)
            except (OSError, ValueError):  # stdout is no file (captured in a test): nothing to redirect
                pass
            return BROKEN_PIPE_STATUS

    return wrapped  # type: ignore[return-value]


def _flush_stdout() -> None:
    """Flush stdout; a closed pipe raises ``BrokenPipeError`` (for :func:`entry_point`), any other fault of a
    stdout that is gone or closed is nothing to report."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except (OSError, ValueError, AttributeError):
        pass


def fail(prog: str, message: object) -> NoReturn:
    """Exit with status 2 after printing one ``PROG: error: MESSAGE`` line (for checks after parsing)."""
    print(f"{prog}: error: {' '.join(str(message).split())}", file=sys.stderr)
    raise SystemExit(2)


def exit_on_next_interrupt(code: int) -> None:
    """Call where a first Ctrl-C was handled (the run closed, its line printed). Until Python's shutdown a
    second one ends the process at once with ``code``; from the shutdown on (atexit hooks, finalizers) Ctrl-C is
    ignored, so the exit status stays ``code``. Before, a second Ctrl-C raised ``KeyboardInterrupt`` in an
    atexit hook (torch's library finalizers): a traceback and the exit status -SIGINT (issue 32)."""

    def now(_sig: int, _frame: object) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)

    try:
        signal.signal(signal.SIGINT, now)
    except ValueError:  # not the main thread: nothing to install
        return
    # registered last, run first: Python resets a handler of its own to the default (death by SIGINT) late in
    # the shutdown, an ignored signal it leaves ignored
    atexit.register(signal.signal, signal.SIGINT, signal.SIG_IGN)


def _typed(convert: Callable[[str], T]) -> Callable[[str], T]:
    """``convert`` as an argparse ``type=``: its ``ValueError`` becomes the one-line argument error."""

    def typed(text: str) -> T:
        try:
            return convert(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return typed


# -- numbers ---------------------------------------------------------------------------------
def _num(v: float) -> str:
    """``1000000`` as ``1,000,000``, ``0.5`` as ``0.5``."""
    return f"{int(v):,}" if float(v).is_integer() and abs(v) < 1e19 else f"{v:g}"


def _range_text(lo: float | None, hi: float | None, lo_open: bool, integer: bool) -> str:
    kind = "an integer" if integer else "a finite number"
    if lo is not None and hi is not None and not lo_open:
        return f"{kind} in {_num(lo)}..{_num(hi)}" if integer else f"{kind} in [{_num(lo)}, {_num(hi)}]"
    parts = []
    if lo is not None:
        parts.append(f"{'>' if lo_open else '>='} {_num(lo)}")
    if hi is not None:
        parts.append(f"<= {_num(hi)}")
    return f"{kind} {' and '.join(parts)}" if parts else kind


def parse_float(text: str, lo: float | None = None, hi: float | None = None, lo_open: bool = False,
                why: str = "") -> float:
    """``text`` as a finite float in the range (``lo_open``: strictly above ``lo``), else ``ValueError``."""
    want = _range_text(lo, hi, lo_open, integer=False) + (f" ({why})" if why else "")
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{text!r} is not a number; valid: {want}") from None
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not a finite number; valid: {want}")
    if (lo is not None and (value <= lo if lo_open else value < lo)) or (hi is not None and value > hi):
        raise ValueError(f"{text!r} is out of range; valid: {want}")
    return value


def parse_int(text: str, lo: int | None = None, hi: int | None = None, why: str = "") -> int:
    """``text`` as an integer in ``lo..hi``, else ``ValueError`` naming it and the range."""
    want = _range_text(lo, hi, False, integer=True) + (f" ({why})" if why else "")
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError(f"{text!r} is not an integer; valid: {want}") from None
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ValueError(f"{text!r} is out of range; valid: {want}")
    return value


def float_arg(lo: float | None = None, hi: float | None = None, lo_open: bool = False,
              why: str = "") -> Callable[[str], float]:
    """A ``type=`` converter: a finite float in the range (``lo_open``: strictly above ``lo``)."""
    return _typed(lambda text: parse_float(text, lo, hi, lo_open, why))


def int_arg(lo: int | None = None, hi: int | None = None, why: str = "") -> Callable[[str], int]:
    """A ``type=`` converter: an integer in ``lo..hi``."""
    return _typed(lambda text: parse_int(text, lo, hi, why))


# -- lists and names -------------------------------------------------------------------------
def split_list(text: str) -> list[str]:
    """Comma-separated items; ``ValueError`` for an empty list or an empty item (``1,,2``, ``1,``)."""
    if not str(text).strip():
        raise ValueError("empty list; give comma-separated values")
    items = [x.strip() for x in str(text).split(",")]
    empty = [i + 1 for i, x in enumerate(items) if not x]
    if empty:
        raise ValueError(f"{text!r}: empty item at position {empty[0]}; give comma-separated values with "
                         "none left empty")
    return items


def csv_items(flag: str, text: str, prog: str = "python -m measure") -> list[str]:
    """``split_list`` for a value checked after parsing: a bad list exits with ``PROG: error: FLAG ...``."""
    try:
        return split_list(text)
    except ValueError as exc:
        fail(prog, f"{flag} {exc}")


def parse_float_list(text: str, lo: float | None = None, hi: float | None = None, lo_open: bool = False,
                     max_items: int | None = None, why: str = "") -> list[float]:
    """Comma-separated finite floats, each in the range, at most ``max_items``; else ``ValueError``."""
    items = split_list(text)
    if max_items is not None and len(items) > max_items:
        raise ValueError(f"{len(items)} values in {text!r}; at most {max_items}" + (f" ({why})" if why else ""))
    return [parse_float(x, lo, hi, lo_open, why) for x in items]


def float_list_arg(lo: float | None = None, hi: float | None = None, max_items: int | None = None,
                   why: str = "", lo_open: bool = False) -> Callable[[str], list[float]]:
    """A ``type=`` converter: comma-separated finite floats, each in the range, at most ``max_items``."""
    return _typed(lambda text: parse_float_list(text, lo, hi, lo_open, max_items, why))


def choice_arg(what: str, valid: Sequence[str]) -> Callable[[str], str]:
    """A ``type=`` converter: one of ``valid`` by exact name; anything else lists them."""

    def convert(text: str) -> str:
        if text not in valid:
            raise ValueError(f"unknown {what} {text!r}; valid: {', '.join(valid)}")
        return text

    return _typed(convert)


def nonempty_arg(what: str) -> Callable[[str], str]:
    """A ``type=`` converter: any string but an empty or blank one."""

    def convert(text: str) -> str:
        if not text.strip():
            raise ValueError(f"empty {what}; give a {what}")
        return text

    return _typed(convert)


# -- addresses and files ---------------------------------------------------------------------
def parse_host_port(text: str) -> tuple[str, int]:
    """``HOST:PORT`` as ``(host, port)`` with a port in 1..65535, else ``ValueError`` naming the part."""
    m = _HOST_PORT.match(str(text))
    if m is None:
        raise ValueError(f"{text!r} is not HOST:PORT (e.g. 10.0.0.1:6379)")
    port = int(m.group("port"))
    if not PORT_RANGE[0] <= port <= PORT_RANGE[1]:
        raise ValueError(f"{text!r}: port {port} is out of range; valid: a TCP port in 1..65,535")
    return m.group("host"), port


def check_output_file(flag: str, path: str | Path) -> Path:
    """Create ``path``'s folder and make sure a file can be written there; ``ValueError`` (one line) if not.

    Run before any work so a bad ``--out`` fails in a second, not after the
    computation. Nothing is left behind when ``path`` did not exist.
    """
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{flag} {str(p)!r} is a directory; give a file name")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        existed = p.exists()
        with p.open("a"):
            pass
        if not existed:
            p.unlink()
    except OSError as exc:
        raise ValueError(f"{flag} {str(p)!r} cannot be written: {exc.strerror or exc}") from None
    return p


def check_output_dir(flag: str, path: str | Path) -> Path:
    """Create directory ``path`` (and parents) and probe that files can be written in it; ``ValueError`` if not."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{flag} {str(p)!r} is a file, not a directory; give a directory")
    try:
        p.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=p, prefix=".write-probe-"):  # a name of its own: two may probe at once
            pass
    except OSError as exc:
        raise ValueError(f"{flag} {str(p)!r} cannot be created or written: {exc.strerror or exc}") from None
    return p
