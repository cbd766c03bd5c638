"""How a tool call fails, and how it is told to stop: the leaf both the executors and the
python pool import (it imports neither).

`ToolFailure.to_error()` is the `error` templates see (docs/language.md, Templates): `type` is the exception
class name (`ValueError`) or one of `Timeout`, `Cancelled`, `HTTPError`,
`ConnectionError`, `ShellError`, `ToolConfigError`, `WorkerCrashed`,
`ResultNotSerialisable`, `ArgsNotSerialisable`; `retryable` is true for timeouts,
connection errors and HTTP 408, 429 and 5xx.
"""

from __future__ import annotations

import asyncio
import traceback as _traceback
from collections.abc import Callable
from typing import Any

from actors.wire.jsonvalues import dumps

__all__ = [
    "CancelSignal",
    "ToolFailure",
    "cancelled_failure",
    "failure_from_exception",
    "result_json",
    "safe_str",
    "timeout_failure",
]


class ToolFailure(Exception):
    """A tool call failed. `type`/`message`/`retryable`/`status` are the DSL's `error`."""

    def __init__(
        self,
        type: str,
        message: str,
        *,
        retryable: bool = False,
        status: int | None = None,
        traceback: str | None = None,
        data: Any = None,
    ) -> None:
        super().__init__(f"{type}: {message}")
        self.type = type
        self.message = message
        self.retryable = retryable
        self.status = status
        self.traceback = traceback
        self.data = data

    def to_error(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "message": self.message,
            "retryable": self.retryable,
            "status": self.status,
            "traceback": self.traceback,
        }

    def __repr__(self) -> str:
        return (
            f"ToolFailure(type={self.type!r}, message={self.message!r}, retryable={self.retryable!r}, "
            f"status={self.status!r})"
        )


class CancelSignal(asyncio.Event):
    """An `asyncio.Event` that also runs plain callbacks when set, so code waiting for a
    call *or* a cancel needs no task of its own to watch the cancel (the tool actor
    gives one to every command)."""

    def __init__(self) -> None:
        super().__init__()
        self._callbacks: list[Callable[[], None]] = []

    def set(self) -> None:
        if self.is_set():
            return
        super().set()
        callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb()

    def add_callback(self, cb: Callable[[], None]) -> None:
        """Run `cb` once when set (not if already set: check `is_set()` first)."""
        self._callbacks.append(cb)

    def remove_callback(self, cb: Callable[[], None]) -> None:
        try:
            self._callbacks.remove(cb)
        except ValueError:
            pass


def timeout_failure(timeout: float | None) -> ToolFailure:
    return ToolFailure(
        "Timeout",
        f"tool call timed out after {timeout:g}s" if timeout is not None else "tool call timed out",
        retryable=True,
    )


def cancelled_failure(what: str = "tool call cancelled") -> ToolFailure:
    return ToolFailure("Cancelled", what)


def failure_from_exception(exc: BaseException) -> ToolFailure:
    """An unexpected exception (a bug, a bad value) as a ToolFailure of its class name."""
    if isinstance(exc, ToolFailure):
        return exc
    return ToolFailure(
        type(exc).__name__,
        safe_str(exc),
        traceback="".join(_traceback.format_exception(type(exc), exc, exc.__traceback__)),
    )


def safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return f"<{type(exc).__name__}>"


def result_json(result: Any) -> bytes:
    """`result`'s JSON text, encoded once: what checks it is JSON data, measures it and
    goes on the wire (as `msgspec.Raw`); ToolFailure(ResultNotSerialisable) if it is not."""
    try:
        return dumps(result)
    except TypeError as exc:
        raise ToolFailure("ResultNotSerialisable", f"tool result is not JSON-serialisable: {exc}") from None
