"""One bad playbook cannot stall the engine (issue: hostile and careless input).

Templates are bounded (operations and output size) and give back JSON data only; a
runaway template is evaluated off the event loop while other executions run; an input
the engine cannot handle ends its execution FAILED with `EngineError` after a few tries
instead of being retried for ever. Every test checks that a good execution on the same
server completes meanwhile.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from actors.playbook.templates import TemplateError, TemplateLimit, render_value
from tests.conftest import System, of_type
from tests.support.bad_playbooks import failed_step_error, good_run_completes, one_step, set_limits

pytestmark = [pytest.mark.timeout(90)]


# --- 1. templates are bounded in time and size -----------------------------------------

RUNAWAY = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}done"


@pytest.mark.asyncio
async def test_a_runaway_template_fails_its_step_while_other_executions_run(system: System) -> None:
    # a budget that takes seconds to spend (~2 s here), so the good executions
    # demonstrably run while the runaway one is still being evaluated; well within the
    # render's 10 s of CPU (template_seconds) even on a busy machine: 60 M took 8.8 s of
    # it, and the CPU deadline, not the budget, ended the render under load
    set_limits(system, template_ops=15_000_000)
    bad = await system.start_yaml(one_step("runaway", f'{{v: "{RUNAWAY}"}}'))
    for _ in range(5):
        await good_run_completes(system)
    still = await system.client.status(bad)
    assert still is None or still.state in ("PENDING", "RUNNING"), "the runaway template should still be running"
    status = await system.client.wait(bad, timeout=60)
    assert status.state == "FAILED"
    error = await failed_step_error(system, bad)
    assert error["type"] == "TemplateLimit"
    assert "step 'a'" in error["message"] and "args.v" in error["message"] and "template_ops" in error["message"]


@pytest.mark.asyncio
async def test_a_huge_string_template_fails_fast_with_the_output_limit(system: System) -> None:
    eid, status = await system.run_yaml(one_step("huge", "{v: \"{{ 'a' * 10**9 }}\"}"))
    assert status.state == "FAILED"
    error = await failed_step_error(system, eid)
    assert error["type"] == "TemplateLimit"
    assert "args.v" in error["message"] and "template_output" in error["message"]
    await good_run_completes(system)


def test_validate_does_not_build_a_huge_constant(tmp_path: Path) -> None:
    """Jinja folds constant expressions when it compiles; `validate` compiles every
    template. The multiplication is intercepted, so nothing is built."""
    f = tmp_path / "huge.yaml"
    f.write_text(one_step("huge", "{v: \"{{ 'a' * 10**9 }}\", w: \"{{ 'b' * 10**9 ~ 'c' }}\"}"))
    # measured from a small parent: a process's peak RSS starts at its parent's size when
    # it is forked (the kernel keeps the larger at exec), and a pytest worker can pass 300 MB
    measure = (
        "import os, subprocess, sys; p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, "
        "stderr=subprocess.DEVNULL); _, s, u = os.wait4(p.pid, 0); print(os.waitstatus_to_exitcode(s), u.ru_maxrss)"
    )
    out = subprocess.run(
        [sys.executable, "-c", measure, sys.executable, "-m", "actors.cli", "validate", str(f)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path.cwd())},
        check=True,
    )
    code, maxrss = map(int, out.stdout.split())
    assert code == 0
    assert maxrss < 300 * 1024, f"validate used {maxrss // 1024} MB"


@pytest.mark.parametrize(
    "source, limit",
    [
        ("{{ 'x'.ljust(10**9) }}", "template_output"),
        ("{{ 'x'|center(1000000000) }}", "template_output"),
        ("{{ '%999999999d' % 1 }}", "template_output"),
        ("{{ '{:>{w}}'.format(1, w=10**9) }}", "template_output"),
        ("{{ [1] * 10**8 }}", "template_output"),
        ("{{ 3 ** 100000000 }}", "template_output"),
        (
            "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}x",
            "template_output",
        ),
        ("{% for i in range(100000) %}{{ i }} and some text{% endfor %}", "template_output"),
        ("{% for i in range(100000) %}{{ (big|sort)[0] }}{% endfor %}", "template_ops"),
        ("{% for i in range(100000) %}{% if i in big %}{% endif %}{% endfor %}", "template_ops"),
        ("{% for i in big %}{% for j in big %}{% endfor %}{% endfor %}", "template_ops"),
        # work one operator does at once is charged by size: big integers, comparisons, views
        ("{% set x = 3**1000000 %}{{ x // 7 }}", "template_output"),
        ("{% for i in range(20000) %}{% if big == big %}{% endif %}{% endfor %}", "template_ops"),
        ("{% for i in range(20000) %}{% if -1 in lookup.values() %}{% endif %}{% endfor %}", "template_ops"),
        ("{{ (big|batch(100)|list)|sum(start=[])|length }}", "template_ops"),
        # a list of references to one big string is small until it is written out
        (
            "{% set ns = namespace(l=[], s='x' * 999999) %}"
            "{% for i in range(999) %}{% set ns.l = ns.l + [ns.s] %}{% endfor %}"
            "{{ ns.l|string|length }}",
            "template_output",
        ),
        (
            "{% set ns = namespace(l=[], s='x' * 999999) %}"
            "{% for i in range(999) %}{% set ns.l = ns.l + [ns.s] %}{% endfor %}"
            "{{ ns.l }}",
            "template_output",
        ),
        ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "template_ops"),
    ],
)
def test_every_way_of_growing_work_or_output_meets_a_bound(source: str, limit: str) -> None:
    with pytest.raises(TemplateLimit) as caught:
        render_value(source, {"big": list(range(100_000)), "lookup": {i: i for i in range(100_000)}}, where="args.v")
    assert caught.value.limit == limit
    assert str(caught.value).startswith("args.v: ")


def test_lookups_and_pass_through_values_are_not_charged_by_size() -> None:
    """What is cheap stays cheap: mapping lookups in a loop, the length of a list, a
    large value passed on from the scope unchanged (a big step result)."""
    users = [f"u{i}" for i in range(10_000)]
    scope = {"users": users, "lookup": {u: i for i, u in enumerate(users)}, "big": "x" * 3_000_000}
    source = "{% for u in users %}{{ lookup.get(u) }}{% if u in lookup %}{{ users|length }}{% endif %}{% endfor %}"
    assert render_value(source, scope).startswith("010000")
    assert render_value("{{ big }}", scope) is scope["big"]
    assert render_value("{{ [big, lookup] }}", scope)[0] is scope["big"]


def test_the_outcome_does_not_depend_on_the_compile_cache_or_the_stack() -> None:
    """A replay may find the template compiled already, or not, and may run at another
    stack depth (inline, on a worker thread, inside a replay): it must end the same."""
    heavy = (
        "{% set s = range(100000)|list|sort|sort|sort|sort|sort|sort %}"
        "{% for i in range(100000) %}{% for j in range(50) %}{% endfor %}{% endfor %}{{ s|length }}"
    )
    outcomes = []
    for _ in range(2):  # the second render finds the template in the cache
        with pytest.raises(TemplateLimit):
            render_value(heavy, {})
        outcomes.append("limit")
    deep = "{% macro f(n) %}{{ f(n - 1) if n else 0 }}{% endmacro %}{{ f(60) }}"

    def at_depth(n: int) -> Any:
        return render_value(deep, {}) if n == 0 else at_depth(n - 1)

    assert at_depth(0) == at_depth(300) == "0"
    nested: list[Any] = []
    for _ in range(2000):
        nested = [nested]
    assert render_value("{{ r }}", {"r": nested}) is nested  # passed through, not copied


def test_markup_becomes_a_plain_string() -> None:
    assert render_value("{{ ['<a>'|safe, 1] }}", {}) == ["<a>", 1]
    assert type(render_value("{{ '<a>'|safe }}", {})) is str


def test_the_operation_count_is_deterministic() -> None:
    """The budget is counted, not timed: the same template and scope stop at the same
    point however loaded the machine is, so a replay decides the same."""
    from actors.playbook import budget

    used = []
    for _ in range(3):
        outer = budget.begin_budget()
        try:
            render_value("{% for i in range(1000) %}{{ i|string }}{% endfor %}", {})
            used.append(budget.thread_state.budget.used)
        finally:
            budget.end_budget(outer)
    assert len(set(used)) == 1 and used[0] > 1000


# --- 2. template values are JSON data --------------------------------------------------


def test_mapping_keys_win_over_methods() -> None:
    scope = {"workload": {"items": [1, 2], "keys": "k", "values": 3, "get": None, "update": True}}
    assert render_value("{{ workload.items }}", scope) == [1, 2]
    assert render_value("{{ workload.keys }}-{{ workload.values }}", scope) == "k-3"
    assert render_value("{{ workload.get }}", scope) is None
    # with no such key, the method is still there to call
    assert render_value("{{ workload.get('items')|length }}", {"workload": {"items": [1]}}) == 1


@pytest.mark.parametrize(
    "source",
    [
        "{{ self }}",
        "{{ range(3) }}",
        "{{ namespace(a=1) }}",
        "{{ lipsum }}",
        "x {{ self }}",
        "{{ workload.items }}",
        "{{ {1: 2}.items() }}",
    ],
)
def test_a_value_that_is_not_json_data_is_a_template_error(source: str) -> None:
    with pytest.raises(TemplateError) as caught:
        render_value(source, {"workload": {}}, where="args.v")
    assert not isinstance(caught.value, TemplateLimit)
    assert "args.v" in str(caught.value)


@pytest.mark.asyncio
async def test_workload_items_is_the_payload_key_end_to_end(system: System) -> None:
    eid, status = await system.run_yaml(one_step("items", '{v: "{{ workload.items }}"}'), payload={"items": [1, 2, 3]})
    assert status.state == "COMPLETED"
    exit_ = of_type(await system.events(eid), "step.exit", "a")[0]
    assert exit_.data["status"] == "COMPLETED"
    assert (await system.client.status(eid)) is not None


@pytest.mark.asyncio
@pytest.mark.parametrize("value", ["{{ self }}", "{{ range(3) }}", "{{ workload.items }}"])
async def test_a_non_json_value_fails_the_step_naming_step_and_field(system: System, value: str) -> None:
    eid, status = await system.run_yaml(one_step("nonjson", f'{{v: "{value}"}}'))
    assert status.state == "FAILED"
    error = await failed_step_error(system, eid)
    assert error["type"] == "TemplateError"
    assert "step 'a'" in error["message"] and "args.v" in error["message"]
    await good_run_completes(system)


@pytest.mark.asyncio
async def test_a_non_json_on_error_result_fails_the_step_instead_of_crash_looping(system: System) -> None:
    eid, status = await system.run_yaml("""
apiVersion: actors/v1
kind: Playbook
metadata: {name: namespace_result}
workflow:
  - step: a
    tool: {kind: python, code: "def main(): raise ValueError('no')"}
    on_error:
      - decision: ignore
        result: "{{ namespace(a=1) }}"
""")
    assert status.state == "FAILED"
    error = await failed_step_error(system, eid)
    assert error["type"] == "TemplateError" and "on_error[0].result" in error["message"]
    await good_run_completes(system)


# --- 3. poison inputs end, they do not loop --------------------------------------------


def _lifecycle_error(items: list[Any]) -> dict[str, Any]:
    failed = [i for i in items if i.type == "playbook.failed"]
    assert len(failed) == 1, [i.type for i in items]
    error: dict[str, Any] = failed[0].data["error"]
    return error


@pytest.mark.asyncio
async def test_an_input_the_fold_cannot_take_fails_the_execution_with_engine_error(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in the pure fold (here: an exception for one step's result) is
    deterministic: the engine gives up on that input after a few tries and the
    execution ends FAILED, with the exception and the input in its log."""
    from actors.core import decide

    real = decide.call_result

    def buggy(d: Any, res: Any) -> None:
        if res.step == "poison":
            raise ZeroDivisionError("a bug in the fold")
        real(d, res)

    monkeypatch.setattr(decide, "call_result", buggy)
    bad = await system.start_yaml("""
apiVersion: actors/v1
kind: Playbook
metadata: {name: poisoned}
workflow:
  - step: poison
    tool: {kind: python, code: "def main(): return 1"}
    next: after
  - step: after
    tool: {kind: python, code: "def main(): return 2"}
""")
    await good_run_completes(system)
    status = await system.client.wait(bad, timeout=30)
    assert status.state == "FAILED"
    items = await system.events(bad)
    error = _lifecycle_error(items)
    assert error["type"] == "EngineError"
    assert "ZeroDivisionError: a bug in the fold" in error["message"] and ".in.result" in error["message"]
    assert status.error is not None and status.error["type"] == "EngineError"
    faults = of_type(items, "engine.fault")  # the input that gave up, and the decision it led to
    assert sorted(f.cls for f in faults) == ["ev", "in"]
    assert all(f.data["error"]["type"] == "EngineError" for f in faults)
    assert not of_type(items, "step.enter", "after")
    # a cancel afterwards changes nothing and fails nothing
    await system.client.cancel(bad, reason="too late")
    await system.engine_idle()
    assert (await system.client.status(bad)).state == "FAILED"  # type: ignore[union-attr]
    assert len([i for i in await system.events(bad) if i.cls == "lc" and i.type.startswith("execution.")]) == 0


@pytest.mark.asyncio
async def test_an_output_that_cannot_be_encoded_fails_the_execution_with_engine_error(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    from actors.core import work
    from actors.wire.messages import Command

    real = work.step_completed

    def unencodable(d: Any, act: Any, step: Any, result: Any, **kw: Any) -> None:
        if step.step == "a":  # a command whose args no encoder takes
            d.out.commands.append(
                Command(
                    execution_id=d.ex.execution_id,
                    command_id="x",
                    step="a",
                    kind="noop",
                    reply_to="r",
                    attempt_number=1,
                    args={"v": object()},
                )
            )
        real(d, act, step, result, **kw)

    monkeypatch.setattr(work, "step_completed", unencodable)
    bad = await system.start_yaml(one_step("unencodable", "{x: 1}", "    tool: {kind: noop}\n"))
    status = await system.client.wait(bad, timeout=30)
    assert status.state == "FAILED"
    error = _lifecycle_error(await system.events(bad))
    assert error["type"] == "EngineError" and "Encoding objects of type object" in error["message"], error
    monkeypatch.setattr(work, "step_completed", real)
    await good_run_completes(system)


@pytest.mark.asyncio
async def test_a_loop_input_the_counter_cannot_take_fails_the_loop_step(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    from actors.core import loop

    real = loop.fold_loop

    def buggy(run: Any, inp: Any, **kw: Any) -> Any:
        if type(inp).__name__ in ("CallDone", "ResultBatch"):
            raise KeyError("a bug in the counter")
        return real(run, inp, **kw)

    monkeypatch.setattr("actors.loops.counter.fold_loop", buggy)
    eid = await system.start_yaml("""
apiVersion: actors/v1
kind: Playbook
metadata: {name: poisoned_loop}
workflow:
  - step: each
    tool: {kind: noop}
    args: {x: "{{ n }}"}
    loop: {collection: [1, 2, 3], element: n}
""")
    status = await system.client.wait(eid, timeout=30)
    assert status.state == "FAILED"
    error = await failed_step_error(system, eid, "each")
    assert error["type"] == "LoopFailed" and "EngineError" in error["message"]
    assert "a bug in the counter" in error["message"]
    monkeypatch.setattr("actors.loops.counter.fold_loop", real)
    await good_run_completes(system)


@pytest.mark.asyncio
async def test_a_restarted_engine_does_not_freeze_on_a_runaway_template(system: System) -> None:
    """The replay after a restart meets the same template: it is evaluated off the
    loop again, and the execution ends the same way."""
    set_limits(system, template_ops=12_000_000)  # ~2 s of CPU: far from the 10 s deadline under load
    bad = await system.start_yaml(one_step("runaway2", f'{{v: "{RUNAWAY}"}}'))
    await good_run_completes(system)
    await system.restart_roles(("engine",))
    await good_run_completes(system)
    status = await system.client.wait(bad, timeout=60)
    assert status.state == "FAILED"
    assert (await failed_step_error(system, bad))["type"] == "TemplateLimit"
    exits = of_type(await system.events(bad), "step.exit", "a")
    assert len(exits) == 1  # decided once, whatever the restart


@pytest.mark.asyncio
async def test_a_sink_template_is_bounded_where_it_is_rendered(system: System) -> None:
    """Sinks are rendered by the tool actor, with the execution's limits."""
    set_limits(system, template_ops=100_000)
    eid, status = await system.run_yaml(f"""
apiVersion: actors/v1
kind: Playbook
metadata: {{name: runaway_sink}}
workflow:
  - step: a
    tool: {{kind: noop}}
    args: {{x: 1}}
    sink:
      tool: {{kind: noop}}
      args: {{v: "{RUNAWAY}"}}
""")
    assert status.state == "FAILED"
    error = await failed_step_error(system, eid)
    assert error["type"] == "TemplateLimit" and "sink.args.v" in error["message"] and "100,000" in error["message"]
    await good_run_completes(system)


def test_what_waiting_cures_is_told_from_what_it_does_not() -> None:
    """Transient: retried with backoff for as long as it takes. Deterministic: given up
    on after a few tries. An unlisted NATS error waits rather than failing executions."""
    import nats.errors
    import nats.js.errors

    from actors.natsio import PublishOutcomeUnknown
    from actors.runtime.supervision import is_transient

    for e in (
        TimeoutError(),
        nats.errors.ConnectionClosedError(),
        nats.errors.NoRespondersError(),
        nats.js.errors.ServiceUnavailableError(),
        nats.js.errors.APIError(),
        PublishOutcomeUnknown(),
        MemoryError(),
        ConnectionResetError(),
    ):
        assert is_transient(e), e
    for e in (
        ZeroDivisionError(),
        KeyError("x"),
        RecursionError(),
        TypeError("not encodable"),
        nats.errors.MaxPayloadError(),
        nats.js.errors.BadRequestError(),
    ):
        assert not is_transient(e), e


@pytest.mark.asyncio
async def test_an_execution_moved_off_the_loop_goes_on_to_the_end(system: System) -> None:
    """A template over the inline slice but within its budget moves the execution off
    the event loop (its renders then run in a render process); every later step, its
    results and its templates work as before."""
    eid, status = await system.run_yaml(
        """
apiVersion: actors/v1
kind: Playbook
metadata: {name: slow_but_fine}
workflow:
  - step: a
    args: {v: "{% for i in range(300) %}{% for j in range(1000) %}{% endfor %}{% endfor %}{{ workload.n }}"}
    next: b
  - step: b
    tool: {kind: python, code: "def main(x, items): return x + '!' + str(len(items))"}
    args: {x: "{{ a.v }}", items: "{{ workload['items'] }}"}
    next: c
  - step: c
    args: {final: "{{ b }}", n: "{{ workload.items|length }}"}
""",
        payload={"n": 7, "items": [1, 2, 3]},
    )
    assert status.state == "COMPLETED", status
    exits = {e.step: e for e in of_type(await system.events(eid), "step.exit")}
    assert exits["c"].data["status"] == "COMPLETED"
    result = await system.client.result(of_type(await system.events(eid), "playbook.completed")[0])
    assert result == {"c": {"final": "7!3", "n": 3}}
    await good_run_completes(system)
