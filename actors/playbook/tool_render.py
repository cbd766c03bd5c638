"""A step's tool and sink as a command carries them: the tool's fields rendered
(code and identity fields left as written), the sink left unrendered with just the
names its templates read (it renders in the tool actor, where `result` exists)."""

from __future__ import annotations

from typing import Any

import msgspec

from actors.playbook.model import UNRENDERED_TOOL_FIELDS, Step
from actors.playbook.templates import current_limits, names_read, render_value
from actors.wire.messages import SinkCall


def render_tool(step: Step, scope: dict[str, Any]) -> dict[str, Any]:
    """The step's tool with its fields rendered, except code and identity fields."""
    raw = msgspec.to_builtins(step.tool)
    return {
        k: (v if k in UNRENDERED_TOOL_FIELDS else render_value(v, scope, where=f"tool.{k}", step=step.step))
        for k, v in raw.items()
    }


def sink_call(step: Step, scope: dict[str, Any], *, element: str | None = None) -> SinkCall | None:
    """The step's sink, to run in the tool actor after the tool: unrendered (its
    templates read `result`, which exists only there) with just the names it reads."""
    if step.sink is None:
        return None
    tool = msgspec.to_builtins(step.sink.tool)
    wanted = _sink_names(step)
    return SinkCall(
        tool=tool,
        args=step.sink.args,
        element=element,
        scope={k: v for k, v in scope.items() if k in wanted},
        limits=current_limits(),
    )


def _sink_names(step: Step) -> set[str]:
    assert step.sink is not None
    raw = msgspec.to_builtins(step.sink.tool)
    fields = {k: v for k, v in raw.items() if k not in UNRENDERED_TOOL_FIELDS}
    return names_read(fields) | names_read(step.sink.args)
