"""How many CPUs this process may use: the default size of the python worker pool."""

from __future__ import annotations

import math
import os
from pathlib import Path

__all__ = ["available_cpus"]


def available_cpus() -> int:
    """CPUs this process may use: its affinity mask, capped by its cgroup's CPU quota
    (`cpu.max`, rounded up). `os.cpu_count()` is the machine's count, which in a
    container is the node's, not the pod's limit."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = _cgroup_cpu_quota()
    if quota is not None:
        n = min(n, math.ceil(quota))
    return max(1, n)


def _cgroup_cpu_quota() -> float | None:
    """The CPU quota of this process's cgroup, in CPUs (cgroup v2 `cpu.max`, else v1
    `cpu.cfs_quota_us`); None when unlimited or unknown."""
    candidates = []
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            hier, _, path = line.partition("::")
            if hier == "0" and path:
                candidates.append(Path("/sys/fs/cgroup") / path.lstrip("/") / "cpu.max")
    except OSError:
        pass
    candidates.append(Path("/sys/fs/cgroup/cpu.max"))
    for f in candidates:
        try:
            quota, period = f.read_text().split()[:2]
        except (OSError, ValueError):
            continue
        return None if quota == "max" else int(quota) / int(period)
    try:
        quota_us = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period_us = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None
