"""Retry semantics on the pure fold harness: which rule takes an attempt, backoff
delays on durable timers, linked attempts, pagination (`next_call` and `collect`),
exhaustion, and rules that cannot render. No NATS, no HTTP server: the tool function
plays the API."""

from __future__ import annotations

import pytest

from tests.harness import Call, Fail, Harness, Run, replay

pytestmark = [pytest.mark.timeout(60)]

HEAD = "apiVersion: actors/v1\nkind: Playbook\nmetadata: {name: %s}\nworkflow:\n"
ON_RETRYABLE = """      - when: "{{ error is not none and error.retryable }}"
        then: {max_attempts: 5, backoff: exponential, initial_delay: 0.2, max_delay: 1}"""
PAGINATE = """      - when: "{{ result is not none and result.data.paging.hasMore }}"
        then:
          max_attempts: %d
          next_call: {args: {page: "{{ result.data.paging.page + 1 }}"}}
          collect: {strategy: %s, path: %s}"""


def http(name: str, retry: str, extra: str = "") -> str:
    return (
        HEAD % name
        + f"""  - step: call
    tool: {{kind: http, url: "http://api/x"}}
    retry:
{retry}
{extra}"""
    )


def busy_twice(call: Call) -> dict[str, object]:
    if call.attempt <= 2:
        raise Fail("HTTPError", "503 busy", retryable=True, status=503)
    return {"status": 200, "data": {"ok": True, "calls": call.attempt}}


def pages(total: int):  # type: ignore[no-untyped-def]
    def api(call: Call) -> dict[str, object]:
        page = int(call.args["page"])
        return {
            "status": 200,
            "data": {
                "data": [f"p{page}i{i}" for i in range(3)],
                "extra": {f"page{page}": page},
                "paging": {"page": page, "hasMore": page < total},
            },
        }

    return api


def test_503_twice_then_200_retries_on_durable_timers_with_exponential_delays() -> None:
    run = Harness(busy_twice).run(http("flaky", ON_RETRYABLE))
    assert run.status == "COMPLETED"
    issued = run.events("command.issued", "call")
    assert [i.data["attempt_number"] for i in issued] == [1, 2, 3]
    # attempts are linked: each names the command of the attempt before
    assert [i.data.get("parent_event_id") for i in issued] == [
        None,
        issued[0].data["command_id"],
        issued[1].data["command_id"],
    ]
    scheduled = run.events("retry.scheduled", "call")
    assert [s.data["delay"] for s in scheduled] == [0.2, 0.4]
    assert all(s.data["reason"] == "error" and s.data["due"] == s.at + s.data["delay"] for s in scheduled)
    fired = run.events("timer.fired")
    assert [f.at for f in fired] == [s.data["due"] for s in scheduled]  # each attempt waited for its timer
    assert len(run.events("retry.due", "call")) == 2
    assert [e.data["error"]["status"] for e in run.events("call.error", "call")] == [503, 503]
    assert run.result == {"call": {"status": 200, "data": {"ok": True, "calls": 3}}}
    assert replay(run)


def test_max_delay_caps_the_backoff_and_exhaustion_fails_the_step() -> None:
    run = Harness({"call": Fail("HTTPError", "503", retryable=True, status=503)}).run(http("cap", ON_RETRYABLE))
    assert run.status == "FAILED"
    assert [s.data["delay"] for s in run.events("retry.scheduled")] == [0.2, 0.4, 0.8, 1.0]
    [exhausted] = run.events("retry.exhausted", "call")
    assert exhausted.data["attempts"] == 5 and exhausted.data["max_attempts"] == 5
    assert len(run.calls) == 5


def test_an_error_no_rule_matches_fails_at_once() -> None:
    run = Harness({"call": Fail("HTTPError", "404", status=404)}).run(http("missing", ON_RETRYABLE))
    assert run.status == "FAILED" and len(run.calls) == 1
    assert not run.events("retry.scheduled")
    err = run.events("step.exit", "call")[0].data["error"]
    assert err["type"] == "HTTPError" and err["status"] == 404 and err["retryable"] is False


def paginate(run: Run) -> list[object]:
    return run.result["call"]["data"]["data"]  # type: ignore[no-any-return]


def test_pagination_collects_every_page_in_order_with_append() -> None:
    run = Harness(pages(7)).run(http("pages", PAGINATE % (100, "append", "data.data"), "    args: {page: 1}\n"))
    assert run.status == "COMPLETED"
    assert [c.args["page"] for c in run.calls] == [1, 2, 3, 4, 5, 6, 7]
    assert paginate(run) == [f"p{p}i{i}" for p in range(1, 8) for i in range(3)]
    assert run.result["call"]["data"]["paging"] == {"page": 7, "hasMore": False}  # the last page's
    done = run.events("retry_sequence.completed", "call")[0].data
    assert done["total_attempts"] == 7 and done["collected_size"] == 21 and done["bounded"] is False
    assert [s.data["reason"] for s in run.events("retry.scheduled")] == ["success"] * 6
    assert not run.events("timer.fired") and not run.events("retry.due")  # no delay: no timer
    assert replay(run)


def test_pagination_with_merge() -> None:
    run = Harness(pages(3)).run(http("merge", PAGINATE % (100, "merge", "data.extra"), "    args: {page: 1}\n"))
    assert run.status == "COMPLETED"
    assert run.result["call"]["data"]["extra"] == {"page1": 1, "page2": 2, "page3": 3}


def test_max_attempts_bounds_a_never_ending_has_more() -> None:
    run = Harness(pages(1_000_000)).run(http("endless", PAGINATE % (4, "append", "data.data"), "    args: {page: 1}\n"))
    assert run.status == "COMPLETED" and len(run.calls) == 4
    done = run.events("retry_sequence.completed", "call")[0].data
    assert done["total_attempts"] == 4 and done["bounded"] is True
    assert len(paginate(run)) == 12


def test_a_when_that_cannot_render_fails_the_step_naming_the_rule() -> None:
    # the first attempt fails with 503 (error is set) -> retried; the third succeeds and
    # `error` is none: `none.retryable` cannot render -> the step fails naming the rule
    run = Harness(busy_twice).run(
        http(
            "bad_rule",
            """      - when: "{{ error.retryable }}"
        then: {max_attempts: 3}""",
        )
    )
    assert run.status == "FAILED" and len(run.calls) == 3
    err = run.events("step.exit", "call")[0].data["error"]
    assert err["type"] == "TemplateError" and "retry[0].when" in err["message"]


def test_timeouts_are_retryable_and_exhaust_with_fixed_delays() -> None:
    on_timeout = """      - when: "{{ error is not none and error.type == 'Timeout' }}"
        then: {max_attempts: 2, backoff: fixed, initial_delay: 0.1}"""
    run = Harness({"call": Fail("Timeout", "no answer after 0.3s", retryable=True)}).run(http("slow", on_timeout))
    assert run.status == "FAILED" and len(run.calls) == 2
    assert [s.data["delay"] for s in run.events("retry.scheduled")] == [0.1]
    [exhausted] = run.events("retry.exhausted", "call")
    assert exhausted.data["attempts"] == 2
    assert run.events("step.exit", "call")[0].data["error"]["type"] == "Timeout"


def test_retry_shorthand_retries_any_error_after_half_a_second() -> None:
    def twice(call: Call) -> int:
        if call.attempt < 2:
            raise Fail("RuntimeError", "first time fails")
        return call.attempt

    run = Harness({"twice": twice}).run(
        HEAD % "shorthand"
        + """  - step: twice
    retry: 3
    tool: {kind: python, code: "def main(): pass"}
"""
    )
    assert run.status == "COMPLETED" and run.result == {"twice": 2}
    assert [s.data["delay"] for s in run.events("retry.scheduled")] == [0.5]


def test_full_jitter_is_deterministic_and_within_the_backoff() -> None:
    source = http(
        "jitter",
        """      - when: "{{ error is not none }}"
        then: {max_attempts: 4, backoff: exponential, initial_delay: 1, jitter: full}""",
    )
    first = Harness({"call": Fail("OSError", "unreachable")}).run(source)
    again = Harness({"call": Fail("OSError", "unreachable")}).run(source)
    delays = [s.data["delay"] for s in first.events("retry.scheduled")]
    assert delays == [s.data["delay"] for s in again.events("retry.scheduled")]  # same execution: same delays
    assert len(delays) == 3 and all(0 <= d <= cap for d, cap in zip(delays, [1, 2, 4], strict=True))
    assert replay(first)
