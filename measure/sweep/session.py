"""The one way to open a sweep's models: :func:`open_session`, used by the local driver, a Ray worker and the
head sweep.

A session is the engine, the target (checked against the run's fingerprint
before any draft is built), the target's decoder (made once and used by every
generation: the caller owns the decoder), the drafts and the encoded prompts.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import torch

from measure.engines import make_engine
from measure.prompts import Prompt
from measure.rows import ids_text
from measure.seam import Decoder, Engine, EngineOptions, TargetModel
from measure.sweep.config import SweepConfig
from measure.sweep.identity import target_fingerprint


@contextlib.contextmanager
def silenced(quiet: bool) -> Iterator[None]:
    """With ``quiet``: third-party output while loading (weight and GGUF conversion bars, which some
    libraries write straight to stderr with their own tqdm) goes to /dev/null."""
    if not quiet:
        yield
        return
    with open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull), contextlib.redirect_stdout(devnull):
        yield


def prompts_meta(prompts: dict[str, list[Prompt]], enc: dict[str, torch.Tensor]) -> dict:
    """``run.json`` ``prompts``: per prompt id its source, domain and encoded token ids."""
    return {p.prompt_id: {"source": p.source, "domain": p.domain, "prompt_tokens": int(enc[p.prompt_id].shape[1]),
                          "tokens": ids_text(enc[p.prompt_id][0].tolist())}
            for ps in prompts.values() for p in ps}


@dataclass(frozen=True)
class Session:
    """A sweep's models opened here (:func:`open_session`)."""

    engine: Engine
    target: TargetModel
    decoder: Decoder  # the target's, made once and used by every generation of the sweep
    drafts: tuple[Any, ...]  # one per ``config.drafts``, in that order
    prompts: dict[str, list[Prompt]]
    enc: dict[str, torch.Tensor]  # prompt id -> token ids [1, S]
    target_fingerprint: dict
    engine_versions: dict  # ``engine_<key>``: the engine's own versions and settings

    @property
    def synthetic(self) -> bool:
        """Whether a model of the session has random weights (timing only)."""
        return bool(self.target.synthetic or any(d.synthetic for d in self.drafts))

    def models(self) -> dict:
        """``run.json`` ``models``."""
        return {"target": self.target.describe(), "drafts": {d.name: d.describe() for d in self.drafts}}

    def prompts_meta(self) -> dict:
        """``run.json`` ``prompts`` (:func:`prompts_meta`)."""
        return prompts_meta(self.prompts, self.enc)

    def versions(self, versions: Mapping[str, Any]) -> dict:
        """``run.json`` ``versions``: ``versions`` (:func:`measure.sweep.identity.environment`) and the engine's."""
        return {**versions, **self.engine_versions}


def open_session(config: SweepConfig, prompts: dict[str, list[Prompt]], options: EngineOptions, quiet: bool = False,
                 say: Callable[[str], None] = lambda _m: None, check: Callable[[dict], None] | None = None,
                 engine: Engine | None = None) -> Session:
    """Open ``config``'s models on ``options.device``: the engine (``engine``, else ``config.engine`` made with
    ``options``), the target, its decoder, the drafts; ``prompts`` encoded.

    ``check`` sees the target's fingerprint before any draft is built (a run writer refuses a resume measured
    with another model: :meth:`measure.records.RunWriter.check_fingerprint`). ``quiet``: third-party loading
    output silenced (:func:`silenced`).
    """
    engine = engine if engine is not None else make_engine(config.engine, options)
    say(f"loading {config.target} ({config.engine})")
    with silenced(quiet):
        target = engine.load_target(config.target, device=options.device, dtype=config.dtype, seed=config.seed)
    fp = target_fingerprint(target, engine)
    if check is not None:
        check(fp)
    with silenced(quiet):
        drafts = tuple(engine.make_draft(d, target, seed=config.seed + 1) for d in config.drafts)
    enc = {p.prompt_id: engine.encode(target, p.message, config.max_prompt_tokens)
           for ps in prompts.values() for p in ps}
    return Session(engine, target, target.new_decoder(), drafts, prompts, enc, fp,
                   {f"engine_{k}": v for k, v in dict(engine.versions()).items()})
