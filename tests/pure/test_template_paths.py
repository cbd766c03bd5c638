"""`{{ name.key }}` templates are looked up directly (actors/playbook/templates.py
`_Path`); what they render, and every error they raise, must be what Jinja gives."""

from __future__ import annotations

import re
from typing import Any

import pytest

from actors.playbook import templates
from actors.playbook.templates import TemplateError, render_value

pytestmark = [pytest.mark.timeout(30)]

SCOPE: dict[str, Any] = {
    "workload": {"i": 3, "nested": {"deep": [1, {"x": None}]}, "items": "a key named like a dict method"},
    "s1": 7,
    "s2": {"data": {"rows": [1, 2]}, "ok": True},
    "execution_id": "e-1",
    "text": "plain string",
}
CASES = [
    "{{ workload }}",
    "{{ workload.i }}",
    "{{ workload.nested.deep }}",
    "{{ s1 }}",
    "{{  s2.data.rows }}",
    "{{ s2.ok }}",
    "{{ execution_id }}",
    "{{ workload.items }}",  # Jinja: the dict method, not the key
    "{{ s1.anything }}",  # an int has no keys
    "{{ text.upper }}",  # a str method
    "{{ workload.missing }}",
    "{{ nobody }}",
    "{{ range }}",  # a Jinja global, not in scope
]


def outcome(source: str) -> tuple[str, Any]:
    try:
        return "value", render_value(source, SCOPE, where="args.x")
    except TemplateError as e:
        return "error", str(e)


@pytest.mark.parametrize("source", CASES)
def test_a_path_template_renders_what_jinja_renders(source: str, monkeypatch: pytest.MonkeyPatch) -> None:
    templates._compile.cache_clear()
    assert isinstance(templates._compile(source)[1], templates._Path)
    fast = outcome(source)
    templates._compile.cache_clear()
    monkeypatch.setattr(templates, "_PATH", re.compile(r"(?!)"))  # no template is a path: Jinja for all
    assert not isinstance(templates._compile(source)[1], templates._Path)
    assert outcome(source) == fast
    templates._compile.cache_clear()


def test_only_plain_paths_take_the_direct_lookup() -> None:
    assert not isinstance(templates._compile("{{ s2.data.rows[0] }}")[1], templates._Path)
    assert not isinstance(templates._compile("{{ s1 + 1 }}")[1], templates._Path)
    assert render_value("{{ s2.data.rows[0] }}", SCOPE) == 1 and render_value("{{ s1 + 1 }}", SCOPE) == 8
