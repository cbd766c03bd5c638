"""The pool of python worker processes: spawning them lazily up to its size, handing one
to each call, killing and replacing one on timeout, cancel or crash, closing them all.

Timeouts and cancel: the worker's process group gets SIGKILL, the process is reaped,
a replacement is started, and ``ToolFailure(Timeout, retryable)`` / ``Cancelled`` is
raised; a worker that dies is reported (``WorkerCrashed``) and replaced. `close()` kills
and reaps every worker. The time a cold worker takes to boot (interpreter start and
imports, ~60 ms, bounded by ``start_timeout``) is not charged to the call's timeout;
waiting for a free worker is. Cancelling the calling task kills the worker too and lets
`CancelledError` propagate.

A pool is used from one event loop at a time (any loop: it keeps no loop-bound state
between calls). It is owned by a tool actor's `ToolResources`, not by the process.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import subprocess
import sys
from collections import deque
from typing import Any

import orjson

from actors.jsonvalues import dumps, loads
from actors.tools.capture import OutputBox, read_capture, reset_capture
from actors.tools.cpus import available_cpus
from actors.tools.environment import base_environment
from actors.tools.failures import ToolFailure, cancelled_failure, timeout_failure
from actors.tools.pyprocess import Stop, WorkerProcess, bounded, describe_end, reap, wait_reaped
from actors.tools.pyworker import ERR, HDR, OK, READY

__all__ = ["PythonPool"]


class PythonPool:
    """A pool of worker processes running python tool code (see the module docstring).

    Workers start lazily as calls need them, up to `size`; `await start()` warms all.
    """

    def __init__(
        self,
        *,
        size: int | None = None,
        start_timeout: float = 60.0,
        code_cache_size: int = 256,
        python: str | None = None,
        environment: dict[str, str] | None = None,
    ) -> None:
        """`size`: most workers at once (default: the CPUs this process may use, see
        `available_cpus`); `start_timeout`: seconds a
        worker may take to boot; `code_cache_size`: compiled snippets kept per worker;
        `python`: the interpreter to run workers with (default: ``sys.executable``);
        `environment`: the workers' whole environment (default: `base_environment()`,
        never the pod's own)."""
        self.size = max(1, size if size is not None else available_cpus())
        self.start_timeout = start_timeout
        self._python = python or sys.executable
        self.environment = dict(environment) if environment is not None else base_environment()
        self._cache_size = max(1, code_cache_size)
        self._workers: set[WorkerProcess] = set()  # live: idle, busy or starting
        self._reaping: dict[asyncio.Future[int | None], subprocess.Popen[bytes]] = {}
        self._idle: deque[WorkerProcess] = deque()
        self._waiters: deque[asyncio.Future[WorkerProcess]] = deque()
        self._closed = False

    # --- introspection ----------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def pids(self) -> list[int]:
        """Pids of the live worker processes."""
        return [worker.pid for worker in self._workers if not worker.dead]

    # --- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Start all `size` workers and wait until each is ready."""
        if self._closed:
            raise cancelled_failure("python worker pool closed")
        loop = asyncio.get_running_loop()
        ws = [worker for worker in self._idle if not worker.ready]
        for worker in ws:
            self._idle.remove(worker)
        try:
            while len(self._workers) < self.size:
                ws.append(self._spawn())
            for worker in ws:
                worker.loop = loop
                await self._await_ready(worker, loop, None)
        finally:
            for worker in ws:
                if not worker.dead:
                    self._release(worker)

    async def close(self) -> None:
        """Stop every worker (SIGKILL to its process group) and reap them all."""
        self._closed = True
        while self._waiters:
            f = self._waiters.popleft()
            if not f.done() and not f.get_loop().is_closed():
                f.set_exception(cancelled_failure("python worker pool closed"))
        self._idle.clear()
        procs = [worker.proc for worker in self._workers]
        for worker in list(self._workers):
            self._kill(worker)
        loop = asyncio.get_running_loop()
        mine = {f for f in self._reaping if f.get_loop() is loop}
        if mine:
            await asyncio.wait(mine, timeout=5.0)
        # belt and braces: anything not reaped yet (or being reaped by a closed loop)
        for proc in procs + list(self._reaping.values()):
            if proc.returncode is None:
                wait_reaped(proc, 1.0)

    # --- calls ------------------------------------------------------------------------

    async def run(
        self,
        code: str,
        args: dict[str, Any],
        *,
        timeout: float | None = None,
        cancel: asyncio.Event | None = None,
        output: OutputBox | None = None,
        credential: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
    ) -> Any:
        """Run `code`'s ``main(**args)`` in a worker; its result, or ToolFailure."""
        return loads(
            await self.run_json(
                code, args, timeout=timeout, cancel=cancel, output=output, credential=credential, env=env
            )
        )

    async def run_json(
        self,
        code: str,
        args: dict[str, Any],
        *,
        timeout: float | None = None,
        cancel: asyncio.Event | None = None,
        output: OutputBox | None = None,
        credential: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
    ) -> bytes:
        """Run `code`'s ``main(**args)`` in a worker; its result as the JSON text the
        worker wrote (it checked the result is JSON data), or ToolFailure. What the
        code printed goes into `output` (when given), whatever the outcome. `credential`
        goes to ``main``'s ``credential`` parameter (if it has one); `env` is laid over
        the worker's environment for this call only."""
        if self._closed:
            raise cancelled_failure("python worker pool closed")
        if cancel is not None and cancel.is_set():
            raise cancelled_failure()
        if timeout is not None and timeout <= 0:
            raise timeout_failure(timeout)
        try:
            request: dict[str, Any] = {"c": code, "a": args}
            if credential is not None:
                request["k"] = credential
            if env:
                request["e"] = env
            payload = dumps(request)
        except TypeError as exc:
            raise ToolFailure("ArgsNotSerialisable", f"python tool args are not JSON-serialisable: {exc}") from None
        frame = HDR.pack(len(payload)) + payload
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        worker, deadline = await self._acquire(loop, deadline, timeout, cancel)
        if worker.outfd is not None:
            reset_capture(worker.outfd)  # what it printed before this call is not this call's
        try:
            reply = await worker.exchange(loop, frame, deadline, cancel)
        except Stop as stop:
            _collect(worker, output)  # what it printed before it was stopped
            raise await self._fail(worker, stop, timeout) from None
        except Exception as exc:  # not expected: the worker's state is unknown, drop it
            _collect(worker, output)
            self._kill(worker)
            self._replace()
            raise ToolFailure("WorkerCrashed", f"python worker channel failed: {type(exc).__name__}: {exc}") from exc
        except BaseException:  # the caller was cancelled: stop the work, then propagate
            self._kill(worker)
            self._replace()
            raise
        _collect(worker, output)
        self._release(worker)
        status = reply[0] if reply else -1
        if status == OK:
            return reply[1:]
        if status == ERR:
            err = orjson.loads(memoryview(reply)[1:])
            raise ToolFailure(str(err.get("type")), str(err.get("message")), traceback=err.get("traceback"))
        raise ToolFailure("WorkerCrashed", f"python worker sent an unexpected frame (status {status})")

    # --- internals --------------------------------------------------------------------

    def _spawn(self) -> WorkerProcess:
        worker = WorkerProcess(self._python, self._cache_size, self.environment)
        worker.handlers = (functools.partial(self._on_data, worker), functools.partial(self._on_exit, worker))
        self._workers.add(worker)
        return worker

    def _on_data(self, worker: WorkerProcess) -> None:
        """The worker's socket is readable: the current call's reply, its READY frame
        (kept in the buffer if no call waits for it yet), or its end."""
        fut = worker.waiter
        try:
            eof = worker.fill()
        except OSError:
            eof = True
        if fut is not None and not fut.done():
            got = worker.take()
            if got is not None:
                fut.set_result(got)
            elif eof:
                fut.set_exception(Stop("crash"))
        if eof:
            worker.unwatch()  # an EOF stays readable
            if fut is None:
                self._lost(worker)

    def _on_exit(self, worker: WorkerProcess) -> None:
        """The worker's process has exited (its pidfd is readable)."""
        fut = worker.waiter
        try:
            got = worker.poll()  # a reply written just before dying still counts
        except (EOFError, OSError):
            got = None
        worker.unwatch()  # an exited pidfd stays readable
        if fut is None:
            self._lost(worker)
        elif not fut.done():
            if got is not None:
                fut.set_result(got)
            else:
                fut.set_exception(Stop("crash"))

    def _lost(self, worker: WorkerProcess) -> None:
        """A worker died while idle: reap it, start its replacement."""
        if not worker.dead:
            self._kill(worker)
            self._replace()

    def _replace(self) -> None:
        """Start a replacement for a killed worker (so the next call finds one warm)."""
        if self._closed or len(self._workers) >= self.size:
            return
        try:
            worker = self._spawn()
        except Exception:
            return
        self._release(worker)

    def _release(self, worker: WorkerProcess) -> None:
        worker.loop = None
        if self._closed or worker.dead:
            self._kill(worker)
            return
        while self._waiters:
            f = self._waiters.popleft()
            if not f.done() and not f.get_loop().is_closed():
                worker.loop = f.get_loop()
                f.set_result(worker)
                return
        self._idle.append(worker)

    def _reclaim_stuck(self) -> bool:
        """Workers held by calls whose event loop is gone are killed; True if any."""
        stuck = [worker for worker in self._workers if worker.loop is not None and worker.loop.is_closed()]
        for worker in stuck:
            worker.active = False
            self._kill(worker)
        return bool(stuck)

    async def _acquire(
        self, loop: asyncio.AbstractEventLoop, deadline: float | None, limit: float | None, cancel: asyncio.Event | None
    ) -> tuple[WorkerProcess, float | None]:
        while True:
            if self._closed:
                raise cancelled_failure("python worker pool closed")
            worker: WorkerProcess | None = None
            while self._idle:
                cand = self._idle.popleft()
                if cand.dead or cand.proc.poll() is not None:
                    self._kill(cand)
                    continue
                worker = cand
                break
            if worker is None:
                if len(self._workers) >= self.size and self._reclaim_stuck():
                    continue
                if len(self._workers) < self.size:
                    try:
                        worker = self._spawn()
                    except Exception as exc:
                        raise ToolFailure("WorkerCrashed", f"cannot start a python worker: {exc}") from None
                else:
                    fut: asyncio.Future[WorkerProcess] = loop.create_future()
                    self._waiters.append(fut)
                    try:
                        await bounded(fut, loop, deadline, cancel)
                    except BaseException as exc:
                        # still queued unless `_release` or `close` took it
                        try:
                            self._waiters.remove(fut)
                        except ValueError:
                            pass
                        if isinstance(exc, Stop):
                            if exc.reason == "cancel":
                                raise cancelled_failure() from None
                            raise timeout_failure(limit) from None
                        if fut.done() and not fut.cancelled() and fut.exception() is None:
                            self._release(fut.result())
                        raise
                    worker = fut.result()  # `_release` took `fut` off the queue before setting it
            worker.loop = loop
            if not worker.ready:
                t0 = loop.time()
                await self._await_ready(worker, loop, cancel)
                if deadline is not None:
                    deadline += loop.time() - t0  # a cold boot is not the user's time
            return worker, deadline

    async def _await_ready(
        self, worker: WorkerProcess, loop: asyncio.AbstractEventLoop, cancel: asyncio.Event | None
    ) -> None:
        try:
            frame = await worker.exchange(loop, None, loop.time() + self.start_timeout, cancel)
        except Stop as stop:
            if stop.reason == "cancel":  # the worker is fine: it goes on booting for the next call
                self._release(worker)
                raise cancelled_failure() from None
            said = _last_words(worker)  # its stderr is the capture file, not ours: read it before it is closed
            reap = self._kill(worker)
            if reap is not None:
                await asyncio.wait({reap}, timeout=5.0)
            what = (
                "did not start in time" if stop.reason == "timeout" else f"died while starting ({describe_end(worker)})"
            )
            said = f": {said}" if said else ""
            raise ToolFailure("WorkerCrashed", f"python worker {what}{said}", retryable=True) from None
        except asyncio.CancelledError:
            self._release(worker)
            raise
        except BaseException:
            self._kill(worker)
            raise
        if not frame or frame[0] != READY:
            self._kill(worker)
            raise ToolFailure("WorkerCrashed", "python worker sent an unexpected first frame")
        worker.ready = True

    async def _fail(self, worker: WorkerProcess, stop: Stop, limit: float | None) -> ToolFailure:
        """Kill and reap `w`, start its replacement; the failure to raise."""
        reap = self._kill(worker)
        self._replace()
        if reap is not None:
            await asyncio.wait({reap}, timeout=5.0)
        if self._closed:
            return cancelled_failure("python worker pool closed")
        if stop.reason == "timeout":
            return timeout_failure(limit)
        if stop.reason == "cancel":
            return cancelled_failure()
        return ToolFailure("WorkerCrashed", f"python worker died while running the code ({describe_end(worker)})")

    def _kill(self, worker: WorkerProcess) -> asyncio.Future[int | None] | None:
        """SIGKILL the worker's process group; return a future set once it is reaped."""
        if worker.dead:
            return worker.reaped
        worker.dead = True
        self._workers.discard(worker)
        try:
            self._idle.remove(worker)
        except ValueError:
            pass
        if worker.proc.returncode is None:  # not reaped: its pid and group id are still ours
            try:
                os.killpg(worker.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                worker.proc.kill()
            except OSError:
                pass
        worker.reaped = r = reap(worker)
        if not worker.active:
            worker.release_fds()
        if r is not None and not r.done():
            self._reaping[r] = worker.proc
            r.add_done_callback(lambda f: self._reaping.pop(f, None))
        return r


def _collect(worker: WorkerProcess, output: OutputBox | None) -> None:
    """What `worker` printed during the call, into `output`."""
    if output is None or worker.outfd is None:
        return
    try:
        output.captured = read_capture(worker.outfd, output.cap)
    except OSError:
        pass


def _last_words(worker: WorkerProcess, limit: int = 500) -> str:
    """The end of what a worker that failed to start wrote (an import error, say)."""
    if worker.outfd is None:
        return ""
    try:
        tail = read_capture(worker.outfd, 0).tail[-limit:]
    except OSError:
        return ""
    return " ".join(tail.decode("utf-8", errors="replace").split())
