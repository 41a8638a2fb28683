"""The function-length rule (docs/ARCHITECTURE.md, "Conventions"): a function of the packages is at most
:data:`MAX_LINES` lines, or says why it is longer in a ``# long: <reason>`` comment right above it (above its
decorators); a ``# long:`` comment above a function that is not long is stale and fails too.

Read with ``ast`` from the source files, so the rule holds for code no test runs; the checker itself is
checked on a synthetic source first, so the test cannot pass by reading nothing.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("toolkit", "presets", "sim", "measure", "calibrate", "reports", "specscope")
#: Lines of a function (``def`` to its last line, docstring included) above which it needs a reason.
MAX_LINES = 60


def function_lengths(source: str) -> list[tuple[str, int, int, str | None]]:
    """``(name, line, length, reason)`` of every function in ``source``; ``reason``: the text of the
    ``# long:`` comment right above it (or above its decorators, or at the end of its ``def`` line), None when
    there is none."""
    lines = source.splitlines()
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([d.lineno for d in node.decorator_list] + [node.lineno])
            reason = None
            i = first - 2
            while i >= 0 and lines[i].lstrip().startswith("#"):  # the comment block right above
                text = lines[i].strip()
                if text.startswith("# long:"):
                    reason = text[len("# long:"):].strip()
                i -= 1
            head = lines[node.lineno - 1]  # or on the def line itself: ``def f(  # long: ...``
            if reason is None and "# long:" in head:
                reason = head.split("# long:", 1)[1].strip()
            out.append((node.name, node.lineno, node.end_lineno - node.lineno + 1, reason))
    return out


def test_the_checker_reads_length_and_reason() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    src = (f"def short():\n    return 1\n\n\n# long: a table, not logic\n@dec\ndef tall():\n{body}\n\n\n"
           f"def bare():\n{body}\n\n\ndef inline(  # long: one loop\n):\n{body}\n")
    got = {name: (length, reason) for name, _, length, reason in function_lengths(src)}
    assert got == {"short": (2, None), "tall": (MAX_LINES + 1, "a table, not logic"), "bare": (MAX_LINES + 1, None),
                   "inline": (MAX_LINES + 2, "one loop")}


@pytest.mark.parametrize("package", PACKAGES)
def test_long_functions_say_why_and_short_ones_do_not(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no source files found for {package}"
    unexplained, stale = [], []
    for path in files:
        for name, line, length, reason in function_lengths(path.read_text()):
            where = f"{path.relative_to(ROOT)}:{line} {name} ({length} lines)"
            if length > MAX_LINES and not reason:
                unexplained.append(where)
            elif length <= MAX_LINES and reason is not None:
                stale.append(where)
    assert not unexplained, (f"functions over {MAX_LINES} lines without a '# long: <reason>' comment above them "
                             f"(split them, or say why not): {unexplained}")
    assert not stale, f"'# long:' above a function of at most {MAX_LINES} lines (remove the comment): {stale}"
