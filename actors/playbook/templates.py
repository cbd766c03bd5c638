"""Jinja2 templates, the render API: sandboxed, strict about undefined names, bounded, JSON in and out.

A string that is exactly one `{{ expr }}` is evaluated as an expression and keeps its
type (a list stays a list); any other string with template syntax renders to a string.
Compiled templates are cached by source: the engine renders the same strings on
every step of every execution.

Every render is bounded by the limits of its execution (`wire.Limits`, fixed in its
start record): an operation budget, `template_ops` (actors/playbook/budget.py), and an
output bound, `template_output` (actors/playbook/bounds.py), enforced by the
instrumented environment the templates run in (actors/playbook/sandbox.py). The names
of those modules that the engine's shells and cores use are importable from here.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame

from actors.playbook.bounds import MAX_SOURCE, bounded_result, output_cap, too_big
from actors.playbook.budget import (
    DEFAULT_LIMITS,
    INLINE_TEMPLATE_OPS,
    RenderFault,
    RenderHalted,
    SliceExhausted,
    TemplateError,
    TemplateLimit,
    begin_budget,
    call_with_limits,
    call_with_slice,
    current_limits,
    end_budget,
    inline_slice,
    off_the_loop,
    template_limits,
    thread_state,
)
from actors.playbook.inline import inline_safe
from actors.playbook.sandbox import ENVIRONMENT, NotData, as_data

__all__ = [
    "DEFAULT_LIMITS",
    "INLINE_TEMPLATE_OPS",
    "RenderFault",
    "RenderHalted",
    "SliceExhausted",
    "TemplateError",
    "TemplateLimit",
    "call_with_limits",
    "call_with_slice",
    "check",
    "current_limits",
    "inline_slice",
    "is_template",
    "names_read",
    "off_the_loop",
    "render_condition",
    "render_value",
    "renders_inline",
    "template_limits",
]

_SINGLE_EXPR = re.compile(r"^\s*\{\{(?P<expr>(?:(?!\{\{|\}\}).)*)\}\}\s*$", re.DOTALL)
_HAS_SYNTAX = ("{{", "{%", "{#")


def is_template(value: Any) -> bool:
    return isinstance(value, str) and any(tok in value for tok in _HAS_SYNTAX)


# blocks (`{% if %}`, `{% for %}`, ...) or brackets nested in one another: Python's compiler
# refuses 20 nested loops, so a template that passes this check also compiles
MAX_NESTING = 16
_TAG = re.compile(r"\{%[-+]?\s*(\w+)")
_OPENERS = frozenset({"if", "for", "macro", "call", "filter", "block", "with", "autoescape", "raw"})
_BRACKETS = str.maketrans("([{)]}", "((()))")


def _refuse_deep(source: str) -> None:
    """Nesting is bounded before anything parses the source: Jinja's parser and Python's
    compiler recurse once per level (3,000 nested `{% if %}` exhaust the interpreter's
    stack; 120 its compiler's indentation). A linear scan: block tags, then brackets
    (counted in strings too, which only errs on the side of refusing)."""
    depth = 0
    for m in _TAG.finditer(source):
        word = m.group(1)
        if word in _OPENERS:
            depth += 1
            if depth > MAX_NESTING:
                raise TemplateLimit(f"blocks nested more than {MAX_NESTING} deep", limit="template_source")
        elif word.startswith("end"):
            depth = max(depth - 1, 0)
    depth = 0
    for c in source.translate(_BRACKETS):
        if c == "(":
            depth += 1
            if depth > MAX_NESTING:
                raise TemplateLimit(f"brackets nested more than {MAX_NESTING} deep", limit="template_source")
        elif c == ")":
            depth = max(depth - 1, 0)


@lru_cache(maxsize=4096)
def _compile(source: str) -> tuple[bool, Callable[..., Any]]:
    if len(source) > MAX_SOURCE:
        raise TemplateLimit(
            f"template of {len(source):,} characters (more than {MAX_SOURCE:,})", limit="template_source"
        )
    _refuse_deep(source)
    # compiling may evaluate constant parts: under a budget (the caller's, or its own)
    outer = begin_budget()
    try:
        m = _SINGLE_EXPR.match(source)
        if m:
            text = m.group("expr").strip()
            expr = ENVIRONMENT.compile_expression(text, undefined_to_none=False)
            if _PATH.match(text):
                return True, _Path(text.split("."), expr)
            return True, expr
        template = ENVIRONMENT.from_string(source)
        return False, functools.partial(_render_text, template)
    except (SyntaxError, RecursionError) as e:  # Python's compiler refused the code Jinja made for it
        raise TemplateLimit(f"template nested too deeply to compile ({e})", limit="template_source") from None
    finally:
        end_budget(outer)


# `{{ name }}` and `{{ name.key.key }}`: most templates in playbooks (a step's argument
# taken from the workload or an earlier step's result)
_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
_DICT_ATTRS = frozenset(dir(dict))  # `d.items` is the method to Jinja, not the key


class _Path:
    """A template that only reads a name and keys of mappings under it, looked up
    directly: Jinja builds a context and runs its code for it on every render. The
    lookup is Jinja's own result wherever it is direct (a scope name, then keys of
    plain dicts that are not dict attributes); anything else (a missing name or key,
    another type, a name that is also a dict method) is left to the compiled
    expression, which gives Jinja's value or error."""

    __slots__ = ("expr", "head", "tail")

    def __init__(self, parts: list[str], expr: Callable[..., Any]) -> None:
        self.head, self.tail, self.expr = parts[0], parts[1:], expr

    def __call__(self, **scope: Any) -> Any:
        return self.get(scope)

    def get(self, scope: Mapping[str, Any]) -> Any:
        value = self.direct(scope)
        return self.expr(**scope) if value is _Path else value

    def direct(self, scope: Mapping[str, Any]) -> Any:
        """The value looked up directly, or `_Path` (the class) when it is not direct."""
        value = scope.get(self.head, _Path)  # the class itself: a value no scope holds
        if value is _Path:
            return _Path
        for key in self.tail:
            if type(value) is not dict or key in _DICT_ATTRS or key not in value:
                return _Path
            value = value[key]
        return value


def _render_text(template: jinja2.Template, **scope: Any) -> str:
    """A string template's output, refused as soon as it passes the output bound (a
    loop printing in every iteration never builds the whole string)."""
    cap, total, parts = output_cap(), 0, []
    ctx = template.new_context(scope)
    try:
        for part in template.root_render_func(ctx):
            total += len(part)
            if total > cap:
                raise too_big(f"output of more than {total:,} characters")
            parts.append(part)
    except Exception:
        template.environment.handle_exception()
    return "".join(parts)


def check(source: str, *, compile: bool = True) -> set[str]:
    """Parse and compile `source`; return the root names it reads. Raises TemplateError.
    `compile=False` (a playbook loaded by a pod, on its event loop: compiling is the
    costly part, 0.3 s for 12 kB) only parses it and looks its filters and tests up;
    each template compiles when it first renders, where that render runs."""
    try:
        if len(source) > MAX_SOURCE:
            _compile(source)  # refused for its size, before anything parses it
        _refuse_deep(source)  # before parsing: the parser recurses per level
        m = _SINGLE_EXPR.match(source)
        ast_ = ENVIRONMENT.parse("{{ " + m.group("expr") + " }}" if m else source)
        names = _undeclared(ast_)
        if compile:
            _compile(source)  # unknown filters and tests are found only when compiling
        else:
            _known_filters_and_tests(ast_)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"template syntax error: {e.message}") from None
    except TemplateError:
        raise
    except jinja2.TemplateError as e:
        raise TemplateError(f"template error: {e}") from None
    except RecursionError:  # a chain of 330 `.a` or `|f`: the parser recurses once per link
        raise TemplateLimit("template nested too deeply to parse", limit="template_source") from None
    # `loop` inside a for-block is Jinja's own variable
    if any(isinstance(n, nodes.For) for n in ast_.find_all(nodes.For)):
        names.discard("loop")
    return names


def _known_filters_and_tests(ast_: nodes.Template) -> None:
    for f in ast_.find_all(nodes.Filter):
        if f.name not in ENVIRONMENT.filters:
            raise TemplateError(f"template error: no filter named {f.name!r}")
    for t in ast_.find_all(nodes.Test):
        if t.name not in ENVIRONMENT.tests:
            raise TemplateError(f"template error: no test named {t.name!r}")


class _Names(CodeGenerator):
    """Jinja's own introspection (`meta.find_undeclared_variables`) without its optimizer,
    which tries to fold every filter chain into a constant at every link: cubic in the
    chain's length (19 s for 300 `|upper`)."""

    def __init__(self, environment: jinja2.Environment) -> None:
        super().__init__(environment, "<introspection>", "<introspection>", optimized=False)
        self.undeclared: set[str] = set()

    def write(self, x: str) -> None:
        pass

    def enter_frame(self, frame: Frame) -> None:
        super().enter_frame(frame)
        for action, param in frame.symbols.loads.values():
            if action == "resolve" and param not in self.environment.globals:
                self.undeclared.add(param)


def _undeclared(ast_: nodes.Template) -> set[str]:
    tracker = _Names(ENVIRONMENT)
    tracker.visit(ast_)
    return tracker.undeclared


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CODE = re.compile(r"\{\{.*?(?:\}\}|\Z)|\{%.*?(?:%\}|\Z)", re.DOTALL)  # what is between delimiters


def names_read(value: Any) -> set[str]:
    """Every name the templates inside `value` may read (dicts and lists walked): each
    identifier between their delimiters, a superset of the root names they read, found without
    parsing (what a pod ships to a render process, a loop or a sink is the scope's
    entries of these names; an extra one costs a copy, never a wrong result)."""
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
    return frozenset(name for code in _CODE.findall(source) for name in _IDENTIFIER.findall(code))


def renders_inline(value: Any) -> bool:
    """Whether every template inside `value` is cheap by construction
    (actors/playbook/inline.py): a pod may render it on its own thread."""
    if isinstance(value, str):
        return not is_template(value) or inline_safe(value)
    if isinstance(value, dict):
        return all(renders_inline(v) for v in value.values())
    if isinstance(value, list):
        return all(renders_inline(v) for v in value)
    return True


def render_value(value: Any, scope: Mapping[str, Any], *, where: str = "", step: str = "") -> Any:
    """Render every template string inside `value` (dicts and lists recursively), under
    one budget. `step` names the step in a render process's fault.

    Where it renders: on this thread when the templates are cheap by construction, or
    when nothing else is set up (a render process, the CLI, the tests' pure harness);
    otherwise in a render process (`remote`, off the event loop), or not at all on the
    event loop: `SliceExhausted` moves the fold to a thread that has one."""
    if isinstance(value, str) and not is_template(value):
        return value  # the common case: nothing to render, no budget to set up
    st = thread_state
    if not st.depth and (st.remote is not None or st.slice_left is not None) and not renders_inline(value):
        if st.remote is None:
            raise SliceExhausted  # on the event loop: never run what could take long
        return st.remote(value, scope, where, st.limits, step)  # in a process of its own, with OS limits
    outer = begin_budget()
    try:
        return _render(value, scope, where)
    finally:
        end_budget(outer)


def _render(value: Any, scope: Mapping[str, Any], where: str) -> Any:
    if isinstance(value, str):
        if not is_template(value):
            return value
        try:
            single, fn = _compile(value)
            if type(fn) is _Path:
                out = fn.direct(scope)
                if out is not _Path:
                    # the scope's own value, JSON data by construction (decoded from the
                    # log, or checked when it was made): handed on as it is, not walked
                    return out
                fn = fn.expr
            out = fn(**scope)
            if single:
                if isinstance(out, jinja2.Undefined):
                    str(out)  # a StrictUndefined leaking out of an expression: raises, naming it
                out = as_data(out)
                bounded_result(out, scope, _names_of(value))
                return out
            return out
        except TemplateError as e:
            raise type(e)(
                e.message, where=where, **({"limit": e.limit} if isinstance(e, TemplateLimit) else {})
            ) from None
        except NotData as e:
            raise TemplateError(f"template {_short(value)}: value {e}", where=where) from None
        except MemoryError:
            raise  # the machine's state, not the template's: the actor retries, it does not decide
        except jinja2.UndefinedError as e:
            raise TemplateError(f"undefined name in template {_short(value)}: {e.message}", where=where) from None
        except jinja2.TemplateError as e:
            raise TemplateError(f"template {_short(value)}: {e}", where=where) from None
        except Exception as e:
            raise TemplateError(f"template {_short(value)} raised {type(e).__name__}: {e}", where=where) from None
    if isinstance(value, dict):
        return {k: _render(v, scope, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_render(v, scope, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def _short(source: str, limit: int = 200) -> str:
    return repr(source if len(source) <= limit else source[:limit] + "...")


def render_condition(source: str | None, scope: Mapping[str, Any], *, where: str = "", step: str = "") -> bool:
    """A `when`: absent means true; a rendered string is truthy unless it says false."""
    if source is None:
        return True
    out = render_value(source, scope, where=where, step=step)
    if isinstance(out, str):
        return out.strip().lower() not in ("", "false", "0", "none", "no", "null")
    return bool(out)
