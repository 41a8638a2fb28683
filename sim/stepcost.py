"""The step-cost seam: what one GPU step costs, from whichever source can price it, named in every output.

One protocol, :class:`sim.cost.ForwardCost` (``forward_ms(n_tokens, context_tokens,
batch)``: the target forward of ``batch`` sequences × ``n_tokens`` query tokens
over a context), three sources behind it:

* ``kernels`` — :class:`sim.kernels.KernelForward`: aiconfigurator-core's
  silicon-measured GEMM / attention / MoE / communication tables
  (H100, H200, B200, B300, GB200, L40S, RTX PRO 6000; A100 with older data);
* ``roofline`` — :class:`ParallelRoofline`: the datasheet roofline of
  :mod:`presets.hardware` with tensor parallelism and the weight dtype (CPU,
  T4, L4, any GPU or architecture the tables lack);
* ``measured`` — a fitted :class:`sim.cost.TabulatedCost` (``--cost-model``),
  as before.

:func:`build_step_cost` picks the source per side (target, draft) —
``auto``: kernels where the GPU has tables, the package is installed and the
model's architecture is one it models, else the roofline, with the reason —
and returns a :class:`StepCost`, a :class:`sim.cost.CostModel`, so the
analytic, event and serve modes use it without knowing the source.

Drafts are priced as what they are (:class:`DraftSide`): a separate model (its
own config), an EAGLE / EAGLE-3 head (one decoder layer of the target's shape,
EAGLE's 2d→d FC per step, EAGLE-3's wider q/k/v input per step and its 3d→d
fusion per round, an LM head over the draft vocabulary), an MTP module applied
once per draft step (DeepSeek's chain: one layer of the target's shape and its
2d→d projection), Medusa heads (a d→d block and an LM head per head), n-gram
lookup (no GPU work). A draft's first forward of a round reads the verified
positions (the engines' draft "extend" over the accepted tokens), so a round
costs γ one-token draft steps, the extra width of that first forward, and the
verification: :meth:`StepCost.verify_ms` carries the latter two.

Before any pricing :func:`check_fits` refuses, in one line, a model that does
not fit the GPUs' memory (weights at the dtype / TP, plus the KV cache of the
asked batch and context), and :func:`check_gpu_setup` an impossible dtype or TP.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from presets.hardware import HARDWARE, Hardware
from presets.heads import HeadSpec
from presets.models import ModelSpec
from sim import kernels
from sim.cost import ForwardCost
from sim.modelref import ModelRef, head_config, resolve_model

COST_SOURCES = ("auto", "kernels", "roofline")
DTYPES = ("bf16", "fp16", "fp8", "nvfp4")
DRAFT_KINDS = ("eagle", "eagle3", "mtp", "medusa", "ngram")
TP_SIZES = (1, 2, 4, 8)
BYTES_PER_PARAM = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "nvfp4": 9 / 16}  # nvfp4: 4 bits + one fp8 scale per 16
USABLE_MEMORY_FRACTION = 0.9  # the rest: activations, CUDA graphs, the engine's workspace (vLLM's default 0.9)
ALLREDUCE_MS = 0.008  # one tensor-parallel all-reduce of a decode step on NVLink (an assumption; two per layer)
DRAFT_VOCAB = 32_000  # the EAGLE-3 Llama heads' draft vocabulary
MEDUSA_HEADS = 5


@dataclass(frozen=True)
class GpuSetup:
    """Where and how the model runs: the device profile, engine, parallelism, weight dtype and, for an MoE model
    priced by the kernel tables, the token routing their MoE op is measured under (:data:`sim.kernels.MOE_ROUTINGS`)."""

    hardware: Hardware
    engine: str = "vllm"
    tp: int = 1
    ep: int = 1
    dtype: str = "bf16"
    engine_given: bool = False
    moe_routing: str = kernels.DEFAULT_MOE_ROUTING

    def __post_init__(self) -> None:
        kernels.check_moe_routing(self.moe_routing)

    @property
    def kv_bytes_per_element(self) -> float:
        return kernels.KV_BYTES[kernels.QUANT_MODES[self.dtype][1]] if self.hardware.name != "cpu" else 4.0


@dataclass(frozen=True)
class ParallelRoofline:
    """The roofline forward of a model (or head) on ``tp`` GPUs at a dtype (satisfies ``ForwardCost``)."""

    model: ModelSpec | HeadSpec
    hardware: Hardware
    tp: int = 1
    kv_bytes_per_element: float = 2.0

    def forward_ms(self, n_tokens: int, context_tokens: float, batch: int = 1) -> float:
        hw, m = self.hardware, self.model
        flops = m.forward_flops(n_tokens, context_tokens, batch) / self.tp
        if isinstance(m, ModelSpec):
            moved = m.forward_bytes(n_tokens, context_tokens, batch, hw.bytes_per_param, self.kv_bytes_per_element)
        else:
            moved = m.forward_bytes(n_tokens, context_tokens, batch, hw.bytes_per_param)
        comm = 2 * m.n_layers * ALLREDUCE_MS if self.tp > 1 else 0.0
        return hw.roofline_ms(flops, moved / self.tp) + hw.fixed_overhead_ms + hw.layer_overhead_ms * m.n_layers + comm

    def gemm_ms(self, n: int, k: int, tokens: int) -> float:
        return self.hardware.roofline_ms(2.0 * n * k * tokens, n * k * self.hardware.bytes_per_param)

    def prefill_ms(self, prompt_tokens: int, batch: int = 1) -> float:
        return self.forward_ms(prompt_tokens, 0.0, batch)

    def describe(self) -> dict:
        return {"model": self.model.name, "source": "roofline", "hardware": self.hardware.name, "tp": self.tp,
                "bytes_per_param": self.hardware.bytes_per_param}


@dataclass(frozen=True)
class Side:
    """Which source priced one side (target or draft), and why."""

    source: str
    why: str
    detail: dict = field(default_factory=dict)

    def line(self) -> str:
        return f"{self.source} ({self.why})"


@dataclass(frozen=True)
class DraftSide:
    """A draft priced as what it is: its forward (``None``: n-gram), extra GEMMs per step and per round.

    ``step_gemms`` / ``round_gemms`` are ``(n, k)`` GEMM shapes (outputs, inputs) per GPU; ``gemm_ms`` prices one
    over a number of token rows on the same source; ``extend``: the first forward of a round reads the verified
    positions (EAGLE, EAGLE-3, MTP, a separate model)."""

    kind: str
    name: str
    forward: ForwardCost | None
    gemm_ms: Callable[[int, int, int], float] | None
    side: Side
    step_gemms: tuple[tuple[int, int], ...] = ()
    round_gemms: tuple[tuple[int, int], ...] = ()
    extend: bool = True
    heads_per_pass: int = 1  # Medusa: every head in one pass

    def _gemms(self, shapes: tuple[tuple[int, int], ...], tokens: int) -> float:
        assert self.gemm_ms is not None or not shapes
        return sum(self.gemm_ms(n, k, tokens) for n, k in shapes) if shapes and self.gemm_ms else 0.0

    def step_ms(self, context_tokens: float, batch: int = 1) -> float:
        """One draft step: one draft token per sequence."""
        if self.forward is None:
            return self._gemms(self.step_gemms, batch)
        return self.forward.forward_ms(1, context_tokens, batch) + self._gemms(self.step_gemms, batch)

    def forward_ms(self, n_tokens: int, context_tokens: float, batch: int = 1) -> float:
        """A draft forward over ``n_tokens`` positions per sequence (a token-tree level)."""
        if self.forward is None or self.kind == "medusa":
            return self.step_ms(context_tokens, batch)
        return self.forward.forward_ms(n_tokens, context_tokens, batch) + self._gemms(self.step_gemms, batch * n_tokens)

    def round_extra_ms(self, verified_tokens: int, context_tokens: float, batch: int = 1) -> float:
        """Per round beyond γ one-token steps: the first forward's extra width over the verified positions,
        and the once-per-round GEMMs (EAGLE-3's fusion of three target layers)."""
        extra = self._gemms(self.round_gemms, batch * verified_tokens)
        if self.forward is not None and self.extend and verified_tokens > 1 and self.kind != "medusa":
            extra += self.forward_ms(verified_tokens, context_tokens, batch) - self.step_ms(context_tokens, batch)
        return max(extra, 0.0)

    def describe(self) -> dict:
        return {"kind": self.kind, "name": self.name, "source": self.side.source, "why": self.side.why,
                "step_gemms": [list(s) for s in self.step_gemms], "round_gemms": [list(s) for s in self.round_gemms],
                "extend": self.extend, **({"forward": self.forward.describe()} if self.forward else {})}


@dataclass(frozen=True)
class StepCost:
    """A :class:`sim.cost.CostModel` whose target and draft are priced by the seam (kernels or roofline).

    ``verify_ms(n)`` is the target's forward over ``n`` positions plus the draft's once-per-round work (its first
    forward's extra width over the verified positions, EAGLE-3's fusion); ``target_step_ms`` is the plain
    autoregressive step."""

    target: ForwardCost
    draft: DraftSide
    target_side: Side
    setup: dict = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def target_step_ms(self, context_tokens: float, batch: int = 1) -> float:
        return self.target.forward_ms(1, context_tokens, batch)

    def draft_step_ms(self, context_tokens: float, batch: int = 1) -> float:
        return self.draft.step_ms(context_tokens, batch)

    def verify_ms(self, n_tokens: int, context_tokens: float, batch: int = 1) -> float:
        return self.verify_extend_ms(n_tokens, n_tokens, context_tokens, batch)

    def verify_extend_ms(self, n_tokens: int, extend_tokens: int, context_tokens: float, batch: int = 1) -> float:
        """The target's forward over ``n_tokens`` positions per sequence plus the draft's once-per-round work over
        the ``extend_tokens`` positions its extend pass reads. A chain verifies and extends over the same γ + 1;
        a tree verifies its nodes and the root, while the draft's extend reads at most the accepted path (SGLang
        pads it to ``speculative_num_steps + 1``). The tree's queries attend to the whole context and to their
        ancestors only: priced as ``n_tokens`` queries over the context, the same attention rule as a chain."""
        return (self.target.forward_ms(n_tokens, context_tokens, batch)
                + self.draft.round_extra_ms(extend_tokens, context_tokens, batch))

    def draft_forward_ms(self, n_tokens: int, context_tokens: float, batch: int = 1) -> float:
        return self.draft.forward_ms(n_tokens, context_tokens, batch)

    def round_overhead_ms(self, gamma: int) -> float:
        return 0.0

    def prefill_ms(self, prompt_tokens: int, batch: int = 1) -> float:
        """A prefill of ``batch`` prompts on the target."""
        return float(getattr(self.target, "prefill_ms")(prompt_tokens, batch))

    def describe(self) -> dict:
        """The sources and setup; ``notes`` gains one line if an estimate so far used transferred table rows."""
        used = kernels.fallback_note() if "kernels" in (self.target_side.source, self.draft.side.source) else None
        return {"kind": "step", "target": {"source": self.target_side.source, "why": self.target_side.why,
                                           **self.target.describe()},
                "draft": self.draft.describe(), "setup": dict(self.setup),
                "notes": [*self.notes, *([used] if used else [])]}


# -- what an engine pays per round beyond the kernels ----------------------------------------------------------
@dataclass(frozen=True)
class EngineRoundOverhead:
    """Time a serving engine spends per speculative round that no kernel table times (ms).

    * ``per_draft_step_ms`` — each draft step's sampling, top-k and launches (γ per round);
    * ``per_round_ms`` — once per round: building the verification input, the accept/reject pass and the
      CPU-side bookkeeping a speculative round does where a plain decode step's is hidden under the GPU
      (SGLang ran speculative rounds without its overlap scheduler until its "spec v2");
    * ``per_extra_sequence_ms`` — the part of that bookkeeping that grows with the batch: per sequence
      beyond the first (accepted-token bookkeeping, KV-slot moves and per-request updates), zero at batch 1.

    The parameters are fitted (``python -m sim validate``), never assumed; the kernel and roofline costs
    of the draft steps, the verification and the draft's extend pass are priced apart (:class:`StepCost`)."""

    per_draft_step_ms: float = 0.0
    per_round_ms: float = 0.0
    per_extra_sequence_ms: float = 0.0

    def round_ms(self, gamma: int, batch: int = 1) -> float:
        """The overhead of one round of ``gamma`` draft steps over ``batch`` sequences."""
        return engine_round_overhead_ms(gamma, batch, self.per_draft_step_ms, self.per_round_ms,
                                        self.per_extra_sequence_ms)


@dataclass(frozen=True)
class EngineOverheads:
    """One per-draft-step overhead for every engine and a per-round overhead of each round kind's own (ms; a kind
    not named pays ``any_round_ms``, zero unless a model fitted one term for every engine; a tree round pays its
    engine's unless its kind has one of its own; every round pays ``per_extra_sequence_ms`` per sequence beyond the
    first). A kind is an engine for a chain, ``"<engine> tree"`` for a token tree:
    SGLang's speculative rounds ran without its overlap scheduler before "spec v2" while vLLM's and
    TensorRT-LLM's need not, and an SGLang tree round does work a chain's does not (selecting the verify tree
    from ``topk`` beams, building its mask and positions, walking it to accept), so their per-round time need
    not be the same."""

    per_draft_step_ms: float = 0.0
    per_round_ms: tuple[tuple[str, float], ...] = ()
    any_round_ms: float = 0.0
    per_extra_sequence_ms: float = 0.0

    def for_engine(self, engine: str, tree: bool = False) -> EngineRoundOverhead:
        """The overhead a round of ``engine`` pays (a tree round where ``tree``)."""
        rounds = dict(self.per_round_ms)
        per_round = rounds.get(round_kind(engine, tree), rounds.get(engine, self.any_round_ms))
        return EngineRoundOverhead(self.per_draft_step_ms, per_round, self.per_extra_sequence_ms)


def round_kind(engine: str, tree: bool = False) -> str:
    """The key of :attr:`EngineOverheads.per_round_ms` for a round of ``engine``: the engine, or ``"<engine> tree"``."""
    return f"{engine} tree" if tree else engine


SGLANG_OVERLAP_ROUND_MS = 1.96
"""Time per speculative round SGLang's overlap scheduler for speculative decoding ("spec v2") hid in its own
measurement, sgl-project/sglang PR #12128 ("Support overlap-spec-v2 with fa3 attention backend", 2025-10-25):
``python3 -m sglang.test.send_one`` on DeepSeek-R1, ``--tp 8 --speculative-algorithm=EAGLE`` (Hopper: the PR
enables FA3 MLA, "the default for dpsk + hopper"), 512 tokens at an acceptance length of 2.296 each way, cells
"3.644 | 512 | 2.296 | 140.52" (v1) and "3.206 | 512 | 2.296 | 159.71" (v2): 2.296 × (1/140.52 − 1/159.71) s =
1.96 ms per round at batch 1. A lower bound on the per-round CPU time SGLang v1 exposes (the PR notes kernels
that still keep it from overlapping fully), on one setup."""


def engine_round_overhead_ms(gamma: int, batch: int, per_draft_step_ms: float, per_round_ms: float = 0.0,
                             per_extra_sequence_ms: float = 0.0) -> float:
    """γ · per step + per round + (batch − 1) · per extra sequence (ms; see :class:`EngineRoundOverhead`)."""
    return gamma * per_draft_step_ms + per_round_ms + max(batch - 1, 0) * per_extra_sequence_ms


# -- checks before any work ------------------------------------------------------------------------------------
def check_gpu_setup(setup: GpuSetup, target: ModelSpec) -> None:
    """An impossible dtype or TP on this hardware and model is one ``ValueError`` line naming it and the valid."""
    hw = setup.hardware
    if hw.name == "cpu":
        if setup.tp != 1 or setup.dtype != "bf16" or setup.engine_given:
            raise ValueError("--hardware cpu takes no --tp, --dtype or --engine (float32 weights, one process); "
                             f"valid hardware for those: {', '.join(h for h in HARDWARE if h != 'cpu')}")
        return
    if hw.flops_for(setup.dtype) is None:
        ok = [d for d in DTYPES if hw.flops_for(d) is not None]
        what = "FP4 tensor cores (Blackwell: b200, b300, gb200, rtx-pro-6000)" if setup.dtype == "nvfp4" else \
            "FP8 tensor cores (Ada, Hopper, Blackwell)"
        raise ValueError(f"--dtype {setup.dtype} needs {what}; {hw.name} has none; valid on {hw.name}: {', '.join(ok)}")
    if setup.ep != setup.tp and not target.is_moe:
        raise ValueError(f"--ep {setup.ep}: {target.name} is dense (no experts); valid: leave --ep out")
    if target.is_moe and (setup.tp % setup.ep or setup.ep > target.n_experts):
        valid_ep = [e for e in range(1, setup.tp + 1) if setup.tp % e == 0 and e <= target.n_experts]
        raise ValueError(f"--ep {setup.ep}: expert parallelism must divide --tp {setup.tp} (attention TP = expert "
                         f"TP x EP) and hold at most {target.n_experts} experts; valid: {', '.join(map(str, valid_ep))}")
    valid_tp = [t for t in TP_SIZES if t <= hw.gpus_per_node and target.n_heads % t == 0
                and (target.is_mla or target.n_kv_heads % t == 0 or t % target.n_kv_heads == 0)]
    if setup.tp not in valid_tp:
        raise ValueError(f"--tp {setup.tp}: {target.name} has {target.n_heads} attention heads and {target.n_kv_heads} "
                         f"KV heads, {hw.name} nodes hold {hw.gpus_per_node} GPUs; valid: {', '.join(map(str, valid_tp))}")


@dataclass(frozen=True)
class MemoryNeed:
    """Bytes per GPU a setup needs: weights (target + draft) and the KV cache of the batch at its context."""

    weights_bytes: float
    kv_bytes: float
    usable_bytes: float | None

    @property
    def fits(self) -> bool:
        return self.usable_bytes is None or self.weights_bytes + self.kv_bytes <= self.usable_bytes


def memory_need(target: ModelSpec, draft_params: float, setup: GpuSetup, batch: int,
                context_tokens: float) -> MemoryNeed:
    """Per-GPU memory of a setup; MLA's latent KV cache is replicated across TP ranks, grouped-query KV split."""
    bpp = setup.hardware.bytes_per_param if setup.hardware.name == "cpu" else BYTES_PER_PARAM[setup.dtype]
    weights = (target.params + draft_params) * bpp / setup.tp
    kv = batch * context_tokens * target.kv_bytes_per_token(setup.kv_bytes_per_element)
    kv /= 1 if target.is_mla else setup.tp
    mem = setup.hardware.memory_bytes
    return MemoryNeed(weights, kv, None if mem is None else mem * USABLE_MEMORY_FRACTION)


def check_fits(target: ModelSpec, draft_params: float, setup: GpuSetup, batch: int, context_tokens: float) -> None:
    """A setup whose weights and KV cache do not fit the GPUs' memory is one ``ValueError`` line."""
    need = memory_need(target, draft_params, setup, batch, context_tokens)
    if need.fits:
        return
    assert need.usable_bytes is not None
    hw = setup.hardware
    fits_tp = [t for t in TP_SIZES if t <= hw.gpus_per_node and memory_need(
        target, draft_params, replace(setup, tp=t), batch, context_tokens).fits]
    fits_dtype = [d for d in DTYPES if hw.flops_for(d) is not None and memory_need(
        target, draft_params, replace(setup, dtype=d), batch, context_tokens).fits]
    fits_hw = [h.name for h in HARDWARE.values() if h.name != hw.name and h.memory_bytes is not None
               and h.flops_for(setup.dtype) is not None and setup.tp <= h.gpus_per_node
               and memory_need(target, draft_params, replace(setup, hardware=h), batch, context_tokens).fits]
    valid = [f"--tp {fits_tp[0]}" if fits_tp else "", f"--dtype {'/'.join(fits_dtype)}" if fits_dtype else "",
             f"--hardware {'/'.join(fits_hw)}" if fits_hw else "", "a smaller --batch or --context-tokens"]
    raise ValueError(
        f"{target.name} ({target.params / 1e9:.1f}B params) does not fit {setup.tp} x {hw.name} at {setup.dtype}: "
        f"{need.weights_bytes / 1e9:.1f} GB of weights + {need.kv_bytes / 1e9:.1f} GB of KV cache (batch {batch}, "
        f"{context_tokens:g} tokens) per GPU > {need.usable_bytes / 1e9:.0f} GB usable "
        f"({USABLE_MEMORY_FRACTION:.0%} of {(hw.memory_bytes or 0) / 1e9:.0f} GB); valid: "
        + ", ".join(v for v in valid if v))


def sequence_memory(target: str, draft: str, setup: GpuSetup, positions: float) -> MemoryNeed:
    """Per-GPU memory of both models' weights and of one sequence's KV cache at ``positions`` (the target's and the
    draft's: a separate model's, a head's layer, none for n-gram lookup): what the largest batch is sized from."""
    tref = resolve_model(target, "--target")
    kind = draft if draft in DRAFT_KINDS else "model"
    dref = None if kind != "model" else resolve_model(draft, "--draft")
    need = memory_need(tref.arch, _draft_model_params(kind, tref, dref), setup, 1, positions)
    if kind == "ngram":
        return need
    dmodel = dref.arch if dref is not None else HeadSpec(kind, tref.arch)  # type: ignore[arg-type]
    return replace(need, kv_bytes=need.kv_bytes + positions * dmodel.kv_bytes_per_token(setup.kv_bytes_per_element)
                   / setup.tp)


# -- building the sides ----------------------------------------------------------------------------------------
def _roofline_hw(setup: GpuSetup) -> Hardware:
    hw = setup.hardware
    if hw.name == "cpu":
        return hw
    return replace(hw, bytes_per_param=BYTES_PER_PARAM[setup.dtype],
                   peak_flops_per_s=hw.flops_for(setup.dtype) or hw.peak_flops_per_s)


def _kernel_reason(model: ModelRef, setup: GpuSetup) -> str | None:
    """Why the kernel tables cannot price ``model`` on this setup, or ``None``."""
    hw = setup.hardware
    if hw.kernel_system is None:
        covered = ", ".join(h.name for h in HARDWARE.values() if h.kernel_system)
        return f"no kernel tables for {hw.name} (tables: {covered})"
    missing = kernels.kernels_unavailable()
    if missing:
        return missing
    if model.kernel_model_path() is None:
        return f"aiconfigurator-core does not model {model.arch.architecture}"
    return None


def _kernel_forward(model: ModelRef, path: str, setup: GpuSetup, label: str, rule: str) -> kernels.KernelForward:
    hw, a = setup.hardware, model.arch
    per_gpu_heads = max(a.n_heads // setup.tp, 1)
    heads_per_kv = per_gpu_heads if a.is_mla else max(a.n_heads // a.n_kv_heads, 1)
    assert hw.kernel_system is not None
    ep = setup.ep if a.is_moe else 1
    return kernels.KernelForward(path, label, hw.kernel_system, setup.engine, setup.tp, ep, setup.dtype,
                                 heads_per_kv, hw.peak_flops_per_s / hw.memory_bandwidth_bytes_per_s, rule,
                                 setup.moe_routing if a.is_moe else None)


def target_side(model: ModelRef, setup: GpuSetup, asked: str, rule: str = "kv-once") -> tuple[ForwardCost, Side]:
    """The target's forward and which source priced it (``asked``: auto, kernels or roofline)."""
    roof = ParallelRoofline(model.arch, _roofline_hw(setup), setup.tp, setup.kv_bytes_per_element)
    if asked == "roofline":
        return roof, Side("roofline", "asked: --cost-source roofline")
    reason = _kernel_reason(model, setup)
    if reason is None:
        path = model.kernel_model_path()
        assert path is not None
        fwd = _kernel_forward(model, path, setup, model.name, rule)
        try:
            fwd.forward_ms(1, 128, 1)
            version = kernels.engine_version(fwd.system, setup.engine)
            routing = f", MoE routing {fwd.routing_text()}" if fwd.moe_routing else ""
            return fwd, Side("kernels", f"aiconfigurator-core 0.12.0, {fwd.system} {setup.engine} {version} tables"
                             f"{routing}", {"engine_version": version, "moe_routing": fwd.moe_routing})
        except kernels.KernelsUnavailable as exc:
            reason = f"aiconfigurator-core cannot price it: {exc}"
    if asked == "kernels":
        raise ValueError(f"--cost-source kernels: {reason}; valid: --cost-source auto or roofline")
    return roof, Side("roofline", f"fallback: {reason}")


def _head_gemms(kind: str, a: ModelSpec, tp: int) -> tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]:
    """Extra GEMMs ``(n, k)`` per GPU beyond the head's decoder layer: per draft step, and per round."""
    d = a.hidden_size
    if kind == "eagle":
        return ((d, 2 * d),), ()
    if kind == "mtp":
        return ((d, 2 * d),), ()
    if kind == "eagle3":  # q/k/v read [embedding; feature]: the second half of their input; the 3d -> d fusion
        return (((a.n_heads + 2 * a.n_kv_heads) * a.head_dim // tp, d),), ((d, 3 * d),)
    if kind == "medusa":  # per head: residual block d -> d and its own LM head
        return ((d, d), (a.vocab_size // tp, d)), ()
    return (), ()


def _draft_model_params(kind: str, target: ModelRef, draft: ModelRef | None) -> float:
    if draft is not None:
        return float(draft.arch.params)
    if kind == "ngram":
        return 0.0
    return float(HeadSpec(kind, target.arch).counted_params())  # type: ignore[arg-type]


def draft_side(kind: str, target: ModelRef, draft: ModelRef | None, setup: GpuSetup, asked: str,
               rule: str = "kv-once") -> DraftSide:
    """The draft priced as what it is, by the kernels where they can, else the roofline (the reason kept)."""
    if kind == "ngram":
        return DraftSide("ngram", "n-gram lookup", None, None, Side("none", "n-gram lookup: no GPU work"),
                         extend=False)
    step_gemms, round_gemms = _head_gemms(kind, target.arch, setup.tp)
    name = draft.name if draft is not None else f"{kind} head on {target.name}"
    if kind == "medusa":  # no decoder layer: GEMMs only, priced on the target's source
        fwd, side = target_side(target, setup, asked, rule)
        gemm = getattr(fwd, "gemm_ms")
        return DraftSide("medusa", name, None, gemm, side, step_gemms, extend=False)
    if draft is not None:
        ref = draft
    else:
        cfg = head_config(target, kind, DRAFT_VOCAB)
        ref = ModelRef(name, ModelSpec.from_config(cfg, name), cfg, f"one layer of {target.name}'s shape", None)
    fwd, side = target_side(ref, replace(setup, tp=setup.tp if ref.arch.n_heads % setup.tp == 0 else 1), asked, rule)
    if isinstance(fwd, ParallelRoofline) and draft is None:
        shape = target.arch.as_dense_layer() if kind in ("eagle", "eagle3") else target.arch
        head = HeadSpec(kind, shape)  # type: ignore[arg-type]
        fwd = ParallelRoofline(head, fwd.hardware, fwd.tp, fwd.kv_bytes_per_element)
        step_gemms, round_gemms = (), ()  # HeadSpec's step weights already hold the FC; its round FC below
        if head.round_params():
            d = target.arch.hidden_size
            round_gemms = ((d, 3 * d),)
    return DraftSide(kind, name, fwd, getattr(fwd, "gemm_ms"), side, step_gemms, round_gemms)


def build_step_cost(target: str, draft: str, setup: GpuSetup, asked: str = "auto", batch: int = 1,
                    context_tokens: float = 512.0, gamma_max: int = 8, rule: str = "kv-once") -> StepCost:
    """Resolve both models, check the setup and memory (one line on any problem), then price both sides."""
    if asked not in COST_SOURCES:
        raise ValueError(f"unknown cost source {asked!r}; valid: {', '.join(COST_SOURCES)}")
    tref = resolve_model(target, "--target")
    kind = draft if draft in DRAFT_KINDS else "model"
    try:
        dref = None if kind != "model" else resolve_model(draft, "--draft")
    except ValueError as exc:
        raise ValueError(f"{exc}; or a draft kind: {', '.join(DRAFT_KINDS)}") from None
    if dref is not None and dref.arch.vocab_size != tref.arch.vocab_size:
        raise ValueError(f"--draft {draft!r} has vocabulary {dref.arch.vocab_size} but --target {target!r} has "
                         f"{tref.arch.vocab_size}; a separate draft must share the target's tokenizer; valid: a "
                         f"model of the same family, or a head: {', '.join(DRAFT_KINDS)}")
    check_gpu_setup(setup, tref.arch)
    draft_params = _draft_model_params(kind, tref, dref)
    check_fits(tref.arch, draft_params, setup, batch, context_tokens + gamma_max + 1)
    fwd, tside = target_side(tref, setup, asked, rule)
    dside = draft_side(kind, tref, dref, setup, asked, rule)
    notes: list[str] = []
    info = {"target": tref.name, "target_origin": tref.origin, "target_kind": tref.arch.kind,
            "target_params_b": round(tref.arch.params / 1e9, 3), "draft": dside.name, "draft_kind": kind,
            "hardware": setup.hardware.name, "engine": setup.engine if tside.source == "kernels" else None,
            "engine_default": not setup.engine_given,
            "tp": setup.tp, "ep": setup.ep, "dtype": "fp32" if setup.hardware.name == "cpu" else setup.dtype,
            "attention_rule": rule,
            "cost_source_asked": asked}
    return StepCost(fwd, dside, tside, info, tuple(notes))


def source_lines(cost_description: dict) -> list[str]:
    """Which source priced the target side and the draft side, and why, for any cost model's ``describe()``."""
    kind = cost_description.get("kind")
    if kind == "step":
        t, d, s = cost_description["target"], cost_description["draft"], cost_description["setup"]
        engine = f", engine {s['engine']}" if s.get("engine") else ""
        engine += " (the default; --engine vllm|sglang|trtllm)" if engine and s.get("engine_default") else ""
        lines = [f"model: {s['target']} ({s['target_kind']}, {s['target_params_b']:g}B params; {s['target_origin']})"
                 f" on {s['tp']} x {s['hardware']} at {s['dtype']}{engine}; draft: {s['draft']}",
                 f"cost source: target {t['source']} ({t['why']}); draft {d['source']} ({d['why']})"]
        extra = [cost_description["engine_overhead"]] if cost_description.get("engine_overhead") else []
        return lines + extra + [f"note: {n}" for n in cost_description.get("notes", [])]
    what = {"roofline": "roofline (presets/hardware.py datasheet numbers), target and draft",
            "tabulated": "measured (a fitted cost-model file), target and draft",
            "leviathan": "cost ratio (Leviathan et al.'s model: draft step = c x target step)"}
    return [f"cost source: {what.get(str(kind), str(kind))}"]
