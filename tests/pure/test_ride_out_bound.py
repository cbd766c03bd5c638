"""`ride_out` gives up within its budget (plus LAST_TRY) even when a try never ends by
itself: a write made of many requests, each with a timeout of its own, could otherwise
carry a command well past its --timeout (an `archive --to objects` the server refused
took 31 s of a 20 s timeout)."""

from __future__ import annotations

import asyncio

import pytest

from actors.natsio.transient import ride_out

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(10)]


async def test_a_try_that_never_ends_is_cancelled_past_the_budget() -> None:
    never = asyncio.Event()
    tries = 0
    cancelled = False

    async def call() -> None:
        nonlocal tries, cancelled
        tries += 1
        try:
            await never.wait()
        except asyncio.CancelledError:
            cancelled = True
            raise

    with pytest.raises(TimeoutError):
        await ride_out(call, budget=0.1)
    assert tries == 1 and cancelled


async def test_a_try_that_fails_transiently_is_asked_again_within_the_budget() -> None:
    tries = 0

    async def call() -> str:
        nonlocal tries
        tries += 1
        if tries < 3:
            raise TimeoutError("no answer")
        return "answered"

    assert await ride_out(call, budget=5.0) == "answered" and tries == 3
