"""What a tool printed, kept bounded: the first `cap` bytes, the last `TAIL`, and the
count of every byte (`Captured`), handed from an executor to the runner in an
`OutputBox`.

A python worker's stdout and stderr (file descriptors 1 and 2, so its subprocesses'
output too) are one unlinked temporary file opened for appending (`capture_file`): the
worker reads it (up to the cap, and the tail) and empties it after each call, and sends
it with its reply; the pool reads it itself when the call timed out or crashed and the
worker was killed. Nothing a tool prints reaches a pod's or the CLI's own stdout.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from dataclasses import dataclass

__all__ = ["TAIL", "Captured", "OutputBox", "capture_file", "captured_bytes", "read_capture"]

TAIL = 4096  # bytes of the end kept apart, for when the whole text is over the cap


@dataclass(frozen=True, slots=True)
class Captured:
    size: int  # every byte printed
    kept: bytes  # the first min(size, cap) bytes
    tail: bytes  # the last TAIL bytes (the end of `kept` when all of it was kept)


class OutputBox:
    """Where an executor leaves what its tool printed (None: it captured nothing)."""

    __slots__ = ("cap", "captured")

    def __init__(self, cap: int) -> None:
        self.cap = cap  # bytes kept at most (`Layout.step_output_max_bytes`)
        self.captured: Captured | None = None


def captured_bytes(*parts: bytes, cap: int) -> Captured:
    """`parts` printed one after the other (a shell command's stdout, then its stderr)."""
    data = b"".join(parts)
    return Captured(size=len(data), kept=data[:cap], tail=data[-TAIL:])


def capture_file() -> int:
    """A file descriptor for a worker's stdout and stderr: an unlinked temporary file
    in append mode (both descriptors of the worker share one offset: the end)."""
    fd, path = tempfile.mkstemp(prefix="actors-out-")
    os.unlink(path)
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
    return fd


def read_capture(fd: int, cap: int) -> Captured:
    """What the file holds now, bounded by `cap` (plus the tail)."""
    size = os.fstat(fd).st_size
    kept = _pread(fd, min(size, cap), 0)
    tail = kept[-TAIL:] if size <= cap else _pread(fd, TAIL, max(size - TAIL, 0))
    return Captured(size=size, kept=kept, tail=tail)


def _pread(fd: int, n: int, offset: int) -> bytes:
    parts: list[bytes] = []
    while n > 0:
        chunk = os.pread(fd, n, offset)
        if not chunk:
            break
        parts.append(chunk)
        n -= len(chunk)
        offset += len(chunk)
    return b"".join(parts)
