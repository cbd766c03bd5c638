"""Failpoints: TEST-ONLY crash points, off unless the environment arms them.

A test that must kill a pod at an exact point (tests/system/test_postgres_sink.py: a
tools pod killed after a postgres sink committed and before the result is published)
starts the pod with ``ACTORS_TEST_FAILPOINTS="postgres.committed=kill@250"``: the 250th
time this process reaches ``postgres.committed`` it sends itself SIGKILL (counted per
process, so a pod started again with the same environment dies again 250 hits later).
Several points are separated by commas. Nothing else reads the variable; a deployment
never sets it.

Off (the variable unset or empty), ``ARMED`` is false and a point costs one test of a
module global: callers write ``if failpoints.ARMED: failpoints.reached("name")``.
"""

from __future__ import annotations

import os
import signal

__all__ = ["ARMED", "ENV", "reached"]

ENV = "ACTORS_TEST_FAILPOINTS"


def _parse(text: str) -> dict[str, int]:
    points: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, action = part.partition("=")
        verb, _, nth = action.partition("@")
        if verb != "kill" or not nth.isdigit() or int(nth) < 1:
            raise ValueError(f"{ENV}: {part!r} is not NAME=kill@N (N >= 1)")
        points[name.strip()] = int(nth)
    return points


_POINTS = _parse(os.environ.get(ENV, ""))
_HITS: dict[str, int] = {}
ARMED = bool(_POINTS)


def reached(name: str) -> None:
    """Count a hit of point `name`; SIGKILL this process at the armed hit."""
    nth = _POINTS.get(name)
    if nth is None:
        return
    _HITS[name] = hits = _HITS.get(name, 0) + 1
    if hits >= nth:
        os.kill(os.getpid(), signal.SIGKILL)
