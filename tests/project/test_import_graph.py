"""The packages depend one way (docs/ARCHITECTURE: presets -> sim -> calibrate/measure -> reports).

Read with ``ast`` from the source files — every ``import``/``from ... import``
anywhere in a file (a lazy import inside a function counts too) and every
``importlib.import_module("...")``/``__import__("...")`` with a literal name —
so the rules hold for code paths no test happens to run:

* ``toolkit`` (neutral utilities) imports no other specscope package and no torch;
* ``presets`` never imports ``sim``, ``measure``, ``calibrate`` or ``reports``;
* ``sim`` never imports ``measure``, ``calibrate`` or ``reports`` (nor any plotting library);
* ``measure`` never imports ``calibrate`` or ``reports``;
* ``calibrate`` never imports ``reports``, and of ``measure`` only the torch-free
  ``measure.records`` (the run format), ``measure.ids`` (its identities and their codecs),
  ``measure.analysis`` (analysis of records),
  ``measure.costpoints`` (which cost points a fit may trust) and ``measure.serve.units`` (a serving
  run's rows and summaries, which itself imports no other ``measure`` module than the run format's
  ``measure.records``, ``measure.rows``, ``measure.ids`` and ``measure.stats``, and no torch) and
  ``measure.runkinds`` (the kinds of run);
* ``reports`` reads files and never runs a fit: no ``calibrate``, no fitting library
  (``scipy.optimize``, ``scipy.stats``, ``sklearn``, ``statsmodels``), no ``numpy.polyfit``/``lstsq``;
  of ``measure`` only ``measure.records``, ``measure.ids`` and ``measure.runkinds``;
* ``measure.records`` reads and writes the run format only: of ``measure`` it imports only the rows and
  identities it writes (``measure.rows``, ``measure.ids``; they import only ``measure.stats``), no torch;
  ``measure.costpoints`` imports no ``measure`` module and no torch (calibrate screens cost tables with it),
  ``measure.serve.units`` only the run format (calibrate reads serving runs through it), ``measure.runkinds``
  only the run format and the identities and rows it registers; ``measure.ids`` (every identity's one codec) no
  ``measure`` module;
* ``specscope`` (the ``specscope`` command) is the top layer: it may import every package, and no
  package imports it;
* ``calibrate.outputs`` writes what was fitted and calls no fit;
* no import cycle inside any package (the cycle is printed);
* inside ``measure``, one-way layers (:data:`MEASURE_LAYERS`): a module imports only modules of its own
  layer or of the layers below it, and every module of ``measure`` has a layer.

The scanner itself is checked on a synthetic source and must find imports the
code is known to have, so the test cannot pass by reading nothing.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("toolkit", "presets", "sim", "measure", "calibrate", "reports", "specscope")
FORBIDDEN = {
    "toolkit": {"presets", "sim", "measure", "calibrate", "reports", "specscope", "torch"},
    "presets": {"sim", "measure", "calibrate", "reports", "specscope"},
    "sim": {"measure", "calibrate", "reports", "specscope", "altair", "matplotlib", "vl_convert", "torch"},
    "measure": {"calibrate", "reports", "specscope"},
    "calibrate": {"reports", "specscope"},
    "reports": {"calibrate", "specscope", "scipy.optimize", "scipy.stats", "sklearn", "statsmodels"},
    "specscope": set(),  # the top layer: it may import every package
}
#: the only ``measure`` modules a package above it may import (torch-free, about files)
MEASURE_ALLOWED = {"calibrate": {"measure", "measure.records", "measure.ids", "measure.analysis",
                                 "measure.serve.units", "measure.costpoints", "measure.runkinds"},
                   "reports": {"measure", "measure.records", "measure.ids", "measure.runkinds"}}
FIT_CALLS = {"polyfit", "lstsq", "curve_fit", "least_squares", "minimize"}  # in reports: none of these
#: ``measure``'s layers, lowest first (docs/ARCHITECTURE.md): a module imports only its own layer or those below
#: (lazy imports count). A module is in the layer of the longest entry naming it or a package above it.
MEASURE_LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("run format: torch-free, what calibrate and reports read",
     ("measure.__init__", "measure.records", "measure.rows", "measure.ids", "measure.stats", "measure.analysis",
      "measure.costpoints", "measure.serve.units", "measure.racing", "measure.prior", "measure.runkinds")),
    ("machine and inputs", ("measure.timing", "measure.system", "measure.prompts", "measure.devices")),
    ("the seam: every protocol that crosses layers", ("measure.seam",)),
    ("loops, drafts and heads, written against the seam", ("measure.decoding", "measure.drafts", "measure.head",
                                                           "measure.trees")),
    ("engine adapters", ("measure.engines",)),
    ("the sweep", ("measure.sweep", "measure.runplan")),
    ("executors, experiments and trackers", ("measure.executors", "measure.head.head_sweep",
                                             "measure.head.head_recall", "measure.head.profiling", "measure.serve",
                                             "measure.tracking", "measure.trees.run")),
    ("command line: parses argv, prints tables", ("measure.cli", "measure.__main__", "measure.head.cli",
                                                  "measure.serve.cli", "measure.trees.cli")),
)


def imports_of(source: str, module: str) -> set[str]:
    """Dotted names ``source`` (the text of module ``module``, e.g. ``sim.cli``) imports, anywhere in it."""
    found: set[str] = set()
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if name in ("import_module", "__import__"):
                found.add(node.args[0].value)
    return found


def calls_of(source: str) -> set[str]:
    """Names of every function called in ``source`` (``np.polyfit(...)`` gives ``polyfit``)."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            fn = node.func
            out.add(fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", ""))
    return out


def _violates(name: str, forbidden: set[str]) -> bool:
    return any(name == f or name.startswith(f + ".") for f in forbidden)


def package_files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    return ".".join(rel.parts)


def graph() -> dict[str, set[str]]:
    """Module -> every dotted name it imports, for every file of the five packages."""
    return {module_name(p): imports_of(p.read_text(), module_name(p))
            for pkg in PACKAGES for p in package_files(pkg)}


def resolve(name: str, modules: set[str] | dict[str, set[str]]) -> str | None:
    """The module an imported dotted name lands in (``measure.sweep.run_sweep`` -> ``measure.sweep``, a package
    -> its ``__init__``), None outside the project."""
    parts = name.split(".")
    while parts:
        cand = ".".join(parts)
        if cand in modules:
            return cand
        if f"{cand}.__init__" in modules:
            return f"{cand}.__init__"
        parts.pop()
    return None


def module_edges(g: dict[str, set[str]]) -> dict[str, set[str]]:
    """Module -> the project modules it imports (itself left out)."""
    return {m: {r for n in names if (r := resolve(n, g)) is not None and r != m} for m, names in g.items()}


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    cycles = []
    for comp in comps:  # a shortest way from the first module back to itself, inside its component
        inside, start = set(comp), comp[0]
        prev: dict[str, str] = {}
        todo, seen = [start], {start}
        while todo:
            v = todo.pop(0)
            nxt = sorted(edges.get(v, set()) & inside)
            if start in nxt:
                path = [v]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                cycles.append([*reversed(path), start])
                break
            for w in nxt:
                if w not in seen:
                    seen.add(w)
                    prev[w] = v
                    todo.append(w)
    return cycles


def layer_of(module: str) -> int | None:
    """Index in :data:`MEASURE_LAYERS` of ``module`` (longest matching entry), None when no entry names it."""
    best, found = -1, None
    for i, (_, entries) in enumerate(MEASURE_LAYERS):
        for e in entries:
            if (module == e or module.startswith(e + ".")) and len(e) > best:
                best, found = len(e), i
    return found


def test_scanner_finds_every_kind_of_import() -> None:
    src = (
        "import reports.charts\n"
        "from calibrate import fit_cost\n"
        "def f():\n"
        "    from measure.records import load_run\n"
        "    import importlib\n"
        "    importlib.import_module('reports.page')\n"
        "    __import__('calibrate.outputs')\n"
        "from . import cost\n"
        "from .acceptance import IIDAcceptance\n"
    )
    found = imports_of(src, "sim.cli")
    assert {"reports.charts", "calibrate", "measure.records", "reports.page", "calibrate.outputs",
            "sim", "sim.cost", "sim.acceptance"} <= found
    assert all(_violates(n, FORBIDDEN["sim"]) for n in ("reports.charts", "calibrate", "measure.records"))
    assert not _violates("simpy", FORBIDDEN["sim"]) and not _violates("reportsx", {"reports"})
    assert "polyfit" in calls_of("import numpy as np\nnp.polyfit(x, y, 1)\n")


def test_scanner_reads_the_real_code() -> None:
    g = graph()
    for pkg in PACKAGES:
        assert package_files(pkg), f"no source files found for {pkg}"
    assert "toolkit.__init__" in g, "the toolkit package is scanned"
    assert "specscope.cli" in g, "the specscope package is scanned"
    # imports the code is known to have, top-level and lazy: the scan is not empty
    assert "presets" in g["sim.cli"] and "sim.acceptance" in g["sim.cli"]
    assert "measure.records" in g["calibrate.dataset"] and "sim.acceptance" in g["calibrate.calibration"]
    assert "reports.charts" in g["reports.prediction_chart"]  # a lazy import inside render()
    assert "calibrate.calibration" in g["calibrate.chain_cli"]  # lazy, after the arguments are checked
    assert "toolkit.cli" in g["calibrate.__main__"] and "toolkit.jsonio" in g["sim.cost"]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_dependencies_point_one_way(package: str) -> None:
    bad = {}
    for path in package_files(package):
        mod = module_name(path)
        names = sorted(n for n in imports_of(path.read_text(), mod) if _violates(n, FORBIDDEN[package]))
        if names:
            bad[str(path.relative_to(ROOT))] = names
    assert not bad, f"{package} must not import {sorted(FORBIDDEN[package])}: {bad}"


def test_nothing_imports_the_top_layer() -> None:
    """``specscope`` sits on top: a package below it that imported it would close a cycle."""
    g = graph()
    assert "specscope.cli" in g["specscope.__main__"]  # the scan sees specscope's own imports
    bad = sorted(m for m, names in g.items() if not m.startswith("specscope")
                 and any(_violates(n, {"specscope"}) for n in names))
    assert not bad, f"no package may import specscope (the top layer): {bad}"


def test_reports_runs_no_fit() -> None:
    fits = {str(p.relative_to(ROOT)): sorted(calls_of(p.read_text()) & FIT_CALLS) for p in package_files("reports")}
    assert not any(fits.values()), f"reports reads files only; fitting calls found: {fits}"


@pytest.mark.parametrize("package", sorted(MEASURE_ALLOWED))
def test_only_torch_free_measure_modules_above_measure(package: str) -> None:
    allowed = MEASURE_ALLOWED[package]
    bad = {}
    for path in package_files(package):
        names = imports_of(path.read_text(), module_name(path))
        # ``from measure.records import load_run`` also yields ``measure.records.load_run``: judge the module
        found = {n for n in names if _violates(n, {"measure"})}
        wrong = sorted(n for n in found if not any(n == a or n.startswith(a + ".") for a in allowed - {"measure"})
                       and n != "measure")
        if wrong:
            bad[str(path.relative_to(ROOT))] = wrong
    assert not bad, f"{package} may import only {sorted(allowed - {'measure'})} of measure: {bad}"


#: The run format's own modules, torch-free: what each may import of measure (calibrate and reports read them).
RUN_FORMAT = {"measure.records": {"measure.rows", "measure.ids"}, "measure.rows": {"measure.ids", "measure.stats"},
              "measure.ids": set(), "measure.stats": set(), "measure.costpoints": set(),
              "measure.serve.units": {"measure.records", "measure.rows", "measure.ids", "measure.stats"},
              "measure.runkinds": {"measure.records", "measure.rows", "measure.ids"}}


@pytest.mark.parametrize("module", sorted(RUN_FORMAT))
def test_records_only_reads_and_writes(module: str) -> None:
    allowed = RUN_FORMAT[module]
    other = sorted(n for n in graph()[module] if _violates(n, {"measure", "torch"})
                   and not any(n == a or n.startswith(a + ".") for a in allowed))
    assert not other, f"{module} imports {other}: calibrate and reports read it without torch"


def test_calibrate_outputs_fits_nothing() -> None:
    fits = {"fit_acceptance", "fit_cost", "fit_target", "fit_draft", "trace_model", "ols", "calibrate"}
    found = calls_of((ROOT / "calibrate" / "outputs.py").read_text()) & fits
    assert not found, f"calibrate/outputs.py writes only; it calls {sorted(found)}"


def test_cycle_finder_finds_a_cycle_and_names_it() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"a"}}
    assert find_cycles(edges) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []
    # a lazy import closes a cycle just as a top-level one does
    g = {"p.x": imports_of("from p import y\n", "p.x"), "p.y": imports_of("def f():\n    import p.x\n", "p.y"),
         "p.__init__": set()}
    assert find_cycles(module_edges(g)) == [["p.x", "p.y", "p.x"]]


def test_no_import_cycle_inside_a_package() -> None:
    cycles = find_cycles(module_edges(graph()))
    assert not cycles, "import cycles (lazy imports count): " + "; ".join(" -> ".join(c) for c in cycles)


def test_every_measure_module_has_a_layer() -> None:
    missing = sorted(m for m in graph() if m.split(".")[0] == "measure" and layer_of(m) is None)
    assert not missing, f"add these modules to MEASURE_LAYERS: {missing}"
    assert layer_of("measure.head.head_sweep") > layer_of("measure.head.pruned_head")  # the longest entry wins
    assert layer_of("measure.recordsx") is None and layer_of("measure.__init__") == 0


def test_measure_layers_point_down() -> None:
    edges = module_edges(graph())
    bad = []
    for mod, targets in sorted(edges.items()):
        if mod.split(".")[0] != "measure" or layer_of(mod) is None:
            continue
        for t in sorted(targets):
            if t.split(".")[0] == "measure" and layer_of(t) is not None and layer_of(t) > layer_of(mod):
                bad.append(f"{mod} ({MEASURE_LAYERS[layer_of(mod)][0]}) imports {t} "
                           f"({MEASURE_LAYERS[layer_of(t)][0]})")
    assert not bad, "measure's layers point down only:\n" + "\n".join(bad)
