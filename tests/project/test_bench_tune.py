"""benchmarks/bench_tune.py --serve: the fixed and the tuned serving run read side by side (the script loaded from
its file, benchmarks/ is no package; the two runs written by the serving simulator, not measured)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from measure.serve.units import LoadSpec
from sim.acceptance import PerPositionAcceptance, ProposalAcceptance
from tests.support.serve_runs import make_serve_run

ROOT = Path(__file__).resolve().parents[2]
ACC = {k: ProposalAcceptance(0.55, PerPositionAcceptance((0.8, 0.7, 0.6, 0.55))) for k in (2, 8)}
LOADS = [LoadSpec(concurrency=1), LoadSpec(concurrency=4)]


@pytest.fixture(scope="module")
def script() -> ModuleType:
    name = "bench_tune"
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_serving_question_side_by_side(script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture) -> None:
    calls = []

    def run(q: object, args: list[str], out: Path) -> float:
        calls.append((q, args))
        tuned = "--until-decided" in args
        make_serve_run(out, ACC, LOADS, repeats=2 if tuned else 4, n_requests=4, new_tokens=16, seed=1)
        return 5.0 if tuned else 20.0

    monkeypatch.setattr(script, "_run", run)
    assert script.main(["--serve", "--out", str(tmp_path), "--", "--concurrency", "1,4"]) == 0
    assert [q.command for q, _ in calls] == [("measure", "serve")] * 2
    assert calls[1][1] == ["--concurrency", "1,4", "--force-new", "--until-decided"]
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("load ") and "fixed design" in lines[0]
    doc = json.loads(lines[-1])
    assert doc["question"] == "load" and [r["load"] for r in doc["rows"]] == ["c1", "c4"]
    assert doc["measured_s"]["tuned"] < doc["measured_s"]["fixed"] and doc["wall_s"] == {"fixed": 20.0, "tuned": 5.0}
    assert "the units' measured seconds" in lines[-2]
    for r in doc["rows"]:
        d = doc["decisions"]["fixed"][r["load"]]
        assert r["fixed"] == (d["choice"] or "off")
        if r["tuned"] == r["fixed"]:
            assert r["regret"] == 0.0
        assert r["regret_lo"] is None or r["regret_lo"] <= r["regret"] <= r["regret_hi"]


def test_a_decision_is_off_unless_a_candidate_beats_it(script: ModuleType) -> None:
    d = script.decisions({"c1": {"k2": (0.9, 0.8, 1.0), "k4": (0.95, 0.9, 1.0)},
                          "c4": {"k2": (1.2, 1.1, 1.3), "k4": (1.1, 1.0, 1.2)}})
    assert d["c1"].choice is None and d["c1"].speedup == 1.0 and d["c4"].choice == "k2"
    value, lo, hi = script.regret({"c4": {"k2": (1.2, 1.1, 1.3), "k4": (1.1, 1.0, 1.2)}},
                                  script.Decision("c4", "k4", 1.1, 1.0, 1.2))
    assert value == pytest.approx(1 - 1.1 / 1.2) and lo == pytest.approx(1 - 1.2 / 1.1)
    assert hi == pytest.approx(1 - 1.0 / 1.3)
