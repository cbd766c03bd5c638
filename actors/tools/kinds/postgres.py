"""The `postgres` kind: SQL on a pooled connection of the tool's credential
(actors/tools/pgpool.py), one transaction per call, values as JSON (actors/tools/pgvalues.py).

Fields: ``query`` (a statement, or a list of them run in order in the same transaction;
taken as written, never rendered), ``credential`` (a name) or ``auth: {type: postgres,
credential: NAME}``, ``max_rows`` (default 10,000). Parameters ``%(name)s`` are bound by
the driver from the step's args (a mapping or a list of mappings as jsonb, a list as an
array), given only to the statements that name one; a statement with no ``%(`` is sent
as written (a literal ``%`` needs no escaping there; in one with parameters it is
``%%``), and then a string may hold several statements separated by ``;``.

Result: the last statement's. Rows: ``{"rows": [{column: value}], "row_count": n,
"columns": [{"name", "type"}]}`` (as the duckdb kind's; the type as Postgres names it,
`type_names`); a command without rows (INSERT, UPDATE, DDL): ``{"row_count": n,
"status": "INSERT 0 5"}``. Rows are read in chunks (`CHUNK`, libpq's chunked mode) and
converted as they come, the event loop running between two; more rows than ``max_rows``
fail the call ``TooManyRows`` (not retryable), never read whole first: nothing is cut
silently.

A tool with ``table`` instead of ``query`` writes rows (append, upsert, replace) in bulk,
and a ``query`` with ``once: true`` is recorded like a write: both go through
actors/tools/pgwrite.py, which keeps the exactly-once ledger.

The call's timeout is the transaction's ``statement_timeout`` and bounds the call
(waiting for a connection included); on timeout or cancel the running statement is
cancelled on the server, the transaction rolled back and the connection given back, its
session reset (pgpool: what a query changed in it never reaches another step).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from actors.tools import pgwrite
from actors.tools.call import ToolCall
from actors.tools.failures import ToolFailure, result_json
from actors.tools.limits import limited
from actors.tools.pgvalues import row_values

__all__ = ["CHUNK", "DEFAULT_MAX_ROWS", "credential_name", "run_postgres", "statements", "type_names"]

DEFAULT_MAX_ROWS = 10_000


async def run_postgres(call: ToolCall) -> bytes:
    # the call's end: the wait for a connection stops before it, saying why (pgpool)
    deadline = None if call.limit is None else asyncio.get_running_loop().time() + call.limit
    if call.tool.get("table") is not None:  # a table write (actors/tools/pgwrite.py), always once per command
        if call.tool.get("query"):
            raise ToolFailure("ToolConfigError", "postgres tool has both `query` and `table`: give one")
        name = credential_name(call.tool)
        credential = call.credential if call.tool.get("credential") else call.resources.credentials.resolve(name)
        assert credential is not None
        write = pgwrite.write_table(call, name, credential, deadline=deadline)
        return await limited(write, call.limit, call.cancel)
    queries = statements(call.tool.get("query"))
    max_rows = _max_rows(call.tool.get("max_rows"))
    name = credential_name(call.tool)
    credential = call.credential if call.tool.get("credential") else call.resources.credentials.resolve(name)
    assert credential is not None
    # the parameters go to the statements that name one: another is sent as written
    # (a literal % in it needs no escaping, and it may hold several statements)
    params = _params(call.args) if any("%(" in q for q in queries) else None
    once = call.tool.get("once", False)
    if not isinstance(once, bool):
        raise ToolFailure("ToolConfigError", f"postgres `once` must be true or false, got {once!r}")
    if once:  # the statements and the ledger row in one transaction (actors/tools/pgwrite.py)
        body = lambda conn: _statements(conn, queries, params, max_rows)  # noqa: E731
        return await limited(pgwrite.once(call, name, credential, body, deadline=deadline), call.limit, call.cancel)
    work = _run(call, name, credential, queries, params, max_rows, deadline)
    return result_json(await limited(work, call.limit, call.cancel))


def statements(query: Any) -> list[str]:
    """The tool's `query`: one statement, or a list of them (ToolConfigError otherwise)."""
    items = query if isinstance(query, list) else [query]
    if not items or not all(isinstance(q, str) and q.strip() for q in items):
        raise ToolFailure("ToolConfigError", "postgres tool needs a `query`: SQL text, or a list of statements")
    return items


def credential_name(tool: dict[str, Any]) -> str:
    """The credential a postgres tool (or sink) names: ``credential``, or the design
    documents' ``auth: {type: postgres, credential: NAME}``."""
    name = tool.get("credential")
    auth = tool.get("auth")
    if auth is not None:
        if not isinstance(auth, dict) or not isinstance(auth.get("credential"), str):
            raise ToolFailure("ToolConfigError", "postgres `auth` must be {type: postgres, credential: NAME}")
        if auth.get("type", "postgres") != "postgres":
            raise ToolFailure("ToolConfigError", f"postgres `auth.type` must be postgres, got {auth.get('type')!r}")
        if name is not None and name != auth["credential"]:
            raise ToolFailure("ToolConfigError", "postgres tool names a `credential` and an `auth`: use one")
        name = auth["credential"]
    if not isinstance(name, str) or not name:
        raise ToolFailure(
            "ToolConfigError", "postgres tool needs a `credential` (or `auth: {type: postgres, credential: NAME}`)"
        )
    return name


def _max_rows(value: Any) -> int:
    if value is None:
        return DEFAULT_MAX_ROWS
    try:
        if isinstance(value, bool):
            raise ValueError
        n = int(value)
    except (TypeError, ValueError):
        raise ToolFailure("ToolConfigError", f"postgres max_rows must be a whole number, got {value!r}") from None
    if n < 0:
        raise ToolFailure("ToolConfigError", f"postgres max_rows must be 0 or more, got {n}")
    return n


def _param(v: Any) -> Any:
    from psycopg.types.json import Jsonb

    if isinstance(v, dict) or (isinstance(v, list) and any(isinstance(x, dict | list) for x in v)):
        return Jsonb(v)  # a mapping, or a list of mappings or lists: one jsonb value, not an array
    return v


def _params(args: dict[str, Any]) -> dict[str, Any]:
    return {k: _param(v) for k, v in args.items()}


async def _run(
    call: ToolCall,
    name: str,
    credential: dict[str, str],
    queries: list[str],
    params: dict[str, Any] | None,
    max_rows: int,
    deadline: float | None,
) -> dict[str, Any]:
    pools = call.resources.postgres
    async with pools.transaction(name, credential, timeout=call.limit, deadline=deadline, reset=True) as conn:
        return await _statements(conn, queries, params, max_rows)


# rows a result is read in from the server (libpq's chunked mode) and converted in, the
# event loop given back between two: a big result neither sits whole in memory before
# max_rows is checked, nor holds the pod's loop while it is converted
CHUNK = 1000


async def _statements(conn: Any, queries: list[str], params: dict[str, Any] | None, max_rows: int) -> dict[str, Any]:
    """The statements on `conn`, in its transaction: the last one's result."""
    import psycopg

    cur = conn.cursor()
    result: _Result | None = None
    for i, query in enumerate(queries):
        given = params if "%(" in query else None
        try:
            result = await _stream(conn, cur, query.encode(), given, max_rows, keep=i == len(queries) - 1)
        except KeyError as exc:  # psycopg: a %(name)s the args lack
            raise ToolFailure(
                "ToolConfigError", f"postgres query names the parameter {exc.args[0]!r}, which the step's args lack"
            ) from None
        except TypeError as exc:
            raise ToolFailure("ToolConfigError", f"postgres parameters: {exc}") from None
        except psycopg.ProgrammingError as exc:
            if exc.sqlstate is not None:
                raise
            # the driver's own, before anything is sent: a parameter missing, a bad placeholder
            raise ToolFailure("ToolConfigError", f"postgres query: {exc}") from None
    assert result is not None
    return await result.value(conn, max_rows)


class _Result:
    """One statement's result as it was read: rows (with their columns) or a status."""

    def __init__(self) -> None:
        self.status: str | None = None
        self.row_count = 0
        self.names: list[str] | None = None  # None: a statement without rows
        self.oids: list[int] = []
        self.rows: list[dict[str, Any]] = []
        self.complete = True  # False: the read stopped past max_rows (count at least)

    def describe(self, res: Any) -> None:
        self.names = [(res.fname(i) or b"").decode() for i in range(res.nfields)]
        self.oids = [res.ftype(i) for i in range(res.nfields)]

    async def value(self, conn: Any, max_rows: int) -> dict[str, Any]:
        if self.names is None:
            return {"row_count": self.row_count, "status": self.status}
        if self.row_count > max_rows:
            many = f"{self.row_count}" if self.complete else f"more than {max_rows}"
            raise ToolFailure(
                "TooManyRows",
                f"postgres query returned {many} rows, over max_rows {max_rows}: add a LIMIT, or raise max_rows",
            )
        _distinct(self.names)
        names = await type_names(conn, self.oids)
        described = [{"name": n, "type": t} for n, t in zip(self.names, names, strict=True)]
        return {"rows": self.rows, "row_count": len(self.rows), "columns": described}


async def _stream(
    conn: Any, cur: Any, query: bytes, params: dict[str, Any] | None, max_rows: int, *, keep: bool
) -> _Result:
    """One item of `query` sent and its results read in chunks of `CHUNK` rows (a string
    without parameters may hold several statements: the last one's result). Rows are
    converted as they come, up to `max_rows` (`keep`: else only counted); past it they are
    counted and dropped, and the last item's statement with parameters (one only: the
    extended protocol) is cancelled there.

    psycopg's `execute` reads a whole result before it returns and its `stream` takes one
    statement that returns rows: this is its `stream` (the cursor's own steps to send a
    query, libpq's chunked mode where libpq has it) with statuses and several results."""
    from psycopg import capabilities, pq
    from psycopg.generators import fetch, send

    pgconn = conn.pgconn
    status = pq.ExecStatus
    stop_early = keep and params is not None
    done: _Result | None = None
    current = _Result()
    async with conn.lock:

        def sending() -> Any:
            yield from cur._start_query(query)
            cur._execute_send(cur._convert_query(query, params), binary=False)
            if capabilities.has_stream_chunked():
                pgconn.set_chunked_rows_mode(CHUNK)
            else:  # libpq before 17: a row at a time
                pgconn.set_single_row_mode()
            yield from send(pgconn)

        await conn.wait(sending())
        try:
            while (res := await conn.wait(fetch(pgconn))) is not None:
                state = res.status
                if state == status.TUPLES_CHUNK or state == status.SINGLE_TUPLE:
                    first = current.names is None
                    if first:  # the first rows of a statement
                        current.describe(res)
                    n = res.ntuples
                    current.row_count += n
                    if current.row_count > max_rows:
                        current.rows = []
                        if stop_early:
                            current.complete = False
                            break  # the finally cancels it
                    elif keep:
                        cur._tx.set_pgresult(res, set_loaders=first)
                        names = current.names
                        assert names is not None
                        current.rows += [
                            dict(zip(names, row_values(r), strict=True)) for r in cur._tx.load_rows(0, n, tuple)
                        ]
                    await asyncio.sleep(0)  # the loop's other work between two chunks
                elif state == status.TUPLES_OK:  # a statement's rows end (or it had none)
                    if current.names is None:
                        current.describe(res)
                    done, current = current, _Result()
                elif state == status.COMMAND_OK or state == status.EMPTY_QUERY:
                    current.status = (res.command_status or b"").decode() or None
                    current.row_count = max(res.command_tuples or 0, 0)
                    done, current = current, _Result()
                elif state == status.FATAL_ERROR:  # the rest of the results read, then raised
                    await _drain(conn)
                    cur._raise_for_result(res)
                else:  # COPY ... STDIN / STDOUT: not through a query (the connection is dropped)
                    await conn.close()
                    raise ToolFailure("ToolConfigError", "postgres query: COPY to or from the client is not supported")
        finally:
            if not conn.closed and pgconn.transaction_status == pq.TransactionStatus.ACTIVE:
                # stopped early (over max_rows, cancelled, timed out): the server stops the
                # statement, and what it sent already is read, so the connection is usable
                await conn._try_cancel()
                with contextlib.suppress(Exception):
                    await _drain(conn)
    return current if done is None else done


async def _drain(conn: Any) -> None:
    """Read the results left of a query (a COPY's state cannot be left so: closed)."""
    from psycopg import pq
    from psycopg.generators import fetch

    copying = (pq.ExecStatus.COPY_IN, pq.ExecStatus.COPY_OUT, pq.ExecStatus.COPY_BOTH)
    while (res := await conn.wait(fetch(conn.pgconn))) is not None:
        if res.status in copying:
            await conn.close()
            return


def _distinct(columns: list[str]) -> None:
    if len(set(columns)) < len(columns):
        twice = sorted({c for c in columns if columns.count(c) > 1})
        raise ToolFailure(
            "ToolConfigError", f"postgres query returns two columns named {twice[0]!r}: give them distinct names (AS)"
        )


# Postgres' names of types by oid (`format_type`, as `\d` shows them): the driver knows the
# built-in ones; others (void, enums, domains, composites: a database's own) are asked for
_BUILTIN_NAMES: dict[int, str] = {}
_FIRST_USER_OID = 16384


async def type_names(conn: Any, oids: list[int]) -> list[str]:
    """Each oid's type as Postgres names it: ``integer``, ``timestamp with time zone``,
    ``numeric[]``; a type the driver does not know is asked for in one round trip."""
    registry = conn.adapters.types
    names: dict[int, str] = {}
    unknown = []
    for oid in oids:
        if oid in names:
            continue
        known = _BUILTIN_NAMES.get(oid)
        if known is None:
            info = registry.get(oid)
            if info is not None:
                known = info.regtype + ("[]" if oid == info.array_oid and oid != info.oid else "")
        if known is None:
            unknown.append(oid)
        else:
            names[oid] = known
    if unknown:
        cur = await conn.execute("SELECT o::oid, format_type(o::oid, NULL) FROM unnest(%s::oid[]) AS o", (unknown,))
        for oid, text in await cur.fetchall():
            names[int(oid)] = str(text)
            if int(oid) < _FIRST_USER_OID:
                _BUILTIN_NAMES[int(oid)] = str(text)
    return [names.get(oid, str(oid)) for oid in oids]
