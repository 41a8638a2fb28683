"""measure.system: the pre-run check of the machine says in words what would spoil timings."""

from __future__ import annotations

import subprocess
import sys

from measure import system


def test_system_check_shape():
    res = system.system_check("cpu", sample_s=0.1)
    assert set(res) >= {"load_average", "cores", "busy", "governors", "gpus", "warnings"}
    assert res["cores"] >= 1 and all(isinstance(w, str) for w in res["warnings"])


def test_a_busy_process_is_named():
    # on a loaded 2-core machine (the suite's other worker, other jobs) a spinner can get less than the busy
    # share in one short sample: up to three samples each, named in any of them
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        assert any(any(pid == spin.pid for pid, _name, _share in system.busy_processes(sample_s=0.5))
                   for _ in range(3))
        assert any(any(f"pid {spin.pid}" in w and "of a core" in w
                       for w in system.system_check("cpu", sample_s=0.5)["warnings"]) for _ in range(3))
    finally:
        spin.kill()
        spin.wait()


def test_other_processes_cpu_is_what_the_sampled_ones_did_not_use():
    a = system.CpuSample(at_s=10.0, busy_s=100.0, steal_s=5.0, own_s=40.0)
    b = system.CpuSample(at_s=12.0, busy_s=103.0, steal_s=5.5, own_s=42.0)  # 3 s busy, 2 of them ours, in 2 s
    assert system.other_cpu_shares(a, b) == (0.5, 0.25)
    assert system.other_cpu_shares(a, None) == (None, None)


def test_a_spinning_process_shows_as_other_cpu():
    import os
    import time

    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        a = system.cpu_sample([os.getpid()])
        time.sleep(0.6)
        other, steal = system.other_cpu_shares(a, system.cpu_sample([os.getpid()]))
        assert other is not None and other > 0.4 and steal is not None and steal >= 0
    finally:
        spin.kill()
