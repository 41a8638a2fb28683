"""Triton kernels for the pruned head on CUDA: row gather + projection (+ fused argmax).

``triton_gather_project(weight, ids, hidden)`` computes
``logits[n, k] = hidden[n] . weight[ids[n, k]]`` with float32 accumulation,
reading only the ``K`` selected rows of the ``[V, H]`` head (no gathered copy
in memory). ``triton_gather_project_argmax`` fuses a per-block max/argmax so
greedy drafting never writes the ``K`` logits; a tiny torch reduction over the
``ceil(K / BLOCK_K)`` block winners finishes it.

Triton is imported lazily: importing this module on a machine without Triton
(or without CUDA) works, :func:`triton_available` returns ``False`` and the
callers (:class:`measure.head.pruned_head.PrunedLMHead`) fall back to the torch
implementation, which is also the reference these kernels are tested against
(``tests/measure/head/test_pruned_head.py``, GPU-only tests). Both kernels share one
``@triton.jit`` helper, ``_gather_dot_block`` (row gather + float32 dot for one
block of ``BLOCK_K`` kept tokens). Without a GPU, ``tests/measure/head/test_triton_interpret.py``
runs both kernels in Triton's interpreter (``TRITON_INTERPRET=1``, CPU tensors,
numpy semantics) against the torch reference; :func:`triton_available` stays
``False`` on CPU, so the interpreter is a correctness check, never a dispatch path.

All shapes are fixed for a given ``(N, K)``, and nothing synchronises with the
host, so the selector + kernel can be captured in a CUDA graph.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = ["triton_available", "triton_gather_project", "triton_gather_project_argmax"]

BLOCK_K = 32
BLOCK_H = 128

# Bound by :func:`_kernels` (module globals, see there); declared here for the type checker only.
_gather_dot_block: Any
_gather_project_kernel: Any
_gather_project_argmax_kernel: Any


@functools.lru_cache(maxsize=1)
def _triton_importable() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # ImportError, or a broken install on a CPU-only box
        return False
    return True


def triton_available() -> bool:
    """True when Triton imports and a CUDA device is present."""
    return torch.cuda.is_available() and _triton_importable()


# long: the Triton kernels are defined inside one lazily-imported factory so that importing the module never needs
#   Triton
@functools.lru_cache(maxsize=1)
def _kernels() -> dict[str, Any]:
    # The helper and the kernels are bound as module globals (``global``): a
    # kernel finds ``_gather_dot_block`` there both when compiled for the GPU
    # and under ``TRITON_INTERPRET=1``, whose interpreter re-executes the kernel
    # source with the module globals only (closure variables are not visible).
    global _gather_dot_block, _gather_project_kernel, _gather_project_argmax_kernel
    import triton
    import triton.language as tl

    @triton.jit
    def _gather_dot_block(
        w_ptr,
        ids_ptr,
        h_ptr,
        K,
        H,
        stride_wv,
        stride_idn,
        stride_hn,
        BLOCK_K: tl.constexpr,
        BLOCK_H: tl.constexpr,
    ):
        """This program's block (grid: K blocks × rows n) → (acc, offs_k, mask_k, n, pid_k).

        ``acc`` = float32 ``hidden[n] . weight[ids[n, offs_k]]`` (0 where ``~mask_k``).
        """
        pid_k = tl.program_id(0)
        n = tl.program_id(1)
        offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        rows = tl.load(ids_ptr + n * stride_idn + offs_k, mask=mask_k, other=0).to(tl.int64)
        acc = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for h0 in range(0, H, BLOCK_H):
            offs_h = h0 + tl.arange(0, BLOCK_H)
            mask_h = offs_h < H
            x = tl.load(h_ptr + n * stride_hn + offs_h, mask=mask_h, other=0.0).to(tl.float32)
            w = tl.load(
                w_ptr + rows[:, None] * stride_wv + offs_h[None, :],
                mask=mask_k[:, None] & mask_h[None, :],
                other=0.0,
            ).to(tl.float32)
            acc += tl.sum(w * x[None, :], axis=1)
        return acc, offs_k, mask_k, n, pid_k

    @triton.jit
    def _gather_project_kernel(
        w_ptr,
        ids_ptr,
        h_ptr,
        out_ptr,
        K,
        H,
        stride_wv,
        stride_idn,
        stride_hn,
        stride_on,
        BLOCK_K: tl.constexpr,
        BLOCK_H: tl.constexpr,
    ):
        acc, offs_k, mask_k, n, pid_k = _gather_dot_block(
            w_ptr, ids_ptr, h_ptr, K, H, stride_wv, stride_idn, stride_hn, BLOCK_K, BLOCK_H
        )
        tl.store(out_ptr + n * stride_on + offs_k, acc, mask=mask_k)

    @triton.jit
    def _gather_project_argmax_kernel(
        w_ptr,
        ids_ptr,
        h_ptr,
        pmax_ptr,
        ppos_ptr,
        K,
        H,
        n_blocks,
        stride_wv,
        stride_idn,
        stride_hn,
        BLOCK_K: tl.constexpr,
        BLOCK_H: tl.constexpr,
    ):
        acc, offs_k, mask_k, n, pid_k = _gather_dot_block(
            w_ptr, ids_ptr, h_ptr, K, H, stride_wv, stride_idn, stride_hn, BLOCK_K, BLOCK_H
        )
        acc = tl.where(mask_k, acc, float("-inf"))
        best = tl.max(acc, axis=0)
        # first position holding the block maximum (torch.argmax tie rule)
        pos = tl.min(tl.where(acc == best, offs_k, 2147483647), axis=0)
        tl.store(pmax_ptr + n * n_blocks + pid_k, best)
        tl.store(ppos_ptr + n * n_blocks + pid_k, pos)

    return {
        "triton": triton,
        "project": _gather_project_kernel,
        "argmax": _gather_project_argmax_kernel,
    }


def _check(weight: torch.Tensor, ids: torch.Tensor, hidden: torch.Tensor) -> None:
    if not triton_available():
        raise ValueError("the Triton head needs CUDA and an importable triton package")
    if not (weight.is_cuda and ids.is_cuda and hidden.is_cuda):
        raise ValueError("weight, ids and hidden must all be CUDA tensors")


def _check_shapes(weight: torch.Tensor, ids: torch.Tensor, hidden: torch.Tensor) -> None:
    if weight.dim() != 2 or ids.dim() != 2 or hidden.dim() != 2:
        raise ValueError(
            f"expected weight [V, H], ids [N, K], hidden [N, H]; got "
            f"{tuple(weight.shape)}, {tuple(ids.shape)}, {tuple(hidden.shape)}"
        )
    if ids.shape[0] != hidden.shape[0] or weight.shape[1] != hidden.shape[1]:
        raise ValueError(
            f"shape mismatch: weight {tuple(weight.shape)}, ids {tuple(ids.shape)}, hidden {tuple(hidden.shape)}"
        )
    if weight.stride(1) != 1:
        raise ValueError("weight rows must be contiguous (stride(1) == 1)")


def triton_gather_project(weight: torch.Tensor, ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """``[N, K]`` float32 logits of the rows ``ids`` ``[N, K]`` of ``weight`` ``[V, H]`` against ``hidden`` ``[N, H]``."""
    _check(weight, ids, hidden)
    return _launch_project(weight, ids, hidden)


def triton_gather_project_argmax(weight: torch.Tensor, ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """Token ids ``[N]``: ``ids[n, argmax_k hidden[n] . weight[ids[n, k]]]`` without materialising the logits."""
    _check(weight, ids, hidden)
    return _launch_argmax(weight, ids, hidden)


def patch_interpreter_index() -> None:
    """Make triton 3.6's interpreter (``TRITON_INTERPRET=1``) work with numpy >= 2.4: it converts 1-element arrays
    with ``int(arr)``, an error there, hit by ``range(0, H, BLOCK_H)`` with a runtime ``H``.

    Fixed upstream (triton-lang/triton#9171, PR #9172: ``int(data.squeeze())``); the same fix, applied to the
    interpreter only, in the calling process only (the CPU checks of the kernels: the interpreter tests and
    ``benchmarks/gpu_check.py --dry-run``).
    """
    import triton.runtime.interpreter as ti

    orig = ti._patch_lang_tensor
    if getattr(orig, "_specscope_patched", False):
        return

    def patched(tensor: Any, scope: Any) -> None:
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._specscope_patched = True  # type: ignore[attr-defined]  # a marker on the function object
    ti._patch_lang_tensor = patched


# The launchers below skip the CUDA check: under TRITON_INTERPRET=1 the tests run
# them on CPU tensors (tests/measure/head/test_triton_interpret.py).
def _launch_project(weight: torch.Tensor, ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    _check_shapes(weight, ids, hidden)
    k = _kernels()
    n, kk = ids.shape
    ids = ids.contiguous()
    hidden = hidden.contiguous()
    out = torch.empty(n, kk, dtype=torch.float32, device=weight.device)
    grid = (k["triton"].cdiv(kk, BLOCK_K), n)
    k["project"][grid](
        weight,
        ids,
        hidden,
        out,
        kk,
        weight.shape[1],
        weight.stride(0),
        ids.stride(0),
        hidden.stride(0),
        out.stride(0),
        BLOCK_K=BLOCK_K,
        BLOCK_H=BLOCK_H,
    )
    return out


def _launch_argmax(weight: torch.Tensor, ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    _check_shapes(weight, ids, hidden)
    k = _kernels()
    n, kk = ids.shape
    ids = ids.contiguous()
    hidden = hidden.contiguous()
    n_blocks = k["triton"].cdiv(kk, BLOCK_K)
    pmax = torch.empty(n, n_blocks, dtype=torch.float32, device=weight.device)
    ppos = torch.empty(n, n_blocks, dtype=torch.int32, device=weight.device)
    k["argmax"][(n_blocks, n)](
        weight,
        ids,
        hidden,
        pmax,
        ppos,
        kk,
        weight.shape[1],
        n_blocks,
        weight.stride(0),
        ids.stride(0),
        hidden.stride(0),
        BLOCK_K=BLOCK_K,
        BLOCK_H=BLOCK_H,
    )
    block = pmax.argmax(dim=1, keepdim=True)  # [N, 1] first block with the global max
    pos = ppos.gather(1, block).to(torch.int64)  # [N, 1]
    return ids.gather(1, pos).squeeze(1)
