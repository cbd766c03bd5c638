"""Webhooks on the UI server: `POST /hooks/<name>` starts the hook's playbook with the
request's JSON body as payload; `POST /hooks/<name>/<execution_id>[?key=K]` sends the
hook's signal to that execution with the body as data (actors/client/hooks.py).

Each hook has its own token (`Authorization: Bearer <token>`), so these two routes, and
only they, skip the UI's own guard on actions (its token or proxy header, and the
JSON-from-this-origin rule against CSRF: a hook is called by other systems, not by a
browser holding a session): `ROUTES` names them for actors/ui/server.py's `_guard`. The
Host check still applies, and a `--read-only` UI refuses them as it refuses every POST.

In this order, so nothing is read or started for a caller without the token:
1. the token: a wrong or missing one, or a name that is no hook, is 401 with one
   message for all three (`hook_authorized` compares in constant time);
2. `Content-Type: application/json` (415), a body of at most the UI's MAX_BODY (413),
   JSON (400) nested at most MAX_DEPTH deep (400); a start hook's body is an object;
3. `Idempotency-Key` (optional): the execution or signal id is derived from it and the
   hook (a signal's also from its execution and `?key=`), so the same request again
   answers the same id and starts nothing twice.

Answers are JSON: 202 `{"execution_id", "existing"}` for a start; 202 `{"execution_id",
"signal_id", "accepted": true, "duplicate"}` for a signal (`duplicate`: one of this id
was sent before, so this one was not written), 409 with `accepted: false` and the
execution's `state` when it has ended; `{"error": "..."}` otherwise."""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from aiohttp import web

from actors.client import Client, InvalidExecutionId, check_execution_id
from actors.client.outcome import ExecutionNotFound
from actors.client.signals import ExecutionNotKnownYet, SignalRefused
from actors.errors import UserError
from actors.natsio.dial import NatsUnavailable
from actors.wire.nesting import MAX_DEPTH, json_within

log = logging.getLogger("actors.ui.hooks")
ROUTES = frozenset({"hook-start", "hook-signal"})  # exempt from the UI's own action guard (server._guard)
UNAUTHORIZED = "this hook needs its token: Authorization: Bearer <token> (actors-cli hook add / rotate)"


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_post("/hooks/{name}", call, name="hook-start")
    router.add_post("/hooks/{name}/{execution_id}", call, name="hook-signal")


def _answer(status: int, data: dict[str, Any], headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=msgspec.json.encode(data), status=status, content_type="application/json", headers=headers)


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return _answer(status, {"error": message}, headers)


def _bearer(request: web.Request) -> str:
    scheme, _, token = request.headers.get("Authorization", "").strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


async def call(request: web.Request) -> web.StreamResponse:
    from actors.ui import server as srv  # imported here: server.py imports this module to register it

    if request.app[srv.CONFIG]["read_only"]:
        return _error(403, "this UI is read-only (--read-only): hooks are refused")
    client: Client = request.app[srv.CLIENT]
    name = request.match_info["name"]
    try:
        spec = await client.hook_authorized(name, _bearer(request))
    except NatsUnavailable as e:
        return _error(503, str(e))
    except UserError:
        spec = None  # no hooks bucket yet: no hook, and the caller is told no more than that
    if spec is None:
        return _error(401, UNAUTHORIZED, {"WWW-Authenticate": 'Bearer realm="actors hooks"'})
    eid = request.match_info.get("execution_id")
    if spec.start is not None and eid is not None:
        return _error(404, f"hook {name} starts executions: POST /hooks/{name}, with no execution id")
    if spec.signal is not None and eid is None:
        return _error(404, f"hook {name} sends signal {spec.signal.name}: POST /hooks/{name}/<execution id>")
    if request.content_type != "application/json":
        return _error(415, f"a hook takes JSON: Content-Type must be application/json, not {request.content_type!r}")
    body = await _body(request, limit=srv.MAX_BODY)
    if isinstance(body, web.Response):
        return body
    key = request.headers.get("Idempotency-Key")
    try:
        if spec.start is not None:
            if body is None:
                body = {}
            if not isinstance(body, dict):
                return _error(400, "a start hook's body is a JSON object: the execution's payload")
            outcome = await client.hook_start(spec, body, idempotency_key=key)
            log.info("hook %s: execution %s%s", name, outcome.execution_id, " (existing)" if outcome.existing else "")
            return _answer(202, {"execution_id": outcome.execution_id, "existing": outcome.existing})
        assert eid is not None
        check_execution_id(eid)
        reply = await client.hook_signal(spec, eid, body, key=request.query.get("key", ""), idempotency_key=key)
    except InvalidExecutionId as e:
        return _error(400, str(e))
    except ExecutionNotKnownYet as e:
        return _error(503, str(e), {"Retry-After": "1"})
    except ExecutionNotFound as e:
        return _error(404, str(e))
    except (NatsUnavailable, SignalRefused) as e:  # NATS, or an upgrade under way: not the caller's doing
        return _error(503, str(e))
    except UserError as e:  # a bad Idempotency-Key or key, a payload too large or too deep, ...
        return _error(400, str(e))
    if not reply.accepted:
        state = reply.status.state if reply.status is not None else None
        return _answer(
            409,
            {
                "execution_id": eid,
                "signal_id": None,
                "accepted": False,
                "state": state,
                "error": f"execution {eid} has ended ({state}): it takes no more signals",
            },
        )
    log.info("hook %s: signal %s to %s", name, reply.signal_id, eid)
    # `duplicate`: a signal of this id (the same Idempotency-Key, execution and key) was
    # written before, so this one was not: the first one's data stands (as a start
    # hook answers `existing`)
    return _answer(
        202, {"execution_id": eid, "signal_id": reply.signal_id, "accepted": True, "duplicate": reply.duplicate}
    )


async def _body(request: web.Request, *, limit: int) -> Any:
    """The body's JSON value (None when empty), or the answer refusing it."""
    if request.content_length is not None and request.content_length > limit:
        return _error(413, f"the body is {request.content_length:,} bytes, over the {limit:,} a hook takes")
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        return _error(413, f"the body is over the {limit:,} bytes a hook takes")
    if not raw.strip():
        return None
    if not json_within(raw):  # measured first: decoding recurses per level
        return _error(400, f"the body nests deeper than {MAX_DEPTH} levels of lists and objects")
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError as e:
        return _error(400, f"the body is not JSON ({e})")
