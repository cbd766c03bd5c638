"""What every system in the peer bench offers the driver, and what the sides share."""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

ROOT = Path(__file__).resolve().parents[2]  # the repository
CHAIN = 50  # steps in workload (2)
TIMEOUT = 120.0  # any single request to a side


class Side(Protocol):
    """One system under test: its servers and workers started and stopped by the bench.
    Every workload checks its results (3 for a 3-step workflow, 50 for the chain) and
    raises if one is wrong."""

    name: str

    async def start(self, wrap: Sequence[str] = ()) -> None:
        """Start the servers and workers; the server processes whose fsyncs count under
        the command `wrap` (bench/peers/fsync.py's strace), their children with them."""
        ...

    async def one_3step(self) -> float:
        """Seconds from start to result of one 3-step workflow."""
        ...

    async def chain50(self) -> float:
        """Seconds from start to result of a chain of `CHAIN` steps."""
        ...

    async def concurrent(self, n: int) -> float:
        """Seconds from the first start to the last result of `n` 3-step workflows at once."""
        ...

    def fsync_pids(self) -> list[int]:
        """The server processes started under `wrap` (checked to be traced)."""
        ...

    def versions(self) -> dict[str, str]: ...
    async def stop(self) -> None: ...


def check(what: str, got: Any, want: int) -> None:
    if got != want:
        raise RuntimeError(f"{what}: result {got!r}, expected {want}")


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of non-empty `values`."""
    s = sorted(values)
    return s[max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))]


class ChildApp:
    """A peer's app in a child process (`python -m MODULE ARGS`), driven by one JSON line
    per request on its stdin, answered by one JSON line on its stdout (its logs go to a
    file: stdout carries only answers). The child says {"ready": ...} once it can serve."""

    def __init__(self, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.proc, self.log = proc, log
        self.hello: dict[str, Any] = {}

    @classmethod
    async def start(cls, module: str, *args: str, log: Path, env: dict[str, str] | None = None) -> ChildApp:
        with log.open("wb") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                module,
                *args,
                cwd=ROOT,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                env={**os.environ, **(env or {})},
            )
        app = cls(proc, log)
        app.hello = await app._answer()
        return app

    async def _answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), TIMEOUT)
        if not line:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{self.log.name}: the child exited ({self.proc.returncode}):\n{tail}")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"{self.log.name}: {answer['error']}")
        return answer

    async def ask(self, **request: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        await self.proc.stdin.drain()
        return await self._answer()

    async def stop(self) -> None:
        if self.proc.returncode is None and self.proc.stdin is not None:
            self.proc.stdin.close()  # end of requests: the child shuts its app down and exits
            try:
                await asyncio.wait_for(self.proc.wait(), 30)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


def serve_lines(handlers: dict[str, Any], hello: dict[str, Any]) -> None:
    """The child's side of `ChildApp`: answer each request line with handlers[op](**rest)
    until stdin closes. Runs in the child's main thread (sync)."""
    out = sys.stdout
    out.write(json.dumps({"ready": True, **hello}) + "\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        try:
            answer = handlers[request.pop("op")](**request)
        except Exception as e:  # reported to the driver, which stops the run
            answer = {"error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()
