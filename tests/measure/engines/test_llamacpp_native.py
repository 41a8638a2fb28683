"""llama.cpp as its users run it (measure/engines/llamacpp_native/): the build's cache key and layout, the check
before trusting a build (a variant that crashes is never used), the worker process and the reference process
(a user's own llama-cpp-python) and what happens when one dies.

The crash tests are real crashes: a CPU backend variant that dies when llama.cpp starts it (a small library
compiled here, scored best by llama.cpp's own scoring) is tried first and never selected, and ``SPECSCOPE_LLAMACPP_FAULT`` makes the worker read address 0 inside native code (SIGSEGV), the
way the miscompiled llama.cpp did; a sweep whose worker dies so ends ``interrupted`` in one line naming the cell
and the signal, keeps its finished visits and resumes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from measure.engines.llamacpp_native import build as B
from measure.engines.llamacpp_native import probe as P

ROOT = Path(__file__).resolve().parents[3]
INSTALLED = B.installed_build()
needs_build = pytest.mark.skipif(INSTALLED is None, reason="no specscope llama.cpp build installed "
                                 "(python -m measure build-llamacpp; `make venv` runs it)")


# -- the build: key, layout, bad input (no compiling) ---------------------------------------------------
def test_build_key_names_version_kind_and_changes_with_every_flag():
    a = B.BuildSpec(kind="portable", compiler="gcc 12")
    assert a.key.startswith(f"{B.VERSION}-portable-") and a.key == B.BuildSpec(kind="portable", compiler="gcc 12").key
    others = {B.BuildSpec(kind="native", compiler="gcc 12").key, B.BuildSpec(kind="portable", compiler="gcc 13").key,
              B.BuildSpec(kind="portable", extra_flags=("-DGGML_LTO=ON",), compiler="gcc 12").key}
    assert a.key not in others and len(others) == 3
    assert "-DGGML_NATIVE=OFF" in a.flags and "-DGGML_CPU_ALL_VARIANTS=ON" in a.flags and "-DGGML_BACKEND_DL=ON" in a.flags
    with pytest.raises(ValueError, match=r"^--kind 'fast': unknown; valid: portable, native, cuda$"):
        B.BuildSpec(kind="fast")


def test_native_links_its_cpu_backend_and_portable_loads_variants():
    # llama.cpp's CMake refuses GGML_NATIVE with GGML_BACKEND_DL (and GGML_BACKEND_DIR without it)
    native, portable = B.BuildSpec(kind="native").flags, B.BuildSpec(kind="portable").flags
    assert "-DGGML_NATIVE=ON" in native and "-DGGML_BACKEND_DL=OFF" in native and "-DGGML_BACKEND_DL=ON" not in native
    assert not B.BuildSpec(kind="native").dynamic_backends and B.BuildSpec(kind="cuda").dynamic_backends
    assert "-DGGML_BACKEND_DL=ON" in portable and "-DGGML_CPU_ALL_VARIANTS=ON" in portable


def test_only_the_listed_cpu_variants_are_built(tmp_path):
    lines = [f"        ggml_add_cpu_backend_variant({v}  SSE42)\n" for v in B._ALL_X86_VARIANTS]
    arm = "            ggml_add_cpu_backend_variant(armv8.2_1    DOTPROD)\n"
    f = tmp_path / "CMakeLists.txt"
    f.write_text("if (x86)\n" + "".join(lines) + arm + "endif()\n")
    B._keep_variants(f)
    text = f.read_text()
    for v in B._ALL_X86_VARIANTS:
        built = f"\n        ggml_add_cpu_backend_variant({v} " in text
        assert built == (v in B.X86_VARIANTS), v
    assert arm in text  # other architectures untouched
    f.write_text("".join(ln for ln in lines if "zen4" not in ln))
    with pytest.raises(RuntimeError, match=r"no CPU variant\(s\) \['zen4'\] to build"):
        B._keep_variants(f)


def test_a_tool_without_a_build_names_the_build_command(monkeypatch):
    monkeypatch.setattr(B, "installed_build", lambda: None)
    with pytest.raises(ValueError, match=r"llama-server is not built here; .*python -m measure build-llamacpp$"):
        B.tool_path("llama-server")
    with pytest.raises(ValueError, match="valid: llama-server, llama-bench"):
        B.tool_path("llama-cli")


def test_the_reference_counts_what_the_library_drafted_and_emitted():
    from measure.engines.llamacpp_native.reference import accepted_of

    # prompt of 5 tokens; a proposal made at length 6 (after the first emitted token) and at length 9
    out = [10, 11, 12, 13, 99, 15, 16]
    calls = [(6, [11, 12, 13, 14]), (9, [5]), (11, [1, 2])]  # 3 of 4 match, 0 of 1, the last after the end
    assert accepted_of(5, out, calls) == 3


def test_unknown_operations_and_processes_are_one_line_errors():
    from measure.engines.llamacpp_native.client import LlamaCppWorker
    from measure.engines.llamacpp_native.reference import Reference

    with pytest.raises(ValueError, match="llama.cpp reference: unknown operation 'forward'"):
        Reference(quiet=True).dispatch("forward", {})  # our contexts are never in the reference process
    with pytest.raises(ValueError, match="module 'server': valid: worker, reference"):
        LlamaCppWorker(module="server")


def test_outcomes_name_the_signal():
    assert P.outcome_of(0) == "ok" and P.outcome_of(-11) == "SIGSEGV" and P.outcome_of(-4) == "SIGILL"
    assert P.outcome_of(1, "x\nValueError: bad file\n") == "exit 1: ValueError: bad file"


@needs_build
def test_the_installed_build_is_complete_and_its_tools_exist():
    b = INSTALLED
    assert b.kind in B.KINDS and (b.root / "build.json").is_file() and b.key == b.root.name
    for t in B.TOOLS:
        assert B.tool_path(t) == b.tool(t) and os.access(b.tool(t), os.X_OK)
    assert {v.name for v in b.variants()} >= {"libggml-cpu-x64.so"} or b.kind == "native"
    assert not list(b.bin_dir.glob("libggml-cpu*.so"))  # no tool finds a CPU backend next to itself, unchecked
    sel = P.Selection.read(b.backends_dir / "selected.json")
    assert sel is not None and (b.backends_dir / sel.variant).resolve() == (b.variants_dir / sel.variant).resolve()
    assert [p.name for p in b.backends_dir.glob("libggml-cpu*.so")] == [sel.variant]  # the one checked variant
    assert sel.cpu_key == P.cpu_identity()[1] and ("ok" in dict(sel.tried).values())


# -- the check before trusting ------------------------------------------------------------------------
@pytest.mark.slow
@needs_build
def test_the_check_decode_runs_the_selected_variant():
    sel = P.Selection.read(INSTALLED.backends_dir / "selected.json")
    res = P.check_decode(P.default_check_model(), variant=INSTALLED.variants_dir / sel.variant)
    assert res.ok and len(res.tokens) == P.CHECK_TOKENS and res.cpu_backend == sel.variant
    assert "CPU :" in res.system_info


#: A CPU backend that llama.cpp scores best for any CPU and that dies of a segmentation fault when it starts: what
#: a variant miscompiled for this machine (or for an instruction set its hypervisor does not really give) does.
CRASHING_VARIANT_C = """
int ggml_backend_score(void) { return 100000; }
void *ggml_backend_init(void) { volatile int *p = 0; return (void *)(long)*p; }
"""


@pytest.mark.slow
@needs_build
def test_a_variant_that_crashes_in_its_check_decode_is_never_selected(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the crashing variant")
    b = B.Build(tmp_path, INSTALLED.version, INSTALLED.kind, "test-build", INSTALLED.flags, "", "", 0.0)
    b.variants_dir.mkdir()
    b.backends_dir.mkdir()
    (tmp_path / "crash.c").write_text(CRASHING_VARIANT_C)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(b.variants_dir / "libggml-cpu-crashy.so"),
                    str(tmp_path / "crash.c")], check=True)
    chosen = P.Selection.read(INSTALLED.backends_dir / "selected.json").variant  # what this machine runs
    (b.variants_dir / chosen).symlink_to(INSTALLED.variants_dir / chosen)
    # llama.cpp's own scores rank the crashing variant first, as on the Xeon where the native build crashed
    scores = P.variant_scores(b.variants())
    assert scores["libggml-cpu-crashy.so"] > scores[chosen] > 0
    sel = P.select_variant(b, P.default_check_model())
    assert sel.tried[0] == ("libggml-cpu-crashy.so", "SIGSEGV") and sel.tried[1] == (chosen, "ok")
    assert sel.variant == chosen
    assert [p.name for p in b.backends_dir.glob("libggml-cpu*.so")] == [chosen]  # the crashing one is never linked
    assert P.select_variant(b) == sel  # kept for this CPU: no second check
    (b.variants_dir / chosen).unlink()
    with pytest.raises(RuntimeError) as e:
        P.select_variant(b, P.default_check_model(), force=True)
    msg = str(e.value)
    assert "no CPU variant" in msg and "libggml-cpu-crashy.so: SIGSEGV" in msg and "\n" not in msg
    assert "python -m measure build-llamacpp --force" in msg


# -- the worker -----------------------------------------------------------------------------------------
@pytest.mark.slow
@needs_build
def test_a_native_crash_in_the_worker_is_one_error_naming_the_signal(monkeypatch):
    from measure.seam import EngineOptions
    from measure.engines.llamacpp import make_engine
    from measure.engines.llamacpp_native.client import WorkerDied
    from measure.records import RunInterrupted

    monkeypatch.setenv("SPECSCOPE_LLAMACPP_FAULT", "argmax:3")
    engine = make_engine(EngineOptions(threads=1, quiet=True, max_len_tokens=128))
    target = engine.load_target("smollm2-135m")
    ids = engine.encode(target, "Hello", 64)
    dec = target.new_decoder()
    dec.forward_argmax(ids, last_only=True)
    dec.forward_argmax(ids[:, -1:], last_only=True)
    with pytest.raises(WorkerDied) as e:
        dec.forward_argmax(ids[:, -1:], last_only=True)
    assert isinstance(e.value, RunInterrupted) and e.value.outcome == "SIGSEGV" and e.value.op == "argmax"
    assert "died (SIGSEGV) during 'argmax'" in str(e.value) and not engine.worker.alive
    with pytest.raises(RuntimeError, match="was closed"):
        engine.worker.call("hello")


@pytest.mark.slow
@needs_build
def test_worker_errors_come_back_as_one_line_errors():
    from measure.engines.llamacpp_native.client import LlamaCppWorker

    w = LlamaCppWorker(quiet=True)
    try:
        assert w.hello["torch_loaded"] is False and w.hello["pid"] == w.pid
        with pytest.raises(ValueError, match="unknown operation 'nosuch'"):
            w.call("nosuch")
        with pytest.raises(ValueError, match="could not load"):
            w.call("load", path=str(ROOT / "README.md"), gpu_layers=0)
        assert w.call("hello")["pid"] == w.pid  # still serving after errors
    finally:
        w.close()
    assert not w.alive


@pytest.mark.slow
@needs_build
def test_a_sweep_whose_worker_crashes_is_interrupted_keeps_its_visits_and_resumes(tmp_path):
    out = tmp_path / "run"
    # short prompts and outputs, no peer: what is tested is the crash, the kept visit and the resume, not a speed
    cmd = [sys.executable, "-m", "measure", "--engine", "llamacpp", "--draft", "ngram:2:first", "--gamma", "2",
           "--domains", "code", "--prompts", "2", "--max-new-tokens", "6", "--max-prompt-tokens", "48", "--no-peer",
           "--repeats", "1", "--threads", "1", "--no-cost", "--no-traces", "--no-system-check", "--quiet",
           "--no-progress", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # llama-cpp-python's plain Llama.generate (the reference process's "plain") runs once in the warm-up and once
    # per visit: the 3rd dies in visit 2
    crash = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                           env={**env, "SPECSCOPE_LLAMACPP_FAULT": "plain:3"})
    err = [ln for ln in crash.stderr.splitlines() if ln.strip()]
    assert crash.returncode == 1 and "Traceback" not in crash.stderr, crash.stderr[-3000:]
    assert err[-1].startswith("python -m measure: interrupted: the llama.cpp reference process"), err[-3:]
    assert "(SIGSEGV)" in err[-1] and "cell draft=ngram:2:first|gamma=fixed:2|temp=0|domain=code" in err[-1]
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "interrupted" and "SIGSEGV" in meta["interruption"]
    staged = (out / "visits.partial.jsonl").read_text().splitlines()
    assert len(staged) == 1  # the first visit was kept
    ok = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert ok.returncode == 0, ok.stderr[-3000:]
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "complete" and meta["n_finished_cells"] == 1
    import pandas as pd

    gens = pd.read_csv(out / "generations.csv")
    assert len(gens[gens["mode"] == "baseline"]) == 2  # the kept visit and the re-measured one
