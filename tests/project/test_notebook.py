"""examples/quickstart.ipynb: committed without outputs, and runs top to bottom on a real Jupyter kernel.

The run (slow: it measures SmolLM2-135M for real, then calibrates and draws
the report) executes every cell with nbclient on an ipykernel started from
this interpreter, in the repository root (so the notebook imports this
checkout), and checks what the cells showed: the prediction chart, the
measured cells with their CIs, the held-out MAPE, the report's charts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"


def test_the_committed_notebook_has_no_outputs() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert len(code) >= 8
    for cell in code:
        assert cell.outputs == [] and cell.execution_count is None, f"outputs left in:\n{cell.source[:200]}"
        assert "execution" not in cell.metadata
    assert nb.metadata["kernelspec"]["name"] == "python3"


def _outputs(cell, kind: str) -> list:
    return [o for o in cell.outputs if o.output_type in ("display_data", "execute_result") and kind in o.data]


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream") + "".join(
        o.data.get("text/plain", "") for o in cell.outputs if o.output_type == "execute_result")


@pytest.mark.slow
def test_the_notebook_runs_top_to_bottom(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ipykernel")
    from nbclient import NotebookClient

    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the notebook's work directory lands under pytest's tmp
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=1800, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not any(o.output_type == "error" for o in c.outputs) for c in code)
    by_source = {c.source.split("\n", 1)[0]: c for c in code}
    predict = next(c for s, c in by_source.items() if s.startswith("doc = json.loads(specscope(\"predict\""))
    assert "best gamma = " in _text(predict) and len(_outputs(predict, "image/png")) == 1
    assert "text/html" in _outputs(predict, "text/html")[0].data  # the prediction table
    check = next(c for s, c in by_source.items() if s.startswith("specscope(\"check\""))
    assert "alpha" in _text(check).lower()
    measured = next(c for s, c in by_source.items() if s.startswith("RUN = WORK"))
    table = _outputs(measured, "text/html")[0].data["text/html"]
    assert "speedup_lo" in table and "fixed:2" in table and "fixed:4" in table
    mape = next(c for s, c in by_source.items() if s.startswith("CAL = WORK"))
    assert "speedup_mape_pct" in _outputs(mape, "text/html")[0].data["text/html"]
    report = next(c for s, c in by_source.items() if s.startswith("REPORT = WORK"))
    assert len(_outputs(report, "image/png")) >= 3  # predicted vs measured, speedup vs gamma, acceptance, ...
    assert list(tmp_path.glob("specscope-quickstart-*/report/report.html"))
