"""PostgreSQL connections of a tool actor: one bounded pool per credential (psycopg 3 and
psycopg_pool), made on first use, reused by every step and iteration the actor runs, closed
with the actor (`ToolResources.close`). The `postgres` kind and a postgres sink take their
connections here: `PostgresPools.transaction` is one command's transaction.

A credential gives the connection (docs/language.md, "postgres"): ``dsn`` or ``url`` (a
libpq connection string or a ``postgresql://`` URL), and/or ``host``, ``port``,
``database`` (or ``dbname``), ``user`` (or ``username``), ``password``, ``sslmode``; the
separate keys win over the same ones in the dsn. The password (also one written inside
the dsn) is handed to the redactor before any connection is tried, and a dsn that cannot
be parsed is refused without quoting it.

A connection is in autocommit (a transaction's BEGIN and COMMIT are ours, each sent with
what goes with it in one round trip) and has the session settings the value loaders need
(`_SESSION`, set when it is made). A transaction that ran a user's SQL (`reset=True`)
ends by resetting the session in the round trip of its COMMIT or ROLLBACK (`_RESET`): a
`SET`, a temporary table, `SET ROLE`, a `LISTEN` or an advisory lock of one step never
reaches the next step on that connection (the pool is shared by every playbook the pod
runs). Table writes run only our statements, which leave nothing behind, and skip it.

A rotated credential (new values under the same name) gets a new pool; the old one is
closed. Failures become `ToolFailure` (`pg_failure`): a connection that is refused or
dropped (the server restarting, `pg_terminate_backend`), a serialization failure, a
deadlock or too many connections are retryable; a password the server refuses, a role or
database it does not have are `CredentialInvalid`, not retryable; a SQL error (syntax,
constraint, a missing table) is not, and its type is the SQLSTATE's name (`UniqueViolation`), its
message starting with the SQLSTATE code.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from actors.tools import pgvalues
from actors.tools.failures import ToolFailure, safe_str
from actors.tools.redact import REDACTOR

if TYPE_CHECKING:
    import psycopg
    from psycopg.adapt import AdaptersMap
    from psycopg_pool import AsyncConnectionPool

__all__ = ["PoolBounds", "PostgresPools", "conninfo", "pg_failure"]

# SQLSTATEs worth trying again: the connection (class 08), the server going away (57P01
# admin shutdown, 57P02 crash shutdown, 57P03 cannot connect now), too many connections,
# serialization failure and deadlock (the transaction as a whole may succeed next time)
# (25P03: the server ended a session left idle in its transaction past our limit)
_RETRYABLE_STATES = frozenset({"57P01", "57P02", "57P03", "53300", "40001", "40P01"})
_CONNECTION_STATES = frozenset({"57P01", "57P02", "57P03", "25P03"})
# a connection attempt the server refused for what the credential says (28P01, 28000, 3D000):
# libpq gives no SQLSTATE for a failed connect, only the server's message (in English
# unless the server's lc_messages says otherwise; then it stays a retryable PoolTimeout)
_CREDENTIAL_REFUSED = re.compile(
    r"password authentication failed|database \"[^\"]*\" does not exist|role \"[^\"]*\" does not exist"
    r"|no pg_hba\.conf entry|password is required|no password supplied"
)
# TCP keepalives of our end (libpq): a server gone silent is noticed in about a minute
_KEEPALIVES = {"keepalives": "1", "keepalives_idle": "30", "keepalives_interval": "10", "keepalives_count": "3"}
_ALIASES = {"database": "dbname", "username": "user"}
_KEYS = ("host", "port", "dbname", "user", "password", "sslmode")


@dataclass(frozen=True)
class PoolBounds:
    """`max_size` connections per credential; an idle one closed after `max_idle` s; a step
    waits at most `wait` s for one (then `PoolTimeout`, retryable); a new connection may
    take `connect_timeout` s."""

    max_size: int = 4
    max_idle: float = 300.0
    wait: float = 30.0
    connect_timeout: float = 10.0

    @classmethod
    def of(cls, settings: Any) -> PoolBounds:
        return cls(
            max_size=settings.postgres_pool_max,
            max_idle=settings.postgres_pool_idle,
            wait=settings.postgres_pool_wait,
            connect_timeout=settings.postgres_connect_timeout,
        )


def conninfo(name: str, credential: dict[str, str]) -> str:
    """The libpq connection string of credential `name` (its password registered with the
    redactor first), with TCP keepalives unless it sets them. ToolFailure(CredentialInvalid)
    when it names no server or its dsn cannot be read; the message never quotes a value."""
    from psycopg import conninfo as ci

    params: dict[str, Any] = {}
    for key in ("dsn", "url"):
        raw = credential.get(key)
        if raw:
            try:
                params.update(ci.conninfo_to_dict(raw))
            except Exception:  # the parser's message quotes the text, password and all
                raise ToolFailure(
                    "CredentialInvalid",
                    f"credential {name!r}: key {key!r} is not a libpq connection string or postgresql:// URL",
                ) from None
            break
    for key, value in credential.items():
        key = _ALIASES.get(key, key)
        if key in _KEYS and value != "":
            params[key] = value
    for key, value in _KEEPALIVES.items():
        params.setdefault(key, value)
    password = params.get("password")
    if password:
        REDACTOR.add([str(password)])
    if not any(params.get(k) for k in ("host", "dbname", "user")):
        raise ToolFailure(
            "CredentialInvalid",
            f"credential {name!r} names no database: give `dsn` (or `url`), or `host`, `database`, `user`, `password`",
        )
    try:
        return ci.make_conninfo("", **params)
    except Exception:
        raise ToolFailure("CredentialInvalid", f"credential {name!r}: its keys make no connection string") from None


def _fingerprint(credential: dict[str, str]) -> str:
    return hashlib.sha256(repr(sorted(credential.items())).encode()).hexdigest()


_adapters: AdaptersMap | None = None


def adapters() -> AdaptersMap:
    """psycopg's adapters with the loaders of actors/tools/pgvalues.py (text in, JSON value
    out) and JSON parsed by the wire's parser: every pooled connection's context."""
    global _adapters
    if _adapters is None:
        import psycopg
        from psycopg.adapt import AdaptersMap, Loader
        from psycopg.types.json import set_json_loads

        from actors.wire.jsonvalues import loads

        made = AdaptersMap(psycopg.adapters)

        def text_loader(shape: Callable[[str], Any]) -> type[Loader]:
            class _Text(Loader):
                def load(self, data: Any) -> Any:
                    return shape(bytes(data).decode("utf-8"))

            return _Text

        for type_name, shape in pgvalues.TEXT_TYPES.items():
            made.register_loader(type_name, text_loader(shape))
        set_json_loads(loads, made)
        _adapters = made
    return _adapters


# what every pooled connection's session has (set when it is made, and again after a reset):
# the styles the text loaders of pgvalues expect, and the server's TCP keepalives on its
# side, so that a pod gone without a word (a partition, a node lost) is noticed by the
# server, which then ends the session and its locks
_SESSION = (
    "SET IntervalStyle = iso_8601; SET DateStyle = 'ISO, YMD'; SET tcp_keepalives_idle = 30;"
    " SET tcp_keepalives_interval = 10; SET tcp_keepalives_count = 3"
)
# after a transaction that ran a user's SQL, in the round trip of its COMMIT or ROLLBACK:
# what DISCARD ALL does (which a transaction block refuses), then `_SESSION` again.
# DEALLOCATE ALL also drops psycopg's prepared statements: psycopg sees its status and
# forgets them (its cache stays right)
_RESET = (
    "; RESET ALL; SET SESSION AUTHORIZATION DEFAULT; CLOSE ALL; UNLISTEN *; SELECT pg_advisory_unlock_all();"
    " DISCARD TEMP; DISCARD SEQUENCES; DEALLOCATE ALL; " + _SESSION
)
# a transaction's settings, in the round trip of its BEGIN (milliseconds, ints of ours:
# formatted in, so that it is one simple query): the step's timeout as the statement timeout
# (none: the role's or database's own stays), and a session left idle inside the transaction
# (its pod partitioned away, holding row and table locks) ended by the server past the step's
# timeout
_BEGIN = "BEGIN; SELECT set_config('idle_in_transaction_session_timeout', '%d', true)"
_BEGIN_TIMEOUT = _BEGIN + ", set_config('statement_timeout', '%d', true)"
# the margin over the step's timeout before an idle transaction is ended; without a timeout,
# the limit itself (our statements follow each other without pause)
_IDLE_MARGIN = 10.0
_IDLE_NO_TIMEOUT = 60.0
# how long a step waits for a connection before looking whether the credential was refused
_FIRST_WAIT = 2.0


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    """A new connection: autocommit, the session's settings (one round trip, once)."""
    await conn.set_autocommit(True)
    await conn.execute(_SESSION)


class PostgresPools:
    """The pools of one tool actor (one event loop), by credential name."""

    def __init__(self, bounds: PoolBounds | None = None) -> None:
        self.bounds = bounds or PoolBounds()
        self._pools: dict[str, tuple[str, AsyncConnectionPool[Any]]] = {}
        # the last reason a pool could not connect, by credential: the pool retries in the
        # background and a waiting step sees only its wait running out, which says why
        self._errors: dict[str, list[str]] = {}
        self._lock: asyncio.Lock | None = None
        self._closing: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._pools)

    async def pool(self, name: str, credential: dict[str, str]) -> AsyncConnectionPool[Any]:
        """Credential `name`'s pool (made now if it has none, or if its values changed)."""
        fp = _fingerprint(credential)
        held = self._pools.get(name)
        if held is not None and held[0] == fp:
            return held[1]
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            held = self._pools.get(name)
            if held is not None and held[0] == fp:
                return held[1]
            info = conninfo(name, credential)
            from psycopg_pool import AsyncConnectionPool

            b = self.bounds
            pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                info,
                connection_class=_recording(self._errors.setdefault(name, [])),
                kwargs={"context": adapters(), "connect_timeout": max(1, round(b.connect_timeout))},
                configure=_configure,
                min_size=0,  # connections made as steps need them, closed after max_idle
                max_size=b.max_size,
                max_idle=b.max_idle,
                timeout=b.wait,
                name=f"postgres:{name}",
                open=False,
            )
            await pool.open(wait=False)
            if held is not None:  # rotated: the old pool goes (connections in use close when returned)
                task = asyncio.get_running_loop().create_task(held[1].close(timeout=5.0))
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
            self._pools[name] = (fp, pool)
            return pool

    @asynccontextmanager
    async def connection(
        self, name: str, credential: dict[str, str], *, deadline: float | None = None
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection of credential `name`, given back (rolled back if a transaction
        was left open, discarded if broken) on exit. Failures as `ToolFailure` (`pg_failure`).
        `deadline` (the event loop's clock): the step's end, before which a step that gets no
        connection fails `PoolTimeout` (or `CredentialInvalid`) saying why, rather than
        running into its own timeout without a reason."""
        pool = await self.pool(name, credential)
        wait = self.bounds.wait
        if deadline is not None:
            left = deadline - asyncio.get_running_loop().time()
            wait = max(0.01, min(wait, left - min(0.5, left * 0.1)))
        try:
            try:
                conn = await pool.getconn(timeout=min(wait, _FIRST_WAIT))
            except Exception as exc:
                if not _is_pool_timeout(exc) or wait <= _FIRST_WAIT or _refused(self._errors.get(name)):
                    raise
                # no connection yet, and not for a refused credential: wait the rest
                conn = await pool.getconn(timeout=wait - _FIRST_WAIT)
        except Exception as exc:
            raise self._failure(exc, name) from None
        try:
            yield conn
        except ToolFailure:
            raise
        except Exception as exc:
            failure = pg_failure(exc, name)
            if failure is None:
                raise
            raise failure from None
        finally:
            await pool.putconn(conn)

    def _failure(self, exc: BaseException, name: str) -> BaseException:
        failure = pg_failure(exc, name)
        if failure is None:
            return exc
        last = self._errors.get(name)
        if failure.type == "PoolTimeout" and last:
            if _refused(last):
                why = f"postgres credential {name!r}: the server refused it: {last[0]}"
                return ToolFailure("CredentialInvalid", why)
            failure.message += f"; the last connection attempt failed: {last[0]}"
        return failure

    @asynccontextmanager
    async def transaction(
        self,
        name: str,
        credential: dict[str, str],
        *,
        timeout: float | None,
        deadline: float | None = None,
        reset: bool = False,
        first: Callable[[psycopg.AsyncConnection[Any]], str] | None = None,
        first_rows: list[Any] | None = None,
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """One command's transaction on a pooled connection: committed when the block ends,
        rolled back when it raises or is cancelled (then the connection goes back to the
        pool idle, or is discarded when the server dropped it). `timeout` (seconds, None:
        none) is the transaction's `statement_timeout`; `deadline` bounds the wait for a
        connection (`connection`); `reset`: the block ran SQL not ours, the session is
        reset as it ends (`_RESET`). `first`: the transaction's first statement, made on the
        connection as text with its values in it (client-side binding: `AsyncClientCursor.mogrify`),
        sent with the BEGIN in the same round trip; its rows go to `first_rows`."""
        idle = _IDLE_NO_TIMEOUT if timeout is None else timeout + _IDLE_MARGIN
        if timeout is None:
            begin = _BEGIN % int(idle * 1000)
        else:
            begin = _BEGIN_TIMEOUT % (int(idle * 1000), max(1, int(timeout * 1000)))
        after = _RESET if reset else ""
        async with self.connection(name, credential, deadline=deadline) as conn:
            # BEGIN, the settings and the first statement in one round trip (psycopg's own
            # transaction sends its BEGIN alone): the connection is in autocommit
            # (`_configure`), the transaction ours
            try:
                query = begin if first is None else f"{begin}; {first(conn)}"
                cur = await conn.execute(query)  # no parameters: one simple query, its statements in turn
                if first_rows is not None:
                    while cur.nextset():  # BEGIN's, the settings', then the first statement's
                        pass
                    first_rows[:] = await cur.fetchall()
                yield conn
            except BaseException:
                await _end(conn, "ROLLBACK" + after)
                raise
            try:
                await conn.execute("COMMIT" + after)
            except BaseException:  # a deferred constraint, the connection lost: the reset is still owed
                await _end(conn, "ROLLBACK" + after)
                raise

    async def close(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        for _, pool in pools:
            await pool.close(timeout=5.0)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


async def _end(conn: psycopg.AsyncConnection[Any], statements: str) -> None:
    """Roll back (and reset); a connection that cannot is closed, so that the pool drops it
    rather than hand out a session in an unknown state."""
    try:
        await conn.execute(statements)
    except Exception:
        with contextlib.suppress(Exception):
            await conn.close()


def _is_pool_timeout(exc: BaseException) -> bool:
    import psycopg_pool

    return isinstance(exc, psycopg_pool.PoolTimeout)


def _refused(last: list[str] | None) -> bool:
    """Whether the pool's last connection attempt was refused for the credential itself."""
    return bool(last) and _CREDENTIAL_REFUSED.search(last[0]) is not None  # type: ignore[index]


def _recording(box: list[str]) -> type[psycopg.AsyncConnection[Any]]:
    """A connection class that keeps in `box` why its last connect failed."""
    import psycopg

    class _Recording(psycopg.AsyncConnection[Any]):
        @classmethod
        async def connect(cls, *args: Any, **kwargs: Any) -> Any:
            try:
                conn = await super().connect(*args, **kwargs)
            except psycopg.Error as exc:
                box[:] = [safe_str(exc)]
                raise
            box.clear()
            return conn

    return _Recording


def pg_failure(exc: BaseException, name: str) -> ToolFailure | None:
    """`exc` (from psycopg or its pool) as a ToolFailure; None when it is neither's."""
    import psycopg
    import psycopg_pool

    if isinstance(exc, psycopg_pool.PoolTimeout):
        return ToolFailure(
            "PoolTimeout",
            f"postgres credential {name!r}: no connection free or made within the pool's wait: {safe_str(exc)}",
            retryable=True,
        )
    if isinstance(exc, psycopg_pool.PoolClosed):
        return ToolFailure("ConnectionError", f"postgres credential {name!r}: pool closed", retryable=True)
    if not isinstance(exc, psycopg.Error):
        return None
    state = exc.sqlstate
    diag = exc.diag
    text = (diag.message_primary if state else None) or safe_str(exc) or type(exc).__name__
    if state and diag.message_detail:
        text = f"{text} ({diag.message_detail})"
    if state is None or state.startswith("08") or state in _CONNECTION_STATES:
        if state is None and not isinstance(exc, psycopg.OperationalError):
            # the driver's own: a programming error (a parameter the args lack, a closed cursor)
            return ToolFailure(type(exc).__name__, text)
        where = f"SQLSTATE {state}: " if state else ""
        return ToolFailure("ConnectionError", f"postgres credential {name!r}: {where}{text}", retryable=True)
    if state == "57014":  # query_canceled: our statement_timeout, or someone's pg_cancel_backend
        timed_out = "statement timeout" in text
        return ToolFailure(
            "Timeout" if timed_out else "QueryCanceled",
            f"SQLSTATE {state}: {text}",
            retryable=True,
        )
    return ToolFailure(type(exc).__name__, f"SQLSTATE {state}: {text}", retryable=state in _RETRYABLE_STATES)
