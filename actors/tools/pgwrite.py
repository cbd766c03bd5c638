"""Table writes of the `postgres` kind (a tool with `table` instead of `query`), and the
ledger that makes a write, or a `query` with `once: true`, happen once per command.

A write takes its rows from the arg `rows` (a mapping is one row, a list of mappings is
rows); a sink given no args writes the result of the step's tool it follows. Columns:
the tool's `columns`, else the union of the rows' keys in the order first seen; either
way checked against the table's columns in the catalog, an unknown one a
ToolConfigError naming it. Modes, all in the command's one transaction:

- ``append``: COPY the rows in;
- ``upsert``: COPY into a temporary table (each row with its place in the write), then
  ``INSERT ... SELECT ... ON CONFLICT (key) DO UPDATE`` the other columns (``DO NOTHING``
  when every column is a key column); two rows of one key in a write: the last wins, keys
  compared by Postgres (``5`` and ``"5"`` are one integer key), and a key holding a NULL
  equal to none. `key` needs a unique index on those columns;
- ``replace``: lock the table against other writers (``SHARE ROW EXCLUSIVE``: readers go
  on and see the old rows until the commit), ``DELETE`` every row, COPY the rows in.

Names (`table`, a schema-qualified ``schema.table`` too, `columns`, `key`, `ledger`) are
quoted by the driver (``psycopg.sql.Identifier``), never formatted into SQL; a name that
itself holds a dot cannot be written. Values: into a json or jsonb column, the value as
JSON (a string too); into an array column, a list as the array; a mapping or a list into
any other column, its JSON text; anything else as its text, parsed by the column's type
(``"2024-01-02T03:04:05Z"`` into a timestamptz, ``"12.50"`` into a numeric); into a
bytea column, base64 text (what a step reads from one); null as NULL, and a key a row
lacks as NULL too (not the column's default). Rows are formatted `WRITE_CHUNK` at a time,
the event loop running between two. Result:
``{"table", "mode", "row_count"}``.

The ledger (`actors_ledger`, or the tool's `ledger:`, made by the first write that needs
it; its schema looked up then and named in every statement on it; made again within
the call when it was dropped since) has one row per write, keyed by the command's identity (actors/tools/call.py
`CommandIdentity`: execution id, command id, iteration index (-1 outside a loop), and
`run`: the step's tool or its sink), holding the result. The row is inserted first in
the write's transaction: a second delivery of the command finds it (or waits for the
first's transaction to end, then finds it), commits nothing more and returns the stored
result. docs/language.md ("Exactly once") says what that guarantees and what not.

`write_appends`: the appends of a chunk's items (one table, one credential, one ledger)
as ONE transaction (actors/tools/chunksinks.py decides when): one statement claims every
item's own ledger row (a redelivered chunk finds, per item, what the first delivery
committed) and reads the catalog, one COPY takes the rows of the items claimed, one
COMMIT. Any failure rolls all of it back; the caller then writes the items one by one.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import copy
import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from actors.tools import failpoints
from actors.tools.call import CommandIdentity, ToolCall
from actors.tools.failures import ToolFailure, result_json

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

__all__ = [
    "DEFAULT_LEDGER",
    "MODES",
    "WRITE_CHUNK",
    "Prepared",
    "bytea_value",
    "copy_text",
    "once",
    "prepared",
    "row_count",
    "shape",
    "table_names",
    "write_appends",
    "write_table",
]

DEFAULT_LEDGER = "actors_ledger"
MODES = ("append", "upsert", "replace")
_TEMP = "_actors_upsert"
_ORDINAL = "_actors_upsert_n"  # the staged rows' place in the write

# the table's columns: (oid, name, base type name, type category, position); a missing
# table gives one row with a null oid
_COLUMNS = """
SELECT r.oid, a.attname, b.typname, b.typcategory, a.attnum
FROM (SELECT to_regclass(%s)::oid AS oid) r
LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_catalog.pg_type b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
"""

# ledgers known to exist, by (credential, ledger as the tool names it): their schema and name
_LEDGERS: dict[tuple[str, str], tuple[str, str]] = {}

T = TypeVar("T")
Body = Callable[["psycopg.AsyncConnection[Any]"], Awaitable[Any]]


def table_names(value: Any, field: str) -> tuple[str, ...]:
    """`table` (or `ledger`) as its parts: ``name`` or ``schema.name``."""
    parts = tuple(value.split(".")) if isinstance(value, str) else ()
    if not 1 <= len(parts) <= 2 or not all(p.strip() for p in parts):
        raise ToolFailure("ToolConfigError", f"postgres `{field}` must be a table name or schema.table, got {value!r}")
    return parts


def _names(value: Any, field: str) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
        raise ToolFailure("ToolConfigError", f"postgres `{field}` must be a list of column names, got {value!r}")
    if len(set(value)) < len(value):
        raise ToolFailure("ToolConfigError", f"postgres `{field}` names a column twice: {value!r}")
    return list(value)


def _rows(call: ToolCall) -> list[dict[str, Any]]:
    if "rows" in call.args:
        value = call.args["rows"]
    elif not call.args and call.identity is not None and call.identity.run == "sink":
        value = call.result  # a sink without args writes the result it follows
    else:
        raise ToolFailure(
            "ToolConfigError",
            "a postgres table write takes its rows from the arg `rows` (a mapping, or a list of mappings)",
        )
    rows = [value] if isinstance(value, dict) else value
    if not isinstance(rows, list):
        raise ToolFailure(
            "ToolConfigError", f"postgres rows must be a mapping or a list of mappings, got {value!r}"[:300]
        )
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ToolFailure("ToolConfigError", f"postgres rows[{i}] is not a mapping: {row!r}"[:300])
    return rows


class _Write:
    """A table write's settings, checked before any connection is taken."""

    def __init__(self, call: ToolCall) -> None:
        tool = call.tool
        self.table_text = str(tool.get("table"))
        self.table = table_names(tool.get("table"), "table")
        self.mode = tool.get("mode", "append")
        if self.mode not in MODES:
            raise ToolFailure(
                "ToolConfigError", f"postgres `mode` must be one of {', '.join(MODES)}, got {self.mode!r}"
            )
        self.key = _names(tool.get("key"), "key")
        if self.mode == "upsert" and self.key is None:
            raise ToolFailure("ToolConfigError", "postgres mode upsert needs `key`: the columns of a unique index")
        if self.mode != "upsert" and self.key is not None:
            raise ToolFailure("ToolConfigError", f"postgres `key` is for mode upsert, not {self.mode}")
        self.columns = _names(tool.get("columns"), "columns")
        self.rows = _rows(call)
        if self.columns is None:
            seen: dict[str, None] = {}
            for row in self.rows:
                seen.update(dict.fromkeys(row))
            self.columns = list(seen)
        for k in self.key or ():
            if k not in self.columns:
                raise ToolFailure(
                    "ToolConfigError", f"postgres upsert key column {k!r} is not among the columns written"
                )

    def result(self, count: int) -> dict[str, Any]:
        return {"table": self.table_text, "mode": self.mode, "row_count": count}


Prepared = _Write  # what `prepared` gives: its table, mode, columns and rows


async def write_table(call: ToolCall, name: str, credential: dict[str, str], *, deadline: float | None = None) -> bytes:
    """A table write (the module docstring) in one transaction of credential `name`, once
    per command: its result's JSON text, or the first delivery's."""
    w = _Write(call)  # the settings and rows checked before a connection is taken
    identity = call.identity
    pools = call.resources.postgres
    # append and replace know their result before writing: the ledger row holds it from
    # the start (one statement fewer); upsert's count comes from the server
    upfront = None if w.mode == "upsert" else result_json(w.result(row_count(w)))

    async def attempt(ledger: tuple[str, ...] | None) -> bytes:
        found: list[Any] = []
        first = functools.partial(_claim_and_columns, w=w, ledger=ledger, identity=identity, result=upfront)
        try:
            async with pools.transaction(
                name, credential, timeout=call.limit, deadline=deadline, first=first, first_rows=found
            ) as conn:
                claimed, kinds = await _claimed(conn, w, ledger, identity, found)
                if isinstance(claimed, bytes):
                    return claimed  # delivered before and committed: nothing more is written
                count = await _write(conn, w, kinds)
                text = upfront if upfront is not None else result_json(w.result(count))
                if upfront is None and ledger is not None:
                    assert identity is not None
                    await _record(conn, ledger, identity, text)
        except ToolFailure as f:
            if f.type == "UndefinedTable" and ledger is not None and not found:
                raise _ledger_missing(name, ledger) from None  # the claim's: only the ledger can be missing
            raise
        return text

    text = await _with_ledger(call, name, credential, deadline, attempt)
    if failpoints.ARMED:  # test-only (actors/tools/failpoints.py): committed, not yet answered
        failpoints.reached("postgres.committed")
    return text


def prepared(call: ToolCall) -> Prepared:
    """A table write's settings and rows, checked as `write_table` checks them before a
    connection is taken (raises the `ToolFailure` it would): for `write_appends`, and for
    its caller to group the items by table and columns (actors/tools/chunksinks.py)."""
    return _Write(call)


def shape(w: Prepared) -> tuple[Any, ...]:
    """What the writes `write_appends` takes together must share: mode, table, column set
    (in any order: COPY takes each row's by name; a column one item leaves out would get
    NULL in the common COPY, not the default its own write gives)."""
    return w.mode, w.table, frozenset(w.columns or ())


def row_count(w: Prepared) -> int:
    return len(w.rows) if w.columns else 0


async def write_appends(
    calls: list[ToolCall],
    writes: list[Prepared],
    name: str,
    credential: dict[str, str],
    *,
    deadline: float | None = None,
) -> list[bytes]:
    """Appends of several items of one command (a chunk's iterations: one execution, command
    and run, each its own `iteration_index`) into one table, with one ledger, as ONE
    transaction of credential `name`: each item's result's JSON text (the first delivery's
    for an item claimed before). `writes`: the calls' `prepared` writes, of one `shape`.
    The transaction's timeout is the first call's `limit`. Raises `ToolFailure` for the
    whole: nothing of it is committed then (the caller writes the items one by one,
    actors/tools/chunksinks.py)."""
    first = writes[0]
    identities = [c.identity for c in calls]
    if any(i is None for i in identities):
        raise ToolFailure("ToolConfigError", "postgres appends are written together only for a command's items")
    keys = [_key(i) for i in identities if i is not None]
    if len({k[:2] + k[3:] for k in keys}) != 1 or len({k[2] for k in keys}) != len(keys):
        raise ToolFailure("ToolConfigError", "postgres appends written together must be one command's items")
    if first.mode != "append" or len({shape(w) for w in writes}) != 1:
        raise ToolFailure("ToolConfigError", "postgres appends written together must be of one table and columns")
    # append knows its result before writing: each ledger row holds its item's from the start
    results = [result_json(w.result(row_count(w))) for w in writes]
    pools = calls[0].resources.postgres

    async def attempt(ledger: tuple[str, ...] | None) -> list[bytes]:
        assert ledger is not None  # every item has a command
        found: list[Any] = []
        claims = functools.partial(_claims_and_columns, w=first, ledger=ledger, keys=keys, results=results)
        try:
            async with pools.transaction(
                name, credential, timeout=calls[0].limit, deadline=deadline, first=claims, first_rows=found
            ) as conn:
                claimed = {int(n) for n in str(found[0][0] or "").split(",") if n}
                texts = list(results)
                late = [k for k, key in enumerate(keys) if key[2] not in claimed]
                if late:  # delivered before and committed (or by a delivery that just committed)
                    stored = await _stored_many(conn, ledger, [keys[k] for k in late])
                    for k in late:
                        texts[k] = stored[keys[k][2]]
                if claimed:  # as `write_table` checks an item it claims: the table, its columns (no rows too)
                    if found[0][1] is None:
                        raise ToolFailure(
                            "UndefinedTable", f"postgres table {first.table_text!r} does not exist (or is not visible)"
                        )
                    kinds = {col: (typname, cat) for _, _, col, typname, cat, _ in found if col is not None}
                    merged = copy.copy(first)
                    merged.rows = [r for k, w in enumerate(writes) if keys[k][2] in claimed for r in w.rows]
                    await _write(conn, merged, kinds)
        except ToolFailure as f:
            if f.type == "UndefinedTable" and not found:
                raise _ledger_missing(name, ledger) from None  # the claim's: only the ledger can be missing
            raise
        return texts

    texts = await _with_ledger(calls[0], name, credential, deadline, attempt)
    if failpoints.ARMED:  # test-only: committed, not yet answered; counted per item, as each alone would
        for _ in calls:
            failpoints.reached("postgres.committed")
    return texts


def _claims_and_columns(
    conn: psycopg.AsyncConnection[Any],
    *,
    w: _Write,
    ledger: tuple[str, ...],
    keys: list[tuple[str, str, int, str]],
    results: list[bytes],
) -> str:
    """`_claim_and_columns` for several items: each item's ledger row inserted (its result
    in it), the iteration indexes claimed (comma-separated; a row another delivery holds
    uncommitted makes the insert wait for its transaction's end) and the table's columns."""
    from psycopg import AsyncClientCursor, sql

    table = _composed(conn, ("name", w.table), lambda: sql.Identifier(*w.table))
    query = _composed(
        conn,
        ("claims", ledger, len(keys)),
        lambda: sql.SQL(
            "WITH claim AS (INSERT INTO {} (execution_id, command_id, iteration_index, run, result)"
            " VALUES {} ON CONFLICT DO NOTHING RETURNING iteration_index)"
            " SELECT (SELECT string_agg(iteration_index::text, ',') FROM claim), q.* FROM ({}) q ORDER BY q.attnum"
        ).format(
            sql.Identifier(*ledger),
            sql.SQL(", ").join([sql.SQL("(%s, %s, %s, %s, %s)")] * len(keys)),
            sql.SQL(_COLUMNS),
        ),
    )
    values = [v for key, text in zip(keys, results, strict=True) for v in (*key, text.decode())]
    return AsyncClientCursor(conn).mogrify(query, (*values, table))


async def _stored_many(
    conn: psycopg.AsyncConnection[Any], ledger: tuple[str, ...], keys: list[tuple[str, str, int, str]]
) -> dict[int, bytes]:
    """`_stored` for several items of one command: the results by iteration index."""
    from psycopg import sql

    execution_id, command_id, _, run = keys[0]
    cur = await conn.execute(
        sql.SQL(
            "SELECT iteration_index, result FROM {}"
            " WHERE execution_id = %s AND command_id = %s AND run = %s AND iteration_index = ANY(%s)"
        ).format(sql.Identifier(*ledger)),
        (execution_id, command_id, run, [k[2] for k in keys]),
    )
    got = {int(i): str(text).encode() for i, text in await cur.fetchall()}
    if len(got) < len(keys):  # deleted between the two statements: as `_stored`
        raise ToolFailure(
            "LedgerMissing", f"postgres ledger rows of command {command_id!r} vanished; try again", retryable=True
        )
    return got


async def _with_ledger(
    call: ToolCall,
    name: str,
    credential: dict[str, str],
    deadline: float | None,
    attempt: Callable[[tuple[str, ...] | None], Awaitable[T]],
) -> T:
    """`attempt` with the command's ledger (its schema-qualified name; None without a
    command), made first if missing. A ledger gone since it was made (dropped, or the
    credential now names another database) is made again and the attempt run again,
    within the call."""
    if call.identity is None:
        return await attempt(None)
    wanted = ledger_names(call.tool)
    for again in (False, True):
        ledger = await _ensure_ledger(call, name, credential, wanted, deadline)
        try:
            return await attempt(ledger)
        except ToolFailure as f:
            if f.type != "LedgerMissing" or again:
                raise
    raise AssertionError("unreachable")


def _claim_and_columns(
    conn: psycopg.AsyncConnection[Any],
    *,
    w: _Write,
    ledger: tuple[str, ...] | None,
    identity: CommandIdentity | None,
    result: bytes | None,
) -> str:
    """The write's first statement, as text with its values in it (it travels with the
    transaction's BEGIN, one simple query: `PostgresPools.transaction`): the command's ledger
    row inserted (`result` in it, or '' until `_record`) and the table's columns. Values are
    bound by the driver on the client (`AsyncClientCursor.mogrify`: quoted and escaped by libpq)."""
    from psycopg import AsyncClientCursor, sql

    table = _composed(conn, ("name", w.table), lambda: sql.Identifier(*w.table))
    if ledger is None or identity is None:
        query = _composed(
            conn, ("columns",), lambda: sql.SQL("SELECT 1, q.* FROM ({}) q ORDER BY q.attnum").format(sql.SQL(_COLUMNS))
        )
        return AsyncClientCursor(conn).mogrify(query, (table,))
    query = _composed(
        conn,
        ("claim", ledger),
        lambda: sql.SQL(
            "WITH claim AS (INSERT INTO {} (execution_id, command_id, iteration_index, run, result)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING 1)"
            " SELECT (SELECT count(*) FROM claim), q.* FROM ({}) q ORDER BY q.attnum"
        ).format(sql.Identifier(*ledger), sql.SQL(_COLUMNS)),
    )
    return AsyncClientCursor(conn).mogrify(query, (*_key(identity), (result or b"").decode(), table))


async def _claimed(
    conn: psycopg.AsyncConnection[Any],
    w: _Write,
    ledger: tuple[str, ...] | None,
    identity: CommandIdentity | None,
    found: list[Any],
) -> tuple[bytes | None, dict[str, tuple[str, str]]]:
    """What the first statement said: the first delivery's result (claimed before), or None
    and the table's columns' (type, category) by name."""
    if ledger is not None and identity is not None and int(found[0][0]) == 0:
        return await _stored(conn, ledger, identity), {}
    if found[0][1] is None:
        raise ToolFailure("UndefinedTable", f"postgres table {w.table_text!r} does not exist (or is not visible)")
    return None, {col: (typname, category) for _, _, col, typname, category, _ in found if col is not None}


async def _write(conn: psycopg.AsyncConnection[Any], w: _Write, kinds: dict[str, tuple[str, str]]) -> int:
    """The rows into the table, by mode: how many rows were written."""
    from psycopg import sql

    assert w.columns is not None
    for c in w.columns:
        if c not in kinds:
            raise ToolFailure(
                "ToolConfigError",
                f"postgres table {w.table_text!r} has no column {c!r} (its columns: {', '.join(kinds)})",
            )
    table = sql.Identifier(*w.table)
    cols = sql.SQL(", ").join(map(sql.Identifier, w.columns))
    cur = conn.cursor()
    if w.mode == "replace":
        await cur.execute(sql.SQL("LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE").format(table))
        await cur.execute(sql.SQL("DELETE FROM {}").format(table))
    if not w.columns or not w.rows:
        return 0
    target = table
    if w.mode == "upsert":
        target = sql.Identifier(_TEMP)
        # with each row's place in the write, for the last of a key to win (`_upsert`)
        await cur.execute(
            sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {}, 0::bigint AS {} FROM {} WITH NO DATA").format(
                target, cols, sql.Identifier(_ORDINAL), table
            )
        )
    types = [kinds[c] for c in w.columns]
    upsert = w.mode == "upsert"
    copied = sql.SQL(", ").join([*map(sql.Identifier, w.columns), *([sql.Identifier(_ORDINAL)] if upsert else [])])
    statement = _composed(
        conn, ("copy", w.mode, w.table, *w.columns), lambda: sql.SQL("COPY {} ({}) FROM STDIN").format(target, copied)
    )
    async with cur.copy(statement) as copy:
        if any(category == "A" for _, category in types):  # arrays: psycopg writes a list as one
            shape = [_shaper(c, *t) for c, t in zip(w.columns, types, strict=True)]
            for i, row in enumerate(w.rows):
                if i and not i % WRITE_CHUNK:
                    await asyncio.sleep(0)  # the loop's other work, between two chunks
                values = [f(row.get(c)) for f, c in zip(shape, w.columns, strict=True)]
                await copy.write_row([*values, i] if upsert else values)
        else:  # COPY's text format made here, in one piece a chunk: per value, not per call into the driver
            shapes = [_kind(t) for t, _ in types]
            for start in range(0, len(w.rows), WRITE_CHUNK):
                if start:
                    await asyncio.sleep(0)  # the loop's other work, between two chunks
                chunk = w.rows[start : start + WRITE_CHUNK]
                await copy.write(copy_text(chunk, w.columns, shapes, first=start if upsert else None))
    if not upsert:
        return len(w.rows)
    assert w.key is not None
    await cur.execute(_composed(conn, ("upsert", w.table, tuple(w.key), *w.columns), lambda: _upsert(w, target)))
    return max(cur.rowcount, 0)  # the temporary table goes with the commit (ON COMMIT DROP)


def _upsert(w: _Write, staged: sql.Identifier) -> sql.Composed:
    """The staged rows into the table: of the rows of one key the last written (the
    ordinal's highest), every row whose key has a NULL (never equal to another in a unique
    index); ``ON CONFLICT (key) DO UPDATE`` the other columns."""
    from psycopg import sql

    assert w.key is not None and w.columns is not None
    cols = sql.SQL(", ").join(map(sql.Identifier, w.columns))
    keys = sql.SQL(", ").join(map(sql.Identifier, w.key))
    whole = sql.SQL(" AND ").join(sql.SQL("{} IS NOT NULL").format(sql.Identifier(k)) for k in w.key)
    others = [c for c in w.columns if c not in w.key]
    action = (
        sql.SQL("DO UPDATE SET {}").format(
            sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in others)
        )
        if others
        else sql.SQL("DO NOTHING")
    )
    return sql.SQL(
        "INSERT INTO {table} ({cols}) SELECT {cols} FROM"
        " (SELECT DISTINCT ON ({keys}) {cols} FROM {staged} WHERE {whole} ORDER BY {keys}, {n} DESC) last"
        " UNION ALL SELECT {cols} FROM {staged} WHERE NOT ({whole})"
        " ON CONFLICT ({keys}) {action}"
    ).format(
        table=sql.Identifier(*w.table),
        cols=cols,
        keys=keys,
        staged=staged,
        whole=whole,
        n=sql.Identifier(_ORDINAL),
        action=action,
    )


# statements as text, by what they are made of: composing them (quoting each name) costs
# more than the rest of a small write's Python; bounded, cleared when full
_STATEMENTS: dict[tuple[Any, ...], str] = {}
_STATEMENTS_MAX = 1024


def _composed(conn: psycopg.AsyncConnection[Any], key: tuple[Any, ...], make: Callable[[], sql.Composable]) -> str:
    text = _STATEMENTS.get(key)
    if text is None:
        if len(_STATEMENTS) >= _STATEMENTS_MAX:
            _STATEMENTS.clear()
        text = _STATEMENTS[key] = make().as_string(conn)
    return text


_JSON_TYPES = frozenset({"json", "jsonb"})
_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
# rows a write formats and hands to COPY at a time, the event loop given back between two
WRITE_CHUNK = 1000


def _kind(typname: str) -> str:
    """How copy_text writes a column's values: ``json``, ``bytea`` or as text (``""``)."""
    return "json" if typname in _JSON_TYPES else "bytea" if typname == "bytea" else ""


def bytea_value(v: Any, column: str) -> bytes:
    """A bytea column's value: base64 text (what a `postgres` step reads from one)."""
    if isinstance(v, str):
        try:
            return base64.b64decode(v, validate=True)
        except (binascii.Error, ValueError):
            pass
    raise ToolFailure(
        "ToolConfigError", f"postgres column {column!r} is bytea: its values are base64 text, got {v!r}"[:300]
    )


def copy_text(rows: list[dict[str, Any]], columns: list[str], kinds: list[str], *, first: int | None = None) -> str:
    """`rows` in COPY's text format (tab-separated, ``\\N`` for NULL, backslash escapes),
    each value as the module docstring says; `kinds` as `_kind` gives them. `first`: each
    line ends with its row's place in the write, counting from it (upsert's ordinal)."""
    from actors.wire.jsonvalues import dumps

    lines = []
    for n, row in enumerate(rows):
        fields = []
        for c, kind in zip(columns, kinds, strict=True):
            v = row.get(c)
            if v is None:
                fields.append("\\N")
                continue
            if kind == "json" or (kind == "" and isinstance(v, dict | list)):
                text = dumps(v).decode()
            elif kind == "bytea":
                text = "\\x" + bytea_value(v, c).hex()
            elif isinstance(v, str):
                text = v
            elif isinstance(v, bool):
                text = "t" if v else "f"
            else:
                text = str(v)
            if "\\" in text or "\t" in text or "\n" in text or "\r" in text:
                text = text.translate(_ESCAPES)
            fields.append(text)
        if first is not None:
            fields.append(str(first + n))
        lines.append("\t".join(fields))
    lines.append("")
    return "\n".join(lines)


def _shaper(column: str, typname: str, category: str) -> Callable[[Any], Any]:
    """How a JSON value goes into a column of this type, for psycopg's `write_row` (a
    table with an array column): as `copy_text` writes it."""
    from psycopg.types.json import Json, Jsonb

    if typname in _JSON_TYPES:
        wrap = Jsonb if typname == "jsonb" else Json
        return lambda v: None if v is None else wrap(v)

    if typname == "bytea":
        return lambda v: None if v is None else bytea_value(v, column)

    if category == "A":
        return lambda v: Jsonb(v) if isinstance(v, dict) else v

    return lambda v: Jsonb(v) if isinstance(v, dict | list) else v


# --- the ledger ----------------------------------------------------------------------------


def ledger_names(tool: dict[str, Any]) -> tuple[str, ...]:
    return table_names(tool.get("ledger", DEFAULT_LEDGER), "ledger")


async def once(
    call: ToolCall, name: str, credential: dict[str, str], body: Body, *, deadline: float | None = None
) -> bytes:
    """Run `body` in one transaction of credential `name` and return its result's JSON text;
    with the command's identity, recorded in the ledger in that transaction, and a second
    delivery of the command returns the first's result without running `body`. `body` is
    a user's SQL: the session is reset as the transaction ends (pgpool)."""
    identity = call.identity
    pools = call.resources.postgres

    async def attempt(ledger: tuple[str, ...] | None) -> bytes:
        async with pools.transaction(name, credential, timeout=call.limit, deadline=deadline, reset=True) as conn:
            if ledger is not None:
                assert identity is not None
                stored = await _claim(conn, name, ledger, identity)
                if stored is not None:
                    return stored  # delivered before and committed: nothing more is written
            text = result_json(await body(conn))
            if ledger is not None:
                assert identity is not None
                await _record(conn, ledger, identity, text)
        return text

    text = await _with_ledger(call, name, credential, deadline, attempt)
    if failpoints.ARMED:  # test-only (actors/tools/failpoints.py): committed, not yet answered
        failpoints.reached("postgres.committed")
    return text


def _key(identity: CommandIdentity) -> tuple[str, str, int, str]:
    index = -1 if identity.iteration_index is None else identity.iteration_index
    return identity.execution_id, identity.command_id, index, identity.run


async def _ensure_ledger(
    call: ToolCall, name: str, credential: dict[str, str], ledger: tuple[str, ...], deadline: float | None
) -> tuple[str, str]:
    """The ledger table's schema and name, the table made if it is missing (in a transaction
    of its own; looked up once per process and credential). Every statement on the ledger
    names its schema: a search path a step changed cannot lead a write to another ledger.
    Two writes (or pods) making it at once: one of them fails with a duplicate, which means
    it is there."""
    known = (name, ".".join(ledger))
    where = _LEDGERS.get(known)
    if where is not None:
        return where
    from psycopg import sql

    table = sql.Identifier(*ledger)
    pools = call.resources.postgres
    found = None
    for _ in range(2):
        try:
            async with pools.transaction(name, credential, timeout=call.limit, deadline=deadline) as conn:
                text = table.as_string(conn)
                found = await _schema_of(conn, text)
                if found is None:
                    await conn.execute(_ledger_ddl(table))
                    found = await _schema_of(conn, text)
        except ToolFailure as f:
            # racing CREATE TABLE IF NOT EXISTS fail on the catalog's keys or on the table's row
            # type (DuplicateObject: seen in bench/sink.py's first writes, ten pods' worth at once)
            if f.type not in ("UniqueViolation", "DuplicateTable", "DuplicateObject"):
                raise
            continue  # made by another at the same moment: look again
        break
    if found is None:
        raise ToolFailure("LedgerMissing", f"postgres ledger table {known[1]!r} could not be made", retryable=True)
    _LEDGERS[known] = found
    return found


async def _schema_of(conn: psycopg.AsyncConnection[Any], table: str) -> tuple[str, str] | None:
    cur = await conn.execute(
        "SELECT n.nspname, c.relname FROM pg_catalog.pg_class c"
        " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass(%s)",
        (table,),
    )
    row = await cur.fetchone()
    return None if row is None else (str(row[0]), str(row[1]))


def _ledger_ddl(table: sql.Identifier) -> sql.Composed:
    from psycopg import sql

    return sql.SQL(
        "CREATE TABLE IF NOT EXISTS {} ("
        " execution_id text NOT NULL, command_id text NOT NULL, iteration_index integer NOT NULL,"
        " run text NOT NULL, result text NOT NULL, written_at timestamptz NOT NULL DEFAULT now(),"
        " PRIMARY KEY (execution_id, command_id, iteration_index, run))"
    ).format(table)


async def _claim(
    conn: psycopg.AsyncConnection[Any], name: str, ledger: tuple[str, ...], identity: CommandIdentity
) -> bytes | None:
    """Insert the command's ledger row; None when it is new. A row another delivery
    committed: its result. One another delivery holds uncommitted: the insert waits for
    that transaction to end (Postgres' unique index does), then decides."""
    import psycopg
    from psycopg import sql

    try:
        cur = await conn.execute(
            sql.SQL(
                "INSERT INTO {} (execution_id, command_id, iteration_index, run, result)"
                " VALUES (%s, %s, %s, %s, '') ON CONFLICT DO NOTHING"
            ).format(sql.Identifier(*ledger)),
            _key(identity),
        )
    except psycopg.errors.UndefinedTable:
        raise _ledger_missing(name, ledger) from None
    return None if cur.rowcount == 1 else await _stored(conn, ledger, identity)


def _ledger_missing(name: str, ledger: tuple[str, ...]) -> ToolFailure:
    """The ledger was dropped since it was looked up (or the credential now names another
    database): forgotten, so that `_with_ledger` makes it again."""
    for known, where in list(_LEDGERS.items()):
        if known[0] == name and where == ledger:
            del _LEDGERS[known]
    return ToolFailure(
        "LedgerMissing", f"postgres ledger table {'.'.join(ledger)!r} is missing; made again next time", retryable=True
    )


async def _stored(conn: psycopg.AsyncConnection[Any], ledger: tuple[str, ...], identity: CommandIdentity) -> bytes:
    """The result the command's committed ledger row holds."""
    from psycopg import sql

    key = _key(identity)
    cur = await conn.execute(
        sql.SQL(
            "SELECT result FROM {} WHERE execution_id = %s AND command_id = %s AND iteration_index = %s AND run = %s"
        ).format(sql.Identifier(*ledger)),
        key,
    )
    row = await cur.fetchone()
    if row is None:  # deleted between the two statements (someone cleaning the ledger): not ours to guess
        raise ToolFailure(
            "LedgerMissing", f"postgres ledger row of command {key!r} vanished; try again", retryable=True
        )
    return str(row[0]).encode()


async def _record(
    conn: psycopg.AsyncConnection[Any], ledger: tuple[str, ...], identity: CommandIdentity, text: bytes
) -> None:
    from psycopg import sql

    await conn.execute(
        sql.SQL(
            "UPDATE {} SET result = %s"
            " WHERE execution_id = %s AND command_id = %s AND iteration_index = %s AND run = %s"
        ).format(sql.Identifier(*ledger)),
        (text.decode(), *_key(identity)),
    )
