"""Calls of quick code queued on a busy python worker (actors/tools/pypool.py): each still
gets its own result, output, timeout and cancel; a queued call taken back never runs; a
worker killed or crashed under a call hands the calls it never started to another."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio

from actors.tools.capture import OutputBox
from actors.tools.failures import CancelSignal, ToolFailure
from actors.tools.pypool import QUEUE_DEPTH, PythonPool
from tests.conftest import wait_for

pytestmark = [pytest.mark.timeout(60)]

# one snippet for every call: its first run teaches the pool it is quick; the args then
# make one call slow, crash or print, the others quick
CODE = """
import os, time

def main(tag, path, wait=0.0, crash=False, say=None):
    if say is not None:
        print(say)
    if crash:
        os._exit(3)
    deadline = time.monotonic() + wait
    while wait and time.monotonic() < deadline and not os.path.exists(path + ".go"):
        time.sleep(0.005)
    with open(path, "a") as f:
        f.write(tag + "\\n")
    return tag
"""


@pytest_asyncio.fixture
async def pool() -> AsyncIterator[PythonPool]:
    p = PythonPool(size=1)
    await p.start()
    try:
        yield p
    finally:
        await p.close()


async def _learn(pool: PythonPool, path: Path) -> None:
    assert await pool.run(CODE, {"tag": "warm", "path": str(path)}) == "warm"
    assert await pool.run(CODE, {"tag": "warm", "path": str(path)}) == "warm"


def _ran(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line != "warm"]


async def _started(path: Path, tag: str) -> None:
    """Wait until the slow call has begun (its worker is busy): a file another process
    writes has no event to await."""
    marker = str(path) + f".{tag}"

    async def there() -> bool:
        return _exists(marker)

    await wait_for(there)


def _exists(name: str) -> bool:
    return os.path.exists(name)


def _let_go(path: Path) -> None:
    """Let the slow call finish."""
    os.close(os.open(str(path) + ".go", os.O_CREAT | os.O_WRONLY))


SLOW = CODE.replace("    deadline =", "    open(path + '.' + tag, 'w').close()\n    deadline =")


@pytest.mark.asyncio
async def test_quick_calls_queued_on_one_worker_each_get_their_result_and_output(
    pool: PythonPool, tmp_path: Path
) -> None:
    path = tmp_path / "log"
    await _learn(pool, path)
    boxes = [OutputBox(1 << 20) for _ in range(3 * QUEUE_DEPTH)]
    results = await asyncio.gather(
        *(
            pool.run(CODE, {"tag": f"t{i}", "path": str(path), "say": f"call {i} says hi"}, output=box)
            for i, box in enumerate(boxes)
        )
    )
    assert results == [f"t{i}" for i in range(len(boxes))]
    for i, box in enumerate(boxes):
        assert box.captured is not None and box.captured.kept == f"call {i} says hi\n".encode()
    assert sorted(_ran(path)) == sorted(f"t{i}" for i in range(len(boxes)))  # each ran once


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["timeout", "cancel"])
async def test_a_queued_call_taken_back_never_runs_and_the_running_one_is_not_killed(
    pool: PythonPool, tmp_path: Path, how: str
) -> None:
    path = tmp_path / "log"
    await _learn_slow(pool, path)
    (pid,) = pool.pids()
    slow = asyncio.create_task(pool.run(SLOW, {"tag": "slow", "path": str(path), "wait": 30}))
    await _started(path, "slow")
    cancel = CancelSignal()
    queued = asyncio.create_task(
        pool.run(SLOW, {"tag": "queued", "path": str(path)}, timeout=0.2 if how == "timeout" else None, cancel=cancel)
    )
    if how == "cancel":
        await asyncio.sleep(0.1)
        cancel.set()
    with pytest.raises(ToolFailure) as caught:
        await queued
    assert caught.value.type == ("Timeout" if how == "timeout" else "Cancelled")
    _let_go(path)
    assert await slow == "slow"
    assert pool.pids() == [pid]  # the worker was not killed for the queued call
    assert await pool.run(SLOW, {"tag": "after", "path": str(path)}) == "after"
    assert _ran(path) == ["slow", "after"]  # the queued call never ran


async def _learn_slow(pool: PythonPool, path: Path) -> None:
    for _ in range(2):
        assert await pool.run(SLOW, {"tag": "warm", "path": str(path)}) == "warm"


@pytest.mark.asyncio
async def test_a_call_killed_on_timeout_hands_the_queued_ones_to_a_new_worker(pool: PythonPool, tmp_path: Path) -> None:
    path = tmp_path / "log"
    await _learn_slow(pool, path)
    (pid,) = pool.pids()
    slow = asyncio.create_task(pool.run(SLOW, {"tag": "slow", "path": str(path), "wait": 30}, timeout=1.0))
    await _started(path, "slow")
    queued = [asyncio.create_task(pool.run(SLOW, {"tag": f"q{i}", "path": str(path)})) for i in range(3)]
    with pytest.raises(ToolFailure) as caught:
        await slow
    assert caught.value.type == "Timeout"
    assert await asyncio.gather(*queued) == ["q0", "q1", "q2"]
    assert pool.pids() != [pid]
    assert sorted(_ran(path)) == ["q0", "q1", "q2"]  # each queued call ran once, the killed one never wrote


@pytest.mark.asyncio
async def test_a_crash_fails_only_the_call_that_crashed(pool: PythonPool, tmp_path: Path) -> None:
    path = tmp_path / "log"
    await _learn(pool, path)
    calls = [pool.run(CODE, {"tag": f"c{i}", "path": str(path), "crash": i == 2}) for i in range(QUEUE_DEPTH)]
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    crashed = outcomes[2]
    assert isinstance(crashed, ToolFailure) and crashed.type == "WorkerCrashed"
    assert [o for i, o in enumerate(outcomes) if i != 2] == [f"c{i}" for i in range(QUEUE_DEPTH) if i != 2]
    assert sorted(_ran(path)) == sorted(f"c{i}" for i in range(QUEUE_DEPTH) if i != 2)


@pytest.mark.asyncio
async def test_a_call_of_other_code_is_not_starved_by_a_stream_of_quick_ones(pool: PythonPool, tmp_path: Path) -> None:
    path = tmp_path / "log"
    await _learn(pool, path)
    done: list[str] = []
    stop = asyncio.Event()

    async def stream(n: int) -> None:
        i = 0
        while not stop.is_set() and i < 2000:
            i += 1
            done.append(await pool.run(CODE, {"tag": f"s{n}.{i}", "path": str(path)}))

    streams = [asyncio.create_task(stream(n)) for n in range(2 * QUEUE_DEPTH)]
    await wait_for(_at_least(done, 50))
    before = len(done)
    assert await pool.run("def main():\n    return 'other'\n", {}) == "other"
    after = len(done)
    stop.set()
    await asyncio.gather(*streams)
    # it waited for the calls already in line, not for the stream to end
    assert after - before <= 4 * QUEUE_DEPTH, (before, after)


def _at_least(items: list[str], n: int) -> Callable[[], Awaitable[bool]]:
    async def enough() -> bool:
        return len(items) >= n

    return enough


@pytest.mark.asyncio
async def test_a_worker_killed_just_after_it_was_handed_to_a_waiting_call_does_not_strand_that_call(
    pool: PythonPool, tmp_path: Path
) -> None:
    """The worker is handed to a call waiting in line (a queued call taken back made
    room), and, before that call gets to send its request, the call running there is
    cancelled, which kills the worker. The waiting call must run on another worker: it
    has no timeout, so a request sent to the dead one would wait for ever (its command
    held and kept alive by the tool actor, its execution stuck)."""
    path = tmp_path / "log"
    await _learn_slow(pool, path)
    stop_running, take_back = CancelSignal(), CancelSignal()
    running = asyncio.create_task(
        pool.run(SLOW, {"tag": "running", "path": str(path), "wait": 30}, cancel=stop_running)
    )
    await _started(path, "running")
    queued = [
        asyncio.create_task(pool.run(SLOW, {"tag": f"q{i}", "path": str(path)}, cancel=take_back if i == 0 else None))
        for i in range(QUEUE_DEPTH - 1)  # the worker is full: the next call waits in line
    ]
    waiting = asyncio.create_task(pool.run(SLOW, {"tag": "waiting", "path": str(path)}))
    await wait_for(_in_line(pool))
    take_back.set()  # q0 taken back: its place goes to `waiting`...
    stop_running.set()  # ...and the worker is killed before `waiting` sends its request
    with pytest.raises(ToolFailure) as caught:
        await running
    assert caught.value.type == "Cancelled"
    assert await asyncio.wait_for(waiting, 20) == "waiting"
    outcomes = await asyncio.gather(*queued, return_exceptions=True)
    assert isinstance(outcomes[0], ToolFailure) and outcomes[0].type == "Cancelled"
    assert outcomes[1:] == [f"q{i}" for i in range(1, QUEUE_DEPTH - 1)]


def _in_line(pool: PythonPool) -> Callable[[], Awaitable[bool]]:
    async def waiting() -> bool:
        return bool(pool._waiters)

    return waiting
