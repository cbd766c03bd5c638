"""The dead letters page's API: the letters newest first, a page at a time, each with
its reason, source, execution, subject, time and the head of the message it holds
(`Client.dead_letter_page`: a page costs the same however many letters there are).
Registered by actors/ui/server.py (`add_routes`).

A letter's message is whatever an actor could not handle (bytes that are not JSON, a
start too deep to decode): only its first HEAD characters are sent, as text, and the
page sets them as text (never markup)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from actors.client import Client, LogItem
from actors.client.deadletters import MAX_PAGE

HEAD = 500  # characters of a letter's message sent to the page
REASON = 2000  # characters of its reason


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/deadletters", dead_letters)


async def dead_letters(request: web.Request) -> web.Response:
    """`{"letters": [letter], "next": cursor|null}`, newest first; `?limit=` (1 to
    MAX_PAGE, 50) and `?before=` (a page's `next`). A letter: `seq, at, source,
    execution_id, reason, subject, head, size` (`size`: the message's length in
    characters; `head`: its first HEAD)."""
    from actors.ui import server  # imported here: server.py imports this module to register it

    limit = server._int(request, "limit", 50, low=1, high=MAX_PAGE) or 50
    before = server._int(request, "before", None, low=1, high=2**63)
    client: Client = request.app[server.CLIENT]
    items, cursor = await client.dead_letter_page(limit=limit, before=before)
    return server._json({"letters": [_letter(i) for i in items], "next": cursor})


def _letter(item: LogItem) -> dict[str, Any]:
    d = item.data
    if item.type == "undecodable":  # the letter itself could not be read
        d = {"source": None, "reason": f"this dead letter cannot be read: {d.get('error')}", "data": ""}
    text = str(d.get("data") or "")
    return {
        "seq": item.seq,
        "at": item.at,
        "source": d.get("source"),
        "execution_id": d.get("execution_id"),
        "reason": str(d.get("reason") or "")[:REASON],
        "subject": d.get("subject"),
        "head": text[:HEAD],
        "size": len(text),
    }
