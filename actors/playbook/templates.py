"""Jinja2 templates, sandboxed, strict about undefined names.

A string that is exactly one `{{ expr }}` is evaluated as an expression and keeps its
type (a list stays a list); any other string with template syntax renders to a string.
Compiled templates are cached by source: the engine renders the same strings on
every step of every execution.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

import jinja2
from jinja2 import meta, nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

_SINGLE_EXPR = re.compile(r"^\s*\{\{(?P<expr>(?:(?!\{\{|\}\}).)*)\}\}\s*$", re.DOTALL)
_HAS_SYNTAX = ("{{", "{%", "{#")

_env = ImmutableSandboxedEnvironment(undefined=jinja2.StrictUndefined, autoescape=False)


class TemplateError(Exception):
    """A template that cannot be compiled or rendered. `where` names the field."""

    def __init__(self, message: str, *, where: str = "") -> None:
        super().__init__(f"{where}: {message}" if where else message)
        self.message = message
        self.where = where


def is_template(value: Any) -> bool:
    return isinstance(value, str) and any(tok in value for tok in _HAS_SYNTAX)


@lru_cache(maxsize=4096)
def _compile(source: str) -> tuple[bool, Callable[..., Any]]:
    m = _SINGLE_EXPR.match(source)
    if m:
        expr = _env.compile_expression(m.group("expr").strip(), undefined_to_none=False)
        return True, expr
    return False, _env.from_string(source).render


def check(source: str) -> set[str]:
    """Compile `source`; return the root names it reads. Raises TemplateError."""
    try:
        m = _SINGLE_EXPR.match(source)
        ast = _env.parse("{{ " + m.group("expr") + " }}" if m else source)
        names = set(meta.find_undeclared_variables(ast))
        _compile(source)  # unknown filters and tests are found only when compiling
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"template syntax error: {e.message}") from None
    # `loop` inside a for-block is Jinja's own variable
    if any(isinstance(n, nodes.For) for n in ast.find_all(nodes.For)):
        names.discard("loop")
    return names


def names_read(value: Any) -> set[str]:
    """The root names every template inside `value` reads (dicts and lists walked);
    templates that do not compile read nothing here (the loader reports them)."""
    if isinstance(value, str):
        if not is_template(value):
            return set()
        return set(_names_of(value))
    if isinstance(value, dict):
        return set().union(*(names_read(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(names_read(v) for v in value)) if value else set()
    return set()


@lru_cache(maxsize=4096)
def _names_of(source: str) -> frozenset[str]:
    try:
        return frozenset(check(source))
    except TemplateError:
        return frozenset()


def render_value(value: Any, scope: Mapping[str, Any], *, where: str = "") -> Any:
    """Render every template string inside `value` (dicts and lists recursively)."""
    if isinstance(value, str):
        if not is_template(value):
            return value
        try:
            single, fn = _compile(value)
            out = fn(**scope)
            if single and isinstance(out, jinja2.Undefined):
                # a StrictUndefined leaking out of an expression: force the error
                str(out)
            return out
        except jinja2.UndefinedError as e:
            raise TemplateError(f"undefined name in template {value!r}: {e.message}", where=where) from None
        except jinja2.TemplateError as e:
            raise TemplateError(f"template {value!r}: {e}", where=where) from None
        except Exception as e:
            raise TemplateError(f"template {value!r} raised {type(e).__name__}: {e}", where=where) from None
    if isinstance(value, dict):
        return {k: render_value(v, scope, where=f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [render_value(v, scope, where=f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def render_condition(source: str | None, scope: Mapping[str, Any], *, where: str = "") -> bool:
    """A `when`: absent means true; a rendered string is truthy unless it says false."""
    if source is None:
        return True
    out = render_value(source, scope, where=where)
    if isinstance(out, str):
        return out.strip().lower() not in ("", "false", "0", "none", "no", "null")
    return bool(out)
