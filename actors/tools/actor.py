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
import hashlib
import logging
import os
import socket
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import DEFAULT_PREFIX

from actors.blobs import BLOB_MISSING, HEADROOM, chunk_message, resolve_command, result_message
from actors.deadletters import answer_undeliverable
from actors.limits import limits_from_env
from actors.metrics import commands_in_flight, observe_step, step_outcome
from actors.natsio import MSG_ID, ack, dead_letter, num_delivered, publisher, send
from actors.playbook.model import UNRENDERED_TOOL_FIELDS
from actors.playbook.templates import (
    SliceExhausted,
    TemplateError,
    render_value,
    template_limits,
)
from actors.render_process import OffLoop
from actors.tools.executors import CancelSignal, ToolFailure, close_http, run_tool
from actors.tools.pyrunner import close_default_pool, default_pool
from actors.wire import (
    CallDone,
    CallError,
    ChunkDone,
    Command,
    ErrorInfo,
    IterationOutcome,
    IterationResult,
    ResultBatchOut,
    SinkCall,
    command_decoder,
    encode,
)
from streams.layout import CMD_STREAM, TOOL_KINDS, Layout, loop_key, result_batch_subject, tool_consumer

log = logging.getLogger("actors.tools")
RESULT_HEADROOM = HEADROOM  # room for the envelope around a result
PULL_EXPIRES = 5.0  # seconds a pull request waits at the server for commands (as long as a fetch did)
PULL_HEARTBEAT = 2.0  # the server's idle heartbeat while a pull request waits


# commands in flight per kind and pod when not given. A sleep holds its slot doing
# nothing, so many can wait at once; the others are bounded by what they use (python:
# the worker pool; shell: processes; http: sockets). A noop is done at once: 256 asks
# for commands in larger pulls, so loop results gather into larger batches (measured on
# bench/loop_fanout.py: 256 beats 64, which beat 256 before results were gathered).
DEFAULT_CONCURRENCY = 64
CANCELS_REMEMBERED = 100_000  # recent `cancel.>` subjects kept, to answer queued cancelled commands
KIND_CONCURRENCY = {"sleep": 512, "noop": 256}

# loop iteration results that end close together go out as one `result.batch` message
# per loop: at most this many, sent at once when no command is running here any more
# (nothing could join) or when as many of the loop's commands here are done as still run
# (a loop with few iterations in flight is not kept waiting), else this many seconds
# after the first result
RESULT_BATCH_MAX = 256
RESULT_BATCH_WINDOW = 0.005


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


class ToolActor:
    def __init__(
        self,
        nc: NATS,
        *,
        layout: Layout,
        kinds: tuple[str, ...] = TOOL_KINDS,
        concurrency: int | Mapping[str, int] | None = None,
        name: str | None = None,
        result_batch_max: int = RESULT_BATCH_MAX,
        result_batch_window: float = RESULT_BATCH_WINDOW,
    ) -> None:
        """`concurrency`: commands in flight per kind, one number for every kind or a
        mapping by kind (kinds it leaves out get `KIND_CONCURRENCY`/`DEFAULT_CONCURRENCY`).
        `result_batch_max`/`result_batch_window`: how loop iteration results are gathered
        into one message (1 sends each alone)."""
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.layout = layout
        self.kinds = kinds
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.limits = limits_from_env()  # bounds the sinks' templates of commands that carry none
        self._off_loop = OffLoop(threads=2, name="sink-render")  # long sink renders
        self._kinds = {kind: _Kind(kind, max(1, concurrency_of(kind, concurrency))) for kind in kinds}
        self._loops: list[asyncio.Task[None]] = []
        self._running: dict[str, dict[str, asyncio.Event]] = {}  # execution -> command -> cancel
        self._cancelled: OrderedDict[str, None] = OrderedDict()  # "<execution>[.<command>]", oldest first
        self._held: dict[str, Msg] = {}  # ack subject -> command not acked yet (kept alive)
        self._inflight: set[asyncio.Task[None]] = set()
        self._cancel_sub: Subscription | None = None
        self._stopping = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._beat: asyncio.Task[None] | None = None
        self._batch_max = max(1, result_batch_max)
        self._batch_window = max(0.0, result_batch_window)
        self._gathering: dict[str, _Gather] = {}  # loop result subject + step -> results waiting to go out
        self._sending: set[asyncio.Task[None]] = set()  # batches waiting for their PubAck
        self._active = 0  # commands taken and not yet answered or handed to a batch
        self._unfinished: dict[str, int] = {}  # gather key -> that loop's commands still running here

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
        deadline = asyncio.get_running_loop().time() + drain_timeout
        if self._inflight:
            await asyncio.wait(self._inflight, timeout=drain_timeout)
        for t in list(self._inflight):
            t.cancel()
        await asyncio.gather(*self._inflight, return_exceptions=True)
        for g in list(self._gathering.values()):
            self._flush(g)
        if self._sending:  # results handed to batches: stored and their commands acked, or left unacked
            await asyncio.wait(self._sending, timeout=max(0.1, deadline - asyncio.get_running_loop().time()))
        for t in list(self._sending):
            t.cancel()
        await asyncio.gather(*self._sending, return_exceptions=True)
        if self._beat is not None:
            self._beat.cancel()
            await asyncio.gather(self._beat, return_exceptions=True)
        if self._cancel_sub is not None:
            await self._cancel_sub.unsubscribe()
        await close_default_pool()
        await close_http()
        self._off_loop.close()  # a sink render still running ends at once

    async def _on_cancel(self, msg: Msg) -> None:
        """`cancel.<execution>` stops all of an execution's commands running here,
        `cancel.<execution>.<command>` one of them."""
        _, _, rest = msg.subject.partition(".")
        eid, _, command_id = rest.partition(".")
        self._cancelled[f"{eid}.{command_id}" if command_id else eid] = None
        if len(self._cancelled) > CANCELS_REMEMBERED:
            self._cancelled.popitem(last=False)
        running = self._running.get(eid, {})
        for cid, ev in running.items():
            if not command_id or cid == command_id:
                ev.set()

    def _was_cancelled(self, cmd: Command) -> bool:
        """A cancel for this command (or its execution) came before the command did:
        cancelled commands stay queued (see actors/outbox.py `Outbox.stop`)."""
        return cmd.execution_id in self._cancelled or f"{cmd.execution_id}.{cmd.command_id}" in self._cancelled

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
                await send(self.nc, subject, msgspec.json.encode(request), reply=inbox)
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
        self._active += 1
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
            await self._command(msg)
        finally:
            self._active -= 1
            if not self._active and self._gathering:
                for g in list(self._gathering.values()):  # nothing running here could join them
                    self._flush(g)

    async def _command(self, msg: Msg) -> None:
        try:
            cmd = command_decoder.decode(msg.data)
        except msgspec.DecodeError as e:
            await dead_letter(self.js, source="tools", reason=f"undecodable command: {e}", msg=msg)
            await msg.term()
            return
        delivered = num_delivered(msg)
        if delivered >= self.layout.max_deliver:
            reason = f"delivered {delivered} times without a result; giving up"
            await dead_letter(self.js, source="tools", reason=reason, msg=msg, execution_id=cmd.execution_id)
            await answer_undeliverable(self.js, cmd, reason, worker=self.name)
            await msg.term()
            return
        if cmd.body_ref is not None:  # too large for a message: the whole command is a blob
            try:
                cmd = await resolve_command(self.js, cmd)
            except BLOB_MISSING:
                missing = ErrorInfo(type="ValueMissing", message=f"step '{cmd.step}': command blob {cmd.body_ref} "
                                                                 "not found (expired or removed)")
                await self._reply(cmd, None, missing, time.time(), time.time())
                await ack(msg)
                return
        # a loop iteration's result may go out with others of its loop (see `_gather`)
        subject = result_batch_subject(cmd.reply_to) if cmd.iteration_index is not None and cmd.chunk is None \
            and self._batch_max > 1 else None
        key = f"{subject} {cmd.step}" if subject is not None else ""
        if key:
            self._unfinished[key] = self._unfinished.get(key, 0) + 1
        cancel = CancelSignal()
        if self._cancelled and self._was_cancelled(cmd):
            cancel.set()  # answered `Cancelled` without running
        running = self._running.get(cmd.execution_id)
        if running is None:
            running = self._running[cmd.execution_id] = {}
        running[cmd.command_id] = cancel
        held = msg.reply
        self._held[held] = msg
        handed_over = False
        commands_in_flight(cmd.kind, 1)
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
                commands_in_flight(cmd.kind, -1)
                running.pop(cmd.command_id, None)
                if not running and self._running.get(cmd.execution_id) is running:
                    del self._running[cmd.execution_id]
                if key:
                    left = self._unfinished[key] - 1
                    if left:
                        self._unfinished[key] = left
                    else:
                        del self._unfinished[key]
            if cmd.chunk is not None:
                failed = next((o.error for o in outcomes if o.error is not None), None)
            else:
                failed = error
            observe_step(cmd.kind, step_outcome(failed.type if failed else None), time.time() - started)
            # the result is stored (PubAck) before the command is acked: a command that
            # was ever acked has its result in the log, which replay relies on
            if cmd.chunk is not None:
                await self._reply_chunk(cmd, outcomes)
            elif subject is not None and self._gather(subject, key, cmd, msg, result, error, started, time.time()):
                handed_over = True  # acked once its batch is stored (still kept alive until then)
                return
            else:
                await self._reply(cmd, result, error, started, time.time())
        finally:
            if not handed_over:
                del self._held[held]
        await ack(msg)

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

        def render() -> tuple[dict[str, Any], Any]:
            with template_limits(sink.limits or self.limits):
                tool = {k: (v if k in UNRENDERED_TOOL_FIELDS else render_value(v, scope, where=f"sink.tool.{k}"))
                        for k, v in sink.tool.items()}
                return tool, render_value(sink.args, scope, where="sink.args")

        try:
            try:
                tool, args = self._off_loop.inline(render)
            except SliceExhausted:  # a long render: off the loop, so other commands go on meanwhile
                tool, args = await self._off_loop.off_loop(render)
        except TemplateError as e:
            return ErrorInfo(type=e.kind, message=f"step '{cmd.step}' field {e}")
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
        # iterations whose results are too large together go as blobs, up to the cap
        payload = await chunk_message(self.js, done, limit=self.layout.max_msg_size - RESULT_HEADROOM)
        await self._publish_result(cmd, payload)

    async def _reply(self, cmd: Command, result: Any, error: ErrorInfo | None, started: float, ended: float) -> None:
        common = dict(execution_id=cmd.execution_id, command_id=cmd.command_id, step=cmd.step,
                      attempt_number=cmd.attempt_number, started_at=started, ended_at=ended, worker=self.name,
                      iteration_index=cmd.iteration_index)
        limit = self.layout.max_msg_size - RESULT_HEADROOM
        # a result too large for a message goes as a blob, up to the cap (actors/blobs.py)
        payload = await result_message(
            self.js, CallError(error=error, **common) if error else CallDone(result=result, **common),  # type: ignore[arg-type]
            limit=limit)
        if len(payload) > limit:  # an error report (message, traceback) too large: never truncated silently
            error = ErrorInfo(
                type="ResultTooLarge",
                message=f"step '{cmd.step}': its answer is {len(payload)} bytes, over the {limit}-byte message limit",
            )
            payload = encode(CallError(error=error, **common))  # type: ignore[arg-type]
        await self._publish_result(cmd, payload)

    async def _publish_result(self, cmd: Command, payload: bytes) -> None:
        """Wait for the PubAck (pipelined with every other command's result). A result
        refused while the log's stream elects a leader is sent again, not dropped:
        dropping it would leave the command unacked, to run again after ack_wait and
        count towards max_deliver."""
        await publisher(self.nc).send([(cmd.reply_to, payload, {MSG_ID: f"{cmd.execution_id}:res:{cmd.command_id}"})],
                                     readers_deduplicate=True)

    # --- loop results, gathered ---------------------------------------------------------
    # An iteration's result waits (a few milliseconds at most) for others of the same
    # loop, then goes out with them in one `result.batch` on `loop.<p>.<id>.<loop>.in.res.batch`:
    # one publish, one stored message and one ack for the counter instead of one each.
    # Its message id is derived from the batch's command ids (sorted), so a publish
    # retried as is is a duplicate; a command redelivered and answered again, alone or in
    # another batch, finds its iteration counted already. Each command is acked once the
    # batch is stored. A batch of one goes out as the plain `call.done`/`call.error`.

    def _gather(self, subject: str, key: str, cmd: Command, msg: Msg, result: Any, error: ErrorInfo | None,
                started: float, ended: float) -> bool:
        """Hand the result of loop iteration `cmd` to the batch of its loop (`key`); False
        when it is to be answered alone (too large)."""
        entry = IterationResult(command_id=cmd.command_id, attempt_number=cmd.attempt_number,
                                iteration_index=cmd.iteration_index, result=result, error=error,
                                started_at=started, ended_at=ended)
        part = encode(entry)
        limit = self.layout.max_msg_size - RESULT_HEADROOM
        if len(part) > limit:
            return False  # answered alone, its result as a blob
        g = self._gathering.get(key)
        if g is not None and g.size + len(part) + 1 > limit:
            self._flush(g)
            g = None
        loop = self._loop
        assert loop is not None
        if g is None:
            g = self._gathering[key] = _Gather(key, subject)
            g.timer = loop.call_later(self._batch_window, self._flush, g)
        g.items.append((cmd, entry, msg))
        g.parts.append(msgspec.Raw(part))
        g.size += len(part) + 1
        if len(g.items) >= self._batch_max:
            self._flush(g)
        elif len(g.items) >= self._unfinished.get(key, 0) and not g.check:
            # as many done as still running for this loop: unless more end in this same
            # turn of the event loop, waiting longer would starve a loop with few
            # iterations in flight
            g.check = True
            loop.call_soon(self._check, g)
        return True

    def _check(self, g: _Gather) -> None:
        g.check = False
        if not g.sent and len(g.items) >= self._unfinished.get(g.key, 0):
            self._flush(g)

    def _flush(self, g: _Gather) -> None:
        """Send `g` now (a task: its PubAck, then the acks of its commands)."""
        if self._gathering.get(g.key) is g:
            del self._gathering[g.key]
        if g.timer is not None:
            g.timer.cancel()
            g.timer = None
        if not g.items or g.sent:
            return
        g.sent = True
        loop = self._loop
        assert loop is not None
        task = loop.create_task(self._send_gathered(g))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send_gathered(self, g: _Gather) -> None:
        try:
            if len(g.items) == 1:
                cmd, e, _ = g.items[0]
                await self._reply(cmd, e.result, e.error, e.started_at, e.ended_at)
            else:
                first = g.items[0][0]
                eid = first.execution_id
                loop_id = loop_key(g.subject)[1]
                ids = sorted(cmd.command_id for cmd, _, _ in g.items)
                digest = hashlib.blake2b("\n".join(ids).encode(), digest_size=16).hexdigest()
                payload = encode(ResultBatchOut(execution_id=eid, loop_id=loop_id, step=first.step, results=g.parts,
                                                worker=self.name))
                # re-sent through an election (same message id), like a single result
                await publisher(self.nc).send([(g.subject, payload, {MSG_ID: f"{eid}:res:{loop_id}:{digest}"})],
                                              readers_deduplicate=True)
        except Exception as e:
            # unacked: the commands come back after ack_wait (here or on another pod)
            log.warning("publishing %d loop results on %s failed: %r", len(g.items), g.subject, e)
            for _, _, msg in g.items:
                self._held.pop(msg.reply, None)
            return
        for _, _, msg in g.items:
            self._held.pop(msg.reply, None)
            try:
                await ack(msg)
            except Exception as e:  # a closed connection: the command comes back, is answered again, ignored
                log.debug("ack of %s: %s", msg.reply, e)

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
