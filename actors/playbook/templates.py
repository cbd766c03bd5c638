"""Jinja2 templates: sandboxed, strict about undefined names, bounded, JSON in and out.

A string that is exactly one `{{ expr }}` is evaluated as an expression and keeps its
type (a list stays a list); any other string with template syntax renders to a string.
Compiled templates are cached by source: the engine renders the same strings on
every step of every execution.

Bounds (`wire.Limits`, fixed per execution in its start record). A template is user
code running inside the engine, so every render has
* an operation budget, `template_ops`: the compiled template is instrumented (see
  `_Instrument`) so that every loop iteration and macro call costs one operation, and
  work the sandbox sees done in one go (a filter, a method call, `+`, `*`, `~`, `in`, a
  slice) costs one per element it touches. The count is a pure function of template
  and scope, so the outcome is the same on every replay, on any pod, however loaded:
  a CPU-time deadline would not be. Exhausting it raises `TemplateLimit`;
* an output bound, `template_output`: no string, list or mapping the template builds,
  nor its result, may exceed it, and operations that would build a larger one (`'a' *
  10**9`, `9 ** 9 ** 9`, `'%999999999d'`, `'x'.ljust(10**9)`, `|center(10**9)`) are
  refused *before* they allocate. Jinja folds constant expressions at compile time, so
  these operators are intercepted (which also stops the folding): `validate` is bounded
  too.

Values are JSON data: a template's result, and every `{{ }}` inside a string template,
must be null, a boolean, a number, a string, a list or a mapping with string keys;
anything else (`{{ self }}`, `{{ range(3) }}`, a method) is a `TemplateError`. And
mapping keys win over attributes: `{{ workload.items }}` is the key `items`, not the
dict's method.

Keeping the event loop free. Renders run inline; the engine and counter shells give
each fold a small slice of operations (`inline_slice`). A render that needs more raises
`SliceExhausted` (a BaseException, so nothing in the pure core catches it); the shell
then rebuilds that actor and folds its inputs on a worker thread (`off_the_loop`), which
hands each render to a render process (actors/render_process.py) or, without one,
renders itself and yields the interpreter every `YIELD_EVERY` operations
(bench/template_budget.py measures both).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import operator
import re
import threading
import time
import types
from collections.abc import Callable, Iterator, Mapping
from functools import lru_cache
from typing import Any, TypeVar

import jinja2
import msgspec
from jinja2 import meta, nodes
from jinja2.nodes import EvalContext
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment
from markupsafe import Markup

from actors.wire import Limits

_SINGLE_EXPR = re.compile(r"^\s*\{\{(?P<expr>(?:(?!\{\{|\}\}).)*)\}\}\s*$", re.DOTALL)
_HAS_SYNTAX = ("{{", "{%", "{#")
_DIGITS = re.compile(r"\d+")

T = TypeVar("T")
DEFAULT_LIMITS = Limits()
YIELD_EVERY = 2_000  # operations between two yields of the interpreter, off the event loop
YIELD_PAUSE = 50e-6  # seconds each yield sleeps: long enough for the waiting loop thread to take over
# operations a fold may spend rendering on the event loop (a few milliseconds) before its
# actor moves to a worker thread: almost every template takes a few dozen
INLINE_TEMPLATE_OPS = 50_000


class TemplateError(Exception):
    """A template that cannot be compiled or rendered. `where` names the field."""

    kind = "TemplateError"  # the error type a failed step records

    def __init__(self, message: str, *, where: str = "") -> None:
        super().__init__(f"{where}: {message}" if where else message)
        self.message = message
        self.where = where


class TemplateLimit(TemplateError):
    """A template went past one of its bounds; `limit` says which (`template_ops` or
    `template_output`)."""

    kind = "TemplateLimit"

    def __init__(self, message: str, *, limit: str, where: str = "") -> None:
        super().__init__(message, where=where)
        self.limit = limit


class SliceExhausted(BaseException):
    """The inline slice of a fold ran out: fold this actor's inputs off the event loop."""


class RenderHalted(BaseException):
    """A render on a worker thread was told to stop (its pod is stopping)."""


# --- the budget ----------------------------------------------------------------------


class _Budget:
    """Operations used by one render, and where the next check is due: past the
    budget, past the fold's inline slice, or (off the event loop) at the next yield."""

    __slots__ = ("depth", "halt", "limits", "polite", "slice_stop", "stop", "used")

    def __init__(self, limits: Limits, *, slice_stop: int | None = None, polite: bool = False,
                 halt: threading.Event | None = None) -> None:
        self.limits = limits
        self.halt = halt
        self.used = 0
        self.depth = 0  # macro calls in progress
        self.slice_stop = slice_stop
        self.polite = polite
        self.stop = self._next_stop()

    def _next_stop(self) -> int:
        stop = self.limits.template_ops
        if self.slice_stop is not None:
            stop = min(stop, self.slice_stop)
        if self.polite:
            stop = min(stop, self.used + YIELD_EVERY)
        return stop

    def over(self) -> None:
        if self.used > self.limits.template_ops:
            raise TemplateLimit(f"template took more than its budget of {self.limits.template_ops:,} operations "
                                "(template_ops)", limit="template_ops")
        if self.slice_stop is not None and self.used > self.slice_stop:
            raise SliceExhausted
        if self.halt is not None and self.halt.is_set():
            raise RenderHalted
        time.sleep(YIELD_PAUSE)  # off the event loop: let the loop's thread take the interpreter
        self.stop = self._next_stop()


class _ThreadState(threading.local):
    def __init__(self) -> None:
        self.budget = _Budget(DEFAULT_LIMITS)
        self.limits = DEFAULT_LIMITS  # what a render started now is bounded by
        self.slice_left: int | None = None  # inline operations left in this fold; None: no slice
        self.polite = False  # yield the interpreter now and then (a worker thread)
        self.halt: threading.Event | None = None  # set: a render off the loop stops at its next yield
        # renders elsewhere (actors/render_process.py): value, scope, where, limits -> value
        self.remote: Callable[[Any, Mapping[str, Any], str, Limits], Any] | None = None
        self.depth = 0


_state = _ThreadState()


def _tick(n: int = 1) -> None:
    """One operation (or `n`): called by instrumented templates and the environment."""
    b = _state.budget
    b.used += n
    if b.used > b.stop:
        b.over()


@contextlib.contextmanager
def template_limits(limits: Limits) -> Iterator[None]:
    """Renders inside are bounded by `limits` (an execution's, from its start record)."""
    previous = _state.limits
    _state.limits = limits
    try:
        yield
    finally:
        _state.limits = previous


def call_with_limits(limits: Limits, fn: Callable[[], T]) -> T:
    """`fn()` with renders bounded by `limits`: `template_limits` without a context
    manager's cost, for the per-input path of the engine and the counter."""
    st = _state
    previous, st.limits = st.limits, limits
    try:
        return fn()
    finally:
        st.limits = previous


def call_with_slice(ops: int, fn: Callable[[], T]) -> T:
    """`fn()` with `ops` inline operations for its renders (`inline_slice`, cheaper)."""
    st = _state
    previous, st.slice_left = st.slice_left, ops
    try:
        return fn()
    finally:
        st.slice_left = previous


@contextlib.contextmanager
def inline_slice(ops: int) -> Iterator[None]:
    """Renders inside may take `ops` operations in all before `SliceExhausted`."""
    previous = _state.slice_left
    _state.slice_left = ops
    try:
        yield
    finally:
        _state.slice_left = previous


@contextlib.contextmanager
def off_the_loop(halt: threading.Event | None = None,
                 remote: Callable[[Any, Mapping[str, Any], str, Limits], Any] | None = None) -> Iterator[None]:
    """For a worker thread: no slice, and a long render yields the interpreter (and
    stops with RenderHalted at a yield once `halt` is set); with `remote`, renders are
    handed to it instead (a render process: the thread then waits without the lock)."""
    previous = _state.polite, _state.slice_left, _state.halt, _state.remote
    _state.polite, _state.slice_left, _state.halt, _state.remote = True, None, halt, remote
    try:
        yield
    finally:
        _state.polite, _state.slice_left, _state.halt, _state.remote = previous


def current_limits() -> Limits:
    """The limits renders on this thread are bounded by now (set by `template_limits`)."""
    return _state.limits


def _begin_budget() -> _Budget | None:
    """A fresh budget for an outermost render (nested ones share it); returns the one it
    replaces, for `_end_budget`."""
    st = _state
    st.depth += 1
    if st.depth > 1:
        return None
    outer = st.budget
    st.budget = _Budget(st.limits, slice_stop=st.slice_left, polite=st.polite, halt=st.halt)
    return outer


def _end_budget(outer: _Budget | None) -> None:
    st = _state
    st.depth -= 1
    if outer is None:
        return
    if st.slice_left is not None:
        st.slice_left -= st.budget.used
    st.budget = outer


def _cap() -> int:
    return _state.budget.limits.template_output


def _too_big(what: str) -> TemplateLimit:
    return TemplateLimit(f"{what} would exceed the output bound of {_cap():,} (template_output)",
                         limit="template_output")


def _size(value: Any) -> int:
    return len(value) if isinstance(value, (str, bytes, list, tuple, dict, set, frozenset, range)) else 1


def _built(value: Any, *inputs: Any) -> Any:
    """A string a filter or method made: refused over the output bound, unless it is
    one of its inputs handed back (a value from the scope passes through unbounded:
    only what a template builds is). Lists they make are no longer than their inputs."""
    if isinstance(value, str) and len(value) > _cap() and not any(value is x for x in inputs):
        raise _too_big(f"a string of {len(value):,} characters")
    return value


def _grown(value: Any) -> Any:
    """What an operator built (`+`, `*`, `%`, ...): bounded, and charged by its size."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value.bit_length() > MAX_INT_BITS:
            raise TemplateLimit(f"an integer of {value.bit_length():,} bits (more than {MAX_INT_BITS:,})",
                                limit="template_output")
        return value
    n = _size(value)
    if n > _cap():
        raise _too_big(f"a value of {n:,} elements")
    _tick(n)
    return value


MAX_SOURCE = 65_536  # characters of one template: compiling is not charged, so it is bounded by size
MAX_INT_BITS = 65_536  # about 20,000 digits: integers a template may build or compute with
MAX_DEPTH = 64  # macro calls nested in one another


def _deep_size(value: Any, what: str) -> int:
    """The size of `value` once written out (characters of its strings and numbers, one
    per other node), refused as soon as it passes the output bound: called before a
    value is turned into text, which a list of the same big string a thousand times
    over would make a gigabyte of. Iterative, and charged for what it walks."""
    cap, total, walked = _cap(), 0, 0
    stack = [value]
    while stack:
        v = stack.pop()
        walked += 1
        if isinstance(v, str):
            total += len(v)
        elif isinstance(v, dict):
            total += 1 + len(v)
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple, set, frozenset)):
            total += 1 + len(v)
            stack.extend(v)
        elif isinstance(v, int) and not isinstance(v, bool):
            total += v.bit_length() // 3 + 1
        else:
            total += 1
        if total > cap:
            raise _too_big(f"{what} of more than {total:,} characters")
    _tick(walked)
    return total


def _int_cost(left: Any, right: Any, operator: str) -> None:
    """Arithmetic on big integers is not one operation: charge it by the words it
    multiplies, and refuse integers past MAX_INT_BITS."""
    if not (isinstance(left, int) and isinstance(right, int)) or isinstance(left, bool) or isinstance(right, bool):
        return
    a, b = left.bit_length(), right.bit_length()
    if max(a, b) > MAX_INT_BITS:
        raise TemplateLimit(f"'{operator}' on an integer of {max(a, b):,} bits (more than {MAX_INT_BITS:,})",
                            limit="template_output")
    _tick(1 + (a // 64) * (b // 64) // 16)


def _refuse_big_ints(values: Any, what: str) -> None:
    """A width, count or padding above the output bound can only build a value over it."""
    cap = _cap()
    for v in values:
        if isinstance(v, int) and not isinstance(v, bool) and v > cap:
            raise _too_big(f"{what} with {v:,}")


def _refuse_wide_format(fmt: str) -> None:
    cap = _cap()
    for digits in _DIGITS.findall(fmt):
        if len(digits) > 12 or int(digits) > cap:
            raise _too_big(f"a format width of {digits}")


# --- the environment -----------------------------------------------------------------


class _Instrument(ast.NodeTransformer):
    """Rewrites the Python that Jinja generates for a template: one operation at the top
    of every loop body and function (macro, block, the template itself); `~` and `in`
    through the environment, which bounds and charges them."""

    @staticmethod
    def _env(attr: str) -> ast.expr:
        return ast.Attribute(value=ast.Name(id="environment", ctx=ast.Load()), attr=attr, ctx=ast.Load())

    def _call(self, attr: str, *args: ast.expr) -> ast.Call:
        return ast.Call(func=self._env(attr), args=list(args), keywords=[])

    def _ticked(self, node: Any) -> Any:
        self.generic_visit(node)
        node.body.insert(0, ast.Expr(value=self._call("tick")))
        return node

    visit_For = visit_AsyncFor = visit_While = _ticked

    def visit_FunctionDef(self, node: ast.FunctionDef) -> Any:
        """A function (a macro, a block, the template itself) counts one operation and
        one level of depth while it runs: recursion is bounded by MAX_DEPTH, the same
        on every thread, not by whatever stack the interpreter has left."""
        self.generic_visit(node)
        node.body = [ast.Expr(value=self._call("enter")),
                     ast.Try(body=node.body, handlers=[], orelse=[], finalbody=[ast.Expr(value=self._call("leave"))])]
        return node

    def visit_Call(self, node: ast.Call) -> Any:
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id in ("str_join", "markup_join"):
            node.func = self._env(f"bounded_{node.func.id}")
        return node

    def visit_Compare(self, node: ast.Compare) -> Any:
        """`in` and comparisons walk what they compare: through the environment, which
        charges them by size (chains, `a < b < c`, are left as they are)."""
        self.generic_visit(node)
        if len(node.ops) != 1:
            return node
        op = node.ops[0]
        if isinstance(op, (ast.In, ast.NotIn)):
            call = self._call("contains", node.left, node.comparators[0])
            return ast.UnaryOp(op=ast.Not(), operand=call) if isinstance(op, ast.NotIn) else call
        if isinstance(op, (ast.Is, ast.IsNot)):
            return node
        return self._call("compare", ast.Constant(type(op).__name__), node.left, node.comparators[0])


_SORTING_FILTERS = frozenset({"sort", "dictsort", "unique", "groupby"})
# filters that look at their input without walking it: one operation, not one per element
_CONSTANT_FILTERS = frozenset({"length", "count", "first", "last", "default", "d", "attr", "abs", "int", "float",
                               "round", "bool", "safe", "random", "e", "escape", "capitalize"})
SORT_WEIGHT = 8  # a sorting filter costs n log n: about 8 per element at the sizes a budget allows
# filters that write a whole value out as text: its written size is checked first
_STRINGIFYING_FILTERS = frozenset({"string", "tojson", "pprint", "format", "urlencode", "xmlattr", "indent",
                                   "wordwrap", "center", "truncate", "title", "upper", "lower", "trim", "striptags"})


def _charged_filter(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    widths = name in ("center", "indent", "wordwrap", "truncate", "batch", "slice", "format")
    weight = SORT_WEIGHT if name in _SORTING_FILTERS else 0 if name in _CONSTANT_FILTERS else 1

    @functools.wraps(f)
    def filtered(*args: Any, **kwargs: Any) -> Any:
        values = [a for a in args if not isinstance(a, (Context, EvalContext, jinja2.Environment))]
        _tick(1 + weight * sum(_size(a) for a in values))
        if widths:
            _refuse_big_ints([*values[1:], *kwargs.values()], f"filter '{name}'")
        if name == "format" and values and isinstance(values[0], str):
            _refuse_wide_format(values[0])
        if name == "replace" and len(values) >= 3 and all(isinstance(v, str) for v in values[:3]):
            _bounded_replace(*values[:3])
        if name == "join" and values:
            _bounded_join(values[0], values[1] if len(values) > 1 else kwargs.get("d", ""))
        if name in _STRINGIFYING_FILTERS and values:
            _deep_size(values[0], f"filter '{name}'")
        if name == "sum" and values:
            start = values[2] if len(values) > 2 else kwargs.get("start", 0)
            if isinstance(start, (list, tuple, str)) and isinstance(values[0], (list, tuple)):
                # adding sequences copies the total so far at every item: quadratic
                total = sum(_size(x) for x in values[0])
                if total > _cap():
                    raise _too_big(f"filter 'sum' building {total:,} elements")
                _tick(len(values[0]) * total // 2)
        return _built(f(*args, **kwargs), *values)

    return filtered


def _bounded_replace(s: str, old: str, new: str) -> None:
    hits = s.count(old) if old else len(s) + 1
    if len(s) + hits * max(len(new) - len(old), 0) > _cap():
        raise _too_big("a replace")


def _bounded_join(items: Any, sep: Any) -> None:
    if isinstance(items, (list, tuple)) and isinstance(sep, str):
        total = len(sep) * max(len(items) - 1, 0) + sum(_size(x) if isinstance(x, str) else 1 for x in items)
        if total > _cap():
            raise _too_big(f"a join of {total:,} characters")


_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "Eq": operator.eq, "NotEq": operator.ne, "Lt": operator.lt, "LtE": operator.le, "Gt": operator.gt,
    "GtE": operator.ge,
}
_STR_WIDTH_METHODS = frozenset({"ljust", "rjust", "center", "zfill", "expandtabs"})


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"+", "*", "**", "%", "//", "/", "-"})

    def __init__(self) -> None:
        # optimized=False: Jinja evaluates no constant part at compile time, so all the
        # work is done (and charged) at render time, the same whether the compiled
        # template came from the cache or not
        super().__init__(undefined=jinja2.StrictUndefined, autoescape=False, finalize=_json_output, optimized=False)
        self.tick = _tick  # read by the instrumented code: `environment.tick()`
        self.globals.pop("lipsum", None)  # unbounded text generation, and not data
        self.filters = {name: _charged_filter(name, f) for name, f in self.filters.items()}

    def _compile(self, source: str, filename: str) -> types.CodeType:
        tree = _Instrument().visit(ast.parse(source, filename))
        return compile(ast.fix_missing_locations(tree), filename, "exec")

    @staticmethod
    def enter() -> None:
        b = _state.budget
        b.depth += 1
        if b.depth > MAX_DEPTH:
            b.depth = 0  # the error unwinds every level: leave() must not go negative meanwhile
            raise TemplateLimit(f"macro calls nested more than {MAX_DEPTH} deep", limit="template_ops")
        _tick()

    @staticmethod
    def leave() -> None:
        b = _state.budget
        b.depth = max(b.depth - 1, 0)

    @staticmethod
    def compare(op: str, left: Any, right: Any) -> Any:
        if isinstance(left, (str, list, tuple, dict)) and isinstance(right, (str, list, tuple, dict)):
            _tick(1 + min(len(left), len(right)))
        else:
            _int_cost(left, right, "compare")
        return _COMPARE[op](left, right)

    @staticmethod
    def bounded_str_join(seq: Any) -> str:
        seq = list(seq)
        for x in seq:
            if not isinstance(x, str):
                _deep_size(x, "'~'")
        parts = [str(x) for x in seq]
        total = sum(len(p) for p in parts)
        if total > _cap():
            raise _too_big(f"a concatenation of {total:,} characters")
        _tick(total)
        return "".join(parts)

    bounded_markup_join = bounded_str_join  # autoescape is off: both are plain joins

    @staticmethod
    def contains(item: Any, container: Any) -> bool:
        # a mapping or set looks up; anything else (a list, a string, `d.values()`) walks
        walks = not isinstance(container, (dict, set, frozenset)) and hasattr(container, "__len__")
        _tick(1 + (len(container) if walks else 0))
        return item in container

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        cap = _cap()
        if operator in ("*", "//", "%", "/", "+", "-"):
            _int_cost(left, right, operator)
        if operator == "*":
            seq, n = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                if len(seq) * n > cap:
                    raise _too_big(f"'*' building {len(seq) * n:,} elements")
                if n > 1 and not isinstance(seq, str) and _deep_size(seq, "'*'") * n > cap:
                    raise _too_big(f"'*' building {n:,} copies of a value")
            elif isinstance(left, int) and isinstance(right, int) and left.bit_length() + right.bit_length() > 8 * cap:
                raise _too_big("'*' of two integers")
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
            if left.bit_length() * right > 8 * cap:
                raise _too_big(f"'**' building an integer of about {left.bit_length() * right:,} bits")
        elif operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
            if len(left) + len(right) > cap:
                raise _too_big(f"'+' building {len(left) + len(right):,} elements")
        elif operator == "%" and isinstance(left, str):
            _refuse_wide_format(left)
            _refuse_big_ints(right if isinstance(right, tuple) else (right,), "a '%' format")
            _deep_size(right, "a '%' format")
        return _grown(super().call_binop(context, operator, left, right))

    def getattr(self, obj: Any, attribute: str) -> Any:
        if isinstance(obj, Mapping) and attribute in obj:
            return obj[attribute]  # data first: `workload.items` is the key, not the method
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        value = super().getitem(obj, argument)
        if isinstance(argument, slice):
            _tick(_size(value))
        return value

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        owner = getattr(__obj, "__self__", None)
        name = getattr(__obj, "__name__", "")
        # a string method walks its string; `index`/`count` walk a list; a mapping's
        # `get`, `items`, ... look up or make a view (iterating it is charged by the loop)
        walks = isinstance(owner, str) or (isinstance(owner, (list, tuple)) and name in ("index", "count"))
        _tick(1 + (_size(owner) if walks else 0) + sum(_size(a) for a in args))
        if isinstance(owner, str):
            if name in _STR_WIDTH_METHODS:
                _refuse_big_ints([*args, *kwargs.values()], f"str.{name}")
                if name == "expandtabs" and args and isinstance(args[0], int) and owner.count("\t") * args[0] > _cap():
                    raise _too_big("str.expandtabs")
            elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
                _bounded_replace(owner, args[0], args[1])
            elif name == "join" and args:
                _bounded_join(args[0], owner)
        return _built(super().call(__context, __obj, *args, **kwargs), owner, *args)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        _refuse_wide_format(value.__self__)

        def bounded(*args: Any, **kwargs: Any) -> str:
            _refuse_big_ints([*args, *kwargs.values()], "str.format")  # a width given as an argument
            _deep_size([args, kwargs], "str.format")
            return str(_built(wrapped(*args, **kwargs)))

        return bounded


# --- JSON data -----------------------------------------------------------------------


class _NotData(Exception):
    pass


def _as_data(value: Any) -> Any:
    """`value` itself when it is JSON data (None, bool, number, str, list, tuple, or a
    mapping with string keys, all the way down), else _NotData saying what sits where.
    Iterative (no depth limit of the interpreter's), not charged and not copied: a
    value passed on from the scope (`{{ fetch.data }}`) may be as large as it is."""
    stack: list[tuple[Any, str]] = [(value, "")]
    markup = False
    while stack:
        v, path = stack.pop()
        if v is None or isinstance(v, (bool, int, float, str)):
            markup = markup or isinstance(v, Markup)
            continue
        if isinstance(v, (list, tuple)):
            stack.extend((x, f"{path}[{i}]") for i, x in enumerate(v))
            continue
        if isinstance(v, dict):
            for k, x in v.items():
                if not isinstance(k, str):
                    raise _NotData(f"mapping key {k!r}{' at ' + path if path else ''} is not a string")
                stack.append((x, f"{path}.{k}" if path else k))
            continue
        what = "an undefined value" if isinstance(v, jinja2.Undefined) else f"a {type(v).__name__}"
        raise _NotData(f"{what}{' at ' + path if path else ''} is not JSON data")
    # `|safe` and `|escape` make Markup, a str the wire encoder does not take as one
    return msgspec.to_builtins(value, enc_hook=str) if markup else value


def _json_output(value: Any) -> Any:
    """`finalize`: every `{{ }}` of a string template prints JSON data only, and no more
    of it than the output bound (checked before Jinja turns it into text)."""
    try:
        _as_data(value)
    except _NotData as e:
        raise TemplateError(f"value {e}") from None
    if not isinstance(value, str):
        _deep_size(value, "a value printed")
    return value


# --- compiling and rendering ---------------------------------------------------------

_env = _BoundedEnvironment()


def is_template(value: Any) -> bool:
    return isinstance(value, str) and any(tok in value for tok in _HAS_SYNTAX)


@lru_cache(maxsize=4096)
def _compile(source: str) -> tuple[bool, Callable[..., Any]]:
    if len(source) > MAX_SOURCE:
        raise TemplateLimit(f"template of {len(source):,} characters (more than {MAX_SOURCE:,})",
                            limit="template_source")
    # compiling may evaluate constant parts: under a budget (the caller's, or its own)
    outer = _begin_budget()
    try:
        m = _SINGLE_EXPR.match(source)
        if m:
            expr = _env.compile_expression(m.group("expr").strip(), undefined_to_none=False)
            return True, expr
        template = _env.from_string(source)
        return False, functools.partial(_render_text, template)
    finally:
        _end_budget(outer)


def _render_text(template: jinja2.Template, **scope: Any) -> str:
    """A string template's output, refused as soon as it passes the output bound (a
    loop printing in every iteration never builds the whole string)."""
    cap, total, parts = _cap(), 0, []
    ctx = template.new_context(scope)
    try:
        for part in template.root_render_func(ctx):
            total += len(part)
            if total > cap:
                raise _too_big(f"output of more than {total:,} characters")
            parts.append(part)
    except Exception:
        template.environment.handle_exception()
    return "".join(parts)


def check(source: str) -> set[str]:
    """Compile `source`; return the root names it reads. Raises TemplateError."""
    try:
        m = _SINGLE_EXPR.match(source)
        ast_ = _env.parse("{{ " + m.group("expr") + " }}" if m else source)
        names = set(meta.find_undeclared_variables(ast_))
        _compile(source)  # unknown filters and tests are found only when compiling
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"template syntax error: {e.message}") from None
    except TemplateError:
        raise
    except jinja2.TemplateError as e:
        raise TemplateError(f"template error: {e}") from None
    # `loop` inside a for-block is Jinja's own variable
    if any(isinstance(n, nodes.For) for n in ast_.find_all(nodes.For)):
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
    """Render every template string inside `value` (dicts and lists recursively), under
    one budget."""
    if isinstance(value, str) and not is_template(value):
        return value  # the common case: nothing to render, no budget to set up
    remote = _state.remote
    if remote is not None and not _state.depth:
        return remote(value, scope, where, _state.limits)  # this thread renders in a process of its own
    outer = _begin_budget()
    try:
        return _render(value, scope, where)
    finally:
        _end_budget(outer)


def _render(value: Any, scope: Mapping[str, Any], where: str) -> Any:
    if isinstance(value, str):
        if not is_template(value):
            return value
        try:
            single, fn = _compile(value)
            out = fn(**scope)
            if single:
                if isinstance(out, jinja2.Undefined):
                    str(out)  # a StrictUndefined leaking out of an expression: raises, naming it
                return _as_data(out)
            return out
        except TemplateError as e:
            raise type(e)(e.message, where=where, **({"limit": e.limit} if isinstance(e, TemplateLimit) else {})) \
                from None
        except _NotData as e:
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


def render_condition(source: str | None, scope: Mapping[str, Any], *, where: str = "") -> bool:
    """A `when`: absent means true; a rendered string is truthy unless it says false."""
    if source is None:
        return True
    out = render_value(source, scope, where=where)
    if isinstance(out, str):
        return out.strip().lower() not in ("", "false", "0", "none", "no", "null")
    return bool(out)
