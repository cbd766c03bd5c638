"""The web UI's HTTP server (aiohttp): one HTML shell for every page (the page routes
itself), the JSON API the pages read, the live feeds (server-sent events), and the
actions (start, cancel, retry, an approval's answer).

`make_app(client, read_only=..., token=...)` builds it on a `Client`; `serve_ui` binds it.

Actions are POSTs and only POSTs change anything. Each one must:
* not come with --read-only (403, and the page hides the buttons);
* carry the token when one is set (`Authorization: Bearer T` or `X-Actors-Token: T`;
  401 otherwise), or, when `user_header` names a header a trusted proxy sets (say
  `X-Forwarded-User`), carry that header;
* be JSON (`Content-Type: application/json`) from this origin: a page elsewhere can
  send neither without a CORS preflight, which this server never answers, so a
  malicious site cannot make a user's browser cancel executions (no CSRF).

The webhooks (`POST /hooks/<name>[/<execution id>]`, actors/ui/hooks.py) are the one
exception, by route: other systems call them, each with its own hook's token.

A stored record that cannot be read (a status, a catalog record: `RecordInvalid`) or a
blob that is not what its key names (`BlobCorrupt`, a `PayloadUnreadable`) is answered
502 with the one line that names its key, never a 500 and a traceback; listings leave
such records out (actors/store/records.py).

Every request, when the UI is bound to a loopback address, must name it in `Host`
(localhost, 127.0.0.1, [::1], or a name given with --allow-host): a site whose DNS
name is rebound to 127.0.0.1 is then the same origin as the UI for the browser, and
only the Host it sends gives it away (403). Live feeds are capped per process
(`max_streams`, 503 beyond): each holds NATS consumers.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import importlib.resources
import ipaddress
import logging
from collections.abc import Collection
from typing import Any

import msgspec
from aiohttp import web

from actors.client import (
    Client,
    InvalidExecutionId,
    RetryRefused,
    StartRefused,
    TooLarge,
    UnknownExecution,
    check_execution_id,
)
from actors.client.outputs import RunningOutput
from actors.store.catalog import CatalogError
from actors.store.records import RecordInvalid
from actors.ui import listing
from actors.ui.detail import DetailCache, NotFound, execution_detail
from actors.ui.hooks import ROUTES as HOOK_ROUTES
from actors.ui.hooks import add_routes as add_hook_routes
from actors.ui.live import ExecutionWatch, StatusHub
from actors.ui.playbookview import playbook_view
from actors.wire.codec import PayloadUnreadable
from actors.wire.events import TERMINAL_STATES
from actors.wire.nesting import MAX_DEPTH, json_within

log = logging.getLogger("actors.ui")
KEEPALIVE = 15.0  # seconds between SSE comments, so proxies keep an idle stream open
UPDATES_PER_SECOND = 4  # an execution page's updates at most, however fast its log grows
START_WAIT = 5.0  # seconds a cancel waits for a start still queued
MAX_BODY = 1024 * 1024  # bytes of a POST body (a start payload)
STATES = ("PENDING", "RUNNING", "HALTED", "COMPLETED", "FAILED", "CANCELLED")
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")  # what a browser on this machine sends as Host
MAX_STREAMS = 100  # live feeds open at once in one UI process (ACTORS_UI_MAX_STREAMS)
MAX_REASON = 1000  # characters of a cancel's reason (it goes into the log and the status)
# the execution page's step logs: the first LOGS_SHOWN outputs, each up to LOG_TEXT_MAX
# bytes (`actors-cli logs` prints them whole); a poll while it runs (`live`) reads no
# object: each output's head and tail as its record holds them
LOGS_SHOWN = 200
LOG_TEXT_MAX = 64 * 1024

CLIENT = web.AppKey("client", Client)
CONFIG = web.AppKey("config", dict)
HUB = web.AppKey("hub", StatusHub)
CACHE = web.AppKey("cache", DetailCache)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(data), status=status, content_type="application/json")


def _refuse(status: int, message: str) -> web.HTTPException:
    """An HTTP error whose body is `{"error": message}` (one line, for the page to show)."""
    kinds: dict[int, type[web.HTTPException]] = {
        400: web.HTTPBadRequest,
        401: web.HTTPUnauthorized,
        403: web.HTTPForbidden,
        404: web.HTTPNotFound,
        502: web.HTTPBadGateway,
        503: web.HTTPServiceUnavailable,
    }
    return kinds[status](text=msgspec.json.encode({"error": message}).decode(), content_type="application/json")


def make_app(
    client: Client,
    *,
    read_only: bool,
    token: str | None,
    user_header: str | None = None,
    hosts: Collection[str] | None = None,
    max_streams: int = MAX_STREAMS,
) -> web.Application:
    """The UI on `client`'s NATS. `token`: what every POST must carry (None: none);
    `user_header`: a header a trusted proxy sets on authenticated requests, accepted
    instead of the token; `read_only`: every POST refused (403); `hosts`: the only host
    names a request's Host may carry (None: any; see `allowed_hosts`); `max_streams`:
    live feeds open at once (503 beyond)."""
    app = web.Application(client_max_size=MAX_BODY, middlewares=[_guard])
    app[CLIENT] = client
    app[CONFIG] = {
        "read_only": read_only,
        "token": token or None,
        "user_header": user_header or None,
        "hosts": None if hosts is None else frozenset(h.lower() for h in hosts),
        "max_streams": max_streams,
        "streams": 0,  # live feeds open now
    }
    app[HUB] = StatusHub(client.nc, client.codec.open_for_display)
    app[CACHE] = DetailCache()
    app.on_startup.append(_start_hub)
    app.on_shutdown.append(_stop_hub)
    r = app.router
    r.add_get("/api/config", config)
    r.add_get("/api/executions", executions)
    r.add_get("/api/executions/stream", executions_stream)
    r.add_get("/api/executions/{id}", execution)
    r.add_get("/api/executions/{id}/stream", execution_stream)
    r.add_get("/api/executions/{id}/events", events)
    r.add_get("/api/executions/{id}/logs", logs)
    r.add_post("/api/executions/{id}/cancel", cancel)
    r.add_post("/api/executions/{id}/retry", retry)
    r.add_get("/api/playbooks", playbooks)
    r.add_post("/api/playbooks/{name:.+}/start", start)
    r.add_get("/api/playbooks/{name:.+}", playbook)
    from actors.ui import deadletters, items, schedules, steps  # their handlers use this module's helpers
    from actors.ui import signals as signal_routes  # approve / reject a waiting approval step (a guarded POST)

    items.add_routes(r)  # a loop's failed items, and their redrive (a guarded POST)
    schedules.add_routes(r)
    deadletters.add_routes(r)
    steps.add_routes(r)
    signal_routes.add_routes(r)
    from actors.ui import triggers  # the triggers page: list, pause, resume, delete (guarded POSTs)

    triggers.add_routes(r)
    add_hook_routes(r)  # POST /hooks/...: each hook's own token, not this guard (actors/ui/hooks.py)
    r.add_static("/static/", _static_dir(), show_index=False, append_version=False)
    pages = ("/", "/executions/{id}", "/playbooks", "/playbooks/{name:.+}", "/schedules", "/triggers", "/deadletters")
    for page in pages:
        r.add_get(page, shell)
    return app


def _static_dir() -> str:
    return str(importlib.resources.files("actors.ui") / "static")


async def _start_hub(app: web.Application) -> None:
    await app[HUB].start()


async def _stop_hub(app: web.Application) -> None:
    await app[HUB].stop()
    app[CACHE].close()


@web.middleware
async def _guard(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every request: to a host name this UI answers to. Every POST: not read-only,
    authorised, JSON from this origin. Every answer: no framing, no sniffing, scripts
    only from here."""
    _check_host(request)
    if request.method == "POST" and request.match_info.route.name not in HOOK_ROUTES:
        _check_action(request)  # a hook's routes check their own token (actors/ui/hooks.py)
    try:
        response: web.StreamResponse = await handler(request)
    except (RecordInvalid, PayloadUnreadable) as e:
        # what NATS holds cannot be used (a malformed record, a changed blob, a value
        # sealed with a key this UI lacks): the upstream's fault, said in one line
        raise _refuse(502, str(e)) from None
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault(
        # scripts from this server only (no inline script, no eval); inline styles are
        # allowed: the graph and the timeline size and place their shapes with them
        "Content-Security-Policy",
        "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'",
    )
    return response


def allowed_hosts(bound: str, extra: Collection[str] = ()) -> frozenset[str] | None:
    """The host names a UI bound to `bound` answers to: on a loopback address, this
    machine's names and `extra`; elsewhere `extra` alone, or None (any) when none is given
    (a pod behind a Service is reached by names it cannot know)."""
    names = {h.strip().lower() for h in extra if h.strip()}
    if _is_loopback(bound):
        return frozenset(names | set(LOOPBACK_NAMES))
    return frozenset(names) if names else None


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_name(host: str) -> str:
    """`Host` without its port: `[::1]:8233` -> `[::1]`, `localhost:8233` -> `localhost`."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1]
    return host.rpartition(":")[0] if ":" in host else host


def _check_host(request: web.Request) -> None:
    # DNS rebinding: attacker.example resolving to 127.0.0.1 makes its page same-origin
    # with the UI (GETs read, POSTs pass the Origin check); only the Host header tells
    hosts = request.app[CONFIG].get("hosts")
    if hosts is None:
        return
    host = request.headers.get("Host", "")
    if _host_name(host) not in hosts:
        raise _refuse(
            403, f"host {host!r} is not one this UI answers to (add it with --allow-host or ACTORS_UI_ALLOWED_HOSTS)"
        )


@contextlib.contextmanager
def _stream_slot(app: web.Application) -> Any:
    """One of the process's live feeds, or 503 when all are taken: each feed holds NATS
    consumers, so an unbounded number of open pages (or a script) would exhaust them."""
    cfg = app[CONFIG]
    if cfg["streams"] >= cfg["max_streams"]:
        raise _refuse(503, f"too many live feeds open ({cfg['max_streams']}, ACTORS_UI_MAX_STREAMS); try again later")
    cfg["streams"] += 1
    try:
        yield
    finally:
        cfg["streams"] -= 1


def _check_action(request: web.Request) -> None:
    cfg = request.app[CONFIG]
    if cfg["read_only"]:
        raise _refuse(403, "this UI is read-only (--read-only): actions are refused")
    if cfg["token"] is not None or cfg["user_header"] is not None:
        given = request.headers.get("X-Actors-Token") or request.headers.get("Authorization", "").removeprefix(
            "Bearer "
        )
        by_token = cfg["token"] is not None and hmac.compare_digest(given.encode(), cfg["token"].encode())
        by_proxy = cfg["user_header"] is not None and bool(request.headers.get(cfg["user_header"], "").strip())
        if not (by_token or by_proxy):
            raise _refuse(401, "this action needs the UI's token (X-Actors-Token or Authorization: Bearer)")
    if request.content_type != "application/json":
        raise _refuse(400, "actions are JSON: Content-Type must be application/json")
    origin = request.headers.get("Origin")
    if origin is not None and origin.split("://", 1)[-1] != request.host:
        raise _refuse(403, f"an action from another origin ({origin}) is refused")


async def _body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    if not raw.strip():
        return {}
    if not json_within(raw):  # measured first: decoding recurses per level
        raise _refuse(400, f"the request body nests deeper than {MAX_DEPTH} levels")
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError as e:
        raise _refuse(400, f"the request body is not JSON ({e})") from None
    if not isinstance(body, dict):
        raise _refuse(400, "the request body must be a JSON object")
    return body


def _execution_id(request: web.Request) -> str:
    try:
        return check_execution_id(request.match_info["id"])
    except InvalidExecutionId as e:
        raise _refuse(400, str(e)) from None


# --- pages ------------------------------------------------------------------------------


async def shell(request: web.Request) -> web.FileResponse:
    """Every page is the same shell; app.js renders the page its URL names."""
    return web.FileResponse(f"{_static_dir()}/index.html", headers={"Cache-Control": "no-cache"})


async def config(request: web.Request) -> web.Response:
    cfg = request.app[CONFIG]
    return _json(
        {
            "read_only": cfg["read_only"],
            "token_required": cfg["token"] is not None and cfg["user_header"] is None,
        }
    )


# --- executions -------------------------------------------------------------------------


def _filters(request: web.Request) -> dict[str, str | None]:
    q = request.query
    state = (q.get("state") or "").upper() or None
    if state is not None and state not in STATES:
        raise _refuse(400, f"unknown state {state!r}; states are {', '.join(STATES)}")
    return {"state": state, "playbook": q.get("playbook") or None, "q": (q.get("q") or "").strip() or None}


def _int(request: web.Request, name: str, default: int | None, *, low: int, high: int) -> int | None:
    raw = request.query.get(name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise _refuse(400, f"{name} must be a whole number, not {raw!r}") from None
    if not low <= value <= high:
        raise _refuse(400, f"{name} must be between {low} and {high}")
    return value


async def executions(request: web.Request) -> web.Response:
    """One page of executions, newest first: `{"executions": [row], "next": cursor|null}`."""
    limit = _int(request, "limit", 50, low=1, high=listing.MAX_LIMIT) or 50
    raw = request.query.get("before", "")
    before: int | str | None
    if raw.startswith(listing.ARCHIVED):  # a page of the archive, after the live index ran out
        skip = raw[len(listing.ARCHIVED) :]
        if not skip.isdigit() or len(skip) > 12:
            raise _refuse(400, f"before must be a whole number or {listing.ARCHIVED}<number>, not {raw[:40]!r}")
        before = raw
    else:
        before = _int(request, "before", None, low=1, high=2**63)
    rows, cursor = await listing.page(request.app[CLIENT], limit=limit, before=before, **_filters(request))
    return _json({"executions": rows, "next": cursor})


async def _sse(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )
    await response.prepare(request)
    await response.write(b"retry: 1000\n\n")
    return response


async def _send(response: web.StreamResponse, event: str, data: Any) -> None:
    await response.write(b"event: " + event.encode() + b"\ndata: " + msgspec.json.encode(data) + b"\n\n")


async def executions_stream(request: web.Request) -> web.StreamResponse:
    """`event: status` with a row, for every status change that passes the filters."""
    filters = _filters(request)
    with _stream_slot(request.app):
        return await _status_feed(request, filters)


async def _status_feed(request: web.Request, filters: dict[str, str | None]) -> web.StreamResponse:
    hub = request.app[HUB]
    queue = hub.listen()
    response = await _sse(request)
    try:
        while True:
            try:
                st = await asyncio.wait_for(queue.get(), KEEPALIVE)
            except TimeoutError:
                await response.write(b": keepalive\n\n")
                continue
            if st is None:
                break
            row = listing.row_of(st)
            if listing.matches(row, **filters):
                await _send(response, "status", row)
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        hub.forget(queue)
    return response


async def execution(request: web.Request) -> web.Response:
    """The execution page's data; 404 for an id that names nothing, with `queued` true
    when a start of this id still waits in stream START (or it started since): the page
    then waits for it to start, where otherwise it says "not found" and waits only when
    asked (also when too many starts wait to look for this one among them)."""
    client = request.app[CLIENT]
    eid = _execution_id(request)
    try:
        detail = await execution_detail(client, eid, request.app[CACHE])
    except NotFound as e:
        queued = await client.start_queued(eid) is True or await client.exists(eid, timeout=0) is True
        body = {"error": str(e) + (": its start is still queued" if queued else ""), "queued": queued}
        raise web.HTTPNotFound(text=msgspec.json.encode(body).decode(), content_type="application/json") from None
    return _json(detail)


async def execution_stream(request: web.Request) -> web.StreamResponse:
    """`event: update` with the execution's detail, at once and then whenever its log,
    status or loops' progress change (at most UPDATES_PER_SECOND a second)."""
    eid = _execution_id(request)
    with _stream_slot(request.app):
        return await _execution_feed(request, eid)


async def _execution_feed(request: web.Request, eid: str) -> web.StreamResponse:
    app = request.app
    client = app[CLIENT]
    response = await _sse(request)
    stopping = asyncio.ensure_future(_app_stopping(app))
    try:
        async with ExecutionWatch(client.nc, client.layout, eid) as watch:
            watch.changed.set()
            while not stopping.done():
                changed = asyncio.ensure_future(watch.changed.wait())
                await asyncio.wait({changed, stopping}, timeout=KEEPALIVE, return_when=asyncio.FIRST_COMPLETED)
                changed.cancel()
                if stopping.done():
                    break
                if not watch.changed.is_set():
                    await response.write(b": keepalive\n\n")
                    continue
                watch.changed.clear()
                try:
                    detail = await execution_detail(
                        client, eid, app[CACHE], loops=dict(watch.loops), rates=watch.rates()
                    )
                except NotFound:
                    continue  # not started yet: its first input will wake us
                except RecordInvalid as e:
                    log.warning("execution page of %s: %s", eid, e)
                    continue  # its status cannot be read: the page keeps what it shows
                if detail["status"]["state"] in TERMINAL_STATES:
                    watch.loops.clear()  # a finished loop's counters are the log's, not the last progress
                await _send(response, "update", detail)
                await asyncio.sleep(1 / UPDATES_PER_SECOND)
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        stopping.cancel()
    return response


async def _app_stopping(app: web.Application) -> None:
    """Returns when the app shuts down (its hub's listeners get None)."""
    queue = app[HUB].listen()
    try:
        while await queue.get() is not None:
            pass
    finally:
        app[HUB].forget(queue)


async def events(request: web.Request) -> web.Response:
    """The whole log, in order (what `actors-cli events --json` prints)."""
    items = await request.app[CLIENT].events(_execution_id(request))
    return _json({"events": [i.to_dict() for i in items]})


async def logs(request: web.Request) -> web.Response:
    """What the steps printed: `{"logs": [{step, iteration_index, attempt_number,
    running, text}], "total": n}`: the first `LOGS_SHOWN` outputs in the order printed,
    each text cut at `LOG_TEXT_MAX` bytes; `?live=1` (the page's poll while the execution
    runs) reads no object from the store, only the outputs' records."""
    client = request.app[CLIENT]
    outputs = await client.outputs(_execution_id(request), step=request.query.get("step") or None)
    shown = outputs[:LOGS_SHOWN]
    live = request.query.get("live") == "1"
    texts = await asyncio.gather(*(_log_text(client, o, live) for o in shown))
    return _json(
        {
            "logs": [
                {
                    "step": o.step,
                    "iteration_index": o.iteration_index,
                    "attempt_number": o.attempt_number,
                    "running": isinstance(o, RunningOutput),  # its text so far (actors/client/outputs.py)
                    "text": text,
                }
                for o, text in zip(shown, texts, strict=True)
            ],
            "total": len(outputs),
        }
    )


async def _log_text(client: Client, o: Any, live: bool) -> str:
    """The text the page shows of output `o`: cut at `LOG_TEXT_MAX` bytes, and without
    reading its object when `live` or when the object is longer than that."""
    if o.output_ref is not None and (live or o.stored > LOG_TEXT_MAX):
        text = f"{o.head}\n... {o.size:,} bytes in all: `actors-cli logs` prints them ...\n{o.tail}"
    else:
        text = await client.output_text(o)
    data = text.encode("utf-8", errors="replace")
    if len(data) <= LOG_TEXT_MAX:
        return text
    # a running step's text so far, or a long one: its start and its end
    half = LOG_TEXT_MAX // 2
    head = data[:half].decode("utf-8", errors="ignore")
    tail = data[-half:].decode("utf-8", errors="ignore")
    return f"{head}\n... {len(data):,} bytes: `actors-cli logs` prints them whole ...\n{tail}"


async def cancel(request: web.Request) -> web.Response:
    client = request.app[CLIENT]
    eid = _execution_id(request)
    body = await _body(request)
    reason = body.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise _refuse(400, "reason must be a string")
    if reason is not None and len(reason) > MAX_REASON:
        raise _refuse(400, f"reason must be at most {MAX_REASON} characters")
    # a start still queued is waited for a moment, as `actors-cli cancel` does: a cancel
    # written before the start record would be ignored
    known = await client.exists(eid, timeout=START_WAIT)
    if known is None:
        raise _refuse(400, f"execution {eid} is still queued (no engine has taken its start yet): try again")
    if not known:
        raise _refuse(404, f"no execution {eid!r}")
    await client.cancel(eid, (reason or "").strip() or "cancelled from the web UI")
    return _json({"execution_id": eid})


async def retry(request: web.Request) -> web.Response:
    client = request.app[CLIENT]
    eid = _execution_id(request)
    body = await _body(request)
    from_step = body.get("from")
    payload = body.get("payload")
    if from_step is not None and not isinstance(from_step, str):
        raise _refuse(400, "from must be a step name or null")
    if payload is not None and not isinstance(payload, dict):
        raise _refuse(400, "payload must be a JSON object or null")
    try:
        outcome = await client.retry(eid, from_step=from_step, payload=payload)
    except UnknownExecution as e:
        raise _refuse(404, str(e)) from None
    except (RetryRefused, TooLarge) as e:
        raise _refuse(400, str(e)) from None
    return _json({"execution_id": outcome.execution_id, "existing": outcome.existing})


# --- playbooks --------------------------------------------------------------------------


async def playbooks(request: web.Request) -> web.Response:
    """The catalog: `{"playbooks": [{"path", "versions": [{"version", "registered_at"}]}]}`
    (KV `catalog`'s names: a playbook's catalog path is `path`)."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for e in await request.app[CLIENT].playbooks():
        by_name.setdefault(e.path, []).append({"version": e.version, "registered_at": e.registered_at})
    return _json({"playbooks": [{"path": n, "versions": v} for n, v in sorted(by_name.items())]})


async def _entry(request: web.Request, version: int | None) -> Any:
    name = request.match_info["name"].strip("/")
    entries = [e for e in await request.app[CLIENT].playbooks() if e.path == name]
    if not entries:
        raise _refuse(404, f"no playbook {name!r} in the catalog")
    if version is None:
        return max(entries, key=lambda e: e.version)
    for e in entries:
        if e.version == version:
            return e
    raise _refuse(404, f"playbook {name!r} has no version {version}")


async def playbook(request: web.Request) -> web.Response:
    entry = await _entry(request, _int(request, "version", None, low=1, high=2**31))
    """One catalog entry as KV `catalog` holds it: `{path, version, source, registered_at, file?}`,
    with its `graph` and `workload` (actors/ui/playbookview.py)."""
    view = await playbook_view(request.app[CLIENT], request.app[CACHE], entry)
    return _json({**msgspec.to_builtins(entry), **view})  # every field the entry has (`file` when known)


async def start(request: web.Request) -> web.Response:
    body = await _body(request)
    payload = body.get("payload") or {}
    version = body.get("version")
    if not isinstance(payload, dict):
        raise _refuse(400, "payload must be a JSON object")
    if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
        raise _refuse(400, "version must be a whole number or null")
    entry = await _entry(request, version)
    try:
        eid = await request.app[CLIENT].start(entry.path, payload=payload, version=entry.version)
    except (TooLarge, StartRefused, CatalogError) as e:  # CatalogError: a path from before paths were checked
        raise _refuse(400, str(e)) from None
    return _json({"execution_id": eid})


# --- serving ----------------------------------------------------------------------------


async def serve_ui(
    client: Client,
    *,
    host: str,
    port: int,
    read_only: bool = False,
    token: str | None = None,
    user_header: str | None = None,
    extra_hosts: Collection[str] = (),
    max_streams: int = MAX_STREAMS,
) -> tuple[web.AppRunner, str]:
    """Bind the UI; returns its runner (`await runner.cleanup()` stops it) and its address.
    OSError when the port is taken. `extra_hosts`: host names it answers to besides this
    machine's (`allowed_hosts`)."""
    app = make_app(
        client,
        read_only=read_only,
        token=token,
        user_header=user_header,
        hosts=allowed_hosts(host, extra_hosts),
        max_streams=max_streams,
    )
    runner = web.AppRunner(
        app,
        access_log=None,
        shutdown_timeout=2.0,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    with contextlib.suppress(Exception):
        port = runner.addresses[0][1]  # the port bound, when 0 asked for any
    shown = f"[{host}]" if ":" in host else host
    return runner, f"http://{shown}:{port}/"
