"""Rows per second into PostgreSQL through a postgres sink in a loop, as a ratio to plain
psycopg COPY of the same rows, measured in the same run (issue #27).

    python -m bench.sink [--iterations 1000] [--rows 100] [--rounds 5] [--mode chunked]
                         [--concurrency 200] [--chunk-size 20] [--pool 4]
                         [--tools process|inline] [--synchronous-commit on]
    python -m bench.sink --writes-only [--rounds 3]   # the writes' CPU alone (`write_cpu`)

One embedded nats-server, the engine, counter and projector in this process, the tools
role in a process of its own (`actors-cli serve --role tools`, as deployed; `--tools
inline`: in this process too), and a throwaway PostgreSQL cluster
(tests/support/postgres.py; Debian's `postgresql` package). The loop runs `--iterations`
python iterations (chunked: `--chunk-size` per command), each returning `--rows` rows
(int, int, text, numeric, jsonb) that its sink appends to a table: COPY and the
exactly-once ledger rows, on the pod's pool of `--pool` connections, in one transaction
per chunk in chunked mode (each item its own ledger row: actors/tools/chunksinks.py), per
iteration in the other modes. The baselines write the same rows with psycopg alone on one connection:
`copy_per_iteration`, one COPY transaction per iteration's rows (the same unit of work:
what a sink's atomicity asks for), and `copy_once`, all of them in one COPY. Rounds
alternate loop and baselines (the table emptied before each), so drift in the
machine's load hits both alike; ratios are of the medians. The last line is one JSON
object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from actors.client import Client
from actors.config.settings import Settings
from actors.pod.roles import connect, start_roles
from streams.layout import Layout
from streams.server import NatsServer
from tests.support.pods import PodProcess
from tests.support.postgres import Postgres

TABLE = "bench_sink"
DDL = f"CREATE TABLE {TABLE} (i int NOT NULL, j int NOT NULL, name text, amount numeric, doc jsonb)"

PLAYBOOK = """apiVersion: actors/v1
kind: Playbook
metadata: {name: bench_sink}
workflow:
  - step: each
    loop:
      collection: "{{ range(%(iterations)d) | list }}"
      element: n
      mode: %(mode)s
      concurrency: %(concurrency)d
      chunk_size: %(chunk_size)d
    tool:
      kind: python
      code: |
        def main(i, rows):
            return [{"i": i, "j": j, "name": f"row {i}-{j}", "amount": f"{j}.25", "doc": {"k": j}} for j in range(rows)]
    args: {i: "{{ n }}", rows: %(rows)d}
    sink:
      tool: postgres
      table: %(table)s
      mode: append
      auth: {type: postgres, credential: bench}
      args: {rows: "{{ result }}"}
"""


def rows_of(i: int, rows: int) -> list[dict[str, Any]]:
    """What iteration `i` returns (the same as the playbook's python)."""
    return [{"i": i, "j": j, "name": f"row {i}-{j}", "amount": f"{j}.25", "doc": {"k": j}} for j in range(rows)]


async def copy_rows(conninfo: str, batches: list[list[dict[str, Any]]]) -> float:
    """COPY `batches` into the table, one transaction each, on one connection: seconds."""
    import psycopg
    from psycopg.types.json import Jsonb

    async with await psycopg.AsyncConnection.connect(conninfo) as conn:
        t0 = time.perf_counter()
        for batch in batches:
            async with (
                conn.transaction(),
                conn.cursor().copy(f"COPY {TABLE} (i, j, name, amount, doc) FROM STDIN") as copy,
            ):
                for r in batch:
                    await copy.write_row((r["i"], r["j"], r["name"], r["amount"], Jsonb(r["doc"])))
        return time.perf_counter() - t0


async def bench(
    iterations: int,
    rows: int,
    rounds: int,
    mode: str,
    concurrency: int,
    sync_commit: bool,
    *,
    separate_tools: bool = True,
    pool: int = 4,
    chunk_size: int = 20,
    tools_pods: int = 1,
) -> dict[str, Any]:
    pg = await Postgres.start(synchronous_commit=sync_commit)
    server = await NatsServer.start()
    conninfo = pg.conninfo("postgres")
    await pg.sql(DDL)
    nc = await connect(server.url, name="bench-sink")
    layout = Layout()
    credentials = {"BENCH": json.dumps({"dsn": conninfo})}
    settings = Settings(credentials=credentials, postgres_pool_max=pool)
    pods: list[PodProcess] = []
    if separate_tools:  # as a deployment runs it: the tools role a process of its own
        roles = ("engine", "counter", "projector", "retention")
        runtime = await start_roles(nc, layout=layout, settings=settings, roles=roles)
        env = {"ACTORS_CREDENTIAL_BENCH": credentials["BENCH"], "ACTORS_POSTGRES_POOL_MAX": str(pool)}
        if os.geteuid() == 0:  # a root pod's steps run as nobody, who cannot read this checkout's python
            env["ACTORS_STEP_USER"] = "root"
        logs = Path(tempfile.mkdtemp(prefix="bench-sink-"))
        for k in range(tools_pods):
            pods.append(
                await PodProcess.start("tools", url=server.url, layout=layout, logs=logs, name=f"tools{k}", env=env)
            )
        for pod in pods:
            await pod.ready()
    else:
        runtime = await start_roles(nc, layout=layout, settings=settings)
    client = Client(nc, layout=layout)
    total = iterations * rows
    times: dict[str, list[float]] = {"sink": [], "loop_without_sink": [], "copy_per_iteration": [], "copy_once": []}
    every = [rows_of(i, rows) for i in range(iterations)]
    one = [[r for batch in every for r in batch]]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            f = Path(tmp) / "sink.yaml"
            text = {
                "iterations": iterations,
                "rows": rows,
                "mode": mode,
                "concurrency": concurrency,
                "chunk_size": chunk_size,
                "table": TABLE,
            }
            f.write_text(PLAYBOOK % text)
            entry = await client.register(f)
            bare = Path(tmp) / "bare.yaml"  # the same loop without its sink: what the loop alone costs
            bare.write_text((PLAYBOOK % text).split("    sink:")[0].replace("bench_sink}", "bench_sink_bare}"))
            bare_entry = await client.register(bare)

            async def loop(path: str, version: int) -> float:
                t0 = time.perf_counter()
                eid = await client.start(path, version=version)
                status = await client.wait(eid, timeout=600)
                if status.state != "COMPLETED":
                    raise SystemExit(f"the loop ended {status.state}: {status.error}")
                return time.perf_counter() - t0

            for r in range(rounds + 1):  # round 0 warms the workers, the pool and the ledger
                await pg.sql(f"TRUNCATE {TABLE}")
                took = await loop(entry.path, entry.version)
                await check_count(conninfo, total)
                bare_took = await loop(bare_entry.path, bare_entry.version)
                if r:
                    times["loop_without_sink"].append(bare_took)
                for name, batches in (("copy_per_iteration", every), ("copy_once", one)):
                    await pg.sql(f"TRUNCATE {TABLE}")
                    spent = await copy_rows(conninfo, batches)
                    await check_count(conninfo, total)
                    if r:
                        times[name].append(spent)
                if r:
                    times["sink"].append(took)
                    per, once = times["copy_per_iteration"][-1], times["copy_once"][-1]
                    print(
                        f"round {r}: sink {total / took:,.0f} rows/s, copy per iteration {total / per:,.0f}, "
                        f"copy once {total / once:,.0f}, the loop without its sink {total / bare_took:,.0f}",
                        flush=True,
                    )
    finally:
        for pod in pods:
            await pod.stop()
        await runtime.stop()
        await nc.close()
        await server.stop()
        await pg.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "bench": "sink",
        "iterations": iterations,
        "rows_per_iteration": rows,
        "rounds": rounds,
        "mode": mode,
        "concurrency": concurrency,
        "chunk_size": chunk_size if mode == "chunked" else None,
        "synchronous_commit": sync_commit,
        "tools": f"{tools_pods} process(es)" if separate_tools else "inline",
        "pool": pool,
        "sink_rows_per_s": round(total / med["sink"]),
        "copy_per_iteration_rows_per_s": round(total / med["copy_per_iteration"]),
        "copy_once_rows_per_s": round(total / med["copy_once"]),
        "loop_without_sink_rows_per_s": round(total / med["loop_without_sink"]),
        "ratio_vs_copy_per_iteration": round(med["copy_per_iteration"] / med["sink"], 3),
        "ratio_vs_copy_once": round(med["copy_once"] / med["sink"], 3),
        "ratio_vs_loop_without_sink": round(med["loop_without_sink"] / med["sink"], 3),
    }


async def write_cpu(iterations: int, rows: int, rounds: int, chunk_size: int) -> dict[str, Any]:
    """`--writes-only`: the sinks' writes alone, sequentially, without NATS or the loop: the
    CPU this process spends per iteration (`time.process_time`: what a tools pod's event
    loop pays) writing each iteration in a transaction of its own (`write_table`), and a
    chunk's iterations in one (`write_appends`); medians of `rounds`."""
    from actors.tools import pgwrite
    from actors.tools.call import CommandIdentity, ToolCall
    from actors.tools.credentials import CredentialSource
    from actors.tools.resources import ToolResources

    pg = await Postgres.start(synchronous_commit=True)
    await pg.sql(DDL)
    credential = {"dsn": pg.conninfo("postgres")}
    res = ToolResources(credentials=CredentialSource(None, {"BENCH": json.dumps(credential)}))
    tool = {"kind": "postgres", "table": TABLE, "mode": "append", "credential": "bench"}
    every = [rows_of(i, rows) for i in range(iterations)]

    def call(i: int, command: str) -> ToolCall:
        identity = CommandIdentity("bench", command, i, "sink")
        return ToolCall(tool, {"rows": every[i]}, 60.0, None, res, None, credential, identity)

    cpu: dict[str, list[float]] = {"per_iteration": [], "per_chunk": []}
    try:
        for r in range(rounds + 1):  # round 0 warms the pool and the ledger
            await pg.sql(f"TRUNCATE {TABLE}")
            c0 = time.process_time()
            for i in range(iterations):
                await pgwrite.write_table(call(i, f"a{r}"), "bench", credential)
            c1 = time.process_time()
            await pg.sql(f"TRUNCATE {TABLE}")
            for k in range(0, iterations, chunk_size):
                chunk = [call(i, f"b{r}c{k}") for i in range(k, min(k + chunk_size, iterations))]
                await pgwrite.write_appends(chunk, [pgwrite.prepared(c) for c in chunk], "bench", credential)
            c2 = time.process_time()
            await check_count(credential["dsn"], iterations * rows)
            if r:
                cpu["per_iteration"].append((c1 - c0) / iterations * 1000)
                cpu["per_chunk"].append((c2 - c1) / iterations * 1000)
                print(f"round {r}: {cpu['per_iteration'][-1]:.3f} ms CPU an iteration alone, "
                      f"{cpu['per_chunk'][-1]:.3f} in chunks of {chunk_size}", flush=True)  # fmt: skip
    finally:
        await res.close()
        await pg.stop()
    alone, chunked = statistics.median(cpu["per_iteration"]), statistics.median(cpu["per_chunk"])
    return {
        "bench": "sink_writes",
        "iterations": iterations,
        "rows_per_iteration": rows,
        "rounds": rounds,
        "chunk_size": chunk_size,
        "cpu_ms_per_iteration_alone": round(alone, 3),
        "cpu_ms_per_iteration_in_chunks": round(chunked, 3),
    }


async def check_count(conninfo: str, expected: int) -> None:
    import psycopg

    async with await psycopg.AsyncConnection.connect(conninfo) as conn:
        cur = await conn.execute(f"SELECT count(*) FROM {TABLE}")
        row = await cur.fetchone()
    if row is None or row[0] != expected:
        raise SystemExit(f"the table holds {row} rows, not {expected}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=1000)
    p.add_argument("--rows", type=int, default=100, help="rows each iteration sinks")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--mode", choices=("async", "chunked", "sequential"), default="chunked")
    p.add_argument("--concurrency", type=int, default=200, help="iterations in flight")
    p.add_argument("--synchronous-commit", choices=("on", "off"), default="on")
    p.add_argument("--chunk-size", type=int, default=20, help="iterations per command in chunked mode")
    p.add_argument("--pool", type=int, default=4, help="ACTORS_POSTGRES_POOL_MAX of the tools pod")
    p.add_argument(
        "--tools", choices=("process", "inline"), default="process", help="the tools role in a process of its own"
    )
    p.add_argument("--tools-pods", type=int, default=1, help="tools processes (competing consumers)")
    p.add_argument(
        "--writes-only", action="store_true", help="the sinks' writes alone: CPU per iteration, alone and in chunks"
    )
    a = p.parse_args()
    if a.writes_only:
        print(json.dumps(asyncio.run(write_cpu(a.iterations, a.rows, a.rounds, a.chunk_size))))
        return
    out = asyncio.run(
        bench(
            a.iterations,
            a.rows,
            a.rounds,
            a.mode,
            a.concurrency,
            a.synchronous_commit == "on",
            separate_tools=a.tools == "process",
            pool=a.pool,
            chunk_size=a.chunk_size,
            tools_pods=a.tools_pods,
        )
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
