"""What a replaying log actor (engine or counter) asks the streams: is an output it
would publish already there (published before a crash, or by another pod)?"""

from __future__ import annotations

from collections.abc import Collection

from nats.aio.client import Client as NATS
from nats.js.api import RawStreamMsg
from nats.js.errors import NotFoundError

from actors.wire import Command
from streams.layout import CMD_STREAM, cmd_subject


async def last_message(nc: NATS, stream: str, subject: str) -> RawStreamMsg:
    """The last message of `stream` on `subject` (a filter may hold wildcards), as the
    stream leader has it; NotFoundError when there is none.

    Not a direct get: with `allow_direct` every replica answers those, and a follower
    still catching up after a restart answers from what it has (nats-server starts
    answering at 90% applied, and nothing stops it when it falls behind later). A
    read that decides something (a replay's "was this sent?", "does this execution
    exist?", the terminal event behind a status just read) must see every stored
    message, so it asks the leader ($JS.API.STREAM.MSG.GET, answered by the leader
    only). During an election it is not answered: callers ride that out."""
    return await nc.jsm().get_last_msg(stream, subject, direct=False)


async def has_message(nc: NATS, stream: str, subject: str) -> bool:
    """Does `stream` hold a message on `subject` (the stream leader's answer)?"""
    try:
        await last_message(nc, stream, subject)
        return True
    except NotFoundError:
        return False


async def command_sent(nc: NATS, cmd: Command, answered: Collection[str], *, reply_stream: str) -> bool:
    """Was this command published before a crash? A tool acks a command (removing it
    from the work queue) only after publishing its result, so a command that was
    published is either still in CMD or answered in the log (`reply_stream`). Checked in
    that order, so a result that lands between the two looks is still found."""
    if cmd.command_id in answered:
        return True
    return await has_message(
        nc, CMD_STREAM, cmd_subject(cmd.kind, cmd.execution_id, cmd.command_id)
    ) or await has_message(nc, reply_stream, cmd.reply_to)
