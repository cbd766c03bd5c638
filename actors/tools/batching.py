"""Loop iteration results gathered into one `result.batch` message per loop.

An iteration's result waits (a few milliseconds at most) for others of the same
loop, then goes out with them in one `result.batch` on `loop.<p>.<id>.<loop>.in.res.batch`:
one publish, one stored message and one ack for the counter instead of one each.
Its message id is derived from the batch's command ids (sorted), so a publish
retried as is is a duplicate; a command redelivered and answered again, alone or in
another batch, finds its iteration counted already. Each command is acked once the
batch is stored. A batch of one goes out as the plain `call.done`/`call.error`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from actors.natsio import MSG_ID, ack, publisher
from actors.natsio.binding import codec_of
from actors.tools.held import HeldCommands
from actors.wire.messages import Command, ErrorInfo, IterationResult, ResultBatchOut, encode
from streams.ids import result_batch_id
from streams.layout import loop_key

__all__ = ["RESULT_BATCH_MAX", "RESULT_BATCH_WINDOW", "ResultBatcher"]

log = logging.getLogger("actors.tools")

# loop iteration results that end close together go out as one `result.batch` message
# per loop: at most this many, sent at once when no command is running here any more
# (nothing could join) or when as many of the loop's commands here are done as still run
# (a loop with few iterations in flight is not kept waiting), else this many seconds
# after the first result
RESULT_BATCH_MAX = 256
RESULT_BATCH_WINDOW = 0.005

# answers one command alone: (command, result, error, started, ended)
AnswerAlone = Callable[[Command, Any, "ErrorInfo | None", float, float], Awaitable[None]]


class _Gather:
    """Results of one loop waiting to go out in one message, with their commands (acked
    once the message is stored)."""

    __slots__ = ("check", "items", "key", "parts", "sent", "size", "subject", "timer")

    def __init__(self, key: str, subject: str) -> None:
        self.key = key
        self.subject = subject
        self.items: list[tuple[Command, IterationResult, Msg]] = []
        self.parts: list[msgspec.Raw] = []  # each result, encoded once (measured to fit)
        self.size = 0
        self.sent = False
        self.check = False  # a `_check` is scheduled
        self.timer: asyncio.TimerHandle | None = None


class ResultBatcher:
    """The batches of one tool actor: results waiting, batches waiting for their PubAck."""

    def __init__(
        self,
        nc: NATS,
        *,
        limit: int,
        batch_max: int,
        window: float,
        worker: str,
        answer_alone: AnswerAlone,
        held: HeldCommands,
    ) -> None:
        """`limit`: bytes a message may take; `answer_alone`: sends one command's answer
        (a batch of one); `held`: commands kept alive until acked (a batch's leave it)."""
        self.nc = nc
        self.limit = limit
        self.batch_max = max(1, batch_max)
        self.window = max(0.0, window)
        self.worker = worker
        self.answer_alone = answer_alone
        self.held = held
        self.loop: asyncio.AbstractEventLoop | None = None  # set by the actor's start
        self._gathering: dict[str, _Gather] = {}  # loop result subject + step -> results waiting to go out
        self._sending: set[asyncio.Task[None]] = set()  # batches waiting for their PubAck
        self._unfinished: dict[str, int] = {}  # gather key -> that loop's commands still running here

    def started(self, key: str) -> None:
        """One more of loop `key`'s commands runs here."""
        self._unfinished[key] = self._unfinished.get(key, 0) + 1

    def finished(self, key: str) -> None:
        """One of loop `key`'s commands here has its result (or failed)."""
        left = self._unfinished[key] - 1
        if left:
            self._unfinished[key] = left
        else:
            del self._unfinished[key]

    def gather(
        self,
        subject: str,
        key: str,
        cmd: Command,
        msg: Msg,
        result: Any,
        error: ErrorInfo | None,
        started: float,
        ended: float,
    ) -> bool:
        """Hand the result of loop iteration `cmd` to the batch of its loop (`key`); False
        when it is to be answered alone (too large)."""
        entry = IterationResult(
            command_id=cmd.command_id,
            attempt_number=cmd.attempt_number,
            iteration_index=cmd.iteration_index,
            result=result,
            error=error,
            started_at=started,
            ended_at=ended,
        )
        part = codec_of(self.nc).encode(entry)  # its values encrypted when the pod has a payload key
        limit = self.limit
        if len(part) > limit:
            return False  # answered alone, its result as a blob
        group = self._gathering.get(key)
        if group is not None and group.size + len(part) + 1 > limit:
            self.flush(group)
            group = None
        loop = self.loop
        assert loop is not None
        if group is None:
            group = self._gathering[key] = _Gather(key, subject)
            group.timer = loop.call_later(self.window, self.flush, group)
        group.items.append((cmd, entry, msg))
        group.parts.append(msgspec.Raw(part))
        group.size += len(part) + 1
        if len(group.items) >= self.batch_max:
            self.flush(group)
        elif len(group.items) >= self._unfinished.get(key, 0) and not group.check:
            # as many done as still run for this loop: unless more end in this same
            # turn of the event loop, waiting longer would starve a loop with few
            # iterations in flight
            group.check = True
            loop.call_soon(self._check, group)
        return True

    def flush_all(self) -> None:
        """Send every batch now (nothing running here could join them)."""
        for group in list(self._gathering.values()):
            self.flush(group)

    async def drain(self, timeout: float) -> None:
        """Send every batch; wait up to `timeout` for their PubAcks (then give up: their
        commands stay unacked and are redelivered)."""
        self.flush_all()
        if self._sending:  # results handed to batches: stored and their commands acked, or left unacked
            await asyncio.wait(self._sending, timeout=timeout)
        for t in list(self._sending):
            t.cancel()
        await asyncio.gather(*self._sending, return_exceptions=True)

    def _check(self, group: _Gather) -> None:
        group.check = False
        if not group.sent and len(group.items) >= self._unfinished.get(group.key, 0):
            self.flush(group)

    def flush(self, group: _Gather) -> None:
        """Send `g` now (a task: its PubAck, then the acks of its commands)."""
        if self._gathering.get(group.key) is group:
            del self._gathering[group.key]
        if group.timer is not None:
            group.timer.cancel()
            group.timer = None
        if not group.items or group.sent:
            return
        group.sent = True
        loop = self.loop
        assert loop is not None
        task = loop.create_task(self._send_gathered(group))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    @property
    def waiting(self) -> bool:
        """Some results wait to go out."""
        return bool(self._gathering)

    async def _send_gathered(self, group: _Gather) -> None:
        try:
            if len(group.items) == 1:
                cmd, e, _ = group.items[0]
                await self.answer_alone(cmd, e.result, e.error, e.started_at, e.ended_at)
            else:
                first = group.items[0][0]
                eid = first.execution_id
                loop_id = loop_key(group.subject)[1]
                ids = sorted(cmd.command_id for cmd, _, _ in group.items)
                digest = hashlib.blake2b("\n".join(ids).encode(), digest_size=16).hexdigest()
                payload = encode(
                    ResultBatchOut(
                        execution_id=eid, loop_id=loop_id, step=first.step, results=group.parts, worker=self.worker
                    )
                )
                # re-sent through an election (same message id), like a single result
                await publisher(self.nc).send(
                    [(group.subject, payload, {MSG_ID: result_batch_id(eid, loop_id, digest)})],
                    readers_deduplicate=True,
                )
        except Exception as e:
            # unacked: the commands come back after ack_wait (here or on another pod)
            log.warning("publishing %d loop results on %s failed: %r", len(group.items), group.subject, e)
            for _, _, msg in group.items:
                self.held.release(msg.reply)
            return
        for _, _, msg in group.items:
            self.held.release(msg.reply)
            try:
                await ack(msg)
            except Exception as e:  # a closed connection: the command comes back, is answered again, ignored
                log.debug("ack of %s: %s", msg.reply, e)
