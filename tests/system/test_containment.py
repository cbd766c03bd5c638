"""User computation is contained by isolation, not by counting alone (the regression
corpus of issue 26's templates).

Every case runs against a real nats-server with the actors running, asserts the
execution's terminal state and its error (type, step, field, which limit), and that a
bystander execution started beside it completes. What the operation count cannot see
(a comparison of structures sharing their parts, memory, a render that simply takes
long) is caught by the render process's OS limits and the pod's deadline, recorded in
the log once, and never evaluated again on a replay.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from actors.client import Client
from actors.config.settings import Settings
from actors.playbook.inline import inline_safe
from actors.playbook.templates import RenderFault, TemplateError, TemplateLimit, check, render_value
from actors.pod.roles import connect, start_roles
from streams.server import NatsServer
from tests.conftest import System, make_layout, of_type, wait_for
from tests.support.bad_playbooks import GOOD, failed_step_error, good_run_completes, one_step, set_limits

pytestmark = [pytest.mark.timeout(120)]

SHARED = (
    "{% set ns = namespace(a=[1], b=[1]) %}{% for i in range(60) %}"
    "{% set ns.a = [ns.a, ns.a] %}{% set ns.b = [ns.b, ns.b] %}{% endfor %}"
)


def quoted(template: str) -> str:
    """A template as a YAML flow scalar (single-quoted: its double quotes stay)."""
    return "'" + template.replace("'", "''") + "'"


async def fails_with(system: System, template: str, limit: str, name: str = "bad") -> dict[str, Any]:
    """Run a one-step playbook whose args.v is `template`, beside a bystander: the step
    fails `TemplateLimit` naming its field and `limit`; the bystander completes."""
    bad = await system.start_yaml(one_step(name, f"{{v: {quoted(template)}}}"))
    await good_run_completes(system)
    status = await system.client.wait(bad, timeout=90)
    assert status.state == "FAILED"
    error = await failed_step_error(system, bad)
    assert error["type"] == "TemplateLimit", error
    assert "args.v" in error["message"] and limit in error["message"], error
    return error


# --- what the count did not see: now charged where it costs ---------------------------


@pytest.mark.asyncio
async def test_comparing_structures_that_share_their_parts_is_charged_per_node(system: System) -> None:
    """30 operations by the old count, 2^60 elements walked: now the walk is charged."""
    await fails_with(system, SHARED + "{{ ns.a == ns.b }}", "template_ops")


@pytest.mark.asyncio
async def test_printing_a_structure_that_shares_its_parts_is_charged_per_node(system: System) -> None:
    await fails_with(system, SHARED + "{{ ns.a }}", "template_ops")


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "template",
    [
        '{{ range(2000) | join("x" * 1000000) }}',
        "{{ '{:{}}'.format('a', '>99999999999') }}",
        "{{ ('%(a)s' * 2000) % {'a': 'x' * 1000} }}",
        "{{ ('a\\n' * 2000) | indent('x' * 1000) }}",
        "{{ ('ab' * 300000).translate({97: 'x' * 100}) }}",
        "{{ 3 ** 3999999 }}",
    ],
    ids=["join-of-a-range", "nested-format-width", "percent-repeated", "indent-fill", "translate-fill", "big-power"],
)
async def test_memory_is_bounded_before_it_is_allocated(system: System, template: str) -> None:
    """Each of these reached a MemoryError (or 1.9 GB, or 1.2 s of CPU for one
    operation) before: each is refused by its size before it is built."""
    error = await fails_with(system, template, "template_")
    assert "template_output" in error["message"] or "template_ops" in error["message"]


@pytest.mark.asyncio
async def test_a_loop_of_big_powers_does_not_slow_a_bystander(system: System) -> None:
    """30 iterations of `3 ** 3999999` used to cost 1.2 s of CPU each: each is refused
    by the size of its result before computing it, and the loop step fails."""
    yaml = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: powers}
workflow:
  - step: a
    loop: {collection: "{{ range(30) | list }}", element: i}
    tool: {kind: noop}
    args: {v: "{{ 3 ** (3999999 + i) }}"}
"""
    bad = await system.start_yaml(yaml)
    await good_run_completes(system)
    status = await system.client.wait(bad, timeout=90)
    assert status.state == "FAILED"
    assert "TemplateLimit" in str(status.error)


# --- what only the OS can bound: isolation, recorded in the log -----------------------


@pytest_asyncio.fixture
async def bounded(nats_server: NatsServer, tmp_path: Path) -> AsyncIterator[System]:
    """The actors with a short render deadline and a small render address space, as a
    pod's ACTORS_TEMPLATE_SECONDS and ACTORS_TEMPLATE_MEMORY_MB would set them."""
    layout = make_layout()
    settings = Settings(template_seconds=1.0, template_memory_mb=256)
    nc = await connect(nats_server.url, name="test")
    runtime = await start_roles(nc, layout=layout, settings=settings)
    try:
        yield System(nats_server, nc, Client(nc, layout=layout), runtime, layout, tmp_path)
    finally:
        await runtime.stop()
        await nc.close()


# within any budget the test sets, and longer than the 1 s deadline on any machine
SLOW = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}done"


async def render_faults(system: System, eid: str) -> list[Any]:
    return [i for i in await system.events(eid) if i.type == "engine.fault" and i.cls == "in"]


@pytest.mark.asyncio
async def test_a_render_past_the_deadline_is_killed_and_recorded_once(bounded: System) -> None:
    system = bounded
    set_limits(system, template_ops=10**12)
    bad = await system.start_yaml(one_step("slow", f"{{v: {quoted(SLOW)}}}"))
    await good_run_completes(system)
    status = await system.client.wait(bad, timeout=60)
    assert status.state == "FAILED"
    error = status.error
    assert error is not None
    assert error["type"] == "TemplateLimit", error
    assert "step 'a' field args" in error["message"] and "template_seconds" in error["message"], error
    faults = await render_faults(system, bad)
    assert len(faults) == 1

    # a restart replays the log: it reads the record instead of rendering again
    await system.restart_roles(("engine",))
    await good_run_completes(system)
    await system.engine_idle()
    assert len(await render_faults(system, bad)) == 1
    assert len(of_type(await system.events(bad), "playbook.failed")) == 1


@pytest.mark.asyncio
async def test_a_render_out_of_memory_fails_the_execution_not_the_pod(bounded: System) -> None:
    """Within its counted budget (raised here) but past the render process's address
    space: a deterministic outcome for the execution, never a transient retry loop."""
    system = bounded
    set_limits(system, template_ops=10**12, template_output=10**9)
    hog = "{% set ns = namespace(l=[]) %}{% for i in range(400) %}{% set ns.l = ns.l + ['x' * 2000000] %}{% endfor %}"
    bad = await system.start_yaml(one_step("hog", f"{{v: {quoted(hog + '{{ ns.l | length }}')}}}"))
    await good_run_completes(system)
    status = await system.client.wait(bad, timeout=60)
    assert status.state == "FAILED"
    error = status.error
    assert error is not None
    assert error["type"] == "TemplateLimit" and "template_memory" in error["message"], error
    assert len(await render_faults(system, bad)) == 1


@pytest.mark.asyncio
async def test_a_loop_iteration_past_the_deadline_fails_the_loop(bounded: System) -> None:
    system = bounded
    set_limits(system, template_ops=10**12)
    yaml = f"""
apiVersion: actors/v1
kind: Playbook
metadata: {{name: slowloop}}
workflow:
  - step: a
    loop: {{collection: [1, 2, 3], element: i}}
    tool: {{kind: noop}}
    args: {{v: {quoted(SLOW)}}}
"""
    bad = await system.start_yaml(yaml)
    await good_run_completes(system)
    status = await system.client.wait(bad, timeout=60)
    assert status.state == "FAILED"
    assert "template_seconds" in str(status.error)


# --- the event loop renders only what is cheap by construction ------------------------


@pytest.mark.parametrize(
    "template",
    [
        "{{ workload.x }}",
        "{{ a.b | default(3) }}",
        "id-{{ workload.id }}-{{ step.n | int }}",
        "{{ a.status == 'ok' and not b }}",
        "{% if a %}yes{% else %}no{% endif %}",
        "{{ 'x' in workload.tags }}",
        "{{ [a, b, {'k': c}] }}",
        "{{ i * 2 }}",
        "{{ iteration.index + 1 }}",
        "{{ n // 10 }}",
    ],
)
def test_lookups_and_simple_filters_render_inline(template: str) -> None:
    assert inline_safe(template)


@pytest.mark.parametrize(
    "template",
    [
        "{{ ns.a == ns.b }}" + SHARED,
        "{{ range(3) }}",
        "{{ x.items() }}",
        "{% for i in a %}{{ i }}{% endfor %}",
        "{{ a * b }}",
        "{{ a * 1000 }}",
        "{{ a ** 2 }}",
        "{{ a % 3 }}",
        "{{ a // b }}",
        "{{ a | map('upper') | list }}",
        "{{ a[1:] }}",
        "{% set x = 1 %}{{ x }}",
        "{{ '%s' % a }}",
        "{% if a %}" * 9 + "x" + "{% endif %}" * 9,
        "{{ a }}" * 1000,
    ],
)
def test_everything_else_renders_in_a_render_process(template: str) -> None:
    assert not inline_safe(template)


@pytest.mark.parametrize(
    "template",
    [
        "{% if a %}" * 120 + "x" + "{% endif %}" * 120,
        "{% if a %}" * 3000 + "x" + "{% endif %}" * 3000,
        "{{ " + "(" * 3000 + "1" + ")" * 3000 + " }}",
        "{% for i in range(1) %}" * 25 + "x" + "{% endfor %}" * 25,
    ],
    ids=["120-ifs", "3000-ifs", "3000-brackets", "25-fors"],
)
def test_deeply_nested_templates_are_refused_with_one_clear_error(template: str) -> None:
    with pytest.raises(TemplateLimit, match="nested"):
        check(template)
    with pytest.raises(TemplateError, match="nested"):
        render_value(template, {"a": 1})


@pytest.mark.asyncio
async def test_a_deeply_nested_template_fails_validation_naming_step_and_field(system: System) -> None:
    deep = "{% if a %}" * 3000 + "x" + "{% endif %}" * 3000
    path = system.tmp / "deep.yaml"
    path.write_text(one_step("deep", f"{{v: {quoted(deep)}}}"))
    with pytest.raises(Exception, match=r"(?s)args.*nested more than 16 deep"):
        await system.client.register(path)
    await good_run_completes(system)


def big_playbook(steps: int = 120) -> str:
    """A playbook of ~200 kB: a pod does not load it on its event loop."""
    body = "\n".join(
        f"""  - step: s{i}
    tool: {{kind: noop}}
    args: {{v: "{{{{ workload.n | default(0) }}}}", pad: "{"x" * 1500}"}}
    next: s{i + 1}"""
        for i in range(steps)
    )
    return f"""apiVersion: actors/v1
kind: Playbook
metadata: {{name: big}}
workflow:
{body}
  - step: s{steps}
    tool: {{kind: python, code: "def main(): return 'big done'"}}
"""


@pytest.mark.asyncio
async def test_a_big_playbook_is_loaded_in_a_render_process_and_runs(system: System) -> None:
    from actors.playbook.loader import INLINE_PLAYBOOK_CHARS

    source = big_playbook()
    assert len(source) > INLINE_PLAYBOOK_CHARS
    eid, status = await system.run_yaml(source, timeout=60)
    assert status.state == "COMPLETED"
    assert (await system.client.result(eid)) == {"s120": "big done"}
    await good_run_completes(system)


def test_a_pod_never_loads_a_big_playbook_on_its_event_loop() -> None:
    """On the event loop (a fold's inline slice) a big source is not loaded: the fold
    moves off the loop, where a render process loads it, under its limits."""
    import asyncio

    from actors.playbook.loader import load_playbook, parsed_playbook
    from actors.playbook.templates import INLINE_TEMPLATE_OPS, SliceExhausted, call_with_slice
    from actors.runtime.render_process import OffLoop, RenderBounds

    source = big_playbook(30) + "\n# unique to this test\n"
    with pytest.raises(SliceExhausted):
        call_with_slice(INLINE_TEMPLATE_OPS, lambda: parsed_playbook(source, "big.yaml", 1000))

    async def off_loop(bounds: RenderBounds) -> Any:
        off = OffLoop(threads=1, name="test-fold", bounds=bounds)
        try:
            return await off.off_loop(lambda: parsed_playbook(source, "big.yaml", 1000))
        finally:
            off.close()

    with pytest.raises(RenderFault, match="was killed"):  # past its deadline
        asyncio.run(off_loop(RenderBounds(seconds=0.001, wall_factor=1)))
    assert asyncio.run(off_loop(RenderBounds())) == load_playbook(source, file="big.yaml", max_attempts=1000)


@pytest.mark.asyncio
@pytest.mark.parametrize("signal", ["SIGTERM", "SIGKILL"])
async def test_a_pod_rendering_a_runaway_template_answers_and_stops_render_process_and_all(
    nats_server: NatsServer, tmp_path: Path, signal: str
) -> None:
    """The case that froze a pod for ever: `{{ ns.a == ns.b }}` (with a budget too big
    to run out before the test ends). The pod's event loop answers /healthz, runs a
    bystander to the end; SIGTERM stops it at once (exit 0), and with SIGKILL too the
    render process does not outlive it (it would spin with nobody to enforce its deadline)."""
    import aiohttp

    from streams.layout import Layout
    from tests.support.pods import PodProcess, get

    layout = Layout(partitions=4)
    env = {"ACTORS_TEMPLATE_OPS": str(10**15), "ACTORS_TEMPLATE_SECONDS": "600"}
    pod = await PodProcess.start("all", url=nats_server.url, layout=layout, logs=tmp_path, name="pod", env=env)
    try:
        await pod.ready()
        nc = await connect(nats_server.url, name="test")
        try:
            client = Client(nc, layout=layout)
            (tmp_path / "bad.yaml").write_text(one_step("frozen", f"{{v: {quoted(SHARED + '{{ ns.a == ns.b }}')}}}"))
            (tmp_path / "good.yaml").write_text(GOOD)
            bad = await client.start((await client.register(tmp_path / "bad.yaml")).path)

            async def rendering() -> bool:  # a process starting: no event to await but its appearance
                return any(b"render_worker" in _cmdline(pid) for pid in _children(pod.proc.pid))

            await wait_for(rendering, timeout=30)  # the render runs in a process of its own
            good = await client.start((await client.register(tmp_path / "good.yaml")).path)
            assert (await client.wait(good, timeout=60)).state == "COMPLETED"
            status = await client.status(bad)  # its first step's args are still being rendered
            assert status is None or status.state in ("PENDING", "RUNNING")
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
                assert (await get(http, f"http://127.0.0.1:{pod.port}/healthz"))[0] == 200
        finally:
            await nc.close()
        children = _children(pod.proc.pid)
        assert any(b"render_worker" in _cmdline(pid) for pid in children), "still rendering"
        if signal == "SIGTERM":
            assert await pod.stop(timeout=30) == 0
        else:
            await pod.kill()

        async def gone() -> bool:
            return not [pid for pid in children if _alive(pid)]

        await wait_for(gone, timeout=10)  # the kernel's signal to an orphan: no event to await
    finally:
        await pod.kill()


def _children(pid: int) -> list[int]:
    """Every descendant of `pid` (render processes start sessions of their own)."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            kids = [
                c for task in Path(f"/proc/{parent}/task").iterdir() for c in (task / "children").read_text().split()
            ]
        except OSError:  # gone meanwhile
            continue
        found += [int(c) for c in kids]
        todo += [int(c) for c in kids]
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# --- found by a hostile review: each a regression test --------------------------------


def test_a_lookup_hands_the_scopes_value_on_without_walking_it() -> None:
    """`when: "{{ workload.big }}"` in a router loop walked a 100,000-element payload at
    every activation, uncharged, on the event loop (23-37 s freezes): a lookup is the
    scope's own JSON data, handed on as it is."""
    from actors.playbook.templates import INLINE_TEMPLATE_OPS, call_with_slice

    big = list(range(3_000_000))
    out = call_with_slice(INLINE_TEMPLATE_OPS, lambda: render_value("{{ workload.big }}", {"workload": {"big": big}}))
    assert out is big


def test_a_value_handed_on_many_times_counts_every_time() -> None:
    """`{{ [w.s, w.s, ...] }}` with a 900 kB string: 1.8 GB once written out (a command of
    that size, a result blob of that size); the first reference is the scope's, the
    others count whole."""
    s = "x" * 900_000
    assert render_value("{{ [w.s, 1] }}", {"w": {"s": s}})[0] is s
    with pytest.raises(TemplateLimit, match="template_output"):
        render_value("{{ [w.s, w.s, w.s] }}", {"w": {"s": s}})


@pytest.mark.parametrize(
    "template", ["{{ ['a', 'b'] | random }}", "{{ (a.keys() - b.keys()) | first }}", "{{ a.keys() - b.keys() }}"]
)
def test_choices_a_replay_could_not_make_again_are_refused(template: str) -> None:
    """`|random`, and a set (its order comes from the process's hash seed): replays of
    one log decided differently, and executions stayed RUNNING waiting for commands a
    replay thought were never sent."""
    with pytest.raises(TemplateError):
        render_value(template, {"a": {"x": 1, "y": 2}, "b": {"y": 1}})
    assert render_value("{{ a.keys() | reject('in', b) | list }}", {"a": {"x": 1, "y": 2}, "b": {"y": 1}}) == ["x"]


@pytest.mark.parametrize("delay", [".inf", "1.0e+300", "1.0e+11"])
def test_a_delay_no_clock_can_keep_is_refused_when_the_playbook_loads(delay: str) -> None:
    """`delay: .inf` passed `validate`, then failed the engine three times with an
    OverflowError; `1.0e+11` kept an execution RUNNING for 3,000 years."""
    from actors.playbook.loader import PlaybookInvalid, load_playbook

    text = one_step(
        "late", "{}", tool=f"    tool: {{kind: noop}}\n    on_error: [{{decision: retry_later, delay: {delay}}}]\n"
    )
    with pytest.raises(PlaybookInvalid, match="on_error"):
        load_playbook(text)


@pytest.mark.parametrize("template", ["{{ s | capitalize }}", "{{ s | int }}", "{{ s | escape }}"])
def test_filters_that_read_a_whole_string_are_charged_for_it(template: str) -> None:
    from actors.playbook.budget import begin_budget, end_budget, thread_state

    s = "1" * 200_000
    outer = begin_budget()
    try:
        try:
            render_value(template, {"s": s})
        except TemplateError:
            pass  # `int` of 200,000 digits is refused by Python itself: charged all the same
        used = thread_state.budget.used
    finally:
        end_budget(outer)
    assert used >= len(s)


@pytest.mark.asyncio
async def test_a_result_of_more_values_than_a_pod_should_decode_fails_its_step(system: System) -> None:
    """A 63 MB list of 21 million `{}` took a pod to 1.6 GB when the engine decoded it:
    a value stored as a blob holds at most MAX_VALUE_NODES values, whatever its bytes."""
    from actors.wire.nesting import MAX_VALUE_NODES

    n = MAX_VALUE_NODES + 1_000
    tool = f'    tool: {{kind: python, code: "def main(): return [0] * {n}"}}\n'
    eid = await system.start_yaml(one_step("many", "{}", tool=tool))
    await good_run_completes(system)
    status = await system.client.wait(eid, timeout=60)
    assert status.state == "FAILED"
    error = await failed_step_error(system, eid)
    assert error["type"] == "ValueTooLarge" and f"more than {MAX_VALUE_NODES:,} values" in error["message"], error
