"""One error root (actors/errors.py): `actors-cli` answers an error of ours by its family,
and others' (nats-py, the OS, streams/) from one table, each with the exit code it had
before the families (3 bad input, 4 not finished, 5 NATS unavailable). An error it
does not know keeps its traceback: exit_code_for says None."""

from __future__ import annotations

import nats.errors
import nats.js.errors
import pytest

from actors.cli.exits import EXIT_INVALID, EXIT_NATS, EXIT_TIMEOUT, UsageError, exit_code_for
from actors.client import (
    ExecutionFailed,
    ExecutionNotFinished,
    ExecutionNotFound,
    InvalidExecutionId,
    RetryRefused,
    ScheduleError,
    StartRefused,
    TooLarge,
    UnknownExecution,
)
from actors.config.settings import SettingsInvalid
from actors.errors import ActorsError, NotFinished, Unavailable, UserError
from actors.natsio import PublishOutcomeUnknown
from actors.natsio.dial import NatsUnavailable
from actors.playbook.loader import PlaybookInvalid
from actors.playbook.userfiles import UnreadableFile
from actors.pod.health import HttpPortUnavailable
from actors.store.blobs import BlobCorrupt, ValueTooLarge
from actors.store.catalog import CatalogError, CatalogPathInvalid, CatalogRecordInvalid, PlaybookNotRegistered
from actors.store.records import RecordInvalid
from actors.wire.codec import PayloadUnreadable
from actors.wire.nesting import TooDeep
from streams.errors import StreamsError
from streams.layout import StreamsMissing
from streams.server import ServerError

pytestmark = pytest.mark.timeout(10)


def bare(cls: type[BaseException]) -> BaseException:
    """An instance without its constructor's arguments: the exit code goes by class."""
    return cls.__new__(cls)


@pytest.mark.parametrize(
    ("family", "code"), [(UserError, EXIT_INVALID), (NotFinished, EXIT_TIMEOUT), (Unavailable, EXIT_NATS)]
)
def test_each_family_exits_with_its_code(family: type[ActorsError], code: int) -> None:
    class Newcomer(family):  # type: ignore[valid-type,misc]
        """An error added later: its family alone decides its exit code."""

    assert exit_code_for(family("x")) == code
    assert exit_code_for(Newcomer("x")) == code


# every error the CLI answered before the families, with the code it answered
BEFORE = [
    (CatalogError, EXIT_INVALID),
    (PlaybookInvalid, EXIT_INVALID),
    (FileNotFoundError, EXIT_INVALID),
    (InvalidExecutionId, EXIT_INVALID),
    (TooLarge, EXIT_INVALID),
    (HttpPortUnavailable, EXIT_INVALID),
    (ValueTooLarge, EXIT_INVALID),
    (SettingsInvalid, EXIT_INVALID),
    (RetryRefused, EXIT_INVALID),
    (UnknownExecution, EXIT_INVALID),
    (PayloadUnreadable, EXIT_INVALID),
    (BlobCorrupt, EXIT_INVALID),
    (RecordInvalid, EXIT_INVALID),
    (CatalogRecordInvalid, EXIT_INVALID),
    (UnreadableFile, EXIT_INVALID),
    (TooDeep, EXIT_INVALID),
    (UsageError, EXIT_INVALID),
    (NatsUnavailable, EXIT_NATS),
    (ServerError, EXIT_NATS),
    (nats.errors.NoServersError, EXIT_NATS),
    (nats.errors.TimeoutError, EXIT_NATS),
    (nats.js.errors.ServiceUnavailableError, EXIT_NATS),
    (PublishOutcomeUnknown, EXIT_NATS),
    (TimeoutError, EXIT_NATS),
    (StreamsMissing, EXIT_NATS),
]


@pytest.mark.parametrize(("cls", "code"), BEFORE, ids=[c.__name__ for c, _ in BEFORE])
def test_every_error_the_cli_answered_keeps_its_exit_code(cls: type[BaseException], code: int) -> None:
    assert exit_code_for(bare(cls)) == code


# the ones the commands caught themselves (with these codes), now in a family too
@pytest.mark.parametrize(
    ("cls", "code"),
    [
        (ScheduleError, EXIT_INVALID),
        (StartRefused, EXIT_INVALID),
        (ExecutionNotFound, EXIT_INVALID),
        (PlaybookNotRegistered, EXIT_INVALID),
        (CatalogPathInvalid, EXIT_INVALID),
        (ExecutionNotFinished, EXIT_TIMEOUT),
    ],
)
def test_errors_the_commands_catch_belong_to_the_family_of_their_code(cls: type[BaseException], code: int) -> None:
    assert exit_code_for(bare(cls)) == code


def test_our_errors_keep_the_builtin_bases_existing_excepts_catch() -> None:
    for cls in (
        InvalidExecutionId,
        TooLarge,
        ValueTooLarge,
        SettingsInvalid,
        RetryRefused,
        UnknownExecution,
        PayloadUnreadable,
        RecordInvalid,
        TooDeep,
        StartRefused,
    ):
        assert issubclass(cls, ValueError) and issubclass(cls, UserError), cls
    assert issubclass(UnreadableFile, OSError) and issubclass(ServerError, RuntimeError)
    e = UnreadableFile(21, "is a directory", "/etc")
    assert str(e) == "/etc: is a directory" and e.errno == 21
    assert issubclass(StreamsMissing, StreamsError) and issubclass(ServerError, StreamsError)


def test_an_error_of_no_family_is_a_bug_and_keeps_its_traceback() -> None:
    assert exit_code_for(ActorsError("ours, of no family")) is None
    assert exit_code_for(bare(ExecutionFailed)) is None  # `result` answers it itself (exit 1 or 2)
    assert exit_code_for(KeyError("x")) is None
    assert exit_code_for(ValueError("x")) is None
    assert exit_code_for(PermissionError(13, "denied")) is None  # only a missing file is the user's
