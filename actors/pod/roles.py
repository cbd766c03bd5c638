"""Start and stop actor roles against a NATS server: what `serve`, `dev`, `run`, the
tests and the benches share."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol

from nats.aio.client import Client as NATS
from prometheus_client.core import Metric

from actors.client import Client
from actors.config.settings import Settings
from actors.engine.actor import Engine
from actors.engine.starter import Starter
from actors.gateway.answers import Gateway
from actors.loops.counter import Counter
from actors.natsio import close_connection, publisher, ride_out
from actors.natsio.binding import bind
from actors.natsio.connopts import ConnectOptions
from actors.natsio.dial import refusal
from actors.natsio.reader import install_reader
from actors.pod.health import HealthServer, PodState
from actors.retention.actor import Retention
from actors.runtime import tracing
from actors.runtime.children import protect_pod
from actors.runtime.metrics import ConsumerCollector, Registry, consumers_for, pod_registry, resident_actors
from actors.runtime.ownership import Leases, pod_name
from actors.runtime.render_process import RenderBounds
from actors.status.projector import Projector
from actors.store.archive import archive_reader, archive_store
from actors.tools.actor import ToolActor
from actors.tools.credentials import CredentialSource
from actors.tools.undeliverable import MaxDeliveriesWatcher
from actors.triggers.actor import TriggerActor
from streams.layout import Layout, StreamsMissing, ensure

log = logging.getLogger("actors")
ROLES = ("engine", "counter", "tools", "projector", "retention", "trigger")
# something more a pod runs on its connection (serve --role ui): start it, get what stops it
Extra = Callable[[NATS], Awaitable[Callable[[], Awaitable[None]]]]
# seconds a starting pod asks again while its streams elect leaders (a node of the
# cluster just died, or the cluster itself is starting): several elections
ENSURE_BUDGET = 120.0
REPEAT_LOG = 30.0  # seconds before a pod logs the same connection error again


class Actor(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


async def connect(url: str, *, name: str = "actors", options: ConnectOptions | None = None) -> NATS:
    """A pod's connection: tries `url` until it answers, and reconnects for ever.
    `options`: credentials and TLS (default: the environment's, so a caller that passes
    none still authenticates as the pod's settings say)."""
    options = options if options is not None else ConnectOptions.from_environment()

    said: dict[str, float] = {}  # line -> when it was last logged

    async def on_error(e: Exception) -> None:
        # a refusal is retried (the Secret may be fixed, the server reloaded) but said
        # plainly, naming what to check: the reason a pod never becomes ready. The same
        # line at most every REPEAT_LOG seconds: the client retries twice a second
        line = refusal(e, url, options) or str(e)
        now = time.monotonic()
        if now - said.get(line, -REPEAT_LOG) >= REPEAT_LOG:
            said[line] = now
            log.warning("nats: %s", line)

    # "nats://a:4222,nats://b:4222": every node of a cluster, so the first connection
    # does not depend on one node being up (one that refuses is skipped for the next)
    servers = [u.strip() for u in url.split(",") if u.strip()]
    wait: dict[str, Any] = {"reconnect_time_wait": 0.5}  # nats-py annotates it int; it takes fractions
    nc = install_reader(NATS())  # the faster protocol reader (actors/natsio/reader.py)
    await nc.connect(servers, name=name, max_reconnect_attempts=-1, error_cb=on_error, **wait, **options.nats_kwargs())
    return nc


class Runtime:
    """A set of running actors on one connection, the settings they were started with
    (a `layout` given to `start_roles` wins over theirs), and the metrics registry that
    reports them (one per runtime)."""

    def __init__(self, nc: NATS, actors: list[Actor], *, settings: Settings, registry: Registry | None = None) -> None:
        self.nc = nc
        self.actors = actors
        self.settings = settings
        self.registry = registry if registry is not None else pod_registry()

    def find(self, kind: type) -> list[Actor]:
        return [a for a in self.actors if isinstance(a, kind)]

    def leases(self) -> list[Leases]:
        return [a for a in self.actors if isinstance(a, Leases)]

    async def stop(self, *, drain_timeout: float | None = None) -> None:
        """Stop every actor, last started first. `drain_timeout`: how long tool actors
        may finish running commands (their own default when None); what is still
        running then is left unacked and redelivered elsewhere."""
        for a in reversed(self.actors):
            try:
                if drain_timeout is not None and isinstance(a, ToolActor):
                    await a.stop(drain_timeout=drain_timeout)
                else:
                    await a.stop()
            except Exception:
                log.exception("stopping %s", type(a).__name__)

    async def collect(self) -> list[Metric]:
        """Metrics read from the actors at each scrape (a `metrics.Collector`)."""
        return [resident_actors((a.role, len(a.actors)) for a in self.actors if isinstance(a, (Engine, Counter)))]

    def consumers(self) -> list[tuple[str, str]]:
        """(stream, consumer) for the JetStream consumers these actors read. An engine
        or counter reports every partition's consumer, not the ones it holds now: those
        change, and lag is a property of the consumer, not of the pod."""
        found: list[tuple[str, str]] = []
        # the layout the actors run with (one given to `start_roles` wins over the settings'):
        # its streams of logs carry the engine's, the projector's and the tools' consumers
        layout = next((a.layout for a in self.actors if isinstance(a, (Engine, Counter, ToolActor))), None)
        layout = layout if layout is not None else self.settings.layout
        for a in self.actors:
            if isinstance(a, (Engine, Counter)):
                found += consumers_for((a.role,), partitions=range(a.layout.partitions), layout=a.layout)
            elif isinstance(a, Projector):
                found += consumers_for(("projector",), partitions=(), layout=layout)
            elif isinstance(a, Retention):
                found += consumers_for(("retention",), partitions=())
            elif isinstance(a, ToolActor):
                found += consumers_for(("tools",), partitions=(), tool_kinds=a.kinds, layout=a.layout)
        return list(dict.fromkeys(found))


# the roles whose pods watch max-deliveries advisories: the engine runs in every
# deployment (so an advisory finds a pod while tool pods crash-loop on a command) and
# its NATS user may answer a command, as the tools' may
WATCHERS = {"engine", "tools"}
# the roles that start processes: render processes (engine, counter, tools' sinks, trigger payloads),
# step workers (tools)
PARENTS = {"engine", "counter", "tools", "trigger"}
# the role that declares (creates and updates) the streams; the others look them up
DECLARES = "engine"
STREAMS_WAIT = 2.0  # seconds between two looks of a pod waiting for its streams


async def declare_streams(nc: NATS, layout: Layout, roles: Sequence[str]) -> None:
    """An engine pod creates or updates every stream, consumer and bucket (its NATS
    user is the one allowed to); a pod of another role only looks them up (creating what
    is missing if its user may) and, when they are missing, waits for an engine pod to
    create them, up to ENSURE_BUDGET seconds, then raises `StreamsMissing` naming them."""
    js = nc.jetstream()
    if DECLARES in roles:
        await ride_out(lambda: ensure(js, layout), budget=ENSURE_BUDGET)
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ENSURE_BUDGET
    while True:
        try:
            await ride_out(lambda: ensure(js, layout, update=False), budget=max(0.1, deadline - loop.time()))
            return
        except StreamsMissing as e:
            if loop.time() >= deadline:
                raise
            log.warning("%s; waiting for an engine pod to create them", e)
        await asyncio.sleep(STREAMS_WAIT)


GC_THRESHOLD = (20_000, 20, 20)


def tune_gc() -> None:
    """For a process that runs actors from now on: what exists now (imported modules,
    the started actors) is moved out of the cyclic collector's sight (`gc.freeze`), and
    young collections run every 20,000 allocations instead of 700. Both cut the time
    the collector spends re-scanning long-lived objects: measured on
    bench/loop_fanout.py (30,000 noop iterations), collector time fell from ~330 ms to
    ~30 ms and CPU per iteration by ~20 %. Reference counting still frees everything at
    once; only garbage in reference cycles waits longer. Called by `serve`, `dev` and
    the embedded `run`, after the roles have started."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


async def start_roles(
    nc: NATS,
    *,
    layout: Layout | None = None,
    roles: Iterable[str] = ROLES,
    tool_concurrency: int | Mapping[str, int] | None = None,  # None: per-kind defaults (actors/tools/actor.py)
    pod: str | None = None,
    settings: Settings | None = None,
    registry: Registry | None = None,
    step_user_fallback: bool = True,
) -> Runtime:
    """Start `roles` on `nc`. Engine and counter consume only the partitions whose
    leases they hold in the `owners` bucket (actors/runtime/ownership.py), rebalanced as pods
    of the same role come and go. There is no other way in: `serve`, `dev`, the
    embedded `run`, the tests and the benches all start here, so any mix of them on one
    server shares the partitions and each partition is consumed by the holder of its
    lease only (a `dev` that took every partition beside leased pods split executions'
    inputs between two engines). A runtime alone on its server wins every lease in its
    first balance, before this returns: `run` waits for no TTL.

    `pod`: the member name in `owners` (default: host, pid and a per-process sequence
    number, so that two runtimes in one process are two members).

    `settings`: default `Settings.from_env()`; `layout`, `tool_concurrency` and `pod`,
    when given, win over it (tests and benches set them directly). `registry`: the
    metrics registry the runtime reports to (default: a new one). `step_user_fallback`:
    when the default step user cannot start python steps, run them as this process's
    user, with a warning (actors/tools/actor.py): what `run`, `dev`, the tests and the
    benches do on a developer's machine; `serve` (a pod) passes False and refuses."""
    settings = settings if settings is not None else Settings.from_env()
    layout = layout if layout is not None else settings.layout
    tool_concurrency = tool_concurrency if tool_concurrency is not None else settings.tool_concurrency
    roles = list(roles)
    unknown = set(roles) - set(ROLES)
    if unknown:
        raise ValueError(f"unknown role(s) {sorted(unknown)}; roles are {', '.join(ROLES)}")
    if PARENTS & set(roles):
        # its environment holds its secrets: not for its children's user to read (actors/runtime/children.py)
        protect_pod()
    codec = settings.payload_codec
    if (
        codec.encrypts
    ):  # every actor on `nc` encrypts values it writes and decrypts what it reads (actors/wire/codec.py)
        bind(nc, codec)
    await declare_streams(nc, layout, roles)
    # how long a publish without a PubAck may be re-sent as is (natsio.RESEND_SHARE)
    publisher(nc).duplicate_window = layout.duplicate_window
    pod = pod or settings.pod_name or pod_name()
    # engine and tool pods watch for commands the server gave up on (one queue group:
    # each once); a projector or counter user may not answer a command (permissions.py)
    actors: list[Actor] = [MaxDeliveriesWatcher(nc)] if WATCHERS & set(roles) else []
    if "projector" in roles:
        actors.append(Projector(nc))
    if "retention" in roles:
        actors.append(Retention(nc, layout=layout, archive=archive_store(nc, settings.archive)))
    if "tools" in roles:
        actors.append(
            ToolActor(
                nc,
                layout=layout,
                concurrency=tool_concurrency,
                python_workers=settings.python_workers,
                limits=settings.limits,
                credentials=CredentialSource(settings.credentials_dir, settings.credentials),
                settings=settings,
                step_user_fallback=step_user_fallback,
            )
        )
    hosts: list[Counter | Engine] = []
    bounds = RenderBounds.of(settings)
    if "counter" in roles:
        hosts.append(Counter(nc, layout=layout, render_bounds=bounds))
    if "engine" in roles:
        hosts.append(Engine(nc, layout=layout, render_bounds=bounds, fast_answers=settings.fast_answers))
    for host in hosts:
        # the leases start after their host and stop before it: a partition is gained
        # by a running host, and handed back (host.lose) while the host still runs
        actors += [
            host,
            Leases(
                nc,
                role=host.role,
                partitions=layout.partitions,
                ttl=layout.lease_ttl,
                pod=pod,
                on_gain=host.gain,
                on_lose=host.lose,
            ),
        ]
    if "engine" in roles:
        actors.append(Starter(nc, layout=layout, limits=settings.limits))
        engine = next(h for h in hosts if isinstance(h, Engine))
        # what any NATS client may ask: a result, a playbook registered (docs/protocol/asyncapi.yaml)
        reader = Client(
            nc,
            layout=layout,
            codec=codec,
            limits=settings.limits,
            archive=archive_reader(nc, settings.archive),  # as `Client.connect`: an earlier setting's archives too
        )
        actors.append(Gateway(nc, client=reader, load=engine.load_playbook, max_attempts=settings.limits.max_attempts))
    if "trigger" in roles:
        # after the starter: a start it publishes is taken by this runtime's starter too
        actors.append(TriggerActor(nc, layout=layout, limits=settings.limits, render_bounds=bounds))
    for a in actors:
        await a.start()
    return Runtime(nc, actors, settings=settings, registry=registry)


@asynccontextmanager
async def running(settings: Settings, *, roles: Iterable[str] = ROLES) -> AsyncIterator[Runtime]:
    if settings.nats_url is None:
        raise ValueError("running() needs settings with a nats_url")
    nc = await connect(settings.nats_url, options=ConnectOptions.from_settings(settings))
    rt = await start_roles(nc, settings=settings, roles=roles)
    try:
        yield rt
    finally:
        await rt.stop()
        await close_connection(nc)


async def wait_forever() -> None:
    await asyncio.Event().wait()


async def serve(
    settings: Settings,
    *,
    stop: asyncio.Event,
    roles: Sequence[str] = ROLES,
    shutdown_timeout: float | None = None,
    extra: Extra | None = None,
) -> bool:
    """Run a pod until `stop` is set, then drain: readiness goes 503, the roles stop
    (tool actors get `settings.drain_timeout` to finish; unacked work is redelivered),
    the connection closes, the HTTP server stops last. `settings.http_port=0`: no HTTP
    server.

    Returns False when shutting down took longer than `shutdown_timeout` (default: the
    drain timeout and 20 s; the caller then exits non-zero; JetStream redelivers
    whatever was in hand, so nothing is lost).

    `extra`: something more the pod runs on its connection (the web UI of `serve --role
    ui`): started after the roles, before the pod is ready; what it returns stops it."""
    if settings.nats_url is None:
        raise ValueError("serve() needs settings with a nats_url")
    traced = tracing.configure(roles)  # the OTEL_* variables; off unless they ask (docs/tracing.md)
    try:
        return await _serve(settings, stop=stop, roles=roles, shutdown_timeout=shutdown_timeout, extra=extra)
    finally:
        if traced:
            # what is queued is exported before the pod exits, for a few seconds at most
            # (`tracing.SHUTDOWN_WAIT`): a collector that hangs does not hold the pod
            await asyncio.to_thread(tracing.shutdown)


async def _serve(
    settings: Settings,
    *,
    stop: asyncio.Event,
    roles: Sequence[str],
    shutdown_timeout: float | None,
    extra: Extra | None,
) -> bool:
    assert settings.nats_url is not None
    state = PodState()
    registry = pod_registry()
    registry.add_collector(state)
    http = (
        HealthServer(state=state, registry=registry, host=settings.http_host, port=settings.http_port)
        if settings.http_port
        else None
    )
    if http is not None:
        await http.start()  # before NATS: liveness answers while the pod waits for its server
    try:
        options = ConnectOptions.from_settings(settings)
        nc = await _connect_until(stop, settings.nats_url, name=f"actors-{'+'.join(roles)}", options=options)
        if nc is None:
            log.info("stopped before NATS answered")
            return True
        try:
            return await _run_roles(
                nc,
                stop=stop,
                state=state,
                settings=settings,
                registry=registry,
                roles=roles,
                shutdown_timeout=settings.drain_timeout + 20 if shutdown_timeout is None else shutdown_timeout,
                extra=extra,
            )
        finally:
            await close_connection(nc)
    finally:
        if http is not None:
            await http.stop()


async def _connect_until(stop: asyncio.Event, url: str, *, name: str, options: ConnectOptions) -> NATS | None:
    """Connect, unless `stop` comes first: the client retries an unreachable server
    forever, and a pod told to stop while it waits must still exit."""
    connecting = asyncio.create_task(connect(url, name=name, options=options))
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({connecting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if connecting.done():
        return connecting.result()
    connecting.cancel()
    await asyncio.gather(connecting, return_exceptions=True)
    return None


async def _run_roles(
    nc: NATS,
    *,
    stop: asyncio.Event,
    state: PodState,
    settings: Settings,
    registry: Registry,
    roles: Sequence[str],
    shutdown_timeout: float,
    extra: Extra | None = None,
) -> bool:
    # start-up runs to its end even if `stop` comes meanwhile (it is bounded, and a
    # half-started actor could not be stopped); `stop.wait()` then returns at once
    # a pod: a step user that cannot run is a configuration error, never a quiet fallback
    rt = await start_roles(nc, settings=settings, roles=roles, registry=registry, step_user_fallback=False)
    tune_gc()
    collector = ConsumerCollector(nc, rt.consumers())
    registry.add_collector(collector)
    registry.add_collector(rt)
    clean = False
    stop_extra = await extra(nc) if extra is not None else None
    try:
        state.ready(nc)
        log.info("serving roles %s", ",".join(roles))
        await stop.wait()
    finally:
        state.draining = True  # /readyz answers 503 from here on
        try:
            async with asyncio.timeout(shutdown_timeout):
                await rt.stop(drain_timeout=settings.drain_timeout)
            clean = True
        except TimeoutError:
            log.error("roles did not stop within %.0fs; exiting anyway", shutdown_timeout)
        registry.remove_collector(collector)
        registry.remove_collector(rt)
        if stop_extra is not None:
            await stop_extra()
    return clean
