"""What every call of a `Client` shares: its connection, layout and timeout, and the two
ways it rides out an election or a reconnect (a read asked again, a publish sent again
with its Nats-Msg-Id) before it raises NatsUnavailable."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from typing import Any, Concatenate, ParamSpec, TypeVar

from nats.aio.client import Client as NATS
from nats.js.api import PubAck
from nats.js.kv import KeyValue

from actors.natsio import (
    MSG_ID,
    TRANSIENT_REQUEST,
    PublishDenied,
    PublishOutcomeUnknown,
    close_connection,
    publisher,
    ride_out,
)
from actors.natsio.binding import bind, codec_of
from actors.natsio.denials import DenialWatch
from actors.natsio.dial import CLIENT_TIMEOUT, NatsUnavailable
from actors.store.archive import ArchivedExecution, ArchiveStore, ObjectArchive
from actors.store.catalog import CatalogReader
from actors.wire.codec import PayloadCodec
from actors.wire.messages import CatalogEntry, Limits
from streams.layout import Layout

# room a message needs around the value it carries (ids, limits, headers): what a
# value may use is the message limit minus this
MESSAGE_HEADROOM = 16 * 1024
T = TypeVar("T")
P = ParamSpec("P")
S = TypeVar("S", bound="Session")
# what a publish raises once its budget is spent: still refused, or still no PubAck
PUBLISH_FAILED: tuple[type[BaseException], ...] = (*TRANSIENT_REQUEST, PublishOutcomeUnknown)


# when the call a user made (`within_timeout`) must be done by, on the event loop's clock
_CALL_ENDS: ContextVar[float | None] = ContextVar("actors_client_call_ends", default=None)


def within_timeout(
    method: Callable[Concatenate[S, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, T]]:
    """A call of several requests (a schedule pause reads, writes, reads and purges)
    done within the client's timeout as a whole: each request it rides out gets what is
    left of it, not a timeout of its own, so a command gives up within `--timeout`
    however NATS comes and goes meanwhile. Once it is spent, a request is still tried
    once. Calls made inside keep the outer call's end."""

    async def bounded(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        if _CALL_ENDS.get() is not None:
            return await method(self, *args, **kwargs)
        token = _CALL_ENDS.set(asyncio.get_running_loop().time() + self.timeout)
        try:
            return await method(self, *args, **kwargs)
        finally:
            _CALL_ENDS.reset(token)

    return functools.wraps(method)(bounded)


class Session:
    """The connection, layout and timeout every call of a client goes through."""

    def __init__(
        self,
        nc: NATS,
        *,
        layout: Layout,
        timeout: float = CLIENT_TIMEOUT,
        owns_connection: bool = False,
        codec: PayloadCodec | None = None,
        limits: Limits | None = None,
        archive: ArchiveStore | None = None,
    ) -> None:
        """A client on `nc` (a connection of the caller's, left open by `close` unless
        `owns_connection`), for a deployment of `layout`, each call trying for up to
        `timeout` seconds. `Client.connect(url)` makes the connection itself.
        `codec`: the payload keys (`Settings.payload_codec`), bound to `nc`; None keeps
        the codec `nc` has (none: values are written in clear, and an encrypted one
        read raises `PayloadUnreadable`). `limits`: the deployment's (`Settings.limits`);
        a playbook registered is checked against its retry ceiling as the starter will
        check it. None: the defaults (`Limits()`), as settings with none set have them."""
        if codec is not None:
            bind(nc, codec)
        self.codec = codec_of(nc)
        self.nc = nc
        self.owns_connection = owns_connection
        self.js = nc.jetstream()
        self.layout = layout
        self.timeout = timeout
        self.limits = limits if limits is not None else Limits()
        # a publish without a PubAck is re-sent only within the streams' duplicate window
        publisher(nc).duplicate_window = layout.duplicate_window
        self._buckets: dict[str, KeyValue] = {}
        self.archives: ArchiveStore = archive if archive is not None else ObjectArchive(nc)
        self._archives: dict[str, ArchivedExecution] = {}  # read back from `archive`, the last few

    async def bucket(self, name: str) -> KeyValue:
        """The KV bucket `name`, looked up once per client: nats-py's `key_value` asks
        the server for the stream's info on every call, a round trip per status read."""
        kv = self._buckets.get(name)
        if kv is None:
            kv = self._buckets[name] = await self.js.key_value(name)
        return kv

    async def close(self) -> None:
        """Close the connection if this client made it (`Client.connect`); a connection
        given to the constructor is the caller's to close."""
        if self.owns_connection:
            await close_connection(self.nc)

    def _left(self) -> float:
        """Seconds a request may still take: the timeout, or what is left of it in a call
        made `within_timeout`."""
        ends = _CALL_ENDS.get()
        return self.timeout if ends is None else max(0.0, ends - asyncio.get_running_loop().time())

    async def _ride(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """`call()` (idempotent), asked again through an election or a reconnect; past
        the timeout NatsUnavailable says that `what` failed. Two tries in a row that
        time out while the server tells this connection of the same permissions
        violation raise Denied, naming what was refused: asking again would only wait
        out the timeout (actors/natsio/denials.py)."""
        try:
            watch = DenialWatch(self.nc, what)
            return await ride_out(lambda: watch.attempt(call), budget=self._left())
        except TRANSIENT_REQUEST as e:
            raise NatsUnavailable(f"NATS did not answer within {self.timeout:g}s: {what} failed ({_why(e)})") from e

    async def _catalog_entry(self, playbook: str, version: int | None, *, what: str | None = None) -> CatalogEntry:
        """Playbook `playbook`'s registered `version` (None: its latest), read through an
        election or a reconnect; CatalogError names what is missing. `what` failed when
        NATS does not answer (default: the catalog read itself)."""
        return await self._ride(
            what or f"reading playbook {playbook} from the catalog",
            lambda: CatalogReader(self.js).resolve(playbook, version),
        )

    async def _publish(
        self,
        what: str,
        subject: str,
        data: bytes,
        msg_id: str,
        *,
        budget: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> PubAck:
        """A JetStream publish, sent again with the same Nats-Msg-Id until the stream
        acks it or the timeout passes (then NatsUnavailable); PublishDenied at once when
        the server says this user may not publish there. `budget`: seconds, when less
        than the timeout is left."""
        budget = self._left() if budget is None else min(budget, self._left())
        try:
            acks = await publisher(self.nc).send([(subject, data, {MSG_ID: msg_id, **(headers or {})})], budget=budget)
        except PublishDenied as e:  # at once: this user may not write there (NATS's -ERR)
            raise PublishDenied(f"{what} not written: {e}") from e
        except PUBLISH_FAILED as e:
            # a copy may have been stored with its PubAck lost: the same id makes a re-send harmless
            raise NatsUnavailable(
                f"NATS did not confirm {what} within {budget:g}s; it may or may not "
                f"have been stored, and sending it again (same id) is safe ({_why(e)})"
            ) from e
        return acks[0]

    def value_limit(self) -> int:
        """Bytes a value (a playbook source, a payload) may take in one message: the
        smaller of the streams' and the server's message limit, less the envelope."""
        server = self.nc.max_payload or self.layout.max_msg_size
        return min(self.layout.max_msg_size, server) - MESSAGE_HEADROOM


def _why(e: BaseException) -> str:
    return "last error: " + (" ".join(str(e).split()) or type(e).__name__)
