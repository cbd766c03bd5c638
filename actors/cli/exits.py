"""What actors-cli exits with, and the one line it prints for an error that is the
user's or NATS's, not a bug of ours.

Exit codes:
  0  COMPLETED (or the command did what it was asked)
  1  FAILED
  2  CANCELLED
  3  invalid input or usage: a bad playbook, payload or execution id, a value over the
    message limit, an unknown execution, playbook or version, a port already in use,
    a bad or unknown schedule (name, cron, time zone), a retry refused, a catalog path
    that is not one; a signal refused (the execution has ended: nothing sent) or no
    approval step waiting (approve, reject);
    a stored record the command asked about that cannot be read (a status, a catalog
    record: RecordInvalid), a blob that is not what its key names (BlobCorrupt)
  4  timeout: the execution (run, status --watch) did not end within --timeout;
     result of an execution still running; an execution whose start is still queued
     or whose status is not recorded yet (status, events, result)
  5  NATS unavailable: unreachable, credentials refused, a TLS handshake failed, or
     it stopped answering; also an embedded nats-server that could not start,
     streams missing that this NATS user may not create, and what it may not do (the
     server's permissions violation, named, without waiting out the timeout)
  130 interrupted (Ctrl-C)
A user error is one line on stderr, never a traceback. Our errors are answered by their
family (actors/errors.py: UserError 3, NotFinished 4, Unavailable 5), others' by
`foreign_exits`; anything else is a bug of ours and keeps its traceback.
"""

from __future__ import annotations

from actors.errors import ActorsError, NotFinished, Unavailable, UserError
from actors.wire.events import ExecState

EXIT_OK, EXIT_FAILED, EXIT_CANCELLED, EXIT_INVALID, EXIT_TIMEOUT, EXIT_NATS = 0, 1, 2, 3, 4, 5
STATE_EXIT = {ExecState.COMPLETED: EXIT_OK, ExecState.FAILED: EXIT_FAILED, ExecState.CANCELLED: EXIT_CANCELLED}


class UsageError(UserError):
    """A command line that cannot be used as given; the message says which option."""


# what each family of our errors exits with (actors/errors.py), checked in this order
FAMILY_EXIT: tuple[tuple[type[ActorsError], int], ...] = (
    (UserError, EXIT_INVALID),
    (NotFinished, EXIT_TIMEOUT),
    (Unavailable, EXIT_NATS),
)


def foreign_exits() -> tuple[tuple[type[BaseException], int], ...]:
    """The errors not ours that the CLI answers in one line, and their exit codes: the
    only place they are named. A bare TimeoutError here is a NATS request or PubAck that
    never came (the commands that time out waiting for an execution catch theirs and
    exit 4); streams/ has its own root (it imports nothing of actors/)."""
    import nats.errors

    from streams.errors import StreamsError

    return (
        (FileNotFoundError, EXIT_INVALID),
        (StreamsError, EXIT_NATS),
        (nats.errors.Error, EXIT_NATS),
        (TimeoutError, EXIT_NATS),
    )


def exit_code_for(e: BaseException) -> int | None:
    """The exit code of an error that is the user's or NATS's, not a bug of ours (None:
    a bug, shown with its traceback): ours by family, others by `foreign_exits`."""
    code = next((code for cls, code in FAMILY_EXIT if isinstance(e, cls)), None)
    if code is None:
        code = next((code for cls, code in foreign_exits() if isinstance(e, cls)), None)
    return code


def nats_reason(e: Exception) -> str:
    """One line for a NATS failure: what our own errors say, else what went wrong."""
    import nats.errors
    import nats.js.errors

    from actors.natsio.denials import recent as recent_denial
    from streams.server import ServerError

    if isinstance(e, ServerError):
        return e.summary
    if isinstance(e, (nats.errors.NoRespondersError, nats.js.errors.ServiceUnavailableError)):
        return (
            "NATS answered but JetStream did not: is JetStream enabled on the server (-js), "
            "or is a stream electing a leader?"
        )
    if isinstance(e, (nats.errors.Error, TimeoutError)):  # after connecting: a request timed out, the connection closed
        text = " ".join(str(e).split()) or type(e).__name__
        # no answer: the server tells a refusal to the connection, not on the reply subject
        denial = recent_denial() if isinstance(e, TimeoutError) else None
        if denial is not None:
            return f"NATS did not answer ({text}), likely because {denial.explain()}"
        return f"NATS stopped answering: {text}"
    return " ".join(str(e).split())
