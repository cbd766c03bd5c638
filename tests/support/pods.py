"""Actor pods as separate processes (`actors-cli serve --role ROLE`), as Kubernetes
runs them: for tests that kill one with SIGKILL."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from streams.layout import Layout
from streams.server import free_port

ROOT = Path(__file__).resolve().parents[2]


# the last commit of semantics 5 (main before semantics 6): an engine pod of 5, as a roll
# back from 6 runs one (tests/system/test_fast_answers.py)
SEMANTICS_5 = "9845ed6b583c61dc1b30385f212ba834ce113b26"


@contextlib.contextmanager
def checkout(commit: str, where: Path) -> Iterator[Path]:
    """`commit` of this repository checked out at `where`, a git worktree removed on
    exit: the code of an earlier release for a pod (`PodProcess.start(code=...)`), run
    with this checkout's interpreter and packages. Skips the test where this clone does
    not hold the commit (a shallow one) or git is not there."""
    try:
        found = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
    except FileNotFoundError:
        pytest.skip("no git: an earlier release cannot be checked out")
    if found.returncode:
        pytest.skip(f"commit {commit[:12]} is not in this clone (a shallow one?): fetch it to run this test")
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(where), commit],
        check=True,
        capture_output=True,
    )
    try:
        yield where
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)], capture_output=True)


def layout_env(layout: Layout) -> dict[str, str]:
    """The environment that makes a pod's `Settings.from_env().layout` equal `layout`."""
    return {
        "ACTORS_PARTITIONS": str(layout.partitions),
        "ACTORS_REPLICAS": str(layout.replicas),
        "ACTORS_ACK_WAIT": str(layout.ack_wait),
        "ACTORS_LEASE_TTL": str(layout.lease_ttl),
        "ACTORS_DUPLICATE_WINDOW": str(layout.duplicate_window),
        "ACTORS_ENGINE_MAX_RESIDENT": str(layout.engine_max_resident),
        "ACTORS_COUNTER_MAX_RESIDENT": str(layout.counter_max_resident),
        # only when set: a pod of an earlier checkout (bench/writes.py --baseline) knows one stream
        **({"ACTORS_EXEC_STREAMS": str(layout.exec_streams)} if layout.exec_streams != 1 else {}),
    }


async def get(session: aiohttp.ClientSession, url: str) -> tuple[int, str, str]:
    async with session.get(url) as r:
        return r.status, r.headers.get("Content-Type", ""), await r.text()


async def until_status(
    session: aiohttp.ClientSession,
    url: str,
    status: int,
    *,
    timeout: float,
    proc: asyncio.subprocess.Process | None = None,
) -> None:
    """Poll `url` until it answers `status` (readiness has no event to await from outside)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        if proc is not None and proc.returncode is not None:
            raise AssertionError(f"serve exited with {proc.returncode} before {url} answered {status}")
        try:
            if (await get(session, url))[0] == status:
                return
        except aiohttp.ClientConnectionError:
            pass  # not listening yet
        if loop.time() > deadline:
            raise TimeoutError(f"{url} did not answer {status} within {timeout}s")
        await asyncio.sleep(0.05)


class PodProcess:
    def __init__(self, role: str, proc: asyncio.subprocess.Process, port: int, log: Path) -> None:
        self.role, self.proc, self.port, self.log = role, proc, port, log

    @classmethod
    async def start(
        cls,
        role: str,
        *,
        url: str,
        layout: Layout,
        logs: Path,
        name: str,
        drain_timeout: float = 2,
        env: dict[str, str] | None = None,
        code: Path = ROOT,
    ) -> PodProcess:
        """`env`: more variables for the pod (credentials, TLS files). `code`: the
        checkout it runs from (an earlier commit's worktree, for benches that compare),
        first on its sys.path."""
        port = free_port()
        log = logs / f"{name}.log"
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "actors.cli",
                "serve",
                "--role",
                role,
                "--http-port",
                str(port),
                "--http-host",
                "127.0.0.1",
                "--drain-timeout",
                str(drain_timeout),
                cwd=code,  # `-m` puts the working directory first on sys.path
                stdout=out,
                stderr=out,
                env={
                    **os.environ,
                    "NATS_URL": url,
                    **layout_env(layout),
                    **({"PYTHONPATH": str(code)} if code != ROOT else {}),
                    **(env or {}),
                },
            )
        return cls(role, proc, port, log)

    async def ready(self, timeout: float = 60) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
            await until_status(http, f"http://127.0.0.1:{self.port}/readyz", 200, timeout=timeout, proc=self.proc)

    async def dump_tasks(self, timeout: float = 5) -> str:
        """What the pod's tasks wait on (`kill -USR1`, actors/pod/taskdump.py), read back from
        its log: for the report of a test that found work stuck."""
        if self.proc.returncode is not None:
            return f"{self.log.name}: exited with {self.proc.returncode}"
        before = self.log.read_bytes()
        self.proc.send_signal(signal.SIGUSR1)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            after = self.log.read_bytes()[len(before) :]
            if b" asyncio tasks\n" in after:
                await asyncio.sleep(0.2)  # the dump is written in one go; let it land
                return self.log.read_bytes()[len(before) :].decode(errors="replace")
            await asyncio.sleep(0.05)  # a file has no event to await
        return f"{self.log.name}: no task dump within {timeout}s"

    async def kill(self) -> None:
        """kill -9: nothing is handed back, leases and unacked messages age out."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()

    async def stop(self, timeout: float = 20) -> int:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(timeout):
                    await self.proc.wait()
            except TimeoutError:
                await self.kill()
        assert self.proc.returncode is not None
        return self.proc.returncode
