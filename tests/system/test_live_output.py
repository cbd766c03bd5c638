"""What a step prints reaches `actors-cli run`, `logs --follow` and `logs` while the step
still runs (python and shell), within the cap, and a command run again after a
redelivery shows its own run's lines once, never mixed with the first run's.

Each step waits for a file the test creates only once it has read the step's first line
through the CLI: the line cannot have come from the step's end."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from actors.client.outputs import RunningOutput
from actors.wire.codec import CLEAR
from actors.wire.events import StepOutput, StepOutputPart
from streams.ids import output_delivery_id, output_part_id
from tests.conftest import System

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]
ROOT = Path(__file__).resolve().parents[2]

TWO_STEPS = """apiVersion: actors/v1
kind: Playbook
metadata: {name: live}
workflow:
  - step: py
    tool:
      kind: python
      code: |
        import os, sys, time
        def main(gate):
            print("py one")
            print("py warns", file=sys.stderr)
            while not os.path.exists(gate):
                time.sleep(0.02)
            print("py two")
            return 1
    args: {gate: "%(a)s"}
    next: [sh]
  - step: sh
    tool:
      kind: shell
      command: "echo sh one; echo sh err >&2; while [ ! -e %(b)s ]; do sleep 0.02; done; echo sh two"
"""


def _env(system: System) -> dict[str, str]:
    return {**os.environ, "NATS_URL": system.server.url, "ACTORS_PARTITIONS": str(system.layout.partitions)}


async def _spawn(system: System, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "actors.cli",
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_env(system),
    )


async def _cli(system: System, *args: str) -> tuple[int, str, str]:
    proc = await _spawn(system, *args)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def _until(proc: asyncio.subprocess.Process, wanted: str, seen: list[str]) -> None:
    """Read `proc`'s stdout lines into `seen` until one is `wanted`."""
    assert proc.stdout is not None
    while True:
        line = await proc.stdout.readline()
        assert line, f"ended before printing {wanted!r}: {seen}"
        seen.append(line.decode().rstrip("\n"))
        if seen[-1] == wanted:
            return


async def test_python_and_shell_output_reaches_run_and_logs_follow_while_the_step_runs(system: System) -> None:
    pb = system.tmp / "live.yaml"
    pb.write_text(TWO_STEPS % {"a": system.tmp / "a", "b": system.tmp / "b"})
    run = await _spawn(system, "run", str(pb), "--execution-id", "live-1")
    ran: list[str] = []
    await asyncio.wait_for(_until(run, "    py | py one", ran), 60)
    follow = await _spawn(system, "logs", "live-1", "--follow")
    followed: list[str] = []
    await asyncio.wait_for(_until(follow, "py one", followed), 60)
    assert followed[0] == "== py  attempt 1  (running) =="

    # `logs` without --follow: the running step's text so far
    [now] = await system.client.outputs("live-1")
    assert isinstance(now, RunningOutput) and now.head.startswith("py one\n")
    code, out, err = await _cli(system, "logs", "live-1", "--step", "py")
    assert code == 0, err
    assert out.splitlines()[0].startswith("== py  attempt 1  (running: ") and "py one" in out.splitlines()
    code, out, err = await _cli(system, "logs", "live-1", "--step", "nosuch")
    assert (code, out) == (3, "") and err.count("\n") == 1 and "no step 'nosuch'" in err, err

    (system.tmp / "a").touch()
    await asyncio.wait_for(_until(run, "    sh | sh one", ran), 60)
    await asyncio.wait_for(_until(follow, "sh one", followed), 60)
    (system.tmp / "b").touch()
    rest, err_b = await asyncio.wait_for(follow.communicate(), 60)
    assert follow.returncode == 0, err_b
    followed += rest.decode().splitlines()
    run_rest, run_err = await asyncio.wait_for(run.communicate(), 60)
    assert run.returncode == 0, run_err
    ran += run_rest.decode().splitlines()

    # every line once, in the order printed (python: stdout and stderr interleaved; shell: as they came)
    assert followed == [
        "== py  attempt 1  (running) ==",
        "py one",
        "py warns",
        "py two",
        "== sh  attempt 1  (running) ==",
        "sh one",
        "sh err",
        "sh two",
    ], followed
    printed = [line for line in ran if " | " in line]
    assert printed == [f"    {line}" for line in ("py | py one", "py | py warns", "py | py two")] + [
        f"    {line}" for line in ("sh | sh one", "sh | sh err", "sh | sh two")
    ], ran
    # once ended, the kept output is what it always was, and says it was streamed
    outs = await system.client.outputs("live-1")
    assert [type(o) for o in outs] == [StepOutput, StepOutput]
    assert [await system.client.output_text(o) for o in outs] == [
        "py one\npy warns\npy two\n",
        "sh one\nsh err\nsh two\n",
    ]
    assert all(o.parts >= 2 and o.delivery == 1 for o in outs), outs


BIG = """apiVersion: actors/v1
kind: Playbook
metadata: {name: big}
workflow:
  - step: big
    tool:
      kind: python
      code: |
        import os, time
        def main(gate):
            for i in range(50):
                print(f"line {i:05d}")
            while not os.path.exists(gate):
                time.sleep(0.02)
            for i in range(50, 1050):
                print(f"line {i:05d}")
            return 1
    args: {gate: "%s"}
"""


@pytest.mark.layout(step_output_max_bytes=2000)
async def test_live_output_keeps_the_cap_and_a_command_run_again_shows_its_own_lines_once(system: System) -> None:
    eid = await system.start_yaml(BIG % (system.tmp / "gate"))
    texts: list[str] = []
    ends: list[StepOutput] = []

    async def follow() -> None:
        async for p in system.client.follow_printed(eid):
            texts.append(p.text)
            if isinstance(p.record, StepOutput):
                ends.append(p.record)
            elif not (system.tmp / "gate").exists():
                (system.tmp / "gate").touch()  # its first part came while it waits: let it print the rest

    await asyncio.wait_for(follow(), 60)
    whole = "".join(f"line {i:05d}\n" for i in range(1050))
    [end] = ends
    assert end.parts >= 2 and end.size == len(whole) and end.stored == 2000
    shown = "".join(texts)
    # the parts are the first 2,000 bytes exactly, then what `logs` says of a cut text
    assert shown.startswith(whole[:2000] + f"\n... {len(whole) - 2000:,} more bytes not kept")
    assert shown.endswith(whole[-4096:])
    assert shown == await system.client.output_text(end)

    # A command delivered again after its pod died runs again: parts and a step.output of
    # its own delivery (written here as the tool actor writes them), beside the first
    # run's; a part sent twice is stored once.
    subject = f"{system.layout.execution(eid).prefix}.out.9-1"

    async def put(o: StepOutput | StepOutputPart, msg_id: str) -> None:
        await system.js_publish(subject, CLEAR.encode(o), msg_id=msg_id)

    common: dict[str, Any] = {"execution_id": eid, "step": "big", "command_id": "9-1"}
    for delivery, lines in ((1, ["one a\n", "one b\n"]), (2, ["two a\n", "two b\n", "two c\n"])):
        for n, line in enumerate(lines):
            part = StepOutputPart(**common, delivery=delivery, part=n, text=line, at=float(delivery * 10 + n))
            await put(part, output_part_id(eid, "9-1", None, delivery, n))
    again = StepOutputPart(**common, delivery=1, part=0, text="one a\n", at=10.0)
    await put(again, output_part_id(eid, "9-1", None, 1, 0))  # the same part once more
    final = StepOutput(**common, delivery=2, parts=3, size=18, head="two a\ntwo b\ntwo c\n", at=30.0)
    await put(final, output_delivery_id(eid, "9-1", None, 2))

    # a run whose second part could not be stored: its step.output says how many bytes
    # at its end the parts miss, and the followed view shows them after the parts
    c2: dict[str, Any] = {**common, "command_id": "9-2", "delivery": 1}
    await put(StepOutputPart(**c2, part=0, text="kept a\n", at=40.0), output_part_id(eid, "9-2", None, 1, 0))
    await put(
        StepOutput(**c2, parts=1, rest=7, size=14, head="kept a\nkept b\n", at=41.0),
        output_delivery_id(eid, "9-2", None, 1),
    )
    printed2 = [p async for p in system.client.follow_printed(eid) if p.record.command_id == "9-2"]
    assert "".join(p.text for p in printed2) == "kept a\nkept b\n"

    outs = [o for o in await system.client.outputs(eid) if o.command_id == "9-1"]
    assert [(o.delivery, o.head) for o in outs] == [(2, "two a\ntwo b\ntwo c\n")]
    printed = [p async for p in system.client.follow_printed(eid) if p.record.command_id == "9-1"]
    assert "".join(p.text for p in printed) == "one a\none b\ntwo a\ntwo b\ntwo c\n"
    assert [p.again for p in printed if p.begins] == [False, True]
    code, out, err = await _cli(system, "logs", eid, "--step", "big", "--json")
    assert code == 0, err
    [mine] = [json.loads(line) for line in out.splitlines() if json.loads(line)["command_id"] == "9-1"]
    assert mine["text"] == "two a\ntwo b\ntwo c\n"


TOKEN = "tok-Wq3vN8-live"  # credential `api` (ACTORS_CREDENTIAL_API): 15 bytes
SPLIT = """apiVersion: actors/v1
kind: Playbook
metadata: {name: split}
workflow:
  - step: split
    tool:
      kind: shell
      credential: api
      command: >-
        echo start; printf "%%s" "$TOKEN" | head -c 8;
        while [ ! -e %(a)s ]; do sleep 0.02; done;
        printf "%%s" "$TOKEN" | tail -c +9; echo " end";
        while [ ! -e %(b)s ]; do sleep 0.02; done; echo after
"""
AT_CAP = """apiVersion: actors/v1
kind: Playbook
metadata: {name: atcap}
workflow:
  - step: atcap
    tool:
      kind: shell
      credential: api
      command: >-
        for i in $(seq 1 999); do echo 12345678; done; printf 12;
        printf "%%s" "$TOKEN"; while [ ! -e %(c)s ]; do sleep 0.02; done; echo more
"""


async def test_no_part_holds_a_credential_split_by_a_tick_or_the_cap_and_follow_shows_what_logs_shows(
    nats_server: Any, tmp_path: Path
) -> None:
    """A value printed half before a part is due and half after, and a value cut by the
    cap, never reach a part: the followed text is `logs`' text, masks and all, to its end."""
    from actors.config.settings import Settings
    from tests.conftest import make_layout, running_system

    settings = Settings(python_workers=1, credentials={"API": TOKEN})
    # 999 lines of 9 bytes and "12": the cap falls 6 bytes into the value
    layout = make_layout(step_output_max_bytes=9000)
    async with running_system(nats_server, tmp_path, layout=layout, settings=settings) as system:
        gates = {k: tmp_path / k for k in "abc"}

        async def follow(eid: str, opens: dict[str, Path]) -> tuple[list[str], list[str], StepOutput]:
            texts: list[str] = []
            parts: list[str] = []
            async for p in system.client.follow_printed(eid):
                texts.append(p.text)
                if isinstance(p.record, StepOutput):
                    return texts, parts, p.record
                parts.append(p.text)
                for seen, gate in opens.items():
                    if seen in "".join(parts):
                        gate.touch()  # the step goes on once the part before was seen
            raise AssertionError(f"no step.output for {eid}: {texts}")

        split = await system.start_yaml(SPLIT % gates)
        cap = await system.start_yaml(AT_CAP % gates)
        (texts, parts, end), (cap_texts, cap_parts, cap_end) = await asyncio.wait_for(
            asyncio.gather(
                follow(split, {"start\n": gates["a"], "end\n": gates["b"]}), follow(cap, {"\n12": gates["c"]})
            ),
            60,
        )
        # split: the first part ("start") came while the value's first half waited
        assert parts[0] == "start\n" and end.parts >= 2
        followed = "".join(texts)
        assert followed == "start\n*** end\nafter\n" == await system.client.output_text(end)
        # cut by the cap: the kept text ends with a mask where the value's start was
        kept = "12345678\n" * 999 + "12***"
        assert "".join(cap_parts) == kept and cap_end.parts >= 2
        assert "".join(cap_texts) == await system.client.output_text(cap_end)
        # 8,993 + 15 + 5 bytes printed, 9,000 kept
        assert "".join(cap_texts).startswith(kept + "\n... 13 more bytes not kept")
        for text in parts + cap_parts:
            for secret in (TOKEN[:4], TOKEN[:8], TOKEN[8:], TOKEN[-4:]):
                assert secret not in text, (secret, text)
