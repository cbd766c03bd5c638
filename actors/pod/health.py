"""A pod's HTTP face: probes and metrics (aiohttp).

* ``GET /healthz``: liveness. Answers while the event loop does; it never looks at
  NATS, or a NATS outage would have Kubernetes restart every pod at once.
* ``GET /readyz``: readiness. 200 once connected to NATS with the roles started; 503
  while starting, while NATS is unreachable, and from SIGTERM on (draining).
* ``GET /metrics``: the Prometheus text format 0.0.4, or OpenMetrics (with exemplars)
  when the ``Accept`` header asks for it, written by prometheus-client (see
  `actors.runtime.metrics`).

The server starts before NATS is dialled, so liveness holds while a pod waits for
its server, and stops last, so probes keep answering while a pod drains.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web
from prometheus_client.core import Metric

from actors.errors import UserError
from actors.runtime.metrics import Registry, gauge_family

log = logging.getLogger("actors.pod.health")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class PodState:
    """What /readyz reports; also a metrics collector (actors_ready, actors_nats_connected)."""

    def __init__(self) -> None:
        self.nc: Any = None
        self.started = False
        self.draining = False

    def ready(self, nc: Any) -> None:
        self.nc, self.started = nc, True

    def readiness(self) -> tuple[bool, str]:
        if self.draining:
            return False, "draining"
        if not self.started:
            return False, "starting"
        if self.nc is None or not self.nc.is_connected:
            return False, "NATS not connected"
        return True, "ready"

    async def collect(self) -> list[Metric]:
        ok, _ = self.readiness()
        connected = self.nc is not None and bool(self.nc.is_connected)
        return [
            gauge_family("actors_ready", "1 when this pod reports ready on /readyz.", (), [((), 1 if ok else 0)]),
            gauge_family(
                "actors_nats_connected", "1 while this pod's NATS connection is up.", (), [((), 1 if connected else 0)]
            ),
        ]


class HttpPortUnavailable(UserError):
    """The probes' port cannot be bound (in use, or not allowed): a setting to fix,
    not something a retry cures."""


class HealthServer:
    """`port=0` binds a free port (tests); `actors-cli serve --http-port 0` instead
    means no server at all."""

    def __init__(self, *, state: PodState, registry: Registry, host: str = "0.0.0.0", port: int = 8080) -> None:
        self.state = state
        self.registry = registry
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    async def start(self) -> int:
        """Serve; returns the bound port."""
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        # access_log=None: kubelet probes every few seconds would drown the pod's log
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        try:
            await site.start()
        except OSError as e:
            await self._runner.cleanup()
            self._runner = None
            raise HttpPortUnavailable(
                f"cannot listen on {self.host}:{self.port} for /healthz, /readyz and "
                f"/metrics: {e.strerror or e} (choose another --http-port, or 0 for none)"
            ) from None
        bound = self._runner.addresses[0][1] if self._runner.addresses else self.port
        self.port = int(bound)
        log.info("health and metrics on http://%s:%d", self.host, self.port)
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        ok, why = self.state.readiness()
        return web.Response(text=why + "\n", status=200 if ok else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        # a scraper that asks for OpenMetrics (Prometheus does, with exemplar storage
        # on) gets it, with the step histogram's exemplars; anyone else the 0.0.4 text
        accept = request.headers.get("Accept", "")
        body = await self.registry.render(accept)
        return web.Response(body=body.encode(), headers={"Content-Type": self.registry.content_type(accept)})
