"""One model description: any decoder-only model's architecture, from a preset or its ``config.json``.

:class:`ModelSpec` is the one description every price reads — the roofline
(:mod:`presets.hardware`, :mod:`sim.stepcost`), the draft heads built on a
target (:mod:`presets.heads`), the kernel tables (:mod:`sim.stepcost` writes
it back as a ``config.json`` with :meth:`ModelSpec.to_config`) and the memory
checks. It comes from :data:`MODELS` (numbers copied from each model's
published ``config.json`` on the model hub, with the published parameter
count) or from any Hugging Face ``config.json`` dict (:meth:`ModelSpec.from_config`:
a shipped config, a user's local directory, :mod:`sim.modelref`).
:meth:`ModelSpec.counted_params` recounts parameters from the architecture;
``tests/presets/test_presets.py`` checks it against the published count within 2%.

What a forward touches:

* attention: grouped-query (q, k, v, o projections) or DeepSeek's multi-head
  latent attention (MLA: q through an optional low-rank ``q_lora_rank``, a
  compressed KV latent of ``kv_lora_rank`` plus a shared rope key, decompressed
  per head); the KV cache holds ``2 · kv_heads · head_dim`` values per token and
  layer, or, with MLA, ``kv_lora_rank + qk_rope_head_dim``;
* MLP: dense layers (``first_k_dense_replace`` of them in DeepSeek's MoE
  models, all of them otherwise) and mixture-of-experts (MoE) layers: a router,
  ``shared_experts`` always-on experts and ``experts_per_token`` of
  ``n_experts`` routed ones. A forward over ``t`` tokens reads, in expectation,
  ``E · (1 − (1 − k/E)^t)`` distinct experts (tokens routed independently and
  uniformly: an assumption; real routing is skewed, which touches fewer);
* each layer's norms (RMSNorm weights; GPT-2's LayerNorms and biases);
* the LM head (``vocab × hidden``) and one embedding row per token.

FLOPs and bytes of one forward (the roofline's inputs):

* FLOPs = 2 · tokens · (weights one token multiplies by + vocab head) + 2 ·
  tokens · context · layers · heads · (QKᵀ and AV widths: 2 · head_dim, or
  MLA's absorbed ``2 · kv_lora_rank + qk_rope_head_dim``);
* bytes = weights read once per forward (the experts the tokens touch) ·
  bytes/param + KV cache read (context · KV bytes per token) per sequence.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, Mapping

Family = Literal["gpt2", "llama", "gemma3"]
# The Hugging Face class of a preset's family (a config.json names its own).
FAMILY_CLASSES: dict[str, str] = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM",
                                  "gemma3": "Gemma3ForCausalLM"}
# Multimodal configs keep the decoder's fields under one of these keys.
_NESTED_TEXT_KEYS = ("text_config", "llm_config")


def _int(d: Mapping[str, Any], *keys: str, default: int | None = None) -> int:
    for k in keys:
        v = d.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return int(v)
    if default is None:
        raise ValueError(f"config.json lacks {keys[0]!r}")
    return default


@dataclass(frozen=True)
class ModelSpec:
    """The numbers of one decoder-only model that set its forward's cost and its memory (its ``config.json``).

    ``published_params`` is the model card's count (presets; ``None`` for a config read from a file: then
    :attr:`params` is the recount). ``hf_class`` is the config's ``architectures[0]`` (``""``: the family's).
    """

    name: str
    family: Family
    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_size: int
    vocab_size: int
    tied_embeddings: bool
    max_position: int
    published_params: int | None
    hub_id: str
    hf_class: str = ""
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

    def __post_init__(self) -> None:
        for f in ("n_layers", "hidden_size", "n_heads", "n_kv_heads", "head_dim", "ffn_size", "vocab_size"):
            if getattr(self, f) < 1:
                raise ValueError(f"{self.name}: {f} must be >= 1, got {getattr(self, f)}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"{self.name}: heads {self.n_heads} not a multiple of KV heads {self.n_kv_heads}")
        if self.n_experts and not 1 <= self.experts_per_token <= self.n_experts:
            raise ValueError(f"{self.name}: experts per token {self.experts_per_token} not in 1..{self.n_experts}")

    # -- reading a config.json -----------------------------------------------------------------
    @classmethod
    def from_config(cls, config: Mapping[str, Any], name: str, hub_id: str = "") -> ModelSpec:
        """A model from a ``config.json`` dict; a missing or impossible field is a one-line ``ValueError``."""
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
            name=name, family="llama", hf_class=str(arch), hub_id=hub_id, published_params=None,
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

    def to_config(self, n_layers: int | None = None, vocab_size: int | None = None) -> dict:
        """A ``config.json`` for this model (optionally with fewer layers or another vocabulary: a draft head of
        this shape), in the fields the Hugging Face Llama / DeepSeek-V3 / Qwen3-MoE configs use."""
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

    def as_dense_layer(self) -> ModelSpec:
        """This model's shape as a dense Llama decoder (grouped-query attention, the config's dense MLP width):
        what an EAGLE or EAGLE-3 head of an MoE or MLA target is (their released heads are Llama layers; for an MLA
        target, 128-wide heads and 8 KV heads, Llama's own attention shape, are assumed)."""
        heads, kv_heads, head_dim = self.n_heads, self.n_kv_heads, self.head_dim
        if self.is_mla:  # no grouped-query shape to copy: Llama's own, 128-wide heads and 8 KV heads
            heads, head_dim = max(self.hidden_size // 128, 1), 128
            kv_heads = 8 if heads % 8 == 0 else heads
        return replace(self, n_heads=heads, n_kv_heads=kv_heads, head_dim=head_dim, family="llama",
                       hf_class="LlamaForCausalLM", published_params=None, n_experts=0, experts_per_token=0,
                       moe_ffn_size=0, shared_experts=0, shared_ffn_size=0, dense_layers=0, kv_lora_rank=0,
                       q_lora_rank=0, qk_rope_head_dim=0, qk_nope_head_dim=0, v_head_dim=0)

    # -- kinds ----------------------------------------------------------------------------------
    @property
    def architecture(self) -> str:
        """The Hugging Face class (``config.json`` ``architectures[0]``)."""
        return self.hf_class or FAMILY_CLASSES[self.family]

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

    # -- parameter accounting -----------------------------------------------------------------------
    @property
    def embedding_params(self) -> int:
        pos = self.max_position * self.hidden_size if self.family == "gpt2" else 0
        return self.vocab_size * self.hidden_size + pos

    @property
    def head_params(self) -> int:
        """The output projection (lm_head): vocab × hidden, shared or not."""
        return self.vocab_size * self.hidden_size

    @property
    def attention_params(self) -> int:
        """One layer's attention projections (GPT-2's biases in :attr:`dense_layer_params`)."""
        d, h = self.hidden_size, self.n_heads
        if not self.is_mla:
            return d * (h + 2 * self.n_kv_heads) * self.head_dim + h * self.head_dim * d
        qk = self.qk_nope_head_dim + self.qk_rope_head_dim
        q = (d * self.q_lora_rank + self.q_lora_rank * h * qk) if self.q_lora_rank else d * h * qk
        kv = d * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank * h * (
            self.qk_nope_head_dim + self.v_head_dim)
        return q + kv + h * self.v_head_dim * d

    @property
    def norm_params(self) -> int:
        """One layer's norm weights: two RMSNorms (Llama), four plus the q/k norms (Gemma 3)."""
        return 4 * self.hidden_size + 2 * self.head_dim if self.family == "gemma3" else 2 * self.hidden_size

    @property
    def dense_layer_params(self) -> int:
        """One dense layer: attention, MLP, norms."""
        if self.family == "gpt2":  # biases, a two-matrix MLP, two LayerNorms
            d, q, f = self.hidden_size, self.n_heads * self.head_dim, self.ffn_size
            kv = self.n_kv_heads * self.head_dim
            return d * (q + 2 * kv) + (q + 2 * kv) + q * d + d + 2 * d * f + f + d + 4 * d
        return self.attention_params + 3 * self.hidden_size * self.ffn_size + self.norm_params

    @property
    def expert_params(self) -> int:
        return 3 * self.hidden_size * self.moe_ffn_size

    @property
    def moe_layers(self) -> int:
        return self.n_layers - self.dense_layers if self.is_moe else 0

    def _moe_layer_fixed_params(self) -> int:
        """An MoE layer's always-read weights: attention, norms, router, shared experts."""
        return self.attention_params + self.norm_params + self.hidden_size * self.n_experts + 3 * self.hidden_size * (
            self.shared_ffn_size * self.shared_experts if self.shared_ffn_size == self.moe_ffn_size
            else self.shared_ffn_size)

    @property
    def layer_params(self) -> int:
        """One layer's weights a one-token forward multiplies by (an MoE layer's active set when the model
        has experts: what an MTP module or an EAGLE head of this shape reads)."""
        if not self.is_moe:
            return self.dense_layer_params
        return self._moe_layer_fixed_params() + self.experts_per_token * self.expert_params

    @property
    def non_embedding_params(self) -> int:
        """Every layer's weights (all experts), excluding the embedding table and the head."""
        dense = (self.n_layers - self.moe_layers) * self.dense_layer_params
        return dense + self.moe_layers * (self._moe_layer_fixed_params() + self.n_experts * self.expert_params)

    def counted_params(self) -> int:
        """Weights held in memory, recounted: embedding (GPT-2's learned positions too), layers, final norm, the
        LM head unless tied."""
        final_norm = 2 * self.hidden_size if self.family == "gpt2" else self.hidden_size
        untied_head = 0 if self.tied_embeddings else self.head_params
        return self.embedding_params + self.non_embedding_params + final_norm + untied_head

    @property
    def params(self) -> int:
        """The published count where there is one, else the recount."""
        return self.counted_params() if self.published_params is None else self.published_params

    def experts_touched(self, tokens: float) -> float:
        """Expected distinct routed experts one MoE layer reads for ``tokens`` tokens (uniform routing)."""
        if not self.is_moe:
            return 0.0
        e, k = self.n_experts, self.experts_per_token
        return e * (1.0 - (1.0 - k / e) ** max(tokens, 0.0))

    def active_params(self, tokens: float = 1.0) -> float:
        """Weights read by a forward over ``tokens`` tokens (layers + LM head; one embedding row is negligible)."""
        dense = (self.n_layers - self.moe_layers) * self.dense_layer_params
        moe = self.moe_layers * (self._moe_layer_fixed_params() + self.experts_touched(tokens) * self.expert_params)
        return dense + moe + self.head_params

    # -- analytic cost of one forward -------------------------------------------------------------------
    def kv_bytes_per_token(self, bytes_per_element: float) -> float:
        per_layer = (self.kv_lora_rank + self.qk_rope_head_dim) if self.is_mla else 2 * self.n_kv_heads * self.head_dim
        return self.n_layers * per_layer * bytes_per_element

    def _attention_width(self) -> int:
        """Per-head dot-product width of QKᵀ plus AV (MLA, weights absorbed: the latent and rope dims)."""
        if self.is_mla:
            return 2 * self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.head_dim

    def forward_flops(self, n_tokens: int, context_tokens: float, batch: int = 1) -> float:
        """FLOPs of one forward over ``n_tokens`` new positions per sequence, all with logits."""
        per_token = 2.0 * (self.layer_params * self.n_layers + self.head_params)
        attn = 2.0 * (context_tokens + n_tokens) * self.n_layers * self.n_heads * self._attention_width()
        return batch * n_tokens * (per_token + attn)

    def weight_bytes(self, bytes_per_param: float, tokens: float = 1.0) -> float:
        """Bytes of weights read by one forward over ``tokens`` tokens."""
        return self.active_params(tokens) * bytes_per_param

    def forward_bytes(self, n_tokens: int, context_tokens: float, batch: int = 1,
                      bytes_per_param: float = 2.0, kv_bytes_per_element: float | None = None) -> float:
        kv_elem = bytes_per_param if kv_bytes_per_element is None else kv_bytes_per_element
        kv = batch * (context_tokens + n_tokens) * self.kv_bytes_per_token(kv_elem)
        return self.weight_bytes(bytes_per_param, batch * n_tokens) + kv

    def as_dict(self) -> dict:
        return {**asdict(self), "architecture": self.architecture, "kind": self.kind, "params": self.params}


def _gpt2(name: str, hub: str, layers: int, d: int, heads: int, params: int) -> ModelSpec:
    return ModelSpec(name, "gpt2", layers, d, heads, heads, d // heads, 4 * d, 50257, True, 1024, params, hub)


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        # GPT-2 family (openai-community/*, config.json: n_layer, n_embd, n_head; n_inner = 4·n_embd)
        _gpt2("gpt2", "openai-community/gpt2", 12, 768, 12, 124_439_808),
        _gpt2("distilgpt2", "distilbert/distilgpt2", 6, 768, 12, 81_912_576),
        _gpt2("gpt2-medium", "openai-community/gpt2-medium", 24, 1024, 16, 354_823_168),
        _gpt2("gpt2-large", "openai-community/gpt2-large", 36, 1280, 20, 774_030_080),
        _gpt2("gpt2-xl", "openai-community/gpt2-xl", 48, 1600, 25, 1_557_611_200),
        # Llama 3.x (meta-llama/*)
        ModelSpec("Llama-3.2-1B", "llama", 16, 2048, 32, 8, 64, 8192, 128256, True, 131072,
                  1_235_814_400, "meta-llama/Llama-3.2-1B"),
        ModelSpec("Llama-3.2-3B", "llama", 28, 3072, 24, 8, 128, 8192, 128256, True, 131072,
                  3_212_749_824, "meta-llama/Llama-3.2-3B"),
        ModelSpec("Llama-3.1-8B", "llama", 32, 4096, 32, 8, 128, 14336, 128256, False, 131072,
                  8_030_261_248, "meta-llama/Llama-3.1-8B"),
        ModelSpec("Llama-3.1-70B", "llama", 80, 8192, 64, 8, 128, 28672, 128256, False, 131072,
                  70_553_706_496, "meta-llama/Llama-3.1-70B"),
        # Llama 2 (meta-llama/Llama-2-*-hf config.json; LLaMA-1 7B/13B share these shapes, context 2048)
        ModelSpec("Llama-2-7B", "llama", 32, 4096, 32, 32, 128, 11008, 32000, False, 4096,
                  6_738_415_616, "meta-llama/Llama-2-7b-hf"),
        ModelSpec("Llama-2-13B", "llama", 40, 5120, 40, 40, 128, 13824, 32000, False, 4096,
                  13_015_864_320, "meta-llama/Llama-2-13b-hf"),
        ModelSpec("Llama-2-70B", "llama", 80, 8192, 64, 8, 128, 28672, 32000, False, 4096,
                  68_976_648_192, "meta-llama/Llama-2-70b-hf"),
        # Vicuna v1.3 is a LLaMA-1 fine-tune (same shapes as Llama-2-7B, context 2048); the 68M draft is a
        # fine-tune of JackFram/llama-68m (config.json: 2 layers, hidden 768, 12 heads, FFN 3072, vocab 32000,
        # untied); its hub name gives "68M", the only published count
        ModelSpec("Vicuna-7B-v1.3", "llama", 32, 4096, 32, 32, 128, 11008, 32000, False, 2048,
                  6_738_415_616, "lmsys/vicuna-7b-v1.3"),
        ModelSpec("Vicuna-68M", "llama", 2, 768, 12, 12, 64, 3072, 32000, False, 2048,
                  68_000_000, "double7/vicuna-68m"),
        ModelSpec("TinyLlama-1.1B", "llama", 22, 2048, 32, 4, 64, 5632, 32000, False, 2048,
                  1_100_048_384, "TinyLlama/TinyLlama-1.1B-Chat-v1.0"),
        # SmolLM2 (HuggingFaceTB/*), Llama architecture
        ModelSpec("SmolLM2-135M", "llama", 30, 576, 9, 3, 64, 1536, 49152, True, 8192,
                  134_515_008, "HuggingFaceTB/SmolLM2-135M-Instruct"),
        ModelSpec("SmolLM2-360M", "llama", 32, 960, 15, 5, 64, 2560, 49152, True, 8192,
                  361_821_120, "HuggingFaceTB/SmolLM2-360M-Instruct"),
        ModelSpec("SmolLM2-1.7B", "llama", 24, 2048, 32, 32, 64, 8192, 49152, True, 8192,
                  1_711_376_384, "HuggingFaceTB/SmolLM2-1.7B-Instruct"),
        # Gemma 3 (google/*): head_dim 256, one KV head at these sizes
        ModelSpec("Gemma-3-270M", "gemma3", 18, 640, 4, 1, 256, 2048, 262144, True, 32768,
                  268_098_176, "google/gemma-3-270m"),
        ModelSpec("Gemma-3-1B", "gemma3", 26, 1152, 4, 1, 256, 6912, 262144, True, 32768,
                  999_885_952, "google/gemma-3-1b-pt"),
    ]
}


def get_model(name: str) -> ModelSpec:
    """Look a model up by exact name; an unknown name lists the valid ones."""
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; valid: {', '.join(MODELS)}") from None
