"""Python tool code, run outside the event loop in a pool of worker processes.

Each worker is a fresh interpreter (``sys.executable -c ...``: spawn semantics, never a
``fork`` of the asyncio parent), started in its own session/process group, that imports
only this module and its few dependencies. It is launched with `subprocess` rather than `multiprocessing`'s
spawn context because spawn re-runs the parent's ``__main__`` module in every worker:
slow, full of side effects, and fatal for a script without an ``if __name__ ==
"__main__"`` guard. The worker gets the parent's ``sys.path`` and talks to it over a
private socketpair (not stdin/stdout, so whatever the user's code prints cannot
corrupt the protocol; its stdout/stderr are the parent's). Frames are a 4-byte
big-endian length and a payload:

- parent -> worker: JSON ``{"c": code, "a": args}`` (orjson, msgspec for integers beyond 64 bits)
- worker -> parent: one status byte, then the JSON result (``_OK``), the JSON error
  ``{"type", "message", "traceback"}`` (``_ERR``), or the worker's pid once it is
  up (``_READY``, sent once, before anything else).

A worker runs one call at a time and caches compiled code by the sha256 of its text
(LRU), so repeated calls with the same code do not recompile; the module body is run
in a fresh namespace each call, then ``main(**args)`` (an ``async def main`` is run
with `asyncio.run`). Module globals do not survive a call; imported modules do (a
worker imports a heavy library once). The parent waits with ``loop.add_reader`` on the socket and on a
pidfd of the process (Linux): the loop is never blocked, and a worker that dies
(``os._exit``, segfault, OOM kill) is noticed at once (``WorkerCrashed``) and replaced.

Timeouts and cancel: the worker's process group gets SIGKILL, the process is reaped,
a replacement is started, and ``ToolFailure(Timeout, retryable)`` / ``Cancelled`` is
raised. `close()` kills and reaps every worker. The time a cold worker takes to boot
(interpreter start and imports, ~60 ms, bounded by ``start_timeout``) is not charged to
the call's timeout; waiting for a free worker is. Cancelling the calling task kills
the worker too and lets `CancelledError` propagate.

A pool is used from one event loop at a time (any loop: it keeps no loop-bound state
between calls). Workers exit by themselves when the parent process disappears.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import hashlib
import linecache
import math
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections import OrderedDict, deque
from collections.abc import Callable
from pathlib import Path
from types import CodeType, TracebackType
from typing import Any

import orjson

from actors.jsonvalues import dumps, loads
from actors.tools.executors import CancelSignal, ToolFailure, cancelled_failure, timeout_failure

__all__ = ["PythonPool", "available_cpus", "close_default_pool", "default_pool"]

_HDR = struct.Struct("!I")
_OK, _ERR, _READY = 0, 1, 2
_RECV = 1 << 18


# ======================================================================================
# worker side
# ======================================================================================


def _watch_parent(ppid: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != ppid:
            os._exit(1)


def _send(sock: socket.socket, status: int, body: bytes) -> None:
    sock.sendall(_HDR.pack(len(body) + 1) + bytes((status,)) + body)


def _error(type_: str, message: str, tb: str | None = None) -> tuple[int, bytes]:
    return _ERR, orjson.dumps({"type": type_, "message": message, "traceback": tb})


def _str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return f"<{type(exc).__name__}>"


def _user_traceback(exc: BaseException) -> str:
    tb: TracebackType | None = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    try:
        return "".join(traceback.format_exception(type(exc), exc, tb))
    except Exception:
        return f"{type(exc).__name__}: {_str(exc)}\n"


def _compile(code: str, cache: OrderedDict[str, CodeType], cache_size: int) -> CodeType:
    key = hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest()
    co = cache.get(key)
    if co is not None:
        cache.move_to_end(key)
        return co
    filename = f"<python tool {key[:12]}>"
    co = compile(code, filename, "exec")
    # lets tracebacks show the user's source lines
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    cache[key] = co
    while len(cache) > cache_size:
        _, old = cache.popitem(last=False)
        linecache.cache.pop(old.co_filename, None)
    return co


def _execute(request: bytes, cache: OrderedDict[str, CodeType], cache_size: int) -> tuple[int, bytes]:
    try:
        msg = loads(request)
        code, args = msg["c"], msg["a"]
    except Exception as exc:
        return _error("ProtocolError", f"bad request to python worker: {_str(exc)}")
    try:
        co = _compile(code, cache, cache_size)
    except SyntaxError as exc:
        text = (exc.text or "").strip()
        where = f"line {exc.lineno}" + (f": {text}" if text else "")
        return _error("SyntaxError", f"{exc.msg} ({where})", "".join(traceback.format_exception_only(type(exc), exc)))
    except Exception as exc:
        return _error(type(exc).__name__, _str(exc), _user_traceback(exc))
    ns: dict[str, Any] = {"__name__": "__tool__", "__builtins__": builtins}
    try:
        exec(co, ns)
        main = ns.get("main")
        if not callable(main):
            return _error("ToolConfigError", "python code must define a function main(**args)")
        result = main(**args)
        if hasattr(result, "__await__"):
            import asyncio as _asyncio

            async def _wait(aw: Any) -> Any:
                return await aw

            result = _asyncio.run(_wait(result))
    except BaseException as exc:
        return _error(type(exc).__name__, _str(exc), _user_traceback(exc))
    try:
        return _OK, dumps(result)
    except Exception as exc:
        return _error("ResultNotSerialisable", f"main() returned a value that is not JSON-serialisable: {_str(exc)}")




# what a worker process runs: argv = [sys.path as JSON, socket fd, parent pid, cache size]
_BOOT = (
    "import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
    f"from {__name__} import _worker_main; "
    "_worker_main(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))"
)


def _worker_main(fd: int, ppid: int, cache_size: int) -> None:
    """Entry point of a worker process: serve requests until the socket closes."""
    sock = socket.socket(fileno=fd)
    sock.set_inheritable(False)  # the user's subprocesses must not hold our channel
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    threading.Thread(target=_watch_parent, args=(ppid,), daemon=True, name="parent-watch").start()
    sock.setblocking(True)
    cache: OrderedDict[str, CodeType] = OrderedDict()
    buf = bytearray()
    try:
        _send(sock, _READY, str(os.getpid()).encode())
        while True:
            while len(buf) < 4 or len(buf) < 4 + _HDR.unpack_from(buf)[0]:
                chunk = sock.recv(_RECV)
                if not chunk:
                    return  # the pool closed our socket: exit quietly
                buf += chunk
            n = _HDR.unpack_from(buf)[0]
            request = bytes(buf[4 : 4 + n])
            del buf[: 4 + n]
            status, body = _execute(request, cache, cache_size)
            for stream in (sys.stdout, sys.stderr):
                try:
                    if stream is not None:
                        stream.flush()
                except Exception:
                    pass
            _send(sock, status, body)
    except OSError:
        return


# ======================================================================================
# parent side
# ======================================================================================


class _Stop(Exception):
    """Internal: why waiting on a worker ended early."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason  # "timeout" | "cancel" | "crash"


class _Worker:
    __slots__ = ("active", "buf", "dead", "exitfd", "handlers", "loop", "pid", "proc", "rbuf", "ready", "reaped",
                 "sock", "waiter", "watched")

    def __init__(self, python: str, cache_size: int) -> None:
        parent_sock, child_sock = socket.socketpair()
        try:
            fd = child_sock.fileno()
            proc = subprocess.Popen(
                [python, "-c", _BOOT, orjson.dumps(sys.path).decode(), str(fd), str(os.getpid()), str(cache_size)],
                stdin=subprocess.DEVNULL,
                pass_fds=(fd,),
                close_fds=True,
                start_new_session=True,  # own process group: a kill takes the user's subprocesses too
            )
        except BaseException:
            parent_sock.close()
            raise
        finally:
            child_sock.close()
        parent_sock.setblocking(False)
        self.proc = proc
        self.sock = parent_sock
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
        self.loop: asyncio.AbstractEventLoop | None = None  # set while a call holds it
        self.active = False  # a call is exchanging frames with it
        self.dead = False
        self.reaped: asyncio.Future[int | None] | None = None
        # the socket and the pidfd stay registered with the loop that last used the
        # worker (`watched`), for its whole life, not per call: `handlers` (data, exit)
        # resolve `waiter`, the current call's future, or notice a worker dying idle
        self.watched: asyncio.AbstractEventLoop | None = None
        self.waiter: asyncio.Future[bytes] | None = None
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
        if self.exitfd is not None:
            loop.remove_reader(self.exitfd)

    def release_fds(self) -> None:
        """Close the parent's ends (only when no call is using them)."""
        self.unwatch()
        _close_quietly(self.sock)
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
            rbuf = self.rbuf = bytearray(_RECV)
        while True:
            try:
                n = self.sock.recv_into(rbuf)
            except (BlockingIOError, InterruptedError):
                return False
            if not n:
                return True
            self.buf += memoryview(rbuf)[:n]
            if n < _RECV:
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
        n = _HDR.unpack_from(buf)[0]
        if len(buf) < 4 + n:
            return None
        frame = bytes(buf[4 : 4 + n])
        del buf[: 4 + n]
        return frame


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
    ) -> None:
        """`size`: most workers at once (default: the CPUs this process may use, see
        `available_cpus`); `start_timeout`: seconds a
        worker may take to boot; `code_cache_size`: compiled snippets kept per worker;
        `python`: the interpreter to run workers with (default: ``sys.executable``)."""
        self.size = max(1, size if size is not None else available_cpus())
        self.start_timeout = start_timeout
        self._python = python or sys.executable
        self._cache_size = max(1, code_cache_size)
        self._workers: set[_Worker] = set()  # live: idle, busy or starting
        self._reaping: dict[asyncio.Future[int | None], subprocess.Popen[bytes]] = {}
        self._idle: deque[_Worker] = deque()
        self._waiters: deque[asyncio.Future[_Worker]] = deque()
        self._closed = False

    # --- introspection ----------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def pids(self) -> list[int]:
        """Pids of the live worker processes."""
        return [w.pid for w in self._workers if not w.dead]

    # --- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Start all `size` workers and wait until each is ready."""
        if self._closed:
            raise cancelled_failure("python worker pool closed")
        loop = asyncio.get_running_loop()
        ws = [w for w in self._idle if not w.ready]
        for w in ws:
            self._idle.remove(w)
        try:
            while len(self._workers) < self.size:
                ws.append(self._spawn())
            for w in ws:
                w.loop = loop
                await self._await_ready(w, loop, None)
        finally:
            for w in ws:
                if not w.dead:
                    self._release(w)

    async def close(self) -> None:
        """Stop every worker (SIGKILL to its process group) and reap them all."""
        self._closed = True
        while self._waiters:
            f = self._waiters.popleft()
            if not f.done() and not f.get_loop().is_closed():
                f.set_exception(cancelled_failure("python worker pool closed"))
        self._idle.clear()
        procs = [w.proc for w in self._workers]
        for w in list(self._workers):
            self._kill(w)
        loop = asyncio.get_running_loop()
        mine = {f for f in self._reaping if f.get_loop() is loop}
        if mine:
            await asyncio.wait(mine, timeout=5.0)
        # belt and braces: anything not reaped yet (or being reaped by a closed loop)
        for proc in procs + list(self._reaping.values()):
            if proc.returncode is None:
                _wait(proc, 1.0)

    # --- calls ------------------------------------------------------------------------

    async def run(
        self,
        code: str,
        args: dict[str, Any],
        *,
        timeout: float | None = None,
        cancel: asyncio.Event | None = None,
    ) -> Any:
        """Run `code`'s ``main(**args)`` in a worker; its result, or ToolFailure."""
        if self._closed:
            raise cancelled_failure("python worker pool closed")
        if cancel is not None and cancel.is_set():
            raise cancelled_failure()
        if timeout is not None and timeout <= 0:
            raise timeout_failure(timeout)
        try:
            payload = dumps({"c": code, "a": args})
        except TypeError as exc:
            raise ToolFailure("ArgsNotSerialisable", f"python tool args are not JSON-serialisable: {exc}") from None
        frame = _HDR.pack(len(payload)) + payload
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        w, deadline = await self._acquire(loop, deadline, timeout, cancel)
        try:
            reply = await self._exchange(w, loop, frame, deadline, cancel)
        except _Stop as stop:
            raise await self._fail(w, stop, timeout) from None
        except Exception as exc:  # not expected: the worker's state is unknown, drop it
            self._kill(w)
            self._replace()
            raise ToolFailure("WorkerCrashed", f"python worker channel failed: {type(exc).__name__}: {exc}") from exc
        except BaseException:  # the caller was cancelled: stop the work, then propagate
            self._kill(w)
            self._replace()
            raise
        self._release(w)
        status = reply[0] if reply else -1
        if status == _OK:
            return loads(memoryview(reply)[1:])
        if status == _ERR:
            err = orjson.loads(memoryview(reply)[1:])
            raise ToolFailure(str(err.get("type")), str(err.get("message")), traceback=err.get("traceback"))
        raise ToolFailure("WorkerCrashed", f"python worker sent an unexpected frame (status {status})")

    # --- internals --------------------------------------------------------------------

    def _spawn(self) -> _Worker:
        w = _Worker(self._python, self._cache_size)
        w.handlers = (functools.partial(self._on_data, w), functools.partial(self._on_exit, w))
        self._workers.add(w)
        return w

    def _on_data(self, w: _Worker) -> None:
        """The worker's socket is readable: the current call's reply, its READY frame
        (kept in the buffer if no call waits for it yet), or its end."""
        fut = w.waiter
        try:
            eof = w.fill()
        except OSError:
            eof = True
        if fut is not None and not fut.done():
            got = w.take()
            if got is not None:
                fut.set_result(got)
            elif eof:
                fut.set_exception(_Stop("crash"))
        if eof:
            w.unwatch()  # an EOF stays readable
            if fut is None:
                self._lost(w)

    def _on_exit(self, w: _Worker) -> None:
        """The worker's process has exited (its pidfd is readable)."""
        fut = w.waiter
        try:
            got = w.poll()  # a reply written just before dying still counts
        except (EOFError, OSError):
            got = None
        w.unwatch()  # an exited pidfd stays readable
        if fut is None:
            self._lost(w)
        elif not fut.done():
            if got is not None:
                fut.set_result(got)
            else:
                fut.set_exception(_Stop("crash"))

    def _lost(self, w: _Worker) -> None:
        """A worker died while idle: reap it, start its replacement."""
        if not w.dead:
            self._kill(w)
            self._replace()

    def _replace(self) -> None:
        """Start a replacement for a killed worker (so the next call finds one warm)."""
        if self._closed or len(self._workers) >= self.size:
            return
        try:
            w = self._spawn()
        except Exception:
            return
        self._release(w)

    def _release(self, w: _Worker) -> None:
        w.loop = None
        if self._closed or w.dead:
            self._kill(w)
            return
        while self._waiters:
            f = self._waiters.popleft()
            if not f.done() and not f.get_loop().is_closed():
                w.loop = f.get_loop()
                f.set_result(w)
                return
        self._idle.append(w)

    def _reclaim_stuck(self) -> bool:
        """Workers held by calls whose event loop is gone are killed; True if any."""
        stuck = [w for w in self._workers if w.loop is not None and w.loop.is_closed()]
        for w in stuck:
            w.active = False
            self._kill(w)
        return bool(stuck)

    async def _acquire(
        self, loop: asyncio.AbstractEventLoop, deadline: float | None, limit: float | None, cancel: asyncio.Event | None
    ) -> tuple[_Worker, float | None]:
        while True:
            if self._closed:
                raise cancelled_failure("python worker pool closed")
            w: _Worker | None = None
            while self._idle:
                cand = self._idle.popleft()
                if cand.dead or cand.proc.poll() is not None:
                    self._kill(cand)
                    continue
                w = cand
                break
            if w is None:
                if len(self._workers) >= self.size and self._reclaim_stuck():
                    continue
                if len(self._workers) < self.size:
                    try:
                        w = self._spawn()
                    except Exception as exc:
                        raise ToolFailure("WorkerCrashed", f"cannot start a python worker: {exc}") from None
                else:
                    fut: asyncio.Future[_Worker] = loop.create_future()
                    self._waiters.append(fut)
                    try:
                        await _bounded(fut, loop, deadline, cancel)
                    except BaseException as exc:
                        # still queued unless `_release` or `close` took it
                        try:
                            self._waiters.remove(fut)
                        except ValueError:
                            pass
                        if isinstance(exc, _Stop):
                            if exc.reason == "cancel":
                                raise cancelled_failure() from None
                            raise timeout_failure(limit) from None
                        if fut.done() and not fut.cancelled() and fut.exception() is None:
                            self._release(fut.result())
                        raise
                    w = fut.result()  # `_release` took `fut` off the queue before setting it
            w.loop = loop
            if not w.ready:
                t0 = loop.time()
                await self._await_ready(w, loop, cancel)
                if deadline is not None:
                    deadline += loop.time() - t0  # a cold boot is not the user's time
            return w, deadline

    async def _await_ready(self, w: _Worker, loop: asyncio.AbstractEventLoop, cancel: asyncio.Event | None) -> None:
        try:
            frame = await self._exchange(w, loop, None, loop.time() + self.start_timeout, cancel)
        except _Stop as stop:
            if stop.reason == "cancel":  # the worker is fine: it goes on booting for the next call
                self._release(w)
                raise cancelled_failure() from None
            reap = self._kill(w)
            if reap is not None:
                await asyncio.wait({reap}, timeout=5.0)
            what = "did not start in time" if stop.reason == "timeout" else f"died while starting ({_how(w)})"
            raise ToolFailure("WorkerCrashed", f"python worker {what}", retryable=True) from None
        except asyncio.CancelledError:
            self._release(w)
            raise
        except BaseException:
            self._kill(w)
            raise
        if not frame or frame[0] != _READY:
            self._kill(w)
            raise ToolFailure("WorkerCrashed", "python worker sent an unexpected first frame")
        w.ready = True

    async def _exchange(
        self,
        w: _Worker,
        loop: asyncio.AbstractEventLoop,
        frame: bytes | None,
        deadline: float | None,
        cancel: asyncio.Event | None,
    ) -> bytes:
        """Send `frame` (if any) and wait for the worker's next frame, never blocking the loop."""
        fut: asyncio.Future[bytes] = loop.create_future()
        sock = w.sock
        fd = sock.fileno()
        pending = memoryview(frame) if frame is not None else None

        def on_writable() -> None:
            nonlocal pending
            if fut.done() or pending is None:
                loop.remove_writer(fd)
                return
            try:
                n = sock.send(pending)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                loop.remove_writer(fd)
                fut.set_exception(_Stop("crash"))
                return
            pending = pending[n:] if n < len(pending) else None
            if pending is None:
                loop.remove_writer(fd)

        w.active = True
        w.waiter = fut
        writing = False
        try:
            w.watch(loop)
            if frame is None:  # waiting for READY, which may have been read already
                early = w.take()
                if early is not None:
                    fut.set_result(early)
            if pending is not None:
                try:
                    n = sock.send(pending)
                except (BlockingIOError, InterruptedError):
                    n = 0
                except OSError:
                    n = -1
                if n < 0:
                    if w.handlers is not None:
                        w.handlers[1]()  # as if it had exited: its last reply, or a crash
                elif n < len(pending):
                    pending = pending[n:]
                    writing = True
                    loop.add_writer(fd, on_writable)
            got: bytes = await _bounded(fut, loop, deadline, cancel)
            return got
        finally:
            w.active = False
            w.waiter = None
            if writing and not loop.is_closed():
                loop.remove_writer(fd)
            if w.dead:
                w.release_fds()

    async def _fail(self, w: _Worker, stop: _Stop, limit: float | None) -> ToolFailure:
        """Kill and reap `w`, start its replacement; the failure to raise."""
        reap = self._kill(w)
        self._replace()
        if reap is not None:
            await asyncio.wait({reap}, timeout=5.0)
        if self._closed:
            return cancelled_failure("python worker pool closed")
        if stop.reason == "timeout":
            return timeout_failure(limit)
        if stop.reason == "cancel":
            return cancelled_failure()
        return ToolFailure("WorkerCrashed", f"python worker died while running the code ({_how(w)})")

    def _kill(self, w: _Worker) -> asyncio.Future[int | None] | None:
        """SIGKILL the worker's process group; return a future set once it is reaped."""
        if w.dead:
            return w.reaped
        w.dead = True
        self._workers.discard(w)
        try:
            self._idle.remove(w)
        except ValueError:
            pass
        if w.proc.returncode is None:  # not reaped: its pid and group id are still ours
            try:
                os.killpg(w.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                w.proc.kill()
            except OSError:
                pass
        w.reaped = r = _reap(w)
        if not w.active:
            w.release_fds()
        if r is not None and not r.done():
            self._reaping[r] = w.proc
            r.add_done_callback(lambda f: self._reaping.pop(f, None))
        return r


async def _bounded(
    fut: asyncio.Future[Any], loop: asyncio.AbstractEventLoop, deadline: float | None, cancel: asyncio.Event | None
) -> Any:
    """Await `fut`; at `deadline` or when `cancel` is set it fails with _Stop."""
    if fut.done():
        return fut.result()
    timer: asyncio.TimerHandle | None = None
    watcher: asyncio.Task[Any] | None = None
    on_cancel: Callable[[], None] | None = None

    def expire(reason: str) -> None:
        if not fut.done():
            fut.set_exception(_Stop(reason))

    if deadline is not None:
        timer = loop.call_at(deadline, expire, "timeout")
    if isinstance(cancel, CancelSignal):  # a callback, not a task per call
        if cancel.is_set():
            expire("cancel")
        else:
            on_cancel = functools.partial(expire, "cancel")
            cancel.add_callback(on_cancel)
    elif cancel is not None:
        watcher = loop.create_task(cancel.wait())
        watcher.add_done_callback(lambda t: None if t.cancelled() else expire("cancel"))
    try:
        return await fut
    finally:
        if timer is not None:
            timer.cancel()
        if on_cancel is not None and isinstance(cancel, CancelSignal):
            cancel.remove_callback(on_cancel)
        if watcher is not None:
            watcher.cancel()


def _close_quietly(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass


def _how(w: _Worker) -> str:
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


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def _reap(w: _Worker) -> asyncio.Future[int | None] | None:
    """Reap `w`'s process once it has exited, without blocking the loop. Watches a dup
    of its pidfd, because a running call may have the pidfd itself registered."""
    proc = w.proc
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        _wait(proc, 5.0)
        return None
    fut: asyncio.Future[int | None] = loop.create_future()
    if proc.returncode is not None:
        fut.set_result(proc.returncode)
        return fut
    if w.exitfd is None:
        return asyncio.ensure_future(loop.run_in_executor(None, _wait, proc, 5.0))
    fd = os.dup(w.exitfd)

    def done() -> None:
        loop.remove_reader(fd)
        os.close(fd)
        code = _wait(proc, 1.0)
        if not fut.done():
            fut.set_result(code)

    loop.add_reader(fd, done)
    return fut


# ======================================================================================
# the process-wide default pool
# ======================================================================================


def available_cpus() -> int:
    """CPUs this process may use: its affinity mask, capped by its cgroup's CPU quota
    (`cpu.max`, rounded up). `os.cpu_count()` is the machine's count, which in a
    container is the node's, not the pod's limit."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = _cgroup_cpu_quota()
    if quota is not None:
        n = min(n, math.ceil(quota))
    return max(1, n)


def _cgroup_cpu_quota() -> float | None:
    """The CPU quota of this process's cgroup, in CPUs (cgroup v2 `cpu.max`, else v1
    `cpu.cfs_quota_us`); None when unlimited or unknown."""
    candidates = []
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            hier, _, path = line.partition("::")
            if hier == "0" and path:
                candidates.append(Path("/sys/fs/cgroup") / path.lstrip("/") / "cpu.max")
    except OSError:
        pass
    candidates.append(Path("/sys/fs/cgroup/cpu.max"))
    for f in candidates:
        try:
            quota, period = f.read_text().split()[:2]
        except (OSError, ValueError):
            continue
        return None if quota == "max" else int(quota) / int(period)
    try:
        quota_us = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period_us = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


_default: PythonPool | None = None
_default_pid = 0


def default_pool() -> PythonPool:
    """The process's shared pool (created lazily; recreated after close or in a child).
    Its size: `ACTORS_PYTHON_WORKERS` if set, else `available_cpus()`."""
    global _default, _default_pid
    if _default is None or _default.closed:  # a forked child starts with None (no getpid() per call)
        size = os.environ.get("ACTORS_PYTHON_WORKERS", "").strip()
        _default = PythonPool(size=int(size) if size.isdigit() and int(size) > 0 else None)
        _default_pid = os.getpid()
    return _default


def _forget_default_in_child() -> None:
    global _default
    _default = None  # the parent's workers are not ours


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_default_in_child)


async def close_default_pool() -> None:
    """Close the shared pool (its workers are killed and reaped)."""
    global _default
    pool, _default = _default, None
    if pool is not None and _default_pid == os.getpid():
        await pool.close()
