"""A pod as Kubernetes sees it: `actors-cli serve` as a subprocess, its probes, its
metrics, its lifecycle log and its exit on SIGTERM; and a drain that hands nothing
back unfinished."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from actors.client import Client
from actors.config.settings import Settings
from actors.pod.roles import connect, serve, start_roles
from streams.layout import CMD_STREAM, EXEC_STREAM, Layout, tool_consumer, tool_log_consumer
from streams.server import NatsServer
from tests.conftest import EXAMPLES, wait_for
from tests.support.pods import PodProcess, free_port, get, until_status

PARTITIONS = 2


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Parse with prometheus_client's own parser (it raises on malformed text)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def types(text: str) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(text)}


@pytest.mark.asyncio
@pytest.mark.timeout(90)
async def test_serve_is_ready_exports_lag_logs_lifecycle_and_exits_0_on_sigterm(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    pod = await PodProcess.start(
        "all", url=nats_server.url, layout=Layout(partitions=PARTITIONS), logs=tmp_path, name="serve", drain_timeout=5
    )
    base = f"http://127.0.0.1:{pod.port}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            await until_status(http, f"{base}/readyz", 200, timeout=30, proc=pod.proc)
            assert (await get(http, f"{base}/healthz"))[0] == 200

            # one execution through the pod: the projector counts and logs it
            nc = await connect(nats_server.url, name="test")
            try:
                client = Client(nc, layout=Layout(partitions=PARTITIONS))
                entry = await client.register(EXAMPLES / "hello.yaml")
                eid = await client.start(entry.path, version=entry.version, execution_id="health-1")
                assert (await client.wait(eid, timeout=30)).state == "COMPLETED"
            finally:
                await nc.close()

            status, content_type, text = await get(http, f"{base}/metrics")
            assert status == 200
            assert content_type.startswith("text/plain") and "version=0.0.4" in content_type
            values = samples(text)
            lag = ("actors_consumer_pending_messages", (("consumer", tool_consumer("python")), ("stream", CMD_STREAM)))
            assert lag in values and values[lag] >= 0
            held = ("actors_consumer_pending_messages", (("consumer", tool_log_consumer("python")), ("stream", "EXEC")))
            assert held in values and values[held] >= 0
            for p in range(PARTITIONS):
                assert (
                    "actors_consumer_pending_messages",
                    (("consumer", f"engine-p{p}"), ("stream", "EXEC")),
                ) in values
            assert ("actors_consumer_ack_pending_messages", (("consumer", "projector"), ("stream", "EXEC"))) in values
            assert ("actors_consumer_redelivered_messages", (("consumer", "starter"), ("stream", "START"))) in values
            assert values[("actors_ready", ())] == 1
            assert types(text)["actors_step_seconds"] == "histogram"
            assert values[("actors_commands_in_flight", (("kind", "python"),))] == 0  # all done
            steps = {
                dict(labels)["kind"]: n
                for (name, labels), n in values.items()
                if name == "actors_step_seconds_count" and dict(labels)["outcome"] == "ok"
            }
            assert steps and all(n >= 1 for n in steps.values()), steps  # every step hello.yaml ran, timed
            for role in ("engine", "counter"):  # actors in memory (series from the start); none evicted
                assert ("actors_resident", (("role", role),)) in values
                assert values[("actors_evicted_total", (("role", role),))] == 0

            # the counters move right after the status write the client saw: poll briefly
            finished = ("actors_executions_finished_total", (("state", "COMPLETED"),))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30  # a wait, not a speed bound: generous under load
            while samples((await get(http, f"{base}/metrics"))[2]).get(finished) != 1:
                assert loop.time() < deadline, "actors_executions_finished_total{state=COMPLETED} never reached 1"
                await asyncio.sleep(0.05)
            assert samples((await get(http, f"{base}/metrics"))[2])[("actors_executions_started_total", ())] == 1

        # `kill -USR1`: what each task waits on, in the log (the pod goes on)
        dump = await pod.dump_tasks()
        assert "task 'tools:keep-alive'" in dump and "held.py" in dump and "keep_alive" in dump, dump
        assert "waiting on <Future pending" in dump, dump
        assert await pod.stop(timeout=30) == 0  # SIGTERM
    finally:
        await pod.kill()  # if it is still running

    lines = [orjson.loads(ln) for ln in pod.log.read_text().splitlines() if ln.startswith("{")]
    mine = [ln for ln in lines if ln.get("logger") == "actors.lifecycle" and ln["execution_id"] == "health-1"]
    assert {"type": "playbook.completed", "state": "COMPLETED"}.items() <= mine[-1].items(), mine
    assert any(ln["type"] == "playbook.initialized" and ln["state"] == "RUNNING" for ln in mine)


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_drain_reports_not_ready_lets_the_running_command_finish_and_loses_nothing(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    port = free_port()
    settings = Settings(
        nats_url=nats_server.url,
        partitions=PARTITIONS,
        ack_wait=5.0,
        http_host="127.0.0.1",
        http_port=port,
        drain_timeout=10,
    )
    layout = settings.layout
    stop = asyncio.Event()
    pod = asyncio.create_task(serve(settings, stop=stop, shutdown_timeout=20))
    nc = await connect(nats_server.url, name="test")
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            await until_status(http, f"http://127.0.0.1:{port}/readyz", 200, timeout=20)
            client = Client(nc, layout=layout)
            pb = tmp_path / "nap.yaml"
            pb.write_text("""apiVersion: actors/v1
kind: Playbook
metadata: {name: nap, path: tests/nap}
workflow:
  - step: nap
    tool: {kind: sleep, seconds: 1.5}
""")
            entry = await client.register(pb)
            eid = await client.start(entry.path, version=entry.version, execution_id="drain-1")

            # wait until the sleep command is running in the pod (delivered, not acked)
            jsm = nc.jsm()

            async def running() -> bool:
                # its command is held by the decision record in the log (semantics 2)
                info: Any = await jsm.consumer_info(EXEC_STREAM, tool_log_consumer("sleep"))
                return bool(info.num_ack_pending)

            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30  # a wait, not a speed bound: generous under load
            while not await running():
                assert loop.time() < deadline, "the sleep command never started"
                await asyncio.sleep(0.02)

            stop.set()  # what SIGTERM does in `actors-cli serve`
            await until_status(http, f"http://127.0.0.1:{port}/readyz", 503, timeout=5)
            assert await asyncio.wait_for(pod, 30) is True

        # the command finished during the drain: acked, nothing queued or redelivered. The
        # ack left on the pod's connection as it closed; the server may read it after this
        # connection's question (two connections: no order between them), so it is asked
        # again for a moment, well within ack_wait (5 s: past it, a lost ack would show)
        async def settled() -> bool:
            info: Any = await jsm.consumer_info(EXEC_STREAM, tool_log_consumer("sleep"))
            return (info.num_pending, info.num_ack_pending) == (0, 0)

        await wait_for(settled, timeout=3)
        # its result waits in the log for the next engine: a fresh pod completes the execution
        rt = await start_roles(nc, layout=layout)
        try:
            assert (await client.wait(eid, timeout=20)).state == "COMPLETED"
        finally:
            await rt.stop()
    finally:
        stop.set()
        if not pod.done():
            pod.cancel()
        await asyncio.gather(pod, return_exceptions=True)
        await nc.close()


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_sigterm_while_waiting_for_nats_exits_0(tmp_path: Path) -> None:
    """A pod whose NATS never answers is live, not ready, and still stops on SIGTERM
    (the client alone would retry the connection forever)."""
    pod = await PodProcess.start(
        "projector",
        url=f"nats://127.0.0.1:{free_port()}",  # nothing listens there
        layout=Layout(),
        logs=tmp_path,
        name="projector",
    )
    base = f"http://127.0.0.1:{pod.port}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            await until_status(http, f"{base}/healthz", 200, timeout=30, proc=pod.proc)
            status, _, why = await get(http, f"{base}/readyz")
            assert (status, why.strip()) == (503, "starting")
        assert await pod.stop(timeout=15) == 0  # SIGTERM
    finally:
        await pod.kill()  # if it is still running


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_sigterm_after_nats_went_away_exits_0_without_a_traceback(tmp_path: Path) -> None:
    """A pod whose server went away (an outage, a NATS upgrade) and is then stopped, as
    Kubernetes does in a rollout, exits 0 with a warning: its leases are let go here and
    expire on the server, and what its connection buffered while reconnecting is
    dropped. It used to exit 1 with a traceback (nats-py's close wrote that buffer to
    the lost socket) after a request timeout per leased role."""
    server = await NatsServer.start()
    pod = await PodProcess.start(
        "all", url=server.url, layout=Layout(partitions=PARTITIONS, lease_ttl=2), logs=tmp_path, name="pod"
    )
    try:
        await pod.ready()
        await server.stop()
        # the pod's lease renewals (every ttl/4) are buffered while it reconnects, until
        # one times out: then there is something buffered for the close to drop
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while b"balance failed" not in pod.log.read_bytes():
            assert loop.time() < deadline, pod.log.read_text()
            await asyncio.sleep(0.1)  # a log file has no event to await
        assert await pod.stop(timeout=20) == 0, pod.log.read_text()  # SIGTERM
        text = pod.log.read_text()
        assert "Traceback" not in text, text
        assert "leases: not handed back" in text, text
    finally:
        await pod.kill()
        await server.stop()
