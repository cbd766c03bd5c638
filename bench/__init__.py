"""Benchmarks: each prints its figures and, as its last line, one JSON object.
Run from the repository: `python -m bench.<name> --help`. Profilers and what-if
harnesses are in `bench.profile`, tools that make documentation in `bench.tools`;
current figures in bench/RESULTS.md."""

import os

# The pods a bench starts run their steps as the bench's own user, as the tests do
# (tests/conftest.py): a root pod refuses to start without a step user its python can
# run as, and `nobody` cannot read an interpreter under /root (actors/runtime/children.py).
# Set ACTORS_STEP_USER to measure with another user.
os.environ.setdefault("ACTORS_STEP_USER", f"{os.geteuid()}:{os.getegid()}")
