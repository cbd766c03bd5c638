"""What a replaying log actor (engine or counter) asks the streams: is an output it
would publish already there (published before a crash, or by another pod)?"""

from __future__ import annotations

from collections.abc import Callable, Collection

from nats.aio.client import Client as NATS
from nats.js.api import RawStreamMsg
from nats.js.errors import NotFoundError

from actors.natsio.batchget import pages
from actors.wire.messages import (
    Command,
    LoopSpec,
    command_of_answer,
    command_of_record_answer,
    loop_of_verdict,
    start_of_record_answer,
)
from streams.layout import CMD_STREAM, cmd_subject
from streams.subjects import START, ExecSubjects, is_answer_record, shares_results, type_of


async def last_message(nc: NATS, stream: str, subject: str, *, newest: bool = False) -> RawStreamMsg:
    """The last message of `stream` on `subject`; NotFoundError when the stream leader
    has none.

    With `allow_direct` every replica answers a direct get, and a follower still
    catching up after a restart answers from what it has (nats-server lets it answer
    from 90% applied on, and nothing stops it when it falls behind later). For a
    subject that holds one message (a start record, a command, a loop spec, a
    terminal event), as the lookups that decide something ask, any replica's "found"
    is right and only "not found" may be stale: so any replica is asked first (a
    direct get, outside the server's JetStream API queue and answered during an
    election), then the leader ($JS.API.STREAM.MSG.GET, answered by the leader only).
    `newest`: the subject (a filter) gains messages and the newest is wanted: a
    replica's answer may be an older one, so only the leader is asked."""
    if not newest:
        try:
            return await nc.jsm().get_last_msg(stream, subject, direct=True)
        except NotFoundError:
            pass  # maybe a replica behind: the leader knows
    return await nc.jsm().get_last_msg(stream, subject, direct=False)


async def has_message(nc: NATS, stream: str, subject: str) -> bool:
    """Does `stream` hold a message on `subject`? (`last_message`: a stale "no" is checked with the leader.)"""
    try:
        await last_message(nc, stream, subject)
        return True
    except NotFoundError:
        return False


def held_start(subject: str, data: bytes) -> bytes | None:
    """The start record the stored message on `subject` holds, as its starter sent it:
    the message itself on `exec.<p>.<id>.in.start`, or (semantics 6) the `answer` of an
    answer record that is the execution's start stored with its first decision (cause
    0); None for any other message."""
    if type_of(subject) == START:
        return data
    if is_answer_record(subject):
        return start_of_record_answer(data)
    return None


async def next_message(nc: NATS, stream: str, subject: str, *, after: int) -> RawStreamMsg:
    """The first message of `stream` on `subject` (a filter) after sequence `after`;
    NotFoundError when the stream leader has none. Any replica's "found" is right (a
    replica holds a prefix of the stream: nothing between is missing from it), a "not
    found" is asked of the leader."""
    try:
        return await nc.jsm().get_msg(stream, after + 1, subject=subject, next=True, direct=True)
    except NotFoundError:
        pass
    return await nc.jsm().get_msg(stream, after + 1, subject=subject, next=True, direct=False)


async def first_message(nc: NATS, stream: str, subject: str) -> RawStreamMsg:
    """The first message of `stream` on `subject` (a filter); NotFoundError when the
    stream leader has none. As `last_message`: any replica's "found" is right (a
    replica holds a prefix of the stream), a "not found" is asked of the leader."""
    return await next_message(nc, stream, subject, after=0)


async def start_message(nc: NATS, stream: str, subjects: ExecSubjects) -> tuple[RawStreamMsg, bytes] | None:
    """The stored message holding the execution's start record, and the record's bytes
    as its starter sent them; None when its log holds none (not started, retired, or
    its start still queued). The log's first input holds it, a start record or (from
    semantics 6) the start stored with its first decision, which is stored only as the
    first input: one get. Else (a cancel or a signal sent before the start came
    first) the start record is on its own subject: a second get."""
    try:
        first = await first_message(nc, stream, subjects.inputs)
    except NotFoundError:
        return None
    held = held_start(first.subject or "", first.data or b"")
    if held is not None:
        return first, held
    try:
        plain = await last_message(nc, stream, subjects.start)
    except NotFoundError:
        return None
    return plain, plain.data or b""


ANSWER_PAGE = 16  # results read at once when looking for one: a page of results holds at most this many messages


async def is_answered(nc: NATS, stream: str, cmd: Command, *, after: int = 0) -> bool:
    """Does `stream` hold the answer to `cmd`? On the command's own subject
    (`reply_to`, `in.result.<command>`), which holds nothing else: a direct get. Then,
    for a command of semantics 4 on, on the subject every result of its execution
    shares (`answer_on`, `in.result`), where a tool of this version answers, for one
    naming this command (`shared_holds`) after sequence `after` (the record that held
    the command, when known: its answer can only follow it). Both subjects, because a
    tool pod older than semantics 4 answers on `reply_to` whatever the execution's
    semantics."""
    if await has_message(nc, stream, cmd.reply_to):
        return True
    shared = cmd.answer_on
    if not shared or not shares_results(shared):
        return False
    if await shared_holds(nc, stream, shared, lambda data: command_of_answer(data) == cmd.command_id, after=after):
        return True
    if not cmd.ask_on:
        return False
    # semantics 5: the result stored with the decision it led to, an answer record
    # (`shared` is `<prefix>.in.result`: `shares_results` said so)
    answers = ExecSubjects(shared.rsplit(".", 2)[0]).answers
    return await shared_holds(
        nc, stream, answers, lambda data: command_of_record_answer(data) == cmd.command_id, after=after
    )


async def verdict_sent(nc: NATS, stream: str, spec: LoopSpec) -> bool:
    """Is a loop's verdict in its execution's log? On the loop's own subject
    (`reply_to`, where a counter older than semantics 4 sends it), then on the
    execution's one subject for every loop's verdict (`answer_on`, semantics 4 on) for
    one naming this loop."""
    if await has_message(nc, stream, spec.reply_to):
        return True
    if not spec.answer_on:
        return False
    return await shared_holds(nc, stream, spec.answer_on, lambda data: loop_of_verdict(data) == spec.loop_id)


async def shared_holds(nc: NATS, stream: str, subject: str, match: Callable[[bytes], bool], *, after: int = 0) -> bool:
    """Does a message on `subject` (a subject several answers share) after sequence
    `after` match? Read a page at a time (bounded direct gets, any replica) until one
    does, then the leader is asked for any stored after the last one read (a replica
    behind answers from what it has, as `last_message` says), so a "no" is the
    leader's, as a direct get's is."""
    seq = after + 1
    async for page in pages(nc, stream, subject, first=seq, batch=ANSWER_PAGE):
        if any(match(m.data) for m in page):
            return True
        seq = page[-1].seq + 1
    while True:
        try:
            msg = await nc.jsm().get_msg(stream, seq, subject=subject, next=True)  # the leader's
        except NotFoundError:
            return False
        if match(msg.data or b""):
            return True
        seq = int(msg.seq or seq) + 1


async def command_sent(nc: NATS, cmd: Command, answered: Collection[str], *, reply_stream: str) -> bool:
    """Was this command published before a crash? A tool acks a command (removing it
    from the work queue) only after publishing its result, so a command that was
    published is either still in CMD or answered in the log (`reply_stream`). Checked in
    that order, so a result that lands between the two looks is still found."""
    if cmd.command_id in answered:
        return True
    return await has_message(
        nc, CMD_STREAM, cmd_subject(cmd.kind, cmd.execution_id, cmd.command_id)
    ) or await is_answered(nc, reply_stream, cmd)
