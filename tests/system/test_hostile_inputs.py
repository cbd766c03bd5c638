"""Hostile inputs (issue 26, items 9-11): what a user hands the CLI, the starter or the
playbook loader is read within bounds, and refused in one line when it is past them.

* Files: only a regular file is read (not `/dev/zero` behind a symlink, a FIFO, a
  device, a directory), up to a size; every command that reads one says which and why.
* Numbers: a timeout of nan, inf, 0 or less is a usage error, not a wait.
* Nesting: a payload nested 3,000 deep is refused by the CLI, `Client.start` and the
  starter (a refusal reply and a dead letter; the starter goes on), never a RecursionError.
* YAML: a playbook nested too deep, one whose aliases nest or expand too far, or one too
  large is refused naming file and line, by `validate`, `register` and the engine;
  anchors and merge keys used as usual still work.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import msgspec
import pytest

from actors.playbook.loader import MAX_SOURCE_BYTES, PlaybookInvalid
from actors.wire.events import TERMINAL_EVENTS
from actors.wire.messages import StartRecord, StartReply, encode
from actors.wire.nesting import MAX_DEPTH, START_MESSAGE_DEPTH, TooDeep
from streams.layout import IN, START_STREAM, START_SUBJECT
from streams.server import NatsServer
from streams.subjects import START_REQUEST_SUBJECT
from tests.conftest import System, wait_for
from tests.support.cli import cli, one_line

pytestmark = [pytest.mark.timeout(60)]
EXIT_INVALID = 3

OK = """apiVersion: actors/v1
kind: Playbook
metadata: {name: hostile}
workflow:
  - step: a
    tool: {kind: python, code: "def main(n): return n + 1"}
    args: {n: "{{ workload.n }}"}
"""
DEEP_PAYLOAD = '{"n": 1, "deep": ' + "[" * 3000 + "]" * 3000 + "}"


def nested_yaml(levels: int, *, flow: bool) -> str:
    """A playbook whose `workload` holds lists or mappings `levels` deep."""
    if flow:
        value = "[" * levels + "1" + "]" * levels
        body = [f"  deep: {value}"]
    else:
        body = [f"{'  ' * (i + 1)}k{i}:" for i in range(levels)]
        body[-1] += " 1"
    head = ["apiVersion: actors/v1", "kind: Playbook", "metadata: {name: deep}", "workload:"]
    tail = ["workflow:", "  - step: a", "    tool: noop", ""]
    return "\n".join(head + body + tail)


def hostile_file(tmp_path: Path, kind: str) -> Path:
    """A path that is not a regular file; reading it would take for ever, block or fail."""
    path = tmp_path / kind.replace(" ", "-")
    if kind == "a character device":  # through a symlink, as a careless `ln -s` leaves it
        path.symlink_to("/dev/zero")
    elif kind == "a FIFO":  # no writer: a plain open() blocks for ever
        os.mkfifo(path)
    else:
        path.mkdir()
    return path


KINDS = ["a character device", "a FIFO", "a directory"]


def refused(code: int, out: str, err: str) -> str:
    """The one line of a command refused as invalid input (exit 3)."""
    assert code == EXIT_INVALID, (code, out, err)
    return one_line(err)


# --- item 9: files the CLI reads ----------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_every_command_reading_a_file_refuses_what_is_not_a_regular_file(tmp_path: Path, kind: str) -> None:
    """`run FILE`, `run --register FILE`, `validate FILE` and `--payload @FILE` of
    `start`, `run`, `schedule add` and `retry` read nothing but a regular file."""
    path = hostile_file(tmp_path, kind)
    playbook = tmp_path / "ok.yaml"
    playbook.write_text(OK)
    for args in (
        ("validate", str(path)),
        ("run", str(path)),
        ("run", str(playbook), "--register", str(path)),
        ("start", "hostile", "--payload", f"@{path}"),
        ("run", str(playbook), "--payload", f"@{path}"),
        ("schedule", "add", "n", "--playbook", "hostile", "--cron", "@daily", "--payload", f"@{path}"),
        ("retry", "some-id", "--payload", f"@{path}"),
    ):
        code, out, err, _ = await cli(*args)
        line = refused(code, out, err)
        assert str(path) in line and f"{kind}" in line and "not a regular file" in line, (args, line)


@pytest.mark.asyncio
async def test_a_device_named_directly_is_refused_too() -> None:
    code, out, err, _ = await cli("start", "hostile", "--payload", "@/dev/urandom")
    assert "/dev/urandom: a character device, not a regular file" in refused(code, out, err)


@pytest.mark.asyncio
async def test_register_and_dev_refuse_what_is_not_a_regular_file(nats_server: NatsServer, tmp_path: Path) -> None:
    for kind in KINDS:
        path = hostile_file(tmp_path, kind)
        code, out, err, _ = await cli("register", str(path), url=nats_server.url)
        assert f"{path}: {kind}" in refused(code, out, err)
    fifo = tmp_path / "config-fifo"
    os.mkfifo(fifo)
    code, out, err, _ = await cli("dev", "--port", "0", "--server-config", str(fifo))
    assert f"--server-config {fifo}: a FIFO" in refused(code, out, err)


@pytest.mark.asyncio
async def test_a_playbook_file_larger_than_a_message_is_refused_naming_the_limit(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text(OK + "#" * 80 + "\n" + ("# padding\n" * (MAX_SOURCE_BYTES // 10)))
    for args in (("validate", str(big)), ("run", str(big))):
        code, out, err, _ = await cli(*args)
        line = refused(code, out, err)
        assert str(big) in line and f"{MAX_SOURCE_BYTES:,} bytes" in line and "NATS message" in line


# --- item 9: numbers ----------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "soon"])
async def test_a_timeout_that_is_not_a_positive_finite_number_is_a_usage_error(value: str) -> None:
    for args in (
        ("run", "examples/hello.yaml", "--timeout", value),
        ("status", "some-id", "--watch", "--timeout", value),
        ("start", "examples/hello", "--timeout", value),
    ):
        code, out, err, _ = await cli(*args)
        line = refused(code, out, err)
        assert "--timeout" in line and repr(value) in line, (args, line)


@pytest.mark.asyncio
async def test_a_drain_timeout_must_be_finite_and_not_negative() -> None:
    for value in ("nan", "inf", "-1"):
        code, out, err, _ = await cli("serve", "--nats", "nats://127.0.0.1:1", "--drain-timeout", value)
        assert "--drain-timeout" in refused(code, out, err)


# --- item 10: a payload nested too deep -------------------------------------------------------


@pytest.mark.asyncio
async def test_the_cli_refuses_a_payload_nested_too_deep_in_one_line(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text(DEEP_PAYLOAD)
    playbook = tmp_path / "ok.yaml"
    playbook.write_text(OK)
    for args in (
        ("start", "hostile", "--payload", DEEP_PAYLOAD),
        ("start", "hostile", "--payload", f"@{deep}"),
        ("run", str(playbook), "--payload", DEEP_PAYLOAD),
    ):
        code, out, err, _ = await cli(*args)
        assert f"nests deeper than {MAX_DEPTH} levels" in refused(code, out, err)


async def start_request(system: System, data: bytes) -> StartReply:
    msg = await system.nc.request(START_REQUEST_SUBJECT, data, timeout=10)
    return msgspec.json.decode(msg.data, type=StartReply)


async def registered(system: System) -> str:
    path = system.tmp / "hostile.yaml"
    path.write_text(OK)
    return (await system.client.register(path)).path


GARBAGE = [
    b'{"playbook": "hostile", "execution_id": "deep-1", "payload": ' + DEEP_PAYLOAD.encode() + b"}",
    b"[" * 100_000,  # never closed
    b'{"playbook": "hostile", "payload": {"a": "' + b'\\"' * 10_000,  # a string never closed
    b"\xff\xfe\x00 not text",
    b'{"playbook": "hostile", "payload": {"a": 1e99999}}',
]


@pytest.mark.asyncio
async def test_a_start_request_the_starter_cannot_parse_is_refused_and_dead_lettered(system: System) -> None:
    playbook = await registered(system)
    for n, data in enumerate(GARBAGE, 1):
        reply = await start_request(system, data)
        assert not reply.started and reply.error is not None, data[:40]
        assert reply.error.type == "InvalidStart", reply.error

        async def letters(want: int = n) -> list[Any]:
            found = await system.client.dead_letters("start")
            return found if len(found) >= want else []

        assert len(await wait_for(letters)) == n  # one dead letter each, none lost
    first = (await system.client.dead_letters("start"))[0]
    assert f"nests deeper than {START_MESSAGE_DEPTH} levels" in first.data["reason"]
    # the starter goes on: a good start after all that runs
    reply = await start_request(
        system, json.dumps({"playbook": playbook, "payload": {"n": 1}, "execution_id": "after-1"}).encode()
    )
    assert reply.started, reply
    assert (await system.client.wait("after-1", timeout=20)).state == "COMPLETED"


@pytest.mark.asyncio
async def test_a_payload_one_level_too_deep_is_refused_naming_the_payload(system: System) -> None:
    playbook = await registered(system)
    within = {"n": 1, "deep": json.loads("[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1))}
    over = {"n": 1, "deep": json.loads("[" * MAX_DEPTH + "]" * MAX_DEPTH)}
    body = {"playbook": playbook, "payload": over, "execution_id": "over-1"}
    reply = await start_request(system, json.dumps(body).encode())
    assert reply.execution_id == "over-1" and not reply.started and reply.error is not None
    assert f"payload nests deeper than {MAX_DEPTH} levels" in reply.error.message
    letters = [i for i in await system.events("over-1") if i.cls == "dlq"]  # filed under its id
    assert len(letters) == 1 and "payload" in letters[0].data["reason"]
    body = {"playbook": playbook, "payload": within, "execution_id": "within-1"}
    assert (await start_request(system, json.dumps(body).encode())).started
    assert (await system.client.wait("within-1", timeout=20)).state == "COMPLETED"


CHILD = """apiVersion: actors/v1
kind: Playbook
metadata: {name: child, path: hostile/child}
workflow:
  - step: a
    tool: noop
"""
PARENT = """apiVersion: actors/v1
kind: Playbook
metadata: {name: parent}
workflow:
  - step: deep
    tool:
      kind: python
      code: |
        def main():
            v = 1
            for _ in range(100):
                v = [v]
            return v
    next: call
  - step: call
    tool: {kind: playbook, path: hostile/child}
    args: {v: "{{ deep }}"}
"""


@pytest.mark.asyncio
async def test_a_child_started_with_a_payload_too_deep_fails_and_its_parent_hears(system: System) -> None:
    """A payload the starter can read but not accept (here 101 levels, a step's result
    passed on to a child) starts an execution that fails saying why: the parent's step
    fails at once instead of waiting for a child that never starts."""
    child = system.tmp / "child.yaml"
    child.write_text(CHILD)
    await system.client.register(child)
    eid, status = await system.run_yaml(PARENT)
    assert status.state == "FAILED", status
    (exit_,) = [i for i in await system.events(eid) if i.type == "step.exit" and i.step == "call"]
    assert f"payload nests deeper than {MAX_DEPTH} levels" in json.dumps(exit_.data["error"])


@pytest.mark.asyncio
async def test_a_deep_start_published_to_the_stream_is_dead_lettered_and_acked(system: System) -> None:
    data = b'{"playbook": "hostile", "execution_id": "deep-2", "payload": ' + DEEP_PAYLOAD.encode() + b"}"
    await system.js_publish(START_SUBJECT, data, msg_id="deep-2")

    async def letters() -> list[Any]:
        return [i for i in await system.client.dead_letters("start") if "nests deeper" in i.data["reason"]]

    assert len(await wait_for(letters)) == 1
    await system.engine_idle()  # taken and acked once: not redelivered for ever
    _, status = await system.run_yaml(OK, payload={"n": 1})
    assert status.state == "COMPLETED"


@pytest.mark.asyncio
async def test_client_start_refuses_a_deep_payload_before_sending_anything(system: System) -> None:
    playbook = await registered(system)
    deep: Any = 1
    for _ in range(3000):
        deep = [deep]
    before = (await system.nc.jsm().stream_info(START_STREAM)).state.last_seq
    with pytest.raises(TooDeep, match=f"the payload nests deeper than {MAX_DEPTH} levels"):
        await system.client.start(playbook, payload={"deep": deep}, execution_id="client-deep")
    with pytest.raises(TooDeep):
        await system.client.start_execution(playbook, payload={"deep": deep}, execution_id="client-deep")
    with pytest.raises(TooDeep):
        await system.client.schedule_add("deep", playbook=playbook, cron="@daily", payload={"deep": deep})
    assert (await system.nc.jsm().stream_info(START_STREAM)).state.last_seq == before
    assert await system.client.dead_letters("start") == []  # nothing reached a starter


# --- item 11: YAML ------------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("text", "line"),
    [
        (nested_yaml(600, flow=False), MAX_DEPTH + 4),  # the first key past the bound
        (nested_yaml(600, flow=True), 5),
    ],
    ids=["block-600", "flow-600"],
)
async def test_validate_refuses_a_deeply_nested_playbook_naming_file_and_line(
    tmp_path: Path, text: str, line: int
) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text(text)
    code, out, err, _ = await cli("validate", str(path))
    said = refused(code, out, err)
    assert said.startswith(f"{path}:{line}:") and "nest" in said, said


ALIASES_TOO_DEEP = """apiVersion: actors/v1
kind: Playbook
metadata: {name: aliases}
workload:
  a: &a [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]
  b: &b [*a]
  c: [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[*b]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]
workflow:
  - step: s
    tool: noop
"""


DEFAULTS = """apiVersion: actors/v1
kind: Playbook
metadata: {name: defaults}
workload:
  base: &base {n: 3, label: one}
  copy:
    <<: *base
    label: two
workflow:
  - step: a
    tool: &double {kind: python, code: "def main(n): return n * 2"}
    args: {n: "{{ workload.copy.n }}"}
    next: b
  - step: b
    tool: *double
    args: {n: "{{ a }}"}
"""


@pytest.mark.asyncio
async def test_aliases_are_bounded_by_the_depth_they_expand_to_and_used_as_usual_still_work(system: System) -> None:
    deep = system.tmp / "aliases.yaml"
    deep.write_text(ALIASES_TOO_DEEP)
    code, out, err, _ = await cli("validate", str(deep))
    said = refused(code, out, err)
    assert said.startswith(f"{deep}:7:") and "*b" in said and f"deeper than {MAX_DEPTH}" in said, said
    # an anchored tool used twice and a merge key: validated and run as before
    usual = system.tmp / "defaults.yaml"
    usual.write_text(DEFAULTS)
    code, out, err, _ = await cli("validate", str(usual))
    assert code == 0 and "ok" in out, err
    eid, status = await system.run_yaml(DEFAULTS)
    assert status.state == "COMPLETED", status
    done = next(i for i in await system.events(eid) if i.type in TERMINAL_EVENTS)
    assert "12" in json.dumps(await system.client.result(done))  # n merged from &base (3), doubled twice


@pytest.mark.asyncio
async def test_register_refuses_a_deep_playbook_through_the_cli_and_the_client(system: System) -> None:
    path = system.tmp / "deep.yaml"
    path.write_text(nested_yaml(600, flow=True))
    code, out, err, _ = await cli("register", str(path), url=system.server.url)
    assert f"{path}:5: YAML nested deeper than {MAX_DEPTH} levels" in refused(code, out, err)
    with pytest.raises(PlaybookInvalid, match="nested deeper"):
        await system.client.register(path)


@pytest.mark.asyncio
async def test_the_engine_refuses_a_deep_playbook_in_a_start_record_and_goes_on(system: System) -> None:
    """A start record written by anything but the CLI (a hand-made message) carries the
    deep source: the engine fails that execution saying why, and runs the next one."""
    eid = "deep-source-1"
    record = StartRecord(execution_id=eid, playbook_path="deep", playbook_source=nested_yaml(300, flow=False))
    await system.js_publish(system.layout.exec_subject(eid, IN, "start"), encode(record), msg_id=f"{eid}:start")
    assert (await system.client.wait(eid, timeout=20)).state == "FAILED"
    failed = next(i for i in await system.events(eid) if i.type in TERMINAL_EVENTS)
    assert failed.data["error"]["type"] == "PlaybookInvalid" and "nested deeper" in failed.data["error"]["message"]
    _, status = await system.run_yaml(OK, payload={"n": 1})
    assert status.state == "COMPLETED"
