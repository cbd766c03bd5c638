"""The step panel's API: one step's whole story (`Client.step_story`,
actors/client/steps.py), what `actors-cli describe ID STEP --json` prints: args as
rendered, result, every attempt with its times, worker, error and traceback, retries,
decisions, the loop's done/total/failed. Registered by actors/ui/server.py
(`add_routes`); the page (static/steppanel.js) sets every value as text."""

from __future__ import annotations

from aiohttp import web

from actors.client import Client, ExecutionNotFound, UnknownStep

__all__ = ["add_routes"]


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/executions/{id}/steps/{step}", step_story)


async def step_story(request: web.Request) -> web.Response:
    """`{"step": story}`; 404 `{"error"}` for an execution or a step its log does not name."""
    from actors.ui import server  # imported here: server.py imports this module to register it

    eid = server._execution_id(request)
    client: Client = request.app[server.CLIENT]
    try:
        story = await client.step_story(eid, request.match_info["step"])
    except (ExecutionNotFound, UnknownStep) as e:
        raise server._refuse(404, str(e)) from None
    return server._json({"step": story.to_dict()})
