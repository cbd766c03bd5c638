"""Tool actors: competing consumers of `cmd.<kind>`, one pull consumer per kind.

A tool actor knows commands and results, nothing of the engine: it runs the command,
publishes `call.done` or `call.error` to the subject the command names (the
execution's input subject) with a deterministic message id, and acks the command
once the server has stored the result (its PubAck). Results of concurrent commands are
published pipelined, not one round trip at a time. Long tools keep their command alive
with `in_progress`. A command that cannot be decoded, or
that has been delivered `max_deliver` times (its tool keeps killing the pod), is
dead-lettered and, where it names an execution, answered with a `call.error`, so
the execution sees the failure instead of waiting forever.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import time
from collections.abc import Mapping
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import DEFAULT_PREFIX

from actors.natsio import MSG_ID, dead_letter, num_delivered, publisher
from actors.playbook.model import UNRENDERED_TOOL_FIELDS
from actors.playbook.templates import TemplateError, render_value
from actors.tools.executors import ToolFailure, close_http, run_tool
from actors.tools.pyrunner import close_default_pool, default_pool
from actors.wire import (
    CallDone,
    CallError,
    ChunkDone,
    Command,
    ErrorInfo,
    IterationOutcome,
    SinkCall,
    command_decoder,
    encode,
)
from streams.layout import CMD_STREAM, TOOL_KINDS, Layout, tool_consumer

log = logging.getLogger("actors.tools")
RESULT_HEADROOM = 4096  # room for the envelope around a result
PULL_EXPIRES = 5.0  # seconds a pull request waits at the server for commands (as long as a fetch did)
PULL_HEARTBEAT = 2.0  # the server's idle heartbeat while a pull request waits


# commands in flight per kind and pod when not given. A sleep holds its slot doing
# nothing, so many can wait at once; the others are bounded by what they use (python:
# the worker pool; shell: processes; http: sockets). A noop is done at once: with the
# continuous pull, more than 64 only keeps more objects alive (measured: 64 beats 256
# and 512 on bench/loop_fanout.py).
DEFAULT_CONCURRENCY = 64
KIND_CONCURRENCY = {"sleep": 512}


def concurrency_of(kind: str, concurrency: int | Mapping[str, int] | None) -> int:
    if isinstance(concurrency, int):
        return concurrency
    if concurrency is not None and kind in concurrency:
        return concurrency[kind]
    return KIND_CONCURRENCY.get(kind, DEFAULT_CONCURRENCY)


class _Kind:
    """The pull consumer of one kind: commands running here, commands asked for."""

    __slots__ = ("backoff_until", "concurrency", "kind", "last_seen", "requested", "running", "sub", "wake")

    def __init__(self, kind: str, concurrency: int) -> None:
        self.kind = kind
        self.concurrency = concurrency
        self.running: set[asyncio.Task[None]] = set()
        self.requested = 0  # asked of the server by pull requests, not delivered yet
        self.last_seen = 0.0  # loop time of the last thing the server sent (or of our last request)
        self.backoff_until = 0.0
        self.wake = asyncio.Event()
        self.sub: Subscription | None = None


class ToolActor:
    def __init__(
        self,
        nc: NATS,
        *,
        layout: Layout,
        kinds: tuple[str, ...] = TOOL_KINDS,
        concurrency: int | Mapping[str, int] | None = None,
        name: str | None = None,
    ) -> None:
        """`concurrency`: commands in flight per kind, one number for every kind or a
        mapping by kind (kinds it leaves out get `KIND_CONCURRENCY`/`DEFAULT_CONCURRENCY`)."""
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.layout = layout
        self.kinds = kinds
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self._kinds = {kind: _Kind(kind, max(1, concurrency_of(kind, concurrency))) for kind in kinds}
        self._loops: list[asyncio.Task[None]] = []
        self._running: dict[str, dict[str, asyncio.Event]] = {}  # execution -> command -> cancel
        self._held: dict[str, Msg] = {}  # ack subject -> command not acked yet (kept alive)
        self._inflight: set[asyncio.Task[None]] = set()
        self._cancel_sub: Subscription | None = None
        self._stopping = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._beat: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if "python" in self.kinds:
            await default_pool().start()  # warm workers now, not on the first step
        self._cancel_sub = await self.nc.subscribe("cancel.>", cb=self._on_cancel)
        for k in self._kinds.values():
            k.sub = await self.nc.subscribe(self.nc.new_inbox(), cb=functools.partial(self._on_delivery, k),
                                            pending_msgs_limit=-1)
            self._loops.append(asyncio.create_task(self._pull(k), name=f"tools:{k.kind}"))
        self._loops.append(asyncio.create_task(self._watch(), name="tools:watch"))
        self._beat = asyncio.create_task(self._keep_alive(), name="tools:keep-alive")

    async def stop(self, *, drain_timeout: float = 5.0) -> None:
        """Stop pulling; give running commands `drain_timeout` to finish (still kept
        alive). What is still running then is left unacked and will be redelivered to
        another pod."""
        self._stopping.set()
        for t in self._loops:
            t.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        for k in self._kinds.values():
            if k.sub is not None:
                try:
                    await k.sub.unsubscribe()  # what our pull requests still bring goes back after ack_wait
                except Exception as e:  # a closed connection
                    log.debug("unsubscribing %s: %s", k.kind, e)
        if self._inflight:
            await asyncio.wait(self._inflight, timeout=drain_timeout)
        for t in list(self._inflight):
            t.cancel()
        await asyncio.gather(*self._inflight, return_exceptions=True)
        if self._beat is not None:
            self._beat.cancel()
            await asyncio.gather(self._beat, return_exceptions=True)
        if self._cancel_sub is not None:
            await self._cancel_sub.unsubscribe()
        await close_default_pool()
        await close_http()

    async def _on_cancel(self, msg: Msg) -> None:
        """`cancel.<execution>` stops all of an execution's commands running here,
        `cancel.<execution>.<command>` one of them."""
        _, _, rest = msg.subject.partition(".")
        eid, _, command_id = rest.partition(".")
        running = self._running.get(eid, {})
        for cid, ev in running.items():
            if not command_id or cid == command_id:
                ev.set()

    # --- pulling commands ---------------------------------------------------------------
    # A continuous pull: requests for as many commands as there are free slots stay
    # open at the server (`expires`), and commands arrive on our inbox as they come,
    # while earlier ones still run. Only free slots are asked for, so what this pod
    # cannot run stays in the stream for other pods (back-pressure, fair competing
    # consumers). A request is sent once a quarter of the slots is free, so a busy kind
    # asks in batches, not one round trip per command.

    async def _pull(self, k: _Kind) -> None:
        assert k.sub is not None
        loop = asyncio.get_running_loop()
        subject = f"{DEFAULT_PREFIX}.CONSUMER.MSG.NEXT.{CMD_STREAM}.{tool_consumer(k.kind)}"
        threshold = max(1, k.concurrency // 4)
        inbox = k.sub.subject
        while not self._stopping.is_set():
            k.wake.clear()
            now = loop.time()
            if k.requested and now - k.last_seen > 3 * PULL_HEARTBEAT:
                k.requested = 0  # neither commands nor heartbeats: our requests are gone (server restart)
            free = k.concurrency - len(k.running) - k.requested
            if free > 0 and (free >= threshold or not k.requested) and now >= k.backoff_until:
                request = {"batch": free, "expires": int(PULL_EXPIRES * 1e9), "idle_heartbeat": int(PULL_HEARTBEAT * 1e9)}
                k.requested += free
                k.last_seen = now
                await self.nc.publish(subject, msgspec.json.encode(request), reply=inbox)
            await k.wake.wait()

    async def _watch(self) -> None:
        """Wake every kind's pull loop now and then: to see lost requests, end backoffs."""
        while True:
            await asyncio.sleep(PULL_HEARTBEAT)
            for k in self._kinds.values():
                k.wake.set()

    async def _on_delivery(self, k: _Kind, msg: Msg) -> None:
        loop = self._loop
        assert loop is not None
        k.last_seen = loop.time()
        if not msg.reply:  # a status from the server about our requests
            self._on_status(k, msg)
            return
        k.requested = max(0, k.requested - 1)
        if self._stopping.is_set():
            await msg.nak()  # back to the stream at once, for another pod
            return
        task = loop.create_task(self._handle(msg))  # not asyncio.create_task: no loop lookup per command
        k.running.add(task)
        self._inflight.add(task)
        task.add_done_callback(functools.partial(self._done, k))

    def _done(self, k: _Kind, task: asyncio.Task[None]) -> None:
        k.running.discard(task)
        self._inflight.discard(task)
        k.wake.set()
        if not task.cancelled() and task.exception() is not None:
            # unacked: the command comes back after ack_wait (here or on another pod)
            log.warning("tool command failed before its ack: %r", task.exception())

    def _on_status(self, k: _Kind, msg: Msg) -> None:
        headers = msg.headers or {}
        status = headers.get("Status")
        if status == "100":
            return  # idle heartbeat: our requests are alive
        pending = headers.get("Nats-Pending-Messages")
        if pending is not None and pending.isdigit():
            k.requested = max(0, k.requested - int(pending))  # a request ended with these undelivered
        else:
            k.requested = 0  # a request refused or dropped (409 ...): ask again
        if status not in ("408", "409") or pending is None:
            log.debug("pull %s: %s %s", k.kind, status, headers.get("Description", ""))
        if status not in ("408", "404") and pending is None:
            k.backoff_until = asyncio.get_running_loop().time() + 0.5  # do not hammer a refusing server
        k.wake.set()

    async def _handle(self, msg: Msg) -> None:
        try:
            cmd = command_decoder.decode(msg.data)
        except msgspec.DecodeError as e:
            await dead_letter(self.js, source="tools", reason=f"undecodable command: {e}", msg=msg)
            await msg.term()
            return
        delivered = num_delivered(msg)
        if delivered >= self.layout.max_deliver:
            reason = f"command delivered {delivered} times without a result; giving up"
            await dead_letter(self.js, source="tools", reason=reason, msg=msg, execution_id=cmd.execution_id)
            await self._reply(cmd, None, ErrorInfo(type="DeliveryExhausted", message=reason), 0.0, 0.0)
            await msg.term()
            return
        cancel = asyncio.Event()
        running = self._running.get(cmd.execution_id)
        if running is None:
            running = self._running[cmd.execution_id] = {}
        running[cmd.command_id] = cancel
        held = msg.reply
        self._held[held] = msg
        try:
            started = time.time()
            try:
                if cmd.chunk is not None:
                    outcomes = []
                    for item in cmd.chunk:
                        t0 = time.time()
                        result, error = await self._run(cmd, item.args, item.element, item.iteration_index, cancel)
                        outcomes.append(IterationOutcome(iteration_index=item.iteration_index, result=result,
                                                         error=error, started_at=t0, ended_at=time.time()))
                else:
                    result, error = await self._run(cmd, cmd.args, cmd.element, cmd.iteration_index, cancel)
            finally:
                running.pop(cmd.command_id, None)
                if not running and self._running.get(cmd.execution_id) is running:
                    del self._running[cmd.execution_id]
            # the result is stored (PubAck) before the command is acked: a command that
            # was ever acked has its result in the log, which replay relies on
            if cmd.chunk is not None:
                await self._reply_chunk(cmd, outcomes)
            else:
                await self._reply(cmd, result, error, started, time.time())
        finally:
            del self._held[held]
        await msg.ack()

    async def _run(self, cmd: Command, args: dict[str, Any], element: Any, index: int | None,
                   cancel: asyncio.Event) -> tuple[Any, ErrorInfo | None]:
        """The tool, then its sink (same command: a failed sink fails the attempt)."""
        if cancel.is_set():
            return None, ErrorInfo(type="Cancelled", message=f"step '{cmd.step}': cancelled")
        try:
            result = await run_tool(cmd.kind, {"kind": cmd.kind, **cmd.tool}, args, timeout=cmd.timeout, cancel=cancel)
        except ToolFailure as f:
            return None, ErrorInfo(**f.to_error())
        if cmd.sink is not None:
            error = await self._sink(cmd, cmd.sink, result, element, index, cancel)
            if error is not None:
                return None, error
        return result, None

    async def _sink(self, cmd: Command, sink: SinkCall, result: Any, element: Any, index: int | None,
                    cancel: asyncio.Event) -> ErrorInfo | None:
        scope = {**sink.scope, "result": result, "response": result, "error": None, "attempt": cmd.attempt_number}
        if sink.element is not None:
            scope[sink.element] = element
            scope["iteration"] = {"index": index}
        try:
            tool = {k: (v if k in UNRENDERED_TOOL_FIELDS else render_value(v, scope, where=f"sink.tool.{k}"))
                    for k, v in sink.tool.items()}
            args = render_value(sink.args, scope, where="sink.args")
        except TemplateError as e:
            return ErrorInfo(type="TemplateError", message=f"step '{cmd.step}' field {e}")
        kind = str(tool.get("kind"))
        try:
            await run_tool(kind, tool, args, timeout=cmd.timeout, cancel=cancel)
        except ToolFailure as f:
            info = ErrorInfo(**f.to_error())
            info.message = f"step '{cmd.step}' sink ({kind}) failed: {info.message}"
            return info
        return None

    async def _reply_chunk(self, cmd: Command, outcomes: list[IterationOutcome]) -> None:
        done = ChunkDone(execution_id=cmd.execution_id, command_id=cmd.command_id, step=cmd.step,
                         attempt_number=cmd.attempt_number, outcomes=outcomes, worker=self.name)
        payload = encode(done)
        limit = self.layout.max_msg_size - RESULT_HEADROOM
        if len(payload) > limit:
            # too large together: the iterations with the largest results fail, each
            # with a clear error, until the rest fits (never a truncated result)
            share = limit // max(len(outcomes), 1)
            for o in outcomes:
                n = len(encode(o.result))
                if n > share:
                    o.result = None
                    o.error = ErrorInfo(type="ResultTooLarge", message=(
                        f"step '{cmd.step}' iteration {o.iteration_index}: result is {n} bytes, over this chunk's "
                        f"{share}-byte share of the message limit (use a smaller chunk_size)"))
            payload = encode(done)
        await self._publish_result(cmd, payload)

    async def _reply(self, cmd: Command, result: Any, error: ErrorInfo | None, started: float, ended: float) -> None:
        common = dict(execution_id=cmd.execution_id, command_id=cmd.command_id, step=cmd.step,
                      attempt_number=cmd.attempt_number, started_at=started, ended_at=ended, worker=self.name,
                      iteration_index=cmd.iteration_index)
        payload = encode(CallError(error=error, **common) if error else CallDone(result=result, **common))  # type: ignore[arg-type]
        limit = self.layout.max_msg_size - RESULT_HEADROOM
        if len(payload) > limit:
            error = ErrorInfo(
                type="ResultTooLarge",
                message=f"step '{cmd.step}': result is {len(payload)} bytes, over the {limit}-byte message limit",
            )
            payload = encode(CallError(error=error, **common))  # type: ignore[arg-type]
        await self._publish_result(cmd, payload)

    async def _publish_result(self, cmd: Command, payload: bytes) -> None:
        """Wait for the PubAck (pipelined with every other command's result). A result
        refused while the log's stream elects a leader is sent again, not dropped:
        dropping it would leave the command unacked, to run again after ack_wait and
        count towards max_deliver."""
        await publisher(self.nc).send([(cmd.reply_to, payload, {MSG_ID: f"{cmd.execution_id}:res:{cmd.command_id}"})])

    async def _keep_alive(self) -> None:
        """One task keeps every held command alive (`in_progress`) while it runs: each
        gets a beat within `ack_wait / 3` of being fetched, then every `ack_wait / 3`."""
        period = max(self.layout.ack_wait / 3, 0.5)
        while True:
            await asyncio.sleep(period)
            for reply, msg in list(self._held.items()):
                if reply in self._held:
                    try:
                        await msg.in_progress()
                    except Exception as e:  # a closed connection: the next beat tries again
                        log.debug("keep-alive of %s: %s", reply, e)
