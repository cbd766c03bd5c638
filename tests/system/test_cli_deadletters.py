"""`actors-cli deadletters [--since T] [--json]`: every actor's dead letters, newest
first, as a user runs it (a subprocess against a running system)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from streams.layout import START_SUBJECT
from streams.subjects import START_REQUEST_SUBJECT
from tests.conftest import System, wait_for

pytestmark = [pytest.mark.timeout(90)]
ROOT = Path(__file__).resolve().parents[2]


async def cli(system: System, *args: str) -> tuple[int, str, str]:
    env = {"NATS_URL": system.server.url, "ACTORS_PARTITIONS": str(system.layout.partitions), "ACTORS_ACK_WAIT": "2"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "actors.cli",
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **env},
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.asyncio
async def test_deadletters_lists_every_letter_newest_first_and_filters_by_time(system: System) -> None:
    code, out, _ = await cli(system, "deadletters")
    assert code == 0 and "no dead letters" in out

    # a refused start request naming an id, then a bad start on the stream naming none
    await system.nc.request(START_REQUEST_SUBJECT, b'{"playbook": "nowhere", "execution_id": "dl-1"}', timeout=10)
    await system.js_publish(START_SUBJECT, b"{not json", msg_id="dl-garbage")
    await wait_for(lambda: _count(system, 2))

    code, out, err = await cli(system, "deadletters", "--json")
    assert code == 0, err
    letters = [json.loads(line) for line in out.splitlines()]
    assert [(d["source"], d["execution_id"]) for d in letters] == [("start", None), ("start", "dl-1")]
    assert "not JSON" in letters[0]["reason"] and letters[0]["data"] == "{not json"
    assert "not registered" in letters[1]["reason"]
    assert letters[0]["seq"] > letters[1]["seq"] and letters[0]["at"] >= letters[1]["at"]

    code, out, _ = await cli(system, "deadletters")
    lines = out.splitlines()
    assert len(lines) == 2 and " start  -  " in lines[0] and " start  dl-1  " in lines[1]

    code, out, _ = await cli(system, "deadletters", "--since", "1h", "--json")
    assert code == 0 and len(out.splitlines()) == 2
    code, out, _ = await cli(system, "deadletters", "--since", "2100-01-01T00:00:00Z", "--json")
    assert code == 0 and out == ""


@pytest.mark.asyncio
async def test_deadletters_refuses_a_since_it_cannot_read_in_one_line(system: System) -> None:
    code, out, err = await cli(system, "deadletters", "--since", "yesterday")
    assert code == 3 and out == ""
    assert len(err.strip().splitlines()) == 1 and "--since 'yesterday'" in err and "ISO 8601" in err


async def _count(system: System, n: int) -> bool:
    return len(await system.client.dead_letters()) >= n


def test_since_takes_an_age_or_an_iso_time() -> None:
    from actors.cli.since import parse_since

    assert parse_since("90s", now=10_000) == 9_910
    assert parse_since("2h", now=10_000) == 10_000 - 7_200
    assert parse_since("1970-01-01T01:00:00Z") == 3_600
    assert parse_since("1970-01-01T02:00:00+01:00") == 3_600
