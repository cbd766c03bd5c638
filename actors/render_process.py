"""Rendering templates in a process of their own, for folds moved off the event loop.

A fold whose templates need more than their inline slice runs on a worker thread
(actors/hosting.py). Rendering on that thread would still hold the interpreter lock
the event loop needs: measured (bench/template_budget.py), every other execution's
steps then take 1.4-2x as long, even with the render yielding often. So each fold
thread sends its renders to a render process of its own and waits on the pipe (not
holding the lock) for the answer. The process renders with the same code and the same
counted budget, so the outcome is what an inline render would give; only the few
actors that exceeded their slice pay the round trip (about a millisecond, plus the
scope's size). A pod that stops kills the processes, which ends a render at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from actors.playbook.templates import (
    INLINE_TEMPLATE_OPS,
    RenderHalted,
    TemplateError,
    TemplateLimit,
    call_with_slice,
    names_read,
    off_the_loop,
    render_value,
    template_limits,
)
from actors.wire import Limits

T = TypeVar("T")
_context = multiprocessing.get_context("spawn")  # no fork of a process running threads and an event loop


def _serve(conn: Connection) -> None:
    """The render process: (value, scope, where, limits) in, (True, value) or
    (False, (kind, message, where, limit)) out, until the pipe closes. At the lowest
    CPU priority: on a busy node, a runaway template gets what the pod's other work
    leaves, not half of it."""
    with contextlib.suppress(OSError):
        os.nice(19)
    while True:
        try:
            value, scope, where, limits = conn.recv()
        except EOFError:
            return
        try:
            with template_limits(limits):
                out: tuple[bool, Any] = (True, render_value(value, scope, where=where))
        except TemplateError as e:
            out = (False, (e.kind, e.message, e.where, getattr(e, "limit", "")))
        conn.send(out)


class RenderProcess:
    """One render process, used by one thread at a time."""

    def __init__(self) -> None:
        self.conn, child = _context.Pipe()
        self.process = _context.Process(target=_serve, args=(child,), daemon=True, name="actors-render")
        self.process.start()
        child.close()

    def render(self, value: Any, scope: Mapping[str, Any], where: str, limits: Limits) -> Any:
        # only the names the templates read travel (an execution's scope holds every
        # step's result); a template that reads an unknown name fails the same way there
        wanted = names_read(value)
        try:
            self.conn.send((value, {k: v for k, v in scope.items() if k in wanted}, where, limits))
            ok, payload = self.conn.recv()
        except (EOFError, OSError):
            # killed: the pod stops (halt), or the process died (out of memory): either
            # way not the template's outcome, so nothing is decided from it
            raise RenderHalted from None
        if ok:
            return payload
        kind, message, where_, limit = payload
        if kind == TemplateLimit.kind:
            raise TemplateLimit(message, limit=limit, where=where_)
        raise TemplateError(message, where=where_)

    def close(self) -> None:
        self.process.kill()
        self.conn.close()


class RenderProcesses:
    """A render process for each thread that asks (the host's fold threads), started on
    first use; `close` kills them all."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._all: list[RenderProcess] = []
        self._lock = threading.Lock()
        self.closed = False

    def for_this_thread(self) -> RenderProcess:
        proc: RenderProcess | None = getattr(self._local, "proc", None)
        if proc is None or not proc.process.is_alive():
            if self.closed:
                raise RenderHalted
            proc = RenderProcess()
            with self._lock:
                self._all.append(proc)
            self._local.proc = proc
        return proc

    def render(self, value: Any, scope: Mapping[str, Any], where: str, limits: Limits) -> Any:
        return self.for_this_thread().render(value, scope, where, limits)

    def close(self) -> None:
        self.closed = True
        with self._lock:
            procs, self._all = self._all, []
        for proc in procs:
            proc.close()


class OffLoop:
    """Where pure work that renders templates runs: inline, with a slice of
    INLINE_TEMPLATE_OPS operations (past it: SliceExhausted), or off the event loop, on
    one of `threads` threads of its own (not the loop's default executor, which lends
    its threads to DNS look-ups and the like) whose renders go to render processes.
    `close` ends what still runs: a render process is killed, a thread rendering
    itself stops at its next yield."""

    def __init__(self, *, threads: int, name: str) -> None:
        self._threads, self._name = threads, name
        self._pool: ThreadPoolExecutor | None = None
        self._halt = threading.Event()
        self._renders = RenderProcesses()

    @staticmethod
    def inline(fn: Callable[[], T]) -> T:
        return call_with_slice(INLINE_TEMPLATE_OPS, fn)

    async def off_loop(self, fn: Callable[[], T]) -> T:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self._threads, thread_name_prefix=self._name)
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._run, fn)

    def _run(self, fn: Callable[[], T]) -> T:
        with off_the_loop(self._halt, remote=self._renders.render):
            return fn()

    def close(self) -> None:
        self._halt.set()
        self._renders.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
