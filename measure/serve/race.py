"""``python -m measure serve --until-decided``: measure until the best configuration at each load is known.

The question: at each load (a concurrency or an arrival rate), which configuration — an n-gram draft of some
k, or speculation off — gives the most throughput? A race per load (:class:`measure.prior.GroupRace`, no prior)
whose candidates are the run's configurations. A unit of evidence is one repeat of that load:
``log(tokens/s of a configuration ÷ tokens/s of off in the same repeat)`` (off's own unit is 0), so the pace of
the machine during that repeat's blocks cancels before two configurations are compared.

After each repeat the race looks (:meth:`ServeRace.look`). A configuration a load no longer needs (eliminated,
or resolved: it cannot beat the leader by ``--regret``) is not measured at that load again; off is measured
while any configuration of the load is live (its unit pairs theirs); a decided load measures nothing more. A
server block with no load left to measure is not started (:func:`measure.serve.runner.run_units`): that is
where the time goes unspent. ``--time-budget`` is checked before each unit after the first repeat
(:meth:`ServeRace.over_budget`; the first repeat always completes, as the chain sweep's first pass does, so every
load has a leader), so a run overshoots it by one unit at most; a repeat cut so is not looked at.

Every look is a function of the finished units of the repeats up to it (``serve_units``), so a resumed run
looks again identically and skips the same blocks. A look needs every unit its repeat was to measure: after a
unit with failed requests (not kept) the race does not look; the run ends ``interrupted`` and the same command
measures that unit, then looks.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Hashable, Mapping, Sequence

from measure.prior import GroupRace
from measure.racing import RaceRule
from measure.serve.units import LoadSpec, ServeConfig, UnitId

if TYPE_CHECKING:
    import pandas as pd

#: Why a tuned serving run stopped measuring (``run.json`` ``race.stopped_by``).
STOPPED_BY = ("decided", "time budget", "out of repeats")

#: The configuration "speculation off": every load's race has it, and its units pair the others'.
OFF = ServeConfig("off").to_str()


class ServeRace:
    """The races of one serving run: one per load, between ``configs`` (``off`` among them), a look per repeat."""

    def __init__(self, rule: RaceRule, configs: Sequence[ServeConfig], loads: Sequence[LoadSpec], slots: int,
                 time_budget_s: float | None = None) -> None:
        names = tuple(c.to_str() for c in configs)
        if OFF not in names or len(names) < 2:
            raise ValueError(f"a serving race needs speculation off and at least one configuration to race, "
                             f"got {', '.join(names)}")
        self.rule, self.configs, self.loads, self.slots = rule, tuple(configs), tuple(loads), slots
        self.time_budget_s = time_budget_s
        self.races = {ld.to_str(): GroupRace(rule, names, paired=(OFF,)) for ld in loads}
        self.stopped: dict[str, set[str]] = {k: set() for k in self.races}
        self.looks: list[dict] = []
        #: How many looks were taken (the next look's index).
        self.n_looks = 0

    def needs(self, config: ServeConfig, load: LoadSpec) -> bool:
        """Whether the next repeat measures ``config`` at ``load``."""
        return config.to_str() not in self.stopped[load.to_str()]

    def needed(self, repeat: int) -> list[UnitId]:
        """The units ``repeat`` measures as the race stands now."""
        return [UnitId(c, self.slots, ld, repeat) for c in self.configs for ld in self.loads if self.needs(c, ld)]

    def look(self, units: pd.DataFrame) -> list[str]:
        """Look after repeat :attr:`n_looks` at the finished ``units`` (a ``serve_units`` DataFrame; units of later
        repeats are left out); a line per load that stopped configurations."""
        r = self.n_looks
        samples = unit_samples(units, r, list(self.races), [c.to_str() for c in self.configs])
        notes: list[str] = []
        record: dict[str, Any] = {"look": r, "groups": {}}
        for key, race in self.races.items():
            gl = race.look(samples[key], r, 1)
            newly = [c for c in race.candidates if c not in gl.measure_next and c not in self.stopped[key]]
            self.stopped[key].update(newly)
            record["groups"][key] = gl.record()
            if newly:
                notes.append(f"race {key}: after repeat {r + 1}, leader {gl.state.leader}; stopped {', '.join(newly)}"
                             + (f" ({gl.stop_reason})" if gl.stop_reason else ""))
        self.looks.append(record)
        self.n_looks += 1
        return notes

    def all_stopped(self) -> bool:
        return all(set(r.candidates) <= self.stopped[k] for k, r in self.races.items())

    def over_budget(self, elapsed_s: float) -> bool:
        """Whether ``--time-budget`` has run out after ``elapsed_s`` of measuring (checked before each unit)."""
        return self.time_budget_s is not None and elapsed_s > self.time_budget_s

    def stop_reason(self, elapsed_s: float) -> str | None:
        """After a look: ``decided`` (every load), ``out of repeats`` (the rule's last look taken) or ``time
        budget`` (``elapsed_s`` past it); None while the next repeat is to be measured."""
        if self.all_stopped():
            return "decided"
        if self.n_looks >= self.rule.max_looks:
            return "out of repeats"
        return "time budget" if self.over_budget(elapsed_s) else None

    def summary(self, reason: str | None) -> dict:
        """``run.json`` ``race``, the schema of the chain sweep's: the rule, every look, why the measuring stopped
        (None while it goes on) and each decided load's choice."""
        last = self.looks[-1]["groups"] if self.looks else {}
        return {"rule": asdict(self.rule), "looks": self.looks, "stopped_by": reason,
                "decided": {k: g["leader"] for k, g in last.items() if g["stop_reason"] == "decided"}}


def unit_samples(units: pd.DataFrame, look_index: int, loads: Sequence[str], configs: Sequence[str]
                 ) -> dict[str, dict[str, dict[Hashable, float]]]:
    """Per load, per configuration, per repeat ``<= look_index``: log(tokens/s ÷ off's tokens/s in that repeat),
    from a ``serve_units`` DataFrame (synthetic units and units without a throughput left out)."""
    out: dict[str, dict[str, dict[Hashable, float]]] = {ld: {c: {} for c in configs} for ld in loads}
    tps: dict[tuple[str, str, int], float] = {}
    if len(units):
        real = units[~units["synthetic"].astype(bool)]
        for cfg, load, rep, thr in zip(real["config"], real["load"], real["repeat"], real["throughput_tokens_per_s"]):
            if int(rep) <= look_index and thr == thr and thr is not None and float(thr) > 0:
                tps[(str(load), str(cfg), int(rep))] = float(thr)
    for (load, cfg, rep), thr in tps.items():
        off = tps.get((load, OFF, rep))
        if load in out and cfg in out[load] and off is not None:
            out[load][cfg][rep] = math.log(thr / off)
    return out


def describe(race: Mapping[str, Any], repeats: int) -> list[str]:
    """The race in words for the printed summary: the rule and why the run stopped, then per load the decision
    and why its measuring stopped."""
    rule, looks = race.get("rule") or {}, race.get("looks") or []
    stopped_by = race.get("stopped_by")
    head = (f"race (--until-decided: regret {100 * rule.get('regret', 0):g}% at confidence "
            f"{100 * rule.get('confidence', 0):g}%): " + (f"stopped by {stopped_by}" if stopped_by else
                                                          "not finished (the same command resumes it)")
            + f" after {len(looks)} of {repeats} repeats")
    lines = [head]
    last = looks[-1]["groups"] if looks else {}
    for load, g in last.items():
        when = next((lk["look"] for lk in looks if (lk["groups"].get(load) or {}).get("stop_reason") == "decided"),
                    None)
        out = [e["cell_id"] for e in g["eliminated"]]
        gone = f"; eliminated {', '.join(out)}" if out else ""
        if when is not None:
            lines.append(f"  {load}: {g['leader']} — decided after repeat {when + 1} (the others cannot beat it by "
                         f"the regret{gone})")
            continue
        racing = [c["cell_id"] for c in g["comparisons"] if c["cell_id"] not in g["resolved"] + out]
        lines.append(f"  {load}: undecided, leader {g['leader']}; still racing {', '.join(racing) or '-'}{gone} "
                     f"({stopped_by or 'not finished'})")
    return lines
