"""The checks a value passes before it goes to NATS: an execution id before it becomes a
subject token or a KV key, a value's size before it goes in a message."""

from __future__ import annotations

from actors.errors import UserError
from streams.layout import EXECUTION_ID


class InvalidExecutionId(UserError, ValueError):
    pass


class TooLarge(UserError, ValueError):
    """A value bigger than a message may carry; the message names it and its size."""


def check_execution_id(execution_id: str) -> str:
    """The id itself, or InvalidExecutionId: it becomes a subject token and a KV key,
    where `*`, `>` and `.` would address other executions."""
    if not EXECUTION_ID.fullmatch(execution_id):  # fullmatch: `$` alone lets a trailing newline through
        raise InvalidExecutionId(f"execution id {execution_id!r} is not valid: it must match {EXECUTION_ID.pattern}")
    return execution_id


def check_size(what: str, size: int, limit: int) -> None:
    """The one place that decides whether a value fits in a message: raise TooLarge
    naming `what` when `size` (encoded bytes) is over `limit`."""
    if size > limit:
        raise TooLarge(
            f"{what} is {size:,} bytes encoded, over the {limit:,} bytes a NATS message may carry "
            "here (the server's max_payload and the streams' max_msg_size, less an envelope)"
        )
