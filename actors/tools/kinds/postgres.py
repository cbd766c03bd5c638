"""The `postgres` kind: SQL on a pooled connection of the tool's credential
(actors/tools/pgpool.py), one transaction per call, values as JSON (actors/tools/pgvalues.py).

Fields: ``query`` (a statement, or a list of them run in order in the same transaction;
taken as written, never rendered), ``credential`` (a name) or ``auth: {type: postgres,
credential: NAME}``, ``max_rows`` (default 10,000). Parameters ``%(name)s`` are bound by
the driver from the step's args (a mapping or a list of mappings as jsonb, a list as an
array); a statement with no ``%(`` is sent as written (a literal ``%`` needs no escaping
there; in one with parameters it is ``%%``), and then a string may hold several
statements separated by ``;``.

Result: the last statement's. Rows: ``{"rows": [{column: value}], "row_count": n,
"columns": [{"name", "type"}]}`` (as the duckdb kind's); a command without rows (INSERT, UPDATE, DDL):
``{"row_count": n, "status": "INSERT 0 5"}``. More rows than ``max_rows`` fail the call
``TooManyRows`` (not retryable): nothing is cut silently.

A tool with ``table`` instead of ``query`` writes rows (append, upsert, replace) in bulk,
and a ``query`` with ``once: true`` is recorded like a write: both go through
actors/tools/pgwrite.py, which keeps the exactly-once ledger.

The call's timeout is the transaction's ``statement_timeout`` and bounds the call
(waiting for a connection included); on timeout or cancel the running statement is
cancelled on the server, the transaction rolled back and the connection given back.
"""

from __future__ import annotations

from typing import Any

from actors.tools import pgwrite
from actors.tools.call import ToolCall
from actors.tools.failures import ToolFailure, result_json
from actors.tools.limits import limited
from actors.tools.pgvalues import row_values

__all__ = ["DEFAULT_MAX_ROWS", "credential_name", "run_postgres", "statements"]

DEFAULT_MAX_ROWS = 10_000


async def run_postgres(call: ToolCall) -> bytes:
    if call.tool.get("table") is not None:  # a table write (actors/tools/pgwrite.py), always once per command
        if call.tool.get("query"):
            raise ToolFailure("ToolConfigError", "postgres tool has both `query` and `table`: give one")
        name = credential_name(call.tool)
        credential = call.credential if call.tool.get("credential") else call.resources.credentials.resolve(name)
        assert credential is not None
        return await limited(pgwrite.write_table(call, name, credential), call.limit, call.cancel)
    queries = statements(call.tool.get("query"))
    max_rows = _max_rows(call.tool.get("max_rows"))
    name = credential_name(call.tool)
    credential = call.credential if call.tool.get("credential") else call.resources.credentials.resolve(name)
    assert credential is not None
    params = _params(call.args) if any("%(" in q for q in queries) else None
    once = call.tool.get("once", False)
    if not isinstance(once, bool):
        raise ToolFailure("ToolConfigError", f"postgres `once` must be true or false, got {once!r}")
    if once:  # the statements and the ledger row in one transaction (actors/tools/pgwrite.py)
        body = lambda conn: _statements(conn, queries, params, max_rows)  # noqa: E731
        return await limited(pgwrite.once(call, name, credential, body), call.limit, call.cancel)
    work = _run(call, name, credential, queries, params, max_rows)
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
) -> dict[str, Any]:
    async with call.resources.postgres.transaction(name, credential, timeout=call.limit) as conn:
        return await _statements(conn, queries, params, max_rows)


async def _statements(conn: Any, queries: list[str], params: dict[str, Any] | None, max_rows: int) -> dict[str, Any]:
    """The statements on `conn`, in its transaction: the last one's result."""
    import psycopg

    cur = conn.cursor()
    for query in queries:
        try:
            await cur.execute(query.encode(), params)
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
    while cur.nextset():  # several statements in one string: the last one's result
        pass
    return await _result(cur, max_rows)


async def _result(cur: Any, max_rows: int) -> dict[str, Any]:
    if cur.description is None:
        return {"row_count": max(cur.rowcount, 0), "status": cur.statusmessage}
    if cur.rowcount > max_rows:
        raise ToolFailure(
            "TooManyRows",
            f"postgres query returned {cur.rowcount} rows, over max_rows {max_rows}: add a LIMIT, or raise max_rows",
        )
    columns = [c.name for c in cur.description]
    if len(set(columns)) < len(columns):
        twice = sorted({c for c in columns if columns.count(c) > 1})
        raise ToolFailure(
            "ToolConfigError", f"postgres query returns two columns named {twice[0]!r}: give them distinct names (AS)"
        )
    rows = [dict(zip(columns, row_values(r), strict=True)) for r in await cur.fetchall()]
    # as the duckdb kind gives them: a name and the database's name of its type
    described = [{"name": c.name, "type": c.type_display} for c in cur.description]
    return {"rows": rows, "row_count": len(rows), "columns": described}
