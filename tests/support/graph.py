"""Playbooks and logs for the execution page's graph and timeline tests (and
bench/ui_graph.py): small playbooks by name, a big one of any size, and a harness
run's log as `Client.events` returns it."""

from __future__ import annotations

from actors.client.logview import LogItem
from tests.harness import Run

HEAD = "apiVersion: actors/v1\nkind: Playbook\nmetadata: {name: %s}\nworkflow:\n"


PY = '{kind: python, code: "def main(): pass"}'


def items_of(run: Run) -> list[LogItem]:
    """A harness run's log as the LogItems `Client.events` returns."""
    return [LogItem(i.seq, i.at, i.cls, i.type, i.step, dict(i.data)) for i in run.items]


def big_playbook(main: int = 100, every: int = 10, side: int = 10) -> str:
    """`main` steps in a chain; every `every`th also starts a side branch of `side`
    steps; every step on the chain has a remediation edge to one cleanup step, and
    some retry. 200 steps (and end, and cleanup) by default."""
    lines = [HEAD % "big"]
    for i in range(main):
        nxt = [f"s{i + 1}"] if i + 1 < main else ["end"]
        if i % every == 0:
            nxt.append(f"b{i}_0")
        retry = "    retry: 3\n" if i % 7 == 0 else ""
        lines.append(f"  - step: s{i}\n    tool: {PY}\n{retry}    on_failure: cleanup\n    next: [{', '.join(nxt)}]\n")
        if i % every == 0:
            for j in range(side):
                after = f"b{i}_{j + 1}" if j + 1 < side else "end"
                lines.append(f"  - step: b{i}_{j}\n    tool: {PY}\n    next: {after}\n")
    lines.append("  - step: cleanup\n")
    return "".join(lines)
