"""The calls of a `Client` that read: an execution's status (now, or awaited until it is
terminal), its log (as it is, or followed live), its result, its loops' iterations and
live progress, and dead letters."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import nats.errors
from nats.js.errors import KeyNotFoundError, NotFoundError

from actors.client.checks import check_execution_id
from actors.client.logview import LogItem, dead_letter_items, log_items
from actors.client.outcome import ExecutionFailed, ExecutionNotFinished, ExecutionNotFound
from actors.client.outcome import running_steps as steps_running
from actors.client.session import Session
from actors.client.watch import StatusWatch
from actors.natsio import held_start, last_message, log_time, start_message, stream_seq
from actors.natsio.readall import read_all
from actors.store.archive import ArchivedExecution
from actors.store.blobs import BLOB_MISSING, blob_owner, get_blob, stored_value
from actors.store.records import status_record
from actors.wire.codec import PayloadUnreadable
from actors.wire.events import TERMINAL_EVENTS, TERMINAL_STATES, ExecState
from actors.wire.messages import (
    CallDone,
    CallError,
    ChunkDone,
    ExecutionStatus,
    IterationResult,
    LoopProgress,
    ResultBatch,
    loop_input_decoder,
)
from streams.layout import (
    BLOB_BUCKET,
    DLQ_STREAM,
    EXECUTION_ID,
    LC,
    LOOP_STREAM,
    STATUS_BUCKET,
    is_exec_stream,
    progress_subject,
)
from streams.subjects import dlq_filter, loop_results_filter, subject_matches

ARCHIVES_KEPT = 4  # archived executions a client keeps read (a page shows one: its status, events, result)
WATCH_ROUND = 10.0  # seconds a status watch runs before it is checked and renewed
_progress = msgspec.json.Decoder(LoopProgress)


class Reader(Session):
    """Status, logs, results, iterations, progress, dead letters."""

    async def status(self, execution_id: str) -> ExecutionStatus | None:
        """The execution's status as projected now (state, playbook, times, result or
        error), or None when no status exists for it (yet). RecordInvalid (one line
        naming the key) when what is stored is not a status."""
        check_execution_id(execution_id)
        return await self._ride(
            f"reading the status of execution {execution_id}", lambda: self._status_once(execution_id)
        )

    async def _status_once(self, execution_id: str) -> ExecutionStatus | None:
        kv = await self.bucket(STATUS_BUCKET)
        try:
            entry = await kv.get(check_execution_id(execution_id))
        except KeyNotFoundError:
            # retired (actors/store/retire.py): its final status is in the archive, if kept
            archived = await self._archived(execution_id)
            status = None if archived is None else archived.status()
            return None if status is None else self.codec.open_for_display(status)
        return self.codec.open_for_display(status_record(entry.value or b"", key=execution_id))

    async def _archived(self, execution_id: str) -> ArchivedExecution | None:
        """The execution as archived when it was retired; None when it is not archived.
        An archive never changes once written: the last few read are kept."""
        if not EXECUTION_ID.fullmatch(execution_id):
            return None  # from a blob key or a record tampered with: never a file name or an object's
        found = self._archives.get(execution_id)
        if found is None:
            found = await self.archives.get(execution_id)
            if found is not None:
                while len(self._archives) >= ARCHIVES_KEPT:
                    self._archives.pop(next(iter(self._archives)))
                self._archives[execution_id] = found
        return found

    async def wait(self, execution_id: str, *, timeout: float | None = None) -> ExecutionStatus:
        """Wait until the projected status is terminal (the status KV is the only
        authority on it) and return it; past `timeout` seconds raise TimeoutError.
        Rides out a NATS node going away: a watch that fails or goes quiet is checked
        against the key and started again."""
        return await self._wait(check_execution_id(execution_id), timeout, None)

    async def _wait(self, execution_id: str, timeout: float | None, watch: StatusWatch | None) -> ExecutionStatus:
        """`wait`; `watch`: a watch of the execution's status opened before it was started
        (`Client.run`), so its first round needs no read of the key: nothing can have
        been stored before it. A round is a watch (the status republished once stored,
        actors/client/watch.py) and, for a watch opened here, a read of the key after
        subscribing: a status stored before the subscription is in the read, one stored
        after it comes on the subscription (the server takes a connection's subscribe
        and then its request in order, and the read goes to the stream's leader)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                if watch is not None:
                    await watch.close()
                raise TimeoutError(f"execution {execution_id} not terminal after {timeout}s")
            try:
                if watch is None:
                    watch = await StatusWatch.open(self.nc, execution_id, self.codec)
                    watch.offer(await self._status_once(execution_id))
                await asyncio.wait([watch.terminal], timeout=min(left or WATCH_ROUND, WATCH_ROUND))
                if watch.terminal.done():
                    return watch.terminal.result()
            except (TimeoutError, nats.errors.Error):
                pass  # a failed round: the key is read below, and a new watch opened
            finally:
                if watch is not None:
                    await watch.close()
                watch = None
            try:
                st = await self._status_once(execution_id)  # the watch's own rounds are the retries
            except (TimeoutError, nats.errors.Error):
                st = None
            if st is not None and st.state in TERMINAL_STATES:
                return st

    async def follow(self, execution_id: str, *, until_terminal: bool = True) -> AsyncIterator[LogItem]:
        """The execution's log from its start, then live (`async for item in
        client.follow(id)`); ends after its terminal lifecycle event unless
        `until_terminal` is False."""
        subjects = self.layout.execution(check_execution_id(execution_id))
        log = subjects.log
        stream = self.layout.exec_stream_of(execution_id)
        if await start_message(self.nc, stream, subjects) is None:
            archived = await self._archived(execution_id)
            if archived is not None:  # retired: its log is all there will ever be
                for subject, data, seq, at in archived.stream(self.layout.exec_stream_of(execution_id)):
                    for item in log_items(subject, data, seq, at, self.codec):
                        yield item
                return
        sub = await self.js.subscribe(log, stream=stream, ordered_consumer=True, pending_msgs_limit=-1)
        try:
            while True:
                msg = await sub.next_msg(timeout=None)
                for item in log_items(msg.subject, msg.data, stream_seq(msg), log_time(msg), self.codec):
                    yield item
                    if until_terminal and item.cls == LC and item.type in TERMINAL_EVENTS:
                        return
        finally:
            await sub.unsubscribe()

    async def events(self, execution_id: str) -> list[LogItem]:
        """The whole log as it is now, in order, then this execution's dead letters."""
        log = self.layout.execution(check_execution_id(execution_id)).log
        what = f"reading the events of execution {execution_id}"
        items = await self._ride(
            what,
            lambda: self._read_all(
                self.layout.exec_stream_of(execution_id),
                log,
                functools.partial(log_items, codec=self.codec),
                execution_id=execution_id,
            ),
        )
        items += await self._ride(
            what,
            lambda: self._read_all(
                DLQ_STREAM, dlq_filter(execution_id=execution_id), dead_letter_items, execution_id=execution_id
            ),
        )
        return items

    async def result(self, execution: str | LogItem) -> Any:
        """An execution's result: given its id, the result of a COMPLETED execution;
        ExecutionFailed for a FAILED or CANCELLED one (its `error`: the root cause type,
        message and step), ExecutionNotFinished while it runs, ExecutionNotFound for an
        unknown id. Given its terminal lifecycle event (a LogItem), that event's result.
        A result too large to travel in the event is read from the blob store."""
        if isinstance(execution, str):
            status, terminal = await self.terminal(execution)
            if status.state != ExecState.COMPLETED:
                raise ExecutionFailed(status, None if terminal is None else terminal.data.get("reason"))
            if terminal is None:
                # its status was read, then its log was gone: retired (without an archive)
                # between the two reads. Not a result of None
                raise ExecutionNotFound(f"execution {execution}: its records were removed by retention")
            execution = terminal
        if execution.unreadable is not None:
            raise PayloadUnreadable(f"the result: {execution.unreadable}")
        ref = execution.data.get("result_ref")
        if ref:
            return await self._ride(f"reading result {ref}", lambda: self._blob(ref))
        return execution.data.get("result")

    async def _blob(self, key: str) -> Any:
        """A blob's value; from the archive of the execution that owns it once retired."""
        try:
            return await get_blob(self.js, key)
        except BLOB_MISSING:
            data = await self._archived_blob(key)
            if data is None:
                raise
            return stored_value(self.js, key, data)

    async def _archived_blob(self, key: str) -> bytes | None:
        """A blob's bytes as stored, from the archive of the execution that owns it."""
        archived = await self._archived(blob_owner(key))
        return None if archived is None else archived.object(BLOB_BUCKET, key)

    async def terminal(self, execution_id: str) -> tuple[ExecutionStatus, LogItem | None]:
        """A finished execution's status and its terminal lifecycle event (None if the
        log no longer holds it); ExecutionNotFinished or ExecutionNotFound otherwise."""
        status = await self.status(execution_id)
        if status is None:
            raise ExecutionNotFound(f"no execution {execution_id!r} (not started, or not projected yet)")
        if status.state not in TERMINAL_STATES or status.terminal_event is None:
            raise ExecutionNotFinished(status)
        subjects = self.layout.execution(execution_id)
        # on its own subject, or (semantics 5) in the answer record of the last step's
        # result, which carries the execution's end (`in.answer.lc.<type>`)
        where = (subjects.lifecycle(status.terminal_event), subjects.answer_lifecycle(status.terminal_event))
        stream = self.layout.exec_stream_of(execution_id)
        found: tuple[str, bytes, int] | None = None
        for subject in where:
            try:
                msg = await self._ride(
                    f"reading the end of execution {execution_id}",
                    functools.partial(last_message, self.nc, stream, subject),
                )
            except NotFoundError:
                continue
            found = subject, msg.data or b"", msg.seq or 0
            break
        if found is None:
            archived = await self._archived(execution_id)
            ends = [] if archived is None else [(s, d, q) for s, d, q, _ in archived.stream(stream) if s in where]
            if not ends:
                return status, None
            found = ends[-1]
        subject, data, seq = found
        # the message may carry its whole decision (semantics 2): the terminal event is one of its items
        items = log_items(subject, data, seq, 0.0, self.codec)
        return status, next((i for i in items if i.type == status.terminal_event), None)

    async def running_steps(self, execution_id: str) -> list[str]:
        """The steps of the execution entered and not exited yet (from its log)."""
        return steps_running(await self.events(execution_id))

    async def iterations(self, execution_id: str) -> list[CallDone | CallError | ChunkDone]:
        """Every iteration result of the execution's loops (the counter's logs, not the
        execution's), in arrival order. A batch of results is given as the `call.done`
        or `call.error` of each of its entries."""
        check_execution_id(execution_id)
        subject = loop_results_filter(execution_id, self.layout.partitions)

        def expand(subject: str, data: bytes, seq: int, at: float) -> list[Any]:
            inp = self.codec.decode(loop_input_decoder, data)
            if isinstance(inp, ResultBatch):
                return [_single(inp, r) for r in inp.results]
            return [inp] if isinstance(inp, (CallDone, CallError, ChunkDone)) else []

        return await self._read_all(LOOP_STREAM, subject, expand, execution_id=execution_id)

    async def progress(self, execution_id: str) -> AsyncIterator[LoopProgress]:
        """Live progress of the execution's loops (best effort, not stored)."""
        sub = await self.nc.subscribe(progress_subject(check_execution_id(execution_id)))
        try:
            async for msg in sub.messages:
                yield _progress.decode(msg.data)
        finally:
            await sub.unsubscribe()

    async def dead_letters(self, source: str = "*", *, since: float | None = None) -> list[LogItem]:
        """Dead letters of every actor (or of `source`: `start`, `engine`, ...), oldest
        first, stored at or after `since` (a Unix time) if given. Each item's data has
        `reason`, `source`, `execution_id` (None when the message named no usable one),
        the original `subject` and `data`."""
        items: list[LogItem] = await self._ride(
            "reading dead letters", lambda: self._read_all(DLQ_STREAM, dlq_filter(source=source), dead_letter_items)
        )
        return items if since is None else [i for i in items if i.at >= since]

    async def _read_all(self, stream: str, subject: str, expand: Any, *, execution_id: str | None = None) -> list[Any]:
        """What `expand(subject, data, seq, at)` makes of each message of `stream` on
        `subject`, in order. For an `execution_id`'s records: when the stream has none
        (the execution was retired), those of its archive, if it has one."""
        msgs = await read_all(self.nc, stream, subject)
        live = [x for m in msgs for x in expand(m.subject, m.data, stream_seq(m), log_time(m))]
        if execution_id is None:
            return live
        if msgs and (not is_exec_stream(stream) or any(held_start(m.subject, m.data) is not None for m in msgs)):
            return live  # its log is there, start record (or start answer, semantics 6) and all: not retired
        archived = await self._archived(execution_id)
        if archived is None:
            return live
        # retired, and maybe a message that reached its log since (a late answer): the
        # archive's history, then what came after it
        kept = archived.stream(stream)
        last = max((seq for _, _, seq, _ in kept), default=0)
        old = [x for s, data, seq, at in kept if subject_matches(subject, s) for x in expand(s, data, seq, at)]
        return old + [
            x for m in msgs if stream_seq(m) > last for x in expand(m.subject, m.data, stream_seq(m), log_time(m))
        ]


def _single(batch: ResultBatch, r: IterationResult) -> CallDone | CallError:
    """One entry of a result batch as the message it stands for."""
    common: dict[str, Any] = dict(
        execution_id=batch.execution_id,
        command_id=r.command_id,
        step=batch.step,
        attempt_number=r.attempt_number,
        started_at=r.started_at,
        ended_at=r.ended_at,
        worker=batch.worker,
        iteration_index=r.iteration_index,
    )
    if r.error is not None:
        return CallError(error=r.error, **common)
    return CallDone(result=r.result, **common)
