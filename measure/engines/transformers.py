"""The transformers engine (TEMPORARY thin adapter of branch ``trust``; branch ``fast`` owns this file).

It exposes today's ``measure.models`` / ``measure.drafts`` / ``measure.decoding``
through the engine seam (:mod:`measure.engines.base`) so that the sweep talks
to models only through an :class:`~measure.engines.base.Engine`. At merge the
``fast`` helper's version (static cache, torch.compile, the shared decoding
loop over Decoders) replaces this file wholesale; the sweep needs from it only
what the seam promises: ``load_target`` (a target with ``new_decoder()``),
``make_draft``, ``encode``, ``versions``, ``peer_generate``.
"""

from __future__ import annotations

import importlib.metadata as md
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from measure.decoding import crop_cache, forward_logits, new_cache
from measure.drafts import NGramDraft, make_draft
from measure.engines.base import EngineOptions, PeerResult
from measure.models import LoadedModel, load_model
from measure.prompts import Prompt, encode_prompt
from measure.timing import Timer


class TransformersDecoder:
    """One model's KV-cached sequence over transformers' DynamicCache."""

    def __init__(self, model: Any, vocab_size: int) -> None:
        self.model, self.vocab_size = model, int(vocab_size)
        self.cache = new_cache()
        self._n = 0

    @property
    def n_cached(self) -> int:
        return self._n

    def reset(self) -> None:
        self.cache, self._n = new_cache(), 0

    def forward(self, input_ids: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        logits = forward_logits(self.model, input_ids, self.cache, last_only=last_only)[0]  # [n or 1, V]
        self._n += int(input_ids.shape[1])
        return logits

    def rollback(self, n_tokens: int) -> None:
        if n_tokens < self._n:
            crop_cache(self.cache, n_tokens)
            self._n = n_tokens


@dataclass(frozen=True)
class TransformersTarget:
    """A :class:`measure.models.LoadedModel` seen as a :class:`~measure.engines.base.TargetModel`."""

    loaded: LoadedModel

    def __getattr__(self, name: str) -> Any:  # model, tokenizer, name, synthetic, vocab_size, device, eos ...
        return getattr(object.__getattribute__(self, "loaded"), name)

    def describe(self) -> dict:
        return self.loaded.describe()

    def new_decoder(self) -> TransformersDecoder:
        return TransformersDecoder(self.loaded.model, self.loaded.vocab_size)


class TransformersEngine:
    """Models through transformers (see module docstring)."""

    name = "transformers"

    def __init__(self, options: EngineOptions) -> None:
        self.options = options
        if options.threads is not None:
            torch.set_num_threads(options.threads)

    def load_target(self, spec: str, *, device: str, dtype: str, seed: int) -> TransformersTarget:
        return TransformersTarget(load_model(spec, device=device, dtype=dtype, seed=seed))

    def make_draft(self, spec: str, target: Any, *, seed: int) -> Any:
        return make_draft(spec, target.loaded, seed=seed)

    def encode(self, target: Any, text: str, max_prompt_tokens: int) -> torch.Tensor:
        p = Prompt(prompt_id="-", domain="-", text=text, message=text, source="-")
        return encode_prompt(p, target.loaded, max_prompt_tokens, target.device)

    def versions(self) -> Mapping[str, str | None]:
        def ver(pkg: str) -> str | None:
            try:
                return md.version(pkg)
            except md.PackageNotFoundError:
                return None

        return {"torch": torch.__version__, "transformers": ver("transformers"),
                "threads": str(torch.get_num_threads()), "cache": "dynamic", "compile": "off"}

    def peer_generate(self, target: Any, draft: Any, input_ids: torch.Tensor, gamma: int, temperature: float,
                      max_new_tokens: int, seed: int) -> PeerResult | None:
        """transformers' assisted generation / prompt lookup with the same draft and γ."""
        loaded: LoadedModel = target.loaded
        kw: dict[str, Any] = dict(max_new_tokens=max_new_tokens, do_sample=temperature > 0,
                                  attention_mask=torch.ones_like(input_ids))
        if temperature > 0:
            kw.update(temperature=temperature, top_k=0, top_p=1.0)
        eos = list(loaded.eos_token_ids)
        kw.update(eos_token_id=eos or None, pad_token_id=eos[0] if eos else 0)
        if isinstance(draft, NGramDraft):
            kw.update(prompt_lookup_num_tokens=gamma, max_matching_ngram_size=draft.max_ngram)
        else:
            gc = draft.model.generation_config
            gc.num_assistant_tokens = gamma
            gc.num_assistant_tokens_schedule = "constant"
            gc.assistant_confidence_threshold = 0.0
            kw.update(assistant_model=draft.model)
        timer = Timer(loaded.device)
        devices = [torch.device(loaded.device).index or 0] if loaded.device.startswith("cuda") else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            t0 = timer.now_s()
            with torch.inference_mode():
                out = loaded.model.generate(input_ids, **kw)  # [1, S + new]
            wall_s = timer.now_s() - t0
        return PeerResult(tokens=tuple(int(t) for t in out[0, input_ids.shape[1]:].tolist()), wall_s=wall_s)


def make_engine(options: EngineOptions) -> TransformersEngine:
    """The transformers engine configured by ``options``."""
    return TransformersEngine(options)
