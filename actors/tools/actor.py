"""Tool actors: competing consumers of `cmd.<kind>`, one pull consumer per kind.

A tool actor knows commands and results, nothing of the engine: it runs the command,
publishes `call.done` or `call.error` to the subject the command names (the
execution's input subject) with a deterministic message id, then acks. Long tools
keep their command alive with `in_progress`. A command that cannot be decoded, or
that has been delivered `max_deliver` times (its tool keeps killing the pod), is
dead-lettered and, where it names an execution, answered with a `call.error`, so
the execution sees the failure instead of waiting forever.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext

from actors.natsio import MSG_ID, dead_letter
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


class ToolActor:
    def __init__(
        self,
        nc: NATS,
        *,
        layout: Layout,
        kinds: tuple[str, ...] = TOOL_KINDS,
        concurrency: int = 64,
        name: str | None = None,
    ) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.layout = layout
        self.kinds = kinds
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self._concurrency = concurrency
        self._loops: list[asyncio.Task[None]] = []
        self._running: dict[str, dict[str, asyncio.Event]] = {}  # execution -> command -> cancel
        self._inflight: set[asyncio.Task[None]] = set()
        self._cancel_sub: Subscription | None = None
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        if "python" in self.kinds:
            await default_pool().start()  # warm workers now, not on the first step
        self._cancel_sub = await self.nc.subscribe("cancel.>", cb=self._on_cancel)
        for kind in self.kinds:
            psub = await self.js.pull_subscribe_bind(durable=tool_consumer(kind), stream=CMD_STREAM)
            self._loops.append(asyncio.create_task(self._pull(psub), name=f"tools:{kind}"))

    async def stop(self, *, drain_timeout: float = 5.0) -> None:
        """Stop pulling; give running commands `drain_timeout` to finish. What is still
        running then is left unacked and will be redelivered to another pod."""
        self._stopping.set()
        for t in self._loops:
            t.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        if self._inflight:
            await asyncio.wait(self._inflight, timeout=drain_timeout)
        for t in list(self._inflight):
            t.cancel()
        await asyncio.gather(*self._inflight, return_exceptions=True)
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

    async def _pull(self, psub: JetStreamContext.PullSubscription) -> None:
        """Fetch only as many commands as there are free slots for this kind: the rest
        stay in the stream for other pods (back-pressure, fair competing consumers)."""
        inflight: set[asyncio.Task[None]] = set()
        space = asyncio.Event()

        def done(task: asyncio.Task[None]) -> None:
            inflight.discard(task)
            self._inflight.discard(task)
            space.set()

        while not self._stopping.is_set():
            while len(inflight) >= self._concurrency:
                space.clear()
                await space.wait()
            try:
                msgs = await psub.fetch(self._concurrency - len(inflight), timeout=5)
            except (TimeoutError, NatsTimeoutError):
                continue
            for m in msgs:
                task = asyncio.create_task(self._handle(m))
                inflight.add(task)
                self._inflight.add(task)
                task.add_done_callback(done)

    async def _handle(self, msg: Msg) -> None:
        try:
            cmd = command_decoder.decode(msg.data)
        except msgspec.DecodeError as e:
            await dead_letter(self.js, source="tools", reason=f"undecodable command: {e}", msg=msg)
            await msg.term()
            return
        if msg.metadata.num_delivered >= self.layout.max_deliver:
            reason = f"command delivered {msg.metadata.num_delivered} times without a result; giving up"
            await dead_letter(self.js, source="tools", reason=reason, msg=msg, execution_id=cmd.execution_id)
            await self._reply(cmd, None, ErrorInfo(type="DeliveryExhausted", message=reason), 0.0, 0.0)
            await msg.term()
            return
        cancel = asyncio.Event()
        self._running.setdefault(cmd.execution_id, {})[cmd.command_id] = cancel
        beat = asyncio.create_task(self._keep_alive(msg))
        started = time.time()
        try:
            if cmd.chunk is not None:
                outcomes = []
                for item in cmd.chunk:
                    t0 = time.time()
                    result, error = await self._run(cmd, item.args, item.element, item.iteration_index, cancel)
                    outcomes.append(IterationOutcome(iteration_index=item.iteration_index, result=result, error=error,
                                                     started_at=t0, ended_at=time.time()))
            else:
                result, error = await self._run(cmd, cmd.args, cmd.element, cmd.iteration_index, cancel)
        finally:
            beat.cancel()
            running = self._running.get(cmd.execution_id, {})
            running.pop(cmd.command_id, None)
            if not running:
                self._running.pop(cmd.execution_id, None)
        if cmd.chunk is not None:
            await self._reply_chunk(cmd, outcomes)
        else:
            await self._reply(cmd, result, error, started, time.time())
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
        await self.js.publish(cmd.reply_to, payload, headers={MSG_ID: f"{cmd.execution_id}:res:{cmd.command_id}"})

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
        await self.js.publish(cmd.reply_to, payload, headers={MSG_ID: f"{cmd.execution_id}:res:{cmd.command_id}"})

    async def _keep_alive(self, msg: Msg) -> None:
        period = max(self.layout.ack_wait / 3, 0.5)
        while True:
            await asyncio.sleep(period)
            await msg.in_progress()
