"""Build llama.cpp portably from the source llama-cpp-python pins, into a cache keyed by version and flags.

``python -m measure build-llamacpp [--kind portable|native|cuda] [--jobs N]`` (:mod:`.install`); the
compile's percentage is printed as it goes (:class:`BuildProgress`), its full output kept in ``build.log``.

pip's own build of llama-cpp-python compiles for the CPU it runs on
(``GGML_NATIVE``); such a build segfaulted on an AVX-512/AMX Xeon, and pip
keys its wheel cache on the source archive, not on the flags, so a machine
that once built natively keeps reinstalling that wheel. This module builds
instead, with CMake, the llama.cpp tree the pinned llama-cpp-python release
vendors (its source archive's ``vendor/llama.cpp``):

* ``portable`` (the default): ``GGML_BACKEND_DL`` with ``GGML_CPU_ALL_VARIANTS``:
  the CPU backend is built once per x86-64 instruction-set level (``x64`` …
  ``haswell`` … ``sapphirerapids``, ``zen4``) as its own library, and the best
  one this CPU supports is picked at run time — only after
  :mod:`measure.engines.llamacpp_native.probe` has seen it run a decode here;
* ``native``: ``GGML_NATIVE=ON``, one CPU backend for this machine only;
* ``cuda``: the portable CPU backends plus ``GGML_CUDA`` (needs the CUDA toolkit).

Layout of one build, ``<cache>/llamacpp/<version>-<kind>-<hash of the flags>/``::

    build/bin/      llama-server, llama-bench, libllama.so, libggml*.so (the CMake build tree)
    variants/       the CPU backend libraries (libggml-cpu-<level>.so), moved out of bin/ so that no
                    tool picks one by itself
    backends/       GGML_BACKEND_DIR (compiled in): the one CPU variant verified on this machine
                    (a link) and ``selected.json`` saying which, for which CPU, and what was tried
    build.json      written last: the build is complete

The llama-cpp-python Python package is installed without compiling
(``CMAKE_ARGS=-DLLAMA_BUILD=OFF``, pip's cache off so no wheel of it is
kept), and its ``llama_cpp/lib/`` links to this build's libraries, so a
plain ``Llama(...)`` in the virtualenv runs this build too.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from measure.engines.gguf_files import specscope_cache

#: The llama-cpp-python release whose vendored llama.cpp is built (pyproject.toml's pin of the bindings).
VERSION = "0.3.36"
KINDS = ("portable", "native", "cuda")
COMMON_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DGGML_BACKEND_DL=ON",
                "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF")
KIND_FLAGS = {
    "portable": ("-DGGML_NATIVE=OFF", "-DGGML_CPU_ALL_VARIANTS=ON"),
    "native": ("-DGGML_NATIVE=ON",),
    "cuda": ("-DGGML_NATIVE=OFF", "-DGGML_CPU_ALL_VARIANTS=ON", "-DGGML_CUDA=ON"),
}
#: The x86-64 CPU backend variants built. ``GGML_CPU_ALL_VARIANTS`` lists 14 (about 45 s of compiling each on
#: 2 cores); these 7 cover every x86-64 CPU: ``x64`` (any), AVX2 (``haswell``: Intel since 2013, AMD since Zen),
#: AVX-VNNI without AVX-512 (``alderlake``), AVX-512 (``skylakex``, ``icelake``; ``zen4`` adds BF16) and AMX
#: (``sapphirerapids``). A CPU whose best level is one left out (SSE4.2/AVX only) runs the best one built below it.
X86_VARIANTS = ("x64", "haswell", "alderlake", "skylakex", "icelake", "zen4", "sapphirerapids")
#: Every x86 variant the vendored llama.cpp can build (those not in :data:`X86_VARIANTS` are commented out).
_ALL_X86_VARIANTS = ("x64", "sse42", "sandybridge", "ivybridge", "piledriver", "haswell", "skylakex", "cannonlake",
                     "cascadelake", "icelake", "cooperlake", "zen4", "alderlake", "sapphirerapids")
#: What is built: the library the bindings load, and llama.cpp's own server and benchmark.
TARGETS = ("llama", "llama-server", "llama-bench")
TOOLS = ("llama-server", "llama-bench")
#: The libraries llama-cpp-python's ``llama_cpp/lib`` links to.
LIBRARIES = ("libllama.so", "libggml.so", "libggml-base.so", "libmtmd.so")
BUILD_COMMAND = "python -m measure build-llamacpp"
#: Not backend modules: the two libraries every backend links against.
_CORE_GGML = {"libggml.so", "libggml-base.so"}


def cache_dir() -> Path:
    """``$SPECSCOPE_CACHE/llamacpp`` (default ``~/.cache/specscope/llamacpp``)."""
    return specscope_cache() / "llamacpp"


def _compiler() -> str:
    """The C++ compiler CMake will use, as ``c++ --version`` names it (part of a build's key)."""
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or "c++"
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return cxx
    return (out.splitlines() or [cxx])[0].strip()


@dataclass(frozen=True)
class BuildSpec:
    """What identifies a build: the bindings' version, the kind, extra CMake flags and the compiler."""

    version: str = VERSION
    kind: str = "portable"
    extra_flags: tuple[str, ...] = ()
    compiler: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"--kind {self.kind!r}: unknown; valid: {', '.join(KINDS)}")

    @property
    def flags(self) -> tuple[str, ...]:
        """The CMake flags, GGML_BACKEND_DIR aside (it names the build's own directory)."""
        common = COMMON_FLAGS if self.dynamic_backends else tuple(
            "-DGGML_BACKEND_DL=OFF" if f == "-DGGML_BACKEND_DL=ON" else f for f in COMMON_FLAGS)
        return common + KIND_FLAGS[self.kind] + tuple(self.extra_flags)

    @property
    def dynamic_backends(self) -> bool:
        """Whether the CPU backend is loaded at run time (one library per level): not for ``native``, whose
        ``GGML_NATIVE`` llama.cpp's CMake refuses with ``GGML_BACKEND_DL`` (its CPU backend is linked in)."""
        return self.kind != "native"

    @property
    def key(self) -> str:
        parts = (self.version, *self.flags, self.compiler, *X86_VARIANTS)
        digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()
        return f"{self.version}-{self.kind}-{digest[:10]}"


@dataclass(frozen=True)
class Build:
    """A complete build in the cache (its ``build.json``)."""

    root: Path
    version: str
    kind: str
    key: str
    flags: tuple[str, ...]
    compiler: str
    built_utc: str
    build_s: float

    @property
    def bin_dir(self) -> Path:
        return self.root / "build" / "bin"

    @property
    def variants_dir(self) -> Path:
        return self.root / "variants"

    @property
    def backends_dir(self) -> Path:
        return self.root / "backends"

    def tool(self, name: str) -> Path:
        """The path of ``llama-server`` or ``llama-bench`` (``ValueError`` naming the valid ones)."""
        if name not in TOOLS:
            raise ValueError(f"llama.cpp tool {name!r}: not built; valid: {', '.join(TOOLS)}")
        return self.bin_dir / name

    def variants(self) -> list[Path]:
        """The CPU backend libraries this build loads at run time, one per instruction-set level (none for
        ``native``: its one CPU backend, compiled for this CPU, is linked in)."""
        return sorted(self.variants_dir.glob("libggml-cpu*.so"))

    def describe(self) -> dict:
        """For ``run.json``: version, kind, key, flags, compiler."""
        d = asdict(self)
        d["root"] = str(self.root)
        return d

    @classmethod
    def read(cls, root: Path) -> "Build | None":
        """The build in ``root`` if it is complete (its ``build.json`` readable), else None."""
        try:
            data = json.loads((root / "build.json").read_text())
            return cls(root=root, version=str(data["version"]), kind=str(data["kind"]), key=str(data["key"]),
                       flags=tuple(data["flags"]), compiler=str(data["compiler"]), built_utc=str(data["built_utc"]),
                       build_s=float(data["build_s"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None


def _say(msg: str) -> None:
    print(f"[llama.cpp build] {msg}", file=sys.stderr, flush=True)


def _run(cmd: list[str], log: Path, env: dict | None = None, on_line: Callable[[str], None] | None = None) -> None:
    """Run ``cmd`` with its output appended to ``log`` (``on_line`` also sees each line as it comes); a failure
    is one ``RuntimeError`` naming the log."""
    with log.open("a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        if on_line is None:
            returncode = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
        else:
            with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                                  errors="replace", bufsize=1) as proc:
                assert proc.stdout is not None
                for line in proc.stdout:
                    f.write(line)
                    f.flush()
                    on_line(line)
                returncode = proc.wait()
    if returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
        raise RuntimeError(f"{cmd[0]} failed (exit {returncode}; last line: {tail[0][:200]}); full log: {log}")


#: A build line's progress: make's ``[ 42%] Building CXX object ...`` or Ninja's ``[123/456] Building ...``.
_PROGRESS_LINE = re.compile(r"^\[\s*(?:(\d{1,3})%|(\d+)/(\d+))\]")
#: The build's progress is said at most every this many percentage points and this many seconds (the rarer).
PROGRESS_STEP_PERCENT = 10
PROGRESS_EVERY_S = 30.0


def build_percent(line: str) -> int | None:
    """The percentage a CMake build output line reports (make's ``[ 42%]``, Ninja's ``[n/m]``), else None."""
    m = _PROGRESS_LINE.match(line)
    if m is None:
        return None
    if m.group(1) is not None:
        return min(int(m.group(1)), 100)
    done, total = int(m.group(2)), int(m.group(3))
    return min(100 * done // total, 100) if total else None


@dataclass
class BuildProgress:
    """Says a build's progress from its output lines (:meth:`feed`): a line when the build has moved
    :data:`PROGRESS_STEP_PERCENT` points and :data:`PROGRESS_EVERY_S` seconds since the last one said (so at
    most one every ~10 % on a slow machine, one every 30 s on a fast one), and the 100 % line."""

    say: Callable[[str], None]
    clock: Callable[[], float] = time.monotonic
    step_percent: int = PROGRESS_STEP_PERCENT
    every_s: float = PROGRESS_EVERY_S
    started_s: float | None = None
    said_percent: int = 0
    said_s: float = 0.0

    def feed(self, line: str) -> None:
        pct = build_percent(line)
        if pct is None:
            return
        now = self.clock()
        if self.started_s is None:
            self.started_s = self.said_s = now
        due = pct - self.said_percent >= self.step_percent and now - self.said_s >= self.every_s
        if not (due or (pct == 100 and self.said_percent < 100)):
            return
        elapsed = now - self.started_s
        left = f", about {elapsed * (100 - pct) / pct / 60:.0f} min left" if 0 < pct < 100 else ""
        self.say(f"compiling: {pct}% after {elapsed / 60:.1f} min{left}")
        self.said_percent, self.said_s = pct, now


def source_dir(version: str = VERSION) -> Path:
    """llama-cpp-python's source archive, unpacked in the cache (downloaded from the package index once)."""
    src_root = cache_dir() / "src"
    src = src_root / f"llama_cpp_python-{version}"
    if (src / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
        return src
    src_root.mkdir(parents=True, exist_ok=True)
    archive = src_root / f"llama_cpp_python-{version}.tar.gz"
    if not archive.is_file():
        _say(f"downloading llama-cpp-python {version}'s source archive (about 75 MB)")
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--no-cache-dir",
              f"llama-cpp-python=={version}", "-d", str(src_root)], src_root / "download.log")
    tmp = src_root / f".unpack-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(archive) as tar:
        tar.extractall(tmp, filter="data")
    _keep_variants(tmp / src.name / "vendor" / "llama.cpp" / "ggml" / "src" / "CMakeLists.txt")
    shutil.rmtree(src, ignore_errors=True)
    (tmp / src.name).rename(src)
    shutil.rmtree(tmp, ignore_errors=True)
    return src


def _keep_variants(cmakelists: Path) -> None:
    """Comment out the x86 CPU variants not in :data:`X86_VARIANTS` in the vendored ``ggml/src/CMakeLists.txt``."""
    lines = cmakelists.read_text().splitlines(keepends=True)
    seen = set()
    for i, line in enumerate(lines):
        m = re.match(r"\s*ggml_add_cpu_backend_variant\((\w+)", line)
        if m and m.group(1) in _ALL_X86_VARIANTS:
            seen.add(m.group(1))
            if m.group(1) not in X86_VARIANTS:
                lines[i] = "# specscope: variant not built: " + line
    if not set(X86_VARIANTS) <= seen:
        raise RuntimeError(f"{cmakelists}: no CPU variant(s) {sorted(set(X86_VARIANTS) - seen)} to build; the vendored "
                           "llama.cpp changed: update X86_VARIANTS in measure/engines/llamacpp_native/build.py")
    cmakelists.write_text("".join(lines))


def build(spec: BuildSpec, jobs: int | None = None, force: bool = False) -> Build:
    """The complete build of ``spec``: from the cache, or configured, compiled and laid out now."""
    root = cache_dir() / spec.key
    done = Build.read(root)
    if done is not None and not force:
        return done
    src = source_dir(spec.version)
    root.mkdir(parents=True, exist_ok=True)
    (root / "build.json").unlink(missing_ok=True)
    log = root / "build.log"
    jobs = jobs or len(os.sched_getaffinity(0))
    t0 = time.perf_counter()
    _say(f"building llama.cpp ({spec.kind}, llama-cpp-python {spec.version}) in {root} with {jobs} jobs; "
         f"log: {log}")
    backends = root / "backends"
    _run(["cmake", "-S", str(src / "vendor" / "llama.cpp"), "-B", str(root / "build"), *spec.flags,
          *([f"-DGGML_BACKEND_DIR={backends}"] if spec.dynamic_backends else [])], log)
    _compile(root / "build", jobs, log)
    bin_dir, variants = root / "build" / "bin", root / "variants"
    variants.mkdir(exist_ok=True)
    backends.mkdir(exist_ok=True)
    for lib in sorted(bin_dir.glob("libggml-*.so")) if spec.dynamic_backends else ():  # native: linked in
        if lib.name in _CORE_GGML:
            continue
        if lib.name.startswith("libggml-cpu"):  # out of the tools' own directory: nothing picks one unchecked
            os.replace(lib, variants / lib.name)
        else:  # a GPU backend: found next to the tools and, through a link, by the bindings
            _relink(backends / lib.name, lib)
    missing = [t for t in TOOLS if not (bin_dir / t).is_file()] + [v for v in ("libllama.so",)
                                                                    if not (bin_dir / v).is_file()]
    linked_cpu = not spec.dynamic_backends and (bin_dir / "libggml-cpu.so").is_file()
    if missing or not (linked_cpu or any(variants.glob("libggml-cpu*.so"))):
        raise RuntimeError(f"the llama.cpp build in {root} lacks {', '.join(missing) or 'a CPU backend'}; "
                           f"log: {log}")
    elapsed = time.perf_counter() - t0
    info = {"version": spec.version, "kind": spec.kind, "key": spec.key, "flags": list(spec.flags),
            "compiler": spec.compiler, "built_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "build_s": round(elapsed, 1)}
    (root / "build.json").write_text(json.dumps(info, indent=2) + "\n")
    _say(f"built in {elapsed / 60:.1f} min: {', '.join(TOOLS)}, libllama.so and "
         f"{len(list(variants.glob('libggml-cpu*.so')))} CPU backend variant(s)")
    out = Build.read(root)
    assert out is not None
    return out


def _compile(build_dir: Path, jobs: int, log: Path, say: Callable[[str], None] = _say,
             clock: Callable[[], float] = time.monotonic) -> None:
    """``cmake --build`` of :data:`TARGETS` in ``build_dir``, its output in ``log`` and its percentage said as it
    goes (:class:`BuildProgress`): a first set-up on 2 cores compiles for a quarter of an hour."""
    progress = BuildProgress(say, clock)
    _run(["cmake", "--build", str(build_dir), "-j", str(jobs), "--target", *TARGETS], log, on_line=progress.feed)


def _relink(link: Path, target: Path) -> None:
    """Make ``link`` a symbolic link to ``target`` (replacing whatever is there)."""
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, link)


def bindings_lib_dir() -> Path | None:
    """``llama_cpp/lib`` of the installed llama-cpp-python (found without importing it), None if not installed."""
    importlib.invalidate_caches()
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "lib"


def install_bindings(b: Build) -> Path:
    """Install llama-cpp-python's Python package (nothing compiled, nothing cached by pip) over build ``b``."""
    src = source_dir(b.version)
    env = {**os.environ, "CMAKE_ARGS": "-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF"}
    _say(f"installing llama-cpp-python {b.version}'s Python package over this build (no compile)")
    _run([sys.executable, "-m", "pip", "install", "--no-cache-dir", "--no-deps", "--force-reinstall", str(src)],
         b.root / "install.log", env=env)
    lib = bindings_lib_dir()
    if lib is None:
        raise RuntimeError(f"llama-cpp-python did not install; log: {b.root / 'install.log'}")
    lib.mkdir(parents=True, exist_ok=True)
    for name in LIBRARIES:
        if (b.bin_dir / name).is_file():
            _relink(lib / name, b.bin_dir / name)
    return lib


def installed_build() -> Build | None:
    """The cached build the installed llama-cpp-python runs (its ``libllama.so`` links into it), else None
    (not installed, or a build of its own, e.g. pip's)."""
    lib = bindings_lib_dir()
    if lib is None or not (lib / "libllama.so").is_symlink():
        return None
    real = (lib / "libllama.so").resolve()
    if real.parent.name != "bin" or real.parent.parent.name != "build":
        return None
    return Build.read(real.parent.parent.parent)


def tool_path(name: str) -> Path:
    """``llama-server`` or ``llama-bench`` of the installed build; one-line ``ValueError`` naming the build
    command when there is none."""
    if name not in TOOLS:
        raise ValueError(f"llama.cpp tool {name!r}: unknown; valid: {', '.join(TOOLS)}")
    b = installed_build()
    if b is None or not b.tool(name).is_file():
        raise ValueError(f"{name} is not built here; build llama.cpp (about 10 min on 2 cores): {BUILD_COMMAND}")
    return b.tool(name)
