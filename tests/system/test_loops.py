"""Loops end to end: iterations are independent messages counted by the counter actor
(issue 3), and retries inside a loop apply to each iteration on its own (issue 4):
redeliveries, blobs, sinks, killed pods, a restarted counter, the progress bar. The
loop semantics are on the pure fold harness (tests/pure/test_semantics_loops.py)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from actors.client import Client
from actors.pod.roles import connect, start_roles
from actors.wire.messages import CallDone, CallError, ChunkDone, ResultBatch, loop_input_decoder
from streams.layout import Layout, ensure
from streams.server import NatsServer
from tests.conftest import System, of_type, wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]
ROOT = Path(__file__).resolve().parents[2]

HEAD = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: %s}
"""


class ResultWatch:
    """Counts iteration results as the tool actors publish them (a core NATS
    subscription on the loop logs' result subjects; a batch counts as its entries), so
    a test can await the n-th."""

    def __init__(self) -> None:
        self.count = 0
        self._waiters: list[tuple[int, asyncio.Event]] = []

    @classmethod
    async def start(cls, nc: Any, layout: Layout, eid: str) -> ResultWatch:
        w = cls()

        async def seen(msg: Any) -> None:
            inp = loop_input_decoder.decode(msg.data)
            w.count += len(inp.results) if isinstance(inp, ResultBatch) else 1
            for n, ev in w._waiters:
                if w.count >= n:
                    ev.set()

        await nc.subscribe(f"loop.{layout.partition_of(eid)}.{eid}.*.in.res.>", cb=seen)
        return w

    async def reach(self, n: int, timeout: float = 30) -> None:
        ev = asyncio.Event()
        if self.count >= n:
            return
        self._waiters.append((n, ev))
        await asyncio.wait_for(ev.wait(), timeout)


def intervals(results: list[Any]) -> list[tuple[float, float]]:
    return [(r.started_at, r.ended_at) for r in results if isinstance(r, (CallDone, CallError))]


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The largest number of spans running at one instant (an end before a start at
    the same instant: back-to-back is not overlap)."""
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda x: (x[0], x[1]))
    now = peak = 0
    for _, delta in edges:
        now += delta
        peak = max(peak, now)
    return peak


async def test_async_results_are_in_collection_order_whatever_the_completion_order(system: System) -> None:
    eid, status = await system.run_yaml(
        HEAD % "ordered"
        + """
workload: {delays: [0.6, 0.45, 0.3, 0.15, 0.0]}
workflow:
  - step: wait
    tool: {kind: shell, command: "sleep {{ d }}; echo {{ iteration.index }}"}
    loop: {collection: "{{ workload.delays }}", element: d, mode: async, concurrency: 5}
    next: pick
  - step: pick
    args: {out: "{{ wait | map(attribute='stdout') | map('trim') | list }}"}
"""
    )
    assert status.state == "COMPLETED"
    items = await system.events(eid)
    assert of_type(items, "playbook.completed")[0].data["result"] == {"pick": {"out": ["0", "1", "2", "3", "4"]}}
    arrived = [r.iteration_index for r in await system.client.iterations(eid)]
    assert sorted(arrived) == [0, 1, 2, 3, 4] and arrived != [0, 1, 2, 3, 4]  # they did finish out of order
    started = of_type(items, "iterator.started", "wait")[0].data
    assert started["size"] == 5 and started["mode"] == "async" and started["element"] == "d"


async def test_concurrency_bounds_iterations_in_flight(system: System) -> None:
    eid, status = await system.run_yaml(
        HEAD % "bounded"
        + """
workflow:
  - step: fan
    tool: {kind: sleep, seconds: 0.1}
    loop: {collection: "{{ range(25) | list }}", element: n, concurrency: 5}
"""
    )
    assert status.state == "COMPLETED"
    spans = intervals(await system.client.iterations(eid))
    assert len(spans) == 25
    assert most_at_once(spans) == 5  # never more, and the bound is used


async def test_chunked_sends_one_command_per_chunk_with_a_last_partial_chunk(system: System) -> None:
    eid, status = await system.run_yaml(
        HEAD % "chunked"
        + """
workflow:
  - step: double
    tool: {kind: python, code: "def main(x): return x * 2"}
    args: {x: "{{ n }}"}
    loop: {collection: "{{ range(23) | list }}", element: n, mode: chunked, chunk_size: 5, concurrency: 2}
    next: check
  - step: check
    args: {doubled: "{{ double }}"}
"""
    )
    assert status.state == "COMPLETED"
    items = await system.events(eid)
    assert of_type(items, "playbook.completed")[0].data["result"] == {"check": {"doubled": [n * 2 for n in range(23)]}}
    chunks = [r for r in await system.client.iterations(eid) if isinstance(r, ChunkDone)]
    assert sorted(len(c.outcomes) for c in chunks) == [3, 5, 5, 5, 5]
    assert sorted(o.iteration_index for c in chunks for o in c.outcomes) == list(range(23))


FAILING = (
    HEAD % "tolerance"
    + """
workflow:
  - step: odd_fails
    tool:
      kind: python
      code: |
        def main(n):
            if n %% 2:
                raise ValueError(f"odd {n}")
            return n
    args: {n: "{{ n }}"}
    loop: {collection: "{{ range(%d) | list }}", element: n, concurrency: 4, tolerated_failures: %s}
"""
)


async def test_a_duplicate_iteration_result_is_counted_once(system: System) -> None:
    eid = system.client.new_id()
    text = (
        HEAD % "dup"
        + """
workflow:
  - step: slow
    tool: {kind: sleep, seconds: 0.3}
    loop: {collection: [1, 2, 3], element: x, mode: sequential}
"""
    )
    watch = await ResultWatch.start(system.nc, system.layout, eid)
    await system.start_yaml(text, execution_id=eid)
    await watch.reach(1)
    # the first iteration's result, as the tool actor wrote it (stored a moment after
    # subscribers see it)
    first = (await wait_for(lambda: system.client.iterations(eid), timeout=5))[0]
    # deliver it again, as a redelivery past the duplicate window would
    prefix = system.layout.loop_prefix(eid, "0-1")
    dup = await system.nc.jsm().get_last_msg("LOOP", f"{prefix}.in.res.{first.command_id}", direct=True)
    await system.js_publish(f"{prefix}.in.res.{first.command_id}", dup.data or b"", msg_id="another-id")
    status = await system.client.wait(eid, timeout=20)
    assert status.state == "COMPLETED"
    items = await system.events(eid)
    verdict = next(i for i in items if i.type == "iterator.completed").data
    assert (verdict["total"], verdict["succeeded"], verdict["failed"]) == (3, 3, 0)
    assert len(verdict["results"]) == 3
    assert len([r for r in await system.client.iterations(eid) if r.command_id == first.command_id]) == 2


async def test_large_results_are_stored_as_a_blob_and_read_transparently(system: System) -> None:
    eid, status = await system.run_yaml(
        HEAD % "blob"
        + """
workflow:
  - step: wide
    tool: {kind: noop}
    args: {pad: "{{ 'x' * 2000 }}", i: "{{ i }}"}
    loop: {collection: "{{ range(300) | list }}", element: i, concurrency: 100}
    next: use
  - step: use
    args:
      n: "{{ wide | length }}"
      last: "{{ wide[-1].i }}"
      size: "{{ wide | map(attribute='pad') | join | length }}"
""",
        timeout=30,
    )
    assert status.state == "COMPLETED"
    items = await system.events(eid)
    verdict = next(i for i in items if i.type == "iterator.completed").data
    assert verdict["results_ref"] and verdict.get("results") is None  # ~600 kB: not inline
    assert of_type(items, "playbook.completed")[0].data["result"] == {"use": {"n": 300, "last": 299, "size": 600_000}}


async def test_a_sink_runs_after_each_iteration_and_its_failure_fails_that_iteration(system: System) -> None:
    out = system.tmp / "sink"
    out.mkdir()
    eid, status = await system.run_yaml(
        HEAD % "sink"
        + f"""
workflow:
  - step: square
    tool: {{kind: python, code: "def main(x): return x * x"}}
    args: {{x: "{{{{ n }}}}"}}
    loop: {{collection: [1, 2, 3, 4], element: n, tolerated_failures: 1}}
    sink:
      tool:
        kind: python
        code: |
          def main(path, value, index):
              if value == 9:
                  raise IOError("disk full")
              open(path + "/" + str(index), "w").write(str(value))
      args: {{path: "{out}", value: "{{{{ result }}}}", index: "{{{{ iteration.index }}}}"}}
"""
    )
    assert status.state == "COMPLETED"
    assert {p.name: p.read_text() for p in out.iterdir()} == {"0": "1", "1": "4", "3": "16"}
    items = await system.events(eid)
    assert of_type(items, "playbook.completed")[0].data["result"] == {"square": [1, 4, None, 16]}
    verdict = next(i for i in items if i.type == "iterator.completed").data
    assert verdict["errors"][0]["index"] == 2
    assert "sink (python) failed" in verdict["errors"][0]["error"]["message"]
    assert "disk full" in verdict["errors"][0]["error"]["message"]


async def test_retry_applies_to_each_iteration_on_its_own(system: System) -> None:
    marks = system.tmp / "marks"
    marks.mkdir()
    eid, status = await system.run_yaml(
        HEAD % "flaky"
        + f"""
workflow:
  - step: each
    tool:
      kind: python
      code: |
        import os
        def main(n, d):
            p = f"{{d}}/{{n}}"
            first = not os.path.exists(p)
            open(p, "a").write("x")
            if n == 3 and first:
                raise ConnectionError("flaky once")
            return n
    args: {{n: "{{{{ n }}}}", d: "{marks}"}}
    loop: {{collection: "{{{{ range(6) | list }}}}", element: n, concurrency: 6}}
    retry:
      - when: "{{{{ error is not none and error.type == 'ConnectionError' }}}}"
        then: {{max_attempts: 3, backoff: fixed, initial_delay: 0.2}}
"""
    )
    assert status.state == "COMPLETED"
    assert {p.name: p.read_text() for p in marks.iterdir()} == {
        "0": "x",
        "1": "x",
        "2": "x",
        "3": "xx",
        "4": "x",
        "5": "x",
    }
    attempts = sorted((r.iteration_index, r.attempt_number) for r in await system.client.iterations(eid))
    assert attempts == [(0, 1), (1, 1), (2, 1), (3, 1), (3, 2), (4, 1), (5, 1)]
    items = await system.events(eid)
    assert of_type(items, "playbook.completed")[0].data["result"] == {"each": [0, 1, 2, 3, 4, 5]}


async def test_a_loop_over_a_playbook_starts_one_child_per_iteration(system: System) -> None:
    child = system.tmp / "child.yaml"
    child.write_text(
        HEAD % "child"
        + """
workflow:
  - step: inc
    tool: {kind: python, code: "def main(v): return v + 1"}
    args: {v: "{{ workload.v }}"}
"""
    )
    await system.client.register(child)
    eid, status = await system.run_yaml(
        HEAD % "parent"
        + """
workflow:
  - step: each
    tool: {kind: playbook, path: child}
    args: {v: "{{ v }}"}
    loop: {collection: [10, 20, 30], element: v, concurrency: 2}
    next: sum
  - step: sum
    args: {total: "{{ each | map(attribute='inc') | sum }}"}
"""
    )
    assert status.state == "COMPLETED"
    items = await system.events(eid)
    assert of_type(items, "playbook.completed")[0].data["result"] == {"sum": {"total": 63}}
    children = {r.command_id for r in await system.client.iterations(eid)}
    assert len(children) == 3


async def test_cancelling_an_execution_stops_its_loop(system: System) -> None:
    eid = system.client.new_id()
    text = (
        HEAD % "cancelloop"
        + """
workflow:
  - step: slow
    tool: {kind: sleep, seconds: 30}
    loop: {collection: "{{ range(50) | list }}", element: x, concurrency: 3}
"""
    )
    await system.start_yaml(text, execution_id=eid)
    async for item in system.client.follow(eid, until_terminal=False):
        if item.type == "iterator.started":
            break
    await system.client.cancel(eid, reason="enough")
    status = await system.client.wait(eid, timeout=10)
    assert status.state == "CANCELLED"

    # the three in flight were stopped, nothing more was released
    async def stopped() -> bool:
        res = await system.client.iterations(eid)
        return len(res) == 3 and all(isinstance(r, CallError) for r in res)

    await wait_for(stopped, timeout=10)


async def test_a_tool_pod_killed_mid_loop_is_replaced_and_the_counts_are_exact(tmp_path: Path) -> None:
    server = await NatsServer.start()
    nc = await connect(server.url)
    layout = Layout(partitions=4, ack_wait=2.0)
    env = {**os.environ, "ACTORS_ACK_WAIT": "2", "ACTORS_PARTITIONS": "4"}

    async def tool_pod() -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "actors.cli",
            "serve",
            "--role",
            "tools",
            "--nats",
            server.url,
            "--http-port",
            "0",
            cwd=ROOT,
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )

    pod = await tool_pod()
    runtime = await start_roles(nc, layout=layout, roles=("engine", "counter", "projector"))
    try:
        await ensure(nc.jetstream(), layout)
        client = Client(nc, layout=layout)
        pb = tmp_path / "kill.yaml"
        pb.write_text(
            HEAD % "killed"
            + """
workflow:
  - step: work
    tool: {kind: python, code: "import time\\ndef main(n):\\n    time.sleep(0.05)\\n    return n"}
    args: {n: "{{ n }}"}
    loop: {collection: "{{ range(60) | list }}", element: n, concurrency: 8}
"""
        )
        entry = await client.register(pb)
        eid = client.new_id()
        watch = await ResultWatch.start(nc, layout, eid)
        await client.start(entry.path, execution_id=eid)
        await watch.reach(10)
        pod.send_signal(signal.SIGKILL)  # mid-loop: commands in its hands are unacked
        await pod.wait()
        pod = await tool_pod()
        status = await client.wait(eid, timeout=60)
        assert status.state == "COMPLETED"
        items = await client.events(eid)
        verdict = [i for i in items if i.type == "iterator.completed"]
        assert len(verdict) == 1
        assert (verdict[0].data["total"], verdict[0].data["succeeded"], verdict[0].data["failed"]) == (60, 60, 0)
        assert of_type(items, "playbook.completed")[0].data["result"] == {"work": list(range(60))}
    finally:
        pod.send_signal(signal.SIGTERM)
        await pod.wait()
        await runtime.stop()
        await nc.close()
        await server.stop()


async def test_run_shows_a_progress_bar_for_a_running_loop(tmp_path: Path) -> None:
    pb = tmp_path / "bar.yaml"
    pb.write_text(
        HEAD % "bar"
        + """
workflow:
  - step: fan
    tool: {kind: noop}
    loop: {collection: "{{ range(2000) | list }}", element: i, concurrency: 200}
"""
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "actors.cli",
        "run",
        str(pb),
        "--json",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert len(json.loads(out)["result"]["fan"]) == 2000
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "actors.cli",
        "run",
        str(pb),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0
    lines = err.decode().splitlines()
    assert any("fan" in line and "2000/2000" in line and "it/s" in line for line in lines), lines


@pytest.mark.layout(duplicate_window=0.1)
async def test_a_counter_restarted_mid_loop_replays_and_duplicates_nothing(system: System) -> None:
    eid = system.client.new_id()
    text = (
        HEAD % "counterreplay"
        + """
workflow:
  - step: work
    tool: {kind: sleep, seconds: 0.02}
    loop: {collection: "{{ range(200) | list }}", element: n, concurrency: 10}
"""
    )
    watch = await ResultWatch.start(system.nc, system.layout, eid)
    await system.start_yaml(text, execution_id=eid)
    await watch.reach(40)
    await system.restart_roles(("counter",))  # a new counter rebuilds the loop from its log
    status = await system.client.wait(eid, timeout=60)
    assert status.state == "COMPLETED"
    items = await system.events(eid)
    verdict = [i for i in items if i.type == "iterator.completed"]
    assert len(verdict) == 1 and (verdict[0].data["succeeded"], verdict[0].data["failed"]) == (200, 0)
    results = await system.client.iterations(eid)
    assert sorted(r.iteration_index or 0 for r in results) == list(range(200))  # each ran once
