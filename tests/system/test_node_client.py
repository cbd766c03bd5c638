"""A client in another language that runs (issue #31): examples/node/client.mjs, the
Node.js program a user copies, against a real system. It uses only the wire protocol
(`catalog.register`, `start`, `start.request`, KV `status`, `status.<playbook>.*`,
`result.request`) through the official @nats-io packages, so a change to any of them
that a non-Python client would trip over fails here.

Runs when `node` is on PATH and the example's packages are installed (`npm ci --prefix
examples/node`, which .ci/run does); skipped, saying which, otherwise."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from actors.pod import permissions
from tests.conftest import EXAMPLES, System
from tests.support.secured import Pods, Secured  # the fixtures: tests/system/conftest.py

NODE_DIR = EXAMPLES / "node"
NODE = shutil.which("node")
HELLO = EXAMPLES / "hello.yaml"


def _skip_reason() -> str | None:
    if NODE is None:
        return "node is not on PATH"
    if not (NODE_DIR / "node_modules" / "@nats-io" / "transport-node").is_dir():
        return "examples/node has no node_modules: run `npm ci --prefix examples/node`"
    return None


pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.timeout(150),
    # skipped on a developer's machine without node; in CI (CI=true), where .ci/run installs
    # the packages, run and fail rather than pass by skipping
    pytest.mark.skipif(not os.environ.get("CI") and _skip_reason() is not None, reason=_skip_reason() or ""),
]


async def run_node(*args: str, env: dict[str, str] | None = None) -> tuple[int, list[dict[str, Any]], str]:
    assert _skip_reason() is None, _skip_reason()
    assert NODE is not None
    proc = await asyncio.create_subprocess_exec(
        NODE,
        str(NODE_DIR / "client.mjs"),
        *args,
        cwd=NODE_DIR,
        env={**os.environ, **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, [json.loads(line) for line in out.decode().splitlines() if line.strip()], err.decode()


async def test_the_node_example_registers_starts_watches_and_reads_results(system: System) -> None:
    name = "nats"
    # the program's own deadline is under the test's, so a hang is reported by the program
    code, lines, err = await run_node("--server", system.server.url, "--name", name, "--timeout", "110")
    assert code == 0, f"exit {code}\nstdout: {lines}\nstderr: {err}"

    # registered over catalog.register under the path the playbook names
    (registered,) = [line["registered"] for line in lines if "registered" in line]
    playbook_path = yaml.safe_load(HELLO.read_text())["metadata"]["path"]
    assert registered["path"] == playbook_path
    assert isinstance(registered["version"], int)

    # a start of an unknown playbook on start.request is refused, with its error type, and
    # nothing runs under its id
    (refused,) = [line["refused"] for line in lines if "refused" in line]
    assert refused["error"]["type"] == "PlaybookNotFound", refused
    assert refused["started"] is False
    assert await system.client.exists(refused["execution_id"]) is False

    # the result the engine computes for the same playbook and payload, read with the
    # Python client: what the Node user must see too, through result.request
    eid, status = await system.client.run(playbook_path, payload={"name": name}, timeout=60)
    assert status.state == "COMPLETED"
    expected = await system.client.result(eid)
    assert expected["shout"] == f"Hello, {name}!".upper()  # the playbook's own steps, not a stale fixture

    executions = [line for line in lines if "execution_id" in line]
    assert sorted(e["started_by"] for e in executions) == ["publish", "request"]
    for e in executions:
        assert e["state"] == "COMPLETED", e
        assert e["result"] == expected, e
        # the executions are the system's own, under the ids the program chose
        stored = await system.client.status(e["execution_id"])
        assert stored is not None and stored.state == "COMPLETED"
        # KV `status`: the watch is open before the start and a watch delivers every write
        # of its keys; the projector writes RUNNING at `playbook.initialized` and COMPLETED
        # at `playbook.completed`, two writes for hello's several steps, so both are seen,
        # in that order (and never PENDING: the bucket does not hold it)
        assert e["statuses"][-1] == "COMPLETED", e
        assert "RUNNING" in e["statuses"][:-1], e
        assert "PENDING" not in e["statuses"], e
        # the status.<playbook>.* feed is at most once, so only COMPLETED is required: on
        # one local server with the subscription flushed before the start nothing is lost,
        # and whatever it carried are the same states in the same order as KV
        assert "COMPLETED" in e["feed"], e
        it = iter(e["statuses"])
        assert all(state in it for state in e["feed"]), e  # a subsequence of KV's


async def test_the_node_example_reports_an_unreachable_server_and_exits_1() -> None:
    # nothing listens on port 1: the program says so and exits 1, instead of hanging
    code, lines, err = await run_node("--server", "nats://127.0.0.1:1", "--timeout", "20")
    assert code == 1
    assert lines == []
    assert err.startswith("error: "), err


async def test_the_node_example_runs_as_the_deployments_cli_user(secured: Secured, pods: Pods, tmp_path: Path) -> None:
    # deploy/nats/permissions.conf as committed, each role its own user: the program
    # connects as the `cli` user, as a deployment's client would (docs/security.md), with
    # its password from a file and replies under its own inbox prefix
    for role in ("engine", "counter", "tools", "projector"):  # the engine first: it declares the streams
        await pods.start(secured, role)
    password = tmp_path / "password"
    password.write_text(secured.passwords["cli"] + "\n")  # a mounted Secret's trailing newline
    env = {
        "NATS_USER": "cli",
        "NATS_PASSWORD_FILE": str(password),
        "NATS_INBOX_PREFIX": permissions.inbox_prefix("cli"),
    }
    server = f"nats://127.0.0.1:{secured.server.port}"
    code, lines, err = await run_node("--server", server, "--name", "cli", "--timeout", "110", env=env)
    assert code == 0, f"exit {code}\nstdout: {lines}\nstderr: {err}\nviolations: {secured.violations()}"
    executions = [line for line in lines if "execution_id" in line]
    assert [e["state"] for e in executions] == ["COMPLETED", "COMPLETED"]
    assert secured.violations() == []
