"""The pool of python worker processes: spawning them lazily up to its size, handing
each call a worker, killing and replacing one on timeout, cancel or crash, closing them all.

A call goes to a free worker. A call of code known to be quick (its calls took less than
`QUICK_CALL` on average) may also be sent to a busy worker that runs only quick calls,
up to `QUEUE_DEPTH` at once: the worker finds its next request waiting as it sends a
reply, instead of sleeping until the parent's event loop comes round, and the requests
of one loop turn go out in one write. Measured with a 10,000-iteration python loop
(bench/loop_fanout.py): half the CPU per iteration, twice the iterations per second.
The price: a call of quick code that turns out slow holds up the calls queued behind it
(at most `QUEUE_DEPTH` - 1; their timeouts keep running, and one that expires is taken
back), and its code is then no longer quick if it timed out.

Timeouts and cancel: a call that its worker has not started yet is taken back (a SKIP
frame, see actors/tools/pyworker.py): it never runs, and the worker goes on with the
others. A running one gets its worker's process group SIGKILLed; the process is reaped,
a replacement is started, and ``ToolFailure(Timeout, retryable)`` / ``Cancelled`` is
raised; the calls queued behind it, never started, go to another worker. A worker that
dies is reported (``WorkerCrashed``) for the call it was running, and replaced. `close()`
kills and reaps every worker. The time a cold worker takes to boot (interpreter start
and imports, ~60 ms, bounded by ``start_timeout``) is not charged to the call's timeout;
waiting for a worker, free or busy, is. Cancelling the calling task stops its work too
(taken back, or its worker killed) and lets `CancelledError` propagate.

A pool is used from one event loop at a time (any loop: it keeps no loop-bound state
between calls). It is owned by a tool actor's `ToolResources`, not by the process.
"""

from __future__ import annotations

import asyncio
import functools
import os
import resource
import signal
import subprocess
import sys
from collections import deque
from typing import Any

import orjson

from actors.runtime.children import RunAs
from actors.tools.capture import TAIL, Captured, LiveOutput, OutputBox, read_capture
from actors.tools.cpus import available_cpus
from actors.tools.environment import base_environment
from actors.tools.failures import ToolFailure, cancelled_failure, timeout_failure
from actors.tools.pyprocess import Bounds, Call, Stop, WorkerProcess, bounded, describe_end, reap, wait_reaped
from actors.tools.pyworker import ERR, HDR, OK, OUT, READY, REQ, SKIPPED
from actors.wire.jsonvalues import dumps, loads

__all__ = ["QUEUE_DEPTH", "QUICK_CALL", "PythonPool"]

# A call of code whose calls took less than QUICK_CALL seconds on average (as its worker
# measured them) may be sent to a busy worker, behind at most QUEUE_DEPTH - 1 others: the
# worker finds the next request waiting when it sends a reply, instead of sleeping until
# the parent's event loop gets round to it (one kernel wake-up and one round trip a call).
# A call of other code (not seen yet, or slower) only goes to a free worker, and nothing
# is queued behind it. A queued call that times out or is cancelled before its worker
# starts it is taken back (the worker skips it): it never runs. 32, not 8: the python
# tool's 64 commands in flight then all sit at the 2 workers of a 2-CPU pod instead of
# waiting in line here (a future and a wake-up more each), and each write and read
# carries more calls (bench/python_pool.py: pod CPU per call -15%, workers' -20%). The
# price: a quick call that turns slow can hold up to 31 others (their timeouts run).
QUICK_CALL = 0.001
QUEUE_DEPTH = 32
_SPEED_KEPT = 1024  # snippets whose speed is remembered
_REQ, _SKIPPED = bytes((REQ,)), bytes((SKIPPED,))


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
        run_as: RunAs | None = None,
        cwd: str | None = None,
        memory: int = 0,
    ) -> None:
        """`size`: most workers at once (default: the CPUs this process may use, see
        `available_cpus`); `start_timeout`: seconds a
        worker may take to boot; `code_cache_size`: compiled snippets kept per worker;
        `python`: the interpreter to run workers with (default: ``sys.executable``);
        `environment`: the workers' whole environment (default: `base_environment()`,
        never the pod's own); `run_as`: the user workers run as (default: this
        process's; actors/runtime/children.py); `cwd`: their working directory (default: this
        process's); `memory`: bytes of address space each worker may map (RLIMIT_AS, set
        on the process once started, before it runs any user code; 0: no bound)."""
        self.size = max(1, size if size is not None else available_cpus())
        self.start_timeout = start_timeout
        self._python = python or sys.executable
        self.environment = dict(environment) if environment is not None else base_environment()
        self._run_as = run_as
        self._cwd = cwd
        self._memory = memory
        self._cache_size = max(1, code_cache_size)
        self._workers: set[WorkerProcess] = set()  # live: idle, busy or starting
        self._reaping: dict[asyncio.Future[int | None], subprocess.Popen[bytes]] = {}
        self._idle: deque[WorkerProcess] = deque()
        # callers waiting for a worker, and whether their code is quick (may be queued)
        self._waiters: deque[tuple[asyncio.Future[WorkerProcess], bool]] = deque()
        self._speed: dict[str, float] = {}  # code -> seconds a call takes (moving average)
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
            f, _ = self._waiters.popleft()
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
        filename: str | None = None,
    ) -> bytes:
        """Run `code`'s ``main(**args)`` in a worker; its result as the JSON text the
        worker wrote (it checked the result is JSON data), or ToolFailure. What the
        code printed goes into `output` (when given), whatever the outcome. `credential`
        goes to ``main``'s ``credential`` parameter (if it has one); `env` is laid over
        the worker's environment for this call only; `filename`: the name the code is
        compiled under (its tracebacks name it; the worker's own name when None)."""
        if self._closed:
            raise cancelled_failure("python worker pool closed")
        if cancel is not None and cancel.is_set():
            raise cancelled_failure()
        if timeout is not None and timeout <= 0:
            raise timeout_failure(timeout)
        try:
            request: dict[str, Any] = {"c": code, "a": args, "o": output.cap if output is not None else 0}
            if credential is not None:
                request["k"] = credential
            if env:
                request["e"] = env
            if filename is not None:
                request["f"] = filename
            payload = dumps(request)
        except TypeError as exc:
            raise ToolFailure("ArgsNotSerialisable", f"python tool args are not JSON-serialisable: {exc}") from None
        frame = HDR.pack(len(payload) + 1) + _REQ + payload
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        quick = self._is_quick(code)
        while True:
            worker = self._grab(loop, quick)
            if worker is None or not worker.ready:  # to wait for: a worker, or its boot
                worker, deadline = await self._acquire(loop, deadline, timeout, cancel, quick, worker)
            call = worker.submit(loop, frame)
            live = _follow(worker, output, quick)
            bounds = Bounds(call.fut, loop, deadline, cancel)
            try:
                try:
                    reply: bytes = await call.fut
                finally:
                    bounds.disarm()
                    if live is not None:
                        live.follow(None)  # the file is the next call's from now on
            except Stop as stop:
                if stop.reason == "requeue":  # its worker died before starting it: another one will
                    self._done_with(worker, quick)
                    continue
                if self._withdraw(worker, call, loop):  # never started, and now never will
                    self._done_with(worker, quick)
                    raise (timeout_failure(timeout) if stop.reason == "timeout" else cancelled_failure()) from None
                answer = call.answer()
                if answer is None:
                    if stop.reason == "timeout":
                        self._speed[code] = float("inf")  # not quick: nothing waits behind it again
                    _collect(worker, output)  # what it printed before it was stopped
                    self._kill(worker)  # before letting go of it: no other call may get it
                    self._done_with(worker, quick)
                    raise await self._fail(worker, stop, timeout) from None
                reply = answer  # its answer came in just then
            except Exception as exc:  # not expected: the worker's state is unknown, drop it
                _collect(worker, output)
                self._kill(worker)
                self._done_with(worker, quick)
                self._replace()
                raise ToolFailure(
                    "WorkerCrashed", f"python worker channel failed: {type(exc).__name__}: {exc}"
                ) from exc
            except BaseException:  # the caller was cancelled: stop the work, then propagate
                if not self._withdraw(worker, call, loop) and call.answer() is None:
                    self._kill(worker)
                    self._replace()
                self._done_with(worker, quick)
                raise
            break
        self._done_with(worker, quick)
        status = reply[0] if reply else -1
        if status not in (OK, ERR) or len(reply) < 1 + OUT.size:
            raise ToolFailure("WorkerCrashed", f"python worker sent an unexpected frame (status {status})")
        size, kept_n, tail_n, micros = OUT.unpack_from(reply, 1)
        at = 1 + OUT.size
        if output is not None and size:  # printed nothing: nothing to mask or store
            kept = reply[at : at + kept_n]
            tail = reply[at + kept_n : at + kept_n + tail_n] if tail_n else kept[-TAIL:]
            output.captured = Captured(size=size, kept=kept, tail=tail)
        self._learn(code, micros)
        body = memoryview(reply)[at + kept_n + tail_n :]
        if status == OK:
            return bytes(body)
        err = orjson.loads(body)
        raise ToolFailure(str(err.get("type")), str(err.get("message")), traceback=err.get("traceback"))

    # --- quick code: calls that may wait behind others on one worker -------------------

    def _is_quick(self, code: str) -> bool:
        took = self._speed.get(code)
        return took is not None and took < QUICK_CALL

    def _learn(self, code: str, micros: int) -> None:
        """Remember how long `code` takes (a moving average of what its worker measured)."""
        took = micros / 1e6
        speed = self._speed
        before = speed.get(code)
        if before is None and len(speed) >= _SPEED_KEPT:
            speed.clear()  # bounded: many different snippets are rare, and relearnt in one call each
        speed[code] = took if before is None or before == float("inf") else before * 0.8 + took * 0.2

    # --- internals --------------------------------------------------------------------

    def _spawn(self) -> WorkerProcess:
        worker = WorkerProcess(self._python, self._cache_size, self.environment, self._run_as, self._cwd)
        if self._memory:
            try:
                # the kernel's bound, not the worker's own: user code cannot raise it (hard = soft)
                resource.prlimit(worker.pid, resource.RLIMIT_AS, (self._memory, self._memory))
            except OSError:  # gone already: the pool sees it die
                pass
        worker.handlers = (functools.partial(self._on_data, worker), functools.partial(self._on_exit, worker))
        self._workers.add(worker)
        return worker

    def _deliver(self, worker: WorkerProcess) -> None:
        """Hand each complete reply in the buffer to its call, in order (a READY frame
        read before anyone waits for it stays in the buffer)."""
        calls = worker.calls
        while calls:
            frame = worker.take()
            if frame is None:
                return
            call = calls.popleft()
            if call.abandoned:
                continue  # its caller took it back: the reply (or SKIPPED) is dropped
            if call.fut.done():
                call.late = frame  # its caller stopped waiting just now: it may still use it
            elif frame[:1] == _SKIPPED:
                call.fut.set_exception(Stop("crash"))  # never asked to skip it: not expected
            else:
                call.fut.set_result(frame)

    def _on_data(self, worker: WorkerProcess) -> None:
        """The worker's socket is readable: replies, its READY frame, or its end."""
        try:
            eof = worker.fill()
        except OSError:
            eof = True
        self._deliver(worker)
        if eof:
            worker.unwatch()  # an EOF stays readable
            self._gone(worker)

    def _on_exit(self, worker: WorkerProcess) -> None:
        """The worker's process has exited (its pidfd is readable)."""
        try:
            worker.fill()  # a reply written just before dying still counts
        except OSError:
            pass
        self._deliver(worker)
        worker.unwatch()  # an exited pidfd stays readable
        self._gone(worker)

    def _gone(self, worker: WorkerProcess) -> None:
        """The worker ended: the call it was running failed (crash), those it never
        started go to another worker; one that died idle is reaped and replaced."""
        if not worker.dead:
            self._kill(worker)  # the calls it had fail with it (`_fail_calls`)
            self._replace()

    def _withdraw(self, worker: WorkerProcess, call: Call, loop: asyncio.AbstractEventLoop) -> bool:
        """Take back `call`, if its worker has not started it: True when the worker will
        skip it (answered ``SKIPPED``, dropped), False when it may be running (or was
        answered). The SKIP goes out first, then every reply sent so far is read: if an
        earlier call is still unanswered then, the worker reads the SKIP before it
        starts this one."""
        if worker.dead or not worker.calls or worker.calls[0] is call or call not in worker.calls:
            return False
        written = worker.skip(loop, call)
        self._on_data(worker)
        if call not in worker.calls or worker.calls[0] is call:
            return False
        # `written` False: the SKIP waits behind a request the socket did not take yet
        # (a full socket); the call may then run, its answer dropped
        del written
        call.abandoned = True
        return True

    def _replace(self) -> None:
        """Start a replacement for a killed worker (so the next call finds one warm)."""
        if self._closed or len(self._workers) >= self.size:
            return
        try:
            worker = self._spawn()
        except Exception:
            return
        self._release(worker)

    def _done_with(self, worker: WorkerProcess, quick: bool) -> None:
        """A call is done with `worker`: free once no call holds it, else open to a
        quick call waiting."""
        worker.held -= 1
        if not quick:
            worker.slow -= 1
        if worker.held > 0:
            self._offer(worker)
            return
        worker.held = worker.slow = 0
        if worker.dead:  # killed while calls held it: its ends are closed once the last lets go
            worker.loop = None
            worker.release_fds()
        else:
            self._release(worker)

    def _release(self, worker: WorkerProcess) -> None:
        """`worker` is held by no call: to the first caller waiting, else idle."""
        worker.loop = None
        if self._closed or worker.dead:
            self._kill(worker)
            return
        while self._waiters:
            f, quick = self._waiters.popleft()
            if not f.done() and not f.get_loop().is_closed():
                self._hand(worker, f, quick)
                if quick:
                    self._offer(worker)  # and the quick calls behind it, as many as fit
                return
        self._idle.append(worker)

    def _offer(self, worker: WorkerProcess) -> None:
        """`worker` is busy with quick calls only: to the quick calls first in line, as
        many as it has room for."""
        waiters = self._waiters
        while waiters and not self._closed and self._queueable(worker):
            f, quick = waiters[0]
            if f.done():
                waiters.popleft()
                continue
            if not quick or f.get_loop() is not worker.loop:
                return  # first in line and not quick: the worker drains for it (no starving it)
            waiters.popleft()
            self._hand(worker, f, quick)

    def _hand(self, worker: WorkerProcess, f: asyncio.Future[WorkerProcess], quick: bool) -> None:
        worker.held += 1
        if not quick:
            worker.slow += 1
        worker.loop = f.get_loop()
        f.set_result(worker)

    @staticmethod
    def _queueable(worker: WorkerProcess) -> bool:
        """A quick call may be sent to `worker` behind the calls it has."""
        return worker.ready and not worker.dead and worker.slow == 0 and worker.held < QUEUE_DEPTH

    def _queue_on(self, loop: asyncio.AbstractEventLoop) -> WorkerProcess | None:
        """The busy worker a quick call may be queued on: only quick calls there, room
        left; the one with the fewest calls."""
        best: WorkerProcess | None = None
        for worker in self._workers:
            if worker.held and worker.loop is loop and self._queueable(worker):
                if best is None or worker.held < best.held:
                    best = worker
        return best

    def _reclaim_stuck(self) -> bool:
        """Workers held by calls whose event loop is gone are killed; True if any."""
        stuck = [worker for worker in self._workers if worker.loop is not None and worker.loop.is_closed()]
        for worker in stuck:
            worker.calls.clear()
            self._kill(worker)
        return bool(stuck)

    def _grab(self, loop: asyncio.AbstractEventLoop, quick: bool) -> WorkerProcess | None:
        """A worker for one call now, held for it (`_done_with` lets it go): an idle one,
        for quick code a busy one with only quick calls (when nobody waits before it), a
        new one; None when the call must wait for one. It may not have booted yet."""
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
            if worker is None and quick and not self._waiters:  # nobody in line before it
                worker = self._queue_on(loop)
            if worker is None:
                if len(self._workers) >= self.size and self._reclaim_stuck():
                    continue
                if len(self._workers) < self.size:
                    try:
                        worker = self._spawn()
                    except Exception as exc:
                        raise ToolFailure("WorkerCrashed", f"cannot start a python worker: {exc}") from None
            if worker is None:
                return None
            worker.held += 1
            if not quick:
                worker.slow += 1
            worker.loop = loop
            return worker

    async def _acquire(
        self,
        loop: asyncio.AbstractEventLoop,
        deadline: float | None,
        limit: float | None,
        cancel: asyncio.Event | None,
        quick: bool,
        worker: WorkerProcess | None,
    ) -> tuple[WorkerProcess, float | None]:
        """A booted worker for one call, held for it: `worker` (grabbed, still booting),
        else the first freed (the call waits in line for it)."""
        if worker is None:
            fut: asyncio.Future[WorkerProcess] = loop.create_future()
            entry = (fut, quick)
            self._waiters.append(entry)
            try:
                await bounded(fut, loop, deadline, cancel)
            except BaseException as exc:
                # still queued unless `_release`/`_offer` or `close` took it
                try:
                    self._waiters.remove(entry)
                except ValueError:
                    pass
                if fut.done() and not fut.cancelled() and fut.exception() is None:
                    self._done_with(fut.result(), quick)  # handed over just then: give it back
                if isinstance(exc, Stop):
                    if exc.reason == "cancel":
                        raise cancelled_failure() from None
                    raise timeout_failure(limit) from None
                raise
            worker = fut.result()  # held for us by whoever handed it over
        if not worker.ready:
            t0 = loop.time()
            try:
                await self._await_ready(worker, loop, cancel)
            except BaseException:
                if not worker.dead:
                    self._done_with(worker, quick)
                raise
            if deadline is not None:
                deadline += loop.time() - t0  # a cold boot is not the user's time
        return worker, deadline

    async def _await_ready(
        self, worker: WorkerProcess, loop: asyncio.AbstractEventLoop, cancel: asyncio.Event | None
    ) -> None:
        call = worker.expect(loop)
        try:
            frame = await bounded(call.fut, loop, loop.time() + self.start_timeout, cancel)
        except Stop as stop:
            if stop.reason == "cancel":  # the worker is fine: it goes on booting for the next call
                _forget(worker, call)
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
            _forget(worker, call)
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
        """SIGKILL the worker's process group; return a future set once it is reaped.
        The call it was running fails (crash); those it never started go to another worker."""
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
        _fail_calls(worker)
        if not worker.held:
            worker.release_fds()
        if r is not None and not r.done():
            self._reaping[r] = worker.proc
            r.add_done_callback(lambda f: self._reaping.pop(f, None))
        return r


def _follow(worker: WorkerProcess, output: OutputBox | None, quick: bool) -> LiveOutput | None:
    """Let `output`'s live parts read what the call prints from the worker's capture file
    while it runs (the parent holds the file too: no frame of the worker protocol, and
    nothing at all for a call that ends before its first part is due). Only for a call
    alone on its worker (not quick code): the file is then this call's until its reply."""
    live = None if output is None else output.live
    fd = worker.outfd
    if live is None or quick or fd is None:
        return None
    live.follow(functools.partial(_read_printed, fd))
    return live


def _read_printed(fd: int, offset: int, n: int) -> bytes:
    return os.pread(fd, n, offset)


def _forget(worker: WorkerProcess, call: Call) -> None:
    """Stop waiting for `call` (a READY nobody waits for stays in the buffer for the next)."""
    try:
        worker.calls.remove(call)
    except ValueError:
        pass


def _fail_calls(worker: WorkerProcess) -> None:
    """`worker` is gone: its first call unanswered was running (crash); the worker never
    started the others (it runs them in order), so they go to another worker."""
    calls, worker.calls = worker.calls, deque()
    for i, call in enumerate(calls):
        if not call.abandoned and not call.fut.done():
            call.fut.set_exception(Stop("crash" if i == 0 else "requeue"))


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
