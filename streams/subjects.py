"""Every subject, built and parsed in one place (pure: no NATS import, so the pure
core may use it too). streams/layout.py says which stream holds which subjects and
why; this module only spells them.

    exec.<partition>.<execution_id>.<class>.<type...>            stream EXEC
    loop.<partition>.<execution_id>.<loop_id>.<class>.<type...>  stream LOOP
    cmd.<kind>.<execution_id>.<command_id>                       stream CMD
    start                                                        stream START
    start.request                                                core NATS: a start asking for a reply
    dlq.<source>.<execution_id or _>                             stream DLQ
    cancel.<execution_id>[.<command_id>]                         core NATS: stop commands
    progress.<execution_id>                                      core NATS: loop progress
    result.request, catalog.register, execution.cancel           core NATS: requests any client sends
    answer.<partition>                                           core NATS: a tool asks to store its result
    answer.start.<partition>                                     core NATS: a starter asks to store a start
    status.<playbook>.<execution_id>                             core NATS: each status written

Classes: ``in`` inputs an actor folds, ``ev`` decision records (``ev.decision``, or
``ev.cmd.<kind>`` for one that holds its one command), ``lc`` lifecycle
events, ``sch`` durable timers (the server fires them into ``in.timer.<id>``), ``out``
what a step printed (written by tool actors beside their answer; no actor reads it),
``fail`` a loop's iterations that failed for good (``fail.<index>``, written by the counter).
"""

from __future__ import annotations

import base64
import re
import zlib
from dataclasses import dataclass

IN, EV, LC, SCH, OUT = "in", "ev", "lc", "sch", "out"
FAILED = "fail"  # loop.<p>.<id>.<loop>.fail.<index>: an iteration that failed for good (LoopSubjects.failed)
START_SUBJECT = "start"
# a start sent as a request: core NATS, answered by a starter (not captured by START, whose
# PubAck would otherwise be the only answer the requester gets)
START_REQUEST_SUBJECT = "start.request"
# a header on a start request: handle it as the same start published to START would be
# (a start that cannot run, an unknown playbook, is written as an execution that fails
# saying why, not refused): Client.start's fast path, with the stream's semantics
START_AS_MESSAGE = "Actors-Start-As-Message"
# a header on a start request: seconds the caller waits for the answer. A starter that
# takes the request from its backlog later drops it unanswered: the caller has sent the
# start to START by then, and handling both would double the work of an overload
START_WAIT = "Actors-Start-Wait"
# core NATS requests any client may send, answered by the engine pods in queue groups
# (docs/protocol/asyncapi.yaml): an execution's status and result, and registering a playbook
RESULT_REQUEST_SUBJECT = "result.request"
REGISTER_REQUEST_SUBJECT = "catalog.register"
# not `cancel.request`: `cancel.<execution_id>` is the tool actors' (an execution may be named "request")
CANCEL_REQUEST_SUBJECT = "execution.cancel"
# a signal for a waiting step (`tool: wait`), sent as a request any client may make:
# checked (the execution exists and is not finished) and written to the execution's log
SIGNAL_REQUEST_SUBJECT = "execution.signal"
# a header on a result request: seconds to wait for the execution to end before answering
RESULT_WAIT = "Actors-Result-Wait"
# a tool asks the engine pod owning partition p to store a step's result together with
# the decision it leads to, as one input (`exec.<p>.<id>.in.answer...`, semantics 5):
# core NATS, outside every stream (docs/architecture.md "The next layout", item 2)
ANSWER_REQUEST_PREFIX = "answer"
# a starter asks that engine pod to store an execution's start record with its first
# decision, as the log's first input (semantics 6): a subject of its own, which only the
# engine user may publish (the tools user publishes `answer.<p>`, which refuses a start:
# the starter's checks, the catalog, the limits, would be skipped)
START_ASK_PREFIX = f"{ANSWER_REQUEST_PREFIX}.start"
# every status the projector writes, also published on core NATS under its playbook, so a
# client can watch one playbook's executions (`status.<playbook>.*`): a notification, at
# most once; KV `status` stays the record
STATUS_FEED = "status"
# a header on each status of that feed: the KV revision it was stored at
STATUS_REVISION = "Actors-Revision"

# input types (the last tokens of an `in` subject)
START, RESULT, ITERATOR, TIMER, FAULT, CANCEL, SPEC = "start", "result", "iterator", "timer", "fault", "cancel", "spec"
LOOP_RESULT, DECISION = "res", "decision"
COMMAND = "cmd"  # ev.cmd.<kind>: a decision record holding its one command
SIGNAL = "signal"  # in.signal: a signal sent to the execution (actors/wire/messages.py SignalSent)
# in.answer.cmd.<kind> | in.answer.ev | in.answer.lc.<type>: a result and the decision it
# led to (semantics 5); in.answer.lc.<type>.cmd.<kind> (semantics 6): lifecycle events and
# a command, and an execution's start stored with its first decision
ANSWER = "answer"
RETRIED = "retried"  # a retry of this (terminal) execution was started (actors/wire/messages.py RetriedBy)


# a catalog path (actors/store/catalog.py PATH_RULE): letters, digits, `_`, `-`, `=` (what a
# KV key allows but `.`, its token separator), in segments separated by single `/`. Spelled
# here, where subjects are, because a path is also a subject token (`status_feed_subject`)
CATALOG_PATH = re.compile(r"[A-Za-z0-9_=-]+(?:/[A-Za-z0-9_=-]+)*")


def subject_matches(filter_: str, subject: str) -> bool:
    """Does `subject` match `filter_` as NATS matches them (`*` one token, `>` the rest)?"""
    want, got = filter_.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(got) > i
        if i >= len(got) or (token != "*" and token != got[i]):
            return False
    return len(want) == len(got)


def partition_of(execution_id: str, partitions: int) -> int:
    return zlib.crc32(execution_id.encode()) % partitions


# --- a log's subjects: what an execution's log and a loop's share ---------------------


@dataclass(frozen=True, slots=True)
class _LogSubjects:
    prefix: str  # exec.<p>.<execution_id> or loop.<p>.<execution_id>.<loop_id>

    def input(self, type_: str) -> str:
        return f"{self.prefix}.{IN}.{type_}"

    @property
    def inputs(self) -> str:
        """Every input of the log (a filter)."""
        return self.input(">")

    @property
    def cancel(self) -> str:
        return self.input(CANCEL)

    @property
    def signal(self) -> str:
        """Where signals go: one subject for every signal of the log (its name and key are
        in the message), so signals add no subject per name to the server's index."""
        return self.input(SIGNAL)

    @property
    def results(self) -> str:
        """Where command results go: for an execution of semantics 4 on, every result
        (the command id is in the result); before, the prefix of one subject per
        command, `<results>.<command_id>`."""
        return self.input(RESULT)

    def result(self, command_id: str) -> str:
        return f"{self.results}.{command_id}"

    def schedule(self, timer_id: str) -> str:
        """A durable timer's schedule (`sch`), which the server fires into `timer(id)`."""
        return f"{self.prefix}.{SCH}.{timer_id}"

    def timer(self, timer_id: str) -> str:
        return self.input(f"{TIMER}.{timer_id}")


# --- an execution's log (EXEC) ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExecSubjects(_LogSubjects):
    """The subjects of one execution's log."""

    @classmethod
    def of(cls, execution_id: str, partitions: int) -> ExecSubjects:
        return cls(f"exec.{partition_of(execution_id, partitions)}.{execution_id}")

    @property
    def log(self) -> str:
        """Everything the execution's log holds (a filter)."""
        return f"{self.prefix}.>"

    @property
    def start(self) -> str:
        return self.input(START)

    def iterator(self, loop_id: str) -> str:
        """Where the counter puts a loop's verdict."""
        return self.input(f"{ITERATOR}.{loop_id}")

    @property
    def fault(self) -> str:
        return self.input(FAULT)

    @property
    def retried(self) -> str:
        """Where the starter links this execution to a retry of it."""
        return self.input(RETRIED)

    @property
    def decision(self) -> str:
        return f"{self.prefix}.{EV}.{DECISION}"

    def decision_with_command(self, kind: str) -> str:
        """A decision record that holds its one command (semantics 2): tool actors of
        `kind` take it from the log (`tool_log_filter`), so the command is not stored a
        second time in CMD."""
        return f"{self.prefix}.{EV}.{COMMAND}.{kind}"

    def lifecycle(self, event_type: str) -> str:
        return f"{self.prefix}.{LC}.{event_type}"

    def lifecycle_with_command(self, event_type: str, kind: str) -> str:
        """A lifecycle event carrying its decision, whose record holds its one command
        (semantics 2): still under `lc.` for the projector, and under `cmd.<kind>`
        for that kind's tool actors (`tool_log_filters`)."""
        return f"{self.lifecycle(event_type)}.{COMMAND}.{kind}"

    @property
    def partition(self) -> int:
        return int(self.prefix.split(".")[1])

    def answer_record(self, kind: str | None) -> str:
        """A step's result stored with the decision it led to (semantics 5), an input:
        `in.answer.cmd.<kind>` when that decision holds its one command (tool actors of
        `kind` take it from the log), else `in.answer.ev`."""
        return self.input(f"{ANSWER}.{COMMAND}.{kind}" if kind else f"{ANSWER}.{EV}")

    def answer_lifecycle(self, event_type: str, kind: str | None = None) -> str:
        """A step's result stored with a decision that has lifecycle events (semantics
        5: the last step's, `in.answer.lc.playbook.completed`), the carrier event holding
        the decision record as `lifecycle` messages do (`LifecycleExtras`). From
        semantics 6 that record may hold the decision's one command too, and the
        subject then names its kind as `lifecycle_with_command` does, for that kind's
        tool actors: `in.answer.lc.<type>.cmd.<kind>` (an execution's start stored with
        its first decision, `in.answer.lc.playbook.initialized.cmd.python`)."""
        carrier = self.input(f"{ANSWER}.{LC}.{event_type}")
        return f"{carrier}.{COMMAND}.{kind}" if kind else carrier

    @property
    def answers(self) -> str:
        """Every result stored with its decision (a filter)."""
        return self.input(f"{ANSWER}.>")

    @property
    def outputs(self) -> str:
        """What the execution's steps printed (a filter; loop iterations' are in LOOP)."""
        return f"{self.prefix}.{OUT}.>"


def execution_of(subject: str) -> str:
    """exec.<p>.<id>.<class>.<type...> -> <id>"""
    return subject.split(".", 3)[2]


def class_of(subject: str) -> str:
    return subject.split(".", 4)[3]


def type_of(subject: str) -> str:
    return subject.split(".", 4)[4]


def shares_results(subject: str) -> bool:
    """Is `subject` an execution's one subject for every result (`exec.<p>.<id>.in.result`)?"""
    parts = subject.split(".")
    return len(parts) == 5 and parts[0] == "exec" and parts[3] == IN and parts[4] == RESULT


def engine_filter(partition: int) -> str:
    return f"exec.{partition}.*.{IN}.>"


LIFECYCLE_FILTER = f"exec.*.*.{LC}.>"


def tool_log_filters(kind: str) -> list[str]:
    """The stored decisions that hold a command of `kind`: decision records
    (`decision_with_command`) and lifecycle events carrying their decision
    (`lifecycle_with_command`: an execution's first step's command), results stored
    with the decision they led to (`answer_record`, semantics 5), and (semantics 6)
    answer records that carry lifecycle events and a command (`answer_lifecycle` with a
    kind: an execution's start with its first decision). An event type is always two
    tokens (`playbook.initialized`: `EVENT_TYPE_TOKENS`), so `*.*` matches exactly one."""
    return [
        f"exec.*.*.{EV}.{COMMAND}.{kind}",
        f"exec.*.*.{LC}.*.*.{COMMAND}.{kind}",
        f"exec.*.*.{IN}.{ANSWER}.{COMMAND}.{kind}",
        f"exec.*.*.{IN}.{ANSWER}.{LC}.*.*.{COMMAND}.{kind}",
    ]


# the tokens of every event type (`<family>.<name>`, actors/wire/events.py EventType): the
# tool log filters above match a carrier's type as `*.*`
EVENT_TYPE_TOKENS = 2


ANSWER_LIFECYCLE_FILTER = f"exec.*.*.{IN}.{ANSWER}.{LC}.>"  # answer records carrying lifecycle events


def answer_request_subject(partition: int) -> str:
    """Where a tool asks partition `partition`'s engine pod to store a result with its
    next decision (`Command.ask_on`)."""
    return f"{ANSWER_REQUEST_PREFIX}.{partition}"


def start_ask_subject(partition: int) -> str:
    """Where a starter asks partition `partition`'s engine pod to store an execution's
    start record with its first decision (semantics 6)."""
    return f"{START_ASK_PREFIX}.{partition}"


def is_answer_record(subject: str) -> bool:
    """Is `subject` a result stored with its decision (`exec.<p>.<id>.in.answer...`)?"""
    parts = subject.split(".", 5)
    return len(parts) >= 5 and parts[0] == "exec" and parts[3] == IN and parts[4] == ANSWER


def answer_lifecycle_type(subject: str) -> str | None:
    """The carrier event's type of an answer record holding lifecycle events
    (`exec.<p>.<id>.in.answer.lc.<type>` -> `<type>`, and from semantics 6
    `exec.<p>.<id>.in.answer.lc.<type>.cmd.<kind>` -> `<type>`); None for any other
    subject."""
    parts = subject.split(".")
    if len(parts) < 6 + EVENT_TYPE_TOKENS or parts[0] != "exec" or parts[3:6] != [IN, ANSWER, LC]:
        return None
    tail = parts[6 + EVENT_TYPE_TOKENS :]
    if tail and (len(tail) != 2 or tail[0] != COMMAND):
        return None
    return ".".join(parts[6 : 6 + EVENT_TYPE_TOKENS])


# the lifecycle event only an execution's start decides: an answer record carried by it
# is that start stored with its first decision (semantics 6)
START_CARRIER = "playbook.initialized"


def is_start_answer(subject: str) -> bool:
    """Is `subject` an execution's start stored with its first decision, the log's first
    input (`exec.<p>.<id>.in.answer.lc.playbook.initialized[.cmd.<kind>]`, semantics 6)?
    Told by its subject alone when that decision left the execution running: one that
    ended it at once (a playbook that cannot run) is on its end's subject
    (`in.answer.lc.playbook.failed`), as a last step's result would be, and is told by
    its cause, 0 (actors/wire/messages.py `start_of_record_answer`)."""
    return answer_lifecycle_type(subject) == START_CARRIER


# --- a loop's log (LOOP) ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoopSubjects(_LogSubjects):
    """The subjects of one loop's log."""

    @classmethod
    def of(cls, execution_id: str, loop_id: str, partitions: int) -> LoopSubjects:
        return cls(f"loop.{partition_of(execution_id, partitions)}.{execution_id}.{loop_id}")

    @property
    def spec(self) -> str:
        return self.input(SPEC)

    @property
    def results(self) -> str:
        """The prefix of iteration results: `<results>.<command_id>` (and `.batch`)."""
        return self.input(LOOP_RESULT)

    @property
    def results_filter(self) -> str:
        return f"{self.results}.>"

    def failed(self, index: int) -> str:
        """Where the counter records iteration `index` failed for good (`FailedItem`):
        not an input (the counter's consumer reads `in.>`), one subject per iteration,
        so failures are counted and paged by subject alone."""
        return f"{self.prefix}.{FAILED}.{index}"


def loop_key(subject: str) -> tuple[str, str]:
    """loop.<p>.<id>.<loop>.<class>.<type...> -> (<id>, <loop>)"""
    parts = subject.split(".", 5)
    return parts[2], parts[3]


def loop_class(subject: str) -> str:
    return subject.split(".", 5)[4]


def loop_type(subject: str) -> str:
    return subject.split(".", 5)[5]


def answered_command(loop_input_type: str) -> str | None:
    """The command a loop input answers, from its type (`res.<command_id>`); None for
    a batch (`res.batch`: read its entries) and for anything else."""
    if not loop_input_type.startswith(f"{LOOP_RESULT}.") or loop_input_type == f"{LOOP_RESULT}.batch":
        return None
    return loop_input_type.split(".", 1)[1]


def is_result_batch(loop_input_type: str) -> bool:
    return loop_input_type == f"{LOOP_RESULT}.batch"


def result_batch_subject(reply_to: str) -> str | None:
    """Where a tool actor may put a loop iteration's result together with others of
    the same loop: ``loop.<p>.<id>.<loop>.in.res.batch`` for a command answered on
    ``loop.<p>.<id>.<loop>.in.res.<command_id>``; None for any other reply subject."""
    prefix, _, _ = reply_to.rpartition(".")
    if not reply_to.startswith("loop.") or not prefix.endswith(f".{IN}.{LOOP_RESULT}") or prefix.count(".") != 5:
        return None
    return f"{prefix}.batch"


def loop_results_filter(execution_id: str, partitions: int) -> str:
    """The iteration results of every loop of an execution."""
    return f"loop.{partition_of(execution_id, partitions)}.{execution_id}.*.{IN}.{LOOP_RESULT}.>"


def failed_items_filter(execution_id: str, partitions: int, loop_id: str = "*") -> str:
    """The failed iterations of an execution's loops (or of loop `loop_id`)."""
    return f"loop.{partition_of(execution_id, partitions)}.{execution_id}.{loop_id}.{FAILED}.*"


def failed_item_of(subject: str) -> tuple[str, int] | None:
    """(loop id, iteration index) of a `...<loop>.fail.<index>` subject; None for another."""
    parts = subject.split(".")
    if len(parts) != 6 or parts[4] != FAILED or not parts[5].isdigit():
        return None
    return parts[3], int(parts[5])


def loop_outputs_filter(execution_id: str, partitions: int) -> str:
    """What the iterations of every loop of an execution printed."""
    return f"loop.{partition_of(execution_id, partitions)}.{execution_id}.*.{OUT}.>"


def output_subject(reply_to: str, command_id: str, iteration_index: int | None) -> str | None:
    """Where a tool actor puts what a command printed, beside its answer: for
    ``exec.<p>.<id>.in.result.<command>``, ``exec.<p>.<id>.out.<command>``; for
    ``loop.<p>.<id>.<loop>.in.res.<command>``, ``loop.<p>.<id>.<loop>.out.<command>.<index>``
    (a chunk answers several iterations). None for any other reply subject."""
    if reply_to.startswith("exec.") and reply_to.count(".") >= 5:
        prefix = reply_to.split(".", 3)
        return f"{'.'.join(prefix[:3])}.{OUT}.{command_id}"
    if reply_to.startswith("loop.") and reply_to.count(".") >= 6:
        prefix = reply_to.split(".", 4)
        index = "" if iteration_index is None else f".{iteration_index}"
        return f"{'.'.join(prefix[:4])}.{OUT}.{command_id}{index}"
    return None


def counter_filter(partition: int) -> str:
    return f"loop.{partition}.*.*.{IN}.>"


# --- commands, starts, dead letters, core NATS signals ---------------------------------


def cmd_subject(kind: str, execution_id: str, command_id: str) -> str:
    """One subject per command, so a replay can ask the work queue whether a command is
    still there (queued or running) with a direct get, instead of re-sending it."""
    return f"cmd.{kind}.{execution_id}.{command_id}"


def cmd_filter(kind: str) -> str:
    return f"cmd.{kind}.>"


def dlq_subject(source: str) -> str:
    return f"dlq.{source}"


def dead_letter_subject(source: str, execution_id: str | None = None) -> str:
    """Dead letters, keyed by execution so `events ID` finds them with a filter."""
    return f"{dlq_subject(source)}.{execution_id or '_'}"


def dlq_filter(*, source: str = "*", execution_id: str | None = None) -> str:
    return f"dlq.{source}.{execution_id}" if execution_id is not None else f"dlq.{source}.>"


CANCEL_FILTER = "cancel.>"


def cancel_subject(execution_id: str, command_id: str | None = None) -> str:
    """Core NATS: tool actors stop an execution's commands (or one of them)."""
    return f"cancel.{execution_id}" if command_id is None else f"cancel.{execution_id}.{command_id}"


def cancel_target(subject: str) -> tuple[str, str | None]:
    """cancel.<execution>[.<command>] -> (execution, command or None)"""
    parts = subject.split(".", 2)
    return parts[1], (parts[2] if len(parts) > 2 else None)


# The server republishes each stored status (KV `status`, its stream's RePublish) here,
# on core NATS: a waiting client subscribes to one execution's subject instead of making
# a JetStream consumer per wait. Only what the stream stored is republished, so a
# compare-and-set the stream refused is never seen.
STATUS_REPUBLISH_DEST = "status.>"


def status_subject(execution_id: str) -> str:
    """Core NATS: the execution's status, each time the status bucket stored it."""
    return f"status.{execution_id}"


def progress_subject(execution_id: str) -> str:
    """Core NATS (not stored): loop progress for people watching, never for decisions."""
    return f"progress.{execution_id}"


INDEX_FILTER = "index.start.>"
ENDED_FILTER = "index.end.>"


def index_subject(execution_id: str) -> str:
    """Stream INDEX: one entry per execution, written by the projector when it first
    records the execution's status, so these subjects are in start order
    (`actors-cli list` reads them backwards)."""
    return f"index.start.{execution_id}"


def index_end_subject(state: str, execution_id: str) -> str:
    """Stream ENDED: an execution's final status, written by the projector once it has
    recorded a terminal state, so `list --state FAILED` reads only failed executions."""
    return f"index.end.{state}.{execution_id}"


def index_ends(state: str) -> str:
    return f"index.end.{state}.*"


def index_ends_of(execution_id: str) -> str:
    """An execution's final status in stream ENDED, whatever its state (a filter)."""
    return f"index.end.*.{execution_id}"


def loop_logs_filter(execution_id: str, partitions: int) -> str:
    """Everything the logs of every loop of an execution hold (a filter)."""
    return f"loop.{partition_of(execution_id, partitions)}.{execution_id}.>"


def ended_execution(subject: str) -> str:
    """The execution of an ENDED subject, `index.end.<state>.<execution_id>`."""
    return subject.split(".", 3)[3]


def object_chunks_subject(bucket: str, nuid: str) -> str:
    """Where an object store object's chunks are (nats-py's spelling: its `nuid`)."""
    return f"$O.{bucket}.C.{nuid}"


def object_meta_subject(bucket: str, name: str) -> str:
    """Where an object store object's metadata is: its name, URL-safe base64 (nats-py's spelling)."""
    return f"$O.{bucket}.M.{base64.urlsafe_b64encode(name.encode()).decode()}"


def object_metas_filter(bucket: str) -> str:
    """Every object's metadata in a bucket (a filter)."""
    return f"$O.{bucket}.M.>"


def kv_stream(bucket: str) -> str:
    """The stream under a KV bucket."""
    return f"KV_{bucket}"


def kv_key_subject(bucket: str, key: str) -> str:
    """The subject of one key of a KV bucket in its stream (a put is a publish to it)."""
    return f"$KV.{bucket}.{key}"


def direct_get_subject(stream: str) -> str:
    """JetStream's direct-get API of a stream (batched gets: actors/natsio/batchget.py)."""
    return f"$JS.API.DIRECT.GET.{stream}"


def deliver_subject(consumer: str) -> str:
    """Push consumers deliver here; actors subscribe with queue group = consumer name,
    so several pods may share one consumer (leases narrow that to one owner)."""
    return f"_deliver.{consumer}"


# --- schedules (stream SCHEDULES): a cron definition per schedule, and its fires ---------

SCHEDULE_FIRES_FILTER = "schedules.fire.>"


def schedule_definition_subject(name: str) -> str:
    """A schedule's cron definition (a `Nats-Schedule` message): one per subject, so
    deleting the subject's message stops the schedule."""
    return f"schedules.def.{name}"


def schedule_fire_subject(name: str) -> str:
    """Where the server publishes each fire of schedule `name` (`Nats-Schedule-Target`)."""
    return f"schedules.fire.{name}"


def schedule_of_fire(subject: str) -> str:
    """The schedule a fire's subject names."""
    return subject.split(".", 2)[2]


def status_feed_subject(playbook: str | None, execution_id: str) -> str:
    """Where a status is announced: `status.<playbook>.<execution_id>`. A catalog path has
    no `.`, `*`, `>` or space (actors/store/catalog.py PATH_RULE), so it is one token as
    it is; an execution whose playbook is unknown, or not a catalog path, is under `~`,
    which no catalog path can be (`_`, say, can)."""
    token = playbook if playbook and CATALOG_PATH.fullmatch(playbook) else UNKNOWN_PLAYBOOK
    return f"{STATUS_FEED}.{token}.{execution_id}"


UNKNOWN_PLAYBOOK = "~"
