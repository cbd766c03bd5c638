"""Shorthands: a step's fields rewritten from the user's form (docs/language.md) into the
model's form (`tool: python`, `next: b`, `retry: 3`, `on_failure: cleanup`, ...),
remembering where each rewritten value came from (`StepCtx.remap`) so that errors point
at what the user wrote.
"""

from __future__ import annotations

import re
from typing import Any

from actors.playbook.errors import Reporter, StepCtx, kind_of, suggest
from actors.playbook.model import TOOL_KINDS
from actors.playbook.yaml_lines import KeyPath

DEFAULT_RETRY_WHEN = "{{ error is not none }}"
_DIGITS = re.compile(r"^\s*\d+\s*$")
_PERCENT = re.compile(r"^(\d+(?:\.\d+)?)%$")
_KINDS_TEXT = ", ".join(TOOL_KINDS)
BAD = object()  # a field whose normalisation already reported an error


class Partial:
    """A field normalised as far as it goes, with errors already reported: checked
    for targets and templates, never converted."""

    def __init__(self, value: Any) -> None:
        self.value = value


def _names_list(ctx: StepCtx, value: Any, norm: KeyPath, user: KeyPath) -> Any:
    """A `then`/`else` target: a step name or a list of them."""
    if isinstance(value, str):
        ctx.remap((*norm, 0), user)
        return [value]
    return value


class Shorthands:
    """Rewrites one field at a time (`normalise`), reporting what cannot be rewritten."""

    def __init__(self, report: Reporter) -> None:
        self.report = report

    def normalise(self, ctx: StepCtx, field: str, value: Any) -> Any:
        if field == "tool":
            return self._tool(ctx, value, ("tool",))
        if field == "next":
            return self._next(ctx, value)
        if field == "retry":
            return self._retry(ctx, value)
        if field == "on_failure":
            return self._on_failure(ctx, value)
        if field == "on_error" and isinstance(value, dict):
            ctx.remap(("on_error", 0), ("on_error",))
            return [value]
        if field == "loop":
            return self._loop(ctx, value)
        if field == "sink" and isinstance(value, dict) and "tool" in value:
            return self._sink(ctx, value)
        return value

    def _sink(self, ctx: StepCtx, value: dict[str, Any]) -> Any:
        if isinstance(value["tool"], str) and set(value) - {"tool", "args"}:
            # the design documents' flat shape, `sink: {tool: postgres, table: t, mode: append,
            # auth: ...}`: the tool's fields beside `tool`, as `sink: {tool: {kind: postgres, ...}}`
            fields = {k: v for k, v in value.items() if k not in ("tool", "args")}
            if "kind" in fields:
                self.report.step_error(ctx, ("sink", "kind"), "a flat sink names its kind in `tool`: drop `kind`")
                return BAD
            kind = self._tool(ctx, value["tool"], ("sink", "tool"))
            if kind is BAD:
                return BAD
            ctx.remap(("sink", "tool"), ("sink",))  # what is said of the whole tool is said of the sink
            for k in fields:
                ctx.remap(("sink", "tool", k), ("sink", k))
            ctx.remap(("sink", "tool", "kind"), ("sink", "tool"))
            flat = {"tool": {**kind, **fields}}
            return {**flat, "args": value["args"]} if "args" in value else flat
        tool = self._tool(ctx, value["tool"], ("sink", "tool"))
        return BAD if tool is BAD else {**value, "tool": tool}

    def _tool(self, ctx: StepCtx, value: Any, at: KeyPath) -> Any:
        if isinstance(value, str):
            if value not in TOOL_KINDS:
                self.report.step_error(
                    ctx, at, f"unknown tool kind {value!r} (one of: {_KINDS_TEXT}){suggest(value, TOOL_KINDS)}"
                )
                return BAD
            return {"kind": value}
        if isinstance(value, dict):
            if "kind" not in value:
                self.report.step_error(ctx, at, f"a tool needs a 'kind' (one of: {_KINDS_TEXT})")
                return BAD
            kind = value["kind"]
            if not isinstance(kind, str) or kind not in TOOL_KINDS:
                self.report.step_error(
                    ctx,
                    (*at, "kind"),
                    f"unknown tool kind {kind!r} (one of: {_KINDS_TEXT}){suggest(kind, TOOL_KINDS)}",
                )
                return BAD
        return value

    def _next(self, ctx: StepCtx, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, str):  # next: b
            ctx.remap(("next", 0), ("next",))
            ctx.remap(("next", 0, "then", 0), ("next",))
            return [{"then": [value]}]
        if isinstance(value, dict):  # next: {when: ..., then: b}
            ctx.remap(("next", 0), ("next",))
            rules: list[Any] = [value]
        elif isinstance(value, list):
            if not value:
                self.report.step_error(ctx, ("next",), "an empty next routes nowhere; omit next to route to end")
                return BAD
            if all(isinstance(v, str) for v in value):  # next: [b, c]
                ctx.remap(("next", 0), ("next",))
                for k in range(len(value)):
                    ctx.remap(("next", 0, "then", k), ("next", k))
                return [{"then": list(value)}]
            if any(isinstance(v, str) for v in value):
                self.report.step_error(
                    ctx,
                    ("next",),
                    "next mixes step names and rules: use a list of step names (parallel branches) "
                    "or a list of rules ({when, then} or {else})",
                )
                return BAD
            rules = value
        else:
            self.report.step_error(
                ctx,
                ("next",),
                f"next must be a step name, a list of step names or a list of rules, not {kind_of(value)}",
            )
            return BAD
        out: list[Any] = []
        bad = False
        for i, rule in enumerate(rules):
            if not isinstance(rule, dict):
                out.append(rule)  # msgspec names the type
                continue
            for k in rule:
                if k not in ("when", "then", "else"):
                    self.report.step_error(
                        ctx, ("next", i, k), f"unknown key {k!r}{suggest(k, ('when', 'then', 'else'))}"
                    )
                    bad = True
            r = {k: v for k, v in rule.items() if k in ("when", "then")}
            if "else" in rule:
                if "when" in rule:
                    self.report.step_error(ctx, ("next", i), "a rule has both 'when' and 'else'")
                    bad = True
                if "then" in rule:
                    self.report.step_error(ctx, ("next", i), "a rule has both 'then' and 'else'")
                    bad = True
                ctx.remap(("next", i, "then"), ("next", i, "else"))
                r["then"] = _names_list(ctx, rule["else"], ("next", i, "then"), ("next", i, "else"))
                if i != len(rules) - 1:
                    self.report.step_error(ctx, ("next", i + 1), "unreachable: an 'else' rule must be the last rule")
                    bad = True
            elif "then" not in rule:
                self.report.step_error(ctx, ("next", i), "a rule needs 'then' (or 'else')")
                bad = True
            else:
                r["then"] = _names_list(ctx, rule["then"], ("next", i, "then"), ("next", i, "then"))
            if r.get("then") == []:
                self.report.step_error(ctx, ("next", i, "then"), "an empty target list routes nowhere")
                bad = True
            out.append(r)
        return Partial(out) if bad else out

    def _retry(self, ctx: StepCtx, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, bool):
            self.report.step_error(
                ctx, ("retry",), "retry must be a count, a policy mapping or a list of rules, not a boolean"
            )
            return BAD
        if isinstance(value, int):  # retry: 3
            ctx.remap(("retry", 0), ("retry",))
            ctx.remap(("retry", 0, "then", "max_attempts"), ("retry",))
            return [{"when": DEFAULT_RETRY_WHEN, "then": {"max_attempts": value}}]
        if isinstance(value, dict):
            ctx.remap(("retry", 0), ("retry",))
            if "then" in value or "when" in value:  # one rule
                return [value]
            ctx.remap(("retry", 0, "then"), ("retry",))  # retry: {max_attempts: 3, ...}
            return [{"when": DEFAULT_RETRY_WHEN, "then": value}]
        return value

    def _on_failure(self, ctx: StepCtx, value: Any) -> Any:
        if isinstance(value, str):  # on_failure: cleanup
            ctx.remap(("on_failure", 0), ("on_failure",))
            return [{"step": value}]
        if isinstance(value, dict):
            ctx.remap(("on_failure", 0), ("on_failure",))
            return [value]
        if isinstance(value, list):
            out: list[Any] = []
            for k, item in enumerate(value):
                if isinstance(item, str):
                    ctx.remap(("on_failure", k, "step"), ("on_failure", k))
                    out.append({"step": item})
                else:
                    out.append(item)
            return out
        return value

    def _loop(self, ctx: StepCtx, value: Any) -> Any:
        if not isinstance(value, dict) or "tolerated_failures" not in value:
            return value
        out = dict(value)
        tf = out["tolerated_failures"]
        if isinstance(tf, str):
            if _DIGITS.match(tf):
                out["tolerated_failures"] = int(tf)
            elif (m := _PERCENT.match(tf.strip())) is None:
                self.report.step_error(
                    ctx,
                    ("loop", "tolerated_failures"),
                    f"tolerated_failures must be a count (3) or a percentage ('5%'), not {tf!r}",
                )
                out["tolerated_failures"] = 0
            elif float(m.group(1)) > 100:
                self.report.step_error(ctx, ("loop", "tolerated_failures"), f"tolerated_failures {tf!r} is above 100%")
                out["tolerated_failures"] = 0
            else:
                out["tolerated_failures"] = tf.strip()
        return out
