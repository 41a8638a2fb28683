"""benchmarks/bench_tune.py --serve: the fixed and the tuned serving run read side by side (the script loaded from
its file, benchmarks/ is no package; the two runs written by the serving simulator, not measured)."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from measure.serve.units import LoadSpec
from toolkit.jsonio import read_json, write_json
from sim.acceptance import PerPositionAcceptance, ProposalAcceptance
from tests.support.scripts import load_benchmark
from tests.support.serve_runs import make_serve_run

ROOT = Path(__file__).resolve().parents[2]
ACC = {k: ProposalAcceptance(0.55, PerPositionAcceptance((0.8, 0.7, 0.6, 0.55))) for k in (2, 8)}
LOADS = [LoadSpec(concurrency=1), LoadSpec(concurrency=4)]


@pytest.fixture(scope="module")
def script() -> ModuleType:
    return load_benchmark("bench_tune")


def _race(leaders: dict[str, str]) -> dict:
    """A ``run.json`` ``race`` whose last look has these leaders (load → configuration)."""
    groups = {ld: {"leader": c, "stop_reason": None, "resolved": [], "eliminated": [],
                   "comparisons": [{"cell_id": o, "ratio": 1.0, "n_units": 2, "ratio_lo": None, "ratio_hi": None}
                                   for o in ("off", "ngram:3:k2", "ngram:3:k8") if o != c]}
              for ld, c in leaders.items()}
    return {"rule": {}, "looks": [{"look": 0, "groups": groups}], "stopped_by": "time budget", "decided": {}}


def _fake_run(calls: list, leaders: dict[str, str]):
    def run(q: object, args: list[str], out: Path) -> float:
        calls.append((q, args))
        tuned = "--until-decided" in args
        make_serve_run(out, ACC, LOADS, repeats=2 if tuned else 4, n_requests=4, new_tokens=16, seed=1)
        if tuned:
            meta = read_json(out / "run.json", "run.json")
            write_json(out / "run.json", {**meta, "race": _race(leaders)})
        return 5.0 if tuned else 20.0
    return run


def test_the_tuned_decision_is_the_race_leader_at_its_last_look(script: ModuleType, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture) -> None:
    calls: list = []
    monkeypatch.setattr(script, "_run", _fake_run(calls, {"c1": "off", "c4": "ngram:3:k8"}))
    fixed = tmp_path / "earlier"
    make_serve_run(fixed, ACC, LOADS, repeats=4, n_requests=4, new_tokens=16, seed=1)
    assert script.main(["--serve", "--fixed", str(fixed), "--budget-share", "0.5", "--out", str(tmp_path / "b"),
                        "--", "--concurrency", "1,4"]) == 0
    budget = 0.5 * script.SERVE.measured_s(fixed)
    assert [args for _, args in calls] == [["--concurrency", "1,4", "--force-new", "--until-decided",
                                            "--time-budget", f"{budget:.0f}"]]  # the fixed run reused
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    tuned = doc["decisions"]["tuned"]
    assert tuned["c1"]["choice"] is None and tuned["c4"]["choice"] == "ngram:3:k8"
    assert doc["wall_s"]["fixed"] != doc["wall_s"]["fixed"]  # NaN: not measured in this session
    assert {r["load"]: r["tuned"] for r in doc["rows"]} == {"c1": "off", "c4": "ngram:3:k8"}


def test_the_serving_question_side_by_side(script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture) -> None:
    calls: list = []
    monkeypatch.setattr(script, "_run", _fake_run(calls, {"c1": "ngram:3:k2", "c4": "ngram:3:k2"}))
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
