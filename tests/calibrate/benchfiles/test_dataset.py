"""Benchmark files → serving rows: the configurations' checks and the units they become."""

from __future__ import annotations

import pytest

from calibrate.benchfiles.dataset import ConfigFiles, build, parse_spec
from calibrate.benchfiles.rows import BenchFile, BenchFileError, BenchLoad, BenchRequest, SpecCounts
from measure.serve.units import LoadSpec


def _load(c: int, n: int = 8, counts: SpecCounts | None = None) -> BenchLoad:
    reqs = tuple(BenchRequest(0.5 * i, 100.0 + i, 500.0 + 10 * i, (12.0,) * 31, 40, 32) for i in range(n))
    return BenchLoad(LoadSpec(concurrency=c), reqs, 0.5 * (n - 1) + 0.57, counts, f"c{c}")


def _file(path: str, model: str | None = "m", hardware: str | None = None, counts: SpecCounts | None = None,
          loads: tuple[int, ...] = (1, 2)) -> BenchFile:
    return BenchFile(path, "vllm-bench-serve", None, None, model, hardware, tuple(_load(c, counts=counts)
                                                                                  for c in loads))


def test_parse_spec_reads_k_and_path_and_refuses_the_rest() -> None:
    assert parse_spec("k=4:runs/k4.json") == (4, "runs/k4.json")
    assert parse_spec("2:a:b.json") == (2, "a:b.json")
    for bad in ("k4.json", "k=0:x", "k=x:y", "k=4:"):
        with pytest.raises(ValueError, match="expected k=K:FILE"):
            parse_spec(bad)


def test_build_makes_one_unit_per_load_with_repeats_and_one_run_intervals() -> None:
    c = SpecCounts(40, 120, 60, (30, 20, 10), "file")
    units, reqs, steps, meta = build([(ConfigFiles(0, ("off.json",)), [_file("off.json"), _file("off2.json",
                                                                                              loads=(1,))]),
                                      (ConfigFiles(3, ("k3.json",)), [_file("k3.json", counts=c)])], None, 2)
    assert len(units) == 5 and len(reqs) == 5 * 8 and not len(steps)
    assert meta["config"]["slots"] == 2 and meta["config"]["max_new_tokens"] == 32
    off_c1 = units[(units["config"] == "off") & (units["load"] == "c1")]
    assert sorted(off_c1["repeat"]) == [0, 1]  # the same load in two files: two repeats
    one = units[(units["config"] == "off") & (units["load"] == "c2")].iloc[0]
    assert one["throughput_tokens_per_s_lo"] < one["throughput_tokens_per_s"] < one["throughput_tokens_per_s_hi"]
    assert off_c1["throughput_tokens_per_s_lo"].isna().all()  # repeats: the interval is over them instead
    k3 = units[units["config"] == "ngram:2:k3"].iloc[0]
    assert k3["accepted_per_pos"] == "30 20 10" and k3["drafts"] == 40 and bool(k3["metrics"])


def test_build_refuses_a_missing_off_configuration() -> None:
    with pytest.raises(BenchFileError, match="no speculation-off configuration"):
        build([(ConfigFiles(4, ("k4.json",)), [_file("k4.json")])], None, 1)


@pytest.mark.parametrize("attr, what", [("model", "models"), ("hardware", "GPUs")])
def test_build_refuses_mixed_models_or_gpus(attr: str, what: str) -> None:
    a = _file("off.json", hardware="h100")
    b = _file("k4.json", model="other" if attr == "model" else "m", hardware="h200" if attr == "hardware" else "h100")
    with pytest.raises(BenchFileError, match=f"k4.json: mixed {what} across configurations"):
        build([(ConfigFiles(0, ("off.json",)), [a]), (ConfigFiles(4, ("k4.json",)), [b])], None, 1)


def test_counter_deltas_that_go_backwards_are_refused() -> None:
    with pytest.raises(ValueError, match="went backwards"):
        SpecCounts(-3, 10, 5, None, "scrape")
