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
"""


def test_a_block_starts_after_its_bar_a_one_line_value_on_its_line_a_folded_one_has_none() -> None:
    pb = load_playbook(TEXT, file="lines.yaml")
    assert pb.code_lines == {"block": 9, "inline": 12}
    assert TEXT.splitlines()[9 - 1].strip() == "def main():"


def test_the_user_cannot_write_the_loaders_field_and_the_schema_does_not_offer_it() -> None:
    with pytest.raises(PlaybookInvalid, match="unknown key 'code_lines'"):
        load_playbook(TEXT + "code_lines: {block: 1}\n")
    assert "code_lines" not in str(playbook_json_schema())
