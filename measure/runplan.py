"""Which cells a run holds, and adding cells to a finished run explicitly (``--extend``), recorded as such.

Torch-free (it reads ``run.json`` as a dict). A run's *plan* is the cross
product of its drafts, γ policies, temperatures and domains. Re-using a
run's ``--out`` resumes it only when the command asks for the same plan; it
used to merge any other γ or draft in silently, rewrite the recorded config
and command, and an interruption then marked the whole, complete run
``interrupted`` (issue #28). Now (:func:`open_plan`, called by
:class:`measure.records.RunWriter` under the run's lock):

* the same plan: a resume, as before (or, when the run's last extension is
  unfinished, the resume of that extension);
* more γ policies, drafts or domains, every recorded one still asked for:
  refused in one line naming ``--extend``; with ``--extend`` (the run
  complete) an *extension*: ``run.json`` ``extensions`` gains ``{"command",
  "started_utc", "added", "config", "status", ...}``, the run's own
  ``config`` and ``command`` stay as they were, and the extension's
  command, status, pid and heartbeat are its own. The command of an
  extension describes the whole extended run (the recorded lists and the
  added values); re-running it resumes an interrupted extension;
* anything else (a recorded γ, draft or domain left out, other
  temperatures, or ``--extend`` of a run that is not complete or that does
  not exist): refused in one line.

**How the status reads.** The run's ``status`` is its own: a complete run
stays ``complete`` while an extension runs and if one is interrupted (its
cells were complete and still are); the extension's status
(``extensions[-1].status``: running, complete, interrupted, failed; a dead
writer reads as interrupted) says whether the added cells are all there.
:func:`extension_note` says it in words (``calibrate`` notes it).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from measure.records import FingerprintMismatch, effective_status, extension_status
from sim.policies import GammaSpec

#: The plan fields ``--extend`` may add to.
EXTENSIBLE = ("drafts", "gammas", "domains")


class PlanMismatch(FingerprintMismatch):
    """A command asks a run for other cells than it holds, and ``--extend`` does not make it an extension
    (a :class:`measure.records.FingerprintMismatch`, raised as one)."""


def _gamma(g: GammaSpec | str) -> str:
    """A γ policy's text as ``run.json`` records it (``fixed:4``): a :class:`GammaSpec` (a sweep's config) or its
    text (a run's ``config``), through its one codec."""
    return GammaSpec.parse(g).to_str()


@dataclass(frozen=True)
class Plan:
    """The cells of a run: drafts × γ policies × temperatures × domains (order as asked)."""

    drafts: tuple[str, ...]
    gammas: tuple[str, ...]
    temperatures: tuple[float, ...]
    domains: tuple[str, ...]

    @classmethod
    def of(cls, drafts: Sequence[str], gammas: Sequence[GammaSpec | str], temperatures: Sequence[float],
           domains: Sequence[str]) -> "Plan":
        return cls(tuple(map(str, drafts)), tuple(_gamma(g) for g in gammas), tuple(float(t) for t in temperatures),
                   tuple(map(str, domains)))

    def values(self, name: str) -> tuple:
        return getattr(self, name)

    @property
    def n_cells(self) -> int:
        return len(self.drafts) * len(self.gammas) * len(self.temperatures) * len(self.domains)


def _values(values: Sequence) -> str:
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def _text(name: str, values: Sequence) -> str:
    """``γ fixed:6``, ``domain docs``, ``drafts int8,bf16``."""
    one = {"drafts": "draft", "gammas": "γ", "temperatures": "temperature", "domains": "domain"}[name]
    many = {"drafts": "drafts", "gammas": "γ", "temperatures": "temperatures", "domains": "domains"}[name]
    return f"{one if len(values) == 1 else many} {_values(values)}"


def _domains_of(prompt_ids: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(str(p).partition("/")[0] for p in prompt_ids))


def recorded_plan(meta: Mapping[str, Any]) -> Plan | None:
    """The plan a run holds: its config's, plus every extension's additions (domains: those of its prompts).
    None for a run that records no config (nothing to compare)."""
    cfg = meta.get("config") or {}
    if not cfg.get("drafts") or not cfg.get("gammas"):
        return None
    ids = ((meta.get("fingerprint") or {}).get("prompts") or {}).get("prompt_ids") or []
    domains = _domains_of(ids) or tuple(cfg.get("domains") or ())
    plan = Plan.of(cfg["drafts"], cfg["gammas"], cfg.get("temperatures") or (0.0,), domains)
    for ext in meta.get("extensions") or []:
        added = ext.get("added") or {}
        plan = Plan(plan.drafts + tuple(added.get("drafts", ())),
                    plan.gammas + tuple(_gamma(g) for g in added.get("gammas", ())), plan.temperatures,
                    plan.domains + tuple(d for d in added.get("domains", ()) if d not in plan.domains))
    return plan


def differences(old: Plan, new: Plan) -> tuple[dict[str, list], list[str]]:
    """(values ``new`` adds per field, in its order; every other difference in words)."""
    added: dict[str, list] = {}
    other: list[str] = []
    for name in ("drafts", "gammas", "temperatures", "domains"):
        a, b = old.values(name), new.values(name)
        plus, minus = [v for v in b if v not in a], [v for v in a if v not in b]
        label = "γ" if name == "gammas" else name
        if name in EXTENSIBLE and plus:
            added[name] = plus
        elif plus:
            other.append(f"{label} {_values(a)} -> {_values(b)}")
        if minus:
            other.append(f"{label} {_values(a)} -> {_values(b)} (leaves out {_text(name, minus)})")
    return added, other


def added_text(added: Mapping[str, Sequence]) -> str:
    """``γ fixed:6 and domain docs``."""
    return " and ".join(_text(k, v) for k, v in added.items())


def texts_sha256(prompt_ids: Sequence[str], texts: Mapping[str, str]) -> str:
    """SHA-256 of prompts in the order given, as ``measure.sweep.select_prompts`` hashes a selection."""
    return hashlib.sha256("\n\x00".join(p + "\x00" + texts[p] for p in prompt_ids).encode()).hexdigest()


@dataclass(frozen=True)
class Opening:
    """What :func:`open_plan` decided for an existing run: the fingerprint to hold against the stored one, and
    either a new extension (``extension``), the resume of the last one (``resume_extension``) or a plain resume."""

    fingerprint: Mapping[str, Any]
    extension: dict | None = None
    resume_extension: bool = False
    added: dict = field(default_factory=dict)


@dataclass(frozen=True)
class PlanRequest:
    """What a sweep asks of a run directory: its plan, ``--extend`` or not, and (for added domains) the texts
    of its prompts by id, to check the recorded prompts are among them unchanged."""

    plan: Plan
    extend: bool = False
    texts: Mapping[str, str] = field(default_factory=dict)

    def check_new(self, path: str | os.PathLike[str]) -> None:
        """``--extend`` of a directory with no run: one line."""
        if self.extend:
            raise PlanMismatch(f"--extend: {path} holds no run to extend; drop --extend to start one there")

    def opener(self, path: str | os.PathLike[str], fingerprint: Mapping[str, Any]
               ) -> Callable[[Mapping[str, Any] | None], Opening | None]:
        """The ``plan`` check :class:`measure.records.RunWriter` calls under the run's lock with the stored
        ``run.json`` (None: no run there yet)."""
        def check(meta: Mapping[str, Any] | None) -> Opening | None:
            if meta is None:
                self.check_new(path)
                return None
            return open_plan(path, meta, fingerprint, self)
        return check


def _status(entry: Mapping[str, Any]) -> str:
    return effective_status(entry)[0]


def open_plan(path: str | os.PathLike[str], meta: Mapping[str, Any], fingerprint: Mapping[str, Any], req: PlanRequest) -> Opening:
    """Decide how a run opens (module docstring); :class:`PlanMismatch` (one line) when it may not."""
    old = recorded_plan(meta)
    if old is None:
        if req.extend:
            raise PlanMismatch(f"--extend: {path}/run.json records no config to extend")
        return Opening(fingerprint)
    added, other = differences(old, req.plan)
    exts = list(meta.get("extensions") or [])
    if other:
        again = (f"re-run the command of its last extension ({exts[-1].get('command')})" if exts else
                 f"re-run its own command ({meta.get('command')})")
        extra = "; --extend adds γ policies, drafts and domains only" if req.extend else ""
        raise PlanMismatch(f"{path}: refusing to resume a run with other cells ({'; '.join(other)}): a resume asks for "
                           f"the same cells ({again}){extra}; use --force-new or a new --out")
    if not added:
        unfinished = bool(exts) and _status(exts[-1]) != "complete"
        return Opening(fingerprint, resume_extension=unfinished)
    if not req.extend:
        raise PlanMismatch(f"{path}: refusing to add cells to a run without --extend (adds {added_text(added)}); pass "
                           "--extend to add them (recorded in run.json extensions, the run's own config kept), or "
                           "use --force-new or a new --out")
    status = _status(meta)
    if status != "complete" or (exts and _status(exts[-1]) != "complete"):
        what = "the run" if status != "complete" else "its last extension"
        raise PlanMismatch(f"--extend: {what} at {path} is {status if status != 'complete' else _status(exts[-1])}, "
                           "not complete; finish it first (re-run its command without the added values)")
    fp = dict(fingerprint)
    if "domains" in added:
        fp = _restricted_prompts(path, meta, fp, req)
    ext = {"added": {k: list(v) for k, v in added.items()}, "started_utc": None, "status": "running"}
    return Opening(fp, extension=ext, added=added)


def _restricted_prompts(path: str | os.PathLike[str], meta: Mapping[str, Any], fp: dict, req: PlanRequest) -> dict:
    """The fingerprint with its prompts restricted to the recorded ones, if those are among the new selection
    unchanged (an extension adds domains, it does not change the run's prompts)."""
    stored = dict((meta.get("fingerprint") or {}).get("prompts") or {})
    ids = list(stored.get("prompt_ids") or [])
    new = dict(fp.get("prompts") or {})
    missing = [p for p in ids if p not in req.texts]
    if missing or texts_sha256(ids, req.texts) != stored.get("texts_sha256"):
        why = f"prompt {missing[0]} is not selected" if missing else "their texts differ"
        raise PlanMismatch(f"--extend: the run's recorded prompts are not among this command's unchanged ({why}); "
                           "an extension adds domains, it keeps the run's prompts")
    new.update(prompt_ids=ids, texts_sha256=stored.get("texts_sha256"))
    return {**fp, "prompts": new}


def extension_note(meta: Mapping[str, Any]) -> str:
    """The run's last extension in words when it is not complete ("" otherwise)."""
    return extension_status(meta)[1]


def opening_text(opening: Opening, finished: int) -> str:
    """What opening an existing run does, in one line (the sweep prints it)."""
    if opening.extension is not None:
        return (f"--extend: adding {added_text(opening.added)} to the run (its {finished} finished cells are kept, "
                "its config and command too); recorded in run.json extensions")
    if opening.resume_extension:
        return f"resuming the run's unfinished extension ({finished} cells finished so far)"
    return f"resuming the run ({finished} cells finished)"
