"""Approve / Reject on the execution page: a waiting approval step (`tool: {kind: wait,
approval: true}`) answered through the public client (`Client.approve`, what
`actors-cli approve` and `reject` do). Registered by actors/ui/server.py
(`add_routes`); a POST, guarded there like every action (`_check_action`: not
read-only, the token or the proxy's user header, JSON from this origin: no CSRF).

The answer's id is the wait's own (`approval_signal_id`): two clicks, or two people
at once, answer one wait once (the first); `by` is the proxy's user when the UI runs
behind one (`--user-header`), else `ui`."""

from __future__ import annotations

from aiohttp import web

from actors.client import Client, ExecutionNotFound, ExecutionNotKnownYet, InvalidSignal, NotWaiting, SignalRefused
from actors.client.signals import MAX_BY, MAX_COMMENT, clean_text

__all__ = ["add_routes"]

MAX_STEP = 200  # characters of a step name in a request


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_post("/api/executions/{id}/approval", approval)


async def approval(request: web.Request) -> web.Response:
    """`{"step": name|null, "approved": bool, "comment": text}` -> `{"execution_id",
    "signal_id", "accepted", "duplicate", "state"}`; `accepted` false (200) when the
    execution has ended meanwhile (nothing sent); `duplicate` true (200) when the wait
    had an answer already (someone else's, first: this one was not sent). 400 with the
    one line of why for a bad body, a rejection without a comment (blank once control
    characters are taken out), no approval step waiting; 404 for an unknown execution;
    503 with Retry-After while whether it exists cannot be told yet (starts queued)."""
    from actors.ui import server  # imported here: server.py imports this module to register it

    eid = server._execution_id(request)
    body = await server._body(request)
    step, approved, comment = body.get("step"), body.get("approved"), body.get("comment") or ""
    if step is not None and (not isinstance(step, str) or len(step) > MAX_STEP):
        raise server._refuse(400, f"step must be a step name of at most {MAX_STEP} characters, or null")
    if not isinstance(approved, bool):
        raise server._refuse(400, "approved must be true or false")
    if not isinstance(comment, str) or len(comment) > MAX_COMMENT:
        raise server._refuse(400, f"comment must be text of at most {MAX_COMMENT} characters")
    comment = clean_text(comment, limit=MAX_COMMENT, what="comment")  # as the client keeps it
    if not approved and not comment:
        raise server._refuse(400, "a rejection needs a comment: say why")
    cfg = request.app[server.CONFIG]
    user = (request.headers.get(cfg["user_header"], "") if cfg["user_header"] else "").strip()
    client: Client = request.app[server.CLIENT]
    try:
        reply = await client.approve(eid, step, approved=approved, comment=comment, by=user[:MAX_BY] or "ui")
    except ExecutionNotKnownYet as e:  # a start still queued may be its: asking again is safe
        refused = server._refuse(503, str(e))
        refused.headers["Retry-After"] = "1"
        raise refused from None
    except ExecutionNotFound as e:
        raise server._refuse(404, str(e)) from None
    except (NotWaiting, InvalidSignal, SignalRefused) as e:
        raise server._refuse(400, str(e)) from None
    state = None if reply.status is None else str(reply.status.state)
    return server._json(
        {
            "execution_id": eid,
            "signal_id": reply.signal_id,
            "accepted": reply.accepted,
            "duplicate": reply.duplicate,
            "state": state,
        }
    )
