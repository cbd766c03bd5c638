"""What steps print (python stdout/stderr, shell output) is kept per attempt and per
loop iteration, bounded, read back by `Client.outputs` and `actors-cli logs`, shown by
`run` under its step, and never written to the CLI's own stdout (`run --json`)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from actors.tools.capture import OutputBox
from actors.tools.failures import ToolFailure
from actors.tools.pypool import PythonPool
from tests.conftest import System

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]
ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "actors.cli"]

RETRIED = """apiVersion: actors/v1
kind: Playbook
metadata: {name: chatty}
workflow:
  - step: talk
    tool:
      kind: python
      code: |
        import os, sys
        def main(marker):
            first = not os.path.exists(marker)
            open(marker, "a").close()
            print("hello from", "attempt one" if first else "attempt two")
            print("a warning", file=sys.stderr)
            os.system("echo from a subprocess")
            print("after the subprocess")
            if first:
                raise ConnectionError("first attempt fails")
            return 7
    args: {marker: "%s"}
    retry: {max_attempts: 2, backoff: fixed, initial_delay: 0.1}
"""


async def test_python_output_is_kept_per_attempt_in_the_order_printed(system: System) -> None:
    eid, status = await system.run_yaml(RETRIED % (system.tmp / "marker"))
    assert status.state == "COMPLETED"
    outs = await system.client.outputs(eid)
    assert [(o.step, o.attempt_number, o.iteration_index) for o in outs] == [("talk", 1, None), ("talk", 2, None)]
    texts = [await system.client.output_text(o) for o in outs]
    for text, which in zip(texts, ("attempt one", "attempt two"), strict=True):
        # stdout, stderr and a subprocess's output, interleaved as written
        assert text == f"hello from {which}\na warning\nfrom a subprocess\nafter the subprocess\n"
    # the execution's log shows them too (class `out`), before the step ends
    items = await system.events(eid)
    kinds = [(i.cls, i.type) for i in items]
    assert kinds.count(("out", "step.output")) == 2
    first_out = kinds.index(("out", "step.output"))
    assert first_out < kinds.index(("ev", "step.exit"))


async def test_python_output_of_a_step_that_times_out_is_kept(system: System) -> None:
    eid, status = await system.run_yaml("""
apiVersion: actors/v1
kind: Playbook
metadata: {name: slowtalk}
workflow:
  - step: nap
    timeout: 1
    tool:
      kind: python
      code: |
        import time
        def main():
            print("going to sleep", flush=True)
            time.sleep(60)
""")
    assert status.state == "FAILED"
    [out] = await system.client.outputs(eid, step="nap")
    assert out.head == "going to sleep\n"


@pytest.mark.layout(step_output_max_bytes=50_000)
async def test_long_output_keeps_head_and_tail_in_the_event_and_the_text_up_to_the_cap(system: System) -> None:
    eid, status = await system.run_yaml("""
apiVersion: actors/v1
kind: Playbook
metadata: {name: loud}
workflow:
  - step: shout
    tool:
      kind: python
      code: |
        def main():
            for i in range(20000):
                print(f"line {i // 100:03d}.{i % 100:02d}")
            return "done"
""")
    assert status.state == "COMPLETED"
    [out] = await system.client.outputs(eid)
    # no run of 4 digits (MIN_SECRET): the tool actor's redactor is the process's, and a
    # number another test's credential held (a postgres port from `free_port`, 10768-32767)
    # would be masked here as `***` (CI saw `line 19700` masked in the tail)
    printed = "".join(f"line {i // 100:03d}.{i % 100:02d}\n" for i in range(20000))
    assert out.size == len(printed) and out.stored == 50_000
    assert out.head == printed[:4096] and out.tail == printed[-4096:]
    text = await system.client.output_text(out)
    assert text.startswith(printed[:50_000])
    assert f"{len(printed) - 50_000:,} more bytes not kept" in text
    assert text.endswith("line 199.98\nline 199.99\n")


async def test_shell_output_is_kept(system: System) -> None:
    eid, status = await system.run_yaml("""
apiVersion: actors/v1
kind: Playbook
metadata: {name: sh}
workflow:
  - step: sh
    tool: {kind: shell, command: "echo out; echo err >&2; exit 3"}
""")
    assert status.state == "FAILED"
    [out] = await system.client.outputs(eid, step="sh")
    assert await system.client.output_text(out) == "out\nerr\n"


@pytest.mark.parametrize("mode", ["async", "chunked"])
async def test_loop_iterations_keep_their_output_in_the_loop_stream(system: System, mode: str) -> None:
    eid, status = await system.run_yaml(f"""
apiVersion: actors/v1
kind: Playbook
metadata: {{name: loopy-{mode}}}
workflow:
  - step: each
    tool:
      kind: python
      code: |
        def main(x):
            print("item", x)
            return x
    args: {{x: "{{{{ n }}}}"}}
    loop: {{collection: "{{{{ range(6) | list }}}}", element: n, mode: {mode}, chunk_size: 4}}
""")
    assert status.state == "COMPLETED"
    outs = await system.client.outputs(eid, step="each")
    assert sorted((o.iteration_index, o.head) for o in outs) == [(i, f"item {i}\n") for i in range(6)]
    # nothing of it in the execution's own log: it does not grow with the loop
    assert not [i for i in await system.events(eid) if i.cls == "out"]


async def test_a_step_that_prints_nothing_has_no_output(system: System) -> None:
    eid, status = await system.run_yaml("""
apiVersion: actors/v1
kind: Playbook
metadata: {name: quiet}
workflow:
  - step: hush
    tool: {kind: python, code: "def main(): return 1"}
""")
    assert status.state == "COMPLETED"
    assert await system.client.outputs(eid) == []


# --- the python pool --------------------------------------------------------------------


async def test_a_worker_prints_into_the_calls_box_never_to_the_pods_streams(capfd: pytest.CaptureFixture[str]) -> None:
    pool = PythonPool(size=1)
    try:
        code = "import os, sys\ndef main(n):\n    print('out', n)\n    os.write(2, b'raw fd 2\\n')\n    return n\n"
        for n in (1, 2):
            box = OutputBox(cap=1000)
            assert await pool.run(code, {"n": n}, output=box) == n
            assert box.captured is not None
            assert box.captured.kept == f"out {n}\nraw fd 2\n".encode()  # each call its own, not the last one's
    finally:
        await pool.close()
    seen = capfd.readouterr()
    assert seen.out == "" and seen.err == ""


async def test_a_worker_that_cannot_start_says_what_it_wrote(tmp_path: Path) -> None:
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'ModuleNotFoundError: no module named nowhere' >&2\nexit 1\n")
    broken.chmod(0o755)
    pool = PythonPool(size=1, python=str(broken))
    try:
        with pytest.raises(ToolFailure) as caught:
            await pool.run("def main(): return 1", {}, timeout=10)
    finally:
        await pool.close()
    assert caught.value.type == "WorkerCrashed"
    assert "died while starting (exit code 1): ModuleNotFoundError: no module named nowhere" in str(caught.value)


# --- the CLI ---------------------------------------------------------------------------


async def cli(system: System, *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "NATS_URL": system.server.url, "ACTORS_PARTITIONS": str(system.layout.partitions)}
    proc = await asyncio.create_subprocess_exec(
        *CLI, *args, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


PRINTS = """apiVersion: actors/v1
kind: Playbook
metadata: {name: prints}
workflow:
  - step: greet
    tool:
      kind: python
      code: |
        import sys
        def main():
            print("hello from print")
            print("{not json", file=sys.stderr)
            return {"ok": True}
    next: shout
  - step: shout
    tool: {kind: shell, command: "echo shouting"}
"""


async def test_run_json_embedded_prints_only_json_on_stdout(tmp_path: Path) -> None:
    """Without --nats the python workers are the CLI's own children: what they print
    must still not reach its stdout."""
    pb = tmp_path / "prints.yaml"
    pb.write_text(PRINTS)
    env = {**os.environ, "NATS_URL": ""}
    proc = await asyncio.create_subprocess_exec(
        *CLI,
        "run",
        str(pb),
        "--json",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert lines and [json.loads(line)["state"] for line in lines] == ["COMPLETED"]
    assert "hello from print" not in out.decode() + err.decode()


async def test_logs_prints_each_step_attempt(system: System) -> None:
    pb = system.tmp / "prints.yaml"
    pb.write_text(PRINTS)
    code, out, err = await cli(system, "run", str(pb), "--json", "--execution-id", "prints-1")
    assert code == 0, err
    assert [json.loads(line)["state"] for line in out.splitlines()] == ["COMPLETED"]

    code, out, err = await cli(system, "logs", "prints-1")
    assert code == 0, err
    assert out.splitlines() == [
        "== greet  attempt 1  (27 bytes) ==",
        "hello from print",
        "{not json",
        "== shout  attempt 1  (9 bytes) ==",
        "shouting",
    ]
    code, out, err = await cli(system, "logs", "prints-1", "--step", "shout", "--json")
    assert code == 0, err
    [obj] = [json.loads(line) for line in out.splitlines()]
    assert obj["step"] == "shout" and obj["text"] == "shouting\n" and obj["attempt"] == 1

    code, out, err = await cli(system, "logs", "never-started", "--timeout", "5")
    assert code == 3 and "no execution 'never-started'" in err and out == ""


async def test_run_shows_output_under_its_step_and_logs_follow_ends_with_the_execution(system: System) -> None:
    pb = system.tmp / "prints.yaml"
    pb.write_text(PRINTS)
    code, out, err = await cli(system, "run", str(pb), "--execution-id", "prints-2")
    assert code == 0, err
    lines = out.splitlines()
    greet = next(i for i, line in enumerate(lines) if " greet " in line)
    assert lines[greet + 1 : greet + 3] == ["    | hello from print", "    | {not json"]
    shout = next(i for i, line in enumerate(lines) if " shout " in line)
    assert lines[shout + 1] == "    | shouting"

    slow = system.tmp / "slow.yaml"
    slow.write_text("""apiVersion: actors/v1
kind: Playbook
metadata: {name: slowprint}
workflow:
  - step: first
    tool: {kind: shell, command: "echo one"}
    next: wait
  - step: wait
    tool: {kind: sleep, seconds: 1}
    next: last
  - step: last
    tool: {kind: shell, command: "echo two"}
""")
    entry = await system.client.register(slow)
    eid = await system.client.start(entry.path, version=entry.version, execution_id="follow-1")
    code, out, err = await cli(system, "logs", eid, "--follow")
    assert code == 0, err
    assert [line for line in out.splitlines() if not line.startswith("==")] == ["one", "two"]


async def test_run_shows_each_iterations_output_under_a_loop_step(system: System) -> None:
    pb = system.tmp / "loop.yaml"
    pb.write_text("""apiVersion: actors/v1
kind: Playbook
metadata: {name: loopprint}
workflow:
  - step: each
    tool:
      kind: python
      code: |
        def main(x):
            print("item", x)
            return x
    args: {x: "{{ n }}"}
    loop: {collection: [0, 1, 2], element: n}
""")
    code, out, err = await cli(system, "run", str(pb))
    assert code == 0, err
    lines = out.splitlines()
    each = next(i for i, line in enumerate(lines) if " each " in line)
    assert lines[each + 1 : each + 7] == [
        "    each[0]  attempt 1  (7 bytes)",
        "    | item 0",
        "    each[1]  attempt 1  (7 bytes)",
        "    | item 1",
        "    each[2]  attempt 1  (7 bytes)",
        "    | item 2",
    ]


async def test_an_engine_replaying_a_log_with_output_decides_the_same(system: System) -> None:
    """Output entries sit in the execution's log: a replay (a new engine) reads past them."""
    entry_file = system.tmp / "replay.yaml"
    entry_file.write_text("""apiVersion: actors/v1
kind: Playbook
metadata: {name: replayprint}
workflow:
  - step: talk
    tool:
      kind: python
      code: |
        def main():
            print("before the restart")
            return 2
    next: nap
  - step: nap
    tool: {kind: sleep, seconds: 1}
    next: double
  - step: double
    args: {v: "{{ talk * 2 }}"}
""")
    entry = await system.client.register(entry_file)
    eid = await system.client.start(entry.path, version=entry.version)
    async for item in system.client.follow(eid):
        if item.type == "step.enter" and item.step == "nap":
            break
    await system.restart_roles(("engine",))
    status = await system.client.wait(eid, timeout=30)
    assert status.state == "COMPLETED"
    [out] = await system.client.outputs(eid)
    assert out.head == "before the restart\n"
    terminal = [i for i in await system.events(eid) if i.type == "playbook.completed"]
    assert await system.client.result(terminal[0]) == {"double": {"v": 4}}
