"""A loop's failed items in the web UI: a page of them (`Client.failed_items`: requests by
the number of the execution's loops, whatever their size) and the redrive of them (`Client.redrive`, what
`actors-cli retry ID --failed-items` does). Registered by actors/ui/server.py
(`add_routes`); the redrive is a POST, guarded there like every action (`_check_action`).

An element and an error message are a user's values: sent as JSON, set by the page as
text (actors/ui/static/loopitems.js), never as markup."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from actors.client import Client, RetryRefused, UnknownExecution
from actors.client.items import MAX_PAGE, InvalidCursor

TRACEBACK = 4000  # characters of an item's traceback sent to the page (its last ones: where it failed)
MAX_STEP = 200  # characters of a step name in a query


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/executions/{id}/items", items)
    router.add_post("/api/executions/{id}/redrive", redrive)


async def items(request: web.Request) -> web.Response:
    """`{"execution_id", "step", "total", "items": [item], "next_after"}`: the failed
    items of the execution's loops (`?step=` one step's), in loop order then the order they failed,
    `?limit=` (1 to 1000, 50) after `?after=` (a page's `next_after`). `?failed=1` is
    the only listing there is (an item that succeeded keeps no record)."""
    from actors.ui import server  # imported here: server.py imports this module to register it

    eid = server._execution_id(request)
    limit = server._int(request, "limit", 50, low=1, high=MAX_PAGE) or 50
    step = request.query.get("step") or None
    if step is not None and len(step) > MAX_STEP:
        raise server._refuse(400, f"step must be at most {MAX_STEP} characters")
    if request.query.get("failed", "1") not in ("1", "true"):
        raise server._refuse(400, "only failed items are listed (failed=1): a succeeded item keeps no record")
    client: Client = request.app[server.CLIENT]
    try:
        page = await client.failed_items(eid, step, after=request.query.get("after") or None, limit=limit)
    except InvalidCursor as e:
        raise server._refuse(400, str(e)) from None
    body = page.as_json()
    for item in body["items"]:
        tb = item["error"].get("traceback")
        if tb and len(tb) > TRACEBACK:
            item["error"]["traceback"] = "…" + tb[-TRACEBACK:]
    return server._json(body)


async def redrive(request: web.Request) -> web.Response:
    """Run again only the failed items (of `{"step": name}`'s loop, or of every loop):
    `{"execution_id", "existing", "redriven": {step: count}}`; 400 with the one line of
    why when there is nothing to redrive, 404 for an unknown execution."""
    from actors.ui import server

    eid = server._execution_id(request)
    body = await server._body(request)
    step = body.get("step")
    if step is not None and not isinstance(step, str):
        raise server._refuse(400, "step must be a step name or null")
    client: Client = request.app[server.CLIENT]
    try:
        outcome = await client.redrive(eid, step=step or None)
    except UnknownExecution as e:
        raise server._refuse(404, str(e)) from None
    except RetryRefused as e:
        raise server._refuse(400, str(e)) from None
    answer: dict[str, Any] = {
        "execution_id": outcome.execution_id,
        "existing": outcome.existing,
        "redriven": outcome.redriven,
    }
    return server._json(answer)
