"""PLACEHOLDER until engineer "ui-graph"'s branch is merged (it replaces this file): the
playbook as a graph, one node per step in a column, no edges, each node's state from
the execution's log. Signatures and JSON shape are the contract's (issue 14)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from actors.client import LogItem
from actors.playbook.model import Playbook
from actors.wire import LoopProgress

NODE_W, NODE_H, GAP = 180.0, 44.0, 20.0


def playbook_graph(playbook: Playbook) -> dict[str, Any]:
    """The playbook's structure: a node per step, laid out in one column."""
    nodes = []
    for i, step in enumerate(playbook.workflow):
        kind = "loop" if step.loop is not None else str(step.tool.__struct_config__.tag)
        nodes.append(
            {
                "id": step.step,
                "label": step.step,
                "kind": kind,
                "state": "pending",
                "x": GAP,
                "y": GAP + i * (NODE_H + GAP),
                "w": NODE_W,
                "h": NODE_H,
                "attempts": 0,
                "loop": None,
            }
        )
    return {"nodes": nodes, "edges": [], "width": NODE_W + 2 * GAP, "height": GAP + len(nodes) * (NODE_H + GAP)}


_EXIT_STATES = {"COMPLETED": "completed", "FAILED": "failed", "CANCELLED": "cancelled"}


def execution_graph(playbook: Playbook, items: list[LogItem], loops: Mapping[str, LoopProgress]) -> dict[str, Any]:
    """The structure with each node's state (from step.enter/step.exit) and loop counters."""
    graph = playbook_graph(playbook)
    by_id = {n["id"]: n for n in graph["nodes"]}
    for item in items:
        node = by_id.get(item.step or "")
        if node is None:
            continue
        if item.type == "step.enter":
            node["state"] = "running"
        elif item.type == "step.exit":
            node["state"] = _EXIT_STATES.get(str(item.data.get("status")), "completed")
        elif item.type == "command.issued":
            node["attempts"] = max(node["attempts"], int(item.data.get("attempt_number") or 1))
        elif item.type == "iterator.started":
            node["loop"] = {"done": 0, "total": item.data.get("size"), "in_flight": 0, "failed": 0, "rate": None}
        elif item.type in ("iterator.completed", "iterator.failed") and node["loop"] is not None:
            total = int(item.data.get("total") or node["loop"]["total"] or 0)
            node["loop"].update(done=total, total=total, failed=int(item.data.get("failed") or 0), in_flight=0)
    for p in loops.values():
        node = by_id.get(p.step)
        if node is not None and node["state"] == "running":
            node["loop"] = {"done": p.done, "total": p.total, "in_flight": p.in_flight, "failed": p.failed}
            node["loop"]["rate"] = None
    return graph
