"""Loop semantics on the pure fold harness (engine fold and counter fold together):
modes and concurrency, results in collection order, chunking as the fold sees it,
tolerated failures, per-iteration retries, nested playbooks, cancel, and the
execution's log staying the same size whatever the iteration count. No NATS."""

from __future__ import annotations

import pytest

from tests.harness import PENDING, Call, Fail, Harness, replay

pytestmark = [pytest.mark.timeout(60)]

HEAD = "apiVersion: actors/v1\nkind: Playbook\nmetadata: {name: %s}\n"
PY = '{kind: python, code: "def main(): pass"}'


def most_in_flight(h: Harness, eid: str) -> int:
    """Run an execution whose tools all answer PENDING, answering the oldest running
    call each time nothing else can happen; the largest number running at once."""
    peak = 0
    run = h.run()
    while h.running():
        peak = max(peak, len(h.running()))
        call = h.running()[0]
        h.answer(call.command_id, call.element)
        run = h.run()
    assert run.status == "COMPLETED", run.status
    return peak


def test_results_are_in_collection_order_whatever_the_completion_order() -> None:
    h = Harness(lambda c: PENDING)
    h.start(
        HEAD % "ordered"
        + f"""
workload: {{xs: [10, 11, 12, 13, 14]}}
workflow:
  - step: wait
    tool: {PY}
    args: {{x: "{{{{ x }}}}"}}
    loop: {{collection: "{{{{ workload.xs }}}}", element: x, mode: async, concurrency: 5}}
    next: pick
  - step: pick
    args: {{out: "{{{{ wait }}}}"}}
"""
    )
    h.run()
    for call in reversed(h.running()):  # the last iteration answers first
        h.answer(call.command_id, call.args["x"] * 2)
    run = h.run()
    assert run.status == "COMPLETED"
    assert run.result == {"pick": {"out": [20, 22, 24, 26, 28]}}
    started = run.events("iterator.started", "wait")[0].data
    assert started["size"] == 5 and started["mode"] == "async" and started["element"] == "x"
    assert started["concurrency"] == 5
    assert replay(run)


def test_sequential_runs_one_iteration_at_a_time_in_order() -> None:
    h = Harness(lambda c: PENDING)
    eid = h.start(
        HEAD % "sequential"
        + f"""
workflow:
  - step: one_by_one
    tool: {PY}
    loop: {{collection: "{{{{ range(6) | list }}}}", element: n, mode: sequential, concurrency: 4}}
"""
    )
    assert most_in_flight(h, eid) == 1
    run = h.runs[eid]
    assert [c.iteration for c in run.calls] == [0, 1, 2, 3, 4, 5]
    assert run.events("iterator.started")[0].data["concurrency"] == 1
    assert run.result == {"one_by_one": [0, 1, 2, 3, 4, 5]}


def test_concurrency_bounds_iterations_in_flight() -> None:
    h = Harness(lambda c: PENDING)
    eid = h.start(
        HEAD % "bounded"
        + f"""
workflow:
  - step: fan
    tool: {PY}
    loop: {{collection: "{{{{ range(25) | list }}}}", element: n, concurrency: 5}}
"""
    )
    assert most_in_flight(h, eid) == 5  # never more, and the bound is used
    assert len(h.runs[eid].calls) == 25


def test_chunked_sends_one_command_per_chunk_with_a_last_partial_chunk() -> None:
    run = Harness(lambda c: c.args["x"] * 2).run(
        HEAD % "chunked"
        + f"""
workflow:
  - step: double
    tool: {PY}
    args: {{x: "{{{{ n }}}}"}}
    loop: {{collection: "{{{{ range(23) | list }}}}", element: n, mode: chunked, chunk_size: 5, concurrency: 2}}
    next: check
  - step: check
    args: {{doubled: "{{{{ double }}}}"}}
"""
    )
    assert run.status == "COMPLETED"
    assert run.result == {"check": {"doubled": [n * 2 for n in range(23)]}}
    chunks: dict[str, list[int]] = {}
    for c in run.calls:
        assert c.chunked
        chunks.setdefault(c.command_id, []).append(c.iteration or 0)
    assert sorted(len(v) for v in chunks.values()) == [3, 5, 5, 5, 5]
    assert sorted(i for v in chunks.values() for i in v) == list(range(23))
    started = run.events("iterator.started")[0].data
    assert started["chunk_size"] == 5 and started["mode"] == "chunked"
    assert replay(run)


FAILING = (
    HEAD % "tolerance"
    + """
workflow:
  - step: odd_fails
    tool: {kind: python, code: "def main(): pass"}
    args: {n: "{{ n }}"}
    loop: {collection: "{{ range(%d) | list }}", element: n, concurrency: 4, tolerated_failures: %s}
"""
)


def odd_fails(call: Call) -> int:
    if call.args["n"] % 2:
        raise Fail("ValueError", f"odd {call.args['n']}")
    return int(call.args["n"])


@pytest.mark.parametrize(
    ("total", "tolerated", "state"),
    [
        (6, "3", "COMPLETED"),  # 3 failures, 3 tolerated
        (6, "2", "FAILED"),
        (10, "'50%'", "COMPLETED"),  # 5 failures of 10, 5 tolerated
        (10, "'40%'", "FAILED"),
    ],
)
def test_tolerated_failures_as_count_and_percentage(total: int, tolerated: str, state: str) -> None:
    run = Harness(odd_fails).run(FAILING % (total, tolerated))
    assert run.status == state
    verdicts = [i for i in run.items if i.cls == "in" and i.type.startswith("iterator.")]
    assert len(verdicts) == 1
    if state == "COMPLETED":
        assert verdicts[0].type == "iterator.completed"
        assert run.result["odd_fails"] == [n if n % 2 == 0 else None for n in range(total)]  # failed ones are null
        assert verdicts[0].data["succeeded"] == total - total // 2 and verdicts[0].data["failed"] == total // 2
        assert {e["error"]["type"] for e in verdicts[0].data["errors"]} == {"ValueError"}
    else:
        assert verdicts[0].type == "iterator.failed"
        exit_ = run.events("step.exit", "odd_fails")[0].data
        assert exit_["error"]["type"] == "LoopFailed"
        assert "iterations failed, more than the" in exit_["error"]["message"]
        assert "ValueError: odd" in exit_["error"]["message"]


def test_one_failure_more_than_tolerated_stops_the_loop_at_once() -> None:
    h = Harness(lambda c: Fail("Boom", "x") if c.iteration == 1 else PENDING)
    run = h.run(
        HEAD % "failfast"
        + f"""
workflow:
  - step: each
    tool: {PY}
    loop: {{collection: "{{{{ range(50) | list }}}}", element: n, concurrency: 3}}
"""
    )
    assert run.status == "FAILED"
    assert len(run.calls) == 3 and not h.running()  # the other two in flight were stopped, none released
    assert sorted(run.cancelled) == sorted(c.command_id for c in run.calls if c.iteration != 1)
    assert run.events("step.exit", "each")[0].data["error"]["type"] == "LoopFailed"


def test_an_on_error_retry_runs_the_whole_loop_again() -> None:
    seen: list[int | None] = []

    def second_round_ok(call: Call) -> int:
        seen.append(call.iteration)
        if seen.count(0) == 1 and call.iteration == 0:
            raise Fail("Boom", "first round")
        return call.iteration or 0

    run = Harness(second_round_ok).run(
        HEAD % "again"
        + f"""
workflow:
  - step: each
    tool: {PY}
    loop: {{collection: [a, b], element: x}}
    on_error: [{{when: "{{{{ attempt == 1 }}}}", decision: retry}}]
"""
    )
    assert run.status == "COMPLETED"
    assert [i.data["attempt_number"] for i in run.events("iterator.started")] == [1, 2]
    assert run.result == {"each": [0, 1]}
    assert seen == [0, 1, 0, 1]  # each iteration ran once more


def test_empty_collection_completes_with_an_empty_list_at_once() -> None:
    run = Harness().run(
        HEAD % "empty"
        + f"""
workflow:
  - step: none
    tool: {PY}
    loop: {{collection: [], element: x}}
"""
    )
    assert run.status == "COMPLETED" and run.result == {"none": []}
    assert not run.calls and not run.loops  # no counter involved


def test_a_collection_that_is_not_a_list_fails_the_step_clearly() -> None:
    run = Harness().run(
        HEAD % "notalist"
        + """
workload: {users: {a: 1}}
workflow:
  - step: each
    tool: {kind: noop}
    loop: {collection: "{{ workload.users }}", element: user}
"""
    )
    assert run.status == "FAILED"
    err = run.events("step.exit", "each")[0].data["error"]
    assert err["type"] == "LoopCollectionInvalid"
    assert "step 'each' field loop.collection: must render to a list, got dict" in err["message"]


def test_the_execution_log_is_the_same_size_for_10_and_10000_iterations() -> None:
    source = (
        HEAD % "size"
        + """
workflow:
  - step: fan
    tool: {kind: noop}
    args: {v: "{{ i }}"}
    loop: {collection: "{{ range(workload.n) | list }}", element: i, concurrency: 1000}
    next: count
  - step: count
    args: {n: "{{ fan | length }}"}
"""
    )
    small, large = Harness().run(source, {"n": 10}), Harness().run(source, {"n": 10_000})
    assert small.status == large.status == "COMPLETED"
    assert large.result == {"count": {"n": 10_000}}
    assert [i.type for i in small.items] == [i.type for i in large.items]


def test_retry_applies_to_each_iteration_on_its_own() -> None:
    def flaky_three(call: Call) -> int:
        if call.args["n"] == 3 and call.attempt == 1:
            raise Fail("ConnectionError", "flaky once")
        return int(call.args["n"])

    run = Harness(flaky_three).run(
        HEAD % "flaky"
        + f"""
workflow:
  - step: each
    tool: {PY}
    args: {{n: "{{{{ n }}}}"}}
    loop: {{collection: "{{{{ range(6) | list }}}}", element: n, concurrency: 6}}
    retry:
      - when: "{{{{ error is not none and error.type == 'ConnectionError' }}}}"
        then: {{max_attempts: 3, backoff: fixed, initial_delay: 0.2}}
"""
    )
    assert run.status == "COMPLETED"
    assert sorted((c.iteration, c.attempt) for c in run.calls) == [
        (0, 1),
        (1, 1),
        (2, 1),
        (3, 1),
        (3, 2),
        (4, 1),
        (5, 1),
    ]
    assert run.result == {"each": [0, 1, 2, 3, 4, 5]}
    # the delay is a timer on the loop's log: the execution's log never sees it
    assert not run.events("retry.scheduled") and not run.events("timer.fired")
    [retried] = [c for c in run.calls if c.attempt == 2]
    assert retried.command_id.endswith("x3-2")
    assert replay(run)


def test_a_loop_over_a_playbook_starts_one_child_per_iteration() -> None:
    child = (
        HEAD % "child"
        + f"""
workflow:
  - step: inc
    tool: {PY}
    args: {{v: "{{{{ workload.v }}}}"}}
"""
    )
    h = Harness({"inc": lambda c: c.args["v"] + 1}, playbooks={"child": child})
    run = h.run(
        HEAD % "parent"
        + """
workflow:
  - step: each
    tool: {kind: playbook, path: child}
    args: {v: "{{ v }}"}
    loop: {collection: [10, 20, 30], element: v, concurrency: 2, mode: chunked, chunk_size: 5}
    next: sum
  - step: sum
    args: {total: "{{ each | map(attribute='inc') | sum }}"}
"""
    )
    assert run.status == "COMPLETED" and run.result == {"sum": {"total": 63}}
    assert len(run.children) == 3  # chunks do not apply to children: one each
    assert all(h.runs[c].status == "COMPLETED" for c in run.children)


def test_cancelling_an_execution_stops_its_loop() -> None:
    h = Harness(lambda c: PENDING)
    eid = h.start(
        HEAD % "cancelloop"
        + f"""
workflow:
  - step: slow
    tool: {PY}
    loop: {{collection: "{{{{ range(50) | list }}}}", element: x, concurrency: 3}}
"""
    )
    h.run()
    assert len(h.running()) == 3
    h.cancel(eid, reason="enough")
    run = h.run()
    assert run.status == "CANCELLED"
    # the three in flight were stopped, nothing more was released
    assert len(run.calls) == 3 and len(run.cancelled) == 3 and not h.running()


def test_a_chunk_counts_each_item_on_its_own() -> None:
    run = Harness(lambda c: Fail("Boom", f"item {c.iteration}") if c.iteration == 7 else c.iteration).run(
        HEAD % "chunkfail"
        + f"""
workflow:
  - step: each
    tool: {PY}
    loop: {{collection: "{{{{ range(10) | list }}}}", element: n, mode: chunked, chunk_size: 4, tolerated_failures: 1}}
"""
    )
    assert run.status == "COMPLETED"
    assert run.result == {"each": [0, 1, 2, 3, 4, 5, 6, None, 8, 9]}
    [verdict] = run.events("iterator.completed")
    assert (verdict.data["succeeded"], verdict.data["failed"]) == (9, 1)
    assert verdict.data["errors"] == [
        {
            "index": 7,
            "error": {"type": "Boom", "message": "item 7", "retryable": False, "status": None, "traceback": None},
        }
    ]


def test_pagination_works_per_iteration() -> None:
    def pages(call: Call) -> dict[str, object]:
        page, last = int(call.args["page"]), int(call.element)
        return {"items": [f"{last}:{page}"], "more": page < last}

    run = Harness(pages).run(
        HEAD % "perpage"
        + f"""
workflow:
  - step: each
    tool: {PY}
    args: {{page: 1}}
    loop: {{collection: [1, 3, 2], element: pages}}
    retry:
      - when: "{{{{ result is not none and result.more }}}}"
        then:
          max_attempts: 10
          next_call: {{args: {{page: "{{{{ result.items | length + attempt }}}}"}}}}
          collect: {{strategy: append, path: items}}
"""
    )
    assert run.status == "COMPLETED"
    assert [r["items"] for r in run.result["each"]] == [["1:1"], ["3:1", "3:2", "3:3"], ["2:1", "2:2"]]
    assert sorted((c.element, c.attempt) for c in run.calls) == [(1, 1), (2, 1), (2, 2), (3, 1), (3, 2), (3, 3)]
    assert replay(run)
