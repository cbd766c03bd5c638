"""Where a step's command is answered, by the semantics its execution started under
(docs/upgrades.md, semantics 4): from 4 on, on the execution's one results subject
(`exec.<p>.<id>.in.result`, the command named in the answer), a child playbook's end
too; before, on a subject per command (`in.result.<command>`), as the logs of those
executions hold them (tests/corpus). Either way the execution decides the same and
replays to it. No NATS: the harness plays the log and the tools."""

from __future__ import annotations

from typing import Any

import pytest

from actors.core.replay import SEMANTICS
from tests.harness import Call, Fail, Stamped, replay
from tests.harness.folds import exec_subjects

pytestmark = [pytest.mark.timeout(30)]

HEAD = "apiVersion: actors/v1\nkind: Playbook\nmetadata: {name: %s}\nworkflow:\n"
PY = '{kind: python, code: "def main(): pass"}'

PARENT = (
    HEAD % "parent"
    + f"""
  - step: flaky
    tool: {PY}
    on_error:
      - when: "{{{{ attempt < 2 }}}}"
        decision: retry
    next: delegate
  - step: delegate
    tool: {{kind: playbook, path: lib/child}}
    args: {{n: "{{{{ flaky }}}}"}}
"""
)
CHILD = HEAD % "child" + f'  - step: work\n    tool: {PY}\n    args: {{n: "{{{{ workload.n }}}}"}}\n'


def flaky(call: Call) -> int:
    if call.attempt == 1:
        raise Fail("ValueError", "first time")
    return 2


def replies(outputs: list[dict[str, Any]]) -> dict[str, str]:
    """command id -> where its answer goes, for every command and child start decided."""
    found: dict[str, str] = {}
    for out in outputs:
        found |= {c["command_id"]: c.get("answer_on") or c["reply_to"] for c in out["commands"]}
        found |= {s["parent"]["command_id"]: s["parent"]["reply_to"] for s in out["starts"]}
    return found


def own_subjects(outputs: list[dict[str, Any]]) -> dict[str, str]:
    """command id -> its `reply_to`, where a tool pod older than semantics 4 answers it."""
    return {c["command_id"]: c["reply_to"] for out in outputs for c in out["commands"]}


@pytest.mark.parametrize("semantics", [3, SEMANTICS])
def test_commands_are_answered_where_the_executions_semantics_says(semantics: int) -> None:
    h = Stamped(
        {"flaky": flaky, "work": lambda call: int(call.args["n"]) * 10},
        playbooks={"lib/child": CHILD},
        semantics=semantics,
    )
    run = h.run(PARENT)
    assert run.status == "COMPLETED" and run.result == {"delegate": {"work": 20}}
    [child_id] = run.children
    subjects, child = exec_subjects(run.execution_id), h.runs[child_id]
    sent = replies(run.outputs)
    assert len(sent) == 3  # flaky twice, then the child's start
    # whatever the semantics, a command names a subject of its own, where an older tool
    # pod answers it (docs/upgrades.md: tool pods roll in any order)
    assert own_subjects(run.outputs) == {c: subjects.result(c) for c in own_subjects(run.outputs)}
    if semantics >= 4:
        assert set(sent.values()) == {subjects.results}
        assert set(replies(child.outputs).values()) == {exec_subjects(child_id).results}
    else:
        assert sent == {c: subjects.result(c) for c in sent}
        assert all(r == exec_subjects(child_id).result(c) for c, r in replies(child.outputs).items())
    assert replay(run) and replay(child)


LOOPS = (
    HEAD % "loops"
    + f"""
  - step: each
    tool: {PY}
    loop: {{collection: "{{{{ [1, 2, 3] }}}}", element: n}}
    next: again
  - step: again
    tool: {PY}
    loop: {{collection: "{{{{ [4, 5] }}}}", element: n}}
"""
)


@pytest.mark.parametrize("semantics", [3, SEMANTICS])
def test_loop_verdicts_go_where_the_executions_semantics_says(semantics: int) -> None:
    """From 4 on a loop's spec names the execution's one subject for every loop's
    verdict (`answer_on`, `in.iterator`), beside the loop's own (`reply_to`, where an
    older counter sends it); before, only the loop's own."""
    h = Stamped({"each": lambda call: call.element, "again": lambda call: call.element}, semantics=semantics)
    run = h.run(LOOPS)
    assert run.status == "COMPLETED"
    specs = [spec for out in run.outputs for spec in out["loops"]]
    subjects = exec_subjects(run.execution_id)
    assert len(specs) == 2
    assert all(spec["reply_to"] == subjects.iterator(spec["loop_id"]) for spec in specs)
    assert [spec.get("answer_on") for spec in specs] == [subjects.input("iterator") if semantics >= 4 else None] * 2
    assert replay(run)
