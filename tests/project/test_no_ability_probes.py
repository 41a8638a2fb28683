"""Abilities are declared, not probed: no ``getattr``/``hasattr`` on a decoder, draft or target in ``measure``.

The seam's base classes (:class:`measure.seam.Decoder`, :class:`~measure.seam.TreeDecoder`,
:class:`~measure.seam.Draft`, :class:`~measure.seam.TargetModel`) carry a default for every optional ability
(the fast paths, ``observe``, a lookup index), engines override what they do faster, and callers call the
methods directly. A probe (``getattr(dec, "forward_argmax", None)``) falls back silently when an engine's
method is renamed or missing; a direct call fails loudly.

What counts as a decoder, draft or target: the probed object's name (``dec``, ``decoder``, ``draft``,
``target``, or a name ending in ``_dec``/``_decoder``/``_draft``/``_target``, also as an attribute:
``self.draft``), or a parameter annotated with a seam type. ``getattr(self, ...)`` inside a class (a decoder's
own ``__del__``) is not a caller's probe. The detector is checked on a synthetic source first, so the test
cannot pass by finding nothing.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: the probing builtins
PROBES = {"getattr", "hasattr"}
#: a name that holds a decoder, draft or target
SEAM_NAME = re.compile(r"(?:^|_)(?:dec|decoder|draft|target)$")
#: annotations naming a seam type (the seam's own classes and the engines' implementations)
SEAM_TYPE = re.compile(r"\b(?:\w*Decoder|Draft|ModelDraft|NGramDraft|TargetModel|LoadedModel|\w*Target)\b")


def _probed_name(node: ast.expr) -> str | None:
    """The last identifier of a probe's first argument (``dec`` of ``dec``, ``draft`` of ``self.draft``)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _annotated_seam_params(tree: ast.AST) -> dict[ast.AST, set[str]]:
    """Per function, the parameters annotated with a seam type."""
    out: dict[ast.AST, set[str]] = {}
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
            out[fn] = {a.arg for a in args if a.annotation is not None
                       and SEAM_TYPE.search(ast.unparse(a.annotation))}
    return out


def probes(source: str) -> list[tuple[int, str]]:
    """``(line, call)`` of every ``getattr``/``hasattr`` whose first argument is a decoder, draft or target."""
    tree = ast.parse(source)
    found = []
    for fn, typed in [*_annotated_seam_params(tree).items(), (tree, set())]:
        body = fn.body if isinstance(fn, ast.Module) else [fn]
        for node in (n for b in body for n in ast.walk(b)):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in PROBES
                    and node.args):
                continue
            name = _probed_name(node.args[0])
            if name is None or name == "self":
                continue
            if SEAM_NAME.search(name) or (isinstance(node.args[0], ast.Name) and name in typed):
                found.append((node.lineno, ast.unparse(node)))
    return sorted(set(found))


SYNTHETIC = '''
def loop(dec, draft, tokens, cfg):
    fast = getattr(dec, "forward_argmax", None)
    observe = getattr(draft, "observe", None)
    rule = getattr(cfg, "rule", None)
    return hasattr(draft, "new_index")

class Drafter:
    def __init__(self, x) -> None:
        self.draft = x
        self.w = getattr(self, "_worker", None)

    def go(self, d: "ModelDraft", m: Decoder, n: int, ref_dec, target_spec):
        getattr(self.draft, "lookup", None)
        getattr(d, "rule", "recent")
        getattr(m, "forward_tree_topk", None)
        getattr(n, "real", None)
        getattr(ref_dec, "forward_topk", None)
        return getattr(target_spec, "strip")
'''


def test_the_detector_finds_probes_on_decoders_drafts_and_targets_only() -> None:
    found = [call for _, call in probes(SYNTHETIC)]
    assert found == ["getattr(dec, 'forward_argmax', None)", "getattr(draft, 'observe', None)",
                     "hasattr(draft, 'new_index')", "getattr(self.draft, 'lookup', None)",
                     "getattr(d, 'rule', 'recent')", "getattr(m, 'forward_tree_topk', None)",
                     "getattr(ref_dec, 'forward_topk', None)"]


def test_measure_probes_no_decoder_draft_or_target() -> None:
    files = sorted((ROOT / "measure").rglob("*.py"))
    assert len(files) > 50  # the whole package was read
    bad = [f"{p.relative_to(ROOT)}:{line}: {call}" for p in files for line, call in probes(p.read_text())]
    assert bad == [], ("call the ability directly; its default belongs on the seam's base class "
                       "(measure/seam.py), its fast path on the engine's subclass:\n" + "\n".join(bad))
