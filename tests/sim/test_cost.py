"""``sim.cost`` reads only physical cost models, and says where a model comes from (issue #45).

The model the busy machine's calibration wrote (a negative cost per context token) made ``python -m sim
--cost-model FILE`` answer ``0.000x over 1000000000.0 tok/s``: it is now refused in one line naming the file
and the field.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cost import LeviathanCost, TabulatedCost, cost_model_from_dict, cost_provenance, load_cost_model
from tests.support.cli_inprocess import run_module


def _tabulated(**over) -> dict:
    d = TabulatedCost({1: 50.0, 4: 100.0}, draft_step_ms_ref=0.03, reference_context_tokens=160.0,
                      context_ms_per_token_by_tokens={1: 0.01, 4: 0.02}).describe()
    return {**d, **over}


#: the cost model the busy-machine calibration wrote before the fits were bounded (rounded)
BUSY = _tabulated(verify_ms_by_tokens={"1": 51.9, "4": 103.0},
                  context_ms_per_token_by_tokens={"1": -0.347, "4": -0.44})


def test_a_physical_model_reads_back():
    assert isinstance(cost_model_from_dict(_tabulated()), TabulatedCost)


@pytest.mark.parametrize("over, field", [
    ({"context_ms_per_token_by_tokens": {"1": -0.0166, "4": 0.01}}, "'context_ms_per_token_by_tokens' is -0.0166 for 1"),
    ({"target_context_ms_per_token": -0.2, "context_ms_per_token_by_tokens": None}, "'target_context_ms_per_token'"),
    ({"draft_context_ms_per_token": -3.6e-05}, "'draft_context_ms_per_token' is -3.6e-05"),
    ({"round_overhead_ms_base": -1.0}, "'round_overhead_ms_base'"),
    ({"verify_ms_by_tokens": {"1": 1.0, "4": 100.0}}, "'verify_ms_by_tokens': the forward of 1 token(s) is 1 ms at 160"),
    ({"draft_step_ms_ref": 0.0}, "'draft_step_ms_ref' is 0 ms"),
    ({"draft_context_ms_per_token": 0.01}, "'draft_step_ms_ref': the draft step is 0.03 ms at 160 tokens"),
])
def test_an_impossible_model_is_refused_naming_the_field(over, field):
    with pytest.raises(ValueError, match="impossible model") as exc:
        cost_model_from_dict(_tabulated(**over))
    assert field in str(exc.value) and "\n" not in str(exc.value)


def test_a_negative_leviathan_ratio_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="field 'cost_ratio' is -0.1"):
        cost_model_from_dict({"kind": "leviathan", "cost_ratio": -0.1})


def test_sim_refuses_the_busy_machine_model_in_one_line(tmp_path: Path):
    path = tmp_path / "cost_model-ngram_3.json"
    path.write_text(json.dumps(BUSY))
    r = run_module("sim", ["--cost-model", str(path), "--alpha", "0.6", "--gamma-max", "10"])
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and str(path) in r.stderr
    assert "field 'context_ms_per_token_by_tokens' is -0.347 for 1 token(s)" in r.stderr
    with pytest.raises(ValueError, match=f"cost model file '{path}': field"):
        load_cost_model(path)


@pytest.mark.parametrize("meta, words, measured", [
    ({"source": "calibrate"}, "fitted by python -m calibrate", True),
    ({"source": "calibrate serve: NNLS on serve_step_cost.csv"}, "fitted by python -m calibrate", True),
    ({"source": "llama-bench", "file": "b.jsonl"}, "measured by llama-bench", True),
    ({}, "supplied by the user (it records no source): taken as given, not measured", False),
    ({"source": "my notebook"}, "supplied by the user (its metadata names the source 'my notebook'", False),
])
def test_provenance_says_what_the_file_is(meta, words, measured):
    text, was_measured = cost_provenance(cost_model_from_dict(_tabulated(metadata=meta)))
    assert words in text and was_measured is measured


def test_assumed_models_are_never_measured():
    assert cost_provenance(LeviathanCost(0.1)) == (
        "assumed: Leviathan et al.'s model, a draft step = 0.1 x a target step", False)
