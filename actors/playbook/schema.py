"""JSON Schema of the playbook *as users write it* (shared/DSL.md), for editors.

It starts from the schema of the normalised model (`msgspec.json.schema(Playbook)`)
and widens the fields the loader accepts in shorthand:

- `tool`: a kind name (`tool: python`) or the tool mapping;
- `next`: a step name, a list of step names, or a list of rules (`{when?, then}` with
  `then` a name or a list of names, or `{else}`), or one such rule;
- `retry`: a count, a policy mapping, one rule, or a list of rules;
- `on_error`: one rule or a list of rules;
- `on_failure`: a step name, one edge, or a list of names and `{when?, step}` edges;
- `loop.tolerated_failures`: a count, a digit string, or a percentage.

The schema describes shapes only; the loader also checks what a schema cannot (step
references, template names, duplicate step names).
"""

from __future__ import annotations

import copy
from typing import Any

import msgspec

from actors.playbook.model import TOOL_KINDS, Playbook

__all__ = ["playbook_schema"]

_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/$defs/{name}"}


def _nullable(*alternatives: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [*alternatives, {"type": "null"}], "default": None}


def playbook_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) editors use to check a playbook's YAML form."""
    schema: dict[str, Any] = copy.deepcopy(msgspec.json.schema(Playbook))
    defs: dict[str, Any] = schema["$defs"]
    step = defs["Step"]["properties"]

    defs["StepName"] = dict(step["step"])
    step["step"] = _ref("StepName")
    targets = {"anyOf": [_ref("StepName"), {"type": "array", "items": _ref("StepName"), "minItems": 1}]}

    # tool: a bare kind name or the mapping
    defs["ToolKind"] = {"type": "string", "enum": list(TOOL_KINDS)}
    defs["AnyTool"] = step["tool"]
    defs["ToolSpec"] = {"anyOf": [_ref("ToolKind"), _ref("AnyTool")]}
    step["tool"] = _ref("ToolSpec")
    defs["Sink"]["properties"]["tool"] = _ref("ToolSpec")

    # next
    defs["NextWhenRule"] = {
        "title": "NextWhenRule",
        "type": "object",
        "properties": {"when": {"anyOf": [{"type": "string"}, {"type": "null"}]}, "then": targets},
        "required": ["then"],
        "additionalProperties": False,
    }
    defs["NextElseRule"] = {
        "title": "NextElseRule",
        "type": "object",
        "properties": {"else": targets},
        "required": ["else"],
        "additionalProperties": False,
    }
    rule = {"anyOf": [_ref("NextWhenRule"), _ref("NextElseRule")]}
    step["next"] = _nullable(
        _ref("StepName"),
        {"type": "array", "items": _ref("StepName"), "minItems": 1},
        {"type": "array", "items": rule, "minItems": 1},
        rule,
    )

    # retry
    step["retry"] = _nullable(
        {"type": "integer", "minimum": 1},
        _ref("RetryPolicy"),
        _ref("RetryRule"),
        {"type": "array", "items": _ref("RetryRule")},
    )

    # on_error
    step["on_error"] = _nullable(_ref("OnErrorRule"), {"type": "array", "items": _ref("OnErrorRule")})

    # on_failure
    step["on_failure"] = _nullable(
        _ref("StepName"),
        _ref("FailureEdge"),
        {"type": "array", "items": {"anyOf": [_ref("StepName"), _ref("FailureEdge")]}},
    )
    defs["FailureEdge"]["properties"]["step"] = _ref("StepName")
    defs.pop("NextRule", None)  # the model's form of a rule; users write the two above

    # loop.tolerated_failures: also a digit string
    tolerated = defs["Loop"]["properties"]["tolerated_failures"]
    tolerated["anyOf"] = [*tolerated["anyOf"], {"type": "string", "pattern": r"^\s*\d+\s*$"}]

    return {"$schema": _DIALECT, "title": "Playbook", **schema}
