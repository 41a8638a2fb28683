"""Check a llama.cpp build before trusting it: a tiny decode in a child process, per CPU variant, best first.

A llama.cpp compiled for the wrong CPU does not fail politely: it segfaults
(or dies of SIGILL) in its first ``llama_decode``, taking down whatever
process loaded it. So before the llama.cpp engine loads a model, a child
process loads the model and greedily decodes a few tokens:

* for a build of :mod:`measure.engines.llamacpp_native.build`, once per CPU
  backend variant, in the order of llama.cpp's own score for this CPU (the
  variant it would pick first). The first variant that decodes is linked
  into the build's ``backends/`` (its compiled-in ``GGML_BACKEND_DIR``, the
  only place the tools and the bindings load a CPU backend from) and
  recorded in ``backends/selected.json`` with every variant tried and how it
  ended (``ok``, ``SIGSEGV`` …). A variant that crashes is never used. The
  selection is kept until the build runs on a CPU with another model name or
  feature list.
* for any other installed llama-cpp-python (e.g. one pip compiled natively),
  once per library file and CPU (``probes.json`` in the cache); a crash stops
  the run with one line naming the signal and the rebuild command.

``python -m measure.engines.llamacpp_native.probe decode --model FILE [--variant LIB]``
is the child (it prints one JSON line); ``... scores LIB...`` prints each
variant's score from llama.cpp's own ``ggml_backend_score``.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from measure.engines.gguf_files import PACKAGED
from measure.engines.llamacpp_native.build import BUILD_COMMAND, Build, bindings_lib_dir, cache_dir, installed_build
from toolkit.cli import OneLineParser, int_arg

#: Tokens the check decodes greedily after a short prompt.
CHECK_TOKENS = 8
CHECK_PROMPT = "The capital of France is"
DECODE_TIMEOUT_S = 300.0
SCORE_TIMEOUT_S = 60.0


class LibraryCrashed(RuntimeError):
    """The installed llama.cpp crashed in the check decode (one line: the signal and the rebuild command)."""


def cpu_identity() -> tuple[str, str]:
    """(the CPU's model name, a hash of it and its feature flags): what a variant's check is valid for."""
    name, flags = "unknown CPU", ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and name == "unknown CPU":
                    name = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = " ".join(sorted(value.split()))
                if name != "unknown CPU" and flags:
                    break
    except OSError:
        pass
    return name, hashlib.sha256(f"{name}\n{flags}".encode()).hexdigest()[:16]


def outcome_of(returncode: int, stderr: str = "") -> str:
    """``ok``, ``SIGSEGV`` (killed by a signal) or ``exit N: <last line>``."""
    if returncode == 0:
        return "ok"
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    last = (stderr.strip().splitlines() or [""])[-1][:200]
    return f"exit {returncode}: {last}"


@dataclass(frozen=True)
class CheckResult:
    """One check decode: how it ended, and what the child reported when it ran."""

    outcome: str
    tokens: tuple[int, ...] = ()
    system_info: str = ""
    cpu_backend: str | None = None

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"


def check_decode(model: Path, variant: Path | None = None, threads: int | None = None) -> CheckResult:
    """Run the check decode of ``model`` in a child process (with only ``variant`` as CPU backend, if given)."""
    cmd = [sys.executable, "-m", "measure.engines.llamacpp_native.probe", "decode", "--model", str(model)]
    if variant is not None:
        cmd += ["--variant", str(variant)]
    if threads:
        cmd += ["--threads", str(threads)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=DECODE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return CheckResult(f"no answer in {DECODE_TIMEOUT_S:.0f} s")
    out = outcome_of(r.returncode, r.stderr)
    if out != "ok":
        return CheckResult(out)
    try:
        data = json.loads(r.stdout.strip().splitlines()[-1])
        return CheckResult("ok", tuple(int(t) for t in data["tokens"]), str(data["system_info"]),
                           data.get("cpu_backend"))
    except (ValueError, KeyError, IndexError, TypeError):
        return CheckResult(f"exit 0 without a result: {r.stdout.strip()[-200:]!r}")


def variant_scores(variants: list[Path]) -> dict[str, int]:
    """llama.cpp's own score of each CPU variant for this CPU (0: the CPU lacks its instructions).

    Asked in a child process; if that dies (a library that cannot even load here), each variant is asked
    in a child of its own and one that kills its child scores 0.
    """
    cmd = [sys.executable, "-m", "measure.engines.llamacpp_native.probe", "scores", *map(str, variants)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=SCORE_TIMEOUT_S)
        if r.returncode == 0:
            return {str(k): int(v) for k, v in json.loads(r.stdout.strip().splitlines()[-1]).items()}
    except (subprocess.TimeoutExpired, ValueError, IndexError):
        pass
    if len(variants) == 1:
        return {variants[0].name: 0}
    out: dict[str, int] = {}
    for v in variants:
        out.update(variant_scores([v]))
    return out


@dataclass(frozen=True)
class Selection:
    """The CPU variant a build runs on this machine (``backends/selected.json``)."""

    variant: str
    score: int
    cpu: str
    cpu_key: str
    tried: tuple[tuple[str, str], ...]
    model: str
    checked_utc: str
    system_info: str = ""

    def summary(self) -> str:
        tried = ", ".join(f"{v.removeprefix('libggml-cpu-').removesuffix('.so')}: {o}" for v, o in self.tried)
        return f"CPU backend {self.variant} for {self.cpu} (checked with a decode of {Path(self.model).name}; " \
               f"tried {tried})"

    def describe(self) -> dict:
        d = asdict(self)
        d["tried"] = [list(t) for t in self.tried]
        return d

    @classmethod
    def read(cls, path: Path) -> "Selection | None":
        try:
            d = json.loads(path.read_text())
            return cls(str(d["variant"]), int(d["score"]), str(d["cpu"]), str(d["cpu_key"]),
                       tuple((str(a), str(b)) for a, b in d["tried"]), str(d["model"]), str(d["checked_utc"]),
                       str(d.get("system_info", "")))
        except (OSError, ValueError, KeyError, TypeError):
            return None


def default_check_model() -> Path | None:
    """The packaged SmolLM2-135M Q4_1 (a quantised model: the kernels that crashed), if installed."""
    try:
        return PACKAGED["smollm2-135m"]()
    except ValueError:
        return None


def select_variant(b: Build, model: Path | None = None, force: bool = False) -> Selection | None:
    """The CPU variant of build ``b`` checked on this machine, checking variants best first when needed.

    None when no model is at hand to check with (the packaged SmolLM2 missing and ``model`` None): the
    engine checks again with the run's own target before loading it. ``RuntimeError`` (one line, what
    each variant did) when no variant decodes here.
    """
    cpu, key = cpu_identity()
    chosen = b.backends_dir / "selected.json"
    have = Selection.read(chosen)
    linked = not b.variants()  # a native build: its one CPU backend is linked in, nothing to choose
    if have is not None and not force and have.cpu_key == key and \
            (linked or (b.backends_dir / have.variant).exists()):
        return have
    model = model or default_check_model()
    if model is None:
        return None
    if linked:
        res = check_decode(model)
        if not res.ok:
            raise RuntimeError(f"the llama.cpp build {b.key} does not decode on this {cpu} ({res.outcome}); "
                               f"rebuild it: {BUILD_COMMAND} --kind {b.kind} --force")
        b.backends_dir.mkdir(exist_ok=True)
        sel = Selection(res.cpu_backend or "libggml-cpu.so (linked in, compiled for this CPU)", 0, cpu, key,
                        (("libggml-cpu.so", "ok"),), str(model), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        res.system_info)
        tmp = chosen.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(sel.describe(), indent=2) + "\n")
        os.replace(tmp, chosen)
        return sel
    variants = b.variants()
    scores = variant_scores(variants)
    ranked = sorted((v for v in variants if scores.get(v.name, 0) > 0), key=lambda v: -scores[v.name])
    skipped = [(v.name, "score 0 (this CPU lacks its instructions)") for v in variants if v not in ranked]
    checked: list[tuple[str, str]] = []
    for v in ranked:
        res = check_decode(model, variant=v)
        checked.append((v.name, res.outcome))
        tried = checked + skipped
        if not res.ok:
            continue
        for old in b.backends_dir.glob("libggml-cpu*.so"):
            old.unlink()
        (b.backends_dir / v.name).symlink_to(v)
        sel = Selection(v.name, scores[v.name], cpu, key, tuple(tried), str(model),
                        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), res.system_info)
        tmp = chosen.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(sel.describe(), indent=2) + "\n")
        os.replace(tmp, chosen)
        return sel
    what = "; ".join(f"{v}: {o}" for v, o in checked + skipped) or "no CPU variant built"
    raise RuntimeError(f"no CPU variant of the llama.cpp build {b.key} decodes on this {cpu} ({what}); "
                       f"rebuild it: {BUILD_COMMAND} --force")


def check_installed(model: Path) -> dict:
    """The check before the engine trusts the installed llama.cpp, cached; what ``run.json`` records of it.

    Our build: its variant selection. Any other: one check decode per library file and CPU. A crash is a
    :class:`LibraryCrashed` (one line naming the signal and the rebuild command).
    """
    b = installed_build()
    if b is not None:
        try:
            sel = select_variant(b, model)
        except RuntimeError as e:
            raise LibraryCrashed(str(e)) from None
        assert sel is not None  # a model was given
        return {"build": b.describe(), "selection": sel.describe()}
    lib = bindings_lib_dir()
    libllama = (lib / "libllama.so").resolve() if lib is not None else None
    if libllama is None or not libllama.is_file():
        raise LibraryCrashed(f"llama-cpp-python's libllama.so is missing; build llama.cpp: {BUILD_COMMAND}")
    cpu, key = cpu_identity()
    st = libllama.stat()
    entry_key = f"{libllama}|{st.st_size}|{st.st_mtime_ns}|{key}"
    store = cache_dir() / "probes.json"
    try:
        seen = json.loads(store.read_text())
    except (OSError, ValueError):
        seen = {}
    if isinstance(seen, dict) and isinstance(seen.get(entry_key), dict):
        return {"build": None, "library": str(libllama), "check": seen[entry_key]}
    res = check_decode(model)
    if not res.ok:
        raise LibraryCrashed(f"the installed llama.cpp ({libllama}) died ({res.outcome}) in a test decode of "
                             f"{model.name} on this {cpu}; rebuild it portably: {BUILD_COMMAND}")
    rec = {"outcome": res.outcome, "cpu": cpu, "model": str(model), "system_info": res.system_info,
           "checked_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    seen = seen if isinstance(seen, dict) else {}
    seen[entry_key] = rec
    store.parent.mkdir(parents=True, exist_ok=True)
    tmp = store.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(seen, indent=1))
    os.replace(tmp, store)
    return {"build": None, "library": str(libllama), "check": rec}


# -- the children -----------------------------------------------------------------------------
def _decode_child(model: str, variant: str | None, threads: int | None) -> int:
    from measure.engines.llamacpp_native.runtime import Runtime

    rt = Runtime(variant=Path(variant) if variant else None, quiet=True)
    m = rt.load_model(Path(model), gpu_layers=0)
    dec = rt.new_decoder(m, max_len_tokens=64, threads=threads or len(os.sched_getaffinity(0)))
    ids = rt.tokenize(m, CHECK_PROMPT, add_special=True, parse_special=False)
    out: list[int] = []
    nxt = dec.argmax(ids, last_only=True)
    for _ in range(CHECK_TOKENS):
        out.append(nxt[0])
        nxt = dec.argmax([nxt[0]], last_only=True)
    print(json.dumps({"tokens": out, "system_info": rt.system_info(), "cpu_backend": rt.cpu_backend()}))
    return 0


def _scores_child(paths: list[str]) -> int:
    import ctypes

    out = {}
    for p in paths:
        lib = ctypes.CDLL(p)
        fn = getattr(lib, "ggml_backend_score", None)
        if fn is None:
            out[Path(p).name] = 0
            continue
        fn.restype = ctypes.c_int
        out[Path(p).name] = int(fn())
    print(json.dumps(out))
    return 0


def main(argv: list[str] | None = None) -> int:
    """The child's command line (``decode`` or ``scores``); a bad one is one line, exit 2."""
    p = OneLineParser(prog="python -m measure.engines.llamacpp_native.probe")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("decode", help="load a model and decode a few tokens greedily; print one JSON line")
    d.add_argument("--model", required=True)
    d.add_argument("--variant", default=None, help="the only CPU backend library to load")
    d.add_argument("--threads", type=int_arg(1, 1024), default=None)
    s = sub.add_parser("scores", help="llama.cpp's score of each CPU backend library for this CPU")
    s.add_argument("libs", nargs="+")
    args = p.parse_args(argv)
    if args.cmd == "decode":
        return _decode_child(args.model, args.variant, args.threads)
    return _scores_child(args.libs)


if __name__ == "__main__":
    sys.exit(main())
