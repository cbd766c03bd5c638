"""The CLI as users run it: a subprocess, its output and exit codes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from streams.server import NatsServer
from tests.support.cli import CLI, ROOT, cli

pytestmark = [pytest.mark.timeout(120)]


@pytest.mark.asyncio
async def test_run_example_embedded_prints_progress_and_result() -> None:
    code, out, err, _ = await cli("run", "examples/hello.yaml", "--payload", '{"name": "nats"}', env={"NATS_URL": ""})
    assert code == 0, err
    assert "greet" in out and "shout" in out and "whisper" in out  # a progress line per step
    assert "COMPLETED" in out
    assert "HELLO, NATS!" in out


@pytest.mark.asyncio
async def test_run_json_gives_one_object_and_exit_code_per_state(tmp_path: Path) -> None:
    code, out, _, _ = await cli(
        "run", "examples/hello.yaml", "--json", "--execution-id", "cli-json-1", env={"NATS_URL": ""}
    )
    assert code == 0
    obj = json.loads(out.strip().splitlines()[-1])
    assert set(obj) == {"execution_id", "state", "result", "error", "started_at", "ended_at", "existing"}
    assert obj["execution_id"] == "cli-json-1" and obj["state"] == "COMPLETED"
    assert obj["result"] == {"shout": "HELLO, WORLD!", "whisper": {"text": "hello, world!"}}

    failing = tmp_path / "fails.yaml"
    failing.write_text("""apiVersion: actors/v1
kind: Playbook
metadata: {name: fails}
workflow:
  - step: boom
    tool: {kind: python, code: "def main(): raise ValueError('no good')"}
""")
    code, out, _, _ = await cli("run", str(failing), "--json", env={"NATS_URL": ""})
    assert code == 1
    obj = json.loads(out.strip().splitlines()[-1])
    assert obj["state"] == "FAILED" and obj["error"]["type"] == "ValueError"
    assert obj["error"]["message"] == "no good"
    assert obj["error"]["step"] == "boom" and obj["error"]["failed_steps"] == ["boom"]


@pytest.mark.asyncio
async def test_run_timeout_exits_4_and_invalid_input_exits_3(tmp_path: Path) -> None:
    slow = tmp_path / "slow.yaml"
    slow.write_text("""apiVersion: actors/v1
kind: Playbook
metadata: {name: slow}
workflow:
  - step: nap
    tool: {kind: sleep, seconds: 30}
""")
    code, _, err, _ = await cli("run", str(slow), "--timeout", "1", env={"NATS_URL": ""})
    assert code == 4 and "not finished" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: actors/v1\nkind: Playbook\nmetadata: {name: x}\nworkflow:\n  - step: a\n    colour: red\n"
    )
    code, _, err, _ = await cli("run", str(bad), env={"NATS_URL": ""})
    assert code == 3 and "bad.yaml:6" in err and "colour" in err
    code, _, err, _ = await cli("run", "examples/hello.yaml", "--payload", "[1, 2]", env={"NATS_URL": ""})
    assert code == 3 and "--payload" in err


@pytest.mark.asyncio
async def test_register_start_status_events_against_a_running_server(tmp_path: Path) -> None:
    """The `dev`/`serve` workflow: actors in one process, the CLI in others."""
    server = await NatsServer.start()
    # --http-port 0: the default 8080 may be taken by anything else on the machine
    serve = await asyncio.create_subprocess_exec(
        *CLI,
        "serve",
        "--role",
        "all",
        "--nats",
        server.url,
        "--http-port",
        "0",
        cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        env = {"NATS_URL": server.url, "ACTORS_PARTITIONS": ""}  # serve's own default layout, not make_layout's
        code, out, _, _ = await cli("register", "examples/hello.yaml", env=env)
        assert code == 0 and "examples/hello v1" in out
        code, out, _, _ = await cli(
            "start", "examples/hello", "--payload", '{"name": "ops"}', "--execution-id", "cli-1", env=env
        )
        assert code == 0 and out.strip() == "cli-1"
        code, out, _, _ = await cli("status", "cli-1", "--watch", "--json", "--timeout", "30", env=env)
        assert code == 0
        assert json.loads(out.strip().splitlines()[-1])["state"] == "COMPLETED"
        code, out, _, _ = await cli("events", "cli-1", "--json", env=env)
        types = [json.loads(line)["type"] for line in out.splitlines()]
        assert types[0] == "execution.start" and types[-1] == "playbook.completed"
        assert "step.enter" in types and "call.done" in types
        code, out, _, _ = await cli("events", "cli-1", env=env)
        assert code == 0 and "playbook.completed" in out  # the table form
        code, out, _, _ = await cli("cancel", "cli-1", env=env)
        assert code == 0 and "already COMPLETED" in out
        code, _, err, _ = await cli("status", "no-such-id", env=env)
        assert code == 3 and "no-such-id" in err
    finally:
        serve.terminate()
        _, serve_err = await asyncio.wait_for(serve.communicate(), 30)
        await server.stop()
    assert serve.returncode == 0, serve_err.decode()[-2000:]


@pytest.mark.asyncio
async def test_commands_that_need_a_server_say_so_without_one() -> None:
    code, _, err, _ = await cli("status", "x", env={"NATS_URL": ""})
    assert code == 3 and "NATS_URL" in err


@pytest.mark.asyncio
async def test_schema_is_json_and_validates_the_example() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    import yaml

    code, out, _, _ = await cli("schema")
    assert code == 0
    schema = json.loads(out)
    doc = yaml.safe_load((ROOT / "examples" / "hello.yaml").read_text())
    jsonschema.validate(doc, schema)
    doc["workflow"][0]["colour"] = "red"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, schema)
