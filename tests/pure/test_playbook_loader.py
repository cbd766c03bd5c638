"""The playbook loader: YAML -> normalised model, and every error with file, line,
step and field. Pure code: no server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from actors.core.decide import fold
from actors.core.state import Execution
from actors.playbook.errors import PlaybookError
from actors.playbook.loader import (
    IMPLICIT_END_DESC,
    MAX_ATTEMPTS_CEILING,
    PlaybookInvalid,
    load_playbook,
    load_playbook_file,
)
from actors.playbook.model import (
    END,
    FailureEdge,
    HttpTool,
    NextRule,
    NoopTool,
    Playbook,
    PythonTool,
    RetryPolicy,
    RetryRule,
)
from actors.playbook.schema import playbook_schema
from actors.playbook.shorthands import DEFAULT_RETRY_WHEN
from actors.wire.messages import Limits, StartRecord
from streams.subjects import ExecSubjects

pytestmark = pytest.mark.timeout(10)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

HEAD = """apiVersion: actors/v1
kind: Playbook
metadata: {name: t}
"""


def load(body: str, head: str = HEAD, *, max_attempts: int = MAX_ATTEMPTS_CEILING) -> Playbook:
    return load_playbook(head + body, file="t.yaml", max_attempts=max_attempts)


def errors(text: str, *, head: str = HEAD, max_attempts: int = MAX_ATTEMPTS_CEILING) -> list[PlaybookError]:
    with pytest.raises(PlaybookInvalid) as info:
        load_playbook(head + text, file="t.yaml", max_attempts=max_attempts)
    assert info.value.errors, "PlaybookInvalid without errors"
    return info.value.errors


def one(errs: list[PlaybookError], **match: Any) -> PlaybookError:
    """The single error whose fields equal `match` (message: substring)."""
    found = [
        e for e in errs if all((v in e.message) if k == "message" else getattr(e, k) == v for k, v in match.items())
    ]
    assert len(found) == 1, (match, [str(e) for e in errs])
    return found[0]


# --- a valid playbook ----------------------------------------------------------------


def test_valid_playbook_loads_with_end_injected_and_steps_routed() -> None:
    pb = load("""workload: {name: world}
workflow:
  - step: start
    tool: {kind: python, code: "def main(name): return name"}
    args: {name: "{{ workload.name }}"}
    next: [left, right]
  - step: left
    next: join
  - step: right
  - step: join
    args: {both: "{{ left }} {{ start }}"}
""")
    assert [s.step for s in pb.workflow] == ["start", "left", "right", "join", END]
    assert pb.entry == "start"
    assert pb.workload == {"name": "world"}
    assert pb.metadata.catalog_path == "t"  # path defaults to name
    assert isinstance(pb.step("start").tool, PythonTool)
    assert pb.step("start").targets() == ["left", "right"]
    assert pb.step("left").targets() == ["join"]
    # no `next`: stays None in the model and routes to end implicitly
    assert pb.step("right").next is None and pb.step("right").targets() == [END]
    assert pb.step("join").targets() == [END]
    end = pb.step(END)
    assert end.desc == IMPLICIT_END_DESC and isinstance(end.tool, NoopTool) and end.next is None
    assert end.targets() == []


def test_user_end_is_kept_not_injected_twice_and_may_run_a_tool() -> None:
    pb = load("""workflow:
  - step: a
  - step: end
    tool: {kind: python, code: "def main(): return 1"}
""")
    assert [s.step for s in pb.workflow] == ["a", END]
    assert isinstance(pb.step(END).tool, PythonTool) and pb.step(END).desc is None


def test_metadata_path_and_version_are_kept() -> None:
    pb = load(
        "workflow: [{step: a}]\n",
        head="apiVersion: actors/v1\nkind: Playbook\nmetadata: {name: x, path: lib/x, version: 3}\n",
    )
    assert pb.metadata.catalog_path == "lib/x" and pb.metadata.version == 3


def test_noetl_api_version_is_accepted_and_others_are_not() -> None:
    head = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: legacy}\n"
    assert load("workflow: [{step: a}]\n", head=head).apiVersion == "noetl.io/v2"
    errs = errors("workflow: [{step: a}]\n", head="apiVersion: actors/v9\nkind: Playbook\nmetadata: {name: x}\n")
    e = one(errs, field="apiVersion")
    assert e.line == 1 and "actors/v9" in e.message and "actors/v1" in e.message


def test_the_example_loads() -> None:
    pb = load_playbook_file(EXAMPLES / "hello.yaml")
    assert pb.metadata.catalog_path == "examples/hello"
    assert pb.workload == {"name": "world"}
    greet = pb.step("greet")
    assert isinstance(greet.tool, PythonTool) and "def main" in greet.tool.code
    assert greet.next is not None and greet.next[0].when is not None and greet.next[-1].when is None
    assert greet.next[-1].then == ["shout", "whisper"]  # the parallel branch
    assert pb.workflow[-1].step == END and pb.workflow[-1].desc == IMPLICIT_END_DESC
    assert {s.step for s in pb.workflow if END in s.targets()} == {"long_name", "shout", "whisper"}


# --- shorthands ------------------------------------------------------------------------


def test_tool_shorthand_and_default_tool() -> None:
    pb = load("""workflow:
  - step: a
    tool: python
  - step: b
  - step: c
    tool: {kind: http, url: "http://127.0.0.1/{{ workload.x }}", method: POST}
""")
    assert pb.step("a").tool == PythonTool()
    assert pb.step("b").tool == NoopTool()
    tool = pb.step("c").tool
    assert isinstance(tool, HttpTool) and tool.method == "POST"


def test_next_shorthands_normalise_to_rules() -> None:
    pb = load("""workflow:
  - step: one
    next: two
  - step: two
    next: [three, four]
  - step: three
    next:
      - when: "{{ result.n > 1 }}"
        then: four
      - when: "{{ result.n > 0 }}"
        then: [four, five]
      - else: five
  - step: four
    next: [{else: [five]}]
  - step: five
    next: [{then: end}]
""")
    assert pb.step("one").next == [NextRule(then=["two"])]
    assert pb.step("two").next == [NextRule(then=["three", "four"])]
    assert pb.step("three").next == [
        NextRule(then=["four"], when="{{ result.n > 1 }}"),
        NextRule(then=["four", "five"], when="{{ result.n > 0 }}"),
        NextRule(then=["five"], when=None),
    ]
    assert pb.step("four").next == [NextRule(then=["five"])]
    assert pb.step("five").next == [NextRule(then=[END])]


def test_retry_shorthands() -> None:
    pb = load("""workflow:
  - step: count
    retry: 3
  - step: policy
    retry: {max_attempts: 5, backoff: fixed, initial_delay: 0.1}
  - step: rules
    retry:
      - when: "{{ error is not none and error.retryable }}"
        then: {max_attempts: 4, jitter: full}
      - when: "{{ result is not none and result.more }}"
        then:
          max_attempts: 10
          next_call: {args: {page: "{{ result.page + 1 }}"}}
          collect: {strategy: append, path: data}
""")
    assert pb.step("count").retry == [RetryRule(then=RetryPolicy(max_attempts=3), when=DEFAULT_RETRY_WHEN)]
    assert DEFAULT_RETRY_WHEN == "{{ error is not none }}"
    assert pb.step("policy").retry == [
        RetryRule(then=RetryPolicy(max_attempts=5, backoff="fixed", initial_delay=0.1), when=DEFAULT_RETRY_WHEN)
    ]
    rules = pb.step("rules").retry
    assert rules is not None and len(rules) == 2
    assert rules[0].then.max_attempts == 4 and rules[0].then.jitter == "full"
    assert rules[1].then.next_call is not None and rules[1].then.next_call.args == {"page": "{{ result.page + 1 }}"}
    assert rules[1].then.collect is not None and rules[1].then.collect.path == "data"


def test_on_failure_shorthands() -> None:
    pb = load("""workflow:
  - step: a
    on_failure: cleanup
  - step: b
    on_failure:
      - when: "{{ error.type == 'Timeout' }}"
        step: slow_path
      - cleanup
  - step: slow_path
  - step: cleanup
    args: {what: "{{ failure.step }}: {{ failure.error.message }}"}
""")
    assert pb.step("a").on_failure == [FailureEdge(step="cleanup")]
    assert pb.step("b").on_failure == [
        FailureEdge(step="slow_path", when="{{ error.type == 'Timeout' }}"),
        FailureEdge(step="cleanup"),
    ]


def test_loop_tolerated_failures_count_or_percentage() -> None:
    pb = load("""workflow:
  - step: pct
    loop: {collection: "{{ workload.xs }}", element: x, tolerated_failures: "5%"}
    args: {x: "{{ x }}", i: "{{ iteration.index }}"}
  - step: count
    loop: {collection: [1, 2], element: y, tolerated_failures: 2, mode: sequential}
  - step: digits
    loop: {collection: [1], element: z, tolerated_failures: "3"}
""")
    loops = {s.step: s.loop for s in pb.workflow if s.loop is not None}
    assert loops["pct"] is not None and loops["pct"].tolerated_failures == "5%"
    assert loops["count"] is not None and loops["count"].tolerated_failures == 2 and loops["count"].mode == "sequential"
    assert loops["digits"] is not None and loops["digits"].tolerated_failures == 3
    errs = errors("""workflow:
  - step: a
    loop: {collection: [1], element: x, tolerated_failures: "150%"}
  - step: b
    loop: {collection: [1], element: x, tolerated_failures: "lots"}
""")
    assert "above 100%" in one(errs, step="a", field="loop.tolerated_failures").message
    assert "lots" in one(errs, step="b", field="loop.tolerated_failures").message


def test_yaml_anchors_and_merge_keys_work() -> None:
    pb = load("""workload:
  defaults: &http {kind: http, method: POST, url: "http://127.0.0.1/"}
workflow:
  - step: a
    tool: *http
  - step: b
    tool: {<<: *http, method: PUT}
""")
    tool_a = pb.step("a").tool
    assert isinstance(tool_a, HttpTool) and tool_a.method == "POST"
    tool_b = pb.step("b").tool
    assert isinstance(tool_b, HttpTool) and tool_b.method == "PUT" and tool_b.url == "http://127.0.0.1/"


# --- errors ---------------------------------------------------------------------------


def test_invalid_yaml_reports_the_line() -> None:
    text = "apiVersion: actors/v1\nkind: Playbook\nworkflow:\n  - step: a\n    args: {x: [1, 2}\n"
    with pytest.raises(PlaybookInvalid) as info:
        load_playbook(text, file="broken.yaml")
    [e] = info.value.errors
    assert e.line == 5 and e.file == "broken.yaml" and "YAML" in e.message
    assert str(e).startswith("broken.yaml:5: ")


def test_duplicate_yaml_keys_are_errors() -> None:
    errs = errors("""workflow:
  - step: a
    args: {x: 1}
    args: {x: 2}
""")
    e = one(errs, message="duplicate key 'args'")
    assert e.line == 7 and e.step == "a" and e.field == "args" and "line 6" in e.message


def test_unknown_key_names_the_key_the_step_and_the_line() -> None:
    errs = errors("""workflow:
  - step: a
    tool: {kind: python, code: "def main(): return 1"}
    nxt: b
  - step: b
    tool:
      kind: http
      url: http://127.0.0.1/
      methd: GET
""")
    e = one(errs, field="nxt")
    assert e.step == "a" and e.line == 7 and "'nxt'" in e.message and "did you mean 'next'" in e.message
    assert str(e) == "t.yaml:7: step 'a' field 'nxt': unknown key 'nxt'; did you mean 'next'?"
    e = one(errs, field="tool.methd")
    assert e.step == "b" and e.line == 12 and "'methd'" in e.message


def test_unknown_top_level_and_metadata_keys() -> None:
    errs = errors(
        "workflow: [{step: a}]\nworkflows: []\n",
        head="apiVersion: actors/v1\nkind: Playbook\nmetadata: {name: x, nmae: y}\n",
    )
    assert one(errs, field="workflows").line == 5
    assert one(errs, field="metadata.nmae").line == 3


def test_missing_step_reference_is_reported_where_written() -> None:
    errs = errors("""workflow:
  - step: a
    next: nowhere
  - step: b
    next:
      - when: "{{ result }}"
        then: [a, nope]
  - step: c
    on_failure: [a, cleanp]
  - step: cleanup
""")
    assert "unknown step 'nowhere'" in one(errs, step="a", field="next").message
    e = one(errs, step="b", field="next[0].then[1]")
    assert "unknown step 'nope'" in e.message and e.line == 10
    e = one(errs, step="c", field="on_failure[1]")
    assert "unknown step 'cleanp'" in e.message and "did you mean 'cleanup'" in e.message and e.line == 12


def test_the_brief_error_format() -> None:
    errs = errors("""workflow:
  - step: fetch
    next:
      - when: "{{ result }}"
        then: nope
""")
    assert [str(e) for e in errs] == ["t.yaml:8: step 'fetch' field 'next[0].then': unknown step 'nope'"]


def test_end_always_exists_as_a_target() -> None:
    pb = load("workflow:\n  - step: a\n    next: end\n    on_failure: end\n")
    assert pb.step("a").targets() == [END] and pb.workflow[-1].step == END


def test_duplicate_step_names() -> None:
    errs = errors("workflow:\n  - step: a\n  - step: b\n  - step: a\n")
    e = one(errs, message="duplicate step name 'a'")
    assert e.line == 7 and e.step == "a" and e.field == "step" and "line 5" in e.message


def test_step_names_must_be_lowercase_identifiers() -> None:
    errs = errors("workflow:\n  - step: Fetch-Users\n  - {desc: no name}\n")
    assert "[a-z0-9_]+" in one(errs, step="Fetch-Users", field="step").message
    e = one(errs, message="missing required key 'step'")
    assert e.step is None and e.field == "workflow[1]" and e.line == 6


def test_rules_with_when_and_else_or_without_target_are_errors() -> None:
    errs = errors("""workflow:
  - step: a
    next:
      - when: "{{ result }}"
        else: b
  - step: b
    next:
      - when: "{{ result }}"
      - else: a
      - then: a
""")
    assert one(errs, step="a", field="next[0]", message="both 'when' and 'else'").line == 7
    assert one(errs, step="b", field="next[0]", message="needs 'then'").line == 11
    assert one(errs, step="b", field="next[2]", message="unreachable").line == 13


def test_end_must_not_have_next() -> None:
    errs = errors("workflow:\n  - step: a\n  - step: end\n    next: a\n")
    assert one(errs, step="end", field="next").line == 7


def test_bad_template_syntax() -> None:
    errs = errors("""workflow:
  - step: a
    args: {x: "{{ workload.x }"}
""")
    e = one(errs, step="a", field="args.x")
    assert "syntax" in e.message and e.line == 6


def test_undefined_template_names() -> None:
    errs = errors("""workflow:
  - step: a
    tool: {kind: shell, command: "echo {{ workloda.x }}", env: {X: "{{ b.stdout }}"}}
    args:
      nested: [{deep: "{{ result.x }}"}]
      ok: "{% for x in workload.xs %}{{ loop.index }}{{ x | upper }}{% endfor %}{{ range(3) | list }}"
    next:
      - when: "{{ result.ok and attempt > 1 and error is none and response }}"
        then: b
  - step: b
    args: {f: "{{ failure }}", i: "{{ iteration.index }}", e: "{{ execution_id }}"}
""")
    e = one(errs, step="a", field="tool.command")
    assert e.message.startswith("undefined name 'workloda' in template") and "did you mean 'workload'" in e.message
    assert e.line == 6
    assert "'result'" in one(errs, step="a", field="args.nested[0].deep").message
    assert one(errs, step="b", field="args.f").message.startswith("undefined name 'failure'")
    assert one(errs, step="b", field="args.i").message.startswith("undefined name 'iteration'")
    assert len(errs) == 4  # the for-loop, filters, range(), the next rule and execution_id are fine


def test_failure_is_in_scope_only_in_remediation_steps() -> None:
    pb = load("""workflow:
  - step: a
    on_failure: fix
  - step: fix
    args: {why: "{{ failure.error.message }}", envelope: "{{ failure.envelope }}"}
""")
    assert pb.step("fix").args["why"] == "{{ failure.error.message }}"


def test_loop_scope_and_element_shadowing() -> None:
    pb = load("""workflow:
  - step: each
    loop: {collection: "{{ workload.users }}", element: user}
    args: {name: "{{ user.name }}", i: "{{ iteration.index }}"}
""")
    loop = pb.step("each").loop
    assert loop is not None and loop.element == "user"
    errs = errors("""workflow:
  - step: a
    loop: {collection: "{{ workload.xs }}", element: result}
  - step: b
    loop: {collection: "{{ workload.xs }}", element: a}
  - step: c
    loop: {collection: "{{ x }}", element: x}
""")
    assert one(errs, step="a", field="loop.element", message="shadows").line == 6
    assert "step 'a'" in one(errs, step="b", field="loop.element", message="shadows").message
    assert "before any iteration" in one(errs, step="c", field="loop.collection").message


def test_plain_string_condition_is_an_error() -> None:
    errs = errors("""workflow:
  - step: a
    next:
      - when: result.ok
        then: b
  - step: b
""")
    assert "template" in one(errs, step="a", field="next[0].when").message


def test_retry_max_attempts_ceiling(monkeypatch: pytest.MonkeyPatch) -> None:
    assert MAX_ATTEMPTS_CEILING == 1000 == Limits().max_attempts
    errs = errors("workflow:\n  - step: a\n    retry: 1001\n")
    e = one(errs, step="a", field="retry")
    assert "1001" in e.message and "1000" in e.message and e.line == 6
    errs = errors("workflow:\n  - step: a\n    retry: {max_attempts: 2000}\n")
    assert one(errs, step="a", field="retry.max_attempts").line == 6
    assert load("workflow:\n  - step: a\n    retry: 2000\n", max_attempts=5000).step("a").retry == [
        RetryRule(then=RetryPolicy(max_attempts=2000), when=DEFAULT_RETRY_WHEN)
    ]
    assert "ceiling 2" in one(errors("workflow:\n  - step: a\n    retry: 3\n", max_attempts=2), field="retry").message
    # the ceiling is the caller's: the process's environment has no say
    monkeypatch.setenv("ACTORS_MAX_ATTEMPTS_CEILING", "2")
    assert load("workflow:\n  - step: a\n    retry: 3\n").step("a").retry is not None
    monkeypatch.setenv("ACTORS_MAX_ATTEMPTS_CEILING", "5000")
    assert one(errors("workflow:\n  - step: a\n    retry: 2000\n"), field="retry").line == 6


def _start_fold(source: str, limits: Limits) -> tuple[str, list[Any], list[Any], list[Any]]:
    """The engine's fold of a start record alone: the state it leaves and what it decides."""
    ex = Execution(execution_id="e")
    record = StartRecord(execution_id="e", playbook_path="p.yaml", playbook_source=source, limits=limits)
    out = fold(ex, record, seq=1, at=1.0, subjects=ExecSubjects("exec.0.e"))
    return (
        ex.status,
        [msgspec.to_builtins(e) for e in out.lifecycle + out.events],
        [msgspec.to_builtins(c) for c in out.commands],
        [t.timer_id for t in out.timers],
    )


@pytest.mark.parametrize("env", [None, "2", "5000"])
def test_the_fold_parses_by_the_records_max_attempts_whatever_the_env_says(
    monkeypatch: pytest.MonkeyPatch, env: str | None
) -> None:
    """A start record fixes the ceiling its execution was started with: a pod with another
    ACTORS_MAX_ATTEMPTS_CEILING replays the log the same way."""
    source = (
        HEAD
        + """workflow:
  - step: flaky
    tool: {kind: python, code: "def main(): return 1"}
    retry: 1500
"""
    )
    if env is not None:
        monkeypatch.setenv("ACTORS_MAX_ATTEMPTS_CEILING", env)
    else:
        monkeypatch.delenv("ACTORS_MAX_ATTEMPTS_CEILING", raising=False)
    started = _start_fold(source, Limits(max_attempts=2000))
    assert started[0] == "RUNNING" and len(started[2]) == 1
    assert started == _start_fold(source, Limits(max_attempts=2000))
    refused = _start_fold(source, Limits())  # started by a pod whose ceiling was the default, 1000
    assert refused[0] == "FAILED" and not refused[2]
    assert "max_attempts 1500 is above the ceiling 1000" in json.dumps(refused[1])
    monkeypatch.setenv("ACTORS_MAX_ATTEMPTS_CEILING", "1")
    assert _start_fold(source, Limits(max_attempts=2000)) == started
    assert _start_fold(source, Limits()) == refused


def test_type_errors_name_the_field() -> None:
    errs = errors("""workflow:
  - step: a
    timeout: -1
    loop: {collection: [1], element: x, concurrency: many}
    retry: 0
  - step: b
    tool: pyton
""")
    assert one(errs, step="a", field="timeout").line == 6
    assert one(errs, step="a", field="loop.concurrency").line == 7
    assert one(errs, step="a", field="retry").line == 8
    assert "did you mean 'python'" in one(errs, step="b", field="tool").message


def test_several_errors_in_one_file_are_all_reported_in_line_order() -> None:
    text = """apiVersion: actors/v1
kind: Playbook
metadata: {name: bad, colour: red}
workflow:
  - step: a
    tool: {kind: python, code: "def main(): return 1"}
    nxt: b
  - step: b
    next: nowhere
  - step: c
    args: {x: "{{ nope }}", y: "{{ a.b }"}
    retry: {max_attempts: 5, backof: fixed}
  - step: c
"""
    with pytest.raises(PlaybookInvalid) as info:
        load_playbook(text, file="bad.yaml")
    errs = info.value.errors
    got = [(e.line, e.step, e.field) for e in errs]
    assert got == [
        (3, None, "metadata.colour"),
        (7, "a", "nxt"),
        (9, "b", "next"),
        (11, "c", "args.x"),
        (11, "c", "args.y"),
        (12, "c", "retry.backof"),
        (13, "c", "step"),
    ]
    lines = str(info.value).splitlines()
    assert lines == [str(e) for e in errs]
    assert all(line.startswith("bad.yaml:") for line in lines)


def test_top_level_shape_errors() -> None:
    for text, needle in (
        ("", "empty"),
        ("- 1\n", "mapping"),
        ("apiVersion: actors/v1\nkind: Playbook\nmetadata: {name: x}\nworkflow: []\n", "at least one step"),
        ("apiVersion: actors/v1\nkind: Flow\nmetadata: {}\nworkflow: [{step: a}]\n", "unsupported kind"),
    ):
        with pytest.raises(PlaybookInvalid) as info:
            load_playbook(text)
        assert any(needle in e.message for e in info.value.errors), (text, str(info.value))
    with pytest.raises(PlaybookInvalid) as info:
        load_playbook("apiVersion: actors/v1\nkind: Flow\nmetadata: {}\nworkflow: [{step: a}]\n")
    assert "missing required key 'name'" in one(info.value.errors, field="metadata").message


def test_error_and_exception_formatting() -> None:
    e = PlaybookError(file="hello.yaml", line=12, step="fetch", field="next[0].then", message="unknown step 'nope'")
    assert str(e) == "hello.yaml:12: step 'fetch' field 'next[0].then': unknown step 'nope'"
    assert str(PlaybookError(file="f", line=None, step=None, field="", message="m")) == "f: m"
    assert str(PlaybookError(file="f", line=3, step=None, field="kind", message="m")) == "f:3: field 'kind': m"
    exc = PlaybookInvalid([e, e])
    assert str(exc) == f"{e}\n{e}" and exc.errors == [e, e]


def test_load_playbook_file_names_the_file(tmp_path: Path) -> None:
    f = tmp_path / "mine.yaml"
    f.write_text(HEAD + "workflow:\n  - step: a\n    next: b\n")
    with pytest.raises(PlaybookInvalid) as info:
        load_playbook_file(f)
    [e] = info.value.errors
    assert e.file == str(f) and e.line == 6 and str(e).startswith(f"{f}:6: step 'a'")


# --- JSON Schema ----------------------------------------------------------------------


def _refs(node: Any) -> set[str]:
    if isinstance(node, dict):
        out = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        for v in node.values():
            out |= _refs(v)
        return out
    if isinstance(node, list):
        return set().union(*(_refs(v) for v in node)) if node else set()
    return set()


def _examples() -> list[Any]:
    docs = [yaml.safe_load((EXAMPLES / "hello.yaml").read_text())]
    for body in (
        "workflow:\n  - step: a\n    tool: python\n    retry: 3\n    next: [b, c]\n    on_failure: b\n"
        "  - step: b\n  - step: c\n",
        "workflow:\n  - step: a\n    retry: {max_attempts: 2}\n"
        "    next: [{when: '{{ result }}', then: b}, {else: [b]}]\n"
        "    on_failure: [{step: b, when: '{{ error }}'}, b]\n  - step: b\n"
        "    loop: {collection: [1], element: x, tolerated_failures: '5%'}\n",
    ):
        load(body)  # every schema example is a valid playbook
        docs.append(yaml.safe_load(HEAD + body))
    return docs


def test_schema_widens_the_shorthands() -> None:
    schema = playbook_schema()
    json.dumps(schema)  # JSON-able
    defs = schema["$defs"]
    assert schema["$schema"].startswith("https://json-schema.org/")
    assert {r.removeprefix("#/$defs/") for r in _refs(schema)} <= set(defs)  # every $ref resolves
    step = defs["Step"]["properties"]
    next_alts = step["next"]["anyOf"]
    assert {"$ref": "#/$defs/StepName"} in next_alts
    assert {"type": "array", "items": {"$ref": "#/$defs/StepName"}, "minItems": 1} in next_alts
    assert "else" in defs["NextElseRule"]["properties"] and "then" in defs["NextWhenRule"]["properties"]
    retry_alts = step["retry"]["anyOf"]
    assert {"type": "integer", "minimum": 1} in retry_alts and {"$ref": "#/$defs/RetryPolicy"} in retry_alts
    assert {"$ref": "#/$defs/StepName"} in step["on_failure"]["anyOf"]
    assert defs["ToolKind"]["enum"] == [
        "python",
        "http",
        "shell",
        "playbook",
        "noop",
        "sleep",
        "wait",
        "duckdb",
        "postgres",
    ]
    assert {"$ref": "#/$defs/ToolKind"} in defs["ToolSpec"]["anyOf"]
    assert defs["Step"]["additionalProperties"] is False  # unknown keys stay errors for editors too
    # the normalised model still converts from what the loader produced
    pb = load_playbook_file(EXAMPLES / "hello.yaml")
    assert msgspec.convert(msgspec.to_builtins(pb), Playbook) == pb


def test_examples_validate_against_the_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = playbook_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for doc in _examples():
        assert not list(validator.iter_errors(doc))
    bad = _examples()[0]
    bad["workflow"][0]["nxt"] = "b"
    assert list(validator.iter_errors(bad))
