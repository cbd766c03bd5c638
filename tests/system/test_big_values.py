"""Big values (issue 11, item 7) and bounded YAML aliases (item 5).

Values over the message limit travel as blobs in the object store and are read back
where they are used; past the cap (ACTORS_MAX_VALUE_BYTES) the step fails saying so.
Integers beyond 64 bits survive every path to the user. A YAML alias bomb is refused
at load, by the CLI and by the engine."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path

import pytest

from actors.playbook.loader import MAX_ALIAS_NODES, PlaybookInvalid, load_playbook
from actors.store.blobs import get_blob
from actors.wire.events import TERMINAL_EVENTS
from actors.wire.messages import CallDone, StartRecord, encode
from streams.layout import IN
from streams.server import NatsServer
from tests.conftest import System, of_type
from tests.support.cli import cli

pytestmark = [pytest.mark.timeout(60)]

TWO_MB = 2_000_000

BIG_THEN_LEN = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: big_then_len}
workflow:
  - step: big
    tool: {kind: python, code: "def main(): return 'x' * 2_000_000"}
    next: measure
  - step: measure
    tool: {kind: python, code: "def main(s): return len(s)"}
    args: {s: "{{ big }}"}
    next: end
  - step: end
    args: {n: "{{ measure }}"}
"""


@pytest.mark.asyncio
async def test_a_python_step_returning_2mb_completes_and_the_next_step_sees_it(system: System) -> None:
    eid, status = await system.run_yaml(BIG_THEN_LEN)
    assert status.state == "COMPLETED"
    items = await system.events(eid)
    done = of_type(items, "call.done", "big")[0]
    assert done.data.get("result_ref") and done.data.get("result") is None  # the log holds a reference
    assert await get_blob(system.nc.jetstream(), done.data["result_ref"]) == "x" * TWO_MB
    terminal = of_type(items, "playbook.completed")[0]
    assert await system.client.result(terminal) == {"n": TWO_MB}  # `measure` got all 2 MB as its args


@pytest.mark.asyncio
async def test_an_execution_reads_its_big_values_back_on_replay(system: System) -> None:
    """An engine that takes an execution over mid-way (restart) replays its log: a result
    held as a blob must be read back, or the end would see `big` as null."""
    eid = await system.start_yaml("""
apiVersion: actors/v1
kind: Playbook
metadata: {name: big_replay}
workflow:
  - step: big
    tool: {kind: python, code: "def main(): return 'y' * 2_000_000"}
    next: nap
  - step: nap
    tool: {kind: sleep, seconds: 1.0}
    next: end
  - step: end
    args: {big: "{{ big | length }}", nap: "{{ nap }}"}
""")
    async for item in system.client.follow(eid, until_terminal=False):
        if item.type == "command.issued" and item.step == "nap":
            break
    await system.restart_roles(("engine",))  # the nap's result reaches a new engine, which replays
    status = await system.client.wait(eid, timeout=20)
    assert status.state == "COMPLETED"
    terminal = of_type(await system.events(eid), "playbook.completed")[0]
    result = await system.client.result(terminal)
    assert result == {"big": TWO_MB, "nap": {"slept": 1.0}}


@pytest.mark.asyncio
async def test_a_missing_result_blob_fails_the_step_clearly(system: System) -> None:
    eid = await system.start_yaml("""
apiVersion: actors/v1
kind: Playbook
metadata: {name: blob_gone}
workflow:
  - step: wait
    tool: {kind: sleep, seconds: 3}
""")
    async for item in system.client.follow(eid, until_terminal=False):
        if item.type == "command.issued":
            cid = item.data["command_id"]
            break
    # a result whose blob is gone (expired, removed) arrives before the tool's own
    gone = CallDone(execution_id=eid, command_id=cid, step="wait", attempt_number=1, result_ref=f"{eid}/result/gone")
    await system.js_publish(
        system.layout.exec_subject(eid, IN, f"result.{cid}"), encode(gone), msg_id=f"{eid}:res:{cid}"
    )
    status = await system.client.wait(eid, timeout=10)
    assert status.state == "FAILED"
    err = of_type(await system.events(eid), "step.exit", "wait")[0].data["error"]
    assert err["type"] == "ValueMissing" and "step 'wait'" in err["message"] and "not found" in err["message"]


@pytest.mark.asyncio
@pytest.mark.layout(max_value_bytes=1_500_000)  # the cap of every actor here (ACTORS_MAX_VALUE_BYTES in a pod)
async def test_values_over_the_cap_fail_the_step_naming_it_while_others_complete(system: System) -> None:
    too_big_result = system.start_yaml("""
apiVersion: actors/v1
kind: Playbook
metadata: {name: over_cap_result}
workflow:
  - step: huge
    tool: {kind: python, code: "def main(): return 'x' * 2_000_000"}
""")
    too_big_args = system.start_yaml("""
apiVersion: actors/v1
kind: Playbook
metadata: {name: over_cap_args}
workflow:
  - step: half
    tool: {kind: python, code: "def main(): return 'x' * 1_000_000"}
    next: twice
  - step: twice
    tool: {kind: python, code: "def main(a, b): return len(a) + len(b)"}
    args: {a: "{{ half }}", b: "{{ half }}"}
""")
    good = system.start_yaml(BIG_THEN_LEN.replace("2_000_000", "1_200_000"))  # over the limit, under the cap
    bad_result, bad_args, ok = await asyncio.gather(too_big_result, too_big_args, good)
    assert (await system.client.wait(ok, timeout=20)).state == "COMPLETED"
    assert (await system.client.wait(bad_result, timeout=20)).state == "FAILED"
    assert (await system.client.wait(bad_args, timeout=20)).state == "FAILED"

    err = of_type(await system.events(bad_result), "step.exit", "huge")[0].data["error"]
    assert err["type"] == "ValueTooLarge"
    assert "step 'huge'" in err["message"] and "result" in err["message"] and "1,500,000" in err["message"]
    err = of_type(await system.events(bad_args), "step.exit", "twice")[0].data["error"]
    assert err["type"] == "ValueTooLarge" and "step 'twice' field args" in err["message"]
    terminal = of_type(await system.events(ok), "playbook.completed")[0]
    assert await system.client.result(terminal) == {"n": 1_200_000}


@pytest.mark.asyncio
async def test_a_loop_whose_iterations_read_and_return_big_values_completes(system: System) -> None:
    """The loop's spec (its scope holds `big`), each iteration's command (args) and each
    iteration's result are over the message limit."""
    eid, status = await system.run_yaml(
        """
apiVersion: actors/v1
kind: Playbook
metadata: {name: big_loop}
workflow:
  - step: big
    tool: {kind: python, code: "def main(): return 'z' * 1_500_000"}
    next: each
  - step: each
    loop: {collection: "{{ [1, 2, 3] }}", element: n}
    tool: {kind: python, code: "def main(s, n): return s[:n] * 1_200_000"}
    args: {s: "{{ big }}", n: "{{ n }}"}
    next: end
  - step: end
    args: {sizes: "{{ each | map('length') | list }}"}
""",
        timeout=40,
    )
    assert status.state == "COMPLETED"
    terminal = of_type(await system.events(eid), "playbook.completed")[0]
    assert await system.client.result(terminal) == {"sizes": [1_200_000, 2_400_000, 3_600_000]}


@pytest.mark.asyncio
async def test_a_chunk_whose_results_are_too_large_together_completes(system: System) -> None:
    """Three 500 kB results in one chunk's answer are over the message limit: each goes
    as a blob, none fails."""
    eid, status = await system.run_yaml(
        """
apiVersion: actors/v1
kind: Playbook
metadata: {name: big_chunk}
workflow:
  - step: each
    loop: {collection: "{{ [1, 2, 3, 4] }}", element: n, mode: chunked, chunk_size: 3}
    tool: {kind: python, code: "def main(n): return str(n) * 500_000"}
    args: {n: "{{ n }}"}
    next: end
  - step: end
    args: {heads: "{{ each | map('first') | list }}", sizes: "{{ each | map('length') | list }}"}
""",
        timeout=40,
    )
    assert status.state == "COMPLETED"
    terminal = of_type(await system.events(eid), "playbook.completed")[0]
    assert await system.client.result(terminal) == {"heads": ["1", "2", "3", "4"], "sizes": [500_000] * 4}


PAYLOAD_LEN = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: payload_len}
workflow:
  - step: measure
    tool: {kind: python, code: "def main(s): return len(s)"}
    args: {s: "{{ workload.blob }}"}
"""


@pytest.mark.asyncio
async def test_a_start_payload_over_the_message_limit_works_through_client_start(system: System) -> None:
    eid, status = await system.run_yaml(PAYLOAD_LEN, payload={"blob": "p" * TWO_MB})
    assert status.state == "COMPLETED"
    items = await system.events(eid)
    start = of_type(items, "execution.start")[0]
    assert start.data.get("payload_ref") and not start.data.get("payload")
    terminal = of_type(items, "playbook.completed")[0]
    assert (await system.client.result(terminal)) == {"measure": TWO_MB}


@pytest.mark.asyncio
async def test_a_large_payload_beside_the_playbook_goes_to_a_blob_at_the_starter(system: System) -> None:
    """Message and payload each fit, the start record (payload plus playbook source)
    would not: the starter moves the payload."""
    padding = "\n".join(f"# {'-' * 90}" for _ in range(6000))  # ~560 kB of comment in the source
    eid, status = await system.run_yaml(PAYLOAD_LEN + padding, payload={"blob": "q" * 600_000})
    assert status.state == "COMPLETED"
    items = await system.events(eid)
    assert of_type(items, "execution.start")[0].data.get("payload_ref")
    assert (await system.client.result(of_type(items, "playbook.completed")[0])) == {"measure": 600_000}


@pytest.mark.asyncio
async def test_cli_run_takes_a_payload_over_the_limit_and_refuses_one_over_the_cap(tmp_path: Path) -> None:
    pb = tmp_path / "payload_len.yaml"
    pb.write_text(PAYLOAD_LEN)
    payload = tmp_path / "payload.json"
    payload.write_text(json.dumps({"blob": "c" * TWO_MB}))
    code, out, err, _ = await cli("run", str(pb), "--payload", f"@{payload}", "--json", env={"NATS_URL": ""})
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["result"] == {"measure": TWO_MB}

    code, out, err, _ = await cli(
        "run", str(pb), "--payload", f"@{payload}", "--json", env={"NATS_URL": "", "ACTORS_MAX_VALUE_BYTES": "1000000"}
    )
    assert code == 3
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "payload" in lines[0] and "1,000,000" in lines[0] and "Traceback" not in err


@pytest.mark.asyncio
async def test_integers_beyond_64_bits_reach_run_json_and_events_json(system: System, tmp_path: Path) -> None:
    pb = tmp_path / "bigint.yaml"
    pb.write_text("""
apiVersion: actors/v1
kind: Playbook
metadata: {name: bigint}
workflow:
  - step: power
    tool: {kind: python, code: "def main(n): return {'n': n, 'next': n + 1}"}
    args: {n: "{{ workload.n }}"}
""")
    # served by this test's actors: the CLI must use their layout
    env = {
        "NATS_URL": system.server.url,
        "ACTORS_PARTITIONS": str(system.layout.partitions),
        "ACTORS_ACK_WAIT": str(system.layout.ack_wait),
    }
    code, out, err, _ = await cli(
        "run", str(pb), "--payload", json.dumps({"n": 2**70}), "--json", "--execution-id", "bigint-1", env=env
    )
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["result"] == {"power": {"n": 2**70, "next": 2**70 + 1}}
    code, out, err, _ = await cli("events", "bigint-1", "--json", env=env)
    assert code == 0, err
    done = [json.loads(line) for line in out.splitlines() if '"call.done"' in line]
    assert done and done[0]["data"]["result"] == {"n": 2**70, "next": 2**70 + 1}
    code, out, err, _ = await cli("events", "bigint-1", env=env)  # the table too
    assert code == 0 and str(2**70) in out, err


# --- YAML alias bomb (item 5) ---------------------------------------------------------


def _bomb() -> str:
    levels = "abcdefgh"
    rows = ["      a: &a [x, x, x, x, x, x, x, x, x]"]
    for prev, name in itertools.pairwise(levels):
        rows.append(f"      {name}: &{name} [{', '.join(['*' + prev] * 9)}]")
    return "\n".join(
        [
            "apiVersion: actors/v1",
            "kind: Playbook",
            "metadata: {name: laughs}",
            "workflow:",
            "  - step: start",
            "    args:",
            *rows,
            "",
        ]
    )


def test_an_alias_bomb_is_refused_at_load_naming_its_line() -> None:
    text = _bomb()
    assert len(text.encode()) < 700  # the 643-byte file, near enough
    with pytest.raises(PlaybookInvalid) as e:
        load_playbook(text, file="laughs.yaml")
    [error] = e.value.errors
    assert error.file == "laughs.yaml" and error.line == 12  # `f: &f [...]`: the alias use past the bound
    assert f"{MAX_ALIAS_NODES:,}" in error.message and "aliases" in error.message


def test_anchors_within_the_bound_still_load() -> None:
    text = _bomb().split("      f:")[0] + "\n"  # five levels: 66,430 nodes, under the bound
    pb = load_playbook(text, file="ok.yaml")
    assert len(pb.step("start").args["e"]) == 9


@pytest.mark.asyncio
async def test_cli_validate_register_and_run_refuse_an_alias_bomb_with_exit_3(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    bomb = tmp_path / "laughs.yaml"
    bomb.write_text(_bomb())
    for args in (
        ("validate", str(bomb)),
        ("register", str(bomb), "--nats", nats_server.url),
        ("run", str(bomb), "--nats", nats_server.url),
    ):
        code, _, err, _ = await cli(*args)
        assert code == 3, (args, err)
        assert f"{bomb}:12:" in err and "aliases" in err and "Traceback" not in err


@pytest.mark.asyncio
async def test_the_engine_refuses_an_alias_bomb_in_a_start_record(system: System) -> None:
    """A start record written by anything but the CLI (an older starter, a hand-made
    message) carries the bomb: the engine fails that execution and goes on."""
    eid = "laughs-1"
    record = StartRecord(execution_id=eid, playbook_path="laughs", playbook_source=_bomb())
    await system.js_publish(system.layout.exec_subject(eid, IN, "start"), encode(record), msg_id=f"{eid}:start")
    _, good_status = await system.run_yaml(BIG_THEN_LEN.replace("2_000_000", "10"))
    assert good_status.state == "COMPLETED"
    status = await system.client.wait(eid, timeout=10)
    assert status.state == "FAILED"
    failed = next(i for i in await system.events(eid) if i.type in TERMINAL_EVENTS)
    assert failed.data["error"]["type"] == "PlaybookInvalid" and "aliases" in failed.data["error"]["message"]
