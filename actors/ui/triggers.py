"""The triggers page's API: every trigger with its subject, stream, state and counts,
and the actions on one (pause, resume, delete). Registered by actors/ui/server.py
(`add_routes`); the actions are POSTs, so the server's guard (read-only, token, JSON
from this origin) has checked them already. Adding a trigger is the CLI's or the
client's (`actors-cli trigger add`): the page shows the command."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from actors.client import Client, TriggerError, TriggerView
from actors.client.triggers import check_trigger_name


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/triggers", triggers)
    for verb in ("pause", "resume", "delete"):
        router.add_post(f"/api/triggers/{{name}}/{verb}", action)


async def triggers(request: web.Request) -> web.Response:
    """`{"triggers": [row]}` by name; a row: the spec (`name, subject, stream, playbook,
    version, paused, created_at`), the pods' counts (`started, duplicates, errors,
    last_start, last_execution_id, last_error, last_error_at`), `waiting` (a stream
    trigger's messages not started yet) and `problem` (its consumer not made yet, or
    being deleted). A spec this version cannot read is `{name, unreadable, problem}`."""
    from actors.ui import server as srv  # imported here: server.py imports this module to register it

    client: Client = request.app[srv.CLIENT]
    try:
        views = await client.triggers()
    except TriggerError as e:  # no bucket yet: engine pods of an earlier version
        raise srv._refuse(503, str(e)) from None
    return srv._json({"triggers": [_row(v) for v in views]})


def _row(view: TriggerView) -> dict[str, Any]:
    s, st = view.spec, view.stats
    if view.unreadable is not None:
        # a spec this version cannot read: its name and why, so it can be deleted
        return {"name": s.name, "unreadable": view.unreadable, "problem": f"its spec cannot be read: {view.unreadable}"}
    return {
        "name": s.name,
        "subject": s.subject,
        "stream": s.stream,
        "playbook": s.playbook,
        "version": s.version,
        "paused": s.paused,
        "deleting": s.deleting,
        "created_at": s.created_at,
        "started": st.started,
        "duplicates": st.duplicates,
        "errors": st.errors,
        "last_start": st.last_start,
        "last_execution_id": st.last_execution_id,
        "last_error": st.last_error,
        "last_error_at": st.last_error_at,
        "waiting": view.waiting,
        "problem": view.problem,
    }


async def action(request: web.Request) -> web.Response:
    """pause, resume, delete: `{"name", "changed"}` (`changed`: false when it was
    paused, or not paused, already; for delete, when no trigger pod removed it yet)."""
    from actors.ui import server as srv

    client: Client = request.app[srv.CLIENT]
    verb = request.path.rsplit("/", 1)[-1]
    await srv._body(request)
    try:
        name = check_trigger_name(request.match_info["name"])
        if verb == "pause":
            changed = await client.trigger_pause(name)
        elif verb == "resume":
            changed = await client.trigger_resume(name)
        else:
            changed = await client.trigger_delete(name)  # false: a trigger pod has yet to remove it
    except TriggerError as e:
        raise srv._refuse(404 if str(e).startswith("no trigger") else 400, str(e)) from None
    return srv._json({"name": name, "changed": changed})
