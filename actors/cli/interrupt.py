"""Ctrl-C for a CLI command, for sure.

`asyncio.run` answers the first SIGINT by cancelling the command's task once. On
Python 3.11, `asyncio.wait_for` (nats-py waits for every request with it) swallows a
cancel that arrives in the same turn of the event loop as the result it waits for
(CPython gh-86296, fixed in 3.12; actors/runtime/stopping.py meets it for tasks): the command
then carries on as if no Ctrl-C had come, and `run` followed its execution to the
end, or `dev` went on to wait for a second signal. Here a SIGINT cancels the
command's task, and again every `CANCEL_AGAIN` seconds while it runs; once it ends
cancelled, KeyboardInterrupt is raised (exit 130, as before).

Whether SIGINT is ours to take is decided before the event loop starts
(`sigint_is_ours`): `uvloop.run` and `asyncio.run` (an `asyncio.Runner`, from Python
3.11) install their own SIGINT handler, which cancels once, before our command runs, so
the handler found then is never Python's default one. (Deciding it there instead made
this handler never installed, and a Ctrl-C whose one cancel was swallowed was lost: `run`
went on to its execution's end.)

A command that runs until told to stop (`dev`, `serve`, `ui`) replaces this handler
with `stop_on_signal`'s, a stop event. A SIGINT ignored when the CLI started (a job
a non-interactive shell put in the background) stays ignored, and `cli.main` called
in another thread than the main one (tests do) leaves signals alone."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

# Seconds between cancels of a command that did not end. Long enough for the clean-up
# an interrupted command does after the first cancel (stopping the embedded actors and
# server takes well under a second), so that a cancel that was not swallowed is not
# followed by one that cuts that clean-up short.
CANCEL_AGAIN = 3.0


def sigint_is_ours() -> bool:
    """May the command take SIGINT? Asked before the event loop starts: in the main
    thread, with SIGINT still Python's default (not ignored, not someone else's)."""
    return (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    )


async def interruptible(command: Coroutine[Any, Any, T], *, take_sigint: bool) -> T:
    """Await `command`; when `take_sigint` (`sigint_is_ours()` before the loop started),
    on SIGINT cancel it (again every CANCEL_AGAIN seconds until it ends) and raise
    KeyboardInterrupt once it has ended cancelled."""
    if not take_sigint:
        return await command  # ignored, someone else's, or not the main thread: left as it is
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    interrupted = False
    again: asyncio.TimerHandle | None = None

    def cancel() -> None:
        nonlocal again
        task.cancel()
        again = loop.call_later(CANCEL_AGAIN, cancel)

    def on_sigint() -> None:
        nonlocal interrupted
        if again is not None:
            again.cancel()  # a second Ctrl-C cancels at once, then on the same rhythm
        interrupted = True
        cancel()

    try:
        loop.add_signal_handler(signal.SIGINT, on_sigint)
    except (NotImplementedError, RuntimeError, ValueError):  # a loop without signal handlers: asyncio.run's own
        return await command
    try:
        return await command
    except asyncio.CancelledError:
        if interrupted:
            raise KeyboardInterrupt from None
        raise
    finally:
        if again is not None:
            again.cancel()  # the command has ended: nothing more to cancel
        loop.remove_signal_handler(signal.SIGINT)


def stop_on_signal() -> asyncio.Event:
    """For a command that runs until told to stop (`dev`, `serve`, `ui`): an event set by
    SIGINT or SIGTERM, handlers installed now (replacing `interruptible`'s); a second
    signal cancels the command (a start-up or a stop that hangs can still be left)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()

    def on_signal() -> None:
        if stop.is_set() and task is not None:
            task.cancel()
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    return stop
