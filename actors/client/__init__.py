"""What users (the CLI, tests, benches) do against a running system: register
playbooks, start and cancel executions, read status, read and follow logs.

Execution ids are checked before they go into a subject or a key (`*`, `>` or `.`
would address other executions). Starts are idempotent by id: the first start record
is what runs; `start_execution` says whether an execution with the id already
existed and what differs from the start that runs.

Every call rides out a stream leader election and a reconnect for up to `timeout`
seconds (default `dial.CLIENT_TIMEOUT`, which covers an election): publishes are sent
again with the same Nats-Msg-Id (`natsio.Publisher.send`; a start's id is its
execution id, so it runs once however often it is sent), reads are asked again
(`natsio.ride_out`). Past the timeout a call raises `dial.NatsUnavailable`, one line
that says what failed, or which publish is unconfirmed (sending it again is safe). What
the server refuses this NATS user (a permissions violation) raises `Denied` instead,
naming what was refused: a publish at once, a request when two tries in a row meet the
same refusal (actors/natsio/denials.py).

One module per idea:

* `session`: what every call shares (connection, timeout, ride-out, publish with its id)
* `writing`: register, start (`StartOutcome`), cancel, and whether an execution exists
* `reading`: status, wait, follow, events, result, iterations, progress, dead letters
* `runs`: run, a start and a wait with the status watched from before the start
* `listing`: executions newest first (`list`, from stream INDEX) and the catalog (`playbooks`)
* `outcome`: what `result(ID)` raises for an execution without a result; running steps
* `outputs`: what steps printed (`StepOutput`), read, followed, whole text
* `logview`: `LogItem`, a log entry as users see it, and `log_items`
* `checks`: execution ids and value sizes, checked before they go to NATS
* `schedules`: cron schedules that start a playbook (add, list, pause, resume, delete)
* `triggers`: a playbook started for every message on a NATS subject (add, list, pause, resume, delete)
* `retrying`: retry a terminal execution from a step (`RetryOutcome`)
* `steps`: each step's whole story folded from the log (`StepStory`: attempts, errors, retries)
* `deadletters`: dead letters newest first, a page at a time (the UI's page)
* `hooks`: webhooks (add, list, rotate, delete; what `POST /hooks/<name>` does)
* `signals`: send a signal to an execution's waiting step, answer an approval step
* `rollback`: before a roll back to an engine of semantics 5, a plain copy of each start
  stored with its first decision (`prepare_rollback`)

The names below are what the rest of the tree imports from `actors.client`."""

from __future__ import annotations

from nats.aio.client import Client as NATS

from actors.client.archiving import Archiver, ArchiveReport
from actors.client.checks import InvalidExecutionId, TooLarge, check_execution_id, check_size
from actors.client.connecting import CLIENT_TIMEOUT, Connecting, open_client
from actors.client.deadletters import DeadLetterReader
from actors.client.hooks import HookError, Hooks
from actors.client.listing import Lister
from actors.client.logview import LogItem, log_items
from actors.client.outcome import ExecutionFailed, ExecutionNotFinished, ExecutionNotFound
from actors.client.outputs import StepOutputs
from actors.client.retrying import Retrier, RetryOutcome, RetryRefused, UnknownExecution
from actors.client.rollback import RollbackReport, Rollbacks
from actors.client.runs import Runs
from actors.client.schedules import ScheduleError, ScheduleView, Scheduling
from actors.client.signals import ExecutionNotKnownYet, InvalidSignal, NotWaiting, SignalRefused, Signals
from actors.client.steps import StepStories, StepStory, UnknownStep
from actors.client.triggers import TriggerError, Triggering, TriggerView
from actors.client.writing import StartOutcome, StartRefused
from actors.config.settings import Settings
from actors.natsio.connopts import ConnectOptions
from actors.natsio.denials import Denied
from actors.store.archive import archive_reader
from actors.wire.codec import PayloadCodec
from actors.wire.messages import Limits
from streams.layout import Layout


class Client(
    Hooks,
    Signals,
    Retrier,
    Runs,
    StepOutputs,
    StepStories,
    Scheduling,
    Triggering,
    Lister,
    Archiver,
    Rollbacks,
    DeadLetterReader,
):
    """`timeout`: seconds each call keeps trying through an election or a reconnect
    before it raises NatsUnavailable."""

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        timeout: float = CLIENT_TIMEOUT,
        layout: Layout | None = None,
        name: str = "actors-client",
        codec: PayloadCodec | None = None,
        options: ConnectOptions | None = None,
        limits: Limits | None = None,
        archive: str | None = None,
    ) -> Connecting[Client]:
        """A client on a connection of its own to `url` (a cluster: URLs separated by
        commas; credentials in the URL, `nats://user:password@host:4222`), reached
        within `timeout` seconds, else `actors.natsio.dial.NatsUnavailable` (at once if the
        credentials are refused). `layout`: the deployment's (default: read from the
        environment, `ACTORS_PARTITIONS` etc., as `actors-cli` does). Use
        `async with Client.connect(url) as client:`, or `client = await
        Client.connect(url)` and `await client.close()`. `codec`: the payload keys
        (default: read from the environment, `ACTORS_PAYLOAD_KEY` etc., as `actors-cli`
        does; `Settings(payload_key=...).payload_codec`). `options`: credentials and
        TLS (`actors.natsio.connopts.ConnectOptions`; default: the environment's, NATS_USER,
        NATS_CREDS, NATS_TLS_CA etc., as `actors-cli` reads them). `limits`: the
        ceilings a playbook registered is checked against (default: read from the
        environment, `ACTORS_MAX_ATTEMPTS_CEILING` etc., as a pod reads them). `archive`:
        where executions removed by retention are read back from, a directory path or
        `objects` (default: `ACTORS_ARCHIVE`; the `archive` bucket unless it names a path)."""
        env = Settings.from_env() if codec is None or limits is None or archive is None else None  # read once
        keys = codec if codec is not None or env is None else env.payload_codec
        bounds = limits if limits is not None or env is None else env.limits
        place = archive if archive is not None or env is None else env.archive

        def make(nc: NATS, lay: Layout, t: float) -> Client:
            store = archive_reader(nc, place) if place is not None else None
            return cls(nc, layout=lay, timeout=t, owns_connection=True, codec=keys, limits=bounds, archive=store)

        return Connecting(lambda: open_client(make, url, timeout=timeout, layout=layout, name=name, options=options))


__all__ = [
    "ArchiveReport",
    "Client",
    "Connecting",
    "Denied",
    "ExecutionFailed",
    "ExecutionNotFinished",
    "ExecutionNotFound",
    "ExecutionNotKnownYet",
    "HookError",
    "InvalidExecutionId",
    "InvalidSignal",
    "LogItem",
    "NotWaiting",
    "RetryOutcome",
    "RetryRefused",
    "RollbackReport",
    "ScheduleError",
    "ScheduleView",
    "SignalRefused",
    "StartOutcome",
    "StartRefused",
    "StepStory",
    "TooLarge",
    "TriggerError",
    "TriggerView",
    "UnknownExecution",
    "UnknownStep",
    "check_execution_id",
    "check_size",
    "log_items",
]
