"""Every stream, subject, consumer and KV bucket, declared in one place.

Subjects
--------
``exec.<partition>.<execution_id>.<class>.<type>`` in stream EXEC, the per-execution
log; or, in a deployment of ``exec_streams`` S over 1 (ACTORS_EXEC_STREAMS), in stream
``EXEC_<partition mod S>``, each holding ``exec.<p>.>`` of its partitions, so that S
streams fsync side by side (`Layout.exec_stream`; S is fixed for a deployment, and
`ensure` refuses a pod whose S disagrees with the streams there). ``class`` separates
who writes and who reads:

* ``in``  inputs the engine folds: the start record, tool results, cancel requests.
  Written by the starter, tool actors and the CLI; the engine's partition consumers
  filter on ``exec.<p>.*.in.>`` so they never receive the engine's own output. From
  semantics 5 the engine writes inputs too, answer records (``in.answer...``): a step's
  result stored with the decision it led to and, from 6, the start with its first
  decision; those that carry lifecycle events (``in.answer.lc.<type>``, with
  ``.cmd.<kind>`` after it when the record holds a command) the projector and that
  kind's tool actors read as well.
* ``ev``  the engine's decision records (step.enter, command.issued, step.exit ...):
  one message per decision, so a decision lands whole or not at all. From semantics 2
  on, a record holding the decision's one command to a tool is on ``ev.cmd.<kind>``,
  where tool actors take it (consumer ``tools-<kind>-log``, on each stream of logs):
  the command is stored once.
* ``sch`` durable timers (retry delays): schedule definitions the server fires into
  ``in.timer.<timer_id>`` when due, so a delay survives the loss of every process.
* ``lc``  lifecycle events (``playbook.*``, ``workflow.*``, ``execution.*``). The
  status projector filters on ``exec.*.*.lc.>`` and reads nothing else. From semantics
  2 on, a decision with lifecycle events is one message: one event carries the
  decision's record and its other lifecycle events (actors/wire/events.py
  ``LifecycleExtras``), on its own subject, with ``.cmd.<kind>`` after it when the
  record holds a command (an execution's first decision).

Why partitions in the subject: an engine pod owns partitions, not executions; one
durable consumer per partition keeps ownership coarse (a handful of consumers per pod,
whatever the number of executions) and lets issue 6 move partitions between pods.

``cmd.<kind>.<execution_id>.<command_id>`` in stream CMD (work queue): commands that
are messages of their own (a loop's iterations, a decision's several commands, a
command too large to be held by its record, every command of semantics 1), competing
consumers per kind. A command's result goes to ``exec.<p>.<id>.in.result`` (executions
of semantics 4 on: one subject for every result of the execution, the command id in
the result, so a step adds no subject to the server's per-subject index) or, in an
older execution, ``exec.<p>.<id>.in.result.<command_id>``. ``start`` in stream START
(work queue): start messages.
``dlq.<source>`` in stream DLQ: messages an actor could not handle, with the reason.
``index.start.<execution_id>`` in stream INDEX: one entry per execution (playbook,
version, start time), appended by the status projector when it first records the
execution, so the newest executions are the stream's last messages; and in stream
ENDED ``index.end.<state>.<execution_id>``, its final status once terminal
(`actors-cli list`; two streams, so a burst of ends never pushes the starts apart).

``loop.<partition>.<execution_id>.<loop_id>.<class>.<type>`` in stream LOOP: one loop's
own log, read by the counter actor, never by the engine: the spec (``in.spec``),
iteration results (``in.res.<command_id>``, or several of one loop at once in
``in.res.batch``), retry timers (``sch``/``in.timer``) and a
cancel. Keeping iterations out of EXEC is what keeps an execution's log the same size
for 10 iterations or 100,000. The counter appends one verdict to the execution's inputs
when the loop ends (``in.iterator.<loop_id>``; ``in.iterator`` from semantics 4).

``schedules.def.<name>`` in stream SCHEDULES: a schedule's cron definition (a
``Nats-Schedule`` message whose body is a start message); the server publishes the body
to ``schedules.fire.<name>`` at each tick, and the starter starts each fire under an id
derived from the schedule and the fire time. KV ``schedules`` keeps each schedule's spec.

Object store ``blobs``: values too large for one message (a step result, a command, a
loop's collection, scope or aggregated results, a large execution result), referenced by
key from the message (actors/store/blobs.py). Object store ``payloads``: start payloads too
large for one message, apart so that clients may write them and nothing else.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Awaitable
from dataclasses import dataclass, field

from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError, NotFoundError

from streams.errors import StreamsError

# subjects are spelled in streams/subjects.py; these names are re-exported for the
# modules that read them with the layout
from streams.subjects import (
    ANSWER_LIFECYCLE_FILTER,
    ENDED_FILTER,
    EV,
    IN,
    INDEX_FILTER,
    LC,
    LIFECYCLE_FILTER,
    SCH,
    SCHEDULE_FIRES_FILTER,
    START_SUBJECT,
    STATUS_REPUBLISH_DEST,
    ExecSubjects,
    LoopSubjects,
    class_of,
    cmd_filter,
    cmd_subject,
    counter_filter,
    deliver_subject,
    dlq_subject,
    engine_filter,
    execution_of,
    kv_key_subject,
    kv_stream,
    loop_class,
    loop_key,
    loop_type,
    partition_of,
    progress_subject,
    result_batch_subject,
    tool_log_filters,
    type_of,
)

EXEC_STREAM = "EXEC"
CMD_STREAM = "CMD"
LOOP_STREAM = "LOOP"
BLOB_BUCKET = "blobs"
# start payloads too large for a message: a bucket of their own, the one clients may
# write (actors/store/blobs.py, actors/pod/permissions.py)
PAYLOAD_BUCKET = "payloads"
# finished executions archived before they are removed (actors/store/archive.py), one
# object each, when the deployment archives to the object store
ARCHIVE_BUCKET = "archive"
START_STREAM = "START"
DLQ_STREAM = "DLQ"
STATUS_BUCKET = "status"
CATALOG_BUCKET = "catalog"
INDEX_STREAM = "INDEX"
ENDED_STREAM = "ENDED"
SCHEDULE_STREAM = "SCHEDULES"
SCHEDULES_BUCKET = "schedules"  # one entry per schedule: what `actors-cli schedule list` shows
TRIGGERS_BUCKET = "triggers"  # one entry per trigger, and its counts (actors/wire/triggers.py)
HOOKS_BUCKET = "hooks"  # one entry per webhook (actors/wire/hooks.py): its action and its token's digest
OWNERS_BUCKET = "owners"  # partition leases and pod membership (entries age out: the lease TTL)


def is_exec_stream(name: str) -> bool:
    """Is `name` a stream of executions' logs (EXEC, or EXEC_<k> when there are several)?"""
    return name == EXEC_STREAM or (name.startswith(f"{EXEC_STREAM}_") and name[len(EXEC_STREAM) + 1 :].isdigit())


EXECUTION_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")

# kinds run by tool actors (one durable consumer each); `playbook` runs in the engine
TOOL_KINDS = ("python", "http", "shell", "noop", "sleep", "duckdb", "postgres")


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Deployment-wide settings. Partition count is fixed for the life of a deployment
    (it is part of every execution's subject). Built from a pod's environment by
    `actors.config.settings.Settings.layout`."""

    partitions: int = 8
    # streams an execution's log is spread over: 1, stream EXEC (every deployment before
    # it); S > 1, partition p's log in stream EXEC_<p mod S>. nats-server fsyncs one
    # stream's writes one after another (`sync always`), so under load one stream's
    # fsyncs bound every execution's progress; S streams fsync side by side. Fixed for
    # the life of a deployment, as the partition count: `ensure` refuses another
    exec_streams: int = 1
    replicas: int = 1
    duplicate_window: float = 120.0
    max_msg_size: int = 1024 * 1024
    # seconds a finished execution's records (its log, its loops' logs, its index entries,
    # its status and its blobs) are kept after it ended; then the retention actor
    # archives them (if an archive is set) and removes them (actors/retention/). 0: kept
    # for ever. A running execution is never removed, however old: no stream of an
    # execution's records has an age limit of its own
    finished_retention: float = 7 * 24 * 3600.0
    # stream DLQ's age limit (0: for ever): longer than the finished executions', so an
    # execution's dead letters are still there to be archived with it (then removed)
    dead_letter_retention: float = 14 * 24 * 3600.0
    archive_retention: float = 0.0  # the `archive` bucket's age limit; 0: for ever
    ack_wait: float = 30.0
    max_deliver: int = 5
    engine_max_ack_pending: int = 4096
    tool_max_ack_pending: int = 1024
    counter_max_ack_pending: int = 16384
    lease_ttl: float = 10.0  # a dead pod's partitions are taken over after at most this
    # actors an engine (per execution) or counter (per loop) pod keeps in memory; past
    # that, idle ones are evicted and rebuilt by replay when their next input comes
    engine_max_resident: int = 50_000
    counter_max_resident: int = 10_000
    # a value (result, args, payload) whose encoding is over this is refused, not
    # stored as a blob (actors/store/blobs.py); clients and actors of a deployment agree on it
    max_value_bytes: int = 64 * 1024 * 1024
    # bytes of what one step attempt printed kept in the object store; past it the rest
    # is counted, not kept (the event's tail still shows the end)
    step_output_max_bytes: int = 8 * 1024 * 1024
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 1 <= self.exec_streams <= self.partitions:
            raise ValueError(
                f"exec_streams must be from 1 to the partition count ({self.partitions}), not {self.exec_streams}"
            )

    @property
    def fire_ttl(self) -> float:
        """Seconds a schedule's fire is kept (a fire is taken within seconds; the TTL
        only bounds fires nobody took): the finished executions' retention, a week
        when they are kept for ever."""
        return self.finished_retention or 7 * 24 * 3600.0

    # --- subjects ----------------------------------------------------------------

    def partition_of(self, execution_id: str) -> int:
        return partition_of(execution_id, self.partitions)

    # --- the streams of executions' logs ------------------------------------------

    def exec_stream(self, partition: int) -> str:
        """The stream holding partition `partition`'s logs: EXEC when there is one
        (`exec_streams` 1, every deployment before it), else EXEC_<partition mod S>."""
        if self.exec_streams == 1:
            return EXEC_STREAM
        return f"{EXEC_STREAM}_{partition % self.exec_streams}"

    def exec_stream_of(self, execution_id: str) -> str:
        """The stream holding the log of `execution_id`."""
        return self.exec_stream(self.partition_of(execution_id))

    def exec_stream_holding(self, subject: str) -> str:
        """The stream holding `subject`, one of an execution's log (`exec.<p>.<id>...`)."""
        return self.exec_stream(int(subject.split(".", 2)[1]))

    @property
    def exec_stream_names(self) -> tuple[str, ...]:
        """Every stream of executions' logs, EXEC or EXEC_0 .. EXEC_<S-1>."""
        return tuple(self.exec_stream(k) for k in range(self.exec_streams))

    def exec_stream_partitions(self, stream: str) -> list[int]:
        """The partitions whose logs `stream` holds."""
        return [p for p in range(self.partitions) if self.exec_stream(p) == stream]

    def exec_stream_subjects(self, stream: str) -> list[str]:
        """The subjects of `stream`: `exec.>` when it is the only one, else
        `exec.<p>.>` for each of its partitions."""
        if self.exec_streams == 1:
            return ["exec.>"]
        return [f"exec.{p}.>" for p in self.exec_stream_partitions(stream)]

    def execution(self, execution_id: str) -> ExecSubjects:
        """The subjects of an execution's log."""
        return ExecSubjects.of(execution_id, self.partitions)

    def loop(self, execution_id: str, loop_id: str) -> LoopSubjects:
        """The subjects of a loop's log."""
        return LoopSubjects.of(execution_id, loop_id, self.partitions)

    def exec_prefix(self, execution_id: str) -> str:
        return f"exec.{self.partition_of(execution_id)}.{execution_id}"

    def exec_subject(self, execution_id: str, cls: str, type_: str) -> str:
        return f"{self.exec_prefix(execution_id)}.{cls}.{type_}"

    def loop_prefix(self, execution_id: str, loop_id: str) -> str:
        return f"loop.{self.partition_of(execution_id)}.{execution_id}.{loop_id}"

    def loop_subject(self, execution_id: str, loop_id: str, cls: str, type_: str) -> str:
        return f"{self.loop_prefix(execution_id, loop_id)}.{cls}.{type_}"


def counter_consumer(partition: int) -> str:
    return f"counter-p{partition}"


def engine_consumer(partition: int) -> str:
    return f"engine-p{partition}"


PROJECTOR_CONSUMER = "projector"
# the lifecycle carriers: every lifecycle event, and (semantics 5) the answer records
# that carry the last step's decision, the execution's end (`in.answer.lc.<type>`), and
# from 6 the start's first decision (`in.answer.lc.playbook.initialized[.cmd.<kind>]`). Still
# only lifecycle carriers: no decision record, result or other input reaches the projector
PROJECTOR_FILTER = [LIFECYCLE_FILTER, ANSWER_LIFECYCLE_FILTER]
STARTER_CONSUMER = "starter"
SCHEDULE_FIRES_CONSUMER = "schedule-fires"  # read by the starter, beside start messages


def tool_consumer(kind: str) -> str:
    return f"tools-{kind}"


# the retention actors' pull consumer on ENDED: finished executions in end order, each
# archived and removed once its retention is over (actors/retention/)
RETENTION_CONSUMER = "retention"


def obj_stream(bucket: str) -> str:
    """The stream under an object store bucket."""
    return f"OBJ_{bucket}"


def tool_log_consumer(kind: str) -> str:
    """The tool consumer of `kind` on EXEC: commands held by their decision record."""
    return f"tools-{kind}-log"


# --- declaration ---------------------------------------------------------------------


def stream_configs(layout: Layout) -> list[api.StreamConfig]:
    common = dict(
        num_replicas=layout.replicas,
        storage=api.StorageType.FILE,
        duplicate_window=layout.duplicate_window,
        max_msg_size=layout.max_msg_size,
        allow_direct=True,  # direct gets: replay checks, duplicate-start checks
    )
    exec_streams = [
        api.StreamConfig(
            name=name,
            description="per-execution logs: inputs, decisions, lifecycle",
            subjects=layout.exec_stream_subjects(name),
            retention=api.RetentionPolicy.LIMITS,
            # no age limit: a running execution's log is kept however old; a finished
            # one's is removed by the retention actor (actors/retention/), whole
            max_age=0,
            # durable timers: the engine stores a schedule on exec.<p>.<id>.sch.<timer>
            # and the server publishes its body to exec.<p>.<id>.in.timer.<timer> when due
            allow_msg_schedules=True,
            **common,  # type: ignore[arg-type]
        )
        for name in layout.exec_stream_names
    ]
    return [
        *exec_streams,
        api.StreamConfig(
            name=LOOP_STREAM,
            description="per-loop logs read by the counter: spec, iteration results, timers",
            subjects=["loop.>"],
            retention=api.RetentionPolicy.LIMITS,
            max_age=0,  # as EXEC: removed with its execution
            allow_msg_schedules=True,  # per-iteration retry delays
            **common,  # type: ignore[arg-type]
        ),
        api.StreamConfig(
            name=CMD_STREAM,
            description="commands for tool actors (work queue)",
            subjects=["cmd.>"],
            retention=api.RetentionPolicy.WORK_QUEUE,
            **common,  # type: ignore[arg-type]
        ),
        api.StreamConfig(
            name=START_STREAM,
            description="start messages (work queue); Nats-Msg-Id = execution_id",
            subjects=[START_SUBJECT],
            retention=api.RetentionPolicy.WORK_QUEUE,
            **common,  # type: ignore[arg-type]
        ),
        api.StreamConfig(
            name=DLQ_STREAM,
            description="messages an actor could not handle, with the reason",
            subjects=["dlq.>"],
            retention=api.RetentionPolicy.LIMITS,
            # never under the duplicate window (the server refuses a stream whose age limit is)
            max_age=max(layout.dead_letter_retention, layout.duplicate_window) if layout.dead_letter_retention else 0,
            **common,  # type: ignore[arg-type]
        ),
        api.StreamConfig(
            name=INDEX_STREAM,
            description="one entry per execution in start order, by the status projector (actors-cli list)",
            subjects=[INDEX_FILTER],
            # no age limit: an entry goes with its execution (actors/retention/)
            retention=api.RetentionPolicy.LIMITS,
            max_msgs_per_subject=1,  # one entry per execution, even re-sent past the duplicate window
            **common,  # type: ignore[arg-type]
        ),
        api.StreamConfig(
            name=ENDED_STREAM,
            description="each execution's final status in end order, by the status projector (actors-cli list)",
            subjects=[ENDED_FILTER],
            # no age limit: the retention actor reads it in end order, and removes an
            # entry with its execution
            retention=api.RetentionPolicy.LIMITS,
            max_msgs_per_subject=1,
            **common,  # type: ignore[arg-type]
        ),
        api.StreamConfig(
            name=SCHEDULE_STREAM,
            description="cron schedules (schedules.def.<name>) and their fires (schedules.fire.<name>)",
            subjects=["schedules.>"],
            retention=api.RetentionPolicy.LIMITS,
            # no max_age: a definition must outlive any age limit; each fire carries a TTL
            # (Nats-Schedule-TTL, the logs' age) instead
            allow_msg_schedules=True,
            allow_msg_ttl=True,
            **common,  # type: ignore[arg-type]
        ),
    ]


def _push(
    layout: Layout,
    name: str,
    filter_subject: str | list[str],
    max_ack_pending: int,
    deliver_policy: api.DeliverPolicy | None = None,
    *,
    skips: bool = True,
) -> api.ConsumerConfig:
    """A durable push consumer delivering to `_deliver.<name>`, read by a queue group of
    the same name (every pod of the role subscribes; see `deliver_subject`)."""
    return api.ConsumerConfig(
        durable_name=name,
        deliver_subject=deliver_subject(name),
        deliver_group=name,
        # several filters (the projector's) as filter_subjects (server 2.10 on)
        filter_subject=filter_subject if isinstance(filter_subject, str) else None,
        filter_subjects=None if isinstance(filter_subject, str) else list(filter_subject),
        ack_policy=api.AckPolicy.EXPLICIT,
        ack_wait=layout.ack_wait,
        # skips=False: a log whose every entry matters (an execution's inputs, a loop's
        # results, lifecycle events). Its actors retry in place and dead-letter bad
        # input themselves; a pod crash or handover counts as a delivery, and an
        # outage (KV or stream unavailable) as several, so a limit here would let the
        # server drop an entry that is perfectly good
        max_deliver=layout.max_deliver if skips else -1,
        max_ack_pending=max_ack_pending,
        deliver_policy=deliver_policy,
    )


def consumer_configs(layout: Layout, tool_kinds: tuple[str, ...]) -> dict[str, list[api.ConsumerConfig]]:
    """Durable consumers per stream. Push consumers for the engine, counter, projector
    and starter (the fastest delivery nats-py has, 66-105k msg/s here); pull for tools
    (competing consumers across pods, back-pressure by fetching only what a pod can run)."""
    every = range(layout.partitions)
    engine = [
        _push(
            layout,
            engine_consumer(p),
            engine_filter(p),
            layout.engine_max_ack_pending,
            api.DeliverPolicy.ALL,
            skips=False,
        )
        for p in every
    ]
    counters = [
        _push(
            layout,
            counter_consumer(p),
            counter_filter(p),
            layout.counter_max_ack_pending,
            api.DeliverPolicy.ALL,
            skips=False,
        )
        for p in every
    ]
    projector = _push(layout, PROJECTOR_CONSUMER, PROJECTOR_FILTER, layout.engine_max_ack_pending, skips=False)
    # the starter dead-letters a bad start message itself; what else fails is transient
    starter = _push(layout, STARTER_CONSUMER, START_SUBJECT, layout.engine_max_ack_pending, skips=False)
    fires = _push(layout, SCHEDULE_FIRES_CONSUMER, SCHEDULE_FIRES_FILTER, layout.engine_max_ack_pending, skips=False)
    tools = [
        api.ConsumerConfig(
            durable_name=tool_consumer(kind),
            filter_subject=cmd_filter(kind),
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=layout.ack_wait,
            max_deliver=layout.max_deliver,
            max_ack_pending=layout.tool_max_ack_pending,
        )
        for kind in tool_kinds
    ]
    # commands held by their decision record in the execution's log (semantics 2): the
    # same competing pull consumers, on EXEC. Acks do not delete (limits retention):
    # the record is the execution's history. Created with the stream's deployment,
    # before any such record exists, so "all" delivers each command once; a consumer
    # deleted and made again would deliver old commands again, which tool actors answer
    # without running when the log already holds their result (actors/tools/running.py)
    tools_log = [
        api.ConsumerConfig(
            durable_name=tool_log_consumer(kind),
            filter_subjects=tool_log_filters(kind),
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=layout.ack_wait,
            max_deliver=layout.max_deliver,
            max_ack_pending=layout.tool_max_ack_pending,
            deliver_policy=api.DeliverPolicy.ALL,
        )
        for kind in tool_kinds
    ]
    # pull: competing retention actors, each taking the oldest ends; one not due yet is
    # handed back with a delay (actors/retention/), so it is never given up on
    retention = api.ConsumerConfig(
        durable_name=RETENTION_CONSUMER,
        filter_subject=ENDED_FILTER,
        ack_policy=api.AckPolicy.EXPLICIT,
        ack_wait=layout.ack_wait,
        max_deliver=-1,
        max_ack_pending=layout.tool_max_ack_pending,
        deliver_policy=api.DeliverPolicy.ALL,
    )
    # each stream of logs: its partitions' engine consumers, and its own projector and
    # tool consumers (the same names on every stream: a projector's push consumers all
    # deliver to one subject, a tool pod pulls from each)
    logs = {
        name: [*(engine[p] for p in layout.exec_stream_partitions(name)), projector, *tools_log]
        for name in layout.exec_stream_names
    }
    return {
        ENDED_STREAM: [retention],
        **logs,
        CMD_STREAM: tools,
        START_STREAM: [starter],
        LOOP_STREAM: counters,
        SCHEDULE_STREAM: [fires],
    }


class StreamsMissing(StreamsError):
    """Streams, consumers or buckets are missing and this connection could not create
    them (its NATS user may not: only the engine's may, see actors/pod/permissions.py)."""

    SHOWN = 6  # names in the message; the rest are counted

    def __init__(self, missing: list[str]) -> None:
        self.missing = missing
        more = len(missing) - self.SHOWN
        names = ", ".join(missing[: self.SHOWN]) + (f" and {more} more" if more > 0 else "")
        super().__init__(
            f"{names} missing in NATS, and creating them got no answer (this NATS user may not create "
            f"them: an engine pod does, at its start)"
        )


class ExecStreamsMismatch(StreamsError):
    """The streams of executions' logs in NATS are not the ones this pod's
    `exec_streams` names: like the partition count, it is fixed for a deployment."""


async def check_exec_streams(js: JetStreamContext, layout: Layout) -> None:
    """Refuse (`ExecStreamsMismatch`) a layout whose `exec_streams` disagrees with the
    streams that exist: EXEC holding messages while it is over 1, EXEC_<k> while it is
    1, or an EXEC_0 whose subjects are another count's. An empty EXEC is refused too
    when it is over 1 (its subjects overlap theirs): the message says to delete it."""

    async def info(name: str) -> api.StreamInfo | None:
        try:
            return await js.stream_info(name)
        except NotFoundError:
            return None

    setting = f"ACTORS_EXEC_STREAMS={layout.exec_streams}"
    fixed = "fixed for a deployment, like ACTORS_PARTITIONS"
    if layout.exec_streams == 1:
        if await info(f"{EXEC_STREAM}_0") is not None:
            raise ExecStreamsMismatch(
                f"{setting} but stream {EXEC_STREAM}_0 exists: this deployment spreads its logs over several "
                f"streams (ACTORS_EXEC_STREAMS over 1), {fixed}"
            )
        return
    first = layout.exec_stream(0)
    got = await info(first)
    if got is not None and sorted(got.config.subjects or []) != sorted(layout.exec_stream_subjects(first)):
        raise ExecStreamsMismatch(
            f"{setting} with {layout.partitions} partitions but stream {first} holds {got.config.subjects}: "
            f"this deployment has another count, {fixed}"
        )
    single = await info(EXEC_STREAM)
    if single is None:
        return
    held = f"holds {single.state.messages} messages" if single.state.messages else "exists (empty)"
    raise ExecStreamsMismatch(
        f"{setting} but stream {EXEC_STREAM} {held}: this deployment keeps every log in one stream "
        f"(ACTORS_EXEC_STREAMS=1), {fixed}"
        + ("" if single.state.messages else f"; if it never ran, delete stream {EXEC_STREAM} first")
    )


async def ensure(
    js: JetStreamContext, layout: Layout, *, tool_kinds: tuple[str, ...] = TOOL_KINDS, update: bool = True
) -> None:
    """Create or update every stream, consumer and bucket. Idempotent: engine pods call
    it at start, so a new deployment needs no separate migration step.

    `update=False` (every other role, the CLI and the client): only look them up, and
    declare them only when something is missing. A NATS user that may look streams up
    but not create them (actors/pod/permissions.py) then starts against streams that exist;
    when some are missing and its create is refused (the server drops the request: no
    answer), StreamsMissing names them."""
    if not update:
        missing = await missing_parts(js, layout, tool_kinds=tool_kinds)
        if not missing:
            return
        try:
            await _declare(js, layout, tool_kinds)
        except TimeoutError:
            raise StreamsMissing(missing) from None
        return
    await _declare(js, layout, tool_kinds)


async def missing_parts(js: JetStreamContext, layout: Layout, *, tool_kinds: tuple[str, ...] = TOOL_KINDS) -> list[str]:
    """The streams, consumers and buckets `ensure` declares that do not exist, looked
    up concurrently (`stream 'EXEC'`, `consumer 'CMD/tools-python'`, `bucket 'status'`)."""

    async def exists(what: str, lookup: Awaitable[object]) -> str | None:
        try:
            await lookup
        except NotFoundError:
            return what
        return None

    checks = [exists(f"stream {cfg.name!r}", js.stream_info(cfg.name or "")) for cfg in stream_configs(layout)]
    # the tool consumers on EXEC (semantics 2) are not required: during a rolling upgrade
    # from semantics 1 the engine pods that create them may not run yet, and a tool pod,
    # CLI or client of 2 must start beside them all the same (a tool pull asks again,
    # backing off, while its consumer does not exist; no such command exists yet either)
    # and so is the retention actors' consumer, which only engine pods of a later version create
    added_later = {(name, tool_log_consumer(kind)) for kind in tool_kinds for name in layout.exec_stream_names} | {
        (ENDED_STREAM, RETENTION_CONSUMER)
    }
    checks += [
        exists(f"consumer {stream + '/' + (c.durable_name or '')!r}", js.consumer_info(stream, c.durable_name or ""))
        for stream, consumers in consumer_configs(layout, tool_kinds).items()
        for c in consumers
        if (stream, c.durable_name) not in added_later
    ]
    checks += [exists(f"bucket {b!r}", js.stream_info(obj_stream(b))) for b in (BLOB_BUCKET, PAYLOAD_BUCKET)]
    checks += [
        exists(f"bucket {b!r}", js.stream_info(kv_stream(b)))
        # not HOOKS_BUCKET nor TRIGGERS_BUCKET, added later: pods and clients of this version beside
        # engine pods of an earlier one would wait for them; only a hook's calls and the trigger
        # role need them, and say so when they are missing
        for b in (OWNERS_BUCKET, STATUS_BUCKET, CATALOG_BUCKET, SCHEDULES_BUCKET)
    ]
    return [m for m in await asyncio.gather(*checks) if m is not None]


# a cluster still forming (a node not yet known to the meta leader) cannot place a
# replicated stream: nats-server's JSClusterNoPeersErr. Asked again for a while
NO_PEERS_FOR_PLACEMENT = 10005
PLACEMENT_PATIENCE = 30.0  # seconds


async def _add_or_update_stream(js: JetStreamContext, cfg: api.StreamConfig) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PLACEMENT_PATIENCE
    delay = 0.1
    while True:
        try:
            await js.add_stream(cfg)
            return
        except BadRequestError as e:
            if e.err_code != NO_PEERS_FOR_PLACEMENT:
                if is_exec_stream(cfg.name or ""):
                    await _same_subjects(js, cfg)  # a stream of logs never takes another count's subjects
                await js.update_stream(cfg)  # it exists: its settings brought up to date
                return
            if loop.time() + delay > deadline:
                raise
        await asyncio.sleep(delay)  # the peers join within seconds: nothing to await but time
        delay = min(delay * 2, 2.0)


async def _same_subjects(js: JetStreamContext, cfg: api.StreamConfig) -> None:
    """A stream of logs that exists keeps its subjects: a pod of another
    `exec_streams` that got past `check_exec_streams` at the same time as the pod that
    made it (both found nothing) is refused here rather than rewriting them, which would
    leave stored messages under subjects their stream no longer lists."""
    held = sorted((await js.stream_info(cfg.name or "")).config.subjects or [])
    if held != sorted(cfg.subjects or []):
        raise ExecStreamsMismatch(
            f"stream {cfg.name} holds {held} but this pod's ACTORS_EXEC_STREAMS gives it {sorted(cfg.subjects or [])}: "
            "another count, fixed for a deployment, like ACTORS_PARTITIONS"
        )


def _filters(cfg: api.ConsumerConfig) -> list[str]:
    return list(cfg.filter_subjects or ()) or ([cfg.filter_subject] if cfg.filter_subject else [])


async def _widened(js: JetStreamContext, stream: str, cfg: api.ConsumerConfig) -> api.ConsumerConfig:
    """`cfg` with every filter the existing consumer of its name has and it lacks:
    declaring a consumer only ever widens its filters. `add_consumer` rewrites an
    existing consumer's filters, so a pod of an older release declaring the streams
    again (a rollback, one old pod left in a roll) would narrow a tool log consumer or
    the projector's, and the messages stored on the dropped subjects meanwhile (answer
    records, semantics 5) would never be delivered, even after widening again: steps
    lost, executions RUNNING for ever. A filter that is no longer wanted is removed by
    hand (docs/upgrades.md)."""
    ours = _filters(cfg)
    if not ours or cfg.durable_name is None:
        return cfg
    try:
        info = await js.consumer_info(stream, cfg.durable_name)
    except NotFoundError:
        return cfg
    extra = [f for f in _filters(info.config) if f not in ours]
    if not extra:
        return cfg
    return dataclasses.replace(cfg, filter_subject=None, filter_subjects=ours + extra)


async def _declare(js: JetStreamContext, layout: Layout, tool_kinds: tuple[str, ...]) -> None:
    await check_exec_streams(js, layout)
    for cfg in stream_configs(layout):
        await _add_or_update_stream(js, cfg)
    # again: pods of two counts that both found nothing may have made streams of both
    # (the server has been seen to accept overlapping subjects in that race): each is
    # then refused, in one line, rather than both running on half of the logs
    await check_exec_streams(js, layout)
    for stream, consumers in consumer_configs(layout, tool_kinds).items():
        for ccfg in consumers:
            try:
                await js.add_consumer(stream, await _widened(js, stream, ccfg))
            except BadRequestError:
                # exists with different settings: recreate is unsafe (loses ack state),
                # so keep the existing one; settings changes are a deploy decision.
                pass
    # blobs and payloads have no age limit (a running execution's are kept however old:
    # the retention actor removes a finished one's); the archive keeps archive_retention
    for store, ttl in ((BLOB_BUCKET, 0.0), (PAYLOAD_BUCKET, 0.0), (ARCHIVE_BUCKET, layout.archive_retention)):
        await _object_store(js, store, replicas=layout.replicas, ttl=ttl)
    try:
        await js.key_value(OWNERS_BUCKET)
    except NotFoundError:
        await js.create_key_value(
            bucket=OWNERS_BUCKET,
            history=1,
            ttl=layout.lease_ttl,
            replicas=layout.replicas,
            storage=api.StorageType.FILE,
        )
    kvs = ((STATUS_BUCKET, 1), (CATALOG_BUCKET, 1), (SCHEDULES_BUCKET, 1), (HOOKS_BUCKET, 1), (TRIGGERS_BUCKET, 1))
    for bucket, history in kvs:
        republish = STATUS_REPUBLISH if bucket == STATUS_BUCKET else None
        try:
            await js.key_value(bucket)
        except NotFoundError:
            await js.create_key_value(
                api.KeyValueConfig(
                    bucket=bucket,
                    history=history,
                    replicas=layout.replicas,
                    storage=api.StorageType.FILE,
                    republish=republish,
                )
            )
            continue
        if republish is not None:
            # a bucket made by an earlier version has no RePublish: add it (an update
            # that changes only RePublish keeps every key)
            info = await js.stream_info(kv_stream(bucket))
            now = info.config.republish
            if now is None or (now.src, now.dest) != (republish.src, republish.dest):
                info.config.republish = republish
                await js.update_stream(info.config)


async def _object_store(js: JetStreamContext, bucket: str, *, replicas: int, ttl: float) -> None:
    """Create an object store bucket, or bring its age limit up to date (buckets made by
    an earlier version expired blobs after 7 days, running executions' too)."""
    try:
        info = await js.stream_info(obj_stream(bucket))
    except NotFoundError:
        await js.create_object_store(
            bucket,
            config=api.ObjectStoreConfig(bucket=bucket, replicas=replicas, storage=api.StorageType.FILE, ttl=ttl),
        )
        return
    if (info.config.max_age or 0.0) != ttl:
        info.config.max_age = ttl
        await js.update_stream(info.config)


# Every stored status is republished on core NATS (`status_subject`), for waiting clients.
STATUS_REPUBLISH = api.RePublish(src=kv_key_subject(STATUS_BUCKET, ">"), dest=STATUS_REPUBLISH_DEST)


__all__ = [
    "ARCHIVE_BUCKET",
    "BLOB_BUCKET",
    "CATALOG_BUCKET",
    "CMD_STREAM",
    "DLQ_STREAM",
    "ENDED_STREAM",
    "EV",
    "EXECUTION_ID",
    "EXEC_STREAM",
    "HOOKS_BUCKET",
    "IN",
    "INDEX_STREAM",
    "LC",
    "LOOP_STREAM",
    "OWNERS_BUCKET",
    "PAYLOAD_BUCKET",
    "PROJECTOR_CONSUMER",
    "PROJECTOR_FILTER",
    "RETENTION_CONSUMER",
    "SCH",
    "SCHEDULES_BUCKET",
    "SCHEDULE_FIRES_CONSUMER",
    "SCHEDULE_STREAM",
    "STARTER_CONSUMER",
    "START_STREAM",
    "START_SUBJECT",
    "STATUS_BUCKET",
    "TOOL_KINDS",
    "TRIGGERS_BUCKET",
    "ExecStreamsMismatch",
    "Layout",
    "StreamsMissing",
    "check_exec_streams",
    "class_of",
    "cmd_filter",
    "cmd_subject",
    "consumer_configs",
    "counter_consumer",
    "counter_filter",
    "deliver_subject",
    "dlq_subject",
    "engine_consumer",
    "engine_filter",
    "ensure",
    "execution_of",
    "is_exec_stream",
    "loop_class",
    "loop_key",
    "loop_type",
    "missing_parts",
    "obj_stream",
    "progress_subject",
    "result_batch_subject",
    "stream_configs",
    "tool_consumer",
    "tool_log_consumer",
    "tool_log_filters",
    "type_of",
]
