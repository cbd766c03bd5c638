"""Triggers: a playbook started for every message on a NATS subject (docs/triggers.md).

A trigger is its spec in KV `triggers` (key: its name), written by `actors-cli trigger
add` (actors/client/triggers.py) and read by the trigger pods (actors/triggers/), and
the pods' running counts beside it (key `<name>.stats`, `TriggerStats`). On a subject
of a stream it reads through a durable consumer of its own (`consumer_name`), which the
trigger pods create (from the spec's `created_at`: nothing stored since `add` is
missed) and delete, so a message stored while no trigger pod runs waits for one; on a
core subject it is a queue subscription, at most once.

Each message starts one execution under an id derived from it: the trigger, its
`add_id` (random per `add`: a trigger deleted and added again under the same name
names none of its predecessor's executions) and the stream sequence, or the
`Nats-Msg-Id` a core message carries. A redelivery, or a second trigger pod, names the
same execution, which the starter writes once.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from typing import Annotated, Any

from msgspec import Struct, field

from actors.wire.secrecy import SECRET

# a subject token and a KV key; `trg-<name>-<add id>-m<24 hex>` stays within an execution id's 128
TRIGGER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
STATS_SUFFIX = ".stats"  # `<name>.stats`: a key of two tokens, which a watch of `*` (the specs) skips
DELIVER_PREFIX = "_trigger"  # a stream trigger's push consumer delivers to `_trigger.<name>`
DEAD_LETTER_SOURCE = "trigger"


class TriggerSpec(Struct, omit_defaults=True, forbid_unknown_fields=True):
    """A trigger as `actors-cli trigger add` wrote it (KV `triggers`, key = name).

    `stream`: the stream holding `subject` (read by the durable consumer
    `trigger-<name>`), or None for a core subject (a queue subscription, at most once).
    `payload`: the template the start's payload is rendered from, over `message`
    (`subject`, `data`, `headers`, `seq`, `time`); None: the message's body (a JSON
    object) is the payload. `paused`: nothing is started; a stream's messages wait."""

    name: str
    subject: str
    playbook: str
    stream: str | None = None
    version: int | None = None
    payload: Annotated[Any, SECRET] = None
    paused: bool = False
    created_at: float = 0.0
    add_id: str = ""
    deleting: bool = False


class TriggerStats(Struct, omit_defaults=True):
    """What the trigger pods counted for one trigger (KV `triggers`, key `<name>.stats`),
    added to by every pod every second or so: starts stored, messages whose start was
    stored already (`duplicates`: a redelivery, a message sent twice, seen within the
    duplicate window; past it the starter drops the second start, uncounted here),
    messages that started none (dead-lettered or dropped), and the last of each. A pod
    killed loses at most its last second's counts: these are for people, not for
    exactly-once (the ids are)."""

    started: int = 0
    duplicates: int = 0
    errors: int = 0
    last_start: float | None = None
    last_execution_id: str | None = None
    last_error: str | None = None
    last_error_at: float | None = None


class TriggerMessage(Struct):
    """What a payload template reads as `message`: the message's subject, its body
    (`data`: decoded when it is JSON, else its text), its headers, its stream sequence
    (None on a core subject) and when it was stored or received (epoch seconds)."""

    subject: str
    data: Any
    headers: dict[str, str] = field(default_factory=dict)
    seq: int | None = None
    time: float = 0.0


def consumer_name(trigger: str) -> str:
    """The durable consumer a stream trigger reads through."""
    return f"trigger-{trigger}"


def deliver_subject(trigger: str) -> str:
    """Where a stream trigger's push consumer delivers (a queue group of the same name)."""
    return f"{DELIVER_PREFIX}.{trigger}"


def stats_key(trigger: str) -> str:
    return f"{trigger}{STATS_SUFFIX}"


def dead_letter_token(trigger: str) -> str:
    """The last token of a trigger's dead letters' subject, `dlq.trigger.trg-<name>`: it
    names the trigger (the execution never started), and no execution id it derives."""
    return f"trg-{trigger}"


def new_add_id() -> str:
    return secrets.token_hex(4)


def _prefix(trigger: str, add_id: str) -> str:
    return f"trg-{trigger}-{add_id}" if add_id else f"trg-{trigger}"


def stream_execution_id(trigger: str, seq: int, add_id: str = "") -> str:
    """The execution a stream message starts: the trigger, its add id and the
    message's sequence."""
    return f"{_prefix(trigger, add_id)}-{seq}"


def core_execution_id(trigger: str, msg_id: str | None, fresh: str, add_id: str = "") -> str:
    """The execution a core message starts: from its `Nats-Msg-Id` (hashed: any text
    is a message id, an execution id is not), so the same message sent twice starts
    one; without one, `fresh` (a new id each message: at most once is all core NATS
    gives)."""
    if msg_id:
        return f"{_prefix(trigger, add_id)}-m{hashlib.blake2b(msg_id.encode(), digest_size=12).hexdigest()}"
    return f"{_prefix(trigger, add_id)}-{fresh}"
