"""The fitted engine overheads: the shipped file, its round trip, and what ``python -m sim`` adds with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from presets.hardware import HARDWARE
from sim import kernels
from sim.cli import main as sim_main
from sim.engine_overheads import (OVERHEADS_FILE, FittedOverhead, WithEngineOverhead, load_overheads, table_sha256,
                                  with_fitted_overhead, write_overheads)
from sim.published import PUBLISHED_FILE
from sim.stepcost import EngineOverheads, EngineRoundOverhead, GpuSetup, build_step_cost
from sim.tree_cli import main as tree_main
from sim.validate import main as validate_main

HAS_KERNELS = kernels.kernels_unavailable() is None


def test_the_shipped_overheads_were_fitted_on_the_shipped_table() -> None:
    """An edited published table without ``python -m sim validate --write-overheads`` fails here."""
    shipped = load_overheads()
    assert set(shipped) == {"kernels", "roofline"}
    assert {f.table_sha256 for f in shipped.values()} == {table_sha256(PUBLISHED_FILE)}
    assert all(f.fit_rows > 0 and f.leave_one_out_error is not None for f in shipped.values())


@pytest.mark.parametrize("fitted", [0.25, EngineRoundOverhead(0.1, 0.8, 0.02),
                                    EngineOverheads(0.08, (("sglang", 0.6), ("sglang tree", 1.6), ("trtllm", 0.2)))],
                         ids=["per-step", "per-round", "per-engine"])
def test_write_and_load_round_trip(tmp_path: Path, fitted: float | EngineRoundOverhead | EngineOverheads) -> None:
    records = {s: FittedOverhead.of(s, "a model", fitted, fit_rows=7, leave_one_out_error=0.05, held_out_error=None,
                                    table_sha256="ab") for s in ("kernels", "roofline")}
    path = tmp_path / "o.toml"
    write_overheads(path, records)
    assert load_overheads(path) == records


def test_what_a_round_pays_per_engine() -> None:
    f = FittedOverhead.of("kernels", "m", EngineOverheads(0.1, (("sglang", 0.6), ("sglang tree", 1.6))))
    assert f.for_engine("sglang") == EngineRoundOverhead(0.1, 0.6)
    assert f.for_engine("sglang", tree=True) == EngineRoundOverhead(0.1, 1.6)
    assert f.for_engine("vllm") == EngineRoundOverhead(0.1, 0.0) and not f.names_engine("vllm")
    every = FittedOverhead.of("roofline", "m", EngineRoundOverhead(0.04, 0.8))
    assert every.for_engine("vllm") == EngineRoundOverhead(0.04, 0.8) and every.names_engine("vllm")


def test_a_bad_file_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "o.toml"
    bad.write_text("[kernels]\nmodel = 'x'\n")
    with pytest.raises(ValueError, match=r"^engine overheads .*o\.toml: .*rewrite it with python -m sim validate"):
        load_overheads(bad)


def test_the_overhead_is_added_to_the_round_only(model_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "o.toml"
    write_overheads(path, {s: FittedOverhead.of(s, "per engine", EngineOverheads(0.1, (("sglang", 0.6),)),
                                                fit_rows=9, held_out_error=0.03) for s in ("kernels", "roofline")})
    cost = build_step_cost(str(model_dir), "eagle3", GpuSetup(HARDWARE["l4"], "sglang"), "roofline")
    paid = with_fitted_overhead(cost, "sglang", path=path)
    assert isinstance(paid, WithEngineOverhead)
    assert paid.round_overhead_ms(3) == pytest.approx(cost.round_overhead_ms(3) + 3 * 0.1 + 0.6)
    assert (paid.target_step_ms(512), paid.draft_step_ms(512), paid.verify_ms(4, 512)) == (
        cost.target_step_ms(512), cost.draft_step_ms(512), cost.verify_ms(4, 512))
    assert "0.10 ms per draft step + 0.60 ms per round (sglang, roofline source" in paid.describe()["engine_overhead"]
    other = with_fitted_overhead(cost, "vllm", path=path)
    assert other.round_overhead_ms(3) == pytest.approx(0.3)
    assert "no fitted row ran on vllm, so no per-round term of its own" in other.line()


def _round_ms(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[float, dict]:
    assert sim_main([*args, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    return doc["rows"][0]["round_time_ms"], doc


@pytest.mark.parametrize("with_kernels", [False, True], ids=["extra-absent", "extra-present"])
def test_the_cli_adds_the_shipped_overhead_and_says_so(model_dir: Path, with_kernels: bool,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A chain on an H100 in SGLang: the round grows by exactly γ · per step + SGLang's per-round term of the source
    that priced the target, the output names it; ``--engine-overhead none`` leaves it out."""
    if with_kernels and not HAS_KERNELS:
        pytest.skip("aiconfigurator-core (the costs extra) not installed")
    if not with_kernels:
        monkeypatch.setattr(kernels, "kernels_unavailable", lambda: "aiconfigurator-core==0.12.0 is not installed")
        monkeypatch.setattr(kernels, "package_dir", lambda: None)
    args = ["--target", str(model_dir), "--draft", "eagle3", "--hardware", "h100-sxm", "--engine", "sglang",
            "--tau", "2.9", "--gamma", "3"]
    paid, doc = _round_ms(args, capsys)
    bare, bare_doc = _round_ms([*args, "--engine-overhead", "none"], capsys)
    source = "kernels" if with_kernels else "roofline"
    expected = load_overheads(OVERHEADS_FILE)[source].for_engine("sglang").round_ms(3)
    assert expected > 0 and paid - bare == pytest.approx(expected, abs=1e-3)
    assert any(line.startswith("engine overhead: ") and f"(sglang, {source} source;" in line
               for line in doc["cost_source"])
    assert not any(line.startswith("engine overhead") for line in bare_doc["cost_source"])


def test_trees_take_no_engine_overhead_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """``sim tree`` prices a round's steps apart; the chain's fitted overhead is not offered there."""
    with pytest.raises(SystemExit) as exit_:
        tree_main(["--preset", "llama3-1b-3b", "--engine-overhead", "none"])
    assert exit_.value.code == 2
    assert "--engine-overhead" in capsys.readouterr().err


def test_validate_writes_what_it_adopted(tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """On a small table: the file names the adopted model per source and the table it came from."""
    row = '''
[[result]]
id = "r{i}"
target = "{target}"
draft_kind = "eagle3"
hardware = "l4"
engine = "sglang"
batch = 1
gamma = {g}
acceptance = 2.4
acceptance_kind = "tau_incl_bonus"
speedup = {s}
speedup_metric = "throughput"
source = "a test"
cells = "written by the test"
'''
    table = tmp_path / "t.toml"
    table.write_text("".join(row.format(i=i, target=model_dir, g=g, s=s)
                             for i, (g, s) in enumerate([(2, 1.8), (3, 1.9), (4, 1.7), (5, 1.6), (3, 2.0), (2, 1.5)])))
    out = tmp_path / "o.toml"
    assert validate_main(["--table", str(table), "--write-overheads", str(out)]) == 0
    text = capsys.readouterr().out
    written = load_overheads(out)
    adopted = text.split("held-out rows are not consulted: ")[-1].split(";")[:2]
    assert [f"{s} {written[s].model}" for s in ("kernels", "roofline")] == [a.strip() for a in adopted]
    assert written["kernels"].table_sha256 == table_sha256(table)
    assert f"engine overheads written to {out}" in text
