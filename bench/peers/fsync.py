"""fsync and fdatasync of a server's processes, counted and optionally slowed, with
strace attached from outside (/usr/bin/strace; fault injection, `man strace` -e inject):

    strace -f -qq -o FILE -e trace=fsync,fdatasync [-e inject=fsync,fdatasync:delay_exit=US] -p PID...

`-f` follows the threads of each process and the children it forks after the attach
(postgres backends); the children already running are attached by pid. A traced
process stops at every syscall (ptrace), so the tracer costs time of its own: the
driver attaches it for the whole run only when it slows fsyncs, and otherwise only to
count, outside the timed workloads.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from bench.common import process_tree

STRACE = "/usr/bin/strace"


def available() -> str | None:
    return None if os.access(STRACE, os.X_OK) else f"no {STRACE}"


def _traced(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("TracerPid:") and line.split()[1] != "0" for line in f)
    except OSError:
        return True  # gone: nothing left to wait for


class FsyncTrace:
    def __init__(self, proc: asyncio.subprocess.Process, out: Path, pids: list[int]) -> None:
        self.proc, self.out, self.pids = proc, out, pids

    @classmethod
    async def attach(cls, roots: list[int], out: Path, *, delay_ms: float = 0, paths: bool = False) -> FsyncTrace:
        """Trace `roots` and their children; each fsync/fdatasync returns `delay_ms` late.
        `paths`: each line names the file flushed (`-y`)."""
        pids = [p for root in roots for p in process_tree(root)]
        argv = [STRACE, "-f", "-qq", *(["-y"] if paths else []), "-o", str(out), "-e", "trace=fsync,fdatasync"]
        if delay_ms > 0:
            argv += ["-e", f"inject=fsync,fdatasync:delay_exit={round(delay_ms * 1000)}"]
        for p in pids:
            argv += ["-p", str(p)]
        proc = await asyncio.create_subprocess_exec(*argv, stderr=asyncio.subprocess.DEVNULL)
        trace = cls(proc, out, pids)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while not all(_traced(p) for p in pids):  # attaching shows only in /proc: no event to await
            if proc.returncode is not None or loop.time() > deadline:
                await trace.detach()
                raise RuntimeError(f"strace did not attach to {pids}")
            await asyncio.sleep(0.01)
        return trace

    def text(self) -> str:
        """What strace wrote so far (all of it once detached)."""
        try:
            return self.out.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def count(self) -> int:
        """fsync and fdatasync calls so far (a call cut in two by another thread's line
        counts once: its `<unfinished ...>` half)."""
        return sum(1 for line in self.text().splitlines() if "sync(" in line and "resumed>" not in line)

    async def detach(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGINT)  # strace detaches and exits; the traced go on
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
