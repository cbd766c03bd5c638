"""One python worker process seen from the pool: its process, socket and pidfd, the
frames read from it, the calls sent to it and not answered yet (in order: the worker
answers in order), sending without ever blocking the loop, and its reaping.

A worker is launched with `subprocess` rather than `multiprocessing`'s spawn context
because spawn re-runs the parent's ``__main__`` module in every worker: slow, full of
side effects, and fatal for a script without an ``if __name__ == "__main__"`` guard.
It is a fresh interpreter (spawn semantics, never a ``fork`` of the asyncio parent), in
its own session/process group, gets the parent's ``sys.path`` and only the environment
the pool gives it (actors/tools/environment.py), and runs as the user steps run as
(actors/runtime/children.py), in their directory when that is another user. The parent waits with
``loop.add_reader`` on the socket and on a pidfd of the process (Linux): the loop is
never blocked, and a worker that dies (``os._exit``, segfault, OOM kill) is noticed at
once.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import socket
import subprocess
import sys
from collections import deque
from collections.abc import Callable
from typing import Any

import orjson

from actors.runtime.children import RunAs
from actors.tools.capture import capture_file
from actors.tools.failures import CancelSignal
from actors.tools.pyworker import BOOT, HDR, RECV, SEQ, SKIP

__all__ = ["Bounds", "Call", "Stop", "WorkerProcess", "bounded", "describe_end", "reap", "wait_reaped"]


class Stop(Exception):
    """Internal: why waiting on a worker ended early."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        # "timeout" | "cancel" | "crash" | "requeue" (the worker is gone but never started
        # this call: run it on another)
        self.reason = reason


class Call:
    """One request sent to a worker (or its READY, awaited): the future its reply sets,
    its number on that worker, and whether its caller gave up on it (the reply, or the
    worker's SKIPPED, is then dropped)."""

    __slots__ = ("abandoned", "fut", "late", "seq")

    def __init__(self, fut: asyncio.Future[bytes], seq: int) -> None:
        self.fut = fut
        self.seq = seq
        self.abandoned = False
        self.late: bytes | None = None  # its reply, come after its caller stopped waiting

    def answer(self) -> bytes | None:
        """Its reply, if it came (in time, or just after its timeout or cancel)."""
        if self.late is not None:
            return self.late
        fut = self.fut
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            return fut.result()
        return None


class WorkerProcess:
    """One worker: its process, the parent's end of its socket, its pidfd, what was read."""

    __slots__ = (
        "buf",
        "calls",
        "dead",
        "exitfd",
        "flushing",
        "handlers",
        "held",
        "loop",
        "next_seq",
        "outbuf",
        "outfd",
        "pid",
        "proc",
        "rbuf",
        "ready",
        "reaped",
        "slow",
        "sock",
        "watched",
        "writing",
    )

    def __init__(
        self,
        python: str,
        cache_size: int,
        environment: dict[str, str],
        run_as: RunAs | None = None,
        cwd: str | None = None,
    ) -> None:
        """`run_as`: the user the worker runs as (None: this process's); `cwd`: its
        working directory (None: this process's)."""
        parent_sock, child_sock = socket.socketpair()
        # the worker's stdout and stderr: what the user's code prints is captured per
        # call (actors/tools/capture.py), never written to this process's own streams
        outfd = capture_file()
        # `''` on sys.path is the working directory: the pod's, not the one the worker is given
        path = [p or os.getcwd() for p in sys.path] if cwd is not None else sys.path
        try:
            fd = child_sock.fileno()
            proc = subprocess.Popen(
                [python, "-c", BOOT, orjson.dumps(path).decode(), str(fd), str(os.getpid()), str(cache_size)],
                stdin=subprocess.DEVNULL,
                stdout=outfd,
                stderr=outfd,
                pass_fds=(fd,),
                close_fds=True,
                env=environment,  # the clean environment (actors/tools/environment.py), never the pod's
                cwd=cwd,
                start_new_session=True,  # own process group: a kill takes the user's subprocesses too
                **(run_as.popen_options() if run_as is not None else {}),
            )
        except BaseException:
            parent_sock.close()
            os.close(outfd)
            raise
        finally:
            child_sock.close()
        parent_sock.setblocking(False)
        self.proc = proc
        self.sock = parent_sock
        self.outfd: int | None = outfd
        self.pid: int = proc.pid
        # readable once the process has exited (no pidfd: the socket's EOF tells us)
        self.exitfd: int | None = None
        if hasattr(os, "pidfd_open"):
            try:
                self.exitfd = os.pidfd_open(proc.pid)
            except OSError:
                pass
        self.ready = False
        self.buf = bytearray()
        self.rbuf: bytearray | None = None
        self.loop: asyncio.AbstractEventLoop | None = None  # set while calls hold it
        self.held = 0  # calls of the pool holding it (acquired and not released)
        self.slow = 0  # of those, calls of code not known to be quick (nothing is queued behind them)
        self.calls: deque[Call] = deque()  # sent and not answered yet, in order
        self.next_seq = 0  # the number the worker gives the next request
        self.outbuf = bytearray()  # requests not written yet: this turn's, or what the socket did not take
        self.flushing = False  # a `flush` is scheduled for the end of this turn
        self.writing = False  # the socket is full: the rest goes out when it is writable
        self.dead = False
        self.reaped: asyncio.Future[int | None] | None = None
        # the socket and the pidfd stay registered with the loop that last used the
        # worker (`watched`), for its whole life, not per call: `handlers` (data, exit)
        # resolve `calls` in order, or notice a worker dying idle
        self.watched: asyncio.AbstractEventLoop | None = None
        self.handlers: tuple[Callable[[], None], Callable[[], None]] | None = None

    def watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Register the socket and the pidfd with `loop` (moved from another loop)."""
        if self.watched is loop:
            return
        self.unwatch()
        assert self.handlers is not None
        on_data, on_exit = self.handlers
        loop.add_reader(self.sock.fileno(), on_data)
        if self.exitfd is not None:
            loop.add_reader(self.exitfd, on_exit)
        self.watched = loop

    def unwatch(self) -> None:
        loop, self.watched = self.watched, None
        if loop is None or loop.is_closed():
            return  # a closed loop's registrations are gone with it
        loop.remove_reader(self.sock.fileno())
        if self.writing:
            self.writing = False
            loop.remove_writer(self.sock.fileno())
        if self.exitfd is not None:
            loop.remove_reader(self.exitfd)

    def release_fds(self) -> None:
        """Close the parent's ends (only when no call is using them)."""
        self.unwatch()
        _close_quietly(self.sock)
        if self.outfd is not None:
            os.close(self.outfd)
            self.outfd = None
        if self.exitfd is not None:
            try:
                os.close(self.exitfd)
            except OSError:
                pass
            self.exitfd = None

    def fill(self) -> bool:
        """Read what is available into the buffer (through one reused receive buffer, not
        a fresh 256 KiB one per read); True at EOF."""
        rbuf = self.rbuf
        if rbuf is None:
            rbuf = self.rbuf = bytearray(RECV)
        while True:
            try:
                n = self.sock.recv_into(rbuf)
            except (BlockingIOError, InterruptedError):
                return False
            if not n:
                return True
            self.buf += memoryview(rbuf)[:n]
            if n < RECV:
                return False

    def poll(self) -> bytes | None:
        """Read what is available; return one complete frame or None. EOFError at EOF."""
        eof = self.fill()
        frame = self.take()
        if frame is None and eof:
            raise EOFError("python worker closed its socket")
        return frame

    def take(self) -> bytes | None:
        """One complete frame from the buffer, or None."""
        buf = self.buf
        if len(buf) < 4:
            return None
        n = HDR.unpack_from(buf)[0]
        if len(buf) < 4 + n:
            return None
        frame = bytes(buf[4 : 4 + n])
        del buf[: 4 + n]
        return frame

    def expect(self, loop: asyncio.AbstractEventLoop) -> Call:
        """Wait for the worker's first frame (READY), which may have been read already."""
        self.watch(loop)
        call = Call(loop.create_future(), -1)
        self.calls.append(call)
        early = self.take()
        if early is not None:
            self.calls.popleft()
            call.fut.set_result(early)
        return call

    def submit(self, loop: asyncio.AbstractEventLoop, frame: bytes) -> Call:
        """Send a request frame (``REQ``); its reply will resolve the returned call. The
        requests submitted in one turn of the event loop go out in one write. On a worker
        killed since it was handed to the caller (a call running there was cancelled
        before the caller's turn came), the call fails at once with Stop("requeue"): it
        never started, and nothing would ever answer it."""
        if self.dead:
            gone = Call(loop.create_future(), -1)
            gone.fut.set_exception(Stop("requeue"))
            return gone
        self.watch(loop)
        call = Call(loop.create_future(), self.next_seq)
        self.next_seq += 1
        self.calls.append(call)
        self.outbuf += frame
        if not self.flushing:
            self.flushing = True
            loop.call_soon(self.flush, loop)
        return call

    def skip(self, loop: asyncio.AbstractEventLoop, call: Call) -> bool:
        """Tell the worker not to run `call` if it has not started it; True if the frame
        is in the socket now (else it waits behind earlier bytes the socket did not take)."""
        self.outbuf += HDR.pack(1 + SEQ.size) + bytes((SKIP,)) + SEQ.pack(call.seq)
        self.flush(loop)
        return not self.outbuf

    def flush(self, loop: asyncio.AbstractEventLoop) -> None:
        """Write what waits to go, in order; what the socket does not take now goes out
        when it is writable, never blocking the loop. A dead socket is noticed by the
        exit handler (the calls fail with it)."""
        self.flushing = False
        if self.writing or not self.outbuf or self.dead:
            return
        try:
            n = self.sock.send(self.outbuf)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError:
            self.outbuf.clear()
            if self.handlers is not None:
                loop.call_soon(self.handlers[1])  # as if it had exited: its last reply, or a crash
            return
        del self.outbuf[:n]
        if self.outbuf:
            self.writing = True
            loop.add_writer(self.sock.fileno(), self._on_writable, loop)

    def _on_writable(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            n = self.sock.send(self.outbuf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            n = len(self.outbuf)  # the exit handler fails the calls
        del self.outbuf[:n]
        if not self.outbuf:
            self.writing = False
            loop.remove_writer(self.sock.fileno())


class Bounds:
    """A deadline and a cancel signal armed on one future: at the deadline, or when the
    signal is set, the future fails with Stop. Set up without a coroutine of its own, so
    a call awaits its reply future directly (one frame less on every resume)."""

    __slots__ = ("cancel", "on_cancel", "timer", "watcher")

    def __init__(
        self,
        fut: asyncio.Future[Any],
        loop: asyncio.AbstractEventLoop,
        deadline: float | None,
        cancel: asyncio.Event | None,
    ) -> None:
        self.timer: asyncio.TimerHandle | None = None
        self.watcher: asyncio.Task[Any] | None = None
        self.on_cancel: Callable[[], None] | None = None
        self.cancel = cancel
        if deadline is not None:
            self.timer = loop.call_at(deadline, _expire, fut, "timeout")
        if isinstance(cancel, CancelSignal):  # a callback, not a task per call
            if cancel.is_set():
                _expire(fut, "cancel")
            else:
                self.on_cancel = functools.partial(_expire, fut, "cancel")
                cancel.add_callback(self.on_cancel)
        elif cancel is not None:
            self.watcher = watcher = loop.create_task(cancel.wait())
            watcher.add_done_callback(lambda t: None if t.cancelled() else _expire(fut, "cancel"))

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.on_cancel is not None:
            cancel = self.cancel
            assert isinstance(cancel, CancelSignal)
            cancel.remove_callback(self.on_cancel)
        if self.watcher is not None:
            self.watcher.cancel()


def _expire(fut: asyncio.Future[Any], reason: str) -> None:
    if not fut.done():
        fut.set_exception(Stop(reason))


async def bounded(
    fut: asyncio.Future[Any], loop: asyncio.AbstractEventLoop, deadline: float | None, cancel: asyncio.Event | None
) -> Any:
    """Await `fut`; at `deadline` or when `cancel` is set it fails with Stop."""
    if fut.done():
        return fut.result()
    bounds = Bounds(fut, loop, deadline, cancel)
    try:
        return await fut
    finally:
        bounds.disarm()


def _close_quietly(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass


def describe_end(w: WorkerProcess) -> str:
    """How a dead worker ended: "exit code 1", "killed by SIGSEGV"."""
    code: int | None = None
    r = w.reaped
    if r is not None and r.done() and not r.cancelled():
        code = r.result()
    if code is None:
        code = w.proc.returncode
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def wait_reaped(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def reap(w: WorkerProcess) -> asyncio.Future[int | None] | None:
    """Reap `w`'s process once it has exited, without blocking the loop. Watches a dup
    of its pidfd, because a running call may have the pidfd itself registered."""
    proc = w.proc
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        wait_reaped(proc, 5.0)
        return None
    fut: asyncio.Future[int | None] = loop.create_future()
    if proc.returncode is not None:
        fut.set_result(proc.returncode)
        return fut
    if w.exitfd is None:
        return asyncio.ensure_future(loop.run_in_executor(None, wait_reaped, proc, 5.0))
    fd = os.dup(w.exitfd)

    def done() -> None:
        loop.remove_reader(fd)
        os.close(fd)
        code = wait_reaped(proc, 1.0)
        if not fut.done():
            fut.set_result(code)

    loop.add_reader(fd, done)
    return fut
