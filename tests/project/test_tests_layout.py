"""The suite's own layout (docs/ARCHITECTURE.md, "Conventions"): tests mirror the packages' tree, every folder is
a package, no test module imports another, and nothing edits ``sys.path``.

A helper two test files share is a fixture in the nearest ``conftest.py`` or a function in ``tests/support/``;
importing it from a test module runs that module's tests' setup (and its fixtures) as a side effect, and a
``sys.path`` entry makes a module importable under two names (two copies of its globals).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
#: folders of tests/ that mirror no package
NOT_PACKAGES = {"project", "support"}
#: an import of a test module written inside a string (a script a test runs in a subprocess)
TEST_IMPORT_TEXT = re.compile(r"^\s*(?:from|import)\s+(?:[\w.]+\.)?test_\w+", re.M)
SYS_PATH_EDIT = re.compile(r"sys\.path\.(?:insert|append|extend)|sys\.path\s*(?:\+=|=)")


def python_files() -> list[Path]:
    return sorted(TESTS.rglob("*.py"))


def imported_test_modules(node: ast.AST) -> list[str]:
    """The test modules (last part ``test_*``) an import statement imports."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        names = [base] + [f"{base}.{a.name}" for a in node.names]
    else:
        return []
    return [n for n in names if n.rsplit(".", 1)[-1].startswith("test_")]


def test_no_test_module_imports_another() -> None:
    bad = {}
    for path in python_files():
        text = path.read_text()
        found = [n for node in ast.walk(ast.parse(text)) for n in imported_test_modules(node)]
        found += [m.group(0).strip() for m in TEST_IMPORT_TEXT.finditer(text)]
        if found:
            bad[str(path.relative_to(ROOT))] = found
    assert bad == {}, "share a fixture through conftest.py or a helper through tests/support/"


def test_nothing_in_tests_edits_sys_path() -> None:
    me = Path(__file__).resolve()
    bad = [str(p.relative_to(ROOT)) for p in python_files() if p != me and SYS_PATH_EDIT.search(p.read_text())]
    assert bad == [], "import as tests.support.<module> (the root is on the path), or set PYTHONPATH in a subprocess"


def test_every_folder_of_tests_is_a_package() -> None:
    folders = {p.parent for p in python_files()}
    missing = sorted(str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").exists())
    assert missing == []  # without it pytest puts the folder on sys.path and tests/sim would shadow sim


def test_tests_mirror_the_packages() -> None:
    """Each test file is in tests/<package>/[<subpackage>/...] of a real package, or in tests/project/; none at
    the top of tests/ and none in tests/support/."""
    bad = []
    for path in TESTS.rglob("test_*.py"):
        parts = path.relative_to(TESTS).parts[:-1]
        if not parts or parts[0] == "support":
            bad.append(str(path.relative_to(ROOT)))
        elif parts[0] not in NOT_PACKAGES and not (ROOT.joinpath(*parts) / "__init__.py").exists():
            bad.append(f"{path.relative_to(ROOT)} (no package {'.'.join(parts)})")
    assert bad == []


def test_the_layout_checks_can_fail() -> None:
    src = "import sys\nfrom tests.measure import test_measure_real\nsys.path.insert(0, 'x')\n"
    assert [n for node in ast.walk(ast.parse(src)) for n in imported_test_modules(node)] == [
        "tests.measure.test_measure_real"]
    assert TEST_IMPORT_TEXT.search('code = """\nfrom test_measure_decoding import _prompt\n"""')
    assert SYS_PATH_EDIT.search(src) and not SYS_PATH_EDIT.search("print(sys.path)")
