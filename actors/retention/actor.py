"""The retention actor: takes finished executions from stream ENDED in the order they
ended, waits until each one's retention is over (`Layout.finished_retention` after its
end), then archives it (when the deployment archives) and removes it from every stream
and bucket (actors/store/retire.py).

ENDED is read through one durable pull consumer (`retention`), so retention pods
compete for the work and any number may run; an end not due yet is handed back with a
delay (at most WAIT_MAX, so a shorter retention set later takes effect within that).
The consumer never gives up on an entry (max_deliver -1): a failure to archive is
retried, never skipped, because removing what was not archived would lose it. Retention
is a decision about people's data, not about an execution: it reads the clock, not the
log, and decides nothing an execution's replay depends on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

from actors.natsio import dead_letter, log_time, stream_seq
from actors.natsio.purge import delete
from actors.natsio.transient import TRANSIENT_REQUEST
from actors.store.archive import ArchiveStore
from actors.store.records import RecordInvalid, ended_status
from actors.store.retire import Retired, retire, sweep_orphan_blobs
from streams.layout import ENDED_STREAM, RETENTION_CONSUMER, Layout
from streams.subjects import ended_execution

log = logging.getLogger("actors.retention")

BATCH = 16  # ends taken at once
FETCH_WAIT = 5.0  # seconds a fetch waits for an end
MORE_WAIT = 0.05  # seconds the fetch after it waits for more (what is there already comes at once)
WAIT_MAX = 300.0  # seconds an end not due yet is handed back for, at most
RETRY_FIRST, RETRY_MAX = 1.0, 60.0  # seconds before a failed retirement is tried again
# blobs no record names (a command's args sent apart) are swept now and then: those of
# executions with neither a status nor a log, stored over SWEEP_GRACE ago (a start's
# payload is stored before its start record: a young one may belong to a start under way)
SWEEP_EVERY = 3600.0
SWEEP_GRACE = 3600.0
SAY_EVERY = 30.0  # seconds between two warnings of failed retirements
TAKING_FAILED: tuple[type[BaseException], ...] = (NotFoundError, nats.errors.Error, *TRANSIENT_REQUEST)


class Retention:
    """One retention actor: a loop taking ends from the `retention` consumer."""

    role = "retention"

    def __init__(
        self,
        nc: NATS,
        *,
        layout: Layout,
        archive: ArchiveStore | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.nc = nc
        self.layout = layout
        self.archive = archive
        self.clock = clock
        self.retired = 0  # executions removed by this actor (metrics, tests)
        self.failures = 0  # retirements that failed and were handed back
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._last_warning = -SAY_EVERY
        self._unsaid = 0  # warnings held back since the last one said

    async def start(self) -> None:
        if self.layout.finished_retention <= 0:
            log.info("finished executions are kept for ever (retention 0): the retention actor idles")
            return
        self._tasks = [
            asyncio.create_task(self._run(), name="retention"),
            asyncio.create_task(self._sweeping(), name="retention-sweep"),
        ]

    async def stop(self) -> None:
        # a flag beside the cancel: nats-py turns a cancel during a fetch on a closed
        # connection into ConnectionClosedError, which the loop would take for an outage
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def sweep(self, *, grace: float = SWEEP_GRACE) -> int:
        """Remove the orphaned blobs stored over `grace` seconds ago; how many went."""
        return await sweep_orphan_blobs(self.nc, self.layout, older_than=self.clock() - grace)

    async def _sweeping(self) -> None:
        while not self._stopping and not self.nc.is_closed:
            await asyncio.sleep(SWEEP_EVERY)  # a period, not an event: nothing signals an orphan
            try:
                swept = await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # NATS away: the next round
                log.warning("retention: sweeping orphaned blobs failed (%s)", e)
                continue
            if swept:
                log.info("retention: removed %d orphaned blobs", swept)

    async def _run(self) -> None:
        js = self.nc.jetstream()
        sub = None
        pause = RETRY_FIRST
        while not self._stopping and not self.nc.is_closed:
            try:
                if sub is None:
                    sub = await js.pull_subscribe_bind(RETENTION_CONSUMER, stream=ENDED_STREAM)
                # one, waiting for it; then what else is there now. nats-py's fetch of a
                # batch waits until the batch is full or the wait is over: ends due one by
                # one (handed back with their delays) would each wait out the whole wait
                msgs = await sub.fetch(1, timeout=FETCH_WAIT)
                try:
                    msgs += await sub.fetch(BATCH - 1, timeout=MORE_WAIT)
                except TimeoutError:
                    pass
                pause = RETRY_FIRST
            except TimeoutError:
                continue  # nothing ended
            except TAKING_FAILED as e:
                # the consumer not made yet (an engine pod of this version makes it),
                # or NATS away: asked again, backing off
                log.warning("retention: taking ends failed (%s); again in %.0fs", e, pause)
                await asyncio.sleep(pause)
                pause = min(pause * 2, RETRY_MAX)
                continue
            # the batch's retirements at once (each its own execution; a retirement
            # is mostly waiting on NATS), the next fetch once all are done
            await asyncio.gather(*(self._handle_safely(msg) for msg in msgs))

    async def _handle_safely(self, msg: Msg) -> None:
        try:
            await self._handle(msg)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            # NATS went away between two steps (a nak, an ack, a dead letter): the end
            # comes back after the ack wait, and is handled again from the start
            self._warn(f"handling an end failed ({e}); it is delivered again")

    async def _handle(self, msg: Msg) -> None:
        try:
            status = ended_status(msg.data, seq=stream_seq(msg))
            if status.execution_id != ended_execution(msg.subject):
                raise RecordInvalid(
                    f"stream {ENDED_STREAM} message {stream_seq(msg)}: the status of execution "
                    f"{status.execution_id!r} under {msg.subject!r}"
                )
        except RecordInvalid as e:
            # not an end anybody can act on. Kept as long as an end is (`list` says it
            # skips it, naming it), then parked where people read it (a copy) and removed
            # from ENDED, where nothing else would ever remove it
            if await self._wait_for(msg, log_time(msg)):
                return
            await dead_letter(self.nc.jetstream(), source="retention", reason=str(e), msg=msg)
            await delete(self.nc, ENDED_STREAM, [stream_seq(msg)])
            await msg.ack()
            return
        if await self._wait_for(msg, status.ended_at if status.ended_at is not None else log_time(msg)):
            return
        # a long retirement (a big loop's log, big blobs) is kept in hand past the ack
        # wait: otherwise the end is delivered to another pod, which retires it again
        keeping = asyncio.create_task(self._keep(msg))
        try:
            done = await retire(self.nc, self.layout, status.execution_id, archive=self.archive)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            # NATS away, the archive unwritable (a full disk, a missing directory):
            # nothing is removed before its archive is written, so trying again is safe
            self.failures += 1
            delay = min(RETRY_MAX, RETRY_FIRST * 2 ** min(msg.metadata.num_delivered, 6))
            self._warn(f"retiring {status.execution_id} failed ({e}); tried again, backing off to {RETRY_MAX:.0f}s")
            await msg.nak(delay=delay)
            return
        finally:
            keeping.cancel()
        self._said(done)
        if done.kept is not None:
            await msg.nak(delay=WAIT_MAX)  # not finished (or not readable) now: looked at again later
            return
        await msg.ack()

    async def _wait_for(self, msg: Msg, ended: float) -> bool:
        """Hand `msg` back until the retention after `ended` is over; False once it is."""
        left = ended + self.layout.finished_retention - self.clock()
        if left <= 0:
            return False
        await msg.nak(delay=min(left, WAIT_MAX))
        return True

    async def _keep(self, msg: Msg) -> None:
        while True:
            await asyncio.sleep(self.layout.ack_wait / 3)
            await msg.in_progress()

    def _warn(self, line: str) -> None:
        """A warning, at most one a SAY_EVERY seconds: a cause that fails every
        retirement (an archive directory not mounted) would otherwise say so for each."""
        now = time.monotonic()
        if now - self._last_warning >= SAY_EVERY:
            self._last_warning = now
            more = f" (and {self._unsaid} more since)" if self._unsaid else ""
            log.warning("retention: %s%s", line, more)
            self._unsaid = 0
        else:
            self._unsaid += 1

    def _said(self, done: Retired) -> None:
        if done.kept is not None:
            log.info("retention: kept %s: %s", done.execution_id, done.kept)
            return
        self.retired += 1
        log.debug(
            "retention: retired %s (%s, %d messages, %d blobs)",
            done.execution_id,
            "archived" if done.archived else "not archived",
            done.messages,
            done.blobs,
        )
