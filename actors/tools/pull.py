"""The continuous pull of one tool kind's consumer (on CMD, or on EXEC for commands
held by their decision record): raw `$JS.API.CONSUMER.MSG.NEXT`
requests for as many commands as there are free slots, and the server's status messages
(heartbeats, expired or refused requests) that say what became of them.

Requests for as many commands as there are free slots stay open at the server
(`expires`), and commands arrive on our inbox as they come, while earlier ones still
run. Only free slots are asked for, so what this pod cannot run stays in the stream for
other pods (back-pressure, fair competing consumers). A request is sent once a quarter
of the slots is free, so a busy kind asks in batches, not one round trip per command.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import DEFAULT_PREFIX

from actors.natsio import send
from actors.natsio.dispatch import subscribe_direct
from streams.layout import CMD_STREAM, tool_consumer

__all__ = ["PULL_EXPIRES", "PULL_HEARTBEAT", "KindPull", "wake_now_and_then"]

log = logging.getLogger("actors.tools")
PULL_EXPIRES = 5.0  # seconds a pull request waits at the server for commands (as long as a fetch did)
PULL_HEARTBEAT = 2.0  # the server's idle heartbeat while a pull request waits

# a delivered command -> the task running it (None: not taken, e.g. nak'ed while stopping)
Deliver = Callable[[Msg], "asyncio.Task[None] | None"]


class KindPull:
    """The pull consumer of one kind: commands running here, commands asked for."""

    __slots__ = (
        "backoff_until",
        "concurrency",
        "consumer",
        "deliver",
        "group",
        "kind",
        "last_seen",
        "loop",
        "nc",
        "requested",
        "running",
        "stream",
        "sub",
        "wake",
    )

    def __init__(
        self, nc: NATS, kind: str, concurrency: int, deliver: Deliver, *, stream: str = CMD_STREAM, consumer: str = ""
    ) -> None:
        self.nc = nc
        self.kind = kind
        self.concurrency = concurrency
        self.deliver = deliver
        self.stream = stream  # CMD (commands as their own messages) or EXEC (held by their decision record)
        self.consumer = consumer or tool_consumer(kind)
        # the pulls of one kind (CMD's and EXEC's) share its slots: `concurrency` counts
        # what all of them run (see `run`)
        self.group: list[KindPull] = [self]
        self.running: set[asyncio.Task[None]] = set()
        self.requested = 0  # asked of the server by pull requests, not delivered yet
        self.last_seen = 0.0  # loop time of the last thing the server sent (or of our last request)
        self.backoff_until = 0.0
        self.wake = asyncio.Event()
        self.sub: Subscription | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    async def subscribe(self) -> None:
        """Our inbox, where the server delivers commands and status messages."""
        self.loop = asyncio.get_running_loop()
        # handed over as read: a command's task starts without a queue hop and task switch first
        self.sub = await subscribe_direct(self.nc, self.nc.new_inbox(), self._on_delivery)

    async def unsubscribe(self) -> None:
        if self.sub is not None:
            try:
                await self.sub.unsubscribe()  # what our pull requests still bring goes back after ack_wait
            except Exception as e:  # a closed connection
                log.debug("unsubscribing %s: %s", self.kind, e)

    async def run(self, stopping: asyncio.Event) -> None:
        """Ask for commands whenever enough slots are free, until `stopping` is set."""
        assert self.sub is not None
        loop = asyncio.get_running_loop()
        subject = f"{DEFAULT_PREFIX}.CONSUMER.MSG.NEXT.{self.stream}.{self.consumer}"
        threshold = max(1, self.concurrency // 4)
        inbox = self.sub.subject
        while not stopping.is_set():
            self.wake.clear()
            now = loop.time()
            if self.requested and now - self.last_seen > 3 * PULL_HEARTBEAT:
                self.requested = 0  # neither commands nor heartbeats: our requests are gone (server restart)
            # slots: what the kind runs (both pulls) and what this pull has asked for. Not
            # what the other pull asked for: its requests may wait at the server for
            # commands that are not coming, and must not starve this one. So when both
            # streams have commands at once a pod may take up to twice `concurrency`
            free = self.concurrency - sum(len(k.running) for k in self.group) - self.requested
            if free > 0 and (free >= threshold or not self.requested) and now >= self.backoff_until:
                request = {
                    "batch": free,
                    "expires": int(PULL_EXPIRES * 1e9),
                    "idle_heartbeat": int(PULL_HEARTBEAT * 1e9),
                }
                self.requested += free
                self.last_seen = now
                await send(self.nc, subject, msgspec.json.encode(request), reply=inbox)
            await self.wake.wait()

    def _on_delivery(self, msg: Msg) -> None:
        loop = self.loop
        assert loop is not None
        self.last_seen = loop.time()
        if not msg.reply:  # a status from the server about our requests
            self._on_status(msg)
            return
        self.requested = max(0, self.requested - 1)
        task = self.deliver(msg)
        if task is not None:
            self.running.add(task)
            task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self.running.discard(task)
        for k in self.group:  # a slot is free for each pull of the kind
            k.wake.set()

    def _on_status(self, msg: Msg) -> None:
        headers = msg.headers or {}
        status = headers.get("Status")
        if status == "100":
            return  # idle heartbeat: our requests are alive
        pending = headers.get("Nats-Pending-Messages")
        if pending is not None and pending.isdigit():
            self.requested = max(0, self.requested - int(pending))  # a request ended with these undelivered
        else:
            self.requested = 0  # a request refused or dropped (409 ...): ask again
        if status not in ("408", "409") or pending is None:
            log.debug("pull %s: %s %s", self.kind, status, headers.get("Description", ""))
        if status not in ("408", "404") and pending is None:
            self.backoff_until = asyncio.get_running_loop().time() + 0.5  # do not hammer a refusing server
        self.wake.set()


async def wake_now_and_then(pulls: Iterable[KindPull]) -> None:
    """Wake every kind's pull loop now and then: to see lost requests, end backoffs."""
    while True:
        await asyncio.sleep(PULL_HEARTBEAT)
        for k in pulls:
            k.wake.set()
