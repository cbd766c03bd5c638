"""The budget of template renders: operations counted per render, and where a render
stands on this thread.

A template is user code running inside the engine, so every render has an operation
budget, `template_ops` (`wire.Limits`, fixed per execution in its start record): the
instrumented environment (actors/playbook/sandbox.py) calls `tick` for every loop
iteration and macro call, and for work the sandbox sees done in one go, one per element
it touches. The count is a pure function of template and scope, so the outcome is the
same on every replay, on any pod, however loaded: a CPU-time deadline would not be.
Exhausting it raises `TemplateLimit`.

Keeping the event loop free. Renders run inline; the engine and counter shells give
each fold a small slice of operations (`inline_slice`). A render that needs more raises
`SliceExhausted` (a BaseException, so nothing in the pure core catches it); the shell
then rebuilds that actor and folds its inputs on a worker thread (`off_the_loop`), which
hands each render to a render process (actors/runtime/render_process.py) or, without one,
renders itself and yields the interpreter every `YIELD_EVERY` operations
(bench/template_budget.py measures both).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from actors.wire.messages import Limits

T = TypeVar("T")
Remote = Callable[[Any, Mapping[str, Any], str, Limits, str], Any]
RemoteLoad = Callable[[str, str, int], Any]  # source, file, max_attempts -> Playbook
DEFAULT_LIMITS = Limits()
YIELD_EVERY = 2_000  # operations between two yields of the interpreter, off the event loop
YIELD_PAUSE = 50e-6  # seconds each yield sleeps: long enough for the waiting loop thread to take over
# operations a fold may spend rendering on the event loop (a few milliseconds) before its
# actor moves to a worker thread: almost every template takes a few dozen
INLINE_TEMPLATE_OPS = 50_000


class TemplateError(Exception):
    """A template that cannot be compiled or rendered. `where` names the field."""

    kind = "TemplateError"  # the error type a failed step records

    def __init__(self, message: str, *, where: str = "") -> None:
        super().__init__(f"{where}: {message}" if where else message)
        self.message = message
        self.where = where


class TemplateLimit(TemplateError):
    """A template went past one of its bounds; `limit` says which (`template_ops` or
    `template_output`)."""

    kind = "TemplateLimit"

    def __init__(self, message: str, *, limit: str, where: str = "") -> None:
        super().__init__(message, where=where)
        self.limit = limit


class SliceExhausted(BaseException):
    """A fold on the event loop met a template that must render in isolation (not cheap
    by construction: actors/playbook/inline.py), or its inline slice ran out: fold this
    actor's inputs off the event loop."""


class RenderHalted(BaseException):
    """A render on a worker thread was told to stop (its pod is stopping)."""


class RenderFault(BaseException):
    """A render process was killed by a bound the pod enforces (its deadline, its memory)
    or died: an outcome that is not a pure function of the log. The shell records it in
    the log (the first pod to see it) and every replay reads that record instead of
    rendering again. A BaseException: nothing in the pure core may decide from it."""

    def __init__(self, message: str, *, limit: str, where: str = "", step: str = "") -> None:
        super().__init__(message)
        self.message, self.limit, self.where, self.step = message, limit, where, step

    def describe(self) -> str:
        """The error as an execution records it: step, field, what happened, which limit."""
        at = f"step '{self.step}' field {self.where}" if self.step else f"field {self.where or '?'}"
        return f"{at}: {self.message} ({self.limit})"


# --- the budget ----------------------------------------------------------------------


class _Budget:
    """Operations used by one render, and where the next check is due: past the
    budget, past the fold's inline slice, or (off the event loop) at the next yield."""

    __slots__ = ("depth", "halt", "limits", "polite", "slice_stop", "stop", "used")

    def __init__(
        self,
        limits: Limits,
        *,
        slice_stop: int | None = None,
        polite: bool = False,
        halt: threading.Event | None = None,
    ) -> None:
        self.limits = limits
        self.halt = halt
        self.used = 0
        self.depth = 0  # macro calls in progress
        self.slice_stop = slice_stop
        self.polite = polite
        self.stop = self._next_stop()

    def _next_stop(self) -> int:
        stop = self.limits.template_ops
        if self.slice_stop is not None:
            stop = min(stop, self.slice_stop)
        if self.polite:
            stop = min(stop, self.used + YIELD_EVERY)
        return stop

    def over(self) -> None:
        if self.used > self.limits.template_ops:
            raise TemplateLimit(
                f"template took more than its budget of {self.limits.template_ops:,} operations (template_ops)",
                limit="template_ops",
            )
        if self.slice_stop is not None and self.used > self.slice_stop:
            raise SliceExhausted
        if self.halt is not None and self.halt.is_set():
            raise RenderHalted
        time.sleep(YIELD_PAUSE)  # off the event loop: let the loop's thread take the interpreter
        self.stop = self._next_stop()


class _ThreadState(threading.local):
    def __init__(self) -> None:
        self.budget = _Budget(DEFAULT_LIMITS)
        self.limits = DEFAULT_LIMITS  # what a render started now is bounded by
        self.slice_left: int | None = None  # inline operations left in this fold; None: no slice
        self.polite = False  # yield the interpreter now and then (a worker thread)
        self.halt: threading.Event | None = None  # set: a render off the loop stops at its next yield
        # renders elsewhere (actors/runtime/render_process.py): value, scope, where, limits, step -> value
        self.remote: Remote | None = None
        self.loader: RemoteLoad | None = None  # loads playbooks there too
        self.depth = 0


thread_state = _ThreadState()


def tick(n: int = 1) -> None:
    """One operation (or `n`): called by instrumented templates and the environment."""
    b = thread_state.budget
    b.used += n
    if b.used > b.stop:
        b.over()


@contextlib.contextmanager
def template_limits(limits: Limits) -> Iterator[None]:
    """Renders inside are bounded by `limits` (an execution's, from its start record)."""
    previous = thread_state.limits
    thread_state.limits = limits
    try:
        yield
    finally:
        thread_state.limits = previous


def call_with_limits(limits: Limits, fn: Callable[[], T]) -> T:
    """`fn()` with renders bounded by `limits`: `template_limits` without a context
    manager's cost, for the per-input path of the engine and the counter."""
    st = thread_state
    previous, st.limits = st.limits, limits
    try:
        return fn()
    finally:
        st.limits = previous


def call_with_slice(ops: int, fn: Callable[[], T]) -> T:
    """`fn()` with `ops` inline operations for its renders (`inline_slice`, cheaper)."""
    st = thread_state
    previous, st.slice_left = st.slice_left, ops
    try:
        return fn()
    finally:
        st.slice_left = previous


@contextlib.contextmanager
def inline_slice(ops: int) -> Iterator[None]:
    """Renders inside may take `ops` operations in all before `SliceExhausted`."""
    previous = thread_state.slice_left
    thread_state.slice_left = ops
    try:
        yield
    finally:
        thread_state.slice_left = previous


@contextlib.contextmanager
def off_the_loop(
    halt: threading.Event | None = None, remote: Remote | None = None, loader: RemoteLoad | None = None
) -> Iterator[None]:
    """For a worker thread: no slice, and a long render yields the interpreter (and
    stops with RenderHalted at a yield once `halt` is set); with `remote`, every render
    that is not cheap by construction is handed to it instead (a render process: the
    thread then waits without the lock)."""
    st = thread_state
    previous = st.polite, st.slice_left, st.halt, st.remote, st.loader
    st.polite, st.slice_left, st.halt, st.remote, st.loader = True, None, halt, remote, loader
    try:
        yield
    finally:
        st.polite, st.slice_left, st.halt, st.remote, st.loader = previous


def current_limits() -> Limits:
    """The limits renders on this thread are bounded by now (set by `template_limits`)."""
    return thread_state.limits


def begin_budget() -> _Budget | None:
    """A fresh budget for an outermost render (nested ones share it); returns the one it
    replaces, for `end_budget`."""
    st = thread_state
    st.depth += 1
    if st.depth > 1:
        return None
    outer = st.budget
    st.budget = _Budget(st.limits, slice_stop=st.slice_left, polite=st.polite, halt=st.halt)
    return outer


def end_budget(outer: _Budget | None) -> None:
    st = thread_state
    st.depth -= 1
    if outer is None:
        return
    if st.slice_left is not None:
        st.slice_left -= st.budget.used
    st.budget = outer
