"""The transformers engine behind :class:`~measure.seam.Engine`: targets, drafts, prompts, the peer.

:class:`TransformersEngine` loads targets (:func:`measure.engines.transformers.models.load_model`) and
drafts (:func:`measure.engines.transformers.drafts.make_draft`), encodes prompts, and runs transformers' own
assisted generation as the peer (:func:`peer_generate`), with the same proposal rule, n-gram size and number of
proposed tokens as our draft.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Mapping

import torch

from measure.drafts import ModelDraft, NGramDraft, parse_draft_spec
from measure.engines.transformers.drafts import make_draft
from measure.engines.transformers.models import context_tokens as model_context_tokens, load_model
from measure.prompts import Prompt, encode_prompt
from measure.seam import EngineOptions, PeerResult


class TransformersEngine:
    """The transformers engine behind :class:`~measure.seam.Engine`."""

    name = "transformers"
    #: float32 eager/static-cache verification matched token-by-token decoding exactly in every test: demand identity
    near_tie_tolerance = 0.0

    def __init__(self, options: EngineOptions | None = None) -> None:
        self.options = options or EngineOptions()
        if self.options.threads is not None:
            torch.set_num_threads(self.options.threads)

    def load_target(self, spec: str, *, device: str, dtype: str, seed: int) -> Any:
        """:func:`~measure.engines.transformers.models.load_model`; the target's ``new_decoder()`` uses this
        engine's options."""
        return replace(load_model(spec, device=device, dtype=dtype, seed=seed), engine_options=self.options)

    def make_draft(self, spec: str, target: Any, *, seed: int) -> Any:
        """:func:`~measure.engines.transformers.drafts.make_draft`; model drafts get a decoder with this engine's
        options."""
        return make_draft(spec, target, seed=seed, options=self.options)

    def encode(self, target: Any, text: str, max_prompt_tokens: int) -> torch.Tensor:
        """Token ids ``[1, S]`` of a user message (:func:`measure.prompts.encode_prompt`)."""
        prompt = Prompt(prompt_id="", domain="", text=text, message=text, source="")
        return encode_prompt(prompt, target, max_prompt_tokens, target.device)

    def versions(self) -> Mapping[str, str | None]:
        """For ``run.json`` and the fingerprint: torch, transformers, threads and the decoder settings."""
        import importlib.metadata as md

        def ver(pkg: str) -> str | None:
            try:
                return md.version(pkg)
            except md.PackageNotFoundError:
                return None

        return {"engine": self.name, "torch": torch.__version__, "transformers": ver("transformers"),
                "threads": str(torch.get_num_threads()), "cache": self.options.cache,
                "compile": str(self.options.compile)}

    def has_peer(self, target: Any, draft: Any, gamma: int) -> bool:
        """Whether :func:`peer_generate` runs this pair: a target with an HF model and an n-gram or model draft."""
        return gamma >= 1 and _peer_kind(target, draft) is not None

    def has_library(self, target: Any) -> bool:
        """False: :meth:`library_generate` has nothing to run here."""
        return False

    def library_generate(self, target: Any, input_ids: torch.Tensor, temperature: float, max_new_tokens: int,
                         seed: int) -> PeerResult | None:
        """None: the baseline is held against transformers' own ``generate`` by ``benchmarks/bench_engine.py``,
        not in every visit."""
        return None

    def peer_generate(self, target: Any, draft: Any, input_ids: torch.Tensor, gamma: int, temperature: float,
                      max_new_tokens: int, seed: int) -> PeerResult | None:
        return peer_generate(target, draft, input_ids, gamma, temperature, max_new_tokens, seed)


def _peer_kind(target: Any, draft: Any) -> str | None:
    """How transformers runs this pair as the peer: ``"lookup"`` (an n-gram draft), ``"assisted"`` (a model
    draft), or None (no HF model behind the target or the draft)."""
    if target.model is None:
        return None
    if isinstance(draft, NGramDraft):
        return "lookup"
    if isinstance(draft, ModelDraft) and draft.model is not None:
        return "assisted"
    return None


def peer_generate(target: Any, draft: Any, input_ids: torch.Tensor, gamma: int, temperature: float,
                  max_new_tokens: int, seed: int, schedule: str = "constant") -> PeerResult | None:
    """Transformers' own speculative decoding of the same pair, like for like with our draft.

    * an n-gram draft → prompt lookup (``prompt_lookup_num_tokens=γ``,
      ``max_matching_ngram_size`` = the draft's N). Transformers' rule is the
      earliest match (our ``ngram:N:first``); with ``ngram:N`` (most recent
      match) the rules differ and the peer is not like for like.
    * a model draft → assisted generation with the draft's model, ``γ``
      assistant tokens per round, ``schedule`` ``"constant"`` (or ``"heuristic"``),
      no confidence early stop.
    * anything else (no HF model behind the draft) → None.

    ``wall_s`` runs from the call to the last token (prefill included), as our loop's.
    """
    if gamma < 1:
        raise ValueError(f"peer gamma {gamma}: must be >= 1")
    kind = _peer_kind(target, draft)
    if kind is None:
        return None
    model = target.model
    kw: dict[str, Any] = dict(max_new_tokens=max_new_tokens, do_sample=temperature > 0,
                              attention_mask=torch.ones_like(input_ids))
    if temperature > 0:
        kw.update(temperature=temperature, top_k=0, top_p=1.0)
    eos = list(target.eos_token_ids)
    kw.update(eos_token_id=eos or None, pad_token_id=eos[0] if eos else 0)
    if kind == "lookup":
        kw.update(prompt_lookup_num_tokens=int(gamma), max_matching_ngram_size=draft.max_ngram)
    else:
        gc = draft.model.generation_config
        gc.num_assistant_tokens = int(gamma)
        gc.num_assistant_tokens_schedule = schedule
        gc.assistant_confidence_threshold = 0.0
        kw.update(assistant_model=draft.model)
    dev = torch.device(target.device)
    devices = [dev.index or 0] if dev.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(input_ids, **kw)  # [1, S + new]
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        wall_s = time.perf_counter() - t0
    return PeerResult(tokens=tuple(int(t) for t in out[0, input_ids.shape[1]:].tolist()), wall_s=wall_s)


def check_specs(target_spec: str, draft_specs: tuple[str, ...] | list[str]) -> None:
    """Draft specs by :func:`measure.drafts.parse_draft_spec` (syntax; layer bounds need the loaded target).

    The target is not checked here: a sweep may be handed an engine of its own for any name (tests); the
    CLI checks model specs with :func:`measure.engines.transformers.models.check_model_spec`.
    """
    del target_spec
    for d in draft_specs:
        parse_draft_spec(d)


def context_tokens(spec: str) -> int | None:
    """:func:`measure.engines.transformers.models.context_tokens`: the training context of model ``spec``, without
    its weights."""
    return model_context_tokens(spec)


def make_engine(options: EngineOptions) -> TransformersEngine:
    """The transformers engine configured by ``options`` (see :mod:`measure.engines`)."""
    return TransformersEngine(options)
