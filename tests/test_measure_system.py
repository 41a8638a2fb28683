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
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        busy = system.busy_processes(sample_s=0.5)
        assert any(pid == spin.pid for pid, _name, _share in busy)
        res = system.system_check("cpu", sample_s=0.5)
        assert any(f"pid {spin.pid}" in w and "of a core" in w for w in res["warnings"])
    finally:
        spin.kill()
        spin.wait()
