"""The playbook graph of the execution page (actors/ui/graph.py, layout.py, runstate.py):
structure from real playbooks (examples/ and the routing constructs of the language),
a layout that a page can draw as is, and each node's state from logs made by the
engine's own fold (tests/harness). Pure: no NATS."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from actors.playbook.loader import load_playbook, load_playbook_file
from actors.playbook.model import Playbook
from actors.ui.graph import execution_graph, playbook_graph
from actors.ui.layout import Box, layered_layout
from actors.wire.messages import LoopProgress
from tests.conftest import EXAMPLES
from tests.harness import PENDING, Fail, Harness
from tests.support.graph import HEAD, PY, big_playbook, items_of

pytestmark = [pytest.mark.timeout(60)]


def nodes(graph: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["id"]: n for n in graph["nodes"]}


def edges(graph: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {(e["from"], e["to"], e["kind"]): e for e in graph["edges"]}


def states(graph: dict[str, Any]) -> dict[str, str]:
    return {n["id"]: n["state"] for n in graph["nodes"]}


def assert_drawable(graph: dict[str, Any]) -> None:
    """What a page needs to draw the graph as given: nodes inside the drawing and never
    overlapping, every edge's points inside it, running from its source's right side to
    its target's left side (a forward edge) or the reverse (an edge back, in a cycle)."""
    boxes = graph["nodes"]
    for n in boxes:
        assert 0 <= n["x"] and n["x"] + n["w"] <= graph["width"], n
        assert 0 <= n["y"] and n["y"] + n["h"] <= graph["height"], n
    for a, b in itertools.combinations(boxes, 2):
        apart = (
            a["x"] + a["w"] <= b["x"]
            or b["x"] + b["w"] <= a["x"]
            or a["y"] + a["h"] <= b["y"]
            or b["y"] + b["h"] <= a["y"]
        )
        assert apart, (a["id"], b["id"])
    by_id = nodes(graph)
    for e in graph["edges"]:
        pts = e["points"]
        assert len(pts) >= 2, e
        assert all(0 <= x <= graph["width"] and 0 <= y <= graph["height"] for x, y in pts), e
        src, dst = by_id[e["from"]], by_id[e["to"]]
        if e["from"] == e["to"]:
            assert all(y <= src["y"] for _, y in pts), e  # the arc is drawn over the node
            continue
        if e["merges"] is not None:  # it joins the line another edge into the same step draws
            trunk = graph["edges"][e["merges"]]
            assert (trunk["to"], trunk["kind"], trunk["merges"]) == (e["to"], e["kind"], None), e
            assert len(pts) == 2 and pts[-1] in trunk["points"][1:-1], e
            assert pts[0][0] == pytest.approx(src["x"] + src["w"]) and pts[0][0] < pts[1][0], e
            continue
        xs = [x for x, _ in pts]
        if src["layer"] < dst["layer"]:
            assert pts[0][0] == pytest.approx(src["x"] + src["w"]) and pts[-1][0] == pytest.approx(dst["x"]), e
            assert xs == sorted(xs), e
        else:
            assert pts[0][0] == pytest.approx(src["x"]) and pts[-1][0] == pytest.approx(dst["x"] + dst["w"]), e
            assert xs == sorted(xs, reverse=True), e


def segments_cross(graph: dict[str, Any]) -> int:
    """Crossings of the drawn edges' segments (straight lines between their points; a
    route several edges share counted once). Every segment lies between two adjacent
    columns, so only segments of the same gap can cross."""

    def orient(a: tuple[float, float], b: tuple[float, float], c: tuple[float, float]) -> float:
        return (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])

    gaps: dict[float, set[tuple[tuple[float, float], tuple[float, float]]]] = {}
    for e in graph["edges"]:
        if e["from"] == e["to"]:
            continue
        for a, b in itertools.pairwise(sorted((x, y) for x, y in e["points"])):
            gaps.setdefault(round((a[0] + b[0]) / 2, -1), set()).add((a, b))
    total = 0
    for segments in gaps.values():
        for (p, q), (r, s) in itertools.combinations(sorted(segments), 2):
            if orient(r, s, p) * orient(r, s, q) < 0 and orient(p, q, r) * orient(p, q, s) < 0:
                total += 1
    return total


# --- structure ----------------------------------------------------------------------------


def test_hello_conditional_routes_parallel_branches_and_the_join_at_end() -> None:
    graph = playbook_graph(load_playbook_file(EXAMPLES / "hello.yaml"))
    assert [n["id"] for n in graph["nodes"]] == ["greet", "long_name", "shout", "whisper", "end"]
    by_id = nodes(graph)
    assert by_id["greet"]["entry"] and by_id["greet"]["kind"] == "python" and by_id["end"]["kind"] == "end"
    assert all(n["state"] == "pending" and n["attempts"] == 0 for n in graph["nodes"])
    e = edges(graph)
    assert e[("greet", "long_name", "next")]["label"] == "result.length > 10"
    assert not e[("greet", "long_name", "next")]["parallel"]
    for branch in ("shout", "whisper"):
        assert e[("greet", branch, "next")]["label"] == "else" and e[("greet", branch, "next")]["parallel"]
        assert e[(branch, "end", "join")]["label"] is None
    assert ("greet", "end", "join") not in e  # its else rule always matches: no route to end
    # left to right: the entry first, the branches side by side, end last where they join
    layers = {n["id"]: n["layer"] for n in graph["nodes"]}
    assert layers == {"greet": 0, "long_name": 1, "shout": 1, "whisper": 1, "end": 2}
    assert_drawable(graph)
    assert segments_cross(graph) == 0


def test_failure_routes_are_edges_of_their_own() -> None:
    graph = playbook_graph(
        load_playbook(
            HEAD % "failures"
            + f"""
  - step: fetch
    tool: {PY}
    retry: {{max_attempts: 4, backoff: exponential}}
    on_error:
      - when: "{{{{ error.status == 404 }}}}"
        decision: ignore
      - when: "{{{{ error.type == 'RateLimited' }}}}"
        decision: retry_later
        delay: 30
      - when: "{{{{ error.status == 401 }}}}"
        decision: abort
      - decision: none
    on_failure:
      - when: "{{{{ error.type == 'Timeout' }}}}"
        step: slow_path
      - step: cleanup
    next:
      - when: "{{{{ result.ok }}}}"
        then: store
  - step: store
    tool: {PY}
  - step: slow_path
    tool: {PY}
  - step: cleanup
    tool: {PY}
"""
        )
    )
    e = edges(graph)
    assert e[("fetch", "slow_path", "on_failure")]["label"] == "error.type == 'Timeout'"
    assert e[("fetch", "cleanup", "on_failure")]["label"] == "on failure"
    assert e[("fetch", "fetch", "on_error")]["label"] == "error.type == 'RateLimited' → retry_later 30s"
    assert e[("fetch", "end", "on_error")]["label"] == "error.status == 401 → abort"
    assert e[("fetch", "end", "on_error")]["decisions"] == ["abort"]
    assert e[("fetch", "store", "next")]["label"] == "result.ok"
    # every `when` may be false: no match sends the branch to end
    assert e[("fetch", "end", "join")]["label"] == "otherwise"
    fetch = nodes(graph)["fetch"]
    assert fetch["retry"] == "error is not none: up to 4 attempts, exponential"  # what `retry: {...}` means
    assert [r["decision"] for r in fetch["on_error"]] == ["ignore", "retry_later", "abort", "none"]
    assert fetch["on_error"][0]["when"] == "error.status == 404"
    assert_drawable(graph)


def test_a_loop_is_one_node_and_a_child_playbook_is_marked() -> None:
    graph = playbook_graph(load_playbook_file(EXAMPLES / "fanout.yaml"))
    square = nodes(graph)["square"]
    assert square["kind"] == "loop" and square["tool"] == "python"
    assert square["loop"] == {"done": 0, "total": None, "in_flight": 0, "failed": 0, "rate": None}
    assert len(graph["nodes"]) == 3  # square, summary, end: never a node per iteration
    child = playbook_graph(
        load_playbook(HEAD % "parent" + "  - step: run_child\n    tool: {kind: playbook, path: lib/child}\n")
    )
    node = nodes(child)["run_child"]
    assert node["kind"] == "playbook" and node["child"] == "lib/child"


def test_cycles_are_drawn_with_edges_going_back() -> None:
    graph = playbook_graph(
        load_playbook(
            HEAD % "cycle"
            + f"""
  - step: poll
    tool: {PY}
    next:
      - when: "{{{{ result.done }}}}"
        then: done
      - else: wait
  - step: wait
    tool: {{kind: sleep, seconds: 1}}
    next: poll
  - step: done
"""
        )
    )
    layers = {n["id"]: n["layer"] for n in graph["nodes"]}
    assert layers["poll"] < layers["wait"] and layers["poll"] < layers["done"] < layers["end"]
    assert_drawable(graph)  # wait -> poll runs right to left


def test_the_same_playbook_gets_the_same_drawing() -> None:
    text = (EXAMPLES / "hello.yaml").read_text()
    first = json.dumps(playbook_graph(load_playbook(text)), sort_keys=True)
    from actors.ui import graph as module

    module._cache.clear()
    assert json.dumps(playbook_graph(load_playbook(text)), sort_keys=True) == first


def test_a_200_step_playbook_is_laid_out_without_overlaps_and_at_most_one_crossing() -> None:
    playbook = load_playbook(big_playbook())
    assert len(playbook.workflow) == 202  # 200 steps, cleanup, end
    graph = playbook_graph(playbook)
    assert_drawable(graph)
    # Long edges into one target share one line (100 on_failure edges into cleanup, 10
    # branches into end): readable, but two such lines can meet only by crossing once.
    assert segments_cross(graph) <= 1
    # a drawing a page can show: one column per layer, as long as the longest chain
    assert graph["width"] < 120 * 300 and graph["height"] < 40 * 200
    # 100 remediation edges into cleanup: one line, the others join it (what is sent
    # grows with the edges, not with their square)
    into_cleanup = [e for e in graph["edges"] if e["to"] == "cleanup"]
    assert (
        len(into_cleanup) == 100 and sum(e["merges"] is None for e in into_cleanup) == 2
    )  # s0 draws it; s99 is beside it
    assert sum(len(e["points"]) for e in graph["edges"]) < 3 * len(graph["edges"]) + 200


def test_layout_handles_unknown_targets_and_self_loops() -> None:
    placed = layered_layout([Box("a", 100, 40), Box("b", 100, 40)], [("a", "b"), ("a", "a"), ("a", "zz")])
    assert placed.points[1] == [] and placed.points[2] == []
    assert placed.positions["a"][0] < placed.positions["b"][0]


# --- state from the log ------------------------------------------------------------------------


def test_states_of_a_completed_run_with_a_remediated_failure() -> None:
    source = (
        HEAD % "remedy"
        + f"""
  - step: start
    next: [work, other]
  - step: work
    tool: {PY}
    retry: {{max_attempts: 3, initial_delay: 1}}
    on_failure: cleanup
  - step: cleanup
    tool: {PY}
  - step: other
    tool: {PY}
  - step: never
    tool: {PY}
"""
    )
    run = Harness({"work": Fail("ValueError", "<b>bad</b> input")}).run(source)
    assert run.status == "COMPLETED"
    graph = execution_graph(load_playbook(source), items_of(run), {})
    assert states(graph) == {
        "start": "completed",
        "work": "failed",
        "cleanup": "completed",
        "other": "completed",
        "never": "skipped",
        "end": "completed",
    }
    work = nodes(graph)["work"]
    assert work["attempts"] == 3 and work["visits"] == 1
    assert work["error"] == "ValueError: <b>bad</b> input" and work["handled"]
    e = edges(graph)
    assert e[("work", "cleanup", "on_failure")]["taken"]
    assert e[("start", "work", "next")]["taken"] and e[("start", "other", "next")]["taken"]
    assert not e[("work", "end", "join")]["taken"]
    assert graph["ended"] == "COMPLETED"
    # the layout is the structure's: a page re-colours it in place
    structure = playbook_graph(load_playbook(source))
    assert [(n["x"], n["y"]) for n in graph["nodes"]] == [(n["x"], n["y"]) for n in structure["nodes"]]


def test_running_retrying_and_pending_while_it_runs() -> None:
    source = (
        HEAD % "live"
        + f"""
  - step: fork
    next: [slow, flaky]
  - step: slow
    tool: {PY}
    next: later
  - step: later
    tool: {PY}
  - step: flaky
    tool: {PY}
    retry: {{max_attempts: 5, backoff: fixed, initial_delay: 30}}
"""
    )
    harness = Harness({"slow": PENDING, "flaky": Fail("Timeout", "slow", retryable=True)})
    # stop as soon as the retry is scheduled (before its timer fires)
    run = harness.run(source, until=lambda h: any(i.type == "retry.scheduled" for i in h.runs["e1"].items))
    graph = execution_graph(load_playbook(source), items_of(run), {})
    assert states(graph) == {
        "fork": "completed",
        "slow": "running",
        "later": "pending",
        "flaky": "retrying",
        "end": "pending",
    }
    assert nodes(graph)["flaky"]["attempts"] == 1 and nodes(graph)["flaky"]["error"] == "Timeout: slow"
    assert graph["ended"] is None
    harness.run(until=lambda h: sum(i.type == "command.issued" and i.step == "flaky" for i in h.runs["e1"].items) == 2)
    assert states(execution_graph(load_playbook(source), items_of(run), {}))["flaky"] == "running"


def test_a_cancel_marks_what_was_running_cancelled_and_the_rest_skipped() -> None:
    source = HEAD % "cancel" + f"  - step: a\n    tool: {PY}\n    next: b\n  - step: b\n    tool: {PY}\n"
    harness = Harness({"a": PENDING})
    run = harness.run(source)
    harness.cancel(run.execution_id, "stop")
    run = harness.run()
    assert run.status == "CANCELLED"
    assert states(execution_graph(load_playbook(source), items_of(run), {})) == {
        "a": "cancelled",
        "b": "skipped",
        "end": "cancelled",
    }


def test_an_abort_fails_the_end_and_shows_the_decision_taken() -> None:
    source = (
        HEAD % "abort"
        + f"""
  - step: s
    next: [a, b]
  - step: a
    tool: {PY}
  - step: b
    tool: {PY}
    on_error:
      - decision: abort
"""
    )
    run = Harness({"a": PENDING, "b": Fail("X", "bad")}).run(source)
    graph = execution_graph(load_playbook(source), items_of(run), {})
    assert states(graph) == {"s": "completed", "a": "cancelled", "b": "failed", "end": "failed"}
    assert nodes(graph)["b"]["decision"] == "abort"
    assert edges(graph)[("b", "end", "on_error")]["taken"]


def test_an_answer_stored_before_its_command_event_still_counts() -> None:
    """The engine publishes a command before its decision record: a fast tool's answer
    can be in the log before the `command.issued` that asked for it."""
    source = HEAD % "fast" + f"  - step: a\n    tool: {PY}\n"
    run = Harness({"a": Fail("ValueError", "first")}).run(source)
    items = items_of(run)
    answer = next(i for i in items if i.type == "call.error")
    issued = next(i for i in items if i.type == "command.issued")
    items.remove(answer)
    items.insert(items.index(issued), answer)
    graph = execution_graph(load_playbook(source), items, {})
    assert nodes(graph)["a"]["state"] == "failed" and nodes(graph)["a"]["error"] == "ValueError: first"


def test_a_retry_shows_the_steps_it_kept_as_completed() -> None:
    source = HEAD % "again" + f"  - step: a\n    tool: {PY}\n    next: b\n  - step: b\n    tool: {PY}\n"
    harness = Harness({"b": Fail("ValueError", "once")})
    first = harness.run(source)
    assert first.status == "FAILED"
    harness.tools = {}
    harness.retry(first.execution_id)
    again = harness.run()
    assert again.status == "COMPLETED"
    graph = execution_graph(load_playbook(source), items_of(again), {})
    assert states(graph) == {"a": "completed", "b": "completed", "end": "completed"}
    assert nodes(graph)["a"]["kept"] and nodes(graph)["a"]["attempts"] == 0
    assert not nodes(graph)["b"]["kept"] and nodes(graph)["b"]["attempts"] == 1


def fanout(n: int) -> str:
    return (EXAMPLES / "fanout.yaml").read_text().replace("n: 1000", f"n: {n}")


def test_a_loop_node_shows_live_progress_then_its_verdict() -> None:
    playbook: Playbook = load_playbook(fanout(40))
    harness = Harness({"square": PENDING})
    run = harness.run(fanout(40))
    started = next(i for i in run.items if i.type == "iterator.started")
    loop_id = started.data["loop_id"]
    live = LoopProgress(
        execution_id=run.execution_id,
        loop_id=loop_id,
        step="square",
        total=40,
        done=10,
        failed=1,
        in_flight=30,
        at=started.at + 2.0,
    )
    stale = LoopProgress(
        execution_id=run.execution_id,
        loop_id=loop_id,
        step="square",
        total=40,
        done=4,
        failed=0,
        in_flight=36,
        at=started.at + 1,
    )
    graph = execution_graph(playbook, items_of(run), {"a": stale, "b": live})
    square = nodes(graph)["square"]
    assert square["state"] == "running"
    assert square["loop"] == {"done": 10, "total": 40, "in_flight": 30, "failed": 1, "rate": 5.0}
    # progress of another loop of the same step (an earlier run of it) is not this one's
    old = LoopProgress(
        execution_id=run.execution_id,
        loop_id="x-1",
        step="square",
        total=9,
        done=9,
        failed=0,
        in_flight=0,
        at=started.at + 3,
    )
    assert nodes(execution_graph(playbook, items_of(run), {"old": old}))["square"]["loop"]["done"] == 0

    done = Harness(lambda call: call.iteration * 2).run(fanout(40))
    square = nodes(execution_graph(playbook, items_of(done), {"stale": stale}))["square"]
    assert square["state"] == "completed"
    assert square["loop"]["done"] == 40 and square["loop"]["total"] == 40 and square["loop"]["in_flight"] == 0


def test_execution_graph_lays_a_playbook_out_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The live page asks for the graph a few times a second: the layout of a playbook
    is computed once, each update only folds the log (figures: bench/ui_graph.py)."""
    from actors.ui import graph as module

    calls = []
    real = module.layered_layout

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "layered_layout", counted)
    module._cache.clear()
    source = big_playbook()
    run = Harness().run(source)
    assert run.status == "COMPLETED"
    first = execution_graph(load_playbook(source), items_of(run), {})
    assert all(n["state"] in ("completed", "skipped") for n in first["nodes"])
    assert nodes(first)["cleanup"]["state"] == "skipped"
    for _ in range(3):
        assert execution_graph(load_playbook(source), items_of(run), {}) == first
    assert len(calls) == 1
