"""Ours: a fresh nats-server (`--sync default|always`) and one pod as its own process
(`actors-cli serve --role all`, as bench/e2e_small.py runs it), the client
(`actors.client.Client`) in the driver's process; playbooks from
`bench.common.chain_playbook` (python steps doing `i + 1`)."""

from __future__ import annotations

import asyncio
import importlib.metadata
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from nats.aio.client import Client as NATS

from actors.client import Client
from actors.pod.roles import connect
from bench.common import chain_playbook
from bench.peers.side import CHAIN, TIMEOUT, check
from streams.layout import Layout
from streams.server import NatsServer
from tests.support.pods import PodProcess


def last(result: object, steps: int) -> object:
    """The value of a chain's last step in its execution result ({"s<steps>": value})."""
    return result.get(f"s{steps}") if isinstance(result, dict) else result


class ActorsSide:
    name = "actors"

    def __init__(self, *, sync: str, exec_streams: int = 1) -> None:
        self.sync = sync
        # the executions' logs over this many streams (ACTORS_EXEC_STREAMS; docs/operating.md)
        self.layout = Layout(partitions=max(8, exec_streams), exec_streams=exec_streams)
        self.server: NatsServer | None = None
        self.pod: PodProcess | None = None
        self.nc: NATS | None = None
        self.client: Client | None = None
        self.tmp = tempfile.TemporaryDirectory(prefix="bench-peers-actors-")
        self.playbooks: dict[int, tuple[str, int]] = {}  # steps -> (path, version)

    async def start(self, wrap: Sequence[str] = ()) -> None:
        self.server = await NatsServer.start(sync=self.sync, wrap=wrap)
        tmp = Path(self.tmp.name)
        self.pod = await PodProcess.start("all", url=self.server.url, layout=self.layout, logs=tmp, name="pod")
        await self.pod.ready()
        self.nc = await connect(self.server.url, name="bench-peers")
        self.client = Client(self.nc, layout=self.layout)
        for steps in (3, CHAIN):
            pb = tmp / f"chain{steps}.yaml"
            pb.write_text(chain_playbook(f"peers_chain{steps}", steps, "python"))
            entry = await self.client.register(pb)
            self.playbooks[steps] = (entry.path, entry.version)

    async def _run(self, steps: int) -> float:
        """One execution of the `steps` chain; seconds from start to the terminal status,
        then its result read and checked (outside the timed part)."""
        assert self.client is not None
        path, version = self.playbooks[steps]
        t0 = time.perf_counter()
        eid, status = await self.client.run(path, version=version, payload={"i": 0}, timeout=TIMEOUT)
        took = time.perf_counter() - t0
        check(f"actors {steps} steps ({eid}, {status.state})", last(await self.client.result(eid), steps), steps)
        return took

    async def one_3step(self) -> float:
        return await self._run(3)

    async def chain50(self) -> float:
        return await self._run(CHAIN)

    async def concurrent(self, n: int) -> float:
        assert self.client is not None
        path, version = self.playbooks[3]
        client = self.client
        t0 = time.perf_counter()
        done = await asyncio.gather(
            *(client.run(path, version=version, payload={"i": 0}, timeout=TIMEOUT) for _ in range(n))
        )
        took = time.perf_counter() - t0
        for eid, status in done:
            check(f"actors concurrent 3 steps ({eid}, {status.state})", last(await client.result(eid), 3), 3)
        return took

    def fsync_pids(self) -> list[int]:
        assert self.server is not None
        return [self.server.proc.pid]

    def versions(self) -> dict[str, str]:
        return {
            "actors": importlib.metadata.version("actors-workflow"),
            "nats-py": importlib.metadata.version("nats-py"),
        }

    async def stop(self) -> None:
        try:
            if self.pod is not None:
                await self.pod.stop()
            if self.nc is not None:
                await self.nc.close()
        finally:
            if self.server is not None:
                await self.server.stop()
            self.tmp.cleanup()
