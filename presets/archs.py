"""Any model's architecture from its ``config.json``: dense, mixture-of-experts (MoE) and MLA attention.

:class:`Architecture` is read from a Hugging Face ``config.json`` (a dict) by
:meth:`Architecture.from_config`, or from a :class:`presets.models.ModelSpec`
preset by :meth:`Architecture.from_model_spec`. It exposes what
:class:`presets.hardware.RooflineForward` and :class:`presets.heads.HeadSpec`
read from a ModelSpec (``n_layers``, ``hidden_size``, ``layer_params``,
``forward_flops``, ``forward_bytes``, ...), so the roofline prices it, and a
draft head can be built on it.

What a forward touches:

* attention: grouped-query (q, k, v, o projections) or DeepSeek's multi-head
  latent attention (MLA: q through an optional low-rank ``q_lora_rank``, a
  compressed KV latent of ``kv_lora_rank`` plus a shared rope key, decompressed
  per head); the KV cache holds ``2 · kv_heads · head_dim`` values per token and
  layer, or, with MLA, ``kv_lora_rank + qk_rope_head_dim``;
* MLP: dense layers (``first_k_dense_replace`` of them in DeepSeek's MoE
  models, all of them otherwise) and MoE layers: a router, ``shared_experts``
  always-on experts and ``experts_per_token`` of ``n_experts`` routed ones.
  A forward over ``t`` tokens reads, in expectation, ``E · (1 − (1 − k/E)^t)``
  distinct experts (tokens routed independently and uniformly: an assumption;
  real routing is skewed, which touches fewer);
* the LM head (``vocab × hidden``) and one embedding row per token.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping

# Architectures whose config this module reads (the decoder-only families of the shipped configs and presets).
_NESTED_TEXT_KEYS = ("text_config", "llm_config")


def _int(d: Mapping[str, Any], *keys: str, default: int | None = None) -> int:
    for k in keys:
        v = d.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None:
            return int(v)
    if default is None:
        raise ValueError(f"config.json lacks {keys[0]!r}")
    return default


@dataclass(frozen=True)
class Architecture:
    """The numbers of one decoder-only model that set its forward's cost (from its ``config.json``)."""

    name: str
    architecture: str
    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_size: int
    vocab_size: int
    tied_embeddings: bool
    max_position: int
    hub_id: str = ""
    n_experts: int = 0
    experts_per_token: int = 0
    moe_ffn_size: int = 0
    shared_experts: int = 0
    shared_ffn_size: int = 0
    dense_layers: int = 0  # leading dense layers of an MoE model (DeepSeek's first_k_dense_replace)
    kv_lora_rank: int = 0  # > 0: multi-head latent attention (MLA)
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    family: str = "llama"

    def __post_init__(self) -> None:
        for f in ("n_layers", "hidden_size", "n_heads", "n_kv_heads", "head_dim", "vocab_size"):
            if getattr(self, f) < 1:
                raise ValueError(f"{self.name}: {f} must be >= 1, got {getattr(self, f)}")
        if self.n_experts and not 1 <= self.experts_per_token <= self.n_experts:
            raise ValueError(f"{self.name}: experts per token {self.experts_per_token} not in 1..{self.n_experts}")

    # -- reading ------------------------------------------------------------------------------
    @classmethod
    def from_config(cls, config: Mapping[str, Any], name: str, hub_id: str = "") -> Architecture:
        """An architecture from a ``config.json`` dict; a missing required field is a one-line ``ValueError``."""
        arch = (config.get("architectures") or ["?"])[0]
        for key in _NESTED_TEXT_KEYS:
            if isinstance(config.get(key), Mapping):
                config = {**config[key], "architectures": [arch]}
        d = int(_int(config, "hidden_size", "n_embd", "d_model"))
        heads = _int(config, "num_attention_heads", "n_head")
        n_experts = _int(config, "n_routed_experts", "num_experts", "num_local_experts", default=0)
        moe_ffn = _int(config, "moe_intermediate_size", default=0) or (
            _int(config, "intermediate_size", default=0) if n_experts else 0)
        shared = _int(config, "n_shared_experts", default=0)
        shared_ffn = _int(config, "shared_expert_intermediate_size", default=0)
        if shared_ffn and not shared:
            shared = 1
        kv_lora = _int(config, "kv_lora_rank", default=0)
        return cls(
            name=name, architecture=str(arch), hub_id=hub_id,
            n_layers=_int(config, "num_hidden_layers", "n_layer", "num_layers"), hidden_size=d,
            n_heads=heads, n_kv_heads=_int(config, "num_key_value_heads", default=heads),
            head_dim=_int(config, "head_dim", default=d // heads),
            ffn_size=_int(config, "intermediate_size", "n_inner", default=4 * d),
            vocab_size=_int(config, "vocab_size"),
            tied_embeddings=bool(config.get("tie_word_embeddings", False)),
            max_position=_int(config, "max_position_embeddings", "n_positions", default=131072),
            n_experts=n_experts, experts_per_token=_int(config, "num_experts_per_tok", default=0) if n_experts else 0,
            moe_ffn_size=moe_ffn, shared_experts=shared, shared_ffn_size=shared_ffn or (moe_ffn if shared else 0),
            dense_layers=_int(config, "first_k_dense_replace", default=0) if n_experts else 0,
            kv_lora_rank=kv_lora, q_lora_rank=_int(config, "q_lora_rank", default=0) if kv_lora else 0,
            qk_rope_head_dim=_int(config, "qk_rope_head_dim", default=0) if kv_lora else 0,
            qk_nope_head_dim=_int(config, "qk_nope_head_dim", default=0) if kv_lora else 0,
            v_head_dim=_int(config, "v_head_dim", default=0) if kv_lora else 0,
        )

    @classmethod
    def from_model_spec(cls, m: Any) -> Architecture:
        """A preset (:class:`presets.models.ModelSpec`) as an architecture (dense, grouped-query attention)."""
        return cls(name=m.name, architecture={"gpt2": "GPT2LMHeadModel", "gemma3": "Gemma3ForCausalLM"}.get(
                       m.family, "LlamaForCausalLM"), n_layers=m.n_layers, hidden_size=m.hidden_size,
                   n_heads=m.n_heads, n_kv_heads=m.n_kv_heads, head_dim=m.head_dim, ffn_size=m.ffn_size,
                   vocab_size=m.vocab_size, tied_embeddings=m.tied_embeddings, max_position=m.max_position,
                   hub_id=m.hub_id, family=m.family)

    def to_config(self, n_layers: int | None = None, vocab_size: int | None = None) -> dict:
        """A ``config.json`` for this architecture (optionally with fewer layers or another vocabulary: a draft
        head of this shape), in the fields the Hugging Face Llama / DeepSeek-V3 / Qwen3-MoE configs use."""
        cfg: dict[str, Any] = {
            "architectures": [self.architecture], "num_hidden_layers": n_layers or self.n_layers,
            "hidden_size": self.hidden_size, "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads, "head_dim": self.head_dim, "intermediate_size": self.ffn_size,
            "vocab_size": vocab_size or self.vocab_size, "tie_word_embeddings": self.tied_embeddings,
            "max_position_embeddings": self.max_position, "rms_norm_eps": 1e-5, "hidden_act": "silu",
            "torch_dtype": "bfloat16", "model_type": "llama",
        }
        if self.n_experts:
            cfg.update(n_routed_experts=self.n_experts, num_experts=self.n_experts,
                       num_experts_per_tok=self.experts_per_token, moe_intermediate_size=self.moe_ffn_size,
                       n_shared_experts=self.shared_experts,
                       first_k_dense_replace=min(self.dense_layers, (n_layers or self.n_layers) - 1))
        if self.is_mla:
            cfg.update(kv_lora_rank=self.kv_lora_rank, q_lora_rank=self.q_lora_rank or None,
                       qk_rope_head_dim=self.qk_rope_head_dim, qk_nope_head_dim=self.qk_nope_head_dim,
                       v_head_dim=self.v_head_dim)
        return cfg

    def as_dense_layer(self) -> Architecture:
        """This model's shape as a dense Llama decoder (grouped-query attention, the config's dense MLP width):
        what an EAGLE or EAGLE-3 head of an MoE or MLA target is (their released heads are Llama layers; for an MLA
        target, 128-wide heads and 8 KV heads, Llama's own attention shape, are assumed)."""
        heads, kv_heads, head_dim = self.n_heads, self.n_kv_heads, self.head_dim
        if self.is_mla:  # no grouped-query shape to copy: Llama's own, 128-wide heads and 8 KV heads
            heads, head_dim = max(self.hidden_size // 128, 1), 128
            kv_heads = 8 if heads % 8 == 0 else heads
        return replace(self, n_heads=heads, n_kv_heads=kv_heads, head_dim=head_dim,
                       architecture="LlamaForCausalLM", n_experts=0, experts_per_token=0, moe_ffn_size=0,
                       shared_experts=0, shared_ffn_size=0, dense_layers=0, kv_lora_rank=0, q_lora_rank=0,
                       qk_rope_head_dim=0, qk_nope_head_dim=0, v_head_dim=0, family="llama")

    # -- kinds --------------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def kind(self) -> str:
        """``dense``, ``moe`` or ``moe+mla`` / ``dense+mla``, for the output."""
        return ("moe" if self.is_moe else "dense") + ("+mla" if self.is_mla else "")

    # -- parameters ---------------------------------------------------------------------------
    @property
    def attention_params(self) -> int:
        d, h = self.hidden_size, self.n_heads
        if not self.is_mla:
            return d * (h + 2 * self.n_kv_heads) * self.head_dim + h * self.head_dim * d
        qk = self.qk_nope_head_dim + self.qk_rope_head_dim
        q = (d * self.q_lora_rank + self.q_lora_rank * h * qk) if self.q_lora_rank else d * h * qk
        kv = d * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank * h * (
            self.qk_nope_head_dim + self.v_head_dim)
        return q + kv + h * self.v_head_dim * d

    @property
    def expert_params(self) -> int:
        return 3 * self.hidden_size * self.moe_ffn_size

    @property
    def moe_layers(self) -> int:
        return self.n_layers - self.dense_layers if self.is_moe else 0

    def _moe_layer_fixed_params(self) -> int:
        """An MoE layer's always-read weights: attention, router, shared experts."""
        return self.attention_params + self.hidden_size * self.n_experts + 3 * self.hidden_size * (
            self.shared_ffn_size * self.shared_experts if self.shared_ffn_size == self.moe_ffn_size
            else self.shared_ffn_size)

    @property
    def dense_layer_params(self) -> int:
        if self.family == "gpt2":  # biases, two-matrix MLP, two LayerNorms (presets.models.ModelSpec's count)
            d, f = self.hidden_size, self.ffn_size
            return 4 * d * d + 4 * d + 2 * d * f + f + d + 4 * d
        return self.attention_params + 3 * self.hidden_size * self.ffn_size

    @property
    def layer_params(self) -> int:
        """One layer's weights a one-token forward multiplies by (an MoE layer's active set when the model
        has experts: what an MTP module or an EAGLE head of this shape reads)."""
        if not self.is_moe:
            return self.dense_layer_params
        return self._moe_layer_fixed_params() + self.experts_per_token * self.expert_params

    @property
    def head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def non_embedding_params(self) -> int:
        """Every layer's weights (all experts)."""
        dense = (self.n_layers - self.moe_layers) * self.dense_layer_params
        return dense + self.moe_layers * (self._moe_layer_fixed_params() + self.n_experts * self.expert_params)

    @property
    def params(self) -> int:
        """Weights held in memory: layers, embedding (GPT-2's learned positions too), the LM head unless tied."""
        positions = self.max_position * self.hidden_size + self.hidden_size if self.family == "gpt2" else 0
        return self.non_embedding_params + self.head_params * (1 if self.tied_embeddings else 2) + positions

    def counted_params(self) -> int:
        return self.params

    def experts_touched(self, tokens: float) -> float:
        """Expected distinct routed experts one MoE layer reads for ``tokens`` tokens (uniform routing)."""
        if not self.is_moe:
            return 0.0
        e, k = self.n_experts, self.experts_per_token
        return e * (1.0 - (1.0 - k / e) ** max(tokens, 0.0))

    def active_params(self, tokens: float = 1.0) -> float:
        """Weights read by a forward over ``tokens`` tokens (layers + LM head)."""
        dense = (self.n_layers - self.moe_layers) * self.dense_layer_params
        moe = self.moe_layers * (self._moe_layer_fixed_params() + self.experts_touched(tokens) * self.expert_params)
        return dense + moe + self.head_params

    # -- a forward's cost (the roofline's inputs) ---------------------------------------------------
    def kv_bytes_per_token(self, bytes_per_element: float) -> float:
        per_layer = (self.kv_lora_rank + self.qk_rope_head_dim) if self.is_mla else 2 * self.n_kv_heads * self.head_dim
        return self.n_layers * per_layer * bytes_per_element

    def _attention_width(self) -> int:
        """Per-head dot-product width of QKᵀ plus AV (MLA, weights absorbed: the latent and rope dims)."""
        if self.is_mla:
            return 2 * self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.head_dim

    def forward_flops(self, n_tokens: int, context_tokens: float, batch: int = 1) -> float:
        tokens = batch * n_tokens
        per_token = 2.0 * (self.layer_params * self.n_layers + self.head_params)
        attn = 2.0 * (context_tokens + n_tokens) * self.n_layers * self.n_heads * self._attention_width()
        return tokens * (per_token + attn)

    def weight_bytes(self, bytes_per_param: float, tokens: float = 1.0) -> float:
        return self.active_params(tokens) * bytes_per_param

    def forward_bytes(self, n_tokens: int, context_tokens: float, batch: int = 1,
                      bytes_per_param: float = 2.0, kv_bytes_per_element: float | None = None) -> float:
        kv_elem = bytes_per_param if kv_bytes_per_element is None else kv_bytes_per_element
        kv = batch * (context_tokens + n_tokens) * self.kv_bytes_per_token(kv_elem)
        return self.weight_bytes(bytes_per_param, batch * n_tokens) + kv

    def as_dict(self) -> dict:
        return {**asdict(self), "kind": self.kind, "params": self.params}
