"""The commands a calibration's report suggests run on what calibrate wrote and answer plausibly (issue #45).

A run is calibrated as ``python -m calibrate`` does (:func:`calibrate.calibration.calibrate`, then
:func:`calibrate.outputs.write_outputs`), the report's headline is built from the written files as
``python -m reports`` builds it, and every ``python -m sim ...`` command among its next steps is run: it must
exit 0 and answer a finite, plausible speedup (0.01–100×) over a finite baseline of a plausible speed (not the
``1000000000.0 tok/s`` of a forward priced at nothing). Before the fits were bounded, the busy-machine run
(``noisy_run``) answered ``0.000x over 1000000000.0 tok/s`` and the one-prompt run's cost model held a
``NaN``, which the command refused to read.
"""

from __future__ import annotations

import math
import re
import shlex
from pathlib import Path

import pandas as pd
import pytest

from calibrate.calibration import calibrate
from calibrate.outputs import write_outputs
from measure.records import load_run
from reports.page import read_calibration
from reports.summary import cell_results, headline, predicted_optima
from tests.support.cli_inprocess import run_module

ROOT = Path(__file__).resolve().parents[2]
#: ``optimal gamma = 2: speedup 1.014x over 21.9 tok/s autoregressive`` (sim's table output, last line)
ANSWER = re.compile(r"optimal gamma = (\d+): speedup ([\d.eE+-]+|nan|inf)x over ([\d.eE+-]+|nan|inf) tok/s")
#: Committed run directories ``python -m calibrate`` calibrates, one of each kind (the serving and tree runs
#: have their own calibrations): the default job (quiet, and with a CPU hog), a small one-domain run, llama.cpp,
#: γ beyond the usual. Each unbounded fit had a negative cost per context token. The two largest
#: (cpu-smollm2-ngram-gammas, cpu-smollm2-llamacpp-gammas: 9 and 12 s here) answer plausibly too; left out for time.
COMMITTED = ("cpu-make-run-fresh3", "cpu-make-run-interleaved-hog3", "cpu-make-run-interleaved-l",
             "cpu-small-run-fresh-3", "cpu-smollm2-llamacpp-ngram2", "cpu-smollm2-ngram-code-g7-11")


def suggested_sim_commands(run: Path, out: Path, holdout: str = "auto") -> list[list[str]]:
    """Calibrate ``run`` into ``out``; the ``python -m sim`` arguments of every next step its report prints.

    ``holdout`` ``none`` skips the folds: the files the command reads are the all-cell fit either way."""
    write_outputs(calibrate([run], holdout=holdout), out)
    doc, pred, curves = read_calibration(out)
    cells = pd.concat([load_run(info["path"]).table("cells").assign(run=label)
                       for label, info in doc["runs"].items()], ignore_index=True)
    results = cell_results(cells, pred)
    steps = headline(results, doc, predicted_optima(curves, results), out.resolve()).next_steps
    return [shlex.split(s.command)[3:] for s in steps if s.command.startswith("python -m sim ")]


def check_answer(argv: list[str]) -> tuple[float, float]:
    """Run ``python -m sim ARGV``; its optimal speedup and baseline tokens/s, checked finite and plausible."""
    r = run_module("sim", argv)
    assert r.returncode == 0, r.stderr
    m = ANSWER.search(r.stdout)
    assert m, r.stdout
    speedup, baseline = float(m.group(2)), float(m.group(3))
    assert math.isfinite(speedup) and 0.01 < speedup < 100, m.group(0)
    assert math.isfinite(baseline) and 0.01 < baseline < 1e5, m.group(0)  # a forward priced at ~0 ms: 1e9 tok/s
    return speedup, baseline


@pytest.mark.slow
def test_the_busy_machine_run_answers_plausibly(noisy_run, tmp_path):
    (argv,) = suggested_sim_commands(noisy_run, tmp_path / "cal")
    speedup, baseline = check_answer(argv)
    assert 10 < baseline < 40  # the run's own baseline decoded at about 20 tok/s
    check_answer(argv + ["--context-tokens", "2048"])  # far beyond the timed contexts: still a forward's time


@pytest.mark.slow
def test_the_one_prompt_run_writes_no_nan_and_answers(one_prompt_run, tmp_path):
    (argv,) = suggested_sim_commands(one_prompt_run, tmp_path / "cal")
    for f in (tmp_path / "cal").glob("*.json"):
        assert "NaN" not in f.read_text() and "Infinity" not in f.read_text(), f.name
    check_answer(argv)


@pytest.mark.slow
@pytest.mark.parametrize("name", COMMITTED)
def test_every_committed_run_answers_plausibly(name, tmp_path):
    commands = suggested_sim_commands(ROOT / "results" / name, tmp_path / "cal", holdout="none")
    assert commands, "the report suggests a python -m sim command"
    for argv in commands:
        check_answer(argv)
