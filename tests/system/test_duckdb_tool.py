"""The `duckdb` tool against a running system (issue 27, item 5): SQL over the step's
inputs and over files, parameters bound by DuckDB, DuckDB's types as documented JSON
values, the row cap, and a query's time, memory and files bounded in its worker process
while the pod goes on serving other steps.

Each test runs playbooks through a real nats-server with every actor; the pod lets
duckdb steps open files in one directory the test makes (`ACTORS_DUCKDB_DIRS`) and
nowhere else.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
import pytest_asyncio

from actors.tools.actor import ToolActor
from tests.conftest import System, wait_for
from tests.support.bad_playbooks import failed_step_error, good_run_completes

pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The one directory the pod lets duckdb steps open files in: set before the system
    starts (its tool actor reads the setting then)."""
    allowed = tmp_path / "data"
    allowed.mkdir()
    monkeypatch.setenv("ACTORS_DUCKDB_DIRS", str(allowed))
    return allowed


@pytest_asyncio.fixture
async def duck(files: Path, system: System) -> AsyncIterator[System]:
    yield system


def playbook(name: str, steps: str) -> str:
    return f"""
apiVersion: actors/v1
kind: Playbook
metadata: {{name: {name}}}
workflow:
{steps}
"""


def one_query(name: str, tool: dict[str, Any], args: dict[str, Any] | None = None, timeout: float = 60) -> str:
    """A playbook whose one step `q` runs a duckdb tool (written as JSON: valid YAML)."""
    step = f"  - step: q\n    tool: {json.dumps({'kind': 'duckdb', **tool})}\n    timeout: {timeout}\n"
    if args is not None:
        step += f"    args: {json.dumps(args)}\n"
    return playbook(name, step)


async def query(system: System, tool: dict[str, Any], args: dict[str, Any] | None = None) -> dict[str, Any]:
    eid, status = await system.run_yaml(one_query("q", tool, args), timeout=60)
    assert status.state == "COMPLETED", await failed_step_error(system, eid, "q")
    result: dict[str, Any] = (await system.client.result(eid))["q"]
    return result


async def query_fails(system: System, tool: dict[str, Any], args: dict[str, Any] | None = None) -> dict[str, Any]:
    eid, status = await system.run_yaml(one_query("bad", tool, args), timeout=60)
    assert status.state == "FAILED"
    return await failed_step_error(system, eid, "q")


def duckdb_pool_pids(system: System) -> list[int]:
    pids: list[int] = []
    for actor in system.runtime.find(ToolActor):
        assert isinstance(actor, ToolActor)
        pids += actor.resources.duckdb_pool().pids()
    return pids


# --- parameters -----------------------------------------------------------------------

HOSTILE = [
    "x'); DROP TABLE t; --",
    "' OR '1'='1",
    '"; DELETE FROM t; --',
    "$$ || (SELECT 1) || $$",
    "\\'; SELECT 1; --",
    "ünïcødé \u2028 \x00 end",
]


@pytest.mark.asyncio
@pytest.mark.parametrize("value", HOSTILE)
async def test_hostile_strings_are_bound_as_values_never_run_as_sql(duck: System, value: str) -> None:
    """Each value comes back as the very string it was, and the table it names in its
    SQL-looking text is still there with its one row: DuckDB bound it."""
    result = await query(
        duck,
        {
            "query": "CREATE TABLE t AS SELECT 1 AS id; INSERT INTO t VALUES (2); "
            "SELECT $v AS v, length($v) AS n, (SELECT count(*) FROM t) AS rows_in_t"
        },
        {"v": value},
    )
    assert result["rows"] == [{"v": value, "n": len(value), "rows_in_t": 2}]


@pytest.mark.asyncio
async def test_the_query_is_never_a_template(duck: System) -> None:
    """`query` is taken as written: `{{ }}` in it is SQL text, not a template (a value
    can reach the SQL only as a bound parameter)."""
    result = await query(duck, {"query": "SELECT '{{ 1 + 1 }}' AS t, $n + 1 AS n"}, {"n": 41})
    assert result["rows"] == [{"t": "{{ 1 + 1 }}", "n": 42}]


@pytest.mark.asyncio
async def test_a_parameter_the_args_lack_fails_clearly(duck: System) -> None:
    error = await query_fails(duck, {"query": "SELECT $missing AS m"}, {"other": 1})
    assert "missing" in error["message"], error


@pytest.mark.asyncio
async def test_every_statement_runs_in_order_whatever_rows_the_earlier_ones_return(duck: System) -> None:
    """Statements before the last run to their end (their rows dropped): one that returns
    rows does not stop the next, and an error late in its rows fails the step."""
    result = await query(
        duck,
        {
            "query": "SELECT 1; CREATE TABLE t AS SELECT 1 AS a; SELECT * FROM t; PRAGMA version; "
            "INSERT INTO t SELECT $n; FROM t; SELECT count(*) AS n, sum(a) AS total FROM t"
        },
        {"n": 41},
    )
    assert result["rows"] == [{"n": 2, "total": 42}]
    error = await query_fails(
        duck,
        {"query": "SELECT CASE WHEN range = 50000 THEN error('late in the rows') END FROM range(100000); SELECT 1"},
    )
    assert "late in the rows" in error["message"], error


# --- inputs and files ---------------------------------------------------------------------


@pytest.mark.asyncio
async def test_inputs_are_tables_the_sql_reads(duck: System) -> None:
    """A previous step's rows (here a data step's) become a table; rows with different
    keys give the union of columns, a missing key NULL."""
    steps = """
  - step: fetch
    args:
      rows:
        - {id: 1, country: nl, amount: 10.5}
        - {id: 2, country: nl, amount: 4.5}
        - {id: 3, country: de, amount: 1, note: "it's late"}
    next: agg
  - step: agg
    tool:
      kind: duckdb
      inputs: {pages: "{{ fetch.rows }}", ids: [1, 3]}
      query: |
        SELECT country, count(*) AS n, sum(amount) AS total, max(note) AS note
        FROM pages WHERE id IN (SELECT value FROM ids) OR country = $country
        GROUP BY country ORDER BY country
    args: {country: nl}
"""
    eid, status = await duck.run_yaml(playbook("inputs", steps), timeout=60)
    assert status.state == "COMPLETED", await failed_step_error(duck, eid, "agg")
    result = (await duck.client.result(eid))["agg"]
    assert result["rows"] == [
        {"country": "de", "n": 1, "total": 1.0, "note": "it's late"},
        {"country": "nl", "n": 2, "total": 15.0, "note": None},
    ]
    assert result["row_count"] == 2
    assert [c["name"] for c in result["columns"]] == ["country", "n", "total", "note"]


@pytest.mark.asyncio
async def test_input_keys_that_differ_only_in_case_are_refused_naming_them(duck: System) -> None:
    """DuckDB's names are case-insensitive (ASCII): `id` and `ID` cannot be two columns,
    and DuckDB's own conversion would give one key's value under both names. The step
    fails naming the keys, whether they meet in one row or in two; keys that differ
    beyond ASCII case (`ä`, `Ä`) are two columns, as DuckDB has them."""
    error = await query_fails(
        duck, {"query": "SELECT * FROM t", "inputs": {"t": [{"id": 1, "ID": 99, "Amount": 5, "amount": 7}]}}
    )
    assert error["type"] == "ToolConfigError", error
    assert "'id', 'ID'" in error["message"] and "'Amount', 'amount'" in error["message"], error
    assert "'t'" in error["message"], error
    error = await query_fails(duck, {"query": "SELECT * FROM t", "inputs": {"t": [{"a": 1}, {"b": 2, "A": 3}]}})
    assert error["type"] == "ToolConfigError" and "'a', 'A'" in error["message"], error
    result = await query(duck, {"query": "SELECT * FROM t", "inputs": {"t": [{"ä": 1, "Ä": 2}]}})
    assert result["rows"] == [{"ä": 1, "Ä": 2}]


@pytest.mark.asyncio
async def test_csv_parquet_and_json_files_in_the_allowed_directory(duck: System, files: Path) -> None:
    (files / "sales.csv").write_text("region,amount\nnorth,3\nsouth,4\nnorth,5\n")
    (files / "people.json").write_text('[{"name": "ada", "age": 36}, {"name": "alan", "age": 41}]')
    writer = duckdb.connect()
    writer.execute(
        f"COPY (SELECT range AS id, range * 2 AS twice FROM range(100)) TO '{files / 'nums.parquet'}' (FORMAT parquet)"
    )
    writer.close()
    result = await query(
        duck,
        {
            "query": f"""
            SELECT
              (SELECT sum(amount) FROM read_csv_auto('{files / "sales.csv"}') WHERE region = $region) AS north,
              (SELECT sum(twice) FROM read_parquet('{files / "nums.parquet"}')) AS twice,
              (SELECT max(age) FROM read_json_auto('{files / "people.json"}')) AS oldest
            """
        },
        {"region": "north"},
    )
    assert result["rows"] == [{"north": 8, "twice": 9900, "oldest": 41}]


@pytest.mark.asyncio
async def test_files_outside_the_allowed_directory_are_refused(duck: System, files: Path, tmp_path: Path) -> None:
    """A file beside the allowed directory, one reached through `..`, a system file, a
    database elsewhere, and the setting that would open them: all refused."""
    outside = tmp_path / "secret.csv"
    outside.write_text("token\nhunter2\n")
    for path in (outside, files / ".." / "secret.csv", Path("/etc/passwd")):
        error = await query_fails(duck, {"query": f"SELECT * FROM read_csv_auto('{path}')"})
        assert error["type"] == "PermissionException", error
        assert "hunter2" not in json.dumps(error)
    error = await query_fails(duck, {"query": "SELECT 1", "database": str(tmp_path / "elsewhere.duckdb")})
    assert error["type"] == "FileNotAllowed" and str(files) in error["message"], error
    assert not (tmp_path / "elsewhere.duckdb").exists()
    error = await query_fails(
        duck, {"query": f"SET enable_external_access = true; SELECT * FROM read_csv_auto('{outside}')"}
    )
    assert "locked" in error["message"], error
    error = await query_fails(duck, {"query": f"COPY (SELECT 1) TO '{tmp_path / 'out.csv'}'"})
    assert error["type"] == "PermissionException", error
    assert not (tmp_path / "out.csv").exists()


@pytest.mark.asyncio
async def test_a_symlink_is_followed_only_to_a_file_in_an_allowed_directory(
    duck: System, files: Path, tmp_path: Path
) -> None:
    """A link in the allowed directory to a file there reads it; a link to a file or a
    directory outside is refused like the path it leads to (DuckDB checks where it leads)."""
    (files / "sales.csv").write_text("amount\n3\n")
    (files / "alias.csv").symlink_to(files / "sales.csv")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.csv").write_text("token\nhunter2\n")
    (files / "secret.csv").symlink_to(outside / "secret.csv")
    (files / "elsewhere").symlink_to(outside)
    result = await query(duck, {"query": f"SELECT sum(amount) AS s FROM read_csv_auto('{files / 'alias.csv'}')"})
    assert result["rows"] == [{"s": 3}]
    for path in (files / "secret.csv", files / "elsewhere" / "secret.csv"):
        error = await query_fails(duck, {"query": f"SELECT * FROM read_csv_auto('{path}')"})
        assert error["type"] == "PermissionException", error
        assert "hunter2" not in json.dumps(error)
    error = await query_fails(duck, {"query": f"COPY (SELECT 1) TO '{files / 'elsewhere' / 'out.csv'}'"})
    assert error["type"] == "PermissionException", error
    assert not (outside / "out.csv").exists()


@pytest.mark.asyncio
async def test_a_database_file_persists_across_steps_and_executions(duck: System, files: Path) -> None:
    db = str(files / "warehouse.duckdb")
    steps = f"""
  - step: create
    tool: {{kind: duckdb, database: "{db}", query: "CREATE TABLE events (id INTEGER, what VARCHAR)"}}
    next: load
  - step: load
    tool:
      kind: duckdb
      database: "{db}"
      inputs: {{batch: [{{id: 1, what: a}}, {{id: 2, what: b}}]}}
      query: "INSERT INTO events SELECT id, what FROM batch"
"""
    eid, status = await duck.run_yaml(playbook("load", steps), timeout=60)
    assert status.state == "COMPLETED", await failed_step_error(duck, eid, "load")
    assert (await duck.client.result(eid))["load"]["rows"] == [{"Count": 2}]
    result = await query(duck, {"database": db, "query": "SELECT id, what FROM events ORDER BY id"})
    assert result["rows"] == [{"id": 1, "what": "a"}, {"id": 2, "what": "b"}]


# --- types ----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_duckdb_types_come_back_as_the_documented_json_values(duck: System) -> None:
    result = await query(
        duck,
        {
            "query": """
            SELECT 12345678901234567890.123456789::DECIMAL(38,9) AS dec,
                   DATE '2024-02-29' AS d,
                   TIMESTAMP '2024-02-29 13:14:15.5' AS ts,
                   TIMESTAMPTZ '2024-02-29 13:14:15+02' AS tstz,
                   TIME '01:02:03' AS t,
                   INTERVAL '1 month 2 days 03:04:05' AS iv,
                   TIMESTAMP_NS '2024-01-01 00:00:00.123456789' AS ns,
                   '\\xAA\\x00\\xFF'::BLOB AS b,
                   [1, 2, NULL] AS l,
                   {'a': 1, 'when': DATE '2024-01-01'} AS s,
                   MAP(['k1', 'k2'], [1, 2]) AS m,
                   MAP([1, 2], ['x', 'y']) AS mi,
                   '{"a": [1, true]}'::JSON AS j,
                   'NaN'::DOUBLE AS nan, 'Infinity'::DOUBLE AS inf, 0.25::DOUBLE AS f,
                   UUID '12345678-1234-5678-1234-567812345678' AS u,
                   170141183460469231731687303715884105727::HUGEINT AS h,
                   true AS yes, NULL::INTEGER AS nothing
            """
        },
    )
    assert result["rows"] == [
        {
            "dec": "12345678901234567890.123456789",
            "d": "2024-02-29",
            "ts": "2024-02-29T13:14:15.500000",
            "tstz": "2024-02-29T11:14:15+00:00",
            "t": "01:02:03",
            "iv": "1 month 2 days 03:04:05",
            "ns": "2024-01-01 00:00:00.123456789",
            "b": "qgD/",
            "l": [1, 2, None],
            "s": {"a": 1, "when": "2024-01-01"},
            "m": {"k1": 1, "k2": 2},
            "mi": [{"key": 1, "value": "x"}, {"key": 2, "value": "y"}],
            "j": {"a": [1, True]},
            "nan": "NaN",
            "inf": "Infinity",
            "f": 0.25,
            "u": "12345678-1234-5678-1234-567812345678",
            "h": 170141183460469231731687303715884105727,
            "yes": True,
            "nothing": None,
        }
    ]
    types = {c["name"]: c["type"] for c in result["columns"]}
    assert types["dec"] == "DECIMAL(38,9)" and types["iv"] == "INTERVAL" and types["m"] == "MAP(VARCHAR, INTEGER)"


# --- limits ---------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_result_over_max_rows_fails_naming_the_cap(duck: System) -> None:
    exactly = await query(duck, {"query": "SELECT range AS i FROM range(5)", "max_rows": 5})
    assert exactly["row_count"] == 5
    error = await query_fails(duck, {"query": "SELECT range AS i FROM range(6)", "max_rows": 5})
    assert error["type"] == "TooManyRows" and "max_rows (5)" in error["message"], error
    error = await query_fails(duck, {"query": "SELECT range AS i FROM range(10001)"})
    assert error["type"] == "TooManyRows" and "max_rows (10,000)" in error["message"], error


HUGE = "SELECT count(*) FROM range(100000000) a, range(100000000) b"  # a cross join of 10^16 rows


@pytest.mark.asyncio
async def test_a_query_past_its_timeout_is_killed_and_the_pod_goes_on(duck: System) -> None:
    """The step fails `Timeout` and its worker process is killed; a duckdb step after it works."""
    eid = await duck.start_yaml(one_query("huge", {"query": HUGE}, timeout=2))
    pids = await wait_for(lambda: _async(duckdb_pool_pids(duck)), timeout=30)
    status = await duck.client.wait(eid, timeout=60)
    assert status.state == "FAILED"
    error = await failed_step_error(duck, eid, "q")
    assert error["type"] == "Timeout", error
    for pid in pids:
        await wait_for(lambda pid=pid: _async(not _alive(pid)), timeout=10)
    assert (await query(duck, {"query": "SELECT 42 AS x"}))["rows"] == [{"x": 42}]


@pytest.mark.asyncio
async def test_a_long_query_runs_beside_other_executions_and_a_cancel_kills_it(duck: System) -> None:
    """Nothing of a query runs on the pod's event loop: while it runs, another execution's
    steps complete; a cancel kills its worker process."""
    eid = await duck.start_yaml(one_query("huge", {"query": HUGE}, timeout=600))
    await wait_for(lambda: _async(duckdb_pool_pids(duck)), timeout=30)
    # its worker booted and took the query (a cancel during the boot leaves the worker booting, rightly)
    (actor,) = duck.runtime.find(ToolActor)
    pool = actor.resources.duckdb_pool()
    (worker,) = await wait_for(lambda: _async([w for w in pool._workers if w.ready and w.calls]), timeout=30)
    await good_run_completes(duck)  # while the query runs
    running = await duck.client.status(eid)
    assert running is not None and running.state == "RUNNING", "the huge query ended first"
    await duck.client.cancel(eid, reason="test over")
    assert (await duck.client.wait(eid, timeout=60)).state == "CANCELLED"
    await wait_for(lambda: _async(not _alive(worker.pid)), timeout=10)  # killed, not left running the join


@pytest.mark.asyncio
async def test_a_query_past_its_memory_fails_the_step_not_the_pod(duck: System) -> None:
    error = await query_fails(
        duck,
        {"query": "SELECT max(x) FROM (SELECT range AS x FROM range(50000000) ORDER BY random())", "memory": 64},
    )
    assert error["type"] == "OutOfMemoryException", error
    assert "64.0 MiB" in error["message"], error
    await good_run_completes(duck)
    assert (await query(duck, {"query": "SELECT 1 AS one"}))["rows"] == [{"one": 1}]


async def _async(value: Any) -> Any:
    return value


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_pod_refuses_a_relative_duckdb_directory() -> None:
    from actors.tools.kinds.duckdb import duckdb_dirs

    assert duckdb_dirs("/a:/b/:") == ("/a", "/b")
    with pytest.raises(ValueError, match="ACTORS_DUCKDB_DIRS"):
        duckdb_dirs("/a:data")
