"""Answering `result.request`, `catalog.register`, `execution.cancel` and `execution.signal` (core
NATS, a queue group of the engine pods), so a client in any language reads a result,
registers a playbook, cancels an execution and signals a waiting step without the
Python client.

Each answer is what the Python client would say (`Client.status`, `Client.terminal`,
`catalog.register`), in the wire's own form: values travel as the deployment's payload
codec writes them (sealed when it has a key), never opened for a requester the log
itself would not show them to. A request that cannot be answered is answered anyway,
with an `error` saying why (`retryable` when NATS could not be reached): nothing is
lost silently, and a requester never waits out its timeout for a refusal.

Bounds: requests are read and written up to `in_flight` at once, playbooks loaded
LOADS_AT_ONCE at a time; one that waits for its execution's end (`Actors-Result-Wait`)
waits at most MAX_RESULT_WAIT seconds, holding no slot meanwhile; past `backlog`
requests taken and not answered the pod answers `Busy` (retryable) at once, as core
NATS has no consumer to hold the flood back. An answer larger than the server takes is
replaced by a `ResultTooLarge` error. A playbook is loaded on a fold thread
(a large one by a render process, under its OS limits), never on the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from actors.client import Client, InvalidExecutionId, InvalidSignal, SignalRefused, TooLarge
from actors.client.outcome import ExecutionNotFinished, ExecutionNotFound
from actors.client.signals import ExecutionNotKnownYet
from actors.natsio import send
from actors.natsio.binding import codec_of
from actors.natsio.dispatch import subscribe_direct
from actors.natsio.replies import is_inbox
from actors.playbook.errors import PlaybookInvalid
from actors.playbook.model import Playbook
from actors.playbook.templates import RenderFault
from actors.runtime.supervision import is_transient
from actors.store.catalog import CatalogError, register_loaded
from actors.store.records import RecordInvalid
from actors.wire.codec import PayloadUnreadable
from actors.wire.events import TERMINAL_STATES, ExecState
from actors.wire.messages import (
    CancelAsk,
    CancelReply,
    RegisterReply,
    RegisterRequest,
    RequestError,
    ResultReply,
    ResultRequest,
    SignalAsk,
    SignalReply,
)
from actors.wire.nesting import START_MESSAGE_DEPTH, json_within
from streams.layout import EXECUTION_ID
from streams.subjects import (
    CANCEL_REQUEST_SUBJECT,
    REGISTER_REQUEST_SUBJECT,
    RESULT_REQUEST_SUBJECT,
    RESULT_WAIT,
    SIGNAL_REQUEST_SUBJECT,
)

log = logging.getLogger("actors.gateway")

GATEWAY_QUEUE = "gateway"
MAX_RESULT_WAIT = 60.0  # seconds a result request may wait for its execution's end
INVALID_REQUEST = "InvalidRequest"
LOADS_AT_ONCE = 2
LOOKUPS_AT_ONCE = 8
MAX_WAITING = 256  # result requests waiting for an end per pod; more are answered at once
UNKNOWN_WAIT = 5.0  # seconds a wait for an id with no status lasts at most
MAX_FILE_NAME = 256

Loader = Callable[[str, str, int], Awaitable[Playbook]]
_result_request = msgspec.json.Decoder(ResultRequest)
_register_request = msgspec.json.Decoder(RegisterRequest)
_cancel_request = msgspec.json.Decoder(CancelAsk)
_signal_request = msgspec.json.Decoder(SignalAsk)
CANCEL_LOOKUP = 2.0  # seconds a cancel of an id with no status waits for a start still queued


def _invalid(what: str, why: object) -> RequestError:
    return RequestError(type=INVALID_REQUEST, message=f"invalid {what}: {why}")


def _decode(decoder: msgspec.json.Decoder[Any], data: bytes, what: str) -> Any:
    """The request, or an InvalidRequest error. Nesting is measured first: a decoder
    meeting thousands of levels raises RecursionError, where a request is only refused."""
    if not json_within(data, START_MESSAGE_DEPTH):
        return _invalid(what, f"nested deeper than {START_MESSAGE_DEPTH}")
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as e:
        return _invalid(what, e)
    except msgspec.DecodeError as e:
        return _invalid(what, f"not JSON: {e}")


def _bad_id(what: str, eid: str) -> RequestError:
    return _invalid(what, f"field execution_id {eid[:200]!r} must match {EXECUTION_ID.pattern}")


# each request's reply when it is not done (refused, busy, failed): its fields empty but `error`
def _no_result(error: RequestError) -> ResultReply:
    return ResultReply(execution_id=None, error=error)


def _not_registered(error: RequestError) -> RegisterReply:
    return RegisterReply(path=None, version=None, registered=False, error=error)


def _not_cancelled(error: RequestError) -> CancelReply:
    return CancelReply(execution_id=None, cancelled=False, error=error)


def _not_signalled(error: RequestError) -> SignalReply:
    return SignalReply(execution_id=None, signal_id=None, accepted=False, error=error)


Answer = Callable[[Msg], Awaitable[msgspec.Struct]]
Refusal = Callable[[RequestError], msgspec.Struct]


def result_wait(msg: Msg) -> float:
    """The seconds the requester asked to wait for the end (`Actors-Result-Wait`), within
    [0, MAX_RESULT_WAIT]; 0 when absent or not a number."""
    try:
        wait = float((msg.headers or {}).get(RESULT_WAIT, "0"))
    except ValueError:
        return 0.0
    return min(wait, MAX_RESULT_WAIT) if wait > 0 else 0.0  # NaN and negatives: no wait


class Gateway:
    """The engine pods' answers to `result.request`, `catalog.register`, `execution.cancel`
    and `execution.signal`."""

    def __init__(
        self,
        nc: NATS,
        *,
        client: Client,
        load: Loader,
        max_attempts: int,
        in_flight: int = 64,
        backlog: int = 1_000,
    ) -> None:
        self.nc = nc
        self.client = client  # the public client on the pod's connection (reads, as `actors-cli result`)
        self._load = load  # the engine host's: off the event loop (actors/runtime/hosting.py)
        self._max_attempts = max_attempts  # the pod's ceiling on retries, as its starter applies
        # requests being read or written at once; a wait for an end holds no slot (it only
        # listens), so a few long waits cannot hold up every other request
        self._slots = asyncio.Semaphore(in_flight)
        # playbooks loaded at once: each takes one of the engine's fold threads, which folds share
        self._loads = asyncio.Semaphore(LOADS_AT_ONCE)
        # lookups of a start still queued, at once (each reads stream START and opens a consumer)
        self._lookups = asyncio.Semaphore(LOOKUPS_AT_ONCE)
        self._backlog = backlog
        self._pending = 0  # requests taken and not yet answered
        self._waiting = 0  # result requests waiting for an end (MAX_WAITING at most)
        self._stopping = asyncio.Event()  # set by stop(): waits end, answered as things stand
        self._tasks: set[asyncio.Task[None]] = set()
        self._subs: list[Subscription] = []

    @property
    def pending(self) -> int:
        """Requests taken and not answered yet (waiting for an end, for a slot, or answering)."""
        return self._pending

    async def start(self) -> None:
        served: tuple[tuple[str, Answer, Refusal], ...] = (
            (RESULT_REQUEST_SUBJECT, self.answer_result, _no_result),
            (REGISTER_REQUEST_SUBJECT, self.answer_register, _not_registered),
            (CANCEL_REQUEST_SUBJECT, self.answer_cancel, _not_cancelled),
            (SIGNAL_REQUEST_SUBJECT, self.answer_signal, _not_signalled),
        )
        for subject, answer, refuse in served:
            handler = functools.partial(self._on_request, answer, refuse)
            self._subs.append(await subscribe_direct(self.nc, subject, handler, queue=GATEWAY_QUEUE))

    async def stop(self) -> None:
        """Take no more requests; answer those taken: a wait for an end stops at once and is
        answered with the status as it stands (a pod stopping must not wait out a requester's
        minute, past its grace period: its leases would not be handed back)."""
        for sub in self._subs:
            await sub.unsubscribe()
        self._subs.clear()
        self._stopping.set()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _on_request(self, answer: Answer, refuse: Refusal, msg: Msg) -> None:
        if not msg.reply or not self._subs:
            return  # nobody to answer (a plain publish), or stopping: the requester asks again
        if not is_inbox(msg.reply):
            # the pod may publish where a requester may not (lifecycle subjects, leases,
            # the catalog): an answer goes only to an inbox, never where a request points it
            log.warning(
                "gateway: a request on %s named reply subject %.80r, not an inbox: ignored", msg.subject, msg.reply
            )
            return
        busy = self._pending >= self._backlog
        self._pending += 1
        task = asyncio.get_running_loop().create_task(self._answer(answer, refuse, msg, busy))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, answer: Answer, refuse: Refusal, msg: Msg, busy: bool) -> None:
        try:
            if busy:
                reply = refuse(
                    RequestError(type="Busy", message="too many requests waiting; ask again", retryable=True)
                )
            else:
                try:
                    reply = await answer(msg)
                except Exception as e:
                    log.exception("gateway: a request on %s could not be answered", msg.subject)
                    error = RequestError(type=type(e).__name__, message=str(e), retryable=is_transient(e))
                    reply = refuse(error)
            data = codec_of(self.nc).encode(reply)
            if len(data) > self.nc.max_payload:  # a result that fit its event, but not beside its status
                error = RequestError(
                    type="ResultTooLarge",
                    message=f"the answer takes {len(data):,} bytes, over the server's {self.nc.max_payload:,}",
                )
                data = codec_of(self.nc).encode(refuse(error))
            await send(self.nc, msg.reply, data)
        except Exception:
            log.exception("gateway: could not answer a request on %s", msg.subject)  # it times out
        finally:
            self._pending -= 1

    # --- result.request -----------------------------------------------------------------

    async def answer_result(self, msg: Msg) -> ResultReply:
        req = _decode(_result_request, msg.data, "result request")
        if isinstance(req, RequestError):
            return _no_result(req)
        eid = req.execution_id
        if not EXECUTION_ID.fullmatch(eid):
            return _no_result(_bad_id("result request", eid))
        wait = result_wait(msg)
        if wait and self._waiting < MAX_WAITING:  # past it: answered at once, as it stands
            self._waiting += 1
            try:
                await self._until_ended(eid, wait)
            finally:
                self._waiting -= 1
        async with self._slots:
            return await self.result_of(eid)

    async def _until_ended(self, eid: str, wait: float) -> None:
        """Wait up to `wait` seconds for the execution to end, or until the pod stops; an
        id with no status is waited for UNKNOWN_WAIT at most (its start may be queued: a
        made-up id must not hold a waiter for a minute)."""
        if await self.client.status(eid) is None:
            wait = min(wait, UNKNOWN_WAIT)
        ended = asyncio.ensure_future(self.client.wait(eid, timeout=wait))
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait((ended, stopping), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (ended, stopping):
                task.cancel()
            await asyncio.gather(ended, stopping, return_exceptions=True)  # a TimeoutError: answered as it stands

    async def result_of(self, eid: str) -> ResultReply:
        try:
            status, terminal = await self.client.terminal(eid)
        except ExecutionNotFound as e:
            return ResultReply(execution_id=eid, error=RequestError(type="ExecutionNotFound", message=str(e)))
        except ExecutionNotFinished as e:
            return ResultReply(execution_id=eid, status=e.status)
        except (RecordInvalid, PayloadUnreadable) as e:
            return ResultReply(execution_id=eid, error=RequestError(type="ResultUnreadable", message=str(e)))
        if status.state != ExecState.COMPLETED:
            return ResultReply(execution_id=eid, status=status)
        if terminal is None:  # its status was read, then its log was retired without an archive
            gone = f"execution {eid}: its records were removed by retention"
            error = RequestError(type="ExecutionNotFound", message=gone)
            return ResultReply(execution_id=eid, status=status, error=error)
        if terminal.unreadable is not None:
            error = RequestError(type="ResultUnreadable", message=f"the result: {terminal.unreadable}")
            return ResultReply(execution_id=eid, status=status, error=error)
        ref = terminal.data.get("result_ref")
        if ref:  # too large for a message: named, not carried
            return ResultReply(execution_id=eid, status=status, result_ref=str(ref))
        return ResultReply(execution_id=eid, status=status, result=terminal.data.get("result"))

    # --- execution.cancel ---------------------------------------------------------------

    async def answer_cancel(self, msg: Msg) -> CancelReply:
        req = _decode(_cancel_request, msg.data, "cancel request")
        if isinstance(req, RequestError):
            return _not_cancelled(req)
        eid = req.execution_id
        if not EXECUTION_ID.fullmatch(eid):
            return _not_cancelled(_bad_id("cancel request", eid))
        async with self._slots:
            status = await self.client.status(eid)
        if status is not None and status.state in TERMINAL_STATES:
            return CancelReply(execution_id=eid, cancelled=False, status=status)
        if status is None:
            # nothing is written for an id no execution has: it would be that id's one
            # record, for ever (retention retires ended executions only). The lookup may
            # wait for starts still queued: a few at once, holding no slot
            async with self._lookups:
                known = await self.client.exists(eid, timeout=CANCEL_LOOKUP)
            if not known:
                why = (
                    f"no execution {eid!r}"
                    if known is False
                    else f"execution {eid!r} is not started yet (starts are still queued): ask again"
                )
                error = RequestError(type="ExecutionNotFound", message=why, retryable=known is None)
                return CancelReply(execution_id=eid, cancelled=False, error=error)
        async with self._slots:
            try:
                await self.client.cancel(eid, reason=req.reason)
            except ExecutionNotFound as e:  # retired meanwhile
                error = RequestError(type="ExecutionNotFound", message=str(e))
                return CancelReply(execution_id=eid, cancelled=False, error=error)
            return CancelReply(execution_id=eid, cancelled=True, status=status)

    # --- execution.signal ---------------------------------------------------------------

    async def answer_signal(self, msg: Msg) -> SignalReply:
        """`Client.signal`'s checks and write, for a requester of any language: refused
        (`accepted: false`, its status) for an execution that has ended; `duplicate` when
        a signal of its id was in the log already (the first stands); `InvalidRequest`
        for a bad name, key, id, sender or data; `ExecutionNotFound` for an unknown or retired id
        (`retryable` while starts queued before it may still hold its start)."""
        req = _decode(_signal_request, msg.data, "signal request")
        if isinstance(req, RequestError):
            return _not_signalled(req)
        eid = req.execution_id
        if not EXECUTION_ID.fullmatch(eid):
            return _not_signalled(_bad_id("signal request", eid))
        try:
            # data sealed by a requester that holds the deployment's key is opened, then
            # sealed again as the log's copy is written (clear data passes as it is)
            data = codec_of(self.nc).open_value(req.data) if req.data is not None else None
        except PayloadUnreadable as e:
            return _not_signalled(_invalid("signal request", f"field data: {e}"))

        def refused(kind: str, message: str, retryable: bool = False) -> SignalReply:
            error = RequestError(type=kind, message=message, retryable=retryable)
            return SignalReply(execution_id=eid, signal_id=req.signal_id, accepted=False, error=error)

        async with self._lookups:  # a start still queued may be looked for: a few at once
            try:
                return await self.client.signal(eid, req.name, data, key=req.key, signal_id=req.signal_id, by=req.by)
            except (InvalidSignal, InvalidExecutionId, TooLarge, ValueError) as e:  # TooDeep is a ValueError
                return refused(INVALID_REQUEST, f"invalid signal request: {e}")
            except ExecutionNotKnownYet as e:
                return refused("ExecutionNotFound", str(e), retryable=True)
            except ExecutionNotFound as e:
                return refused("ExecutionNotFound", str(e))
            except SignalRefused as e:
                return refused("SignalRefused", str(e))

    # --- catalog.register ---------------------------------------------------------------

    async def answer_register(self, msg: Msg) -> RegisterReply:
        req = _decode(_register_request, msg.data, "register request")
        if isinstance(req, RequestError):
            return _not_registered(req)
        file = req.file or "<request>"
        if len(file) > MAX_FILE_NAME or not file.isprintable():
            why = f"field file must be printable text of at most {MAX_FILE_NAME} characters"
            return _not_registered(_invalid("register request", why))
        try:
            async with self._loads:
                pb = await self._load(req.source, file, self._max_attempts)
            async with self._slots:
                entry = await register_loaded(self.client.js, pb, req.source, file=file)
        except PlaybookInvalid as e:
            error = RequestError(type="PlaybookInvalid", message=str(e))
        except CatalogError as e:
            error = RequestError(type=e.error_type, message=str(e))
        except RenderFault as e:  # killed past the pod's deadline, out of memory
            error = RequestError(type="PlaybookInvalid", message=f"{file}: not loaded within the pod's limits: {e}")
        else:
            return RegisterReply(path=entry.path, version=entry.version, registered=True)
        return _not_registered(error)
