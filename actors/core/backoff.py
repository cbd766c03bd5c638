"""Retry delays: pure functions of the policy, the attempt and a log-derived random unit.

Jitter needs randomness, and engine decisions must replay identically, so the "random"
unit comes from a hash of what identifies the attempt (execution, activation,
attempt): the same on every replay, spread evenly across attempts.
"""

from __future__ import annotations

import hashlib
from typing import Literal

Backoff = Literal["fixed", "linear", "exponential"]
Jitter = Literal["none", "full", "equal"]
DEFAULT_ERROR_DELAY = 0.5


def unit_random(*parts: object) -> float:
    """A deterministic number in [0, 1) from `parts`."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def base_delay(backoff: Backoff, *, attempt: int, initial: float, factor: float, max_delay: float) -> float:
    """Delay before the attempt after `attempt` (1-based), without jitter:
    fixed: initial; linear: initial * attempt; exponential: initial * factor^(attempt-1);
    capped by max_delay."""
    if backoff == "fixed":
        raw = initial
    elif backoff == "linear":
        raw = initial * attempt
    else:
        try:
            raw = initial * factor ** (attempt - 1)
        except OverflowError:  # a huge attempt number: far past any cap
            raw = max_delay
    return min(raw, max_delay)


def with_jitter(delay: float, jitter: Jitter, unit: float) -> float:
    """full: uniform in [0, delay]; equal: delay/2 + uniform in [0, delay/2]."""
    if jitter == "full":
        return delay * unit
    if jitter == "equal":
        return delay / 2 + (delay / 2) * unit
    return delay


def retry_delay(
    *,
    backoff: Backoff,
    jitter: Jitter,
    attempt: int,
    initial: float,
    factor: float,
    max_delay: float,
    unit: float,
) -> float:
    return with_jitter(
        base_delay(backoff, attempt=attempt, initial=initial, factor=factor, max_delay=max_delay), jitter, unit
    )
