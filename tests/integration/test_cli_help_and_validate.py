"""The CLI's help and `validate` as users meet them: help on every option, the exit codes
in each command's help, -v before or after the command, `validate` compiling python
code and warning on unreachable steps, an invalid enum value listing the valid ones, and
`schema` describing every field for an editor."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from actors.cli.main import build_parser
from tests.support.cli import cli

pytestmark = [pytest.mark.timeout(120)]


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


def test_every_option_of_every_command_has_help() -> None:
    missing = [
        f"{name} {a.option_strings or a.dest}" for name, sp in _subparsers().items() for a in sp._actions if not a.help
    ]
    assert missing == []


@pytest.mark.asyncio
async def test_help_of_a_command_lists_the_exit_codes_and_v_works_after_the_command() -> None:
    code, out, _, _ = await cli("status", "--help")
    # in two lines (`actors-cli help exits` and the end of `actors-cli --help` tell them whole)
    assert code == 0 and "exit codes: 0 done" in out and "4 timeout" in out and "130 Ctrl-C" in out
    code, out, err, _ = await cli("validate", "-v", "examples/hello.yaml")
    assert code == 0, err
    assert "examples/hello.yaml: ok" in out
    code, out, err, _ = await cli("-v", "validate", "examples/hello.yaml")  # before the command still works
    assert code == 0, err


@pytest.mark.asyncio
async def test_validate_compiles_python_code_and_warns_on_steps_no_route_reaches(tmp_path: Path) -> None:
    f = tmp_path / "code.yaml"
    f.write_text("""apiVersion: actors/v1
kind: Playbook
metadata: {name: code}
workflow:
  - step: first
    tool:
      kind: python
      code: |
        def main():
            return (1
    next: end
  - step: helper_only
    tool: {kind: python, code: "def helper(): return 1"}
  - step: orphan
    tool: noop
    next: helper_only
""")
    code, out, err, _ = await cli("validate", str(f))
    assert code == 3 and out == ""
    lines = err.splitlines()
    assert f"{f}:8: step 'first' field 'tool.code': python syntax error at line 2 of the code:" in lines[0]
    assert lines[1] == f"{f}:13: step 'helper_only' field 'tool.code': python code defines no main(): " + (
        "the tool calls main(**args)"
    )
    assert lines[2].startswith(f"{f}:12: step 'helper_only': warning: no route reaches this step")
    assert lines[3].startswith(f"{f}:14: step 'orphan': warning: no route reaches this step")
    code, out, _, _ = await cli("validate", "--json", str(f))
    report = json.loads(out)
    assert report["ok"] is False and len(report["errors"]) == 2
    assert [w["step"] for w in report["warnings"]] == ["helper_only", "orphan"]

    # a warning alone does not fail validation
    f.write_text("""apiVersion: actors/v1
kind: Playbook
metadata: {name: code}
workflow:
  - step: first
    tool: {kind: python, code: "async def main(): return 1"}
  - step: orphan
    tool: noop
""")
    code, out, err, _ = await cli("validate", str(f))
    assert code == 0 and f"{f}: ok" in out
    assert "step 'orphan': warning: no route reaches this step from the first step 'first'" in err


@pytest.mark.asyncio
async def test_an_invalid_enum_value_lists_the_valid_ones(tmp_path: Path) -> None:
    f = tmp_path / "enum.yaml"
    f.write_text("""apiVersion: actors/v1
kind: Playbook
metadata: {name: enum}
workflow:
  - step: a
    tool: noop
    loop: {collection: "{{ [1] }}", element: x, mode: paralel}
    on_error:
      - decision: abrt
""")
    code, _, err, _ = await cli("validate", str(f))
    assert code == 3
    assert f"{f}:7: step 'a' field 'loop.mode': invalid value 'paralel' (one of: async, chunked, sequential)" in err
    assert (
        f"{f}:9: step 'a' field 'on_error[0].decision': invalid value 'abrt' (one of: abort, cancel, handled, "
        "ignore, none, retry, retry_later); did you mean 'abort'?"
    ) in err


@pytest.mark.asyncio
async def test_schema_describes_every_field_for_editor_hover_help() -> None:
    code, out, _, _ = await cli("schema")
    assert code == 0
    defs = json.loads(out)["$defs"]
    undescribed = [
        f"{name}.{prop}"
        for name, d in defs.items()
        for prop, spec in d.get("properties", {}).items()
        if not spec.get("description")
    ]
    assert undescribed == []
    assert "parallel branches" in defs["Step"]["properties"]["next"]["description"]
