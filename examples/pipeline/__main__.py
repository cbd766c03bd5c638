"""Run the pipeline example end to end, in one command:

    python -m examples.pipeline                     # a throwaway Postgres, nats-server and every actor here
    python -m examples.pipeline --dsn postgresql://app:secret@127.0.0.1:5432/app   # your Postgres
    NATS_URL=nats://127.0.0.1:4222 python -m examples.pipeline --api-url http://api:8000
        # against a running system: its tools pods need the credential `main_db`
        # (ACTORS_CREDENTIAL_MAIN_DB='{"dsn": "..."}') and must reach the API

It starts the paginated API (examples/pipeline/api.py) on a free port, a PostgreSQL
cluster of its own unless `--dsn` names one (initdb + pg_ctl in a temporary directory,
tests/support/postgres.py; Debian's `postgresql` package), and a private nats-server with
every actor in this process unless NATS_URL is set; registers pipeline.yaml, runs it, and
prints each step's outcome, the aggregates and what the table holds. Exit code 0 when the
execution COMPLETED and the table holds every item of the API once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from actors.client import Client

HERE = Path(__file__).resolve().parent
PLAYBOOK = HERE / "pipeline.yaml"


async def run_pipeline(client: Client, *, api_url: str, page_size: int = 25, timeout: float = 120) -> dict[str, Any]:
    """Register and run pipeline.yaml against the API at `api_url`: the execution's id,
    state and result (`{"totals": ..., "stored": ...}`)."""
    entry = await client.register(PLAYBOOK)
    eid = await client.start(entry.path, version=entry.version, payload={"api_url": api_url, "page_size": page_size})
    status = await client.wait(eid, timeout=timeout)
    result = await client.result(eid) if status.state == "COMPLETED" else None
    return {"execution_id": eid, "state": status.state, "error": status.error, "result": result}


async def table_rows(dsn: str) -> list[tuple[Any, ...]]:
    """(id, name, country, amount_cents) of every row of raw_data, by id."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute("SELECT id, name, country, amount_cents FROM raw_data ORDER BY id")
        return await cur.fetchall()


async def main(argv: list[str] | None = None) -> int:
    from examples.pipeline.api import items, pages, serve

    p = argparse.ArgumentParser(prog="python -m examples.pipeline", description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", help="a PostgreSQL database to write to (default: a throwaway cluster of its own)")
    p.add_argument("--api-url", help="the API to fetch (default: examples/pipeline/api.py, started here)")
    p.add_argument("--items", type=int, default=100, help="items the API started here serves")
    p.add_argument("--page-size", type=int, default=25)
    p.add_argument(
        "--flaky", type=pages, default=(), help="pages whose first request the API started here answers 503, e.g. 2,4"
    )
    a = p.parse_args(argv)
    async with AsyncExitStack() as stack:
        api_url = a.api_url
        if api_url is None:
            api, api_url = serve(n=a.items, flaky=a.flaky)
            stack.callback(api.shutdown)
            print(f"API: {api_url}/items ({a.items} items, {a.page_size} a page)")
        dsn = a.dsn
        if dsn is None:
            from tests.support.postgres import Postgres, available

            why = available()
            if why is not None:
                print(f"cannot start a PostgreSQL cluster here: {why}; pass --dsn", file=sys.stderr)
                return 2
            pg = await Postgres.start()
            stack.push_async_callback(pg.stop)
            dsn = pg.conninfo("postgres")
            print(f"PostgreSQL: a throwaway cluster in {pg.root} (port {pg.port})")
        credential = json.dumps({"dsn": dsn})
        url = os.environ.get("NATS_URL")
        if url:
            client = await stack.enter_async_context(Client.connect(url))
        else:
            from actors.config.settings import Settings
            from actors.pod.roles import connect, start_roles
            from streams.server import NatsServer

            server = await NatsServer.start()
            stack.push_async_callback(server.stop)
            nc = await connect(server.url)
            stack.push_async_callback(nc.close)
            runtime = await start_roles(nc, settings=Settings(credentials={"MAIN_DB": credential}))
            stack.push_async_callback(runtime.stop)
            client = await stack.enter_async_context(Client.connect(server.url))
        out = await run_pipeline(client, api_url=api_url, page_size=a.page_size)
        print(f"execution {out['execution_id']}: {out['state']}")
        if out["state"] != "COMPLETED":
            print(f"error: {out['error']}", file=sys.stderr)
            return 1
        for log in await client.events(out["execution_id"]):
            if log.type in ("call.done", "call.error") and log.step:
                print(f"  {log.type:<10} {log.step} attempt {log.data.get('attempt_number')}")
        result = out["result"]
        print("DuckDB over the pages fetched:", json.dumps(result["totals"]["rows"]))
        print("Postgres over the table:      ", json.dumps(result["stored"]["rows"]))
        rows = await table_rows(dsn)
        print(f"raw_data holds {len(rows)} rows")
        if a.api_url is None:
            expected = [(i["id"], i["name"], i["country"], i["amount_cents"]) for i in items(a.items)]
            if rows != expected:
                print("raw_data does not hold each of the API's items once", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
