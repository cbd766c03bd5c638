"""The worker's side of a `duckdb` step (actors/tools/kinds/duckdb.py): runs in a worker
process of the duckdb pool, called as ``main(**request)`` by actors/tools/pyworker.py.

Per call: the process's address space is bounded (soft ``RLIMIT_AS``: the call's memory
plus `HEADROOM` for the engine itself), a fresh connection is opened (in-memory, or the
step's `database` file, checked to be in an allowed directory), bounded (``memory_limit``,
``threads``, no spilling to disk, no extensions loaded or installed), closed to files
outside the allowed directories (``allowed_directories``, then ``enable_external_access``
off and ``lock_configuration`` on, so no statement can give any of it back), given the
step's inputs as temporary tables (keys that differ only in case refused), then the
statements run in order, each with the parameters it names and each to its end (rows of
all but the last dropped), and the last one's rows are returned. The connection is closed
after every call: nothing of a step (an in-memory table, a file lock) is left to the next.
"""

from __future__ import annotations

import datetime
import os
import re
import resource
from decimal import Decimal
from typing import Any

import orjson

from actors.tools.jsonscalars import NOT_A_SCALAR, json_scalar

__all__ = ["HEADROOM", "TooManyRows", "main"]

# Address space beyond DuckDB's own memory_limit: measured, the engine maps ~0.7 GiB on
# connect and ~1.1 GiB after a sort with 1-4 threads (allocator arenas and thread stacks
# reserve address space they never touch). Past memory + HEADROOM an allocation fails.
HEADROOM = 2 << 30


class TooManyRows(Exception):
    """The query returned more rows than `max_rows`."""


class FileNotAllowed(Exception):
    """The step's `database` is not in a directory duckdb steps may open."""


class ToolConfigError(Exception):
    """The step's fields cannot be run as given (here: an input whose keys DuckDB would
    take for one name)."""


def _bound(memory_mb: int) -> None:
    soft = memory_mb * (1 << 20) + HEADROOM
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _inside(path: str, dirs: list[str]) -> bool:
    real = os.path.realpath(path)
    return any(real == d or real.startswith(d.rstrip("/") + "/") for d in dirs)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def main(
    query: str,
    params: dict[str, Any],
    inputs: dict[str, list[Any]],
    database: str | None,
    max_rows: int,
    memory: int,
    threads: int,
    dirs: list[str],
) -> dict[str, Any]:
    _bound(memory)
    import duckdb

    statements = duckdb.extract_statements(query)
    if not statements:
        raise duckdb.InvalidInputException("the query has no statement")
    if database is not None and database != ":memory:" and not _inside(database, dirs):
        raise FileNotAllowed(
            f"database {database!r} is not in a directory duckdb steps may open "
            f"({', '.join(dirs) or 'none: set ACTORS_DUCKDB_DIRS'})"
        )
    config: dict[str, str | bool | int | float | list[str]] = {
        "memory_limit": f"{memory}MiB",
        "threads": threads,
        "temp_directory": "",  # no spilling: a query bigger than `memory` fails, it never fills a disk
        "autoinstall_known_extensions": False,
        "autoload_known_extensions": False,
        "allow_community_extensions": False,
    }
    con = duckdb.connect(database or ":memory:", config=config)
    try:
        # set after connect: DuckDB takes allowed_directories only on a started database
        con.execute("SET allowed_directories = $dirs", {"dirs": [d.rstrip("/") + "/" for d in dirs]})
        con.execute("SET enable_progress_bar = false")  # nothing printed to the step's output
        con.execute("SET TimeZone = 'UTC'")  # timestamps with a time zone come back in UTC, whatever the pod's zone
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        for name, rows in inputs.items():
            _register(con, name, rows)
        for statement in statements[:-1]:
            con.execute(statement, _named(statement, params))
            _finish(con)
        return _result(con, statements[-1], params, max_rows)
    finally:
        con.close()


def _finish(con: Any) -> None:
    """Run the statement just executed to its end, its rows dropped unread: DuckDB 2 refuses
    any other work on a connection whose result is unfinished (`SELECT 1; SELECT 2` failed
    ResourceInUseException), and stopping early (`abort`) would skip the rest of its work
    and any error in it. DuckDB before 2 has no `complete`: the rows are read and dropped."""
    complete = getattr(con, "complete", None)
    if complete is not None:
        complete()
    elif con.description is not None:
        while con.fetchmany(2048):
            pass


def _named(statement: Any, params: dict[str, Any]) -> dict[str, Any] | None:
    """The parameters `statement` names (DuckDB refuses one it does not use); one it
    names and the args lack is DuckDB's error to report."""
    names = statement.named_parameters
    return {k: params[k] for k in names if k in params} if names else None


def _register(con: Any, name: str, rows: list[Any]) -> None:
    """`rows` as the temporary table `name`: a list of mappings gives a column per key
    (the union of every row's keys, a value missing as NULL, each column's type the one
    all its values fit); a list of other values gives the one column ``value``. The rows
    go in as a bound parameter, never as SQL text."""
    table = _quote(name)
    _distinct_names(name, rows)
    if not rows:
        con.execute(f"CREATE TEMP TABLE {table} (value JSON)")
        return
    if all(isinstance(r, dict) for r in rows):
        if not any(rows):
            con.execute(f"CREATE TEMP TABLE {table} AS SELECT NULL::JSON AS value FROM range($n)", {"n": len(rows)})
            return
        con.execute(f"CREATE TEMP TABLE {table} AS SELECT unnest(r) FROM (SELECT unnest($rows) AS r)", {"rows": rows})
    else:
        con.execute(f"CREATE TEMP TABLE {table} AS SELECT unnest($rows) AS value", {"rows": rows})


def _distinct_names(name: str, rows: list[Any]) -> None:
    """Refuse keys that differ only in ASCII case (`id`, `ID`): DuckDB's names are
    case-insensitive that way, and its conversion of such rows gives one key's value under
    both names (`{"id": 1, "ID": 99}` read back as `{"id": 1, "ID_1": 1}`), or one column
    for keys met in different rows. Other letters' case is DuckDB's to keep apart (`ä`,
    `Ä` are two columns), so only ASCII is folded, as DuckDB does."""
    seen: dict[bytes, str] = {}
    clashes: dict[bytes, list[str]] = {}
    for row in rows:
        if not isinstance(row, dict):
            return  # not all mappings: one column `value`, no names from the keys
        for key in row:
            folded = key.encode("utf-8", "surrogatepass").lower()  # bytes.lower(): ASCII only
            first = seen.setdefault(folded, key)
            if first != key and key not in clashes.setdefault(folded, [first]):
                clashes[folded].append(key)
    if clashes:
        listed = "; ".join(", ".join(repr(k) for k in keys) for keys in clashes.values())
        raise ToolConfigError(
            f"duckdb input {name!r} has keys that differ only in case ({listed}): DuckDB's column "
            "names are case-insensitive; rename one of each in the step that makes the rows"
        )


_EXACT = re.compile(r"\b(INTERVAL|TIMESTAMP_NS)\b")


def _result(con: Any, statement: Any, params: dict[str, Any], max_rows: int) -> dict[str, Any]:
    """The last statement's rows, at most `max_rows` of them read (one more tells it is
    over). Columns whose type Python would round (INTERVAL: months as 30 days;
    TIMESTAMP_NS: to microseconds) are read as DuckDB's text of them."""
    import duckdb

    named = _named(statement, params)
    rel = None
    if statement.type == duckdb.StatementType.SELECT:
        rel = con.sql(statement.query, params=named)
    if rel is not None:
        types = [str(t) for t in rel.types]
        if any(_EXACT.search(t) for t in types):
            exprs = [
                f"CAST({_quote(c)} AS {_EXACT.sub('VARCHAR', t)}) AS {_quote(c)}" if _EXACT.search(t) else _quote(c)
                for c, t in zip(rel.columns, types, strict=True)
            ]
            try:
                rel = rel.project(", ".join(exprs))
            except duckdb.Error:  # a name twice, a struct field spelled like a type: read as Python has it
                pass
        names = list(rel.columns)  # `types`: as the query has them, not as read
        rows = rel.limit(max_rows + 1).fetchall()
    else:
        cur = con.execute(statement, named)
        if cur.description is None:
            return {"rows": [], "row_count": 0, "columns": []}
        names = [d[0] for d in cur.description]
        types = [str(d[1]) for d in cur.description]
        rows = cur.fetchmany(max_rows + 1)
    if len(rows) > max_rows:
        raise TooManyRows(
            f"the query returned more than max_rows ({max_rows:,}) rows: aggregate, add a LIMIT, "
            "or raise the step's max_rows"
        )
    json_cols = [i for i, t in enumerate(types) if t == "JSON"]
    out = []
    for row in rows:
        values = [_json(v) for v in row]
        for i in json_cols:
            if isinstance(values[i], str):
                values[i] = orjson.loads(values[i])
        out.append(dict(zip(names, values, strict=True)))
    return {
        "rows": out,
        "row_count": len(out),
        "columns": [{"name": n, "type": t} for n, t in zip(names, types, strict=True)],
    }


def _json(v: Any) -> Any:
    """A DuckDB value as JSON data (docs/language.md, duckdb: types)."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, Decimal):
        return format(v, "f")  # exact: a float would round it
    if isinstance(v, datetime.timedelta):  # only where an INTERVAL could not be read as text
        return str(v)
    shaped = json_scalar(v)  # floats, bytes, dates and times, UUIDs
    if shaped is not NOT_A_SCALAR:
        return shaped
    if isinstance(v, dict):
        if all(isinstance(k, str) for k in v):
            return {k: _json(x) for k, x in v.items()}
        return [{"key": _json(k), "value": _json(x)} for k, x in v.items()]  # a MAP with other keys
    if isinstance(v, (list, tuple)):
        return [_json(x) for x in v]
    return str(v)
