"""Checks that span steps: duplicate names, routing targets, `end`, loop element
names; and every template compiled, the root names it reads checked against the names
in scope where it is rendered.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import jinja2

from actors.playbook import templates
from actors.playbook.errors import Reporter, StepCtx, suggest
from actors.playbook.model import END, UNRENDERED_TOOL_FIELDS, WaitTool
from actors.playbook.yaml_lines import KeyPath

# names a template may read in next/retry/on_error/on_failure conditions and in sinks
OUTCOME_NAMES = frozenset({"result", "response", "error", "attempt"})
# names a loop element must not take
RESERVED_NAMES = frozenset({"workload", "execution_id", "iteration", "failure"}) | OUTCOME_NAMES

STEP_NAME = re.compile(r"^[a-z0-9_]+$")
_OUTCOME_HINT = (
    " ('result', 'response', 'error' and 'attempt' are in scope only in next, retry, on_error and "
    "on_failure rules and in sink)"
)


class _Names:
    """The names in scope where a template is rendered: those every step sees (each
    step's name, ...) and this step's own few. Kept apart so that checking a long
    workflow does not copy every step name for every step."""

    def __init__(self, everywhere: frozenset[str], own: frozenset[str]) -> None:
        self.everywhere = everywhere
        self.own = own

    def __contains__(self, name: object) -> bool:
        return name in self.own or name in self.everywhere

    def __iter__(self) -> Iterator[str]:
        yield from self.own
        yield from self.everywhere

    def missing(self, used: frozenset[str]) -> list[str]:
        return sorted(name for name in used if name not in self)


def _items(value: Any) -> Iterator[tuple[int, dict[Any, Any]]]:
    """(index, rule) for each mapping in a normalised rule list."""
    if isinstance(value, list):
        for i, item in enumerate(value):
            if isinstance(item, dict):
                yield i, item


def _strings(value: Any, path: KeyPath, seen: set[int] | None = None) -> Iterator[tuple[KeyPath, str]]:
    """Every string inside `value` (mappings and lists, recursively) with its path."""
    if isinstance(value, str):
        yield path, value
        return
    if isinstance(value, (dict, list)):
        seen = set() if seen is None else seen
        if id(value) in seen:  # a YAML alias shared many times: check it once
            return
        seen.add(id(value))
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for k, v in items:
            yield from _strings(v, (*path, k), seen)


@lru_cache(maxsize=4096)
def _template_names(source: str) -> frozenset[str]:
    try:
        return frozenset(templates.check(source, compile=False))  # compiled where it renders
    except jinja2.TemplateError as e:  # e.g. an unknown filter, found while collecting names
        raise templates.TemplateError(f"template syntax error: {e.message or e}") from None


class StepChecks:
    """The checks of a whole workflow, once each step is normalised and converted."""

    def __init__(self, report: Reporter) -> None:
        self.report = report

    def across_steps(self, ctxs: list[StepCtx]) -> None:
        names = {ctx.label for ctx in ctxs if ctx.label}
        known = names | {END}
        first: dict[str, int | None] = {}
        for ctx in ctxs:
            if ctx.label is None:
                continue
            if ctx.label in first:
                at = first[ctx.label]
                where = f" (first at line {at})" if at is not None else ""
                self.report.step_error(ctx, ("step",), f"duplicate step name {ctx.label!r}{where}")
            else:
                first[ctx.label] = self.report.line(("workflow", ctx.index, "step"))

        def target(ctx: StepCtx, name: Any, at: KeyPath) -> None:
            if isinstance(name, str) and STEP_NAME.match(name) and name not in known:
                self.report.step_error(ctx, at, f"unknown step {name!r}{suggest(name, known)}")

        for ctx in ctxs:
            if not isinstance(ctx.raw, dict):
                continue
            if ctx.label == END and ctx.raw.get("next") is not None:
                self.report.step_error(
                    ctx, ("next",), "the 'end' step must not have 'next': every branch converges there"
                )
            for i, rule in _items(ctx.norm.get("next")):
                then = rule.get("then")
                for k, name in enumerate(then if isinstance(then, list) else []):
                    target(ctx, name, ("next", i, "then", k))
            for i, edge in _items(ctx.norm.get("on_failure")):
                target(ctx, edge.get("step"), ("on_failure", i, "step"))
            element = ctx.loop_element
            if element in RESERVED_NAMES:
                self.report.step_error(
                    ctx, ("loop", "element"), f"loop element {element!r} shadows the template name {element!r}"
                )
            elif element in names:
                self.report.step_error(
                    ctx, ("loop", "element"), f"loop element {element!r} shadows the result of step {element!r}"
                )

    def loop_signals(self, ctxs: list[StepCtx]) -> None:
        """A loop of waits owns its signal name: the engine forwards every signal of
        that name to the loop, whatever its key (the keys its iterations wait on are
        rendered by the counter, per iteration), so no other wait step may wait for it:
        one step's signals would go to the other, and be lost there."""
        waits: list[tuple[StepCtx, str, bool]] = []  # (step, its signal, whether a loop)
        for ctx in ctxs:
            tool = ctx.converted.get("tool")
            if isinstance(tool, WaitTool) and tool.signal is not None:
                waits.append((ctx, tool.signal, isinstance(ctx.norm.get("loop"), dict)))
        for j, (ctx, name, loop) in enumerate(waits):
            for other, other_name, other_loop in waits[:j]:
                if other_name != name or not (loop or other_loop):
                    continue
                # told at the loop (the later one when both are loops), naming the other
                at, with_ = (ctx, other) if loop else (other, ctx)
                line = self.report.line(("workflow", with_.index, "step"))
                where = f" (line {line})" if line is not None else ""
                self.report.step_error(
                    at,
                    ("tool", "signal"),
                    f"signal {name!r} is also waited for by step {with_.label!r}{where}: a loop of waits owns "
                    f"its signal name (every signal of that name goes to the loop, whatever its key); give one "
                    f"of the two steps another signal name",
                )

    # -- templates ----------------------------------------------------------------

    def templates(self, ctxs: list[StepCtx]) -> None:
        names = frozenset(ctx.label for ctx in ctxs if ctx.label)
        remediation = {
            edge["step"]
            for ctx in ctxs
            for _, edge in _items(ctx.norm.get("on_failure"))
            if isinstance(edge.get("step"), str)
        }
        everywhere = names | {"workload", "execution_id"}
        for ctx in ctxs:
            n = ctx.norm
            if not n:
                continue
            own = {"failure"} if ctx.label in remediation else set()
            outer = _Names(everywhere, frozenset(own))
            if isinstance(n.get("loop"), dict):
                own.add("iteration")
                if ctx.loop_element:
                    own.add(ctx.loop_element)
            base = _Names(everywhere, frozenset(own))
            outcome = _Names(everywhere, frozenset(own | OUTCOME_NAMES))

            self._walk(ctx, n.get("args"), ("args",), base)
            tool = n.get("tool")
            if isinstance(tool, dict):
                for k, v in tool.items():
                    if tool.get("kind") == "wait" and k == "when":  # rendered per signal: `signal` in scope
                        self._condition(ctx, v, ("tool", k), _Names(everywhere, frozenset(own | {"signal"})))
                    elif k not in UNRENDERED_TOOL_FIELDS:
                        self._walk(ctx, v, ("tool", k), base)
            loop = n.get("loop")
            if isinstance(loop, dict) and "collection" in loop:
                # rendered once, before any iteration: no element, no `iteration`
                self._walk(ctx, loop["collection"], ("loop", "collection"), outer)
            for i, rule in _items(n.get("next")):
                self._condition(ctx, rule.get("when"), ("next", i, "when"), outcome)
            for i, rule in _items(n.get("retry")):
                self._condition(ctx, rule.get("when"), ("retry", i, "when"), outcome)
                then = rule.get("then")
                if isinstance(then, dict):
                    for key in ("next_call", "collect"):
                        self._walk(ctx, then.get(key), ("retry", i, "then", key), outcome)
            for i, rule in _items(n.get("on_error")):
                self._condition(ctx, rule.get("when"), ("on_error", i, "when"), outcome)
                for key in ("result", "args"):
                    self._walk(ctx, rule.get(key), ("on_error", i, key), outcome)
            for i, edge in _items(n.get("on_failure")):
                self._condition(ctx, edge.get("when"), ("on_failure", i, "when"), outcome)
            sink = n.get("sink")
            if isinstance(sink, dict):
                stool = sink.get("tool")
                if isinstance(stool, dict):
                    for k, v in stool.items():
                        if k not in UNRENDERED_TOOL_FIELDS:
                            self._walk(ctx, v, ("sink", "tool", k), outcome)
                self._walk(ctx, sink.get("args"), ("sink", "args"), outcome)

    def _walk(self, ctx: StepCtx, value: Any, at: KeyPath, scope: _Names) -> None:
        for path, source in _strings(value, at):
            if templates.is_template(source):
                self._template(ctx, path, source, scope)

    def _condition(self, ctx: StepCtx, value: Any, at: KeyPath, scope: _Names) -> None:
        if not isinstance(value, str):
            return  # absent, or msgspec already named the type
        if templates.is_template(value):
            self._template(ctx, at, value, scope)
        elif value.strip().lower() not in ("true", "false"):
            self.report.step_error(
                ctx,
                at,
                f'a condition must be a template such as "{{{{ {value.strip()} }}}}" (a plain string is always true)',
            )

    def _template(self, ctx: StepCtx, at: KeyPath, source: str, scope: _Names) -> None:
        try:
            used = _template_names(source)
        except templates.TemplateError as e:
            self.report.step_error(ctx, at, e.message)
            return
        for name in scope.missing(used):
            self.report.step_error(ctx, at, f"undefined name {name!r} in template{self._hint(ctx, at, name, scope)}")

    @staticmethod
    def _hint(ctx: StepCtx, at: KeyPath, name: str, scope: _Names) -> str:
        if name in OUTCOME_NAMES:
            return _OUTCOME_HINT
        if name == "failure":
            return " ('failure' is in scope only in a step that some step's on_failure names)"
        if at[:2] == ("loop", "collection") and (name == "iteration" or name == ctx.loop_element):
            return " (the collection is rendered once, before any iteration)"
        if name == "iteration":
            return " ('iteration' is in scope only in a step with a loop)"
        return suggest(name, scope)
