"""fsync and fdatasync of a bench's server processes, counted and optionally slowed by
the strace that starts them (/usr/bin/strace; fault injection, `man strace` -e inject):

    strace -D -f --seccomp-bpf -qq -A [-y] -o FILE -e trace=fsync,fdatasync,sigaltstack,setsid
           -e signal=none [-e inject=fsync,fdatasync:delay_exit=US] -- SERVER ARGS...

Started under strace, not attached to (`-p`): an attached tracer stops its tracee at
*every* system call (ptrace), whatever `-e trace=` names, ~250 µs a call on this VM, so
a server doing thousands of reads, writes, epolls and futexes a second was mostly
measuring ptrace. `--seccomp-bpf` installs a filter before the exec, inherited by every
thread and forked child (`-f`: the postmaster's backends), under which only the traced
calls stop. `-D` runs the tracer as a detached grandchild: the server keeps the pid it
was started with (the bench signals and waits for it; pg_ctl checks the postmaster's),
and strace exits once every process it traces has. `-A`: a node restarted under the
same file appends.

One catch, strace's (6.1 here; unchanged in its source up to 7.2): a thread or process
born after the start is resumed at every system call (PTRACE_SYSCALL) until its first
seccomp stop, since strace cannot tell whether it has the filter until then. A thread
that never fsyncs (Go's sysmon, a backend that never flushes WAL itself) would stay as
slow as under `-p`. So the trace names `MARKERS` as well, a call each new thread or
child makes as it starts and seldom after: from its first, it stops only at traced
calls. Those lines are neither slowed nor counted.

What remains of the tracer's cost: each fsync stops its thread twice (the seccomp stop,
then its exit), ~0.1 ms on this VM (a small file's fsync: 0.10-0.22 ms untraced,
0.26-0.29 traced, 1.29-1.35 with a 1 ms delay), so `--fsync-delay-ms 1` slows each
fsync by 1.1-1.2 ms, not 1.0; a new thread or child stops at its first few calls; a
signal sent to a server (the Go runtime's preemption, rare) stops it once; every system
call runs the seccomp filter (well under 1 µs). The rest run at full speed: traced without a
delay, both peer benches' servers were within noise of untraced (bench/RESULTS.md).

    trace = FsyncTrace(folder, delay_ms=1)
    server = await NatsServer.start(sync=..., wrap=trace.wrap("nats"))
    trace.check([server.proc.pid])       # traced, by a seccomp filter
    since = trace.mark()
    ...                                  # a phase
    trace.count(since)                   # the fsyncs of that phase
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

STRACE = "/usr/bin/strace"
SYNCS = "fsync,fdatasync"
# traced too, neither slowed nor counted: a call each new thread or process of the
# servers makes as it starts and seldom after (Go's runtime, each new thread:
# sigaltstack; PostgreSQL, each child of the postmaster: setsid), so that strace sees
# its seccomp stop and from then on resumes it past every untraced call (docstring)
MARKERS = "sigaltstack,setsid"

Mark = Mapping[Path, int]  # each file's length at a moment, up to its last full line


def available() -> str | None:
    return None if os.access(STRACE, os.X_OK) else f"no {STRACE}"


def _status(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/status") as f:
            return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    except OSError:
        return {}


class FsyncTrace:
    """The strace output files of the servers started under `wrap(name)`, one per name,
    in `folder`; each fsync/fdatasync of theirs returns `delay_ms` late. `paths`: each
    line names the file flushed (`-y`)."""

    def __init__(self, folder: Path, *, delay_ms: float = 0, paths: bool = False) -> None:
        self.folder, self.delay_ms, self.paths = folder, delay_ms, paths
        self.files: list[Path] = []
        folder.mkdir(parents=True, exist_ok=True)

    def wrap(self, name: str = "server") -> list[str]:
        """The command to start one server under (its output in `folder/NAME.strace`)."""
        out = self.folder / f"{name}.strace"
        if out not in self.files:
            self.files.append(out)
        argv = [STRACE, "-D", "-f", "--seccomp-bpf", "-qq", "-A", *(["-y"] if self.paths else [])]
        argv += ["-o", str(out), "-e", f"trace={SYNCS},{MARKERS}", "-e", "signal=none"]
        if self.delay_ms > 0:
            argv += ["-e", f"inject={SYNCS}:delay_exit={round(self.delay_ms * 1000)}"]
        return [*argv, "--"]

    @staticmethod
    def check(pids: Iterable[int]) -> None:
        """Raise unless every process in `pids` is traced with a seccomp filter: strace
        falls back to stopping at every system call, silently, when it cannot install
        one (`man strace`, --seccomp-bpf)."""
        for pid in pids:
            status = _status(pid)
            if status.get("TracerPid", "0") == "0" or status.get("Seccomp") != "2":
                raise RuntimeError(
                    f"process {pid} is not traced by strace with a seccomp filter"
                    f" (TracerPid {status.get('TracerPid')}, Seccomp {status.get('Seccomp')})"
                )

    def _read(self, path: Path) -> bytes:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return b""
        return data[: data.rfind(b"\n") + 1]  # full lines only: strace may be mid-line

    def mark(self) -> Mark:
        """Now, to count from (`lines(since=...)`)."""
        return {path: len(self._read(path)) for path in self.files}

    def lines(self, since: Mark | None = None) -> list[str]:
        """The full lines written since `since` (all of them without), every file's."""
        out: list[str] = []
        for path in self.files:
            data = self._read(path)[(since or {}).get(path, 0) :]
            out += data.decode(errors="replace").splitlines()
        return out

    def text(self, since: Mark | None = None) -> str:
        return "\n".join(self.lines(since))

    def count(self, since: Mark | None = None) -> int:
        """fsync and fdatasync calls since `since` (a call cut in two by another
        thread's line counts once: its `<unfinished ...>` half)."""
        return sum(1 for line in self.lines(since) if "sync(" in line and "resumed>" not in line)
