"""A playbook as a graph for the execution page: its steps as nodes, its routes as
edges, laid out left to right (actors/ui/layout.py), coloured by an execution's log.

`playbook_graph(playbook)` is the structure, the same for every execution of one
playbook version; `execution_graph(playbook, items, loops)` adds each node's state,
attempts and loop progress from an execution's log (`Client.events(id)`) and live loop
progress (`Client.progress(id)`). Both return plain JSON data:

* a node per step (`id` is the step's name): `kind` is `end`, `loop` (a step with a
  `loop`, whatever its tool: one node however many iterations, with `loop` progress),
  or its tool's kind (`playbook`: a child execution, `child` names its playbook and
  `children` the executions started); `x, y` its top-left corner, `w, h` its size;
  `retry` and `on_error` summarise its retry rules and on_error decisions; `kept` marks
  a step a retry did not run again (its result taken over: shown `completed`);
* an edge per route (`kind`): `next` (a `next` rule's target, `label` its `when`,
  `else`, or `otherwise` for the implicit route to `end` when no rule matches;
  `parallel` when one rule starts several branches), `join` (into `end`, where parallel
  branches join), `on_failure` (a remediation edge, `label` its `when`) and `on_error`
  (an on_error decision that routes: `abort`, `cancel` and `handled` go to `end`;
  `retry` and `retry_later` loop back onto the step). `points` run from the source's
  side to the target's; `label_at` is where its label goes; `taken` says the execution
  went that way. Long edges of one kind into one step share one line: it is drawn by
  one of them, and each other one ends where it joins that line, `merges` naming the
  edge (an index into `edges`) that draws it.

A step's `ignore` and `none` decisions do not route anywhere new (the step goes on by
its `next` rules, or fails as it would): they are listed on the node, not drawn.
Pure: no NATS, no I/O.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from actors.core.failure import ON_ERROR_RETRY_DELAY
from actors.playbook.model import END, Playbook, Step
from actors.ui.layout import Box, layered_layout
from actors.ui.runstate import Item, LoopRun, RunState, StepRun, fold_run
from actors.wire.messages import LoopProgress

NODE_H = 54.0
LOOP_H = 98.0  # room for the progress bar and two lines of counts
MIN_W, MAX_W = 156.0, 260.0
BADGE_W = 14.0  # an entry, retry or child-playbook mark beside the label
LOOP_W = 220.0  # a loop node's counts: "100,000/100,000 · 12,345/s ·" over "50 in flight · 3 failed"
CHAR_W = 8.2  # a character of the label's font (13px, bold), in px
LABEL_CHARS = 48  # an edge label longer than this is cut (the whole text is in `title`)
LABEL_CHAR_W = 6.2  # a character of an edge label (11px), in px
LABEL_STEP = 14.0  # between two labels of edges that share a route
SELF_LOOP_RISE = 26.0  # how far an on_error retry arc rises above its node
CACHED_LAYOUTS = 64

_SINGLE_EXPR = re.compile(r"^\s*\{\{\s*(.*?)\s*\}\}\s*$", re.S)
_cache: OrderedDict[bytes, dict[str, Any]] = OrderedDict()

Graph = dict[str, Any]


def playbook_graph(playbook: Playbook) -> Graph:
    """The playbook's steps and routes, laid out; every node `pending`. Computed once
    per playbook (cached by its content): execution_graph copies it for each update."""
    key = msgspec.json.encode(playbook)
    graph = _cache.get(key)
    if graph is None:
        graph = _build(playbook)
        _cache[key] = graph
        if len(_cache) > CACHED_LAYOUTS:
            _cache.popitem(last=False)
    else:
        _cache.move_to_end(key)
    return _copy(graph)


def execution_graph(playbook: Playbook, items: list[Any], loops: Mapping[str, LoopProgress]) -> Graph:
    """The playbook's graph with each node's state from the execution's log `items`
    (`LogItem`s, in log order) and each running loop's latest `loops` progress (keyed
    by anything; matched by step and loop id). The layout is the structure's: only
    states, counts and `taken` differ from one update to the next."""
    graph = playbook_graph(playbook)
    run = fold_run(items)
    progress = _latest_progress(loops.values())
    for node in graph["nodes"]:
        step = run.step(node["id"])
        node.update(
            state=step.state,
            attempts=step.attempts,
            visits=step.visits,
            error=step.error,
            decision=step.decision,
            handled=step.handled,
            children=list(step.children),
            kept=step.kept,
        )
        if node["loop"] is not None:
            node["loop"] = _loop_view(step.loop, progress.get(node["id"]))
    for edge in graph["edges"]:
        edge["taken"] = _taken(run, edge)
    for edge in graph["edges"]:  # a shared line is taken when any edge on it is
        if edge["taken"] and edge["merges"] is not None:
            graph["edges"][edge["merges"]]["taken"] = True
    graph["ended"] = None if run.ended is None else str(run.ended)
    return graph


# --- structure ---------------------------------------------------------------------------


def _build(playbook: Playbook) -> Graph:
    nodes = [_node(playbook, step) for step in playbook.workflow]
    edges = _edges(playbook)
    placed = layered_layout(
        [Box(n["id"], n["w"], n["h"]) for n in nodes],
        [(e["from"], e["to"]) for e in edges],
        last=END if END in playbook.steps else None,
        # many steps into one (a remediation step, end): one line, not one per step
        bundles=[e["kind"] for e in edges],
    )
    for node in nodes:
        node["x"], node["y"] = placed.positions[node["id"]]
        node["layer"] = placed.layers[node["id"]]
    by_id = {n["id"]: n for n in nodes}
    labels_at: set[tuple[float, float]] = set()
    for edge, points, trunk in zip(edges, placed.points, placed.merges, strict=True):
        edge["merges"] = trunk
        if edge["from"] == edge["to"]:
            points = _self_loop(by_id[edge["from"]])
        edge["points"] = [[round(x, 1), round(y, 1)] for x, y in points]
        at = _label_at(edge["points"])
        while at is not None and edge["label"] and (at[0], at[1]) in labels_at:
            at = [at[0], round(at[1] + LABEL_STEP, 1)]  # routes shared by two labelled edges: one under the other
        if at is not None and edge["label"]:
            labels_at.add((at[0], at[1]))
            half = len(edge["label"]) * LABEL_CHAR_W / 2 + 4  # keep the whole label in the drawing
            at[0] = round(min(max(at[0], half), max(half, placed.width - half)), 1)
        edge["label_at"] = at
    for node in nodes:
        node["x"], node["y"] = round(node["x"], 1), round(node["y"], 1)
    return {
        "nodes": nodes,
        "edges": edges,
        "width": round(placed.width, 1),
        "height": round(placed.height, 1),
        "ended": None,
    }


def _node(playbook: Playbook, step: Step) -> dict[str, Any]:
    tool = step.tool.__struct_config__.tag
    kind = END if step.step == END else "loop" if step.loop is not None else str(tool)
    label = step.step
    badges = (step.step == playbook.entry) + (step.retry is not None) + (tool == "playbook")
    return {
        "id": step.step,
        "label": label,
        "kind": kind,
        "tool": str(tool),
        "state": "pending",
        "x": 0.0,
        "y": 0.0,
        "w": max(LOOP_W if step.loop is not None else MIN_W, min(MAX_W, len(label) * CHAR_W + 30 + BADGE_W * badges)),
        "h": LOOP_H if step.loop is not None else NODE_H,
        "attempts": 0,
        "visits": 0,
        "loop": _loop_view(None, None) if step.loop is not None else None,
        "entry": step.step == playbook.entry,
        "desc": step.desc,
        "child": getattr(step.tool, "path", None) if tool == "playbook" else None,
        "children": [],
        "retry": _retry_summary(step),
        "on_error": [{"when": _condition(r.when), "decision": r.decision} for r in step.on_error or ()],
        "error": None,
        "decision": None,
        "handled": False,
        "kept": False,
    }


def _edges(playbook: Playbook) -> list[dict[str, Any]]:
    edges: dict[tuple[str, str, str], dict[str, Any]] = {}

    def add(source: str, target: str, kind: str, label: str | None, **extra: Any) -> None:
        edge = edges.get((source, target, kind))
        if edge is None:
            edges[(source, target, kind)] = {
                "from": source,
                "to": target,
                "kind": kind,
                "label": label,
                "parallel": False,
                "decisions": [],
                "points": [],
                "taken": False,
                **extra,
            }
            return
        if label and label not in (edge["label"] or "").split(" | "):
            edge["label"] = f"{edge['label']} | {label}" if edge["label"] else label
        edge["parallel"] = edge["parallel"] or extra.get("parallel", False)
        edge["decisions"] += [d for d in extra.get("decisions", ()) if d not in edge["decisions"]]

    for step in playbook.workflow:
        name = step.step
        if name != END:
            if step.next is None:
                add(name, END, "join", None)
            else:
                conditional = any(rule.when is not None for rule in step.next)
                for rule in step.next:
                    label = _condition(rule.when) if rule.when is not None else "else" if conditional else None
                    for target in rule.then:
                        add(name, target, "join" if target == END else "next", label, parallel=len(rule.then) > 1)
                if all(rule.when is not None for rule in step.next):
                    add(name, END, "join", "otherwise")  # no rule matched: the branch goes to end
        for route in step.on_failure or ():
            add(name, route.step, "on_failure", _condition(route.when) if route.when else "on failure")
        for decided in step.on_error or ():
            if decided.decision in ("abort", "cancel", "handled"):
                target = END
            elif decided.decision in ("retry", "retry_later"):
                target = name
            else:
                continue
            text = str(decided.decision)
            if decided.decision == "retry_later":
                text += f" {_seconds(decided.delay if decided.delay is not None else ON_ERROR_RETRY_DELAY)}"
            if decided.when:
                text = f"{_condition(decided.when)} → {text}"
            add(name, target, "on_error", text, decisions=[decided.decision])
    for edge in edges.values():
        edge["title"] = edge["label"]
        if edge["label"] and len(edge["label"]) > LABEL_CHARS:
            edge["label"] = edge["label"][: LABEL_CHARS - 1] + "…"
    return list(edges.values())


def _condition(when: str | None) -> str | None:
    """A `when` as people read it: `{{ result.ok }}` is `result.ok`."""
    if when is None:
        return None
    match = _SINGLE_EXPR.match(when)
    text = match.group(1) if match else when
    return " ".join(text.split())


def _seconds(value: float) -> str:
    return f"{value:g}s"


def _retry_summary(step: Step) -> str | None:
    if not step.retry:
        return None
    parts = []
    for rule in step.retry:
        then = rule.then
        what = "pages" if then.next_call is not None else "attempts"
        text = f"up to {then.max_attempts} {what}, {then.backoff}"
        if rule.when:
            text = f"{_condition(rule.when)}: {text}"
        parts.append(text)
    return "; ".join(parts)


def _self_loop(node: dict[str, Any]) -> list[tuple[float, float]]:
    """An arc over the node's top, from its right half back to its left half."""
    x, y, w = node["x"], node["y"], node["w"]
    top = y - SELF_LOOP_RISE
    return [(x + w * 0.7, y), (x + w * 0.7, top), (x + w * 0.3, top), (x + w * 0.3, y)]


def _label_at(points: list[list[float]]) -> list[float] | None:
    """The middle of the middle segment: on the drawn curve, between the layers."""
    if len(points) < 2:
        return None
    i = (len(points) - 1) // 2
    (x0, y0), (x1, y1) = points[i], points[i + 1]
    return [round((x0 + x1) / 2, 1), round((y0 + y1) / 2, 1)]


def _copy(graph: Graph) -> Graph:
    """A copy an update may change: fresh node and edge dicts (their points are shared,
    never changed)."""
    return {
        **graph,
        "nodes": [{**n, "children": [], "on_error": n["on_error"]} for n in graph["nodes"]],
        "edges": [{**e} for e in graph["edges"]],
    }


# --- state ---------------------------------------------------------------------------------


def _latest_progress(progress: Iterable[LoopProgress]) -> dict[str, LoopProgress]:
    latest: dict[str, LoopProgress] = {}
    for p in progress:
        seen = latest.get(p.step)
        if seen is None or p.at >= seen.at:
            latest[p.step] = p
    return latest


def _loop_view(loop: LoopRun | None, progress: LoopProgress | None) -> dict[str, Any]:
    """done/total, in flight, failed and iterations a second of the step's latest loop."""
    if loop is None:
        return {"done": 0, "total": None, "in_flight": 0, "failed": 0, "rate": None}
    if loop.ok is not None:  # the verdict is in the log: exact, whatever progress said
        done, in_flight, failed, at = loop.succeeded + loop.failed, 0, loop.failed, loop.ended_at
        total = loop.size
    elif progress is not None and progress.loop_id == loop.loop_id:
        done, in_flight, failed, at = progress.done, progress.in_flight, progress.failed, progress.at
        total = progress.total
    else:
        done, in_flight, failed, at, total = 0, 0, 0, None, loop.size
    elapsed = None if at is None else at - loop.started_at
    rate = round(done / elapsed, 1) if elapsed and elapsed > 0 and done else None
    return {"done": done, "total": total, "in_flight": in_flight, "failed": failed, "rate": rate}


def _taken(run: RunState, edge: dict[str, Any]) -> bool:
    step: StepRun | None = run.steps.get(edge["from"])
    if step is None:
        return False
    if edge["kind"] == "on_error":
        return not step.decisions.isdisjoint(edge["decisions"])
    how = "on_failure" if edge["kind"] == "on_failure" else "next"
    return (edge["to"], how) in step.taken


__all__ = ["Item", "execution_graph", "playbook_graph"]
