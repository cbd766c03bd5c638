"""`actors-cli` against a real system, as a user meets it: a start of a playbook or
version that does not exist refused at the door, one message for an unknown execution
whatever the command, times with their zone, and `list`'s duration and error columns."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from streams.layout import START_STREAM, START_SUBJECT
from tests.conftest import System, wait_for
from tests.support.cli import EXIT_INVALID, cli, one_line

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]

FAILS = """apiVersion: actors/v1
kind: Playbook
metadata: {name: polish/fails}
workflow:
  - step: boom
    tool: {kind: python, code: "def main(): raise KeyError('missing')"}
"""
WORKS = """apiVersion: actors/v1
kind: Playbook
metadata: {name: polish/works}
workflow:
  - step: one
    tool: noop
"""
UTC_TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d{3})?Z"


async def test_errors_at_the_door_one_message_times_with_zone_and_list_columns(system: System) -> None:
    url = system.server.url
    failed, _ = await system.run_yaml(FAILS)
    worked, _ = await system.run_yaml(WORKS)

    # a playbook or version that does not exist: refused, one line, exit 3, nothing started
    before = (await system.nc.jsm().stream_info(START_STREAM)).state.last_seq
    refusals = await asyncio.gather(
        cli("start", "polish/nosuch", "--execution-id", "door-1", url=url),
        cli("start", "polish/works", "--version", "7", "--execution-id", "door-2", url=url),
    )
    for (code, out, err, _), said in zip(
        refusals,
        (
            "actors-cli: playbook 'polish/nosuch' is not registered",
            "actors-cli: playbook 'polish/works' version 7 is not",
        ),
        strict=True,
    ):
        assert code == EXIT_INVALID and out == "" and one_line(err).startswith(said), (code, out, err)
    assert (await system.nc.jsm().stream_info(START_STREAM)).state.last_seq == before
    assert await system.client.exists("door-1", timeout=1) is False and await system.client.status("door-2") is None

    # an unknown execution: the same words and exit code from every command that reads one
    runs = await asyncio.gather(*(cli(c, "nosuch", url=url) for c in ("status", "logs", "events", "result")))
    assert [(code, one_line(err), out) for code, out, err, _ in runs] == [
        (EXIT_INVALID, "actors-cli: no execution 'nosuch'", "")
    ] * 4

    # times in UTC with their zone; --local in the machine's (here Asia/Kolkata, +05:30); and
    # list's duration and error columns, as the web UI's list has them
    status, local, listed, as_json = await asyncio.gather(
        cli("status", failed, url=url),
        cli("status", failed, "--local", url=url, env={"TZ": "Asia/Kolkata"}),
        cli("list", url=url),
        cli("list", "--json", url=url),
    )
    lines = dict(line.split(None, 1) for line in status.out.splitlines())
    assert status.code == 1 and re.fullmatch(UTC_TIME, lines["started_at"]), status
    assert re.fullmatch(UTC_TIME, lines["ended_at"]) and re.fullmatch(r"\d+ms|\d+\.\d+s", lines["duration"]), lines
    assert re.search(r"started_at +\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\+05:30\n", local.out), local.out

    assert listed.code == 0, listed.err
    header, *rows = listed.out.splitlines()
    assert header.split() == ["execution", "state", "playbook", "ver", "started", "took", "error"]
    row = {line.split()[0]: line for line in rows}
    assert re.search(rf"FAILED +polish/fails +1 +{UTC_TIME} +\S+ +KeyError: 'missing'$", row[failed]), row[failed]
    assert re.search(rf"COMPLETED +polish/works +1 +{UTC_TIME} +\S+$", row[worked]), row[worked]
    objs = {o["execution_id"]: o for o in map(json.loads, as_json.out.splitlines())}
    assert objs[failed]["error"]["type"] == "KeyError" and objs[worked]["error"] is None
    assert objs[failed]["duration"] == pytest.approx(objs[failed]["ended_at"] - objs[failed]["started_at"])

    # the other printed times: a dead letter's, a schedule's creation, a playbook's registration
    await system.js_publish(START_SUBJECT, b"{not json", msg_id="polish-garbage")  # dead-lettered by the starter

    async def lettered() -> bool:
        return bool(await system.client.dead_letters("start"))

    await wait_for(lettered)
    code, out, err, _ = await cli(
        "schedule", "add", "polished", "--playbook", "polish/works", "--cron", "0 2 * * *", url=url
    )
    assert code == 0, err
    listed, letters, books = await asyncio.gather(
        cli("schedule", "list", url=url), cli("deadletters", url=url), cli("playbooks", url=url)
    )
    assert re.search(rf"polished .*{UTC_TIME}$", listed.out, re.MULTILINE), listed.out
    assert re.match(rf"{UTC_TIME}  start  -  ", letters.out), letters.out
    assert re.search(rf"polish/works +1  {UTC_TIME}$", books.out, re.MULTILINE), books.out
