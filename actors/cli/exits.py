"""What actors-cli exits with, and the one line it prints for an error that is the
user's or NATS's, not a bug of ours.

Exit codes:
  0  COMPLETED (or the command did what it was asked)
  1  FAILED
  2  CANCELLED
  3  invalid input or usage: a bad playbook, payload or execution id, a value over the
    message limit, an unknown execution, a port already in use, a bad or unknown
    schedule (name, cron, time zone), a retry refused, a catalog path that is not one;
    a stored record the command asked about that cannot be read (a status, a catalog
    record: RecordInvalid), a blob that is not what its key names (BlobCorrupt)
  4  timeout: the execution (run, status --watch) did not end within --timeout;
     result of an execution still running
  5  NATS unavailable: unreachable, credentials refused, a TLS handshake failed, or
     it stopped answering; also an embedded nats-server that could not start, and
     streams missing that this NATS user may not create
  130 interrupted (Ctrl-C)
A user error is one line on stderr, never a traceback.
"""

from __future__ import annotations

from actors.runtime.settings import SettingsInvalid
from actors.wire.events import ExecState

EXIT_OK, EXIT_FAILED, EXIT_CANCELLED, EXIT_INVALID, EXIT_TIMEOUT, EXIT_NATS = 0, 1, 2, 3, 4, 5
STATE_EXIT = {ExecState.COMPLETED: EXIT_OK, ExecState.FAILED: EXIT_FAILED, ExecState.CANCELLED: EXIT_CANCELLED}


class UsageError(Exception):
    pass


def exit_code_for(e: Exception) -> int | None:
    """The exit code of an error that is the user's or NATS's, not a bug of ours."""
    import nats.errors

    from actors.client import InvalidExecutionId, RetryRefused, TooLarge, UnknownExecution
    from actors.natsio import PublishOutcomeUnknown
    from actors.natsio.dial import NatsUnavailable
    from actors.playbook.loader import PlaybookInvalid
    from actors.playbook.userfiles import UnreadableFile
    from actors.pod.health import HttpPortUnavailable
    from actors.store.blobs import ValueTooLarge
    from actors.store.catalog import CatalogError
    from actors.store.records import RecordInvalid
    from actors.wire.codec import PayloadUnreadable
    from actors.wire.nesting import TooDeep
    from streams.layout import StreamsMissing
    from streams.server import ServerError

    if isinstance(
        e,
        (
            CatalogError,
            PlaybookInvalid,
            FileNotFoundError,
            InvalidExecutionId,
            TooLarge,
            HttpPortUnavailable,
            ValueTooLarge,
            SettingsInvalid,
            RetryRefused,
            UnknownExecution,
            PayloadUnreadable,  # an encrypted value and no key (or the wrong one); a blob changed (BlobCorrupt)
            RecordInvalid,  # a malformed status or catalog record, named by its key
            UnreadableFile,  # a file named that is not a regular file, or too large (`PATH: why`)
            TooDeep,  # a payload nested too deep
        ),
    ):
        return EXIT_INVALID
    # a bare TimeoutError here is a NATS request or PubAck that never came (the commands
    # that time out waiting for an execution catch theirs and exit 4)
    if isinstance(
        e, (NatsUnavailable, ServerError, nats.errors.Error, PublishOutcomeUnknown, TimeoutError, StreamsMissing)
    ):
        return EXIT_NATS
    return None


def nats_reason(e: Exception) -> str:
    """One line for a NATS failure: what our own errors say, else what went wrong."""
    import nats.errors
    import nats.js.errors

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
        return f"NATS stopped answering: {text}"
    return " ".join(str(e).split())
