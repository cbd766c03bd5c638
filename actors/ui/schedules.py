"""The schedules page's API: every schedule with its next and last fire and the state of
the execution its last fire started, and the actions on one (pause, resume, delete,
run now). Registered by actors/ui/server.py (`add_routes`); the actions are POSTs, so
the server's guard (read-only, token, JSON from this origin) has checked them already.

The last fire and its execution come from the schedule's fire subject (the client's
`schedules`, actors/client/schedules.py): nothing is stored per fire for the page. The
states of the last runs are read at once, one status each."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from actors.client import Client, ScheduleError, ScheduleView
from actors.client.schedules import REQUEST_ID, check_schedule_name
from actors.wire.messages import ExecutionStatus


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/schedules", schedules)
    for verb in ("pause", "resume", "delete", "run"):
        router.add_post(f"/api/schedules/{{name}}/{verb}", action)


async def schedules(request: web.Request) -> web.Response:
    """`{"schedules": [row]}` by name; a row: the spec (`name, playbook, version, cron,
    timezone, payload, paused, created`), `next_fire` (RFC 3339, as the server announced
    it), `last_fire` (epoch seconds), `last_run_now`, `last_execution_id` and
    `last_state` (its status's state; PENDING while its start is queued)."""
    from actors.ui import server as srv  # imported here: server.py imports this module to register it

    client: Client = request.app[srv.CLIENT]
    views = sorted(await client.schedules(), key=lambda v: v.spec.name)
    statuses = await asyncio.gather(*(_status(client, v) for v in views))
    return srv._json({"schedules": [_row(v, st) for v, st in zip(views, statuses, strict=True)]})


async def _status(client: Client, view: ScheduleView) -> ExecutionStatus | None:
    return None if view.last_execution_id is None else await client.status(view.last_execution_id)


def _row(view: ScheduleView, status: ExecutionStatus | None) -> dict[str, Any]:
    s = view.spec
    state = None
    if view.last_execution_id is not None:
        state = status.state if status is not None else "PENDING"
    return {
        "name": s.name,
        "playbook": s.playbook,
        "version": s.version,
        "cron": s.cron,
        "timezone": s.timezone or "UTC",
        "payload": s.payload,
        "paused": s.paused,
        "created": s.created,
        "next_fire": view.next_fire,
        "last_fire": view.last_fire,
        "last_run_now": view.last_run_now,
        "last_execution_id": view.last_execution_id,
        "last_state": state,
    }


async def action(request: web.Request) -> web.Response:
    """pause, resume, delete: `{"name", "changed"}` (`changed`: false when it was paused,
    or not paused, already); run: `{"name", "execution_id"}`, its body `{"request": ID}`
    naming the click (the same request sent twice starts one execution)."""
    from actors.ui import server as srv

    client: Client = request.app[srv.CLIENT]
    verb = request.path.rsplit("/", 1)[-1]
    body = await srv._body(request)
    try:
        name = check_schedule_name(request.match_info["name"])
        if verb == "run":
            req = body.get("request")
            if not isinstance(req, str) or not REQUEST_ID.fullmatch(req):
                raise srv._refuse(400, f"request must be an id matching {REQUEST_ID.pattern} (one per click)")
            eid = await client.schedule_run_now(name, request_id=req)
            return srv._json({"name": name, "execution_id": eid})
        if verb == "pause":
            changed = await client.schedule_pause(name)
        elif verb == "resume":
            changed = await client.schedule_resume(name)
        else:
            await client.schedule_delete(name)
            changed = True
    except ScheduleError as e:
        raise srv._refuse(404 if str(e).startswith("no schedule") else 400, str(e)) from None
    return srv._json({"name": name, "changed": changed})
