"""Model architecture presets, with the analytic cost functions next to them.

Numbers are copied from each model's published ``config.json`` on the model
hub (layers, hidden size, heads, KV heads, head dim, FFN size, vocabulary,
tied embeddings, context length) and the published parameter count.
:meth:`ModelSpec.counted_params` recounts parameters from the architecture;
``tests/presets/test_presets.py`` checks the two agree within 2%.

FLOPs and bytes of one forward (used by the roofline in :mod:`presets.hardware`):

* FLOPs = 2 · tokens · (non-embedding weights + vocab head) + 4 · tokens ·
  context · layers · (heads · head_dim)  (QKᵀ and AV);
* bytes = weights read once per forward · bytes/param + KV cache read
  (context · layers · 2 · kv_heads · head_dim · bytes/element) per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Family = Literal["gpt2", "llama", "gemma3"]


@dataclass(frozen=True)
class ModelSpec:
    """Architecture numbers of one model (from its published config)."""

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
    params: int  # published parameter count
    hub_id: str

    def __post_init__(self) -> None:
        for f in ("n_layers", "hidden_size", "n_heads", "n_kv_heads", "head_dim", "ffn_size", "vocab_size"):
            if getattr(self, f) < 1:
                raise ValueError(f"{self.name}: {f} must be >= 1, got {getattr(self, f)}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"{self.name}: heads {self.n_heads} not a multiple of KV heads {self.n_kv_heads}")

    # -- parameter accounting ------------------------------------------------
    @property
    def embedding_params(self) -> int:
        pos = self.max_position * self.hidden_size if self.family == "gpt2" else 0
        return self.vocab_size * self.hidden_size + pos

    @property
    def head_params(self) -> int:
        """The output projection (lm_head): vocab × hidden, shared or not."""
        return self.vocab_size * self.hidden_size

    @property
    def layer_params(self) -> int:
        d, hd = self.hidden_size, self.head_dim
        q = self.n_heads * hd
        kv = self.n_kv_heads * hd
        if self.family == "gpt2":
            attn = d * (q + 2 * kv) + (q + 2 * kv) + q * d + d
            mlp = 2 * d * self.ffn_size + self.ffn_size + d
            norms = 4 * d
        else:
            attn = d * (q + 2 * kv) + q * d
            mlp = 3 * d * self.ffn_size
            norms = 2 * d if self.family == "llama" else 4 * d + 2 * hd
        return attn + mlp + norms

    @property
    def non_embedding_params(self) -> int:
        """Weights a forward multiplies by, excluding the embedding table and the head."""
        return self.n_layers * self.layer_params

    def counted_params(self) -> int:
        final_norm = 2 * self.hidden_size if self.family == "gpt2" else self.hidden_size
        untied_head = 0 if self.tied_embeddings else self.head_params
        return self.embedding_params + self.non_embedding_params + final_norm + untied_head

    # -- analytic cost of one forward -------------------------------------------
    def forward_flops(self, n_tokens: int, context_tokens: float, batch: int = 1) -> float:
        """FLOPs of one forward over ``n_tokens`` new positions per sequence, all with logits."""
        dense = 2.0 * (self.non_embedding_params + self.head_params)
        attn = 4.0 * (context_tokens + n_tokens) * self.n_layers * self.n_heads * self.head_dim
        return batch * n_tokens * (dense + attn)

    def weight_bytes(self, bytes_per_param: float) -> float:
        """Bytes of weights read by one forward (layers + head; one embedding row is negligible)."""
        return (self.non_embedding_params + self.head_params) * bytes_per_param

    def kv_bytes_per_token(self, bytes_per_element: float) -> float:
        return self.n_layers * 2 * self.n_kv_heads * self.head_dim * bytes_per_element

    def forward_bytes(
        self, n_tokens: int, context_tokens: float, batch: int = 1, bytes_per_param: float = 2.0
    ) -> float:
        kv = batch * (context_tokens + n_tokens) * self.kv_bytes_per_token(bytes_per_param)
        return self.weight_bytes(bytes_per_param) + kv

    def as_dict(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


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
