"""Running one command: decode it (or dead-letter it), read its blob back, run the tool and
its sink, answer (`call.done`/`call.error`, a chunk's `chunk.done`, or a loop iteration's
entry in a batch) and ack it once the answer is stored.

A command that cannot be decoded, or that has been delivered `max_deliver` times (its
tool keeps killing the pod), is dead-lettered and, where it names an execution, answered
with a `call.error`, so the execution sees the failure instead of waiting forever. A
tool's result is JSON text encoded once (by its executor) and goes into the answer as it
is (`msgspec.Raw`); a sink gets it decoded.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from actors.natsio import MSG_ID, ack, dead_letter, is_answered, log_time, num_delivered, publisher
from actors.natsio.binding import codec_of
from actors.natsio.metadata import stream_and_consumer
from actors.natsio.requests import requester
from actors.playbook.model import UNRENDERED_TOOL_FIELDS
from actors.playbook.templates import RenderFault, SliceExhausted, TemplateError, render_value, template_limits
from actors.runtime import tracing
from actors.runtime.metrics import commands_in_flight, observe_step, step_outcome
from actors.runtime.render_process import OffLoop
from actors.store.blobs import BLOB_MISSING, HEADROOM, chunk_message, resolve_command, result_message
from actors.tools import chunksinks
from actors.tools.batching import ResultBatcher
from actors.tools.call import CommandIdentity
from actors.tools.cancels import Cancels
from actors.tools.capture import OutputBox
from actors.tools.executors import run_tool
from actors.tools.failures import ToolFailure
from actors.tools.held import HeldCommands, hold_bound
from actors.tools.outputs import live_output, publish_output
from actors.tools.redact import REDACTOR
from actors.tools.resources import ToolResources
from actors.tools.undeliverable import answer_undeliverable
from actors.wire.codec import PayloadUnreadable
from actors.wire.events import embedded_command
from actors.wire.jsonvalues import loads
from actors.wire.messages import (
    CallDone,
    CallError,
    ChunkDone,
    ChunkItem,
    Command,
    ErrorInfo,
    IterationOutcome,
    Limits,
    SinkCall,
    answer_subject,
    command_decoder,
)
from streams.ids import result_id
from streams.layout import Layout, execution_of, result_batch_subject

__all__ = ["RESULT_HEADROOM", "CommandRunner"]

log = logging.getLogger("actors.tools")

RESULT_HEADROOM = HEADROOM  # room for the envelope around a result
# seconds a tool waits for the engine to store its result with the next decision
# (semantics 5) before it publishes the result itself
ANSWER_ASK_TIMEOUT = 2.0
LIVE_KINDS = frozenset({"python", "shell"})  # the kinds whose printed output is published while they run
# the delivery count of the command the current task runs (`CommandRunner.command`)
DELIVERY: contextvars.ContextVar[int] = contextvars.ContextVar("actors_tools_delivery", default=0)


class CommandRunner:
    """Runs the commands one tool actor takes (see the module docstring)."""

    def __init__(
        self,
        nc: NATS,
        js: JetStreamContext,
        *,
        layout: Layout,
        name: str,
        limits: Limits,
        off_loop: OffLoop,
        resources: ToolResources,
        cancels: Cancels,
        held: HeldCommands,
        batch_max: int,
        batch_window: float,
        slots: dict[str, asyncio.Semaphore] | None = None,
    ) -> None:
        """`limits` bound the sinks' templates of commands that carry none; `off_loop`
        renders long sinks; `held`: commands kept alive until acked; `batch_max`,
        `batch_window`: how loop results are gathered (`ResultBatcher`)."""
        self.nc = nc
        self.js = js
        self.layout = layout
        self.name = name
        self.limits = limits
        self.off_loop = off_loop
        self.resources = resources
        self.cancels = cancels
        self.held = held
        # per kind, the commands that may run at once (its pulls may fetch more: CMD's and
        # EXEC's each ask for free slots, actors/tools/pull.py)
        self.slots: dict[str, asyncio.Semaphore] = dict(slots or {})
        # when each consumer on EXEC was made (epoch seconds; ToolActor.start): a record
        # stored before that is delivered again by a consumer made again
        self.consumers_made: dict[tuple[str, str], float] = {}  # (stream, consumer)
        self.batcher = ResultBatcher(
            nc,
            limit=layout.max_msg_size - RESULT_HEADROOM,
            batch_max=batch_max,
            window=batch_window,
            worker=name,
            answer_alone=self.reply,
            held=held,
        )

    async def _answered_already(self, msg: Msg, cmd: Command, delivered: int) -> bool:
        """A command delivered again (its pod died after storing the answer, before the
        ack), or held by a decision record stored before its consumer was made (a
        consumer deleted and made again delivers the log's old commands again), whose
        answer the execution's log holds: acked without running it twice. Asked only
        then, so a fresh command, or a backlog's, costs no lookup. Its answer may be on
        its own subject (`reply_to`: a tool pod older than semantics 4 answered it) or on
        the execution's shared one (`answer_on`), where only a result naming this
        command counts: any other is another step's."""
        if not cmd.reply_to.startswith("exec.") or cmd.iteration_index is not None:
            return False  # a loop iteration's answer may be in a batch: not one subject to ask
        if delivered <= 1:  # read from the ack subject: this runs for every command
            made = self.consumers_made.get(stream_and_consumer(msg), 0.0)
            if log_time(msg) >= made:
                return False
        try:
            # a command held by a decision record in the log: its answer can only follow it
            after = msg.metadata.sequence.stream if msg.subject.startswith("exec.") else 0
            return await is_answered(self.nc, self.layout.exec_stream_holding(cmd.reply_to), cmd, after=after)
        except Exception as e:  # NATS unreachable, a node down: run it, as a redelivery always was
            log.info("command %s: whether it is answered is not known (%s); running it", cmd.command_id, e)
            return False

    async def command(self, msg: Msg) -> None:
        data = msg.data
        if msg.subject.startswith("exec."):  # a decision record holding its command (semantics 2)
            try:
                held = embedded_command(data)
            except msgspec.DecodeError as e:
                held, why = None, f"undecodable decision record: {e}"
            else:
                why = "a decision record on a command subject holds no command"
            if held is None:
                await dead_letter(self.js, source="tools", reason=why, msg=msg, execution_id=execution_of(msg.subject))
                await msg.term()  # the record stays in the log; only its delivery to tools ends
                return
            data = held
        try:
            cmd = codec_of(self.js).decode(command_decoder, data)  # args, tool, element decrypted
        except PayloadUnreadable as e:  # encrypted with a key this pod lacks: the step fails saying so
            cmd = command_decoder.decode(data)
            unreadable = ErrorInfo(type="PayloadUnreadable", message=f"step '{cmd.step}': {e}")
            await self.reply(cmd, None, unreadable, time.time(), time.time())
            await ack(msg)
            return
        except msgspec.DecodeError as e:
            await dead_letter(self.js, source="tools", reason=f"undecodable command: {e}", msg=msg)
            await msg.term()
            return
        delivered = num_delivered(msg)
        DELIVERY.set(delivered)  # for the output its run publishes (`_tool`): this task's alone
        if await self._answered_already(msg, cmd, delivered):
            await ack(msg)
            return
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
                missing = ErrorInfo(
                    type="ValueMissing",
                    message=f"step '{cmd.step}': command blob {cmd.body_ref} not found (expired or removed)",
                )
                await self.reply(cmd, None, missing, time.time(), time.time())
                await ack(msg)
                return
            except PayloadUnreadable as e:
                # the blob is sealed with a key this pod lacks: as for an inline command, the
                # step fails saying so (a redelivery would meet the same key and end dead-lettered)
                unreadable = ErrorInfo(type="PayloadUnreadable", message=f"step '{cmd.step}': {e}")
                await self.reply(cmd, None, unreadable, time.time(), time.time())
                await ack(msg)
                return
        # a loop iteration's result may go out with others of its loop (see actors/tools/batching.py)
        subject = (
            result_batch_subject(cmd.reply_to)
            if cmd.iteration_index is not None and cmd.chunk is None and self.batcher.batch_max > 1
            else None
        )
        key = f"{subject} {cmd.step}" if subject is not None else ""
        if key:
            self.batcher.started(key)
        cancel = self.cancels.begin(cmd)
        self.held.hold(msg, cmd)  # kept alive from now, while it waits for a slot too
        slot = self.slots.get(cmd.kind)
        if slot is not None and not await self._slot_taken(slot, msg, cmd, key):
            return  # let go while it waited: the server hands it to another pod
        handed_over = False
        since = asyncio.get_running_loop().time()  # its hold's bound counts from here (held.py)
        commands_in_flight(cmd.kind, 1)
        # its spans (docs/tracing.md), current while it runs: none when tracing is off
        call = tracing.tool_call(cmd, msg.headers, msg.metadata.timestamp, delivered) if tracing.enabled() else None
        try:
            started = time.time()
            try:
                if cmd.chunk is not None:
                    outcomes = await self._run_chunk(cmd, cmd.chunk, cancel, since)
                else:
                    result, error = await self._run(cmd, cmd.args, cmd.element, cmd.iteration_index, cancel)
            finally:
                if slot is not None:
                    slot.release()  # the tool is done: the reply is not the kind's work
                commands_in_flight(cmd.kind, -1)
                self.cancels.end(cmd)
                if key:
                    self.batcher.finished(key)
            if cmd.chunk is not None:
                failed = next((o.error for o in outcomes if o.error is not None), None)
            else:
                failed = error
            observe_step(cmd.kind, step_outcome(failed.type if failed else None), time.time() - started)
            if call is not None:
                # the type alone (a message may hold values), and not even that when types are sealed
                sealed = codec_of(self.js).encrypts
                call.outcome(tracing.span_error_type(failed.type, sealed=sealed) if failed else None)
            # the result is stored (PubAck) before the command is acked: a command that
            # was ever acked has its result in the log, which replay relies on
            if cmd.chunk is not None:
                await self._reply_chunk(cmd, outcomes)
            elif subject is not None and self.batcher.gather(
                subject, key, cmd, msg, result, error, started, time.time()
            ):
                handed_over = True  # acked once its batch is stored (still kept alive until then)
                return
            else:
                await self.reply(cmd, result, error, started, time.time())
        finally:
            if call is not None:
                call.end()
            if not handed_over:
                self.held.release(msg.reply)
        await ack(msg)

    async def _slot_taken(self, slot: asyncio.Semaphore, msg: Msg, cmd: Command, key: str) -> bool:
        """Wait for one of the kind's slots (`ACTORS_TOOL_CONCURRENCY` caps what runs at
        once, whichever stream the command came from). False when the command was let
        go meanwhile (held past its bound, actors/tools/held.py): it is not run here."""
        try:
            await slot.acquire()
        except BaseException:
            self._abandon(msg, cmd, key)
            raise
        if not self.held.holds(msg.reply):
            slot.release()
            self._abandon(msg, cmd, key)
            return False
        self.held.hold(msg, cmd)  # its bound counts from its start
        return True

    def _abandon(self, msg: Msg, cmd: Command, key: str) -> None:
        self.held.release(msg.reply)
        self.cancels.end(cmd)
        if key:
            self.batcher.finished(key)

    async def _run(
        self, cmd: Command, args: dict[str, Any], element: Any, index: int | None, cancel: asyncio.Event
    ) -> tuple[msgspec.Raw | None, ErrorInfo | None]:
        """The tool, then its sink (same command: a failed sink fails the attempt)."""
        ran = await self._tool(cmd, args, index, cancel)
        if isinstance(ran, ErrorInfo):
            return None, ran
        if cmd.sink is not None:
            error = await self._sink(cmd, cmd.sink, loads(ran), element, index, cancel)
            if error is not None:
                return None, _masked(error)
        return msgspec.Raw(ran), None

    async def _run_chunk(
        self, cmd: Command, chunk: list[ChunkItem], cancel: asyncio.Event, since: float
    ) -> list[IterationOutcome]:
        """A chunk's items, each its tool then its sink, all-or-nothing per item. Postgres
        appends to one table: the items' sinks held as their tools run, and written together
        (actors/tools/chunksinks.py) when they hold about `chunksinks.GROUP_ROWS` rows and at
        the end, then let go; `since` (the loop's clock): when the command started."""
        sink = cmd.sink
        if sink is None or not chunksinks.may_combine(sink.tool):
            outcomes = []
            for item in chunk:
                t0 = time.time()
                result, error = await self._run(cmd, item.args, item.element, item.iteration_index, cancel)
                outcomes.append(_outcome(item, t0, result, error))
            return outcomes
        each, deadline = cmd.timeout, since + hold_bound(cmd)

        def keep(untooled: int, unwritten: int) -> float:
            """What the command's bound (held.py: `each` per item's tool and per item's
            sink) keeps for what is still to run: tools not yet run and sinks not written."""
            return 0.0 if each is None else each * (2 * untooled + unwritten)

        staged: list[_Staged] = []
        pending: dict[Any, list[_Staged]] = {}  # the appends not written yet, by group
        held = 0  # ... their rows, at most about chunksinks.GROUP_ROWS (memory)

        async def flush(untooled: int, others: int) -> None:
            """The pending appends written, a group at a time; `others`: items rendered
            and not among them (their sinks are still to write)."""
            nonlocal held
            groups = list(pending.values())
            pending.clear()
            held = 0
            waiting = sum(len(g) for g in groups)
            for members in groups:
                waiting -= len(members)
                writes = []
                for s in members:
                    assert s.sink is not None
                    identity = CommandIdentity(cmd.execution_id, cmd.command_id, s.item.iteration_index, "sink")
                    writes.append(chunksinks.SinkWrite(s.sink[0], s.sink[1], identity, s.value))
                done = await chunksinks.write_together(
                    writes,
                    resources=self.resources,
                    cancel=cancel,
                    each=each,
                    deadline=deadline,
                    keep=keep(untooled, others + waiting),
                )
                del writes
                ended = time.time()
                for s, out in zip(members, done, strict=True):
                    if isinstance(out, ToolFailure):
                        s.error = _masked(_sink_failed(cmd, "postgres", out))
                    s.ended, s.value, s.sink = ended, None, None  # written: its rows let go

        for n, item in enumerate(chunk):
            s = _Staged(item, time.time())
            staged.append(s)
            ran = await self._tool(cmd, item.args, item.iteration_index, cancel)
            if isinstance(ran, ErrorInfo):
                s.error, s.ended = ran, time.time()
                continue
            s.raw, value = ran, loads(ran)
            rendered = await self._render_sink(cmd, sink, value, item.element, item.iteration_index)
            if isinstance(rendered, ErrorInfo):
                s.error, s.ended = _masked(rendered), time.time()
                continue
            untooled = len(chunk) - n - 1
            key = chunksinks.group_key(rendered[0])
            if key is None:  # alone: as a chunk item is written without chunksinks
                timeout = chunksinks.alone_timeout(each, deadline, keep(untooled, sum(map(len, pending.values()))))
                error = await self._run_sink(cmd, *rendered, value, item.iteration_index, cancel, timeout=timeout)
                if error is not None:
                    s.error = _masked(error)
                s.ended = time.time()
                continue
            rows = chunksinks.rows_in(rendered[1], value)
            if pending and held + rows > chunksinks.GROUP_ROWS:
                await flush(untooled, 1)  # this item's after them
            s.value, s.sink = value, rendered
            pending.setdefault(key, []).append(s)
            held += rows
            if held >= chunksinks.GROUP_ROWS:  # (an item of that many rows alone: written alone, as before)
                await flush(untooled, 0)
        await flush(0, 0)
        return [
            _outcome(
                s.item,
                s.started,
                None if s.error is not None or s.raw is None else msgspec.Raw(s.raw),
                s.error,
                s.ended,
            )
            for s in staged
        ]

    async def _tool(
        self, cmd: Command, args: dict[str, Any], index: int | None, cancel: asyncio.Event
    ) -> bytes | ErrorInfo:
        """The command's tool: its result's JSON text, or why it failed."""
        if cancel.is_set():
            return ErrorInfo(type="Cancelled", message=f"step '{cmd.step}': cancelled")
        cap, delivery = self.layout.step_output_max_bytes, DELIVERY.get()
        # what it prints, published while it runs (the kinds that print: actors/tools/capture.py)
        live = live_output(self.nc, cmd, index, delivery, cap) if cmd.kind in LIVE_KINDS else None
        output = OutputBox(cap, live)
        try:
            result = await run_tool(
                cmd.kind,
                {"kind": cmd.kind, **cmd.tool},
                args,
                timeout=cmd.timeout,
                cancel=cancel,
                resources=self.resources,
                output=output,
                identity=CommandIdentity(cmd.execution_id, cmd.command_id, index, "tool"),
                code_at=cmd.code_at,
            )
        except ToolFailure as f:
            await publish_output(self.nc, self.js, cmd, index, output.captured, live=live, delivery=delivery)
            return ErrorInfo(**f.to_error())
        except BaseException:
            if live is not None:
                live.close()  # cancelled: no part is sent any more
            raise
        # stored before the answer: a reader of the log sees the output before the step ends
        await publish_output(self.nc, self.js, cmd, index, output.captured, live=live, delivery=delivery)
        return result

    async def _sink(
        self, cmd: Command, sink: SinkCall, result: Any, element: Any, index: int | None, cancel: asyncio.Event
    ) -> ErrorInfo | None:
        rendered = await self._render_sink(cmd, sink, result, element, index)
        if isinstance(rendered, ErrorInfo):
            return rendered
        return await self._run_sink(cmd, *rendered, result, index, cancel, timeout=cmd.timeout)

    async def _render_sink(
        self, cmd: Command, sink: SinkCall, result: Any, element: Any, index: int | None
    ) -> tuple[dict[str, Any], Any] | ErrorInfo:
        """The sink's tool and args rendered with the attempt's result (and element)."""
        scope = {**sink.scope, "result": result, "response": result, "error": None, "attempt": cmd.attempt_number}
        if sink.element is not None:
            scope[sink.element] = element
            scope["iteration"] = {"index": index}

        def render() -> tuple[dict[str, Any], Any]:
            with template_limits(sink.limits or self.limits):
                tool = {
                    k: (v if k in UNRENDERED_TOOL_FIELDS else render_value(v, scope, where=f"sink.tool.{k}"))
                    for k, v in sink.tool.items()
                }
                return tool, render_value(sink.args, scope, where="sink.args")

        try:
            try:
                return self.off_loop.inline(render)
            except SliceExhausted:  # not cheap by construction: in a render process, off the loop
                return await self.off_loop.off_loop(render)
        except TemplateError as e:
            return ErrorInfo(type=e.kind, message=f"step '{cmd.step}' field {e}")
        except RenderFault as fault:  # the render process's limits: the attempt's outcome records it
            fault.step = fault.step or cmd.step
            return ErrorInfo(type="TemplateLimit", message=fault.describe())

    async def _run_sink(
        self,
        cmd: Command,
        tool: dict[str, Any],
        args: Any,
        result: Any,
        index: int | None,
        cancel: asyncio.Event,
        *,
        timeout: float | None,
    ) -> ErrorInfo | None:
        """The rendered sink run alone, within `timeout`: None, or why it failed."""
        kind = str(tool.get("kind"))
        try:
            # its identity: a postgres sink's ledger key; `result`: what a table write takes as rows by default
            identity = CommandIdentity(cmd.execution_id, cmd.command_id, index, "sink")
            await run_tool(
                kind,
                tool,
                args,
                timeout=timeout,
                cancel=cancel,
                resources=self.resources,
                identity=identity,
                result=result,
            )
        except ToolFailure as f:
            return _sink_failed(cmd, kind, f)
        return None

    async def _reply_chunk(self, cmd: Command, outcomes: list[IterationOutcome]) -> None:
        done = ChunkDone(
            execution_id=cmd.execution_id,
            command_id=cmd.command_id,
            step=cmd.step,
            attempt_number=cmd.attempt_number,
            outcomes=outcomes,
            worker=self.name,
        )
        # iterations whose results are too large together go as blobs, up to the cap
        payload = await chunk_message(
            self.js, done, limit=self.layout.max_msg_size - RESULT_HEADROOM, cap=self.layout.max_value_bytes
        )
        await self._publish_result(cmd, payload)

    async def reply(self, cmd: Command, result: Any, error: ErrorInfo | None, started: float, ended: float) -> None:
        """Answer `cmd` alone: its `call.done` or `call.error`."""
        limit = self.layout.max_msg_size - RESULT_HEADROOM
        # a result too large for a message goes as a blob, up to the cap (actors/store/blobs.py)
        answer = self._answer(cmd, started, ended, result=result, error=error)
        payload = await result_message(self.js, answer, limit=limit, cap=self.layout.max_value_bytes)
        if len(payload) > limit:  # an error report (message, traceback) too large: never truncated silently
            error = ErrorInfo(
                type="ResultTooLarge",
                message=f"step '{cmd.step}': its answer is {len(payload)} bytes, over the {limit}-byte message limit",
            )
            payload = codec_of(self.js).encode(self._answer(cmd, started, ended, result=None, error=error))
        if await self._ask(cmd, payload):
            return
        await self._publish_result(cmd, payload)

    async def _ask(self, cmd: Command, payload: bytes) -> bool:
        """Semantics 5: ask the execution's engine pod to store the result with the
        decision it leads to, as one message (`Command.ask_on`; docs/architecture.md
        "The next layout", item 2). True once it says `stored`; anything else (a
        refusal, no responder, a timeout, an error) and the result is published as
        before. Not for a loop iteration, nor a result that travelled as a blob."""
        if not cmd.ask_on or cmd.iteration_index is not None or b'"result_ref"' in payload:
            return False
        try:
            # the connection's requester: answered without the server when this pod's
            # own engine serves the partition (actors/natsio/requests.py)
            reply = await requester(self.nc).request(
                cmd.ask_on,
                payload,
                timeout=ANSWER_ASK_TIMEOUT,
                headers={MSG_ID: result_id(cmd.execution_id, cmd.command_id)},
            )
        except Exception as e:  # no responders, a timeout, the connection away
            log.debug("command %s: asking to store its result: %r; publishing it", cmd.command_id, e)
            return False
        return reply == b"stored"

    def _answer(
        self, cmd: Command, started: float, ended: float, *, result: Any, error: ErrorInfo | None
    ) -> CallDone | CallError:
        """`cmd`'s `call.error` (with `error`), else its `call.done` (with `result`)."""
        done = CallDone(
            execution_id=cmd.execution_id,
            command_id=cmd.command_id,
            step=cmd.step,
            attempt_number=cmd.attempt_number,
            started_at=started,
            ended_at=ended,
            worker=self.name,
            iteration_index=cmd.iteration_index,
            result=result if error is None else None,
        )
        return done if error is None else done.failed(error)

    async def _publish_result(self, cmd: Command, payload: bytes) -> None:
        """Wait for the PubAck (pipelined with every other command's result). A result
        refused while the log's stream elects a leader is sent again, not dropped:
        dropping it would leave the command unacked, to run again after ack_wait and
        count towards max_deliver."""
        await publisher(self.nc).send(
            [(answer_subject(cmd), payload, {MSG_ID: result_id(cmd.execution_id, cmd.command_id)})],
            readers_deduplicate=True,
        )


class _Staged:
    """A chunk item between its tool and its sink (`CommandRunner._run_chunk`)."""

    __slots__ = ("ended", "error", "item", "raw", "sink", "started", "value")

    def __init__(self, item: ChunkItem, started: float) -> None:
        self.item = item
        self.started = started
        self.ended: float | None = None  # None: when the outcome is made
        self.raw: bytes | None = None  # the tool's result, as JSON text
        self.value: Any = None  # ... decoded, for its sink until written
        self.sink: tuple[dict[str, Any], Any] | None = None  # the sink's tool and args, rendered
        self.error: ErrorInfo | None = None


def _outcome(
    item: ChunkItem, started: float, result: msgspec.Raw | None, error: ErrorInfo | None, ended: float | None = None
) -> IterationOutcome:
    return IterationOutcome(
        iteration_index=item.iteration_index,
        result=result,
        error=error,
        started_at=started,
        ended_at=time.time() if ended is None else ended,
    )


def _sink_failed(cmd: Command, kind: str, f: ToolFailure) -> ErrorInfo:
    info = ErrorInfo(**f.to_error())
    info.message = f"step '{cmd.step}' sink ({kind}) failed: {info.message}"
    return info


def _masked(error: ErrorInfo) -> ErrorInfo:
    """A sink's failure with each of its texts masked (actors/tools/redact.py), as
    `run_tool` masks a tool's: its message quotes what the sink's templates made."""
    return msgspec.structs.replace(
        error,
        type=REDACTOR.text(error.type),
        message=REDACTOR.text(error.message),
        traceback=REDACTOR.maybe(error.traceback),
    )
