"""``python -m calibrate ingest`` on hostile numbers: bounded flags, impossible counters, non-finite values, deep JSON.

Every case of issue 32 that reached ingest, run as a user would (a subprocess
with a timeout, so a hang fails the test): each ends with exit status 2 and one
stderr line naming the field or flag, no traceback, or (a figure that can be
dropped) with a ``note:`` saying which and why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from calibrate.ingest.fields import count
from calibrate.ingest.records import ImpossibleFigure, Observation

ROOT = Path(__file__).resolve().parents[3]
V1 = ("SpecDecoding metrics: Mean acceptance length: {tau}, Accepted throughput: 3.87 tokens/s, Drafted throughput: "
      "5.72 tokens/s, Accepted: {acc} tokens, Drafted: {dr} tokens, Per-position acceptance rate: 0.837, 0.669, "
      "0.524, Avg Draft acceptance rate: {rate}%\n")
PROM = ("# TYPE vllm:spec_decode_num_drafts counter\n"
        'vllm:spec_decode_num_drafts_total{{model_name="m",engine="0"}} {d0}\n'
        'vllm:spec_decode_num_drafts_total{{model_name="m",engine="1"}} {d1}\n'
        'vllm:spec_decode_num_draft_tokens_total{{model_name="m",engine="0"}} {t}\n'
        'vllm:spec_decode_num_accepted_tokens_total{{model_name="m",engine="0"}} 30\n')


def _request(**sd: object) -> str:
    base = {"num_spec_tokens": 4, "num_spec_steps": 10, "num_accepted_draft_tokens": 30, "num_draft_tokens": 40}
    return json.dumps({"metrics": {"speculative_decoding": {**base, **sd}}}) + "\n"


FILES = {
    "inf.prom": PROM.format(d0="+Inf", d1=0, t=400),
    "nan.prom": PROM.format(d0=100, d1="NaN", t=400),
    "negative.prom": PROM.format(d0=-5, d1=0, t=400),
    "capacity.prom": PROM.format(d0=10, d1=0, t=400) + "".join(
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="m",position="{i}"}} 10\n' for i in range(3)),
    # json.dumps writes Infinity and NaN, as a Python server would
    "inf.json": _request(num_spec_steps=float("inf")),
    "nan.json": _request(num_draft_tokens=float("nan")),
    "k0.json": _request(num_spec_tokens=0),
    "k1e9.json": _request(num_spec_tokens=10**9),
    "hist.json": _request(acceptance_histogram={"1000000000": 1}),
    "tau_nan.json": _request(mean_acceptance_length=float("nan")),
    "deep.json": "[" * 100_000 + "]" * 100_000,
    "accepted_gt_drafted.log": V1.format(tau="3.03", acc=537, dr=169, rate="317.7"),
    "zero.log": "SpecDecoding metrics: Mean acceptance length: 3.09, Accepted throughput: 0.00 tokens/s, Drafted "
                "throughput: 0.00 tokens/s, Accepted: 0 tokens, Drafted: 0 tokens\n",
    "server.log": "draft acceptance rate = 0.85265 (  604 accepted /   515 generated)\n",
    "timings.json": json.dumps({"timings": {"predicted_n": 665, "draft_n": 100, "draft_n_accepted": 150}}) + "\n",
    "speculative.txt": "n_draft   = 5\nn_predict = 673\nn_drafted = 730\nn_accept  = 800\naccept    = 72.055%\n",
    "good.log": V1.format(tau="3.03", acc=337, dr=498, rate="67.7"),
}


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ingest-bad")
    for name, text in FILES.items():
        (folder / name).write_text(text)
    return folder


def ingest(d: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [a.replace("{d}", str(d)) for a in args]
    return subprocess.run([sys.executable, "-m", "calibrate", "ingest", *argv], capture_output=True, text=True,
                          cwd=d, env=env, timeout=120)


PRESET = ("--preset", "llama3-1b-8b")
REFUSED = [
    # unbounded inputs: the bounds of python -m sim (sim.limits)
    (["{d}/good.log", *PRESET, "--mode", "serve", "--requests", "1000000000"],
     "argument --requests: '1000000000' is out of range; valid: an integer in 1..1,000,000"),
    (["{d}/good.log", *PRESET, "--gamma-max", "100000"], "argument --gamma-max: '100000' is out of range; valid: an "
                                                          "integer in 1..64"),
    (["{d}/good.log", *PRESET, "--mode", "serve", "--new-tokens", "100000000"],
     "argument --new-tokens: '100000000' is out of range; valid: an integer in 1..1,000,000"),
    (["{d}/good.log", *PRESET, "--mode", "serve", "--new-tokens", "1000000"], "simulated tokens"),
    (["{d}/good.log", *PRESET, "--requests", "5"], "--requests applies to --mode serve only"),
    (["{d}/good.log", *PRESET, "--mode", "serve", "--arrival-rates", "1,,4"], "'1,,4': empty item at position 2"),
    (["{d}/good.log", *PRESET, "--mode", "serve", "--arrival-rates", "0"], "'0' is out of range; valid: a finite "
                                                                           "number in [0.001, 1,000,000]"),
    (["{d}/good.log", *PRESET, "--spec-tokens", "1000000"], "argument --spec-tokens: '1000000' is out of range; "
                                                             "valid: an integer in 1..64"),
    (["{d}/good.log", *PRESET, "--context-tokens", "nan"], "argument --context-tokens: 'nan' is not a finite number"),
    (["{d}/good.log", *PRESET, "--mode", "fast"], "argument --mode: unknown --mode 'fast'; valid: analytic, serve"),
    # non-finite and negative numbers in the files: named, not a traceback
    (["{d}/inf.prom", *PRESET], 'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} is inf: a spec-decode '
                                "counter or gauge must be a finite number >= 0"),
    (["{d}/nan.prom", *PRESET], 'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} is nan'),
    (["{d}/negative.prom", *PRESET], "is -5: a spec-decode counter or gauge must be a finite number >= 0"),
    (["{d}/inf.json", *PRESET], "inf.json: num_spec_steps is inf: a count must be a finite whole number >= 0"),
    (["{d}/nan.json", *PRESET], "nan.json: num_draft_tokens is nan"),
    (["{d}/deep.json", *PRESET], "deep.json:1 nests deeper than 100 levels"),
    # impossible counters
    (["{d}/accepted_gt_drafted.log", *PRESET], "accepted_gt_drafted.log:1: Accepted (537) is more than Drafted (169)"),
    (["{d}/zero.log", *PRESET], "zero.log:1: Mean acceptance length 3.09 with Drafted 0: "
                                                      "without a draft there is no acceptance length"),
    (["{d}/k0.json", *PRESET], "k0.json: num_spec_tokens 0 is not a draft length: valid 1..64"),
    (["{d}/k1e9.json", *PRESET], "k1e9.json: num_spec_tokens 1000000000 is not a draft length: valid 1..64"),
    (["{d}/hist.json", *PRESET], "acceptance_histogram has a bucket 1000000000: no draft accepts more than 64 tokens"),
    (["{d}/capacity.prom", *PRESET], "vllm:spec_decode_num_draft_tokens (400) is more than vllm:spec_decode_num_drafts "
                                     "x k = 10 x 3 = 30"),
    (["{d}/server.log", *PRESET], "server.log:1: accepted (604) is more than generated (515)"),
    (["{d}/timings.json", *PRESET], "draft_n_accepted (150) is more than draft_n (100)"),
    (["{d}/speculative.txt", *PRESET], "n_accept (800) is more than n_drafted (730)"),
    # the bounds sim applies to the same quantities (sim/limits.py)
    (["{d}/good.log", *PRESET, "--context-tokens", "0"], "argument --context-tokens: '0' is out of range"),
    (["{d}/good.log", *PRESET, "--mode", "serve", "--arrival-rates", "1,1e-300"],
     "argument --arrival-rates: '1e-300' is out of range"),
]


@pytest.mark.parametrize("args, message", REFUSED, ids=[m[:50] for _, m in REFUSED])
def test_refused_in_one_line(d: Path, args: list[str], message: str) -> None:
    r = ingest(d, *args)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert lines[0].startswith("python -m calibrate ingest: error: ") and message in lines[0], lines[0]
    assert r.stdout == ""


def test_a_redundant_nan_figure_is_dropped_with_a_note(d: Path) -> None:
    r = ingest(d, "{d}/tau_nan.json", *PRESET)
    assert r.returncode == 0, r.stderr
    assert "note: vLLM mean_acceptance_length nan dropped (not a finite number): the counts are used" in r.stdout
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert last["mean_tokens_per_round"] == pytest.approx(1 + 30 / 10)  # from the counts


def test_the_good_line_still_answers(d: Path) -> None:
    r = ingest(d, "{d}/good.log", *PRESET, "--mode", "serve", "--requests", "10", "--new-tokens", "16",
               "--gamma-max", "2", "--arrival-rates", "1,4")
    assert r.returncode == 0, r.stderr
    assert "by arrival rate" in r.stdout


# -- the checks themselves -------------------------------------------------------------------
@pytest.mark.parametrize("fields, needle", [
    (dict(accepted_tokens=5, draft_tokens=4), "accepted tokens (5) is more than drafted tokens (4)"),
    (dict(k=0), "draft length k 0 is not a draft length"),
    (dict(k=65), "draft length k 65 is not a draft length: valid 1..64"),
    (dict(drafts=-1), "drafts -1: a count must be >= 0"),
    (dict(tau=float("nan")), "mean tokens per round nan: not a finite number"),
    (dict(acceptance_rate=float("inf")), "acceptance rate inf: not a finite number"),
    (dict(tau=2.5, drafts=0), "mean tokens per round 2.5 with drafts 0"),
    (dict(k=2, rounds_by_accepted=(1, 1, 1, 1)), "rounds that accepted up to 3 tokens, more than k = 2"),
])
def test_observation_refuses_impossible_figures(fields: dict, needle: str) -> None:
    with pytest.raises(ImpossibleFigure) as exc:
        Observation("vllm", "x", "src:1", **fields)
    assert str(exc.value).startswith("src:1: ") and needle in str(exc.value)


def test_observation_names_the_engine_field() -> None:
    with pytest.raises(ImpossibleFigure, match=r"src: num_spec_tokens 0 is not a draft length"):
        Observation("vllm", "x", "src", k=0, names=(("k", "num_spec_tokens"),))
    Observation("vllm", "x", "src", k=64, drafts=1, draft_tokens=64, accepted_tokens=64, tau=65.0)  # the edges pass


@pytest.mark.parametrize("value, result", [(None, None), (3, 3), (3.0, 3), ("12", 12)])
def test_count_reads_whole_numbers(value: object, result: int | None) -> None:
    assert count("s", {"n": value}, "n") == result


@pytest.mark.parametrize("value", [float("inf"), float("nan"), -1, 2.5])
def test_count_refuses_impossible_numbers(value: float) -> None:
    with pytest.raises(ImpossibleFigure, match="s: n is"):
        count("s", {"n": value}, "n")


@pytest.mark.parametrize("value", ["abc", [1], True])
def test_count_leaves_unreadable_values_to_the_caller(value: object) -> None:
    with pytest.raises((TypeError, ValueError)) as exc:
        count("s", {"n": value}, "n")
    assert not isinstance(exc.value, ImpossibleFigure)
