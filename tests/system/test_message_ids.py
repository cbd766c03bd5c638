"""Every message in the logs carries the message id its builder in streams/ids.py
gives: de-duplication of a re-send (a replay, a second actor answering the same
command) works only while every writer spells an id the same way. The playbook
touches every writer: starter, engine (commands, records, lifecycle, timers, a child
execution and its answer, a loop, answer records: a result or the start stored with
its decision), counter (spec, iteration timers, verdict), tool actors (results alone
and in batches, what steps print), a cancel from the client, and a retry's link into
the retried execution's log."""

from __future__ import annotations

import msgspec
import pytest
from nats.aio.msg import Msg

from actors.natsio import private
from actors.wire.events import decision_decoder
from actors.wire.messages import command_of_record_answer, start_of_record_answer
from streams import ids
from streams.subjects import class_of, loop_class, loop_key, loop_type, type_of
from tests.conftest import System, wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]

CHILD = """apiVersion: actors/v1
kind: Playbook
metadata: {name: child, path: lib/ids-child}
workflow:
  - step: work
    tool: {kind: noop}
    args: {n: "{{ workload.n }}"}
"""

FLAKY = """
        import os
        def main(n, d):
            p = f"{d}/{n}"
            first = not os.path.exists(p)
            open(p, "a").write("x")
            print("attempt", "one" if first else "again")  # output: a writer of its own (class `out`)
            if n == 1 and first:
                raise ConnectionError("flaky once")
            return n"""


def parent(marks: str) -> str:
    """A step that fails once then succeeds on a delayed retry, then a loop (one
    iteration retried after a delay) beside a child execution."""
    code = FLAKY.replace("\n        ", "\n        ")
    return f"""apiVersion: actors/v1
kind: Playbook
metadata: {{name: parent, path: lib/ids-parent}}
workflow:
  - step: flaky
    tool:
      kind: python
      code: |{code}
    args: {{n: 1, d: "{marks}/step"}}
    retry:
      - when: "{{{{ error is not none }}}}"
        then: {{max_attempts: 3, backoff: fixed, initial_delay: 0.3}}
    next: [{{then: [fan, child]}}]
  - step: fan
    tool:
      kind: python
      code: |{code}
    args: {{n: "{{{{ n }}}}", d: "{marks}/loop"}}
    loop: {{collection: "{{{{ range(4) | list }}}}", element: n, concurrency: 4}}
    retry:
      - when: "{{{{ error is not none }}}}"
        then: {{max_attempts: 3, backoff: fixed, initial_delay: 0.3}}
  - step: child
    tool: {{kind: playbook, path: lib/ids-child}}
    args: {{n: 4}}
"""


# a first step that is a loop: its first decision hands a loop over, which no answer
# record holds, so its start record is stored plain (semantics 6 stores the others' with
# their first decision)
LOOP_FIRST = """apiVersion: actors/v1
kind: Playbook
metadata: {name: loop-first, path: lib/ids-loop-first}
workflow:
  - step: each
    tool: {kind: noop}
    loop: {collection: "{{ [1, 2] }}", element: n}
"""


HANG = """apiVersion: actors/v1
kind: Playbook
metadata: {name: hang, path: lib/ids-hang}
workflow:
  - step: wait
    tool: {kind: sleep, seconds: 30}
"""


async def _running(system: System, eid: str) -> bool:
    status = await system.client.status(eid)
    return status is not None and status.state == "RUNNING"


def _expected_exec(eid: str, subject: str, data: bytes) -> str:
    cls, kind = class_of(subject), type_of(subject)
    head, _, rest = kind.partition(".")
    if cls == "in":
        return {
            "start": lambda: ids.start_record_id(eid),
            # the command named by the subject, or in the result (semantics 4: one subject for all)
            "result": lambda: ids.result_id(eid, rest or msgspec.json.decode(data)["command_id"]),
            # the loop named by the subject, or in the verdict (semantics 4: one subject for all)
            "iterator": lambda: ids.verdict_id(eid, rest or msgspec.json.decode(data)["loop_id"]),
            "cancel": lambda: ids.cancel_id(eid),
            "timer": lambda: ids.timer_id_msg(ids.timer_owner(eid), rest),
            "fault": lambda: ids.fault_id(eid, msgspec.json.decode(data)["input_seq"]),
            "retried": lambda: ids.retried_id(eid, msgspec.json.decode(data)["retry_execution_id"]),
            # a result stored with its decision (semantics 5): the result's id; the start
            # stored with its first decision (semantics 6): the start record's
            "answer": lambda: (
                ids.start_record_id(eid)
                if start_of_record_answer(data) is not None
                else ids.result_id(eid, command_of_record_answer(data) or "")
            ),
        }[head]()
    if cls == "ev":
        return ids.decision_id(eid, decision_decoder.decode(data).cause)
    if cls == "lc":  # `lc.<type>[.cmd.<kind>]`: the event's type names it
        return ids.lifecycle_id(eid, kind.split(".cmd.", 1)[0])
    if cls == "out":
        return ids.output_id(eid, kind)
    assert cls == "sch", subject
    return ids.schedule_id(ids.timer_owner(eid), kind)


def _expected_loop(subject: str, msg_id: str) -> str:
    eid, loop_id = loop_key(subject)
    cls, kind = loop_class(subject), loop_type(subject)
    owner = ids.timer_owner(eid, loop_id)
    if cls == "sch":
        return ids.schedule_id(owner, kind)
    head, _, rest = kind.partition(".")
    if cls == "out":
        return ids.output_id(eid, head, int(rest) if rest else None)
    if kind == "res.batch":
        return ids.result_batch_id(eid, loop_id, msg_id.rsplit(":", 1)[-1])
    return {
        "spec": lambda: ids.loop_spec_id(eid, loop_id),
        "res": lambda: ids.result_id(eid, rest),
        "cancel": lambda: ids.loop_cancel_id(eid, loop_id),
        "timer": lambda: ids.timer_id_msg(owner, rest),
    }[head]()


def _expected_other(subject: str, data: bytes) -> str:
    if subject == "start":
        return ids.start_id(msgspec.json.decode(data)["execution_id"])
    _, _, eid, command_id = subject.split(".", 3)
    return ids.command_msg_id(eid, command_id)


async def test_every_message_carries_the_id_its_builder_gives(system: System) -> None:
    # every message published to a stream, as it is published (a schedule is purged
    # from the log once it fires, a command once it is done: the log alone misses them)
    seen: list[tuple[str, bytes, dict[str, str]]] = []

    async def capture(msg: Msg) -> None:
        seen.append((msg.subject, msg.data, dict(msg.headers or {})))

    subs = [await system.nc.subscribe(f, cb=capture) for f in ("exec.>", "loop.>", "cmd.>", "start")]
    child = system.tmp / "child.yaml"
    child.write_text(CHILD)
    await system.client.register(child)
    for d in ("step", "loop"):
        (system.tmp / d).mkdir()
    _, status = await system.run_yaml(parent(str(system.tmp)), timeout=60)
    assert status.state == "COMPLETED"
    _, status = await system.run_yaml(LOOP_FIRST)
    assert status.state == "COMPLETED"
    hang = await system.start_yaml(HANG)
    await wait_for(lambda: _running(system, hang))
    await system.client.cancel(hang, "test")
    assert (await system.client.wait(hang, timeout=20)).state == "CANCELLED"
    retry = await system.client.retry(hang, from_step="wait")  # the starter links the old log
    await wait_for(lambda: _running(system, retry.execution_id))
    await system.client.cancel(retry.execution_id, "test")
    assert (await system.client.wait(retry.execution_id, timeout=20)).state == "CANCELLED"
    await system.engine_idle()
    await private.flush(system.nc)
    for sub in subs:
        await sub.unsubscribe()

    checked: set[str] = set()  # kinds of message seen
    for subject, data, headers in seen:
        msg_id = headers.get("Nats-Msg-Id", "")
        if "Nats-Scheduler" in headers:
            continue  # delivered by the server from a schedule: its id is the server's
        if subject.startswith("exec."):
            want = _expected_exec(subject.split(".", 3)[2], subject, data)
            cls = class_of(subject)
            kind = cls if cls in ("sch", "out") else f"{cls}.{type_of(subject).split('.')[0]}"
        elif subject.startswith("loop."):
            want = _expected_loop(subject, msg_id)
            cls = loop_class(subject)
            kind = f"loop.{cls}" if cls in ("sch", "out") else f"loop.{cls}.{loop_type(subject).split('.')[0]}"
        else:
            want, kind = _expected_other(subject, data), subject.split(".")[0]
        assert msg_id == want, (subject, headers)
        checked.add(kind)
    # every writer was met: a kind missing here means the playbook no longer exercises it
    assert {
        "start",
        "cmd",
        "in.start",
        "in.answer",  # a result (5) or the start (6) stored with its decision
        "in.result",
        "in.iterator",
        "in.cancel",
        "in.retried",
        "ev.decision",
        "ev.cmd",  # a decision record holding its one command (semantics 2)
        "lc.playbook",  # carrying `workflow.*` beside it: one message per decision (semantics 2)
        "lc.execution",
        "sch",
        "loop.in.spec",
        "loop.in.res",
        "loop.sch",
        "out",
        "loop.out",
    } <= checked
