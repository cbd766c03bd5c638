"""What a trigger may not read: the system's own streams and subjects (pure: no I/O).

A trigger on one of them feeds itself or steals the system's inputs: one on `dlq.>`
dead-letters what it cannot start, which it reads again; one on `exec.*.*.in.start`
starts an execution per start record, each writing one more. `actors-cli trigger add`
refuses them (actors/client/triggers.py), and a trigger pod will not run a spec that
names one (written into KV by hand), so the rule holds for both; the trigger user's
NATS permissions deny its consumers on the system's streams besides
(actors/pod/permissions.py)."""

from __future__ import annotations

from streams.layout import (
    CMD_STREAM,
    DLQ_STREAM,
    ENDED_STREAM,
    EXEC_STREAM,
    INDEX_STREAM,
    LOOP_STREAM,
    SCHEDULE_STREAM,
    START_STREAM,
    is_exec_stream,
)
from streams.subjects import (
    ANSWER_REQUEST_PREFIX,
    CANCEL_FILTER,
    CANCEL_REQUEST_SUBJECT,
    REGISTER_REQUEST_SUBJECT,
    RESULT_REQUEST_SUBJECT,
    SIGNAL_REQUEST_SUBJECT,
    START_REQUEST_SUBJECT,
    START_SUBJECT,
    STATUS_REPUBLISH_DEST,
)

SYSTEM_STREAMS = (
    EXEC_STREAM,
    LOOP_STREAM,
    CMD_STREAM,
    START_STREAM,
    INDEX_STREAM,
    ENDED_STREAM,
    SCHEDULE_STREAM,
    DLQ_STREAM,
)
# the streams under KV buckets and object stores: the system's (status, catalog, owners,
# hooks, triggers, blobs, payloads, archive) are among them, and a trigger on a bucket's
# key updates is no trigger on messages anyway
SYSTEM_STREAM_PREFIXES = ("KV_", "OBJ_")
# every subject the system publishes or answers on (streams/subjects.py), as patterns
SYSTEM_SUBJECTS = (
    "exec.>",
    "loop.>",
    "cmd.>",
    START_SUBJECT,
    START_REQUEST_SUBJECT,
    RESULT_REQUEST_SUBJECT,
    REGISTER_REQUEST_SUBJECT,
    CANCEL_REQUEST_SUBJECT,
    SIGNAL_REQUEST_SUBJECT,
    "execution.>",  # the requests on executions, those to come included
    f"{ANSWER_REQUEST_PREFIX}.>",  # asks to the engine pods: results and (semantics 6) start records
    "dlq.>",
    CANCEL_FILTER,
    "progress.>",
    STATUS_REPUBLISH_DEST,
    "index.>",
    "schedules.>",
    "_trigger.>",  # the triggers' own deliveries
    "_deliver.>",  # the system's push consumers' deliveries
)
# first tokens that are NATS's or the clients' own: `$JS`, `$KV`, `$O`, `$SYS`, inboxes
# (`_INBOX`, and each role's `_INBOX_<user>`)
SYSTEM_PREFIXES = ("$", "_INBOX")


def overlaps(a: str, b: str) -> bool:
    """Do subject patterns `a` and `b` match some subject in common?"""
    x, y = a.split("."), b.split(".")
    for i in range(max(len(x), len(y))):
        if i >= len(x) or i >= len(y):
            return False  # one ended before the other (a `>` would have answered already)
        s, t = x[i], y[i]
        if s == ">" or t == ">":
            return True
        if s != t and s != "*" and t != "*":
            return False
    return True


def is_system_stream(name: str) -> bool:
    """Is `name` one of the system's streams (the executions' logs: EXEC, or EXEC_<k>
    in a deployment of several)?"""
    return name in SYSTEM_STREAMS or is_exec_stream(name)


def refusal(subject: str, stream: str | None) -> str | None:
    """Why a trigger on `subject` (of `stream`, None: core NATS) may not be, or None."""
    if stream is not None and (is_system_stream(stream) or stream.startswith(SYSTEM_STREAM_PREFIXES)):
        return f"stream {stream} is the system's own: a trigger may not read it (it would feed itself or steal inputs)"
    if subject.split(".", 1)[0].startswith(SYSTEM_PREFIXES):
        return f"subject {subject!r} is NATS's own or a reply inbox: not a trigger's subject"
    for pattern in SYSTEM_SUBJECTS:
        if overlaps(subject, pattern):
            return (
                f"subject {subject!r} overlaps the system's subjects ({pattern}): a trigger may not read them "
                "(it would feed itself or steal inputs)"
            )
    return None
