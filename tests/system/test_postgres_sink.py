"""Postgres table writes and sinks against a real server (the session's throwaway cluster,
tests/support/postgres.py): the three modes in bulk, values by column type, names
quoted by the driver, a failed sink leaving no rows and failing the attempt, the design
documents' flat sink shape, and exactly once: a command delivered again writes
nothing more, also when the tools pod is killed with SIGKILL between the sink's commit
and its result's publish (a test-only failpoint, actors/tools/failpoints.py) or at
random times, in a loop of 1,000 iterations. A chunk's appends written together: each
item ends as it would alone (a retryable error on one item's rows, a redelivered chunk's
committed item, columns that differ, a missing table, the time left after a failed write
together), and a chunk's rows are written a few thousand at a time."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from nats.aio.msg import Msg

from actors.client import Client
from actors.config.settings import Settings
from actors.pod.roles import connect, start_roles
from actors.tools.call import CommandIdentity
from actors.tools.credentials import CredentialSource
from actors.tools.executors import run_tool
from actors.tools.failpoints import ENV as FAILPOINTS
from actors.tools.failures import ToolFailure
from actors.tools.pgpool import PoolBounds
from actors.tools.resources import ToolResources
from actors.wire.messages import CallError, ChunkDone
from streams.layout import ensure
from streams.server import NatsServer
from streams.subjects import progress_subject
from tests.conftest import System, make_layout, of_type, running_system
from tests.support.loopturns import loop_turns
from tests.support.pods import PodProcess
from tests.support.postgres import Database

pytestmark = pytest.mark.asyncio


async def admin(db: Database, query: str) -> list[tuple[Any, ...]]:
    """`query` as the superuser (its rows, if any)."""
    async with await psycopg.AsyncConnection.connect(db.admin(), autocommit=True) as conn:
        cur = await conn.execute(query.encode())
        return await cur.fetchall() if cur.description is not None else []


async def as_app(db: Database, query: str) -> None:
    """DDL as the tests' role (the tables the steps write are its own)."""
    async with await psycopg.AsyncConnection.connect(db.url(), autocommit=True) as conn:
        await conn.execute(query.encode())


@pytest.fixture
def table(request: pytest.FixtureRequest) -> str:
    """A table name of this test's own (the cluster is the session's)."""
    return "s_" + str(request.node.name).lower().replace("[", "_").replace("]", "").replace("-", "_")[:50]


@pytest_asyncio.fixture
async def res(postgres: Database) -> AsyncIterator[ToolResources]:
    r = ToolResources(credentials=CredentialSource(None, {"DB": json.dumps(postgres.credential())}))
    try:
        yield r
    finally:
        await r.close()


_EXECUTION = ["e"]


@pytest.fixture(autouse=True)
def _execution(table: str) -> None:
    _EXECUTION[0] = table  # the ledger is the session's: each test's commands are of an execution of its own


def ident(command: str = "1-1", index: int | None = None, run: str = "sink", eid: str = "") -> CommandIdentity:
    return CommandIdentity(eid or _EXECUTION[0], command, index, run)  # type: ignore[arg-type]


async def write(
    res: ToolResources,
    table: str,
    rows: Any,
    *,
    identity: CommandIdentity | None = None,
    as_result: bool = False,
    **tool: Any,
) -> Any:
    """A table write as the tool actor runs it: `rows` as the arg, or (`as_result`) as the
    result a sink without args follows."""
    spec = {"kind": "postgres", "credential": "db", "table": table, **tool}
    args = {} if as_result else {"rows": rows}
    out = await run_tool("postgres", spec, args, timeout=20, resources=res, identity=identity or ident(), result=rows)
    return json.loads(out)


@pytest.mark.timeout(60)
async def test_append_upsert_and_replace_write_rows_by_column_type(
    postgres: Database, res: ToolResources, table: str
) -> None:
    await as_app(
        postgres,
        f"""CREATE SCHEMA IF NOT EXISTS raw;
            CREATE TABLE raw.{table} (id int PRIMARY KEY, "Select" text, amount numeric, at timestamptz,
                                      doc jsonb, tags text[], note text DEFAULT 'd')""",
    )
    qualified = f"raw.{table}"
    rows = [
        {"id": 1, "Select": "x'); DROP TABLE raw." + table + "; --", "amount": "12.50", "at": "2024-01-02T03:04:05Z",
         "doc": {"a": [1, 2]}, "tags": ["a", "b"]},
        {"id": 2, "Select": "tab\there\nnewline", "amount": 3, "doc": "just a string", "note": None},
    ]  # fmt: skip
    out = await write(res, qualified, rows, identity=ident("1-1"))
    assert out == {"table": qualified, "mode": "append", "row_count": 2}
    got = await admin(postgres, f'SELECT id, "Select", amount::text, at, doc, tags, note FROM raw.{table} ORDER BY id')
    assert (
        got[0][1] == rows[0]["Select"] and got[0][2] == "12.50" and got[0][3].isoformat() == "2024-01-02T03:04:05+00:00"
    )
    assert got[0][4] == {"a": [1, 2]} and got[0][5] == ["a", "b"]
    assert got[1][1:] == ("tab\there\nnewline", "3", None, "just a string", None, None)  # a key a row lacks: NULL

    # upsert: the key's row updated, a new one inserted, two rows of one key: the last wins
    out = await write(
        res,
        qualified,
        [{"id": 2, "amount": 5}, {"id": 3, "amount": 7}, {"id": 3, "amount": 8}],
        identity=ident("2-1"),
        mode="upsert",
        key=["id"],
    )
    assert out == {"table": qualified, "mode": "upsert", "row_count": 2}
    got = await admin(postgres, f'SELECT id, amount::text, "Select" FROM raw.{table} ORDER BY id')
    assert got == [(1, "12.50", rows[0]["Select"]), (2, "5", "tab\there\nnewline"), (3, "8", None)]

    # replace: the rows are these only; a sink without args writes the result it follows
    out = await write(res, qualified, {"id": 9, "amount": 1}, identity=ident("3-1"), mode="replace", as_result=True)
    assert out == {"table": qualified, "mode": "replace", "row_count": 1}
    assert await admin(postgres, f"SELECT id, amount::text FROM raw.{table}") == [(9, "1")]

    # `columns` chooses what is written (other keys ignored)
    out = await write(res, qualified, [{"id": 10, "amount": 2, "extra": "x"}], identity=ident("4-1"), columns=["id"])
    assert out["row_count"] == 1
    assert await admin(postgres, f"SELECT id, amount FROM raw.{table} WHERE id = 10") == [(10, None)]


@pytest.mark.timeout(60)
async def test_a_bad_write_names_what_is_wrong_and_writes_nothing(
    postgres: Database, res: ToolResources, table: str
) -> None:
    await as_app(postgres, f"CREATE TABLE {table} (id int PRIMARY KEY, name text)")
    with pytest.raises(ToolFailure) as unknown:
        await write(res, table, [{"id": 1, "name": "a"}, {"id": 2, "nmae": "b"}], identity=ident("1-1"))
    assert unknown.value.type == "ToolConfigError" and "'nmae'" in unknown.value.message
    assert "id, name" in unknown.value.message  # the table's columns, to pick from
    with pytest.raises(ToolFailure) as missing:
        await write(res, "no_such_table", [{"id": 1}], identity=ident("2-1"))
    assert missing.value.type == "UndefinedTable" and "no_such_table" in missing.value.message
    with pytest.raises(ToolFailure) as hostile:  # a name is an identifier, never SQL
        await write(res, f"{table}; DROP TABLE {table}", [{"id": 1}], identity=ident("3-1"))
    assert hostile.value.type == "UndefinedTable"
    with pytest.raises(ToolFailure) as dup:  # the second row breaks the key: the first is not kept either
        await write(res, table, [{"id": 1, "name": "a"}, {"id": 1, "name": "b"}], identity=ident("4-1"))
    assert dup.value.type == "UniqueViolation"
    with pytest.raises(ToolFailure) as no_key:
        await write(res, table, [{"id": 1}], identity=ident("5-1"), mode="upsert")
    assert no_key.value.type == "ToolConfigError" and "key" in no_key.value.message
    with pytest.raises(ToolFailure) as no_rows:
        await run_tool("postgres", {"kind": "postgres", "credential": "db", "table": table}, {"x": 1}, timeout=5,
                       resources=res, identity=ident("6-1"))  # fmt: skip
    assert no_rows.value.type == "ToolConfigError" and "`rows`" in no_rows.value.message
    assert await admin(postgres, f"SELECT count(*) FROM {table}") == [(0,)]
    # the failed writes left no ledger rows: the same commands, delivered again, write
    out = await write(res, table, [{"id": 1, "name": "a"}], identity=ident("4-1"))
    assert out["row_count"] == 1


@pytest.mark.timeout(60)
async def test_a_command_delivered_again_writes_nothing_more_and_answers_as_the_first_time(
    postgres: Database, res: ToolResources, table: str
) -> None:
    await as_app(postgres, f"CREATE TABLE {table} (id int, v text)")
    first = await write(res, table, [{"id": 1, "v": "a"}, {"id": 2, "v": "a"}], identity=ident("7-1", 4))
    # the same command again (a pod killed before its answer): the tool ran again and gave other rows
    again = await write(res, table, [{"id": 1, "v": "b"}], identity=ident("7-1", 4))
    assert again == first == {"table": table, "mode": "append", "row_count": 2}
    assert await admin(postgres, f"SELECT id, v FROM {table} ORDER BY id") == [(1, "a"), (2, "a")]
    # another iteration, attempt, run or execution is another command: it writes
    for other in (ident("7-1", 5), ident("7-2", 4), ident("7-1", 4, run="tool"), ident("7-1", 4, eid=table + "2")):
        assert (await write(res, table, [{"id": 3, "v": "c"}], identity=other))["row_count"] == 1
    assert await admin(postgres, f"SELECT count(*) FROM {table} WHERE id = 3") == [(4,)]
    ledger = await admin(
        postgres, f"SELECT result FROM actors_ledger WHERE execution_id = '{table}' AND command_id = '7-1'"
    )
    assert json.loads(ledger[0][0]) == first  # what a second delivery answers

    # two deliveries at the same moment (ack wait past, another pod took it): one writes, the
    # other waits for its transaction and answers its result
    both = await asyncio.gather(*(write(res, table, [{"id": 4, "v": "d"}], identity=ident("8-1")) for _ in range(2)))
    assert both[0] == both[1]
    assert await admin(postgres, f"SELECT count(*) FROM {table} WHERE id = 4") == [(1,)]

    # a query with `once: true`, under its own ledger
    tool = {"kind": "postgres", "credential": "db", "query": f"INSERT INTO {table} VALUES (5, 'e')", "once": True,
            "ledger": "public.my_ledger"}  # fmt: skip
    for _ in range(2):
        out = json.loads(await run_tool("postgres", tool, {}, timeout=5, resources=res, identity=ident("9-1")))
        assert out == {"row_count": 1, "status": "INSERT 0 1"}
    assert await admin(postgres, f"SELECT count(*) FROM {table} WHERE id = 5") == [(1,)]
    assert await admin(postgres, "SELECT count(*) FROM my_ledger") == [(1,)]

    # the first writes to a new ledger, at once: one makes it, none fails
    firsts = [write(res, table, [{"id": 6}], identity=ident(f"10-{k}"), ledger="race_ledger") for k in range(1, 5)]
    assert [out["row_count"] for out in await asyncio.gather(*firsts)] == [1, 1, 1, 1]
    assert await admin(postgres, "SELECT count(*) FROM race_ledger") == [(4,)]


@pytest.mark.timeout(60)
async def test_bytea_read_by_a_step_is_written_back_the_same(
    postgres: Database, res: ToolResources, table: str
) -> None:
    await as_app(postgres, f"CREATE TABLE {table} (id int, data bytea, blobs bytea[])")
    await as_app(postgres, f"INSERT INTO {table} VALUES (1, '\\x00ff0a5c09'::bytea, NULL)")
    tool = {"kind": "postgres", "credential": "db", "query": f"SELECT data FROM {table}"}
    read = json.loads(await run_tool("postgres", tool, {}, timeout=20, resources=res))["rows"][0]["data"]
    assert read == "AP8KXAk="  # base64
    out = await write(res, table, [{"id": 2, "data": read}, {"id": 3, "data": None}], identity=ident("1-1"))
    assert out["row_count"] == 2
    got = await admin(postgres, f"SELECT id, encode(data, 'hex') FROM {table} ORDER BY id")
    assert got == [(1, "00ff0a5c09"), (2, "00ff0a5c09"), (3, None)]
    # the same through psycopg's row writer (a table with an array column)
    await write(res, table, [{"id": 4, "data": read, "blobs": None}], identity=ident("2-1"))
    assert await admin(postgres, f"SELECT encode(data, 'hex') FROM {table} WHERE id = 4") == [("00ff0a5c09",)]
    with pytest.raises(ToolFailure) as garbled:
        await write(res, table, [{"id": 5, "data": "not base64!"}], identity=ident("3-1"))
    assert garbled.value.type == "ToolConfigError" and "'data'" in garbled.value.message


@pytest.mark.timeout(60)
async def test_upsert_takes_the_last_row_of_a_key_by_value_and_never_merges_null_keys(
    postgres: Database, res: ToolResources, table: str
) -> None:
    await as_app(postgres, f"CREATE TABLE {table} (id int PRIMARY KEY, code text UNIQUE, n int)")
    # 5 and "5" are one key to Postgres: the last row of it wins, nothing fails
    out = await write(
        res, table, [{"id": 5, "n": 1}, {"id": "5", "n": 2}, {"id": 6, "n": 3}], identity=ident("1-1"),
        mode="upsert", key=["id"],
    )  # fmt: skip
    assert out["row_count"] == 2
    assert await admin(postgres, f"SELECT id, n FROM {table} ORDER BY id") == [(5, 2), (6, 3)]
    # rows whose key is NULL are not one key (a unique index lets each in)
    out = await write(
        res, table, [{"id": 7, "code": None, "n": 1}, {"id": 8, "code": None, "n": 2}, {"id": 9, "code": "a", "n": 3},
                     {"id": 10, "code": "a", "n": 4}],
        identity=ident("2-1"), mode="upsert", key=["code"], columns=["id", "code", "n"],
    )  # fmt: skip
    assert out["row_count"] == 3
    got = await admin(postgres, f"SELECT id, code, n FROM {table} WHERE id > 6 ORDER BY id")
    assert got == [(7, None, 1), (8, None, 2), (10, "a", 4)]


@pytest.mark.timeout(60)
async def test_a_ledger_dropped_since_it_was_made_is_made_again_within_the_write(
    postgres: Database, res: ToolResources, table: str
) -> None:
    await as_app(postgres, f"CREATE TABLE {table} (id int)")
    ledger = f"{table}_ledger"
    assert (await write(res, table, [{"id": 1}], identity=ident("1-1"), ledger=ledger))["row_count"] == 1
    await admin(postgres, f"DROP TABLE {ledger}")
    assert (await write(res, table, [{"id": 2}], identity=ident("2-1"), ledger=ledger))["row_count"] == 1
    tool = {"kind": "postgres", "credential": "db", "query": f"INSERT INTO {table} VALUES (3)", "once": True,
            "ledger": ledger}  # fmt: skip
    await admin(postgres, f"DROP TABLE {ledger}")
    await run_tool("postgres", tool, {}, timeout=20, resources=res, identity=ident("3-1", run="tool"))
    assert await admin(postgres, f"SELECT id FROM {table} ORDER BY id") == [(1,), (2,), (3,)]
    assert await admin(postgres, f"SELECT command_id FROM {ledger}") == [("3-1",)]


@pytest.mark.timeout(60)
async def test_a_steps_search_path_or_temporary_table_does_not_redirect_a_later_write(
    postgres: Database, table: str
) -> None:
    res = ToolResources(
        credentials=CredentialSource(None, {"DB": json.dumps(postgres.credential())}),
        postgres_pool=PoolBounds(max_size=1),  # every call on the one connection
    )
    evil = f"{table}_evil"
    await as_app(postgres, f"CREATE TABLE {table} (id int); CREATE SCHEMA {evil}; CREATE TABLE {evil}.{table} (id int)")
    ledger = f"{table}_ledger"
    try:
        await write(res, table, [{"id": 0}], identity=ident("0-1"), ledger=ledger)  # the ledger made, in public

        async def query(q: str, **tool: Any) -> None:
            identity = tool.pop("identity", None)
            spec = {"kind": "postgres", "credential": "db", "query": q, **tool}
            await run_tool("postgres", spec, {}, timeout=20, resources=res, identity=identity)

        await query(f"SET search_path = {evil}, public; CREATE TEMP TABLE {table} (id int)")
        await write(res, table, [{"id": 1}], identity=ident("1-1"), ledger=ledger)
        await query(f"SET search_path = {evil}")
        await write(res, table, [{"id": 2}], identity=ident("2-1"), ledger=ledger)
        await write(res, table, [{"id": 2}], identity=ident("2-1"), ledger=ledger)  # again: written once
        # a `once` query that moves its own search path still records in the ledger it claimed in
        await query(f"SET LOCAL search_path = {evil}; INSERT INTO public.{table} VALUES (3)", once=True,
                    ledger=ledger, identity=ident("3-1", run="tool"))  # fmt: skip
        assert await admin(postgres, f"SELECT id FROM public.{table} ORDER BY id") == [(0,), (1,), (2,), (3,)]
        assert await admin(postgres, f"SELECT count(*) FROM {evil}.{table}") == [(0,)]
        recorded = await admin(postgres, f"SELECT command_id, result <> '' FROM public.{ledger} ORDER BY command_id")
        assert recorded == [("0-1", True), ("1-1", True), ("2-1", True), ("3-1", True)]
    finally:
        await res.close()


@pytest.mark.timeout(60)
async def test_a_big_write_is_formatted_in_chunks_with_the_event_loop_running_between(
    postgres: Database, res: ToolResources, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from actors.tools import pgwrite

    await as_app(postgres, f"CREATE TABLE {table} (id int, doc jsonb)")
    async with loop_turns() as turns:
        monkeypatch.setattr(pgwrite, "copy_text", turns.counting(pgwrite.copy_text, lambda rows, *a, **k: len(rows)))
        out = await write(res, table, [{"id": i, "doc": {"i": i}} for i in range(20000)], identity=ident("1-1"))
    assert out["row_count"] == 20000 and sum(turns.work.values()) == 20000
    assert max(turns.work.values()) <= 1000  # pgwrite.WRITE_CHUNK
    assert await admin(postgres, f"SELECT count(*), max(id), max((doc->>'i')::int) FROM {table}") == [
        (20000, 19999, 19999)
    ]


def sink_write(table: str, rows: Any, command: str, index: int) -> Any:
    from actors.tools.chunksinks import SinkWrite

    spec = {"kind": "postgres", "credential": "db", "table": table}
    return SinkWrite(spec, {"rows": rows}, ident(command, index), rows)


def outcomes_of(out: list[Any]) -> list[Any]:
    """Each item's row count, or its failure's type."""
    return [o.type if isinstance(o, ToolFailure) else json.loads(o)["row_count"] for o in out]


@pytest.mark.timeout(60)
async def test_a_chunks_appends_written_together_end_for_each_item_as_written_alone(
    postgres: Database, res: ToolResources, table: str
) -> None:
    from actors.tools.chunksinks import write_together

    # a deadlock (retryable) on item 2's rows: only item 2 fails, as alone
    await as_app(
        postgres,
        f"""CREATE TABLE {table} (i int, part int);
        CREATE FUNCTION {table}_f() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN IF NEW.i = 2 THEN RAISE EXCEPTION 'conflict' USING ERRCODE = '40P01'; END IF; RETURN NEW; END $$;
        CREATE TRIGGER {table}_t BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION {table}_f();
        CREATE TABLE {table}_b (i int, part int DEFAULT 7);
        CREATE SEQUENCE {table}_n;
        CREATE FUNCTION {table}_s() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN PERFORM pg_sleep(CASE WHEN nextval('{table}_n') = 1 THEN 30 ELSE 0.3 END); RETURN NEW; END $$;
        CREATE TABLE {table}_c (i int);
        CREATE TRIGGER {table}_t BEFORE INSERT ON {table}_c FOR EACH ROW EXECUTE FUNCTION {table}_s();""",
    )
    out = await write_together(
        [sink_write(table, [{"i": i, "part": 0}], "d", i) for i in range(4)],
        resources=res, cancel=None, each=5.0, deadline=None,
    )  # fmt: skip
    assert outcomes_of(out) == [1, 1, "DeadlockDetected", 1]
    assert await admin(postgres, f"SELECT i FROM {table} ORDER BY i") == [(0,), (1,), (3,)]

    # item 1 leaves out a column: written alone (its default), the others still together
    rows = [[{"i": 0, "part": 0}], [{"i": 1}], [{"i": 2, "part": 2}], [{"part": 3, "i": 3}]]
    out = await write_together(
        [sink_write(f"{table}_b", rows[i], "c", i) for i in range(4)],
        resources=res, cancel=None, each=5.0, deadline=None,
    )  # fmt: skip
    assert outcomes_of(out) == [1, 1, 1, 1]
    assert await admin(postgres, f"SELECT i, part FROM {table}_b ORDER BY i") == [(0, 0), (1, 7), (2, 2), (3, 3)]
    ledger = await admin(
        postgres,
        f"SELECT array_agg(iteration_index ORDER BY iteration_index) FROM actors_ledger"
        f" WHERE execution_id = '{table}' AND command_id = 'c' GROUP BY written_at ORDER BY 1",
    )
    assert ledger == [([0, 2, 3],), ([1],)]

    # empty items into a missing table: UndefinedTable, as each alone
    out = await write_together(
        [sink_write(f"{table}_nope", [], "e", i) for i in range(3)], resources=res, cancel=None, each=5.0, deadline=None
    )
    assert outcomes_of(out) == ["UndefinedTable"] * 3

    # the first insert hangs, the others take 0.3 s: the write together gets only the time
    # the command can spare (0.5 s: the deadline leaves each item its 2 s alone), then each
    # item alone has its own
    deadline = asyncio.get_running_loop().time() + 4 * 2.0 + 0.5
    out = await write_together(
        [sink_write(f"{table}_c", [{"i": i}], "t", i) for i in range(4)],
        resources=res, cancel=None, each=2.0, deadline=deadline,
    )  # fmt: skip
    assert outcomes_of(out) == [1, 1, 1, 1]
    assert await admin(postgres, f"SELECT i FROM {table}_c ORDER BY i") == [(0,), (1,), (2,), (3,)]


# --- through the whole system -------------------------------------------------------------


def playbook(name: str, steps: str) -> str:
    return f"apiVersion: actors/v1\nkind: Playbook\nmetadata: {{name: {name}}}\nworkflow:\n{steps}"


@pytest_asyncio.fixture
async def pod(nats_server: NatsServer, tmp_path: Path, postgres: Database) -> AsyncIterator[System]:
    """Every role in this process, with credential `db` for the cluster."""
    settings = Settings(credentials={"DB": json.dumps(postgres.credential())})
    async with running_system(nats_server, tmp_path, settings=settings) as system:
        yield system


@pytest.mark.timeout(120)
async def test_a_sink_writes_each_iteration_with_it_and_a_failed_sink_fails_the_iteration(
    pod: System, postgres: Database, table: str
) -> None:
    # iteration 13's third row breaks a check: that iteration's sink fails, its retry too
    await as_app(
        postgres,
        f"""CREATE TABLE {table} (i int, part int, attempt int, CHECK (NOT (i = 13 AND part = 2)));
            CREATE TABLE {table}_up (id int PRIMARY KEY, n int)""",
    )
    eid, status = await pod.run_yaml(
        playbook(
            "pg-sinks",
            f"""
  - step: fan
    loop: {{collection: "{{{{ range(20) | list }}}}", element: i, concurrency: 5, tolerated_failures: 1}}
    tool: noop
    retry:
      when: "{{{{ error is not none and error.type == 'CheckViolation' }}}}"
      then: {{max_attempts: 2, initial_delay: 0.05}}
    sink:                      # the design documents' flat shape
      tool: postgres
      table: {table}
      mode: append
      auth: {{type: postgres, credential: db}}
      args:                    # the sink's templates see the element and the attempt too
        rows:
          - {{i: "{{{{ i }}}}", part: 0, attempt: "{{{{ attempt }}}}"}}
          - {{i: "{{{{ i }}}}", part: 1, attempt: "{{{{ attempt }}}}"}}
          - {{i: "{{{{ i }}}}", part: 2, attempt: "{{{{ attempt }}}}"}}
    next: counts
  - step: counts
    tool:
      kind: python
      code: |
        def main():
            return [{{"id": k, "n": k * 10}} for k in range(3)]
    sink:                      # nested shape; no args: the result is the rows
      tool: {{kind: postgres, credential: db, table: {table}_up, mode: upsert, key: [id]}}
""",
        ),
        timeout=60,
    )
    assert status.state == "COMPLETED", status.error
    rows = await admin(postgres, f"SELECT i, part, attempt FROM {table} ORDER BY i, part")
    assert rows == [(i, p, 1) for i in range(20) if i != 13 for p in range(3)]  # nothing of iteration 13
    failed = [r for r in await pod.client.iterations(eid) if isinstance(r, CallError)]
    assert [(r.iteration_index, r.attempt_number) for r in failed] == [(13, 1), (13, 2)]  # retry saw it
    for r in failed:
        assert r.error.type == "CheckViolation" and "sink (postgres) failed" in r.error.message
    verdict = of_type(await pod.events(eid), "iterator.completed")[0].data
    assert [e["index"] for e in verdict["errors"]] == [13]
    assert await admin(postgres, f"SELECT id, n FROM {table}_up ORDER BY id") == [(0, 0), (1, 10), (2, 20)]


@pytest.mark.timeout(120)
async def test_a_chunks_appends_are_one_transaction_and_a_bad_row_fails_only_its_iteration(
    pod: System, postgres: Database, table: str
) -> None:
    # chunks of 4; iteration 6's second row breaks a check: its chunk's write together fails,
    # then each item is written alone, so 4, 5 and 7 are written and only 6 fails. Then a
    # chunk of 4 items of 2,000 rows each: written two items (4,000 rows) at a time, a
    # chunk's rows held until written bounded (chunksinks.GROUP_ROWS)
    await as_app(
        postgres,
        f"""CREATE TABLE {table} (i int, part int, CHECK (NOT (i = 6 AND part = 1)));
        CREATE TABLE {table}_big (i int, part int)""",
    )
    eid, status = await pod.run_yaml(
        playbook(
            "pg-chunk-sinks",
            f"""
  - step: fan
    loop: {{collection: "{{{{ range(12) | list }}}}", element: i, mode: chunked, chunk_size: 4, concurrency: 12,
           tolerated_failures: 1}}
    tool: noop
    args: {{rows: [{{i: "{{{{ i }}}}", part: 0}}, {{i: "{{{{ i }}}}", part: 1}}]}}
    sink: {{tool: postgres, table: {table}, auth: {{type: postgres, credential: db}},
           args: {{rows: "{{{{ result.rows }}}}"}}}}
    next: big
  - step: big
    loop: {{collection: "{{{{ range(4) | list }}}}", element: i, mode: chunked, chunk_size: 4}}
    tool: {{kind: python, code: "def main(i): return [{{'i': i, 'part': p}} for p in range(2000)]"}}
    args: {{i: "{{{{ i }}}}"}}
    sink: {{tool: postgres, table: {table}_big, ledger: {table}_ledger, auth: {{type: postgres, credential: db}}}}
""",
        ),
        timeout=60,
    )
    assert status.state == "COMPLETED", status.error
    assert await admin(postgres, f"SELECT i, count(DISTINCT part) FROM {table}_big GROUP BY i ORDER BY i") == [
        (i, 2000) for i in range(4)
    ]
    together = f"SELECT array_agg(iteration_index ORDER BY iteration_index) FROM {table}_ledger GROUP BY written_at"
    assert sorted(await admin(postgres, together)) == [([0, 1],), ([2, 3],)]
    rows = await admin(postgres, f"SELECT i, part FROM {table} ORDER BY i, part")
    assert rows == [(i, p) for i in range(12) if i != 6 for p in range(2)]  # once each, nothing of 6
    outcomes = {o.iteration_index: o for r in await pod.client.iterations(eid)
                if isinstance(r, ChunkDone) and r.step == "fan" for o in r.outcomes}  # fmt: skip
    assert sorted(outcomes) == list(range(12))
    bad = outcomes.pop(6).error
    assert bad is not None and bad.type == "CheckViolation" and "sink (postgres) failed" in bad.message
    for i, o in outcomes.items():  # the others' results are their tools'
        assert o.error is None and o.result["rows"] == [{"i": i, "part": 0}, {"i": i, "part": 1}]
    # per chunk (command): its items' ledger rows, and the transactions they were written in
    # (`written_at` is the transaction's now()): the good chunks in one, the bad one's alone
    ledger = await admin(
        postgres,
        "SELECT array_agg(iteration_index ORDER BY iteration_index), count(DISTINCT written_at)"
        f" FROM actors_ledger WHERE execution_id = '{eid}' GROUP BY command_id ORDER BY 1",
    )
    assert ledger == [([0, 1, 2, 3], 1), ([4, 5, 7], 3), ([8, 9, 10, 11], 1)]


ITERATIONS = 1000
PARTS = 3


def loop_playbook(table: str, mode: str, concurrency: int, iterations: int = ITERATIONS, chunk_size: int = 10) -> str:
    rows = ", ".join(f'{{i: "{{{{ i }}}}", part: {p}}}' for p in range(PARTS))
    return playbook(
        "pg-once",
        f"""
  - step: fan
    loop: {{collection: "{{{{ range({iterations}) | list }}}}", element: i, mode: {mode}, chunk_size: {chunk_size},
           concurrency: {concurrency}}}
    tool: noop
    args: {{rows: [{rows}]}}
    sink:
      tool: postgres
      table: {table}
      auth: {{type: postgres, credential: db}}
      args: {{rows: "{{{{ result.rows }}}}"}}
""",
    )


async def run_with_kills(
    nats_server: NatsServer,
    tmp_path: Path,
    postgres: Database,
    table: str,
    *,
    mode: str,
    concurrency: int,
    failpoint: str | None = None,
    kill_at: list[int] | None = None,
    kills: int,
    iterations: int = ITERATIONS,
    chunk_size: int = 10,
    ledger: list[tuple[Any, ...]] | None = None,
) -> int:
    """Run the loop with the tools pod a process of its own, killed (SIGKILL) and started
    again: by the failpoint (`failpoint`, armed in the first `kills` lives), or by the
    test when the loop's progress passes each of `kill_at` (iterations done). Returns
    how many times it was killed; `ledger` gets the execution's ledger rows per command
    (command id, rows, distinct `written_at`: one per transaction)."""
    await as_app(postgres, f"CREATE TABLE {table} (i int NOT NULL, part int NOT NULL)")  # no key: a row twice shows
    layout = make_layout()
    nc = await connect(nats_server.url, name="test")
    await ensure(nc.jetstream(), layout)
    runtime = await start_roles(nc, layout=layout, roles=("engine", "counter", "projector", "retention"))
    logs = tmp_path / "logs"
    logs.mkdir()
    env = {"ACTORS_CREDENTIAL_DB": json.dumps(postgres.credential())}
    killed = 0
    lives = 0
    thresholds = sorted(kill_at or [])

    async def tools() -> PodProcess:
        nonlocal lives
        lives += 1
        armed = {FAILPOINTS: failpoint} if failpoint and killed < kills else {}
        p = await PodProcess.start(
            "tools", url=nats_server.url, layout=layout, logs=logs, name=f"tools{lives}", env={**env, **armed}
        )
        await p.ready()
        return p

    tools_pod = await tools()
    eid = "once" + os.urandom(6).hex()
    done_so_far = [0]
    moved = asyncio.Event()

    async def on_progress(msg: Msg) -> None:
        done_so_far[0] = max(done_so_far[0], json.loads(msg.data)["done"])
        moved.set()

    sub = await nc.subscribe(progress_subject(eid), cb=on_progress)
    try:
        client = Client(nc, layout=layout)
        path = tmp_path / "once.yaml"
        path.write_text(loop_playbook(table, mode, concurrency, iterations, chunk_size))
        entry = await client.register(path)
        await client.start(entry.path, execution_id=eid)
        done = asyncio.ensure_future(client.wait(eid, timeout=150))
        while not done.done():
            died = asyncio.ensure_future(tools_pod.proc.wait())
            progressed = asyncio.ensure_future(moved.wait())
            await asyncio.wait({done, died, progressed}, return_when=asyncio.FIRST_COMPLETED)
            moved.clear()
            if thresholds and done_so_far[0] >= thresholds[0] and not done.done():
                thresholds.pop(0)
                await tools_pod.kill()  # wherever its work is: mid-tool, mid-sink, mid-answer
            if tools_pod.proc.returncode is not None and not done.done():
                assert tools_pod.proc.returncode == -signal.SIGKILL, tools_pod.log.read_text()[-3000:]
                killed += 1
                tools_pod = await tools()
            died.cancel()
            progressed.cancel()
        status = done.result()
        assert status.state == "COMPLETED", status.error
    finally:
        await sub.unsubscribe()
        await tools_pod.stop()
        await runtime.stop(drain_timeout=0.2)
        await nc.close()
    # each iteration's rows, exactly once
    assert await admin(postgres, f"SELECT count(*), count(DISTINCT (i, part)) FROM {table}") == [
        (iterations * PARTS, iterations * PARTS)
    ]
    assert await admin(postgres, f"SELECT min(i), max(i), count(DISTINCT i) FROM {table}") == [
        (0, iterations - 1, iterations)
    ]
    if ledger is not None:
        ledger[:] = await admin(
            postgres,
            "SELECT command_id, count(*), count(DISTINCT written_at) FROM actors_ledger"
            f" WHERE execution_id = '{eid}' GROUP BY command_id ORDER BY command_id",
        )
    return killed


@pytest.mark.timeout(240)
async def test_a_tools_pod_killed_between_the_sinks_commit_and_its_answer_writes_each_row_once(
    nats_server: NatsServer, tmp_path: Path, postgres: Database, table: str
) -> None:
    # chunked: a kill loses a whole chunk's answer, some of its iterations committed
    failpoint = "postgres.committed=kill@250"
    killed = await run_with_kills(
        nats_server, tmp_path, postgres, table, mode="chunked", concurrency=100, failpoint=failpoint, kills=3
    )
    assert killed == 3  # each by the failpoint: committed, then killed before the answer


@pytest.mark.timeout(240)
async def test_a_tools_pod_killed_at_random_times_writes_each_row_once(
    nats_server: NatsServer, tmp_path: Path, postgres: Database, table: str
) -> None:
    # a random point in each of three spans, the last well before the end: progress is
    # published every 0.25 s at most, and the loop must still be running when it passes
    kill_at = [random.randrange(lo, hi) for lo, hi in ((30, 300), (360, 600), (660, 800))]
    killed = await run_with_kills(
        nats_server, tmp_path, postgres, table, mode="async", concurrency=10, kill_at=kill_at, kills=3
    )
    assert killed == 3, kill_at


@pytest.mark.timeout(120)
async def test_a_chunk_delivered_again_after_its_commit_writes_its_rows_once(
    nats_server: NatsServer, tmp_path: Path, postgres: Database, table: str
) -> None:
    # killed right after the first chunk's one transaction committed, before its answer:
    # the chunk is delivered again, finds each item's ledger row and writes nothing more
    ledger: list[tuple[Any, ...]] = []
    killed = await run_with_kills(
        nats_server, tmp_path, postgres, table, mode="chunked", concurrency=8, failpoint="postgres.committed=kill@1",
        kills=1, iterations=24, chunk_size=4, ledger=ledger,
    )  # fmt: skip
    assert killed == 1
    # each iteration recorded once, each chunk's items in one transaction (rows: run_with_kills)
    assert [(n, tx) for _, n, tx in ledger] == [(4, 1)] * 6


@pytest.mark.timeout(180)
async def test_a_chunk_delivered_again_whose_write_together_fails_retryably_writes_its_committed_item_once(
    nats_server: NatsServer, tmp_path: Path, postgres: Database, table: str
) -> None:
    # first delivery: item 3's second row breaks a check, so the chunk's items are written
    # one by one; the pod is killed right after item 0's commit. Second delivery: item 0 is
    # found committed, and the write together of 1 to 3 meets a serialization failure (the
    # second time item 1's first row is copied). Item 0 must answer its stored result, not
    # the retryable error (its retry, a command of its own, would write its rows again)
    await as_app(
        postgres,
        f"""CREATE TABLE {table} (i int NOT NULL, part int NOT NULL, CHECK (NOT (i = 3 AND part = 1)));
        CREATE SEQUENCE {table}_n;
        CREATE FUNCTION {table}_f() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN IF NEW.i = 1 AND NEW.part = 0 AND nextval('{table}_n') = 2 THEN
          RAISE EXCEPTION 'could not serialize' USING ERRCODE = '40001'; END IF; RETURN NEW; END $$;
        CREATE TRIGGER {table}_t BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION {table}_f();""",
    )
    layout = make_layout()
    nc = await connect(nats_server.url, name="test")
    await ensure(nc.jetstream(), layout)
    runtime = await start_roles(nc, layout=layout, roles=("engine", "counter", "projector", "retention"))
    logs = tmp_path / "logs"
    logs.mkdir()
    env = {"ACTORS_CREDENTIAL_DB": json.dumps(postgres.credential())}
    armed = {**env, FAILPOINTS: "postgres.committed=kill@1"}
    tools = await PodProcess.start("tools", url=nats_server.url, layout=layout, logs=logs, name="tools1", env=armed)
    eid = "dup" + os.urandom(6).hex()
    try:
        await tools.ready()
        client = Client(nc, layout=layout)
        path = tmp_path / "p.yaml"
        path.write_text(
            playbook(
                "pg-dup",
                f"""
  - step: fan
    loop: {{collection: "{{{{ range(4) | list }}}}", element: i, mode: chunked, chunk_size: 4, tolerated_failures: 1}}
    tool: noop
    timeout: 10
    retry: {{when: "{{{{ error is not none and error.retryable }}}}", then: {{max_attempts: 3, initial_delay: 0.1}}}}
    args: {{rows: [{{i: "{{{{ i }}}}", part: 0}}, {{i: "{{{{ i }}}}", part: 1}}]}}
    sink: {{tool: postgres, table: {table}, auth: {{type: postgres, credential: db}},
           args: {{rows: "{{{{ result.rows }}}}"}}}}
""",
            )
        )
        entry = await client.register(path)
        await client.start(entry.path, execution_id=eid)
        assert await asyncio.wait_for(tools.proc.wait(), 60) == -signal.SIGKILL, tools.log.read_text()[-3000:]
        assert await admin(postgres, f"SELECT i, part FROM {table} ORDER BY 1, 2") == [(0, 0), (0, 1)]
        tools = await PodProcess.start("tools", url=nats_server.url, layout=layout, logs=logs, name="tools2", env=env)
        await tools.ready()
        status = await client.wait(eid, timeout=120)
        assert status.state == "COMPLETED", status.error
        done = [r for r in await client.iterations(eid) if isinstance(r, ChunkDone)]
    finally:
        await tools.stop()
        await runtime.stop(drain_timeout=0.2)
        await nc.close()
    assert await admin(postgres, f"SELECT i, part, count(*) FROM {table} GROUP BY 1, 2 ORDER BY 1, 2") == [
        (i, p, 1) for i in range(3) for p in range(2)
    ]  # once each, nothing of 3
    # one answer, of the chunk's first attempt: 1 and 2 written alone, 3 failed by its row
    assert [(r.attempt_number, [o.error.type if o.error else None for o in r.outcomes]) for r in done] == [
        (1, [None, None, None, "CheckViolation"])
    ]
