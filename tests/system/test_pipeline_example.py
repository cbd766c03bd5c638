"""examples/pipeline end to end: its paginated API, every page through the flat-shape
postgres sink into `raw_data` (the session's throwaway cluster), then the DuckDB and
Postgres aggregates. The table must hold each of the API's items exactly once, and both
aggregates must be the API's own totals."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest
import pytest_asyncio

from actors.config.settings import Settings
from examples.pipeline.__main__ import run_pipeline, table_rows
from examples.pipeline.api import items, serve
from streams.server import NatsServer
from tests.conftest import System, of_type, running_system
from tests.support.postgres import Database

pytestmark = pytest.mark.asyncio

ITEMS = 103  # not a multiple of the page size: the last page is short


@pytest_asyncio.fixture
async def pod(nats_server: NatsServer, tmp_path: Path, postgres: Database) -> AsyncIterator[System]:
    """Every role in this process, with the example's credential `main_db`."""
    settings = Settings(credentials={"MAIN_DB": json.dumps({"dsn": postgres.url()})})
    async with running_system(nats_server, tmp_path, settings=settings) as system:
        yield system


def totals(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    by: dict[str, list[int]] = {}
    for r in rows:
        by.setdefault(str(r["country"]), []).append(int(str(r["amount_cents"])))
    return [{"country": c, "items": len(v), "amount_cents": sum(v)} for c, v in sorted(by.items())]


@pytest.mark.timeout(120)
async def test_the_pipeline_example_loads_every_page_once_and_aggregates_it(pod: System, postgres: Database) -> None:
    async with await psycopg.AsyncConnection.connect(postgres.url(), autocommit=True) as conn:
        await conn.execute("DROP TABLE IF EXISTS raw_data")
    api, url = serve(n=ITEMS)
    try:
        out = await run_pipeline(pod.client, api_url=url, page_size=25, timeout=90)
        assert out["state"] == "COMPLETED", out["error"]
        # a second run loads the API afresh: the table is emptied first, nothing doubles
        again = await run_pipeline(pod.client, api_url=url, page_size=25, timeout=90)
        assert again["state"] == "COMPLETED", again["error"]
    finally:
        api.shutdown()
    expected = items(ITEMS)
    assert await table_rows(postgres.url()) == [(i["id"], i["name"], i["country"], i["amount_cents"]) for i in expected]
    want = totals(expected)
    assert out["result"]["totals"]["rows"] == want  # DuckDB over the pages fetched
    assert out["result"]["stored"]["rows"] == want  # Postgres over what the sink wrote
    # five pages, five attempts of `fetch`, each with its sink
    done = of_type(await pod.events(out["execution_id"]), "call.done", "fetch")
    assert [d.data["attempt_number"] for d in done] == [1, 2, 3, 4, 5]


@pytest.mark.timeout(120)
async def test_an_api_error_on_a_page_past_the_error_rules_count_is_retried(pod: System, postgres: Database) -> None:
    """The retry rules share the step's one attempt count, pages included: the API
    failing its first request for pages 5 and 6 (attempts 5 and 7) is retried, not the
    step failed with four pages written, and each item is still loaded once."""
    async with await psycopg.AsyncConnection.connect(postgres.url(), autocommit=True) as conn:
        await conn.execute("DROP TABLE IF EXISTS raw_data")
    api, url = serve(n=ITEMS, flaky=(5, 6))
    try:
        out = await run_pipeline(pod.client, api_url=url, page_size=20, timeout=90)
    finally:
        api.shutdown()
    assert out["state"] == "COMPLETED", out["error"]
    expected = items(ITEMS)
    assert await table_rows(postgres.url()) == [(i["id"], i["name"], i["country"], i["amount_cents"]) for i in expected]
    assert out["result"]["totals"]["rows"] == totals(expected)
    events = await pod.events(out["execution_id"])
    failed = of_type(events, "call.error", "fetch")
    assert [e.data["attempt_number"] for e in failed] == [5, 7]
    assert all(e.data["error"]["status"] == 503 for e in failed), [e.data for e in failed]
    done = of_type(events, "call.done", "fetch")
    assert [d.data["attempt_number"] for d in done] == [1, 2, 3, 4, 6, 8]
