"""No module but the registry reads a run's kind (docs/ARCHITECTURE.md, "Kinds of run").

A run's kind is ``run.json`` ``config.kind``, read only by :func:`measure.runkinds.kind_of`. Read with
``ast`` from every file of every package: a ``["kind"]`` subscript or a ``.get("kind")`` call on an
expression that names a config (``meta["config"]["kind"]``, ``(meta.get("config") or {}).get("kind")``,
``config.get("kind")``, ``cfg["kind"]``) outside ``measure/runkinds.py`` fails, naming file and line.
Other things called ``kind`` (a cost model's ``{"kind": "roofline"}``, a draft's ``kind`` attribute, a
DataFrame column) are not a run's kind and are not flagged. The detector is checked on a synthetic source
first, so the test cannot pass by finding nothing.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("toolkit", "presets", "sim", "measure", "calibrate", "reports", "specscope")
REGISTRY = ROOT / "measure" / "runkinds.py"
CONFIG_WORDS = ("config", "cfg")


def _is_kind(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value == "kind"


def kind_reads(source: str) -> list[tuple[int, str]]:
    """``(line, expression)`` of every read of a config's ``kind`` in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        receiver = None
        if isinstance(node, ast.Subscript) and _is_kind(node.slice) and isinstance(node.ctx, ast.Load):
            receiver = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and node.args and _is_kind(node.args[0]):
            receiver = node.func.value
        if receiver is None:
            continue
        text = ast.get_source_segment(source, receiver) or ""
        if any(w in text.lower() for w in CONFIG_WORDS):
            found.append((node.lineno, ast.get_source_segment(source, node) or ""))
    return found


def test_the_detector_finds_every_way_the_kind_was_read() -> None:
    source = '\n'.join([
        'a = meta["config"]["kind"]',
        'b = (meta.get("config") or {}).get("kind")',
        'c = config.get("kind")',
        'd = run.meta["config"].get("kind", "chain")',
        'e = cfg["kind"]',
        'f = model.get("kind")',  # a cost model's kind: not a run's
        'g = frame["kind"]',  # a column
        'config["kind"] = "x"',  # a write (RunKind.stamp writes; a stray write is a review matter)
    ])
    assert [line for line, _ in kind_reads(source)] == [1, 2, 3, 4, 5]


def test_no_module_but_the_registry_reads_the_kind() -> None:
    bad = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path == REGISTRY:
                continue
            bad += [f"{path.relative_to(ROOT)}:{line}: {expr}" for line, expr in kind_reads(path.read_text())]
    assert not bad, ("read a run's kind through measure.runkinds.kind_of / read_kind, not the string: "
                     + "; ".join(bad))
