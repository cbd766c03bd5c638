"""What a failure to handle an input means, for an actor that keeps its inputs until it
has handled them (the log actors: actors/runtime/logactor.py `on_failure`; the starter
and the projector judge their own inputs with `is_transient` and `POISON_TRIES` too).

Two kinds of failure, told apart by `is_transient`. NATS unreachable, electing a
leader or reconnecting: wait and try again for as long as it takes (the inputs stay in
the log). Anything else (an exception from the pure fold, from encoding its outputs, a
message the server refuses) is deterministic: the same input fails the same way every
time, so after `POISON_TRIES` failures in a row the actor gives up on it (the engine
fails the execution with an `EngineError`, the counter the loop) and goes on.

Pure policy: no NATS connection, no actor; `Strikes` counts one batch's failures.
"""

from __future__ import annotations

import random
import traceback
from dataclasses import dataclass

import nats.errors
from nats.js.errors import BadRequestError, NoStreamResponseError, ServerError, ServiceUnavailableError

from actors.natsio import PublishOutcomeUnknown
from actors.wire.messages import ErrorInfo

FAILURE_PAUSE_FIRST = 0.5  # seconds before the second try of inputs an actor failed to handle
FAILURE_PAUSE_MAX = 15.0  # ... doubling up to this: an outage costs little, a long one is not hammered
POISON_TRIES = 3  # deterministic failures in a row before an actor gives up on its inputs

# What waiting cures: the server unreachable, reconnecting, electing a stream leader, a
# PubAck lost. (nats-py's TimeoutError is an OSError.)
TRANSIENT: tuple[type[BaseException], ...] = (
    OSError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionDrainingError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.NoServersError,
    nats.errors.StaleConnectionError,
    nats.errors.UnexpectedEOF,
    nats.errors.FlushTimeoutError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.NoRespondersError,
    nats.errors.SlowConsumerError,
    nats.errors.AuthorizationError,
    NoStreamResponseError,
    ServiceUnavailableError,
    ServerError,
    PublishOutcomeUnknown,
    MemoryError,  # the pod is short of memory now: not the input's fault, try again later
)


# NATS errors that say the message itself is wrong: sending it again fails the same way
DETERMINISTIC_NATS: tuple[type[BaseException], ...] = (
    nats.errors.MaxPayloadError,
    nats.errors.BadSubjectError,
    nats.errors.BadHeaderError,
    nats.errors.JsonParseError,
    BadRequestError,
)


def is_transient(e: BaseException) -> bool:
    """Any other error from NATS counts as transient: better an actor that waits out a
    NATS error nobody listed than an execution failed for it."""
    if isinstance(e, DETERMINISTIC_NATS):
        return False
    return isinstance(e, TRANSIENT) or isinstance(e, nats.errors.Error)


def engine_error(e: BaseException, *, subject: str, seq: int, data: bytes) -> ErrorInfo:
    """What an actor records when it gives up on an input: the exception, and the input
    that caused it (its subject, stream position and the start of its content)."""
    head = data[:500].decode("utf-8", "replace") + (" ..." if len(data) > 500 else "")
    tb = "".join(traceback.format_exception(e))
    return ErrorInfo(
        type="EngineError",
        message=f"{type(e).__name__}: {str(e)[:1000]} (input {subject}, stream seq {seq}: {head})",
        traceback=tb[-4000:],
    )


class Refold(BaseException):
    """An actor recorded in its log something that changes how its inputs fold (a render
    fault, actors/runtime/render_process.py): rebuild it by replay and try again at once. Not a
    failure: nothing is counted against the input."""


@dataclass(slots=True)
class Strikes:
    """One batch's failures so far: all of them (`failures`: the pause after a transient
    one grows with them) and the deterministic ones (`poisoned`: every POISON_TRIES of
    them the actor gives up once more, one level up)."""

    failures: int = 0
    poisoned: int = 0


def failure_pause(failures: int) -> float:
    """Seconds to wait after `failures` failures in a row: doubling from
    FAILURE_PAUSE_FIRST up to FAILURE_PAUSE_MAX, give or take a quarter, so actors that
    failed together (one outage) do not all come back at the same instant. Only timing:
    no decision depends on it."""
    base: float = min(FAILURE_PAUSE_FIRST * 2.0 ** min(failures - 1, 16), FAILURE_PAUSE_MAX)
    return base * random.uniform(0.75, 1.25)


def poison_pause(poisoned: int) -> float:
    """Seconds to wait after a deterministic failure not yet given up on: the same input
    fails the same way, so no long wait (it is tried POISON_TRIES times first)."""
    return min(0.05 * poisoned, 0.5)
