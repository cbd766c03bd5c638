"""A looped step's templates prepared once for all its iterations.

What the counter's fold (actors/core/loop.py `_issue`) renders for every iteration,
prepared once per loop. The results are exactly those of `render_value`/`render_tool`/
`sink_call`, only cheaper at 100,000 iterations: values without templates are not
walked, a template that is one bare name (`{{ item }}`) is a dictionary lookup, and a
tool or sink that reads nothing of the iteration is rendered once.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import jinja2
import msgspec
from jinja2 import nodes

from actors.playbook.model import UNRENDERED_TOOL_FIELDS, PlaybookTool, Step, WaitTool
from actors.playbook.templates import TemplateError, is_template, names_read, render_condition, render_value
from actors.playbook.tool_render import render_tool, sink_call
from actors.wire.messages import LoopSpec

_BARE_NAME = re.compile(r"^\s*\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}\s*$")
_jinja = jinja2.Environment()  # parsing only: same syntax as the templates' environment


def _bare_name(source: str) -> str | None:
    """The name a template reads when it is exactly `{{ name }}`: Jinja gives back the
    scope's value itself then. None for anything else (`{{ true }}` is a constant)."""
    m = _BARE_NAME.match(source)
    if m is None or m.group(1) == "self":  # `self` collides with the expression's own
        return None
    try:
        body = _jinja.parse(source).body
    except jinja2.TemplateSyntaxError:
        return None
    if len(body) == 1 and isinstance(body[0], nodes.Output) and len(body[0].nodes) == 1:
        node = body[0].nodes[0]
        if isinstance(node, nodes.Name) and node.ctx == "load":
            return node.name
    return None


_Render = Callable[[dict[str, Any]], Any]


def _renderer(value: Any, where: str, step: str = "") -> _Render | None:
    """A function rendering `value` like `render_value(value, scope, where=where)`, or
    None when `value` holds no template (render_value would give it back unchanged, or
    rebuilt: containers are rebuilt here too, so no iteration shares them)."""
    if isinstance(value, str):
        if not is_template(value):
            return None
        name = _bare_name(value)
        if name is not None:

            def lookup(scope: dict[str, Any], name: str = name, value: str = value) -> Any:
                if name in scope:
                    return scope[name]
                return render_value(value, scope, where=where, step=step)  # a global, or the error

            return lookup
        return lambda scope: render_value(value, scope, where=where, step=step)
    if isinstance(value, dict):
        parts = [(k, v, _renderer(v, f"{where}.{k}" if where else str(k), step)) for k, v in value.items()]
        if all(r is None for _, _, r in parts):
            return (
                None
                if not _has_container(value)
                else (lambda scope: render_value(value, scope, where=where, step=step))
            )

        def render_dict(scope: dict[str, Any]) -> dict[str, Any]:
            out = {}
            for k, v, r in parts:
                out[k] = r(scope) if r is not None else _fresh(v)
            return out

        return render_dict
    if isinstance(value, list):
        items = [(v, _renderer(v, f"{where}[{i}]", step)) for i, v in enumerate(value)]
        if all(r is None for _, r in items):
            return (
                None
                if not _has_container(value)
                else (lambda scope: render_value(value, scope, where=where, step=step))
            )
        return lambda scope: [r(scope) if r is not None else _fresh(v) for v, r in items]
    return None


def _has_container(value: dict[str, Any] | list[Any]) -> bool:
    return any(isinstance(v, (dict, list)) for v in (value.values() if isinstance(value, dict) else value))


def _fresh(value: Any) -> Any:
    """A template-free value as render_value returns it: containers rebuilt."""
    if isinstance(value, (dict, list)):
        return render_value(value, {})
    return value


class IterationTemplates:
    """What a loop renders for each iteration's command (args, tool, sink), prepared
    from its step and spec once: `render` gives exactly what rendering each would."""

    __slots__ = (
        "args",
        "args_const",
        "per_iteration_tool",
        "sink",
        "tool",
        "tool_error",
        "tool_nested",
        "wait",
        "wait_key",
        "wait_until",
        "wait_zone",
    )

    def __init__(self, step: Step, spec: LoopSpec) -> None:
        assert step.loop is not None
        varying = {step.loop.element, "iteration"}
        self.args = _renderer(step.args, "args", step.step)
        self.args_const = step.args
        # a loop of waits sends no command: what each iteration renders is its wait's
        # key and deadline (its `when` is rendered per signal, with `signal` in scope)
        self.wait = step.tool if isinstance(step.tool, WaitTool) else None
        self.wait_key: _Render | None = None
        self.wait_until: _Render | None = None
        self.wait_zone: _Render | None = None
        if self.wait is not None:
            self.wait_key = _renderer(self.wait.key, "tool.key", step.step)
            self.wait_until = _renderer(self.wait.until, "tool.until", step.step)
            self.wait_zone = _renderer(self.wait.zone, "tool.zone", step.step)
        raw = msgspec.to_builtins(step.tool)
        fields = {k: v for k, v in raw.items() if k not in UNRENDERED_TOOL_FIELDS}
        # a tool that reads nothing of the iteration renders the same for every one
        self.per_iteration_tool = bool(names_read(fields) & varying) or isinstance(step.tool, PlaybookTool)
        self.tool: dict[str, Any] | None = None
        self.tool_error: TemplateError | None = None
        self.tool_nested = False
        if self.wait is not None:
            # no command: the tool is not rendered whole (its `when` reads `signal`), nor a sink run
            self.per_iteration_tool = False
            self.sink = None
            return
        if not self.per_iteration_tool:
            try:
                self.tool = render_tool(step, spec.scope)
                self.tool_nested = _has_container(self.tool)
            except TemplateError as e:
                self.tool_error = e
        self.sink = sink_call(step, spec.scope, element=step.loop.element)

    def render(self, step: Step, scope: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """(args, tool) for one iteration; raises TemplateError like rendering would
        (args first)."""
        args = self.args(scope) if self.args is not None else _fresh(self.args_const)
        if self.per_iteration_tool:
            return args, render_tool(step, scope)
        if self.tool_error is not None:
            raise self.tool_error
        assert self.tool is not None
        return args, (_fresh(self.tool) if self.tool_nested else dict(self.tool))

    def render_wait(self, scope: dict[str, Any]) -> tuple[Any, Any, Any]:
        """A wait iteration's (key, until, zone) as rendered (None where the tool has
        none); raises TemplateError like rendering would (key first)."""
        assert self.wait is not None
        w = self.wait
        key = self.wait_key(scope) if self.wait_key is not None else w.key
        until = self.wait_until(scope) if self.wait_until is not None else w.until
        zone = self.wait_zone(scope) if self.wait_zone is not None else w.zone
        return key, until, zone

    def wait_holds(self, step: Step, scope: dict[str, Any]) -> bool:
        """The wait's `when` over `scope` (the iteration's, with `signal`): absent is true."""
        assert self.wait is not None
        return render_condition(self.wait.when, scope, where="tool.when", step=step.step)
