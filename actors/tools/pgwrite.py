"""Table writes of the `postgres` kind (a tool with `table` instead of `query`), and the
ledger that makes a write, or a `query` with `once: true`, happen once per command.

A write takes its rows from the arg `rows` (a mapping is one row, a list of mappings is
rows); a sink given no args writes the result of the step's tool it follows. Columns:
the tool's `columns`, else the union of the rows' keys in the order first seen; either
way checked against the table's columns in the catalog, an unknown one a
ToolConfigError naming it. Modes, all in the command's one transaction:

- ``append``: COPY the rows in;
- ``upsert``: COPY into a temporary table, then ``INSERT ... SELECT ... ON CONFLICT (key)
  DO UPDATE`` the other columns (``DO NOTHING`` when every column is a key column); two
  rows of one key in a write: the last wins. `key` needs a unique index on those columns;
- ``replace``: lock the table against other writers (``SHARE ROW EXCLUSIVE``: readers go
  on and see the old rows until the commit), ``DELETE`` every row, COPY the rows in.

Names (`table`, a schema-qualified ``schema.table`` too, `columns`, `key`, `ledger`) are
quoted by the driver (``psycopg.sql.Identifier``), never formatted into SQL; a name that
itself holds a dot cannot be written. Values: into a json or jsonb column, the value as
JSON (a string too); into an array column, a list as the array; a mapping or a list into
any other column, its JSON text; anything else as its text, parsed by the column's type
(``"2024-01-02T03:04:05Z"`` into a timestamptz, ``"12.50"`` into a numeric); null as
NULL, and a key a row lacks as NULL too (not the column's default). Result:
``{"table", "mode", "row_count"}``.

The ledger (`actors_ledger`, or the tool's `ledger:`, made by the first write that needs
it) has one row per write, keyed by the command's identity (actors/tools/call.py
`CommandIdentity`: execution id, command id, iteration index (-1 outside a loop), and
`run`: the step's tool or its sink), holding the result. The row is inserted first in
the write's transaction: a second delivery of the command finds it (or waits for the
first's transaction to end, then finds it), commits nothing more and returns the stored
result. docs/language.md ("Exactly once") says what that guarantees and what not.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from actors.tools import failpoints
from actors.tools.call import CommandIdentity, ToolCall
from actors.tools.failures import ToolFailure, result_json

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

__all__ = ["DEFAULT_LEDGER", "MODES", "copy_text", "once", "table_names", "write_table"]

DEFAULT_LEDGER = "actors_ledger"
MODES = ("append", "upsert", "replace")
_TEMP = "_actors_upsert"

# the table's columns: (oid, name, base type name, type category, position); a missing
# table gives one row with a null oid
_COLUMNS = """
SELECT r.oid, a.attname, b.typname, b.typcategory, a.attnum
FROM (SELECT to_regclass(%s)::oid AS oid) r
LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_catalog.pg_type b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
"""

# ledgers known to exist, by (credential, ledger): made once per process
_LEDGERS: set[tuple[str, str]] = set()

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
        if self.key is not None:  # one row per key, the last: ON CONFLICT may not touch a row twice
            last: dict[str, dict[str, Any]] = {}
            for row in self.rows:
                last[result_json([row.get(k) for k in self.key]).decode()] = row
            self.rows = list(last.values())

    def result(self, count: int) -> dict[str, Any]:
        return {"table": self.table_text, "mode": self.mode, "row_count": count}


async def write_table(call: ToolCall, name: str, credential: dict[str, str]) -> bytes:
    """A table write (the module docstring) in one transaction of credential `name`, once
    per command: its result's JSON text, or the first delivery's."""
    w = _Write(call)  # the settings and rows checked before a connection is taken
    identity = call.identity
    ledger = ledger_names(call.tool) if identity is not None else None
    if ledger is not None:
        await _ensure_ledger(call, name, credential, ledger)
    # append and replace know their result before writing: the ledger row holds it from
    # the start (one statement fewer); upsert's count comes from the server
    upfront = None if w.mode == "upsert" else result_json(w.result(len(w.rows) if w.columns else 0))
    async with call.resources.postgres.transaction(name, credential, timeout=call.limit) as conn:
        claimed, kinds = await _claim_and_columns(conn, name, w, ledger, identity, upfront)
        if isinstance(claimed, bytes):
            return claimed  # delivered before and committed: nothing more is written
        count = await _write(conn, w, kinds)
        text = upfront if upfront is not None else result_json(w.result(count))
        if upfront is None and ledger is not None:
            assert identity is not None
            await _record(conn, ledger, identity, text)
    if failpoints.ARMED:  # test-only (actors/tools/failpoints.py): committed, not yet answered
        failpoints.reached("postgres.committed")
    return text


async def _claim_and_columns(
    conn: psycopg.AsyncConnection[Any],
    name: str,
    w: _Write,
    ledger: tuple[str, ...] | None,
    identity: CommandIdentity | None,
    result: bytes | None,
) -> tuple[bytes | None, dict[str, tuple[str, str]]]:
    """In one round trip: the command's ledger row inserted (`result` in it, or '' until
    `_record`) and the table's columns. (the first delivery's result, or None; the
    columns' (type, category) by name)."""
    import psycopg
    from psycopg import sql

    table = _composed(conn, ("name", w.table), lambda: sql.Identifier(*w.table))
    if ledger is None or identity is None:
        query = _composed(
            conn, ("columns",), lambda: sql.SQL("SELECT 1, q.* FROM ({}) q ORDER BY q.attnum").format(sql.SQL(_COLUMNS))
        )
        cur = await conn.execute(query, (table,))
    else:
        query = _composed(
            conn,
            ("claim", ledger),
            lambda: sql.SQL(
                "WITH claim AS (INSERT INTO {} (execution_id, command_id, iteration_index, run, result)"
                " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING 1)"
                " SELECT (SELECT count(*) FROM claim), q.* FROM ({}) q ORDER BY q.attnum"
            ).format(sql.Identifier(*ledger), sql.SQL(_COLUMNS)),
        )
        try:
            cur = await conn.execute(query, (*_key(identity), (result or b"").decode(), table))
        except psycopg.errors.UndefinedTable:  # the ledger (a missing table itself is a null oid)
            raise _ledger_missing(name, ledger) from None
    found = await cur.fetchall()
    if ledger is not None and identity is not None and found[0][0] == 0:
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
        await cur.execute(
            sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA").format(target, cols, table)
        )
    types = [kinds[c] for c in w.columns]
    statement = _composed(
        conn, ("copy", w.mode, w.table, *w.columns), lambda: sql.SQL("COPY {} ({}) FROM STDIN").format(target, cols)
    )
    async with cur.copy(statement) as copy:
        if any(category == "A" for _, category in types):  # arrays: psycopg writes a list as one
            shape = [_shaper(*t) for t in types]
            for row in w.rows:
                await copy.write_row([f(row.get(c)) for f, c in zip(shape, w.columns, strict=True)])
        else:  # COPY's text format made here, in one piece: per value, not per call into the driver
            await copy.write(copy_text(w.rows, w.columns, [t in _JSON_TYPES for t, _ in types]))
    if w.mode != "upsert":
        return len(w.rows)
    assert w.key is not None
    others = [c for c in w.columns if c not in w.key]
    action = (
        sql.SQL("DO UPDATE SET {}").format(
            sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in others)
        )
        if others
        else sql.SQL("DO NOTHING")
    )
    await cur.execute(
        sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} ON CONFLICT ({}) {}").format(
            table, cols, cols, target, sql.SQL(", ").join(map(sql.Identifier, w.key)), action
        )
    )
    return max(cur.rowcount, 0)  # the temporary table goes with the commit (ON COMMIT DROP)


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


def copy_text(rows: list[dict[str, Any]], columns: list[str], json_columns: list[bool]) -> str:
    """`rows` in COPY's text format (tab-separated, ``\\N`` for NULL, backslash escapes),
    each value as the module docstring says."""
    from actors.wire.jsonvalues import dumps

    lines = []
    for row in rows:
        fields = []
        for c, as_json in zip(columns, json_columns, strict=True):
            v = row.get(c)
            if v is None:
                fields.append("\\N")
                continue
            if as_json or isinstance(v, dict | list):
                text = dumps(v).decode()
            elif isinstance(v, str):
                text = v
            elif isinstance(v, bool):
                text = "t" if v else "f"
            else:
                text = str(v)
            if "\\" in text or "\t" in text or "\n" in text or "\r" in text:
                text = text.translate(_ESCAPES)
            fields.append(text)
        lines.append("\t".join(fields))
    lines.append("")
    return "\n".join(lines)


def _shaper(typname: str, category: str) -> Callable[[Any], Any]:
    """How a JSON value goes into a column of this type, for psycopg's `write_row` (a
    table with an array column): as `copy_text` writes it."""
    from psycopg.types.json import Json, Jsonb

    if typname in _JSON_TYPES:
        wrap = Jsonb if typname == "jsonb" else Json
        return lambda v: None if v is None else wrap(v)

    if category == "A":
        return lambda v: Jsonb(v) if isinstance(v, dict) else v

    return lambda v: Jsonb(v) if isinstance(v, dict | list) else v


# --- the ledger ----------------------------------------------------------------------------


def ledger_names(tool: dict[str, Any]) -> tuple[str, ...]:
    return table_names(tool.get("ledger", DEFAULT_LEDGER), "ledger")


async def once(call: ToolCall, name: str, credential: dict[str, str], body: Body) -> bytes:
    """Run `body` in one transaction of credential `name` and return its result's JSON text;
    with the command's identity, recorded in the ledger in that transaction, and a second
    delivery of the command returns the first's result without running `body`."""
    identity = call.identity
    pools = call.resources.postgres
    ledger = ledger_names(call.tool) if identity is not None else None
    if ledger is not None:
        await _ensure_ledger(call, name, credential, ledger)
    async with pools.transaction(name, credential, timeout=call.limit) as conn:
        if ledger is not None:
            assert identity is not None
            stored = await _claim(conn, name, ledger, identity)
            if stored is not None:
                return stored  # delivered before and committed: nothing more is written
        text = result_json(await body(conn))
        if ledger is not None:
            assert identity is not None
            await _record(conn, ledger, identity, text)
    if failpoints.ARMED:  # test-only (actors/tools/failpoints.py): committed, not yet answered
        failpoints.reached("postgres.committed")
    return text


def _key(identity: CommandIdentity) -> tuple[str, str, int, str]:
    index = -1 if identity.iteration_index is None else identity.iteration_index
    return identity.execution_id, identity.command_id, index, identity.run


async def _ensure_ledger(call: ToolCall, name: str, credential: dict[str, str], ledger: tuple[str, ...]) -> None:
    """Make the ledger table if it is missing (once per process and credential): in a
    transaction of its own. Two writes (or pods) making it at once: one of them fails
    with a duplicate, which means it is there."""
    known = (name, ".".join(ledger))
    if known in _LEDGERS:
        return
    from psycopg import sql

    table = sql.Identifier(*ledger)
    try:
        async with call.resources.postgres.transaction(name, credential, timeout=call.limit) as conn:
            cur = await conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table.as_string(conn),))
            row = await cur.fetchone()
            if not (row and row[0]):
                await conn.execute(_ledger_ddl(table))
    except ToolFailure as f:
        if f.type not in ("UniqueViolation", "DuplicateTable"):
            raise
    _LEDGERS.add(known)


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
    _LEDGERS.discard((name, ".".join(ledger)))  # dropped since: made again by the next attempt
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
