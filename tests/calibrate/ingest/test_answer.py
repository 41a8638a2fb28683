"""Where ``calibrate ingest``'s cost model comes from is said truthfully (issue #45).

Before: a cost JSON written by hand was printed as ``costs: measured: FILE (a cost-model file)`` and
``cost_measured`` was true; only the files specscope writes (``calibrate``'s fits, llama-bench's timings) are
measured or fitted, anything else is supplied by the user.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cost import TabulatedCost
from tests.support.cli_inprocess import run_module

LINE = ("SpecDecoding metrics: Mean acceptance length: 3.03, Accepted throughput: 3.87 tokens/s, Drafted "
        "throughput: 5.72 tokens/s, Accepted: 337 tokens, Drafted: 498 tokens, Per-position acceptance rate: "
        "0.837, 0.669, 0.524, Avg Draft acceptance rate: 67.7%\n")


@pytest.mark.parametrize("metadata, said, measured", [
    ({}, "costs: supplied by the user (it records no source): taken as given, not measured: ", False),
    ({"source": "calibrate", "draft": "ngram:3"}, "costs: fitted by python -m calibrate to measured timings: ", True),
])
def test_the_cost_files_source_is_what_is_printed(tmp_path: Path, metadata, said, measured):
    log = tmp_path / "vllm.log"
    log.write_text(LINE)
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps(TabulatedCost({1: 20.0, 4: 26.0}, draft_step_ms_ref=2.0,
                                             metadata=metadata).describe()))
    r = run_module("calibrate", ["ingest", str(log), "--cost-model", str(cost)])
    assert r.returncode == 0, r.stderr
    assert said in r.stdout and "costs: measured: " not in r.stdout
    assert json.loads(r.stdout.strip().splitlines()[-1])["cost_measured"] is measured
