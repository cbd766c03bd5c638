"""What a running pod is waiting on: every asyncio task with the chain of coroutines it
is suspended in, down to the future at the bottom. `kill -USR1 <pid>` writes it to the
pod's stderr (`install`), the way a JVM answers SIGQUIT, so a pod that holds work and
does nothing can be asked why without stopping it.

`asyncio.Task.get_stack` gives only the outermost frame of a suspended coroutine; the
chain is followed here through `cr_await` (coroutines), `ag_await` (async generators)
and `gi_yieldfrom` (generator-based awaitables)."""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any, TextIO

__all__ = ["describe_tasks", "install"]

_DEPTH = 40  # awaits followed per task: a chain deeper than this is cut, said so


def _awaiting(step: Any) -> tuple[Any, Any]:
    """(frame, what it awaits) of one link of an await chain."""
    for frame_attr, await_attr in (("cr_frame", "cr_await"), ("ag_frame", "ag_await"), ("gi_frame", "gi_yieldfrom")):
        if hasattr(step, frame_attr):
            return getattr(step, frame_attr), getattr(step, await_attr, None)
    return None, None


def describe_task(task: asyncio.Task[Any]) -> list[str]:
    """One task: its name, then each coroutine it is suspended in (file:line function),
    then the object at the bottom of the chain (a future, usually)."""
    lines = [f"task {task.get_name()!r}{' (done)' if task.done() else ''}"]
    step: Any = task.get_coro()
    for _ in range(_DEPTH):
        frame, awaited = _awaiting(step)
        if frame is None:
            # a future's iterator says nothing: the task knows the future it waits for
            waited = getattr(task, "_fut_waiter", None)
            lines.append(f"    waiting on {(waited if waited is not None else step)!r:.300}")
            return lines
        code = frame.f_code
        lines.append(f"    {code.co_filename}:{frame.f_lineno} {code.co_name}")
        if awaited is None:
            return lines
        step = awaited
    lines.append("    ... (deeper)")
    return lines


def describe_tasks(loop: asyncio.AbstractEventLoop | None = None) -> str:
    """Every task of `loop` (default: the running one), longest chains first."""
    tasks = asyncio.all_tasks(loop)
    described = sorted((describe_task(t) for t in tasks), key=len, reverse=True)
    return "\n".join([f"{len(tasks)} asyncio tasks"] + [ln for d in described for ln in d])


def install(out: TextIO | None = None, sig: int = signal.SIGUSR1) -> None:
    """On `sig`, write `describe_tasks()` to `out` (default: stderr). Needs a running loop."""
    loop = asyncio.get_running_loop()

    def dump() -> None:
        stream = out if out is not None else sys.stderr
        try:
            stream.write(describe_tasks(loop) + "\n")
            stream.flush()
        except Exception as e:  # a dump must never take the pod down
            print(f"task dump failed: {e!r}", file=sys.stderr, flush=True)

    loop.add_signal_handler(sig, dump)
