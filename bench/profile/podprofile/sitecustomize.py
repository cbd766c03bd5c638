"""Profile a pod process with cProfile (bench/e2e_small.py --pod-cprofile FILE).

Python imports `sitecustomize` at start-up from its path; e2e_small.py puts this folder
on the pod's PYTHONPATH and names the output file in BENCH_POD_CPROFILE. Only the pod
(`actors.cli serve`) is profiled, not its python workers. The profile is written when
the pod exits normally (the bench stops it with SIGTERM, which it handles)."""

from __future__ import annotations

import atexit
import cProfile
import os
import sys

_OUT = os.environ.get("BENCH_POD_CPROFILE")
if _OUT and "serve" in sys.argv:
    _profile = cProfile.Profile()
    _profile.enable()

    def _dump() -> None:
        _profile.disable()
        _profile.dump_stats(_OUT)

    atexit.register(_dump)
