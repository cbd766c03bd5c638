"""Where a python step's code starts in its YAML (`Playbook.code_lines`, from the loader):
what its tracebacks count lines from. Only code whose lines are the file's gets one."""

from __future__ import annotations

import pytest

from actors.playbook.loader import PlaybookInvalid, load_playbook
from actors.playbook.model import playbook_json_schema

pytestmark = [pytest.mark.timeout(30)]

TEXT = """\
apiVersion: actors/v1
kind: Playbook
metadata: {name: lines}
workflow:
  - step: block
    tool:
      kind: python
      code: |  # the text starts on the next line
        def main():
            return 1
  - step: inline
    tool: {kind: python, code: "def main(): return 2"}
  - step: folded
    tool:
      kind: python
      code: >
        def main(): return 3
  - step: shell
    tool: {kind: shell, command: "echo hi"}
  - step: escaped
    tool: {kind: python, code: "x = 1\\ndef main(): return x"}
"""


def test_a_block_starts_after_its_bar_a_one_line_value_on_its_line_a_folded_one_has_none() -> None:
    pb = load_playbook(TEXT, file="lines.yaml")
    # `escaped`: one line of YAML holding two of code (an escaped newline): its line 2
    # would point past the file's end, so it gets none
    assert TEXT.splitlines()[-1].count("\\n") == 1  # on one line of the file, two of code
    assert pb.code_lines == {"block": 9, "inline": 12}
    assert TEXT.splitlines()[9 - 1].strip() == "def main():"


def test_the_user_cannot_write_the_loaders_field_and_the_schema_does_not_offer_it() -> None:
    with pytest.raises(PlaybookInvalid, match="unknown key 'code_lines'"):
        load_playbook(TEXT + "code_lines: {block: 1}\n")
    assert "code_lines" not in str(playbook_json_schema())


def test_two_playbooks_of_one_file_name_each_show_their_own_line_in_a_traceback() -> None:
    """The python worker (actors/tools/pyworker.py) compiles each step's code padded to its
    lines in the file, under the file's name. Two playbooks named `flow.yaml` (or two
    versions of one) are told apart: each traceback shows its own source line, and still
    names `flow.yaml` and the line."""
    from collections import OrderedDict

    import orjson

    from actors.tools.pyworker import _call

    cache: OrderedDict[object, object] = OrderedDict()
    first = "\n\n\ndef main():\n    raise KeyError('first')  # the first playbook's line\n"
    second = "\n\n\ndef main():\n    raise KeyError('second')  # the second playbook's line\n"
    tracebacks = []
    for code in (first, second, first):
        _, body = _call(code, {}, None, cache, 8, "flow.yaml")  # type: ignore[arg-type]
        tracebacks.append(orjson.loads(body)["traceback"])
    for tb, mine, other in zip(tracebacks, ("first", "second", "first"), ("second", "first", "second"), strict=True):
        assert 'File "flow.yaml", line 5, in main' in tb
        assert f"the {mine} playbook's line" in tb and f"the {other} playbook's line" not in tb
    syntax = orjson.loads(_call("\n\ndef main(:\n", {}, None, cache, 8, "flow.yaml")[1])  # type: ignore[arg-type]
    assert syntax["type"] == "SyntaxError" and 'File "flow.yaml", line 3' in syntax["traceback"]
