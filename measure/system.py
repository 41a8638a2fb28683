"""A short check of the machine before a timing run (pyperf's ``system`` habit).

Warns, in words, about what is known to spoil timings: a load average above
the core count, other processes using a CPU core right now, a CPU frequency
governor other than ``performance`` (where Linux exposes it), and on a CUDA
device its current clocks below the maximum. Nothing here changes the
machine; the result is printed and stored in ``run.json`` (``system_check``).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

#: A process using more than this share of one core during the check counts as busy.
BUSY_CPU_SHARE = 0.5
#: How long other processes' CPU use is sampled.
SAMPLE_S = 0.5


def available_memory_bytes() -> int | None:
    """Memory a new process can take now without swapping: Linux's ``MemAvailable``, else the physical memory
    (``sysconf``); None where neither is known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def _proc_times() -> dict[int, tuple[str, float]]:
    """pid → (command name, user+system CPU seconds) of every readable process."""
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out = {}
    for d in Path("/proc").glob("[0-9]*"):
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.find("(") + 1:stat.rfind(")")]
        try:
            out[int(d.name)] = (name, _stat_cpu_s(stat, hz))
        except (IndexError, ValueError):
            continue
    return out


def _stat_cpu_s(stat: str, hz: int) -> float:
    """User + system CPU seconds from a ``/proc/<pid>/stat`` line (every thread of the process)."""
    fields = stat[stat.rfind(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / hz


def busy_processes(sample_s: float = SAMPLE_S, exclude: set[int] | None = None) -> list[tuple[int, str, float]]:
    """Other processes using more than :data:`BUSY_CPU_SHARE` of a core over ``sample_s``: (pid, name, share)."""
    if not Path("/proc/self/stat").exists():
        return []
    skip = set(exclude or ()) | {os.getpid(), os.getppid()}
    a = _proc_times()
    time.sleep(sample_s)
    b = _proc_times()
    out = []
    for pid, (name, t1) in b.items():
        if pid in skip or pid not in a:
            continue
        share = (t1 - a[pid][1]) / sample_s
        if share > BUSY_CPU_SHARE:
            out.append((pid, name, share))
    return sorted(out, key=lambda x: -x[2])


@dataclass(frozen=True)
class CpuSample:
    """The machine's CPU seconds so far (busy, and stolen by the hypervisor) and those of some processes."""

    at_s: float
    busy_s: float
    steal_s: float
    own_s: float


def _machine_cpu_s() -> tuple[float, float] | None:
    """(busy, steal) CPU seconds of every core since boot, from ``/proc/stat``; None where unreadable."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if first[0] != "cpu" or len(first) < 9:
        return None
    hz = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in first[1:9])
    return (user + nice + system + irq + softirq) / hz, steal / hz


def _pid_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (every thread); 0 when it is gone."""
    try:
        return _stat_cpu_s(Path(f"/proc/{pid}/stat").read_text(), os.sysconf("SC_CLK_TCK"))
    except (OSError, IndexError, ValueError):
        return 0.0


def cpu_sample(pids: Sequence[int]) -> CpuSample | None:
    """Now: the machine's busy and stolen CPU seconds and those of ``pids``; None without ``/proc``."""
    m = _machine_cpu_s()
    if m is None:
        return None
    return CpuSample(time.perf_counter(), m[0], m[1], sum(_pid_cpu_s(p) for p in pids))


def other_cpu_shares(a: CpuSample | None, b: CpuSample | None) -> tuple[float | None, float | None]:
    """Between two samples, in cores: the CPU the *other* processes used (busy minus the sampled pids') and the
    CPU the hypervisor stole; (None, None) without samples."""
    if a is None or b is None or b.at_s <= a.at_s:
        return None, None
    wall = b.at_s - a.at_s
    other = max((b.busy_s - a.busy_s) - (b.own_s - a.own_s), 0.0)
    return other / wall, max(b.steal_s - a.steal_s, 0.0) / wall


def cpu_governors() -> set[str]:
    """The CPU frequency governors in use (empty where not readable, e.g. most VMs)."""
    govs = set()
    for f in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_governor"):
        try:
            govs.add(f.read_text().strip())
        except OSError:
            continue
    return govs


def gpu_clocks() -> list[dict]:
    """Current vs maximum SM clocks per GPU via ``nvidia-smi`` (empty when unavailable)."""
    try:
        res = subprocess.run(["nvidia-smi", "--query-gpu=index,clocks.sm,clocks.max.sm,utilization.gpu",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return []
    out = []
    for line in res.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            out.append({"index": int(parts[0]), "sm_mhz": float(parts[1]), "max_sm_mhz": float(parts[2]),
                        "utilization_pct": float(parts[3])})
        except (IndexError, ValueError):
            continue
    return out


def system_check(device: str = "cpu", sample_s: float = SAMPLE_S) -> dict:
    """``{"load_average", "cores", "busy", "governors", "gpus", "warnings": [...]}`` (warnings in words)."""
    cores = os.cpu_count() or 1
    warnings: list[str] = []
    try:
        load1 = os.getloadavg()[0]
    except OSError:
        load1 = None
    if load1 is not None and load1 > cores:
        warnings.append(f"load average {load1:.2f} is above the {cores} cores: timings will be noisy")
    busy = busy_processes(sample_s)
    for pid, name, share in busy[:5]:
        warnings.append(f"process {name} (pid {pid}) is using {100 * share:.0f}% of a core: timings will be noisy")
    govs = cpu_governors()
    if govs and govs != {"performance"}:
        warnings.append(f"CPU frequency governor {', '.join(sorted(govs))} (not 'performance'): clock changes "
                        "move timings")
    gpus = gpu_clocks() if str(device).startswith("cuda") else []
    for g in gpus:
        if g["utilization_pct"] > 10:
            warnings.append(f"GPU {g['index']} is {g['utilization_pct']:.0f}% busy before the run")
    return {"load_average": load1, "cores": cores,
            "busy": [{"pid": p, "name": n, "core_share": round(s, 2)} for p, n, s in busy],
            "governors": sorted(govs), "gpus": gpus, "warnings": warnings}
