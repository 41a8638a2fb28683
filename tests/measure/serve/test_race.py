"""``measure serve --until-decided`` (measure/serve/race.py) on synthetic units: the runner's real loop with the
server and the load replaced by known throughputs, so which blocks the race skips, the resume, the record and the
summary are checked exactly and fast."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from measure.racing import RaceRule
from measure.records import load_run
from measure.runkinds import SERVE, open_run_dir
from measure.serve import runner
from measure.serve.client import LoadResult, RequestResult, RequestSpec
from measure.serve.race import STOPPED_BY, ServeRace, describe, unit_samples
from measure.serve.runner import Interrupted, Plan, Progress, run_units
from measure.serve.units import LoadSpec, ServeConfig

CONFIGS = (ServeConfig("off"),) + tuple(ServeConfig("ngram", k, 2) for k in (2, 4, 8))
LOADS = (LoadSpec(concurrency=1), LoadSpec(concurrency=4))
#: tokens/s per load and configuration: k = 2 wins at c1, off at c4, k = 8 loses clearly at both
TRUE_TPS = {"c1": {"off": 100.0, "ngram:2:k2": 140.0, "ngram:2:k4": 115.0, "ngram:2:k8": 60.0},
            "c4": {"off": 100.0, "ngram:2:k2": 85.0, "ngram:2:k4": 70.0, "ngram:2:k8": 50.0}}
NOISE = 0.02  # sd of a unit's log throughput
REPEATS = 8


def _plan(**kw: Any) -> Plan:
    base = dict(configs=CONFIGS, loads=LOADS, slots=4, requests=2, max_new_tokens=16, repeats=REPEATS, seed=0,
                prompts=(RequestSpec(0, "code/p0", "code", "hello"),),
                race_rule=RaceRule(confidence=0.9, regret=0.05, max_looks=REPEATS, min_units=2))
    return Plan(**{**base, **kw})


class _Server:
    """A started 'server' of one configuration: its URL names the configuration for the fake load."""

    def __init__(self, cfg: ServeConfig, alive: Any) -> None:
        self.base_url = f"http://fake.invalid/{cfg.to_str()}"
        self._alive = alive

    def __enter__(self) -> "_Server":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def alive(self) -> bool:
        return self._alive()

    def died(self) -> str:
        return "llama-server exited (fake)"


@pytest.fixture()
def fake(monkeypatch: pytest.MonkeyPatch) -> dict:
    """The runner with known throughputs: ``started`` lists each server block's configuration and repeat;
    ``die_after`` (units) makes the server die; ``fail`` names a unit (config, load, repeat) whose requests fail
    once."""
    state: dict = {"started": [], "units": 0, "die_after": None, "fail": set()}

    def load(ep: Any, requests: list, ld: LoadSpec, max_tokens: int, seed: int, stall_s: float = 0.0) -> LoadResult:
        cfg = ep.base_url.rsplit("/", 1)[1]
        if requests[0].prompt_id == "warmup":
            return LoadResult([], 0.0, 0.0, 0.0, np.array([]))
        repeat = seed % 1000
        state["units"] += 1
        key = (cfg, ld.to_str(), repeat)
        if key in state["fail"]:
            state["fail"].discard(key)
            res = [RequestResult(i, r.prompt_id, r.domain, sent_s=0.0, error="HTTP 500") for i, r in
                   enumerate(requests)]
            return LoadResult(res, 0.0, 1.0, 0.0, np.array([]))
        i, j = [c.to_str() for c in CONFIGS].index(cfg), [x.to_str() for x in LOADS].index(ld.to_str())
        tps = TRUE_TPS[ld.to_str()][cfg] * math.exp(np.random.default_rng([i, j, repeat]).normal(0.0, NOISE))
        dur = len(requests) * max_tokens / tps
        res = [RequestResult(k, r.prompt_id, r.domain, sent_s=0.0, event_s=[0.0, dur], tokens=max_tokens)
               for k, r in enumerate(requests)]
        return LoadResult(res, 0.0, dur, 0.0, np.array([]))

    def factory(cfg: ServeConfig, log: Path) -> _Server:
        state["started"].append(cfg.to_str())
        return _Server(cfg, lambda: state["die_after"] is None or state["units"] < state["die_after"])

    monkeypatch.setattr(runner, "run_load", load)
    monkeypatch.setattr(runner, "_scrape", lambda base_url: (None, None))
    monkeypatch.setattr(runner, "_record_slot_context", lambda *a: None)
    state["factory"] = factory
    return state


def _measure(out: Path, plan: Plan, fake: dict, notes: list[str] | None = None) -> list:
    w = open_run_dir(SERVE, out, meta={"config": {"kind": "serve", "repeats": plan.repeats}}, fingerprint={"kind": "serve"})
    progress = Progress(on_note=(notes.append if notes is not None else lambda t: None),
                        on_block=(notes.append if notes is not None else lambda t: None))
    with w.recording():
        return run_units(plan, w, progress, "test", fake["factory"])


def _needed_from_record(race: dict) -> dict[int, set[tuple[str, str]]]:
    """What each repeat measures, derived from the recorded looks alone: a configuration stops at a load when it
    is eliminated or resolved (off, when the load is decided), and stays stopped."""
    names = [c.to_str() for c in CONFIGS]
    stopped: dict[str, set[str]] = {ld.to_str(): set() for ld in LOADS}
    needed = {0: {(c, ld) for c in names for ld in stopped}}
    for lk in race["looks"]:
        for ld, g in lk["groups"].items():
            gone = {e["cell_id"] for e in g["eliminated"]}
            keep = set() if g["stop_reason"] == "decided" else \
                {"off", g["leader"]} | {c for c in names if c not in gone and c not in g["resolved"]}
            stopped[ld] |= set(names) - keep
        needed[lk["look"] + 1] = {(c, ld) for c in names for ld in stopped if c not in stopped[ld]}
    return needed


def test_the_race_skips_what_it_no_longer_needs_and_records_why(fake, tmp_path):
    notes: list[str] = []
    assert _measure(tmp_path / "run", _plan(), fake, notes) == []
    run = load_run(tmp_path / "run")
    race = run.meta["race"]
    assert set(race) == {"rule", "looks", "stopped_by", "decided"}
    assert race["rule"]["max_looks"] == REPEATS and race["rule"]["regret"] == 0.05
    assert race["stopped_by"] == "decided" and race["decided"] == {"c1": "ngram:2:k2", "c4": "off"}
    assert len(race["looks"]) < REPEATS, "decided before the fixed design's last repeat"
    g = race["looks"][-1]["groups"]["c1"]
    assert {"leader", "stop_reason", "resolved", "eliminated", "comparisons"} <= set(g)
    k8 = next(e for e in g["eliminated"] if e["cell_id"] == "ngram:2:k8")
    assert k8["ratio"] < 1 and k8["ratio_hi"] < 1 and k8["n_units"] >= 2
    units = run.table("serve_units")
    measured: dict[int, set[tuple[str, str]]] = {}
    for cfg, ld, r in zip(units["config"], units["load"], units["repeat"]):
        measured.setdefault(int(r), set()).add((str(cfg), str(ld)))
    needed = _needed_from_record(race)
    assert measured == {r: s for r, s in needed.items() if s}, "exactly the units the recorded looks left live"
    assert needed[len(race["looks"])] == set()
    # a block whose configuration no load needs starts no server: fewer servers than the fixed design's
    assert len(fake["started"]) == sum(1 for r in measured for c in CONFIGS
                                       if any(cfg == c.to_str() for cfg, _ in measured[r]))
    assert len(fake["started"]) < REPEATS * len(CONFIGS)
    assert any("no load needs it (the race), not started" in n for n in notes)
    assert any(n.startswith("race c1: after repeat") for n in notes)


def test_off_is_measured_while_its_load_is_undecided(fake, tmp_path):
    _measure(tmp_path / "run", _plan(), fake)
    race = load_run(tmp_path / "run").meta["race"]
    units = load_run(tmp_path / "run").table("serve_units")
    for lk in race["looks"]:
        for ld, g in lk["groups"].items():
            off = units[(units["config"] == "off") & (units["load"] == ld) & (units["repeat"] == lk["look"] + 1)]
            assert len(off) == (0 if g["stop_reason"] == "decided" else 1)


@pytest.mark.slow  # two runs of eight repeats each (about 2 s)
@pytest.mark.parametrize("fault", ["dead server", "failed requests"])
def test_a_resumed_run_looks_again_identically(fake, tmp_path, fault):
    _measure(tmp_path / "whole", _plan(), fake)
    whole = load_run(tmp_path / "whole")
    fake["units"], fake["started"] = 0, []
    if fault == "dead server":
        fake["die_after"] = 11  # mid repeat 1, after the first look
        with pytest.raises(Interrupted):
            _measure(tmp_path / "cut", _plan(), fake)
        fake["die_after"] = None
    else:
        fake["fail"] = {("ngram:2:k4", "c4", 1)}
        failures = _measure(tmp_path / "cut", _plan(), fake)
        assert [f.unit for f in failures] == ["config=ngram:2:k4|slots=4|load=c4|repeat=1"]
        cut = load_run(tmp_path / "cut").meta["race"]
        assert len(cut["looks"]) == 1 and cut["stopped_by"] is None, "no look while a needed unit is missing"
    assert len(load_run(tmp_path / "cut").table("serve_units")) < len(whole.table("serve_units"))
    assert _measure(tmp_path / "cut", _plan(), fake) == []
    resumed = load_run(tmp_path / "cut")
    assert resumed.meta["race"] == whole.meta["race"]
    key = ["config", "load", "repeat"]
    assert sorted(map(tuple, resumed.table("serve_units")[key].values.tolist())) == \
        sorted(map(tuple, whole.table("serve_units")[key].values.tolist()))


def test_the_time_budget_stops_after_a_look(fake, tmp_path):
    _measure(tmp_path / "run", _plan(time_budget_s=1e-9), fake)
    run = load_run(tmp_path / "run")
    race = run.meta["race"]
    assert race["stopped_by"] == "time budget" and len(race["looks"]) == 1 and race["decided"] == {}
    assert set(run.table("serve_units")["repeat"]) == {0}


def test_the_time_budget_is_checked_before_each_unit(fake, tmp_path, monkeypatch):
    """A clock that a unit advances by 1 s: the budget runs out 0.5 s into the second repeat's first unit, so that
    unit is the last one measured (an overshoot under one unit) and the cut repeat is not looked at."""
    clock = {"s": 0.0}
    load = runner.run_load

    def timed_load(*a: Any, **kw: Any) -> LoadResult:
        res = load(*a, **kw)
        clock["s"] += 0.0 if a[1][0].prompt_id == "warmup" else 1.0
        return res

    monkeypatch.setattr(runner, "run_load", timed_load)
    monkeypatch.setattr(runner, "time", SimpleNamespace(monotonic=lambda: clock["s"]))
    n_first = len(CONFIGS) * len(LOADS)
    notes: list[str] = []
    _measure(tmp_path / "run", _plan(time_budget_s=n_first + 0.5), fake, notes)
    run = load_run(tmp_path / "run")
    units = run.table("serve_units")
    assert len(units[units["repeat"] == 0]) == n_first and len(units[units["repeat"] == 1]) == 1
    assert clock["s"] - (n_first + 0.5) <= 1.0
    race = run.meta["race"]
    assert race["stopped_by"] == "time budget" and len(race["looks"]) == 1
    assert any("time budget" in t and "the run stops" in t for t in notes)


def test_out_of_repeats_and_the_summary_says_per_load_why(fake, tmp_path):
    _measure(tmp_path / "run", _plan(repeats=3, race_rule=RaceRule(0.9, 0.05, max_looks=3, min_units=2)), fake)
    race = load_run(tmp_path / "run").meta["race"]
    assert race["stopped_by"] == "out of repeats" and len(race["looks"]) == 3
    assert race["stopped_by"] in STOPPED_BY
    lines = describe(race, 3)
    assert lines[0].startswith("race (--until-decided: regret 5% at confidence 90%): stopped by out of repeats "
                               "after 3 of 3 repeats")
    assert len(lines) == 3 and lines[1].startswith("  c1: ") and lines[2].startswith("  c4: ")
    assert all("decided after repeat" in t or "(out of repeats)" in t for t in lines[1:])


def test_a_unit_is_log_throughput_over_off_in_the_same_repeat():
    import pandas as pd

    units = pd.DataFrame({"config": ["off", "ngram:2:k2", "off", "ngram:2:k2", "ngram:2:k2", "synth:k2:p32"],
                          "load": ["c1"] * 6, "repeat": [0, 0, 1, 1, 2, 0], "synthetic": [False] * 5 + [True],
                          "throughput_tokens_per_s": [100.0, 120.0, 50.0, 75.0, 90.0, 10.0]})
    s = unit_samples(units, 1, ["c1"], ["off", "ngram:2:k2"])
    assert s["c1"]["off"] == {0: 0.0, 1: 0.0}
    assert s["c1"]["ngram:2:k2"] == pytest.approx({0: math.log(1.2), 1: math.log(1.5)})  # repeat 2: no off, later
    with pytest.raises(ValueError, match="needs speculation off"):
        ServeRace(RaceRule(), (ServeConfig("ngram", 2, 2),), LOADS, 4)
