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
  ``measure.records`` (the run format), ``measure.analysis`` (analysis of records),
  ``measure.costpoints`` (which cost points a fit may trust) and ``measure.serve.units`` (a serving
  run's identities, rows and summaries, which itself imports no other ``measure`` module than
  ``measure.records`` and ``measure.stats``, and no torch);
* ``reports`` reads files and never runs a fit: no ``calibrate``, no fitting library
  (``scipy.optimize``, ``scipy.stats``, ``sklearn``, ``statsmodels``), no ``numpy.polyfit``/``lstsq``;
  of ``measure`` only ``measure.records``;
* ``measure.records`` reads and writes the run format only: it imports no other ``measure`` module;
  ``measure.costpoints`` neither, and no torch (calibrate screens cost tables with it);
* ``specscope`` (the ``specscope`` command) is the top layer: it may import every package, and no
  package imports it;
* ``calibrate.outputs`` writes what was fitted and calls no fit.

The scanner itself is checked on a synthetic source and must find imports the
code is known to have, so the test cannot pass by reading nothing.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
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
MEASURE_ALLOWED = {"calibrate": {"measure", "measure.records", "measure.analysis", "measure.serve.units",
                                 "measure.costpoints"},
                   "reports": {"measure", "measure.records"}}
FIT_CALLS = {"polyfit", "lstsq", "curve_fit", "least_squares", "minimize"}  # in reports: none of these


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
    assert "measure.records" in g["calibrate.calibration"] and "sim.acceptance" in g["calibrate.calibration"]
    assert "reports.charts" in g["reports.prediction_chart"]  # a lazy import inside render()
    assert "calibrate.calibration" in g["calibrate.__main__"]  # lazy, after the arguments are checked
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


def test_records_only_reads_and_writes() -> None:
    g = graph()
    other = sorted(n for n in g["measure.records"] if _violates(n, {"measure", "torch"}))
    assert not other, f"measure.records imports {other}: analysis belongs in measure.analysis"
    other = sorted(n for n in g["measure.costpoints"] if _violates(n, {"measure", "torch"}))
    assert not other, f"measure.costpoints imports {other}: calibrate imports it, torch-free"


def test_serve_units_stay_torch_free() -> None:
    g = graph()
    for mod, allowed in (("measure.serve.units", {"measure.records", "measure.stats"}), ("measure.stats", set())):
        other = sorted(n for n in g[mod] if _violates(n, {"measure", "torch"})
                       and not any(n == a or n.startswith(a + ".") for a in allowed))
        assert not other, f"{mod} imports {other}: calibrate reads serving runs through it without torch"


def test_calibrate_outputs_fits_nothing() -> None:
    fits = {"fit_acceptance", "fit_cost", "fit_target", "fit_draft", "trace_model", "ols", "calibrate"}
    found = calls_of((ROOT / "calibrate" / "outputs.py").read_text()) & fits
    assert not found, f"calibrate/outputs.py writes only; it calls {sorted(found)}"
