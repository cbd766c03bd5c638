"""The trigger actor: every message on a trigger's subject starts an execution of its
playbook (docs/triggers.md; the spec: actors/wire/triggers.py).

Each trigger pod watches KV `triggers` and keeps one subscription per trigger that is
not paused: on a stream subject, to the push consumer `trigger-<name>` (created here,
not by `actors-cli trigger add`, whose user may make no consumer: from the spec's
creation time, so nothing stored since `add` is missed) in a queue group of the same
name, so every pod shares one consumer and the server keeps what arrives while none
runs; on a core subject, a queue subscription (at most once: a message sent while no
pod listens is gone). A spec `delete` marked `deleting` is removed here: its consumer
first, then its counts and the spec. A spec on the system's streams or subjects
(written by hand) is not run (actors/triggers/guard.py).

A message becomes a start message on stream START under an id derived from the
message (`trg-<name>-<add id>-<stream seq>`, or from its `Nats-Msg-Id`), published with that id
as its Nats-Msg-Id: a redelivery, or the same message read by a second pod, names
the same execution, which the stream drops as a duplicate within its window and the
starter (which writes a start record only on an empty subject) after it. A stream
message is acked only once its start is stored; a pod that dies before leaves it to
be delivered again.

The payload is rendered from the trigger's template over `message` as an execution's
templates are, under the pod's `Limits`: on the event loop only when the template is
cheap by construction, otherwise on a worker thread that hands it to a bounded render
process (actors/runtime/render_process.py). A message whose payload cannot be made
(a template error or limit, a body that is no JSON object, a payload too large or too
deep) starts nothing: it goes to the dead letters (`dlq.trigger.trg-<name>`, the
reason naming the trigger) and is acked; the trigger goes on with the next. A render
killed by the pod's bounds (deadline, memory: load, not the message, may be why) is
handed back with a delay (`RENDER_TRIES` deliveries) before it is dead-lettered.

A pod holds at most `MAX_ACK_PENDING` of a consumer's messages unacked (the consumer's
bound, near `IN_FLIGHT`): a backlog waits in the stream, not in a pod's queue past the
ack wait (where it would be delivered again).

Paused (or deleted), a trigger's subscription is dropped; a stream message in hand
then is handed back (nak) for when it is resumed. Each pod adds what it started and
dead-lettered to the trigger's counts (`<name>.stats`) every `STATS_EVERY` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import api
from nats.js.errors import (
    APIError,
    BadRequestError,
    BucketNotFoundError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NoKeysError,
    NotFoundError,
)
from nats.js.kv import KeyValue

from actors.natsio import MSG_ID, ack, log_time, num_delivered, publish_all, publisher, stream_seq
from actors.natsio.binding import codec_of
from actors.natsio.dispatch import subscribe_direct
from actors.playbook.templates import (
    RenderFault,
    RenderHalted,
    SliceExhausted,
    TemplateError,
    call_with_limits,
    render_value,
)
from actors.runtime.keyed_limiter import KeyedLimiter, stop_grace
from actors.runtime.render_process import OffLoop, RenderBounds
from actors.runtime.stopping import cancel_and_wait
from actors.runtime.supervision import POISON_TRIES, is_transient
from actors.triggers.guard import refusal
from actors.wire.messages import DeadLetter, Limits, StartMessage, encode
from actors.wire.nesting import MAX_DEPTH, json_within, value_within
from actors.wire.triggers import (
    DEAD_LETTER_SOURCE,
    TriggerSpec,
    TriggerStats,
    consumer_name,
    core_execution_id,
    dead_letter_token,
    deliver_subject,
    stats_key,
    stream_execution_id,
)
from streams.ids import dead_letter_id, start_id
from streams.layout import TRIGGERS_BUCKET, Layout
from streams.subjects import START_SUBJECT, dead_letter_subject

log = logging.getLogger("actors.trigger")
_spec_decoder = msgspec.json.Decoder(TriggerSpec)
_stats_decoder = msgspec.json.Decoder(TriggerStats)
_json = msgspec.json.Decoder()

IN_FLIGHT = 64  # messages handled at once by a pod (each: a render, a publish, an ack)
# a stream trigger's messages delivered and not acked, across its pods: near IN_FLIGHT, so
# what a pod queues is handled well within the ack wait (4096 here had 473 of 1,500 delivered twice)
MAX_ACK_PENDING = 2 * IN_FLIGHT
CORE_BACKLOG = 10_000  # core messages waiting for a slot; past it they are dropped (at most once)
CORE_BACKLOG_BYTES = 64 << 20  # and their bodies' bytes: 10,000 of 1 MB each is no bound
RENDER_TRIES = 3  # deliveries of a stream message whose render was killed, before its dead letter
RENDER_RETRY_DELAY = 5.0  # seconds before such a message is delivered again
WRONG_LAST_SEQUENCE = 10071  # JetStream's error code: the key was written since it was read
STATS_EVERY = 1.0  # seconds between two additions of a pod's counts to KV
RESCAN = 30.0  # seconds between two full reads of the specs, beside the watch
RENDER_THREADS = 2
MESSAGE_HEADROOM = 16 * 1024  # room around a payload in its start message (as the client's)


class Unusable(Exception):
    """A message whose payload cannot be made: it starts nothing and is dead-lettered."""


class RenderKilled(Unusable):
    """Its render was killed by the pod's bounds (deadline, memory): maybe the load's
    doing, so a stream message is tried again a few times before its dead letter."""


@dataclass
class _Running:
    spec: TriggerSpec
    sub: Subscription | None = None
    active: bool = True  # False once paused or deleted: what is in hand is handed back


@dataclass
class _Counts:
    started: int = 0
    duplicates: int = 0
    errors: int = 0
    last_start: float | None = None
    last_execution_id: str | None = None
    last_error: str | None = None
    last_error_at: float | None = None
    pending: bool = field(default=False)


class TriggerActor:
    role = "trigger"

    def __init__(
        self,
        nc: NATS,
        *,
        layout: Layout,
        limits: Limits | None = None,
        render_bounds: RenderBounds | None = None,
        in_flight: int = IN_FLIGHT,
    ) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.layout = layout
        self.limits = limits if limits is not None else Limits()
        self._off = OffLoop(threads=RENDER_THREADS, name="trigger-render", bounds=render_bounds)
        self._limiter = KeyedLimiter(limit=in_flight, what="trigger")
        self._running: dict[str, _Running] = {}
        self._counts: dict[str, _Counts] = {}
        self._kv: KeyValue | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._backlog = 0
        self._backlog_bytes = 0
        self._lock = asyncio.Lock()  # specs applied one at a time (watch and rescan)
        self._stopping = False

    # --- life -----------------------------------------------------------------------

    async def start(self) -> None:
        try:
            self._kv = await self.js.key_value(TRIGGERS_BUCKET)
        except BucketNotFoundError:
            # engine pods of an earlier version, which do not make it: looked for again by the watch
            log.warning("trigger: KV %s missing (an engine pod of this version creates it); waiting", TRIGGERS_BUCKET)
        else:
            await self._rescan()  # every trigger running before start returns
        self._tasks = [
            asyncio.create_task(self._watch(), name="trigger:watch"),
            asyncio.create_task(self._flush_loop(), name="trigger:stats"),
        ]

    async def stop(self) -> None:
        """Stop reading; finish what is in hand (each: a render and a publish; what
        cannot finish within `STOP_GRACE`, or at all with NATS gone, is cut short, not
        acked, and comes back); add the last counts."""
        self._stopping = True
        await cancel_and_wait(self._tasks)
        self._tasks = []
        for run in list(self._running.values()):
            await self._halt(run)
        await self._limiter.drain(grace=stop_grace(self.nc.is_connected))
        self._off.close()
        with contextlib.suppress(Exception):
            await self._flush()  # before the triggers are forgotten: a count is kept only for a known one
        self._running.clear()

    def triggers(self) -> list[str]:
        """The triggers this pod reads now (not paused)."""
        return sorted(n for n, r in self._running.items() if r.sub is not None)

    # --- specs ----------------------------------------------------------------------

    async def _watch(self) -> None:
        while self._kv is None:
            await asyncio.sleep(RESCAN / 10)
            try:
                self._kv = await self.js.key_value(TRIGGERS_BUCKET)
                await self._rescan()
            except Exception as e:
                log.debug("trigger: KV %s not there yet: %s", TRIGGERS_BUCKET, e)
        while True:
            try:
                watcher = await self._kv.watch("*")  # the specs: one-token keys, not `<name>.stats`
                async for entry in watcher:
                    if entry is None:
                        continue  # the end of what was there: read already by `_rescan`
                    if entry.operation in ("DEL", "PURGE"):
                        await self._apply(entry.key, None, gone=True)
                    else:
                        await self._apply(entry.key, self._decode(entry.key, entry.value), entry.revision or 0)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a watch lost with the connection: read everything again
                log.warning("trigger: watch of KV %s ended (%s); reading it again", TRIGGERS_BUCKET, e)
            await asyncio.sleep(RESCAN / 10)
            with contextlib.suppress(Exception):
                await self._rescan()

    async def _rescan(self) -> None:
        """Every spec read again and applied: what a watch lost meanwhile is caught up."""
        assert self._kv is not None
        try:
            keys = [k for k in await self._kv.keys() if "." not in k]
        except NoKeysError:  # an empty bucket
            keys = []
        seen = set()
        for name in keys:
            try:
                entry = await self._kv.get(name)
            except KeyNotFoundError:
                continue
            seen.add(name)
            await self._apply(name, self._decode(name, entry.value), entry.revision or 0)
        for name in set(self._running) - seen:
            await self._apply(name, None, gone=True)

    def _decode(self, name: str, value: bytes | None) -> TriggerSpec | None:
        try:
            return codec_of(self.nc).decode(_spec_decoder, value or b"")
        except Exception as e:  # a spec written by hand that cannot be read: skipped, said
            log.error("trigger %s: its spec in KV %s cannot be read (%s); not running it", name, TRIGGERS_BUCKET, e)
            return None

    async def _apply(self, name: str, spec: TriggerSpec | None, revision: int = 0, *, gone: bool = False) -> None:
        """Run `spec` as trigger `name` (None: run nothing; `gone`: its spec was deleted,
        so its consumer goes too; an unreadable spec's is kept, the version that wrote
        it owns it)."""
        async with self._lock:
            if self._stopping:
                return
            run = self._running.get(name)
            if run is not None and spec is not None and run.spec == spec:
                return
            if run is not None:
                await self._halt(run)
                del self._running[name]
                if gone:
                    with contextlib.suppress(Exception):
                        await self._drop_consumer(run.spec)
            if spec is None or spec.name != name:
                return
            if spec.deleting:
                await self._remove(spec, revision)
                return
            refused = refusal(spec.subject, spec.stream)
            if refused is not None:
                log.error("trigger %s: not run: %s", name, refused)
                return
            run = self._running[name] = _Running(spec)
            if spec.paused:
                log.info("trigger %s: paused", name)
                return
            try:
                run.sub = await self._subscribe(run)
            except Exception as e:
                # its stream gone, say: the next rescan tries again
                log.error("trigger %s: cannot read %s: %s", name, spec.subject, e)
                del self._running[name]
                return
            where = f"stream {spec.stream}" if spec.stream else "core NATS"
            log.info("trigger %s: starting %s for each message on %s (%s)", name, spec.playbook, spec.subject, where)

    async def _halt(self, run: _Running) -> None:
        run.active = False
        if run.sub is not None:
            with contextlib.suppress(Exception):
                await run.sub.unsubscribe()
            run.sub = None

    async def _subscribe(self, run: _Running) -> Subscription:
        spec = run.spec
        if spec.stream is None:
            return await subscribe_direct(
                self.nc, spec.subject, functools.partial(self._on_core, run), queue=consumer_name(spec.name)
            )
        await self._ensure_consumer(spec)
        return await subscribe_direct(
            self.nc,
            deliver_subject(spec.name),
            functools.partial(self._on_stream, run),
            queue=consumer_name(spec.name),
        )

    async def _ensure_consumer(self, spec: TriggerSpec) -> None:
        """The trigger's durable consumer, made here from the spec's creation time
        when missing (not made yet, or deleted by hand), so no message stored since
        the trigger was added is skipped. One of the same name left by a predecessor
        (another `add`: its description names another add id) is replaced."""
        assert spec.stream is not None
        name = consumer_name(spec.name)
        config = consumer_config(spec, self.layout)
        try:
            info = await self.js.consumer_info(spec.stream, name)
        except NotFoundError:
            info = None
        if info is not None:
            if not spec.add_id or info.config.description == config.description:
                return
            log.info("trigger %s: consumer %s is a predecessor's; replacing it", spec.name, name)
            with contextlib.suppress(NotFoundError):
                await self.js.delete_consumer(spec.stream, name)
        try:
            await self.js.add_consumer(spec.stream, config)
        except BadRequestError:
            # made meanwhile by another pod with the same config: fine; else say so
            info = await self.js.consumer_info(spec.stream, name)
            if info.config.description != config.description:
                raise

    async def _drop_consumer(self, spec: TriggerSpec) -> None:
        """`spec`'s consumer deleted, if it is still this spec's (not a successor's)."""
        if spec.stream is None:
            return
        name = consumer_name(spec.name)
        try:
            info = await self.js.consumer_info(spec.stream, name)
        except NotFoundError:
            return
        if spec.add_id and info.config.description != consumer_config(spec, self.layout).description:
            return  # a successor's (the trigger added again meanwhile)
        with contextlib.suppress(NotFoundError):
            await self.js.delete_consumer(spec.stream, name)

    async def _remove(self, spec: TriggerSpec, revision: int) -> None:
        """A spec `delete` marked: its consumer, its counts, then the spec (unless
        written again meanwhile). Every pod may do it; each step is idempotent, and a
        pod that dies half way leaves the mark for the next rescan."""
        assert self._kv is not None
        try:
            await self._drop_consumer(spec)
            await self._kv.delete(stats_key(spec.name))
            await self._kv.delete(spec.name, last=revision or None)
        except APIError as e:
            if e.err_code != WRONG_LAST_SEQUENCE:
                log.warning("trigger %s: not removed yet (tried again at the next rescan): %s", spec.name, e)
            return  # else changed meanwhile (deleted by another pod, or added again): its own entry says
        except Exception as e:
            log.warning("trigger %s: not removed yet (tried again at the next rescan): %s", spec.name, e)
            return
        self._counts.pop(spec.name, None)
        log.info("trigger %s: deleted", spec.name)

    # --- messages -------------------------------------------------------------------

    def _on_stream(self, run: _Running, msg: Msg) -> None:
        if not msg.reply:
            return  # a status message
        self._limiter.submit(functools.partial(self._stream_message, run, msg))

    def _on_core(self, run: _Running, msg: Msg) -> None:
        size = len(msg.data) + sum(len(k) + len(str(v)) for k, v in (msg.headers or {}).items())
        if self._backlog >= CORE_BACKLOG or self._backlog_bytes + size > CORE_BACKLOG_BYTES:
            # at most once: a flood past what a pod holds is dropped, counted, not queued without end
            self._count_error(
                run.spec.name,
                f"dropped: more than {CORE_BACKLOG} core messages or {CORE_BACKLOG_BYTES >> 20} MB waiting",
            )
            return
        self._backlog += 1
        self._backlog_bytes += size
        self._limiter.submit(functools.partial(self._core_message, run, msg, time.time(), size))

    async def _stream_message(self, run: _Running, msg: Msg) -> None:
        spec = run.spec
        if not run.active:
            await _nak(msg)  # paused or deleted meanwhile: handed back, started by no one now
            return
        seq = stream_seq(msg)
        letter_id = dead_letter_id(DEAD_LETTER_SOURCE, _letter_key(spec), seq)
        try:
            eid = stream_execution_id(spec.name, seq, spec.add_id)
            message = _message(msg, seq=seq, at=log_time(msg))
            try:
                start = await self._start_of(spec, eid, message)
            except RenderKilled as e:
                if num_delivered(msg) < RENDER_TRIES:
                    log.warning("trigger %s: render killed (%s); handed back for a later try", spec.name, e)
                    await _nak(msg, delay=RENDER_RETRY_DELAY)
                    return
                await self._dead_letter(spec, msg, eid, str(e), letter_id)
            except Unusable as e:
                await self._dead_letter(spec, msg, eid, str(e), letter_id)
            else:
                await self._publish(spec, start, eid)
        except Exception as e:
            if is_transient(e) or num_delivered(msg) < POISON_TRIES:
                log.warning("trigger %s: message not handled (it comes back): %s", spec.name, e)
                return  # not acked: delivered again after ack_wait
            # the same message failed the same way every time: it will not start, say why
            try:
                reason = f"the message could not be handled: {type(e).__name__}: {e}"
                await self._dead_letter(spec, msg, None, reason, letter_id)
            except Exception:
                log.exception("trigger %s: could not dead-letter a message", spec.name)
                return
        except RenderHalted:
            return  # stopping: not acked, it comes back
        await ack(msg)

    async def _core_message(self, run: _Running, msg: Msg, received: float, size: int) -> None:
        self._backlog -= 1
        self._backlog_bytes -= size
        spec = run.spec
        if not run.active:
            return  # paused meanwhile: at most once, so dropped
        headers = msg.headers or {}
        eid = core_execution_id(spec.name, headers.get(MSG_ID), uuid.uuid4().hex, spec.add_id)
        try:
            try:
                start = await self._start_of(spec, eid, _message(msg, seq=None, at=received))
            except Unusable as e:
                await self._dead_letter(spec, msg, eid, str(e), None)
            else:
                await self._publish(spec, start, eid)
        except RenderHalted:
            return  # stopping: at most once, so this one is lost (docs/triggers.md)
        except Exception as e:
            log.error("trigger %s: a core message started nothing (%s: %s)", spec.name, type(e).__name__, e)
            self._count_error(spec.name, f"{type(e).__name__}: {e}")

    async def _start_of(self, spec: TriggerSpec, eid: str, message: dict[str, Any]) -> StartMessage:
        """The start a message asks for, or Unusable saying why it asks for none."""
        if spec.payload is None:
            payload = message["data"]
            if not isinstance(payload, dict):
                raise Unusable(
                    f"trigger {spec.name}: the message's body is not a JSON object "
                    "(a trigger without --payload starts with the body as its payload)"
                )
        else:
            payload = await self._render(spec, message)
            if not isinstance(payload, dict):
                raise Unusable(f"trigger {spec.name}: its payload template made {_kind(payload)}, not a JSON object")
        if not value_within(payload):
            raise Unusable(f"trigger {spec.name}: the payload nests deeper than {MAX_DEPTH} levels")
        start = StartMessage(playbook=spec.playbook, version=spec.version, payload=payload, execution_id=eid)
        size = len(codec_of(self.nc).encode(start))
        limit = self._start_limit()
        if size > limit:
            raise Unusable(f"trigger {spec.name}: a start of {size:,} bytes is over the {limit:,} a start may take")
        return start

    def _start_limit(self) -> int:
        server = self.nc.max_payload or self.layout.max_msg_size
        return min(self.layout.max_msg_size, server) - MESSAGE_HEADROOM

    async def _render(self, spec: TriggerSpec, message: dict[str, Any]) -> Any:
        """The payload template rendered over `message`: inline when cheap by
        construction, else in a bounded render process (never on the event loop)."""
        scope = {"message": message}
        template, limits = spec.payload, self.limits

        def render() -> Any:
            return call_with_limits(limits, lambda: render_value(template, scope, where="payload"))

        try:
            try:
                return self._off.inline(render)
            except SliceExhausted:
                return await self._off.off_loop(render)
        except TemplateError as e:  # TemplateLimit included
            where = f" ({e.where})" if getattr(e, "where", "") else ""
            raise Unusable(f"trigger {spec.name}: its payload template failed{where}: {e.message}") from None
        except RenderFault as e:
            raise RenderKilled(f"trigger {spec.name}: its payload template failed: {e.describe()}") from None

    async def _publish(self, spec: TriggerSpec, start: StartMessage, eid: str) -> None:
        """The start stored in stream START (its id: the execution's, so a second copy
        within the window is dropped, and the starter writes one record whatever)."""
        data = codec_of(self.nc).encode(start)
        (puback,) = await publisher(self.nc).send([(START_SUBJECT, data, {MSG_ID: start_id(eid)})])
        c = self._counts_of(spec.name)
        if puback.duplicate:
            c.duplicates += 1  # stored already (a redelivery, a message sent twice): one execution
            return
        c.started += 1
        c.last_start, c.last_execution_id = time.time(), eid

    async def _dead_letter(self, spec: TriggerSpec, msg: Msg, eid: str | None, reason: str, msg_id: str | None) -> None:
        letter = DeadLetter(
            source=DEAD_LETTER_SOURCE,
            reason=reason,
            subject=msg.subject,
            data=msg.data.decode("utf-8", errors="replace")[:64_000],
            execution_id=eid,
            headers={k: str(v) for k, v in (msg.headers or {}).items()},
        )
        log.warning("trigger %s: dead letter (%s): %s", spec.name, msg.subject, reason)
        to = dead_letter_subject(DEAD_LETTER_SOURCE, dead_letter_token(spec.name))
        if msg_id is None:
            await publish_all(self.js, [(to, encode(letter), f"dlq:trigger:{spec.name}:{uuid.uuid4().hex}")])
        else:
            await publish_all(self.js, [(to, encode(letter), msg_id)])
        self._count_error(spec.name, reason)

    # --- counts ---------------------------------------------------------------------

    def _counts_of(self, name: str) -> _Counts:
        c = self._counts.get(name)
        if c is None:
            c = self._counts[name] = _Counts()
        c.pending = True
        return c

    def _count_error(self, name: str, reason: str) -> None:
        c = self._counts_of(name)
        c.errors += 1
        c.last_error, c.last_error_at = reason[:500], time.time()

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(STATS_EVERY)
            try:
                await self._flush()
            except Exception as e:
                log.warning("trigger: counts not written (kept for the next try): %s", e)

    async def _flush(self) -> None:
        """Add this pod's counts since the last flush to each trigger's `<name>.stats`
        (compare-and-set: pods add to one entry without losing each other's)."""
        if self._kv is None:
            return
        for name, c in list(self._counts.items()):
            if not c.pending:
                continue
            # taken out before the await: what is counted meanwhile goes to fresh counts
            del self._counts[name]
            if name not in self._running:
                continue  # deleted: its counts go with it
            try:
                await self._add(name, c)
            except BaseException:
                self._merge(name, c)  # not written: kept for the next flush
                raise

    def _merge(self, name: str, c: _Counts) -> None:
        now = self._counts_of(name)
        now.started += c.started
        now.duplicates += c.duplicates
        now.errors += c.errors
        if c.last_start is not None and (now.last_start or 0) < c.last_start:
            now.last_start, now.last_execution_id = c.last_start, c.last_execution_id
        if c.last_error_at is not None and (now.last_error_at or 0) < c.last_error_at:
            now.last_error, now.last_error_at = c.last_error, c.last_error_at

    async def _add(self, name: str, c: _Counts) -> None:
        assert self._kv is not None
        key = stats_key(name)
        for _ in range(10):
            try:
                entry = await self._kv.get(key)
                stats, revision = _stats_decoder.decode(entry.value or b"{}"), entry.revision
            except KeyNotFoundError:
                stats, revision = TriggerStats(), None
            stats.started += c.started
            stats.duplicates += c.duplicates
            stats.errors += c.errors
            if c.last_start is not None and (stats.last_start or 0) <= c.last_start:
                stats.last_start, stats.last_execution_id = c.last_start, c.last_execution_id
            if c.last_error_at is not None and (stats.last_error_at or 0) <= c.last_error_at:
                stats.last_error, stats.last_error_at = c.last_error, c.last_error_at
            value = msgspec.json.encode(stats)
            try:
                if revision is None:
                    await self._kv.create(key, value)
                else:
                    await self._kv.update(key, value, last=revision)
                return
            except KeyWrongLastSequenceError:
                continue  # another pod added meanwhile: read again
        raise RuntimeError(f"trigger {name}: counts not written after 10 tries (other pods writing)")


def consumer_config(spec: TriggerSpec, layout: Layout, *, created_now: bool = False) -> api.ConsumerConfig:
    """The durable push consumer a stream trigger reads through: from the messages
    stored after the trigger was added; explicit acks; redelivered after `ack_wait`
    without a limit (the pods dead-letter a message they cannot use themselves)."""
    assert spec.stream is not None
    name = consumer_name(spec.name)
    by_time = not created_now and spec.created_at > 0
    return api.ConsumerConfig(
        durable_name=name,
        deliver_subject=deliver_subject(spec.name),
        deliver_group=name,
        filter_subject=spec.subject,
        ack_policy=api.AckPolicy.EXPLICIT,
        ack_wait=layout.ack_wait,
        max_deliver=-1,
        max_ack_pending=MAX_ACK_PENDING,
        deliver_policy=api.DeliverPolicy.BY_START_TIME if by_time else api.DeliverPolicy.NEW,
        opt_start_time=datetime.datetime.fromtimestamp(spec.created_at, datetime.UTC) if by_time else None,
        # the add id names the trigger this consumer is for: one left by a predecessor of
        # the same name is told apart (and replaced)
        description=f"trigger {spec.name} ({spec.add_id or '-'}): starts {spec.playbook}",
    )


def _message(msg: Msg, *, seq: int | None, at: float) -> dict[str, Any]:
    """What a payload template reads as `message` (actors/wire/triggers.py TriggerMessage)."""
    data: Any
    raw = msg.data
    try:
        data = _json.decode(raw) if raw and json_within(raw) else raw.decode("utf-8", errors="replace")
    except (msgspec.DecodeError, RecursionError):
        data = raw.decode("utf-8", errors="replace")
    headers = {k: str(v) for k, v in (msg.headers or {}).items()}
    return {"subject": msg.subject, "data": data, "headers": headers, "seq": seq, "time": at}


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {str: "a string", list: "a list", bool: "a boolean", int: "a number", float: "a number"}.get(
        type(value), type(value).__name__
    )


async def _nak(msg: Msg, delay: float | None = None) -> None:
    with contextlib.suppress(Exception):
        await msg.nak(delay=delay)


def _letter_key(spec: TriggerSpec) -> str:
    """What a dead letter's id names the trigger by: with its add id, so a trigger
    added again does not find its predecessor's letters as duplicates."""
    return f"{spec.name}:{spec.add_id}" if spec.add_id else spec.name
