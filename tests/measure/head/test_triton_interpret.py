"""The Triton kernels of measure.head.triton_head run in Triton's interpreter on CPU.

``TRITON_INTERPRET=1`` makes ``@triton.jit`` build interpreted kernels that run
on CPU tensors with numpy, so the kernels' semantics (indexing, masking of the
partial K and H blocks, the strided row gather, dtype conversion, the argmax
tie rule) are checked against the torch reference without a GPU. A second
subprocess compiles the real kernels for sm_80/sm_90 down to cubin (Triton ships
ptxas; no GPU needed) without running them. Speed and execution on a GPU are
the ``gpu`` tests in tests/measure/head/test_pruned_head.py.

The variable is read when a kernel is decorated, so the kernels run in one
subprocess (this file run as a script, ``TRITON_INTERPRET=1`` in its
environment); the pytest process never builds interpreted kernels and
``triton_available()`` stays ``False`` on CPU. Skipped when triton is not
installed (``pip install -e '.[kernels]'``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
# find_spec, not importorskip: the pytest process itself never imports triton
needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton not installed (pip install -e '.[kernels]')"
)

# (N, K, H): K = 1; K and H not multiples of BLOCK_K = 32 / BLOCK_H = 128; exact
# multiples; several K blocks with a partial last one; H = 1.
SHAPES = [(1, 1, 64), (2, 77, 100), (3, 32, 128), (2, 65, 300), (1, 5, 1)]
DTYPES = ["float32", "bfloat16"]
PROJECT_CASES = [f"project-{d}-{n}x{k}x{h}" for d in DTYPES for (n, k, h) in SHAPES]
ARGMAX_CASES = [f"argmax-{d}-{n}x{k}x{h}" for d in DTYPES for (n, k, h) in SHAPES]
EXTRA_CASES = ["strided", "mixed_dtype", "ties"]


# ---- the worker: runs in the subprocess with TRITON_INTERPRET=1 -----------------------
def _run_cases() -> dict[str, str]:
    """``{case: "ok" | error text}`` for every case."""
    import torch

    from measure.head import triton_head as th
    from measure.head.pruned_head import torch_gather_project

    th.patch_interpreter_index()
    kernels = th._kernels()
    assert type(kernels["project"]).__name__ == "InterpretedFunction", type(kernels["project"])
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    v = 500

    def data(seed, n, k, h, dtype):
        g = torch.Generator().manual_seed(seed)
        w = torch.randn(v, h, generator=g).to(dtype)
        x = torch.randn(n, h, generator=g).to(dtype)
        ids = torch.stack([torch.randperm(v, generator=g)[:k] for _ in range(n)])
        return w, ids, x

    def first_argmax(ids, logits):
        return ids.gather(1, logits.argmax(1, keepdim=True)).squeeze(1)

    def check_project(w, ids, x):
        got = th._launch_project(w, ids, x)
        assert got.dtype == torch.float32 and got.shape == ids.shape, (got.dtype, got.shape)
        h = w.shape[1]
        ref32 = torch_gather_project(w.float(), ids, x.float())  # same float32 math
        torch.testing.assert_close(got, ref32, rtol=1e-5, atol=1e-5 * h**0.5)
        ref = torch_gather_project(w, ids, x)  # the CPU path, in the weight's dtype
        torch.testing.assert_close(got, ref, rtol=2e-2, atol=2e-2 * h**0.5)
        return got

    def check_argmax(w, ids, x):
        logits = th._launch_project(w, ids, x)
        am = th._launch_argmax(w, ids, x)
        assert am.dtype == ids.dtype and am.shape == (ids.shape[0],), (am.dtype, am.shape)
        assert torch.equal(am, first_argmax(ids, logits)), (am, first_argmax(ids, logits))
        ref = torch_gather_project(w.float(), ids, x.float())
        top2 = ref.topk(min(2, ref.shape[1]), dim=1).values
        clear = (top2[:, 0] - top2[:, -1] > 1e-3) | (ref.shape[1] == 1)  # rows not decided by rounding
        assert torch.equal(am[clear], first_argmax(ids, ref)[clear])

    def strided():
        # weight: column slice of a wider matrix (row stride 200 != H); ids and hidden non-contiguous
        w_big, _, _ = data(1, 1, 1, 200, torch.float32)
        w = w_big[:, :100]
        _, ids_t, x_t = data(2, 70, 3, 100, torch.float32)
        ids, x = ids_t.t(), torch.randn(100, 3, generator=torch.Generator().manual_seed(3)).t()
        assert w.stride(0) == 200 and not ids.is_contiguous() and not x.is_contiguous()
        check_project(w, ids, x)
        check_argmax(w, ids, x)

    def mixed_dtype():
        w, ids, x = data(4, 2, 40, 130, torch.float32)
        got = th._launch_project(w, ids, x.to(torch.bfloat16))
        torch.testing.assert_close(got, torch_gather_project(w, ids, x.to(torch.bfloat16).float()))
        w, ids, x = data(5, 2, 40, 130, torch.bfloat16)
        got = th._launch_project(w, ids, x.float())  # float32 hidden is not rounded to bf16 in the kernel
        torch.testing.assert_close(got, torch_gather_project(w.float(), ids, x.float()), rtol=1e-5, atol=1e-4)

    def ties():
        # identical rows for distinct ids at K positions 40, 3 (block 0) and 70: the first position wins
        w, ids, x = data(6, 2, 100, 64, torch.float32)
        x = x.abs()
        for row in range(2):
            for p in (40, 3, 70):
                w[ids[row, p]] = 10.0  # far above every random logit
        am = th._launch_argmax(w, ids, x)
        assert torch.equal(am, ids[:, 3]), (am, ids[:, 3])
        # tie across blocks only: positions 33 and 97 (blocks 1 and 3) -> 33
        w, ids, x = data(7, 1, 100, 64, torch.float32)
        x = x.abs()
        w[ids[0, 97]] = 10.0
        w[ids[0, 33]] = 10.0
        assert torch.equal(th._launch_argmax(w, ids, x), ids[:, 33])
        # all logits equal (zero hidden state): position 0, as torch.argmax
        w, ids, x = data(8, 3, 77, 100, torch.bfloat16)
        assert torch.equal(th._launch_argmax(w, ids, torch.zeros_like(x)), ids[:, 0])

    results: dict[str, str] = {}

    def record(name, fn):
        try:
            fn()
            results[name] = "ok"
        except Exception as e:  # report every case, not just the first failure
            results[name] = f"{type(e).__name__}: {e}"

    for d in DTYPES:
        for seed, (n, k, h) in enumerate(SHAPES):
            record(f"project-{d}-{n}x{k}x{h}", lambda a=(seed, n, k, h, dtypes[d]): check_project(*data(*a)))
            record(f"argmax-{d}-{n}x{k}x{h}", lambda a=(seed, n, k, h, dtypes[d]): check_argmax(*data(*a)))
    record("strided", strided)
    record("mixed_dtype", mixed_dtype)
    record("ties", ties)
    return results


# ---- the worker for the ahead-of-time compile check (TRITON_INTERPRET unset) ------------
COMPILE_TARGETS = [80, 90]  # A100, H100/H200
COMPILE_CASES = [
    f"compile-{name}-{wdt}-sm{cc}" for name in ("project", "argmax") for wdt in ("fp32", "bf16") for cc in COMPILE_TARGETS
]


def _compile_cases() -> dict[str, str]:
    """Compile both kernels for CUDA targets down to cubin (ptxas ships with triton; no GPU needed)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from measure.head import triton_head as th

    kernels = th._kernels()
    assert type(kernels["project"]).__name__ == "JITFunction", type(kernels["project"])
    common = {"K": "i32", "H": "i32"}
    results: dict[str, str] = {}
    for name in ("project", "argmax"):
        for wdt in ("fp32", "bf16"):
            ptrs = {"w_ptr": f"*{wdt}", "ids_ptr": "*i64", "h_ptr": f"*{wdt}"}
            if name == "project":
                sig = {**ptrs, "out_ptr": "*fp32", **common, "stride_wv": "i32", "stride_idn": "i32",
                       "stride_hn": "i32", "stride_on": "i32"}
            else:
                sig = {**ptrs, "pmax_ptr": "*fp32", "ppos_ptr": "*i32", **common, "n_blocks": "i32",
                       "stride_wv": "i32", "stride_idn": "i32", "stride_hn": "i32"}
            sig |= {"BLOCK_K": "constexpr", "BLOCK_H": "constexpr"}
            for cc in COMPILE_TARGETS:
                case = f"compile-{name}-{wdt}-sm{cc}"
                try:
                    src = ASTSource(kernels[name], sig, constexprs={"BLOCK_K": th.BLOCK_K, "BLOCK_H": th.BLOCK_H})
                    compiled = triton.compile(src, target=GPUTarget("cuda", cc, 32))
                    assert len(compiled.asm["cubin"]) > 0 and ".entry" in compiled.asm["ptx"]
                    results[case] = "ok"
                except Exception as e:
                    results[case] = f"{type(e).__name__}: {e}"
    return results


# ---- the pytest side --------------------------------------------------------------------
def _worker(mode: str, cache_dir: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_CACHE_DIR": str(cache_dir)}
    env.pop("TRITON_INTERPRET", None)
    if mode == "interpret":
        env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), mode],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        pytest.fail(f"{mode} worker failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict[str, str]:
    return _worker("interpret", tmp_path_factory.mktemp("triton_cache"))


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict[str, str]:
    return _worker("compile", tmp_path_factory.mktemp("triton_cache"))


@needs_triton
@pytest.mark.parametrize("case", PROJECT_CASES + ARGMAX_CASES + EXTRA_CASES)
def test_interpreted_kernels_match_torch_reference(interpreted, case):
    # project / argmax over dtypes × shapes, plus strided rows, mixed dtypes and argmax ties
    assert interpreted[case] == "ok", interpreted[case]


@needs_triton
@pytest.mark.parametrize("case", COMPILE_CASES)
@pytest.mark.slow
def test_kernels_compile_to_cubin_for_cuda_targets(compiled, case):
    # the real GPU code path down to ptxas (not run): the shared helper, types and masks lower for sm_80/sm_90
    assert compiled[case] == "ok", compiled[case]


@needs_triton
def test_interpreter_is_not_a_cpu_dispatch_path():
    import torch

    from measure.head.triton_head import triton_available

    if torch.cuda.is_available():
        pytest.skip("CPU-only check")
    assert triton_available() is False  # with triton installed, and whatever TRITON_INTERPRET says


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "interpret"
    if mode == "interpret":
        if os.environ.get("TRITON_INTERPRET") != "1":
            sys.exit("run with TRITON_INTERPRET=1 (read when triton builds the kernels)")
        print(json.dumps(_run_cases()))
    elif mode == "compile":
        if os.environ.get("TRITON_INTERPRET") == "1":
            sys.exit("run without TRITON_INTERPRET=1 to compile the real kernels")
        print(json.dumps(_compile_cases()))
    else:
        sys.exit(f"usage: {sys.argv[0]} [interpret|compile]")
