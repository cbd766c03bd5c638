"""A stop that cancels a task ends it even when the task swallowed the first cancel
(what Python 3.11's asyncio.wait_for can do inside nats-py's requests)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from actors.cli import interrupt
from actors.runtime.stopping import cancel_and_wait

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]


async def test_a_task_that_swallows_a_cancel_is_cancelled_again_until_it_ends() -> None:
    swallowed = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            swallowed.set()  # as wait_for does when its result came in the same turn
        await asyncio.sleep(3600)

    async def failing() -> None:
        raise RuntimeError("failed before the stop")

    task, failed = asyncio.create_task(stubborn()), asyncio.create_task(failing())
    await asyncio.sleep(0)
    await cancel_and_wait([task, None, failed])
    assert swallowed.is_set() and task.cancelled() and failed.done()


@pytest.mark.asyncio
@pytest.mark.timeout(20)
async def test_one_ctrl_c_ends_a_cli_command_that_swallowed_the_cancel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Python 3.11's wait_for can swallow the one cancel asyncio.run sends on Ctrl-C (a
    CLI command then ran on, or `dev` waited for another signal): the command is
    cancelled again until it ends, which it does as KeyboardInterrupt (exit 130)."""
    monkeypatch.setattr(interrupt, "CANCEL_AGAIN", 0.05)
    swallowed: list[bool] = []

    async def command() -> str:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            swallowed.append(True)  # as wait_for does when its result came in the same turn
        await asyncio.sleep(30)
        return "ran on"

    with pytest.raises(KeyboardInterrupt):
        await interrupt.interruptible(command(), take_sigint=True)
    assert swallowed == [True]


@pytest.mark.asyncio
@pytest.mark.timeout(20)
async def test_a_cli_command_that_ended_after_a_ctrl_c_is_not_cancelled_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cancels stop when the command ends: what runs after it (the CLI's exit) is left alone."""
    monkeypatch.setattr(interrupt, "CANCEL_AGAIN", 0.05)

    async def command() -> str:
        os.kill(os.getpid(), signal.SIGINT)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "stopped cleanly"  # a command may end normally on Ctrl-C
        return "ran on"

    assert await interrupt.interruptible(command(), take_sigint=True) == "stopped cleanly"
    current = asyncio.current_task()
    assert current is not None
    current.uncancel()  # the cancel the command took
    await asyncio.sleep(0.3)  # several CANCEL_AGAIN: no further cancel comes (nothing to await)


@pytest.mark.asyncio
@pytest.mark.timeout(20)
async def test_a_cli_command_run_in_a_thread_leaves_signals_alone() -> None:
    """`cli.main` in a thread (as tests/system/test_ride_out.py runs it): uvloop refuses signal
    handlers outside the main thread, and the command must run all the same."""
    import uvloop

    async def command() -> str:
        return "done"

    def in_a_thread() -> str:
        assert not interrupt.sigint_is_ours()  # decided where the loop is started: not the main thread
        return uvloop.run(interrupt.interruptible(command(), take_sigint=True))  # and refused by uvloop anyway

    assert await asyncio.to_thread(in_a_thread) == "done"
