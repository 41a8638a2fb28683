"""Draft heads: EAGLE, EAGLE-3, MTP and Medusa drafts that live on the target and share its tokenizer.

A draft head is not a separate model: it reads the target's hidden states and
shares its embedding table (and, except EAGLE-3 and Medusa, its LM head). Its
cost is that of its own few layers plus the LM head it reads each step, so a
separate-model preset (a whole small model) prices it wrongly, and the
acceptance typical for separate drafts (Leviathan et al.'s 0.5–0.9) is not
what these heads reach. :class:`HeadSpec` is one head built for one target
(it has the methods :class:`presets.hardware.RooflineForward` calls, so the
roofline prices it like a model); :data:`HEAD_KINDS` holds, per kind, the
architecture in words and what the papers print about its acceptance
(:class:`PublishedAcceptance`: the printed figures, never a derived α; the
simulator turns τ into α, :mod:`sim.typical`).

Per draft step (one draft token), the weights read:

* ``eagle`` (EAGLE and EAGLE-2; the two share the head): one decoder layer of
  the target's shape, the FC that fuses [feature; token embedding] (2d → d,
  with bias), and the target's LM head (shared);
* ``eagle3``: one decoder layer whose attention reads [embedding; feature]
  (q/k/v take 2d inputs), the head's own LM head over a reduced draft
  vocabulary (32,000 tokens for the Llama-3 heads); the FC fusing three of the
  target's layers (3d → d) runs once per round (SGLang ``llama_eagle3.py``);
* ``mtp`` (DeepSeek-V3 §2.2 multi-token prediction module): a projection
  [RMSNorm(h); RMSNorm(emb)] (2d → d), one decoder layer, the shared output head;
* ``medusa`` (Medusa-1): one head per position, a residual block (d → d, with
  bias, SiLU) and the head's own LM head (vocab × d); all heads run in one pass
  after the target's, no attention and no KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from presets.models import ModelSpec

HeadKindName = Literal["eagle", "eagle3", "mtp", "medusa"]


@dataclass(frozen=True)
class PublishedAcceptance:
    """What one source prints about a kind of head's acceptance: the figures, with where they are.

    ``measure`` is ``alpha`` (per-position acceptance rates, chain drafts) or
    ``tau`` (mean tokens per draft-verify round, bonus token included, at draft
    depth ``depth``). ``tree``: measured with tree drafts, which accept more
    than a chain of the same depth (EAGLE Table 5: +0.6–0.8 tokens), so the α a
    chain model infers from such a τ is an upper estimate. ``headline`` is the
    source's own summary figure (e.g. its mean column), or ``None``.
    """

    source: str
    measure: Literal["alpha", "tau"]
    low: float
    high: float
    setting: str
    headline: float | None = None
    depth: int | None = None
    tree: bool = False
    checked: str = "checked against the source's text"

    def __post_init__(self) -> None:
        if self.measure not in ("alpha", "tau"):
            raise ValueError(f"{self.source}: measure must be 'alpha' or 'tau', got {self.measure!r}")
        if not self.low <= self.high:
            raise ValueError(f"{self.source}: low {self.low} > high {self.high}")
        if self.measure == "alpha" and not 0.0 <= self.low <= self.high <= 1.0:
            raise ValueError(f"{self.source}: acceptance rates must be in [0, 1], got {self.low}–{self.high}")
        if self.measure == "tau":
            if self.depth is None or self.depth < 1:
                raise ValueError(f"{self.source}: a τ needs the draft depth it was measured at, got {self.depth}")
            if not (1.0 <= self.low and self.high <= self.depth + 1):
                raise ValueError(f"{self.source}: τ must be in [1, depth + 1], got {self.low}–{self.high}")
        if self.headline is not None and not self.low <= self.headline <= self.high:
            raise ValueError(f"{self.source}: headline {self.headline} outside {self.low}–{self.high}")

    def figures(self) -> str:
        """The printed figures in a few words, e.g. ``tree τ 4.24–6.74 at depth 8``."""
        if self.measure == "alpha":
            return f"α {self.low:g}–{self.high:g}"
        return f"{'tree ' if self.tree else ''}τ {self.low:g}–{self.high:g} at depth {self.depth}"


@dataclass(frozen=True)
class HeadKind:
    """A kind of draft head: its name, its architecture in words and its published acceptance."""

    name: HeadKindName
    title: str
    architecture: str
    acceptance: tuple[PublishedAcceptance, ...]
    layers: int  # decoder layers per draft step (0: Medusa's residual block)


_EAGLE_PAPER = "Li, Wei, Zhang, Zhang 2024, EAGLE (ICML 2024, arXiv:2401.15077)"
_EAGLE3_PAPER = "Li, Wei, Zhang, Zhang 2025, EAGLE-3 (arXiv:2503.01840)"

HEAD_KINDS: dict[str, HeadKind] = {
    k.name: k
    for k in [
        HeadKind(
            "eagle", "EAGLE / EAGLE-2 head",
            "one decoder layer of the target's shape + FC [feature; embedding] 2d→d + the target's LM head (shared)",
            (
                PublishedAcceptance(
                    f"{_EAGLE_PAPER}, Table 2", "alpha", 0.64, 0.79,
                    "chain drafts, MT-bench, Vicuna 7B/13B/33B and LLaMA2-Chat 7B/13B/70B, temperature 0 and 1; "
                    "n-α for n = 0..4 of the head's own features in its input"),
                PublishedAcceptance(
                    f"{_EAGLE3_PAPER}, Table 1, EAGLE-2 rows for LLaMA-Instruct 3.1 8B", "tau", 3.14, 4.71,
                    "EAGLE-2 dynamic trees of depth 6 (Appendix A), five tasks, temperature 0 and 1", depth=6,
                    tree=True),
            ),
            layers=1,
        ),
        HeadKind(
            "eagle3", "EAGLE-3 head",
            "one decoder layer (q/k/v read [embedding; feature], 2d inputs) + its own LM head over a 32,000-token "
            "draft vocabulary; FC fusing three target layers 3d→d once per round",
            (
                PublishedAcceptance(
                    f"{_EAGLE3_PAPER}, Table 1, EAGLE-3 rows for LLaMA-Instruct 3.1 8B and 3.3 70B", "tau", 4.24,
                    6.74, "trees of depth 8 (Appendix A), MT-bench, HumanEval, GSM8K, Alpaca, CNN/DM, temperature "
                    "0 and 1; headline: LLaMA-Instruct 3.1 8B mean at temperature 0", headline=6.23, depth=8,
                    tree=True),
            ),
            layers=1,
        ),
        HeadKind(
            "mtp", "multi-token-prediction (MTP) module",
            "projection [RMSNorm(h); RMSNorm(embedding)] 2d→d + one decoder layer + the shared output head "
            "(DeepSeek-V3 §2.2)",
            (
                PublishedAcceptance(
                    "DeepSeek-AI 2024, DeepSeek-V3 Technical Report (arXiv:2412.19437), §5.4.3", "alpha", 0.85, 0.90,
                    "one MTP module (D = 1, the second token only) on DeepSeek-V3, \"across various generation "
                    "topics\"; no table: a sentence of the report",
                    checked="as quoted from the report's §5.4.3 in several public notes; the report's own text was "
                            "not checked"),
            ),
            layers=1,
        ),
        HeadKind(
            "medusa", "Medusa-1 head",
            "per draft position one head: a residual block d→d (with bias, SiLU) + the head's own LM head; all heads "
            "in one pass, no attention, no KV cache",
            (
                PublishedAcceptance(
                    f"{_EAGLE3_PAPER}, Table 1, Medusa rows (Vicuna 13B)", "tau", 2.09, 2.78,
                    "official Medusa weights and default settings (Appendix A): the mc_sim_7b_63 tree, 4 deep "
                    "(FasterDecoding/Medusa medusa/model/medusa_choices.py), five tasks, temperature 0",
                    headline=2.51, depth=4, tree=True),
                PublishedAcceptance(
                    "Xia et al. 2024, Spec-Bench Leaderboard.md, \"Leaderboard on A100\", Medusa rows", "tau", 2.32,
                    2.39, "Vicuna-7B/13B/33B-v1.3, greedy, the default 4-deep tree", depth=4, tree=True),
                PublishedAcceptance(
                    "FasterDecoding/Medusa assets/medusa_acc.csv (training runs)", "alpha", 0.56, 0.60,
                    "top-1 accuracy of the first Medusa head (the token after next) on Vicuna 7B/13B/33B"),
            ),
            layers=0,
        ),
    ]
}


def get_head_kind(name: str) -> HeadKind:
    """A head kind by exact name; an unknown name lists the valid ones."""
    try:
        return HEAD_KINDS[name]
    except KeyError:
        raise ValueError(f"unknown draft head {name!r}; valid: {', '.join(HEAD_KINDS)}") from None


@dataclass(frozen=True)
class HeadSpec:
    """A draft head of ``kind`` built for ``target``: its weights, FLOPs and bytes per draft step.

    Exposes what :class:`presets.hardware.RooflineForward` and the pair checks
    read from a :class:`presets.models.ModelSpec` (``name``, ``n_layers``,
    ``vocab_size``, ``max_position``, ``params``, ``counted_params``,
    ``forward_flops``, ``forward_bytes``), so the roofline prices it like a
    model. ``draft_vocab_size`` is the EAGLE-3 head's own vocabulary (default
    32,000, the Llama-3 heads'); ``medusa_heads`` the Medusa heads held in
    memory (5, as the released Medusa-1 weights were trained).
    """

    kind: HeadKindName
    target: ModelSpec
    draft_vocab_size: int = 32_000
    medusa_heads: int = 5

    def __post_init__(self) -> None:
        get_head_kind(self.kind)
        if self.draft_vocab_size < 1 or self.medusa_heads < 1:
            raise ValueError(f"{self.name}: draft vocabulary and head count must be >= 1")

    # -- what a ModelSpec exposes ------------------------------------------------------------
    @property
    def name(self) -> str:
        return f"{self.kind}-head({self.target.name})"

    @property
    def head_kind(self) -> HeadKind:
        return get_head_kind(self.kind)

    @property
    def n_layers(self) -> int:
        return self.head_kind.layers

    @property
    def vocab_size(self) -> int:
        """The target's vocabulary: the head speaks the target's tokens."""
        return self.target.vocab_size

    @property
    def max_position(self) -> int:
        return self.target.max_position

    @property
    def params(self) -> int:
        """The head's own weights (no published count for most heads: recounted from the architecture)."""
        return self.counted_params()

    # -- weights -------------------------------------------------------------------------------
    def _layer_params(self) -> int:
        t, d = self.target, self.target.hidden_size
        if self.kind != "eagle3":
            return t.layer_params
        q, kv = t.n_heads * t.head_dim, t.n_kv_heads * t.head_dim
        return t.layer_params + d * (q + 2 * kv)  # q/k/v read 2d inputs instead of d

    def _fc_params(self) -> int:
        d = self.target.hidden_size
        return {"eagle": 2 * d * d + d, "eagle3": 3 * d * d, "mtp": 2 * d * d + 2 * d, "medusa": 0}[self.kind]

    def _lm_head_params(self) -> int:
        d = self.target.hidden_size
        return (self.draft_vocab_size if self.kind == "eagle3" else self.target.vocab_size) * d

    def step_params(self) -> int:
        """Weights one draft step multiplies by (and reads): layer, per-step FC, LM head, shared ones included."""
        d = self.target.hidden_size
        if self.kind == "medusa":
            return d * d + d + self._lm_head_params()
        per_step_fc = 0 if self.kind == "eagle3" else self._fc_params()
        return self._layer_params() + per_step_fc + self._lm_head_params()

    def round_params(self) -> int:
        """Weights read once per round, not per draft step (EAGLE-3's fusing FC)."""
        return self._fc_params() if self.kind == "eagle3" else 0

    def counted_params(self) -> int:
        """The head's own weights in memory (the target's shared embedding and LM head not counted)."""
        d = self.target.hidden_size
        if self.kind == "medusa":
            return self.medusa_heads * (d * d + d + self._lm_head_params())
        own_head = self._lm_head_params() if self.kind == "eagle3" else 0
        return self._layer_params() + self._fc_params() + own_head

    # -- cost of one forward (the same formulas as ModelSpec's) --------------------------------------
    def forward_flops(self, n_tokens: int, context_tokens: float, batch: int = 1) -> float:
        t = self.target
        attn = 4.0 * (context_tokens + n_tokens) * self.n_layers * t.n_heads * t.head_dim
        return batch * n_tokens * (2.0 * self.step_params() + attn)

    def kv_bytes_per_token(self, bytes_per_element: float) -> float:
        t = self.target
        return self.n_layers * 2 * t.n_kv_heads * t.head_dim * bytes_per_element

    def weight_bytes(self, bytes_per_param: float) -> float:
        return self.step_params() * bytes_per_param

    def forward_bytes(self, n_tokens: int, context_tokens: float, batch: int = 1,
                      bytes_per_param: float = 2.0) -> float:
        kv = batch * (context_tokens + n_tokens) * self.kv_bytes_per_token(bytes_per_param)
        return self.weight_bytes(bytes_per_param) + kv

    def round_flops_and_bytes(self, batch: int, bytes_per_param: float) -> tuple[float, float]:
        """FLOPs and bytes of the once-per-round part (EAGLE-3's FC over one position per sequence)."""
        p = self.round_params()
        return 2.0 * batch * p, p * bytes_per_param

    def as_dict(self) -> dict:
        return {"kind": self.kind, "target": self.target.name, "step_params": self.step_params(),
                "round_params": self.round_params(), "own_params": self.counted_params(),
                **({"draft_vocab_size": self.draft_vocab_size} if self.kind == "eagle3" else {}),
                **({"medusa_heads": self.medusa_heads} if self.kind == "medusa" else {})}


__all__ = ["HEAD_KINDS", "HeadKind", "HeadKindName", "HeadSpec", "PublishedAcceptance", "get_head_kind"]
