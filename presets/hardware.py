"""Hardware profiles and the roofline forward-time estimate.

Bandwidth, peak dense bf16/fp16 tensor FLOP/s and memory capacity are the
vendors' datasheet figures (NVIDIA H100 SXM5 80 GB, H200 SXM 141 GB, A100 SXM
80 GB, L4 24 GB, T4 16 GB; B200, B300, GB200, L40S and RTX PRO 6000 Blackwell
Server as NVIDIA's datasheets print them and as aiconfigurator-core 0.12.0's
``systems/*.yaml`` copy them, dense, i.e. half the "with sparsity" figure).
``fp8_flops_per_s`` / ``fp4_flops_per_s`` are the dense FP8 / NVFP4 tensor
peaks, ``None`` where the chip has no such tensor cores (then ``--dtype fp8`` /
``nvfp4`` is refused on it). ``kernel_system`` names the system whose measured
kernel tables aiconfigurator-core ships (``None``: no tables, roofline only).
The achievable
fractions and the per-forward overheads are stated assumptions (eager PyTorch
launches a few kernels per layer at a few microseconds each); ``calibrate``
replaces all of it with measured numbers.

    forward_ms = max(bytes / (bandwidth · bw_eff), FLOPs / (peak · flop_eff))
                 + fixed_overhead_ms + layer_overhead_ms · layers
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from presets.heads import HeadSpec
from presets.models import ModelSpec


@dataclass(frozen=True)
class Hardware:
    """One accelerator (or CPU) as a roofline."""

    name: str
    description: str
    memory_bandwidth_bytes_per_s: float
    peak_flops_per_s: float
    dtype: str
    bytes_per_param: float
    bandwidth_efficiency: float = 0.8
    compute_efficiency: float = 0.6
    fixed_overhead_ms: float = 0.1
    layer_overhead_ms: float = 0.02
    usd_per_hour: float | None = None
    memory_bytes: float | None = None  # device memory (datasheet); None = not a fixed limit (CPU RAM)
    fp8_flops_per_s: float | None = None  # dense FP8 tensor peak; None = no FP8 tensor cores
    fp4_flops_per_s: float | None = None  # dense NVFP4 tensor peak; None = no FP4 tensor cores (pre-Blackwell)
    kernel_system: str | None = None  # aiconfigurator-core system with measured tables, None = none
    gpus_per_node: int = 1  # the largest tensor-parallel group on one NVLink/PCIe node

    def __post_init__(self) -> None:
        for f in ("memory_bandwidth_bytes_per_s", "peak_flops_per_s", "bytes_per_param"):
            if getattr(self, f) <= 0:
                raise ValueError(f"{self.name}: {f} must be > 0")
        for f in ("bandwidth_efficiency", "compute_efficiency"):
            if not 0 < getattr(self, f) <= 1:
                raise ValueError(f"{self.name}: {f} must be in (0, 1]")
        if self.memory_bytes is not None and self.memory_bytes <= 0:
            raise ValueError(f"{self.name}: memory_bytes must be > 0")

    def flops_for(self, dtype: str) -> float | None:
        """Dense tensor peak for weights in ``dtype`` (bf16, fp16, fp8, nvfp4); ``None`` if the chip lacks it."""
        if dtype in ("bf16", "fp16"):
            return self.peak_flops_per_s
        return {"fp8": self.fp8_flops_per_s, "nvfp4": self.fp4_flops_per_s}.get(dtype)

    def roofline_ms(self, flops: float, bytes_moved: float) -> float:
        mem_s = bytes_moved / (self.memory_bandwidth_bytes_per_s * self.bandwidth_efficiency)
        compute_s = flops / (self.peak_flops_per_s * self.compute_efficiency)
        return max(mem_s, compute_s) * 1000.0

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class RooflineForward:
    """Forward time of ``model`` (a model, or a draft head on its target) on ``hardware`` (satisfies
    ``sim.cost.ForwardCost``)."""

    model: ModelSpec | HeadSpec
    hardware: Hardware

    def forward_ms(self, n_tokens: int, context_tokens: float, batch: int = 1) -> float:
        hw, m = self.hardware, self.model
        flops = m.forward_flops(n_tokens, context_tokens, batch)
        bytes_moved = m.forward_bytes(n_tokens, context_tokens, batch, hw.bytes_per_param)
        return hw.roofline_ms(flops, bytes_moved) + hw.fixed_overhead_ms + hw.layer_overhead_ms * m.n_layers

    def describe(self) -> dict:
        return {"model": self.model.name, "hardware": self.hardware.name}


_TB, _TF, _GB = 1e12, 1e12, 1e9

HARDWARE: dict[str, Hardware] = {
    h.name: h
    for h in [
        Hardware("h100-sxm", "NVIDIA H100 SXM5 80GB: 3.35 TB/s HBM3, 989 TFLOP/s dense bf16",
                 3.35 * _TB, 989 * _TF, "bfloat16", 2.0, usd_per_hour=None, memory_bytes=80 * _GB,
                 fp8_flops_per_s=1979 * _TF, kernel_system="h100_sxm", gpus_per_node=8),
        Hardware("h200", "NVIDIA H200 SXM 141GB: 4.8 TB/s HBM3e, 989 TFLOP/s dense bf16",
                 4.8 * _TB, 989 * _TF, "bfloat16", 2.0, memory_bytes=141 * _GB, fp8_flops_per_s=1979 * _TF,
                 kernel_system="h200_sxm", gpus_per_node=8),
        Hardware("a100-80gb", "NVIDIA A100 SXM 80GB: 2.039 TB/s HBM2e, 312 TFLOP/s dense bf16",
                 2.039 * _TB, 312 * _TF, "bfloat16", 2.0, memory_bytes=80 * _GB, kernel_system="a100_sxm",
                 gpus_per_node=8),
        Hardware("b200", "NVIDIA B200 (HGX) 180GB: 8 TB/s HBM3e, 2.25 PFLOP/s dense bf16, 4.5 fp8, 9 nvfp4",
                 8.0 * _TB, 2250 * _TF, "bfloat16", 2.0, memory_bytes=180 * _GB, fp8_flops_per_s=4500 * _TF,
                 fp4_flops_per_s=9000 * _TF, kernel_system="b200_sxm", gpus_per_node=8),
        Hardware("b300", "NVIDIA B300 (HGX) 288GB: 8 TB/s HBM3e, 2.25 PFLOP/s dense bf16, 4.5 fp8, 14 nvfp4",
                 8.0 * _TB, 2250 * _TF, "bfloat16", 2.0, memory_bytes=288 * _GB, fp8_flops_per_s=4500 * _TF,
                 fp4_flops_per_s=14000 * _TF, kernel_system="b300_sxm", gpus_per_node=8),
        Hardware("gb200", "NVIDIA GB200 (one Blackwell GPU of an NVL72) 186GB: 8 TB/s HBM3e, 2.5 PFLOP/s dense "
                 "bf16, 5 fp8, 10 nvfp4", 8.0 * _TB, 2500 * _TF, "bfloat16", 2.0, memory_bytes=186 * _GB,
                 fp8_flops_per_s=5000 * _TF, fp4_flops_per_s=10000 * _TF, kernel_system="gb200", gpus_per_node=8),
        Hardware("l40s", "NVIDIA L40S 48GB: 864 GB/s GDDR6, 362 TFLOP/s dense bf16, 733 fp8",
                 0.864 * _TB, 362 * _TF, "bfloat16", 2.0, memory_bytes=48 * _GB, fp8_flops_per_s=733 * _TF,
                 kernel_system="l40s", gpus_per_node=8),
        Hardware("rtx-pro-6000", "NVIDIA RTX PRO 6000 Blackwell Server 96GB: 1.79 TB/s GDDR7, 468 TFLOP/s dense "
                 "bf16, 936 fp8, 1871 nvfp4", 1.792 * _TB, 468 * _TF, "bfloat16", 2.0, memory_bytes=96 * _GB,
                 fp8_flops_per_s=936 * _TF, fp4_flops_per_s=1871 * _TF, kernel_system="rtx_pro_6000_server",
                 gpus_per_node=8),
        Hardware("l4", "NVIDIA L4 24GB: 300 GB/s GDDR6, 121 TFLOP/s dense bf16",
                 300e9, 121 * _TF, "bfloat16", 2.0, memory_bytes=24 * _GB, fp8_flops_per_s=242.5 * _TF,
                 gpus_per_node=8),
        Hardware("t4", "NVIDIA T4 16GB: 320 GB/s GDDR6, 65 TFLOP/s dense fp16 (no bf16)",
                 320e9, 65 * _TF, "float16", 2.0, layer_overhead_ms=0.03, memory_bytes=16 * _GB, gpus_per_node=8),
        Hardware("cpu", "2-core x86 VM, float32 weights: assumed 20 GB/s DRAM, 150 GFLOP/s "
                 "(AVX-512 fp32, 2 cores); calibrate replaces these with measured numbers",
                 20e9, 150e9, "float32", 4.0, bandwidth_efficiency=1.0, compute_efficiency=1.0,
                 fixed_overhead_ms=0.5, layer_overhead_ms=0.1),
    ]
}


def get_hardware(name: str) -> Hardware:
    """Look a hardware profile up by exact name; an unknown name lists the valid ones."""
    try:
        return HARDWARE[name]
    except KeyError:
        raise ValueError(f"unknown hardware {name!r}; valid: {', '.join(HARDWARE)}") from None
