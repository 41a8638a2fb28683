"""Draft/target pairs by exact name, each with a default acceptance rate and its source.

No α below is a measurement of ours: each is a stated assumption for a
same-family pair, anchored on Leviathan et al. (2023, Table 3), where T5-small,
-base and -large drafting for T5-XXL accept α ≈ 0.62–0.82 depending on draft
size and task. Override with ``--alpha``/``--alpha-per-position``, or measure
(``python -m measure``) and calibrate.

:data:`HEAD_PAIRS` are draft heads on their target (:mod:`presets.heads`):
their α is not an assumption but comes from what the head's papers print
(``default_alpha`` is ``None``; :mod:`sim.typical` derives it). They are kept
apart from :data:`PAIRS`, the separate-model pairs ``measure`` can run;
:func:`get_pair` and :func:`make_pair` (a head kind as the draft name) give both.
"""

from __future__ import annotations

from dataclasses import dataclass

from presets.heads import HEAD_KINDS, HeadSpec, get_head_kind
from presets.models import ModelSpec, get_model

_ANCHOR = "assumption for a same-family pair; cf. Leviathan et al. 2023 Table 3 (T5 drafts for T5-XXL: alpha 0.62-0.82)"


@dataclass(frozen=True)
class Pair:
    """A draft (a model, or a draft head on the target) and a target that share a tokenizer.

    ``default_alpha`` is ``None`` exactly for draft heads: their α comes from
    the head kind's published acceptance (:mod:`sim.typical`).
    """

    name: str
    draft: ModelSpec | HeadSpec
    target: ModelSpec
    default_alpha: float | None
    alpha_source: str
    default_hardware: str = "h100-sxm"

    def __post_init__(self) -> None:
        if self.draft.vocab_size != self.target.vocab_size:
            raise ValueError(
                f"pair {self.name!r}: draft {self.draft.name} has vocabulary {self.draft.vocab_size} but "
                f"target {self.target.name} has {self.target.vocab_size}; speculative decoding needs a "
                "shared tokenizer"
            )
        if self.is_head != (self.default_alpha is None):
            raise ValueError(f"pair {self.name!r}: a draft head takes its alpha from its published acceptance "
                             "(default_alpha None); a separate draft model needs a default alpha")
        if isinstance(self.draft, HeadSpec) and self.draft.target != self.target:
            raise ValueError(f"pair {self.name!r}: head {self.draft.name} is built for {self.draft.target.name}, "
                             f"not {self.target.name}")
        if self.default_alpha is not None and not 0.0 <= self.default_alpha <= 1.0:
            raise ValueError(f"pair {self.name!r}: default alpha {self.default_alpha} outside [0, 1]")

    @property
    def is_head(self) -> bool:
        """True when the draft is a head on the target (EAGLE, EAGLE-3, MTP, Medusa), not a separate model."""
        return isinstance(self.draft, HeadSpec)

    @property
    def head(self) -> HeadSpec | None:
        """The draft when it is a head on the target, else None."""
        return self.draft if isinstance(self.draft, HeadSpec) else None

    @property
    def context_window_tokens(self) -> int:
        """The longest context both models accept: the shorter of their position windows."""
        return min(self.draft.max_position, self.target.max_position)

    @property
    def shorter_window_model(self) -> ModelSpec | HeadSpec:
        """The model whose position window limits the pair (the draft on a tie)."""
        return self.draft if self.draft.max_position <= self.target.max_position else self.target

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "draft": self.draft.name,
            "target": self.target.name,
            "default_alpha": self.default_alpha,
            "alpha_source": self.alpha_source,
            "default_hardware": self.default_hardware,
        }


def make_pair(draft: str, target: str, alpha: float = 0.7, source: str = "user-specified pair",
              name: str | None = None, hardware: str = "h100-sxm") -> Pair:
    """A pair from two model names, or a head kind (``eagle``, ``eagle3``, ``mtp``, ``medusa``) and a target
    model name (``alpha``/``source`` then come from the head's papers); mismatched vocabularies raise
    ``ValueError``."""
    if draft in HEAD_KINDS:
        return head_pair(draft, target, name=name, hardware=hardware)
    return Pair(name or f"{draft}->{target}", get_model(draft), get_model(target), alpha, source, hardware)


def head_pair(kind: str, target: str, name: str | None = None, hardware: str = "h100-sxm") -> Pair:
    """A draft head of ``kind`` on the target model named ``target``."""
    head = HeadSpec(get_head_kind(kind).name, get_model(target))
    title = HEAD_KINDS[kind].title
    return Pair(name or f"{kind}->{target}", head, head.target, None,
                f"published acceptance of {title}s: " + "; ".join(e.source for e in HEAD_KINDS[kind].acceptance),
                hardware)


PAIRS: dict[str, Pair] = {
    p.name: p
    for p in [
        make_pair("gpt2", "gpt2-large", 0.6, _ANCHOR, "gpt2-small-large"),
        make_pair("distilgpt2", "gpt2-medium", 0.6, _ANCHOR, "distilgpt2-gpt2-medium"),
        make_pair("gpt2", "gpt2-xl", 0.55, _ANCHOR, "gpt2-small-xl"),
        make_pair("distilgpt2", "gpt2-xl", 0.55, _ANCHOR, "distilgpt2-gpt2-xl"),
        make_pair("Llama-2-7B", "Llama-2-13B", 0.8, _ANCHOR, "llama2-7b-13b"),
        make_pair("Llama-2-7B", "Llama-2-70B", 0.8, _ANCHOR, "llama2-7b-70b", "b200"),
        make_pair("Vicuna-68M", "Vicuna-7B-v1.3", 0.6, _ANCHOR, "vicuna-68m-7b"),
        make_pair("Llama-3.2-1B", "Llama-3.2-3B", 0.8, _ANCHOR, "llama3-1b-3b"),
        make_pair("Llama-3.2-1B", "Llama-3.1-8B", 0.75, _ANCHOR, "llama3-1b-8b"),
        make_pair("Llama-3.1-8B", "Llama-3.1-70B", 0.8, _ANCHOR, "llama3-8b-70b", "b200"),
        make_pair("SmolLM2-135M", "SmolLM2-360M", 0.7, _ANCHOR, "smollm2-135m-360m"),
        make_pair("SmolLM2-135M", "SmolLM2-1.7B", 0.65, _ANCHOR, "smollm2-135m-1.7b"),
        make_pair("SmolLM2-360M", "SmolLM2-1.7B", 0.7, _ANCHOR, "smollm2-360m-1.7b"),
        make_pair("Gemma-3-270M", "Gemma-3-1B", 0.65, _ANCHOR, "gemma3-270m-1b"),
    ]
}


HEAD_PAIRS: dict[str, Pair] = {
    p.name: p
    for p in [
        head_pair("eagle", "Vicuna-7B-v1.3", "eagle-vicuna-7b", "a100-80gb"),
        head_pair("eagle", "Llama-3.1-8B", "eagle-llama3.1-8b"),
        head_pair("eagle3", "Llama-3.1-8B", "eagle3-llama3.1-8b"),
        head_pair("eagle3", "Llama-3.1-70B", "eagle3-llama3.1-70b", "b200"),
        head_pair("medusa", "Vicuna-7B-v1.3", "medusa-vicuna-7b", "a100-80gb"),
        head_pair("mtp", "Llama-3.1-8B", "mtp-llama3.1-8b"),
    ]
}
"""Draft heads on the targets their papers measured (``mtp-llama3.1-8b``: an MTP module of DeepSeek-V3's
design priced on a Llama-3.1-8B, the way to price one on a dense target; no such checkpoint is published)."""


def get_pair(name: str) -> Pair:
    """Look a pair (or a draft head on its target) up by exact name; an unknown name lists the valid ones."""
    try:
        return PAIRS[name] if name in PAIRS else HEAD_PAIRS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; valid: {', '.join([*PAIRS, *HEAD_PAIRS])}") from None
