"""Rendering templates in a process of their own, with OS limits, for folds moved off
the event loop.

A template that is not cheap by construction (actors/playbook/inline.py) never renders
on a pod's own threads: a fold that meets one on the event loop is moved to a worker
thread (actors/runtime/hosting.py), and that thread hands the render to a render process and
waits on the pipe, without the interpreter lock, for the answer. The process
(actors/playbook/render_worker.py) is a fresh interpreter started from a clean
environment (it holds no pod secret), limited in address space, unable to write files
or dump core, not dumpable, at the lowest CPU priority. It renders with the same code
and the same counted budget, so a template that goes over its operations or output
bound fails the same way on every replay.

What the OS or the pod bounds is not a pure function of the log: a render past the
pod's deadline (`seconds`) is killed, one that ran out of memory ends, a process that
died is gone. Each raises `RenderFault`, which the engine (or the counter) records in
the log before deciding anything from it (actors/engine/actor.py). A pod that stops
kills the processes, which ends a render at once (`RenderHalted`: nothing is decided).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import select
import signal
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import msgspec
import orjson

from actors.playbook.errors import PlaybookError, PlaybookInvalid
from actors.playbook.model import Playbook
from actors.playbook.render_worker import RenderReply, RenderRequest
from actors.playbook.templates import (
    INLINE_TEMPLATE_OPS,
    RenderFault,
    RenderHalted,
    TemplateError,
    TemplateLimit,
    call_with_slice,
    names_read,
    off_the_loop,
)
from actors.wire.messages import Limits

if TYPE_CHECKING:
    from actors.config.settings import Settings

T = TypeVar("T")

# the worker's own code: sys.path from the pod (not PYTHONPATH: the environment is clean)
_BOOT = (
    "import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
    "from actors.playbook.render_worker import main; main(int(sys.argv[2]), int(sys.argv[3]))"
)
_encoder = msgspec.json.Encoder()
_TICKS = os.sysconf("SC_CLK_TCK")
CPU_CHECK = 0.1  # seconds between two looks at a render's CPU time
_decoder = msgspec.json.Decoder(RenderReply)


@dataclass(frozen=True, slots=True)
class RenderBounds:
    """What the OS and the pod bound a render process by (pod settings, not `Limits`:
    their outcomes are recorded in the log, so pods may differ)."""

    seconds: float = 10.0  # CPU seconds a render may use; then the process is killed
    memory: int = 1 << 30  # bytes of address space (RLIMIT_AS); 0: none
    # a render starved of CPU (a node loaded to its limits, the process at nice 19) is
    # killed after this many times `seconds` of wall-clock time all the same
    wall_factor: float = 6.0

    @classmethod
    def of(cls, settings: Settings) -> RenderBounds:
        """A pod's bounds, from its settings (ACTORS_TEMPLATE_SECONDS, ACTORS_TEMPLATE_MEMORY_MB)."""
        return cls(seconds=settings.template_seconds, memory=settings.template_memory_mb << 20)


def render_environment() -> dict[str, str]:
    """All a render process is given: it renders templates, it needs no pod setting."""
    return {"PATH": os.defpath, "LANG": "C.UTF-8"}


class EncodedValues:
    """Scope values already written as JSON, by identity, for the renders that send them
    again: a step's 60 MB result read by a router's `when` at every activation is
    encoded once, not once a render (the encoding holds the interpreter lock the event
    loop needs). A value is held with its encoding, so its id cannot be reused meanwhile;
    only big ones are kept, `budget` bytes of them at most, least recently used first."""

    BIG = 64 << 10

    def __init__(self, budget: int = 256 << 20) -> None:
        self.budget = budget
        self._kept: OrderedDict[int, tuple[Any, msgspec.Raw]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def scope(self, scope: Mapping[str, Any], wanted: set[str]) -> dict[str, Any]:
        return {k: self._encoded(v) for k, v in scope.items() if k in wanted}

    def _encoded(self, value: Any) -> Any:
        if not isinstance(value, (dict, list, str)) or (not isinstance(value, str) and not value):
            return value
        with self._lock:
            kept = self._kept.get(id(value))
            if kept is not None and kept[0] is value:
                self._kept.move_to_end(id(value))
                return kept[1]
        raw = msgspec.Raw(_encoder.encode(value))
        if len(raw) < self.BIG:
            return raw
        with self._lock:
            self._kept[id(value)] = (value, raw)
            self._bytes += len(raw)
            while self._bytes > self.budget and self._kept:
                _, (_, old) = self._kept.popitem(last=False)
                self._bytes -= len(old)
        return raw


class RenderProcess:
    """One render process, used by one thread at a time."""

    def __init__(self, bounds: RenderBounds, encoded: EncodedValues | None = None) -> None:
        self.bounds = bounds
        self.encoded = encoded if encoded is not None else EncodedValues()
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-c", _BOOT, orjson.dumps(sys.path).decode(), str(bounds.memory), str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            env=render_environment(),
            start_new_session=True,  # a Ctrl-C at the terminal is the pod's to handle, not the renderer's
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self._in = self.process.stdin
        self._out = self.process.stdout.fileno()
        self.killed = False

    def alive(self) -> bool:
        return self.process.poll() is None

    def load(self, source: str, file: str, max_attempts: int) -> Playbook:
        """A playbook source loaded here (YAML parsed, every template compiled): a big
        one takes the pod a second, and a pathological one longer. PlaybookInvalid as
        `load_playbook` raises it; a load past the deadline or out of memory is a fault
        like a render's (`where`: `playbook`)."""
        request = RenderRequest(
            value=None, scope={}, where="playbook", limits=Limits(max_attempts=max_attempts), playbook=source, file=file
        )
        # a model written out is a few times its YAML (aliases expanded: at most 100,000 nodes)
        reply = self._ask(request, "playbook", "", extra=32 * len(source) + (16 << 20))
        if reply.ok:
            return msgspec.convert(reply.value, Playbook)
        if reply.kind == "PlaybookInvalid":
            raise PlaybookInvalid(msgspec.convert(reply.value, list[PlaybookError]))
        self._raise(reply, "playbook", "")

    def render(self, value: Any, scope: Mapping[str, Any], where: str, limits: Limits, step: str) -> Any:
        # only the names the templates read travel (an execution's scope holds every
        # step's result); a template that reads an unknown name fails the same way there
        wanted = names_read(value)
        request = RenderRequest(
            value=value, scope=self.encoded.scope(scope, wanted), where=where, limits=limits, step=step
        )
        # what comes back is the scope's own values passed on, or what the template built
        # (each within the output bound): a reply over that is refused before it is read
        reply = self._ask(request, where, step, extra=2 * limits.template_output)
        if reply.ok:
            return reply.value
        self._raise(reply, where, step)

    def _ask(self, request: RenderRequest, where: str, step: str, *, extra: int) -> RenderReply:
        """Send `request`, read its reply: at most the request's size plus `extra` bytes."""
        body = _encoder.encode(request)
        cpu_at_start = self._cpu()
        # the kernel's own bound beside the pod's watch: SIGXCPU a second past the deadline
        with contextlib.suppress(OSError, ValueError):
            soft = int(cpu_at_start + self.bounds.seconds) + 2
            resource.prlimit(self.process.pid, resource.RLIMIT_CPU, (soft, resource.RLIM_INFINITY))
        try:
            self._in.write(len(body).to_bytes(4, "big") + body)
            self._in.flush()
        except (BrokenPipeError, OSError):
            self._died(where, step)
        return self._read_reply(where, step, cpu_at_start, len(body) + extra + (64 << 10))

    def _raise(self, reply: RenderReply, where: str, step: str) -> NoReturn:
        if reply.limit == "template_memory":
            self.kill()  # it exits after saying so: the next render starts a fresh one
            raise RenderFault(
                f"the render ran out of memory (more than {self.bounds.memory >> 20:,} MB of address space)",
                limit="template_memory",
                where=where,
                step=step,
            )
        if reply.kind == TemplateLimit.kind:
            raise TemplateLimit(reply.message, limit=reply.limit, where=reply.where or where)
        raise TemplateError(reply.message, where=reply.where or where)

    def _read_reply(self, where: str, step: str, cpu_at_start: float, max_reply: int) -> RenderReply:
        """The reply, read as it comes. Every `CPU_CHECK` seconds without it, the
        process's CPU time is read: past `seconds` of CPU (a measure that a loaded node
        does not stretch) it is killed, and past `wall_factor` times that in wall-clock
        time too."""
        bounds = self.bounds
        wall_deadline = time.monotonic() + bounds.seconds * bounds.wall_factor
        buf = bytearray()
        need = 4
        poller = select.poll()
        poller.register(self._out, select.POLLIN | select.POLLHUP | select.POLLERR)
        while True:
            while len(buf) >= need:
                if need == 4:
                    need = 4 + int.from_bytes(buf[:4], "big")
                    if need - 4 > max_reply:  # the pod never holds more than the render could rightly make
                        self.kill()
                        raise TemplateLimit(
                            f"a result of {need - 4:,} bytes, more than the scope it read and twice the output "
                            "bound (template_output)",
                            limit="template_output",
                            where=where,
                        )
                    continue
                return _decoder.decode(bytes(buf[4:need]))
            left = wall_deadline - time.monotonic()
            if left <= 0:
                self._deadline(
                    f"the render did not finish within {bounds.seconds * bounds.wall_factor:g} s "
                    f"({bounds.wall_factor:g} times its {bounds.seconds:g} s of CPU) and was killed",
                    where,
                    step,
                )
            if not poller.poll(min(left, CPU_CHECK) * 1000):
                if self._cpu() - cpu_at_start > bounds.seconds:
                    self._deadline(f"the render used more than {bounds.seconds:g} s of CPU and was killed", where, step)
                continue
            try:
                chunk = os.read(self._out, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                self._died(where, step)
            buf += chunk

    def _deadline(self, message: str, where: str, step: str) -> NoReturn:
        self.kill()
        raise RenderFault(message, limit="template_seconds", where=where, step=step)

    def _cpu(self) -> float:
        """CPU seconds the process has used (user and system), 0 when it cannot be read."""
        try:
            with open(f"/proc/{self.process.pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / _TICKS
        except (OSError, IndexError, ValueError):
            return 0.0

    def _died(self, where: str, step: str) -> NoReturn:
        """The process is gone before answering: killed by the pod (it stops: nothing is
        decided) or dead on its own (out of memory, a crash): a fault to record."""
        if self.killed:
            raise RenderHalted
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            code = None
        how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit status {code}"
        if code == -signal.SIGXCPU:
            raise RenderFault(
                f"the render used more than {self.bounds.seconds:g} s of CPU and was killed ({how})",
                limit="template_seconds",
                where=where,
                step=step,
            )
        raise RenderFault(
            f"the render process ended before answering ({how}; out of memory?)",
            limit="template_memory",
            where=where,
            step=step,
        )

    def kill(self) -> None:
        self.killed = True
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for f in (self.process.stdin, self.process.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass

    def close(self) -> None:
        self.kill()


class RenderProcesses:
    """A render process for each thread that asks (the host's fold threads), started on
    first use (and again after one was killed or died); `close` kills them all."""

    def __init__(self, bounds: RenderBounds) -> None:
        self.bounds = bounds
        self.encoded = EncodedValues()  # shared by this host's render processes
        self._local = threading.local()
        self._all: list[RenderProcess] = []
        self._lock = threading.Lock()
        self.closed = False

    def for_this_thread(self) -> RenderProcess:
        proc: RenderProcess | None = getattr(self._local, "proc", None)
        if proc is None or proc.killed or not proc.alive():
            if self.closed:
                raise RenderHalted
            if proc is not None:
                proc.kill()  # reaped, its pipes closed
            proc = RenderProcess(self.bounds, self.encoded)
            with self._lock:
                if self.closed:
                    proc.kill()
                    raise RenderHalted
                self._all = [p for p in self._all if not p.killed]
                self._all.append(proc)
            self._local.proc = proc
        return proc

    def render(self, value: Any, scope: Mapping[str, Any], where: str, limits: Limits, step: str) -> Any:
        return self.for_this_thread().render(value, scope, where, limits, step)

    def load(self, source: str, file: str, max_attempts: int) -> Playbook:
        return self.for_this_thread().load(source, file, max_attempts)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            procs, self._all = self._all, []
        for proc in procs:
            proc.close()


class OffLoop:
    """Where pure work that renders templates runs: inline, on the event loop, where
    only templates cheap by construction render (any other raises SliceExhausted, as
    does a fold past its slice of INLINE_TEMPLATE_OPS operations), or off the event
    loop, on one of `threads` threads of its own (not the loop's default executor, which
    lends its threads to DNS look-ups and the like) whose other renders go to render
    processes bounded by `bounds`. `close` ends what still runs: a render process is
    killed, a thread rendering itself stops at its next yield."""

    def __init__(self, *, threads: int, name: str, bounds: RenderBounds | None = None) -> None:
        self._threads, self._name = threads, name
        self._pool: ThreadPoolExecutor | None = None
        self._halt = threading.Event()
        self._renders = RenderProcesses(bounds or RenderBounds())

    @staticmethod
    def inline(fn: Callable[[], T]) -> T:
        return call_with_slice(INLINE_TEMPLATE_OPS, fn)

    async def off_loop(self, fn: Callable[[], T]) -> T:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self._threads, thread_name_prefix=self._name)
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._run, fn)

    def _run(self, fn: Callable[[], T]) -> T:
        with off_the_loop(self._halt, remote=self._renders.render, loader=self._renders.load):
            return fn()

    def close(self) -> None:
        self._halt.set()
        self._renders.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
