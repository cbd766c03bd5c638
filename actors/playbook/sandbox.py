"""The Jinja2 environment templates run in: sandboxed, strict about undefined names,
instrumented and bounded, JSON data in and out.

The Python Jinja generates for a template is rewritten (`_Instrument`) so that every
loop iteration and macro call costs one operation, and the sandbox's hooks (filters,
method calls, operators, `~`, `in`, slices) charge and bound the work they do
(actors/playbook/bounds.py). Jinja folds constant expressions at compile time, so these
operators are intercepted (which also stops the folding): `validate` is bounded too.

Values are JSON data: a template's result, and every `{{ }}` inside a string template,
must be null, a boolean, a number, a string, a list or a mapping with string keys;
anything else (`{{ self }}`, `{{ range(3) }}`, a method) is a `TemplateError`. And
mapping keys win over attributes: `{{ workload.items }}` is the key `items`, not the
dict's method.
"""

from __future__ import annotations

import ast
import functools
import operator
import re
import types
from collections.abc import Callable, Mapping
from typing import Any

import jinja2
import msgspec
from jinja2.nodes import EvalContext
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment
from markupsafe import Markup

from actors.playbook.bounds import (
    CHARGE_BATCH,
    MAX_DEPTH,
    MAX_INT_BITS,
    WALK_WEIGHT,
    bounded_fill,
    bounded_join,
    bounded_percent,
    bounded_replace,
    built,
    charge_compare,
    charge_walk,
    deep_size,
    grown,
    int_cost,
    output_cap,
    refuse_big_ints,
    refuse_wide_format,
    size_of,
    too_big,
)
from actors.playbook.budget import TemplateError, TemplateLimit, thread_state, tick

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
        node.body = [
            ast.Expr(value=self._call("enter")),
            ast.Try(body=node.body, handlers=[], orelse=[], finalbody=[ast.Expr(value=self._call("leave"))]),
        ]
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
# (`int`, `float`, `capitalize`, `escape`, `safe` read or copy a whole string: charged by it)
_CONSTANT_FILTERS = frozenset({"length", "count", "first", "last", "default", "d", "attr", "abs", "round", "bool"})
SORT_WEIGHT = 8  # a sorting filter costs n log n: about 8 per element at the sizes a budget allows
# filters that write a whole value out as text: its written size is checked first
_STRINGIFYING_FILTERS = frozenset(
    {
        "string",
        "tojson",
        "pprint",
        "format",
        "urlencode",
        "xmlattr",
        "indent",
        "wordwrap",
        "center",
        "truncate",
        "title",
        "upper",
        "lower",
        "trim",
        "striptags",
    }
)


def _charged_filter(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    widths = name in ("center", "indent", "wordwrap", "truncate", "batch", "slice", "format")
    weight = SORT_WEIGHT if name in _SORTING_FILTERS else 0 if name in _CONSTANT_FILTERS else 1

    @functools.wraps(f)
    def filtered(*args: Any, **kwargs: Any) -> Any:
        values = [a for a in args if not isinstance(a, (Context, EvalContext, jinja2.Environment))]
        tick(1 + weight * sum(size_of(a) for a in values))
        if widths:
            refuse_big_ints([*values[1:], *kwargs.values()], f"filter '{name}'")
        if name == "format" and values and isinstance(values[0], str):
            refuse_wide_format(values[0])
        if name == "replace" and len(values) >= 3 and all(isinstance(v, str) for v in values[:3]):
            bounded_replace(*values[:3])
        if name == "join" and values:
            if not hasattr(values[0], "__len__"):  # a generator (`|map(...)|join`): its length first
                items = list(values[0])
                tick(len(items))
                args = tuple(items if a is values[0] else a for a in args)
                values[0] = items
            bounded_join(values[0], values[1] if len(values) > 1 else kwargs.get("d", ""))
        if name in _SORTING_FILTERS or name in ("min", "max"):
            if (
                values
                and isinstance(values[0], (list, tuple))
                and any(isinstance(x, (list, tuple, dict)) for x in values[0])
            ):
                charge_walk(values[0])  # comparing structures walks them
        if name == "format" and values and isinstance(values[0], str):
            bounded_percent(values[0], kwargs if kwargs else tuple(values[1:]))
        if name == "indent" and values and isinstance(values[0], str):
            fill = values[1] if len(values) > 1 else kwargs.get("width", 4)
            if isinstance(fill, str):
                bounded_fill(values[0], fill, values[0].count("\n") + 1, "filter 'indent'")
        if name in _STRINGIFYING_FILTERS and values:
            deep_size(values[0], f"filter '{name}'")
        if name == "sum" and values:
            start = values[2] if len(values) > 2 else kwargs.get("start", 0)
            if isinstance(start, (list, tuple, str)) and isinstance(values[0], (list, tuple)):
                # adding sequences copies the total so far at every item: quadratic
                total = sum(size_of(x) for x in values[0])
                if total > output_cap():
                    raise too_big(f"filter 'sum' building {total:,} elements")
                tick(len(values[0]) * total // 2)
        return charged_output(built(f(*args, **kwargs), *values), values)

    return filtered


_NESTED_SPEC = re.compile(r"\{[^{}]*:[^{}]*\{")  # a replacement field inside a format spec


def _ordered(value: Any) -> Any:
    """Refuse a set (`a.keys() - b.keys()`): its order comes from the process's string
    hash seed, so `|first` or a loop over it would decide differently on a replay."""
    if isinstance(value, (set, frozenset)):
        raise TemplateError(
            "a set, whose order differs from one process to the next (and so from one replay to the next): "
            "keep lists (`a.keys() | reject('in', b) | list`)"
        )
    return value


def charged_output(out: Any, inputs: Any) -> Any:
    """A string or list a filter or method built, charged by its size (`center(999999)`
    writes a million characters); one of its inputs handed back costs nothing more."""
    if isinstance(out, (str, list)) and not any(out is x for x in inputs):
        tick(len(out))
    return out


# tests that compare their two values (`x is eq y`): charged as the operators are
_COMPARING_TESTS = frozenset(
    {
        "eq",
        "equalto",
        "==",
        "ne",
        "!=",
        "lt",
        "lessthan",
        "<",
        "le",
        "<=",
        "gt",
        "greaterthan",
        ">",
        "ge",
        ">=",
        "sameas",
    }
)


def _charged_test(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(f)
    def tested(*args: Any, **kwargs: Any) -> Any:
        values = [a for a in args if not isinstance(a, (Context, EvalContext, jinja2.Environment))]
        if name in _COMPARING_TESTS and len(values) >= 2:
            a, b = values[0], values[1]
            if isinstance(a, (list, tuple, dict)) and isinstance(b, (list, tuple, dict)):
                charge_compare(a, b, ordered=name not in ("eq", "equalto", "==", "ne", "!="))
            elif isinstance(a, str) and isinstance(b, str):
                tick(1 + min(len(a), len(b)))
            else:
                tick()
        elif name == "in" and len(values) >= 2:
            _BoundedEnvironment.contains(values[0], values[1])  # charges as `in` does (and answers the same)
        else:
            tick(1 + sum(size_of(v) for v in values[1:]))
        return f(*args, **kwargs)

    return tested


_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "Eq": operator.eq,
    "NotEq": operator.ne,
    "Lt": operator.lt,
    "LtE": operator.le,
    "Gt": operator.gt,
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
        self.tick = tick  # read by the instrumented code: `environment.tick()`
        self.globals.pop("lipsum", None)  # unbounded text generation, and not data
        # a choice no replay could make again: decisions are a pure function of the log
        self.filters.pop("random", None)
        self.filters = {name: _charged_filter(name, f) for name, f in self.filters.items()}
        self.tests = {name: _charged_test(name, f) for name, f in self.tests.items()}  # type: ignore[arg-type]

    def _compile(self, source: str, filename: str) -> types.CodeType:
        tree = _Instrument().visit(ast.parse(source, filename))
        return compile(ast.fix_missing_locations(tree), filename, "exec")

    @staticmethod
    def enter() -> None:
        b = thread_state.budget
        b.depth += 1
        if b.depth > MAX_DEPTH:
            b.depth = 0  # the error unwinds every level: leave() must not go negative meanwhile
            raise TemplateLimit(f"macro calls nested more than {MAX_DEPTH} deep", limit="template_ops")
        tick()

    @staticmethod
    def leave() -> None:
        b = thread_state.budget
        b.depth = max(b.depth - 1, 0)

    @staticmethod
    def compare(op: str, left: Any, right: Any) -> Any:
        if isinstance(left, (list, tuple, dict)) and isinstance(right, (list, tuple, dict)):
            charge_compare(left, right, ordered=op not in ("Eq", "NotEq"))
        elif isinstance(left, str) and isinstance(right, str):
            tick(1 + min(len(left), len(right)))
        else:
            int_cost(left, right, "compare")
        return _COMPARE[op](left, right)

    @staticmethod
    def bounded_str_join(seq: Any) -> str:
        seq = list(seq)
        for x in seq:
            if not isinstance(x, str):
                deep_size(x, "'~'")
        parts = [str(x) for x in seq]
        total = sum(len(p) for p in parts)
        if total > output_cap():
            raise too_big(f"a concatenation of {total:,} characters")
        tick(total)
        return "".join(parts)

    bounded_markup_join = bounded_str_join  # autoescape is off: both are plain joins

    @staticmethod
    def contains(item: Any, container: Any) -> bool:
        # a mapping or set looks up; anything else (a list, a string, `d.values()`) walks
        walks = not isinstance(container, (dict, set, frozenset)) and hasattr(container, "__len__")
        tick(1 + (len(container) if walks else 0))
        if walks and isinstance(item, (list, tuple, dict)) and isinstance(container, (list, tuple)):
            for x in container:  # each element compared with a structure: walked as `==` walks it
                charge_compare(item, x, ordered=False)
        return item in container

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        cap = output_cap()
        if operator in ("*", "//", "%", "/", "+", "-"):
            int_cost(left, right, operator)
        if operator == "*":
            seq, n = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                if len(seq) * n > cap:
                    raise too_big(f"'*' building {len(seq) * n:,} elements")
                if n > 1 and not isinstance(seq, str) and deep_size(seq, "'*'") * n > cap:
                    raise too_big(f"'*' building {n:,} copies of a value")
            elif isinstance(left, int) and isinstance(right, int) and left.bit_length() + right.bit_length() > 8 * cap:
                raise too_big("'*' of two integers")
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
            bits = (left.bit_length() - 1) * right  # at least this many: refused before it is computed
            if bits > MAX_INT_BITS:
                raise TemplateLimit(
                    f"'**' building an integer of about {bits:,} bits (more than {MAX_INT_BITS:,}: template_output)",
                    limit="template_output",
                )
            tick(1 + (bits // 64) ** 2 // 16)  # squarings of a number that many words long
        elif operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
            if len(left) + len(right) > cap:
                raise too_big(f"'+' building {len(left) + len(right):,} elements")
        elif operator == "%" and isinstance(left, str):
            refuse_wide_format(left)
            refuse_big_ints(right if isinstance(right, tuple) else (right,), "a '%' format")
            deep_size(right, "a '%' format")
            bounded_percent(left, right)
        return grown(_ordered(super().call_binop(context, operator, left, right)))

    def getattr(self, obj: Any, attribute: str) -> Any:
        if isinstance(obj, Mapping) and attribute in obj:
            return obj[attribute]  # data first: `workload.items` is the key, not the method
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        value = super().getitem(obj, argument)
        if isinstance(argument, slice):
            tick(size_of(value))
        return value

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        owner = getattr(__obj, "__self__", None)
        name = getattr(__obj, "__name__", "")
        # a string method walks its string; `index`/`count` walk a list; a mapping's
        # `get`, `items`, ... look up or make a view (iterating it is charged by the loop)
        walks = isinstance(owner, str) or (isinstance(owner, (list, tuple)) and name in ("index", "count"))
        tick(1 + (size_of(owner) if walks else 0) + sum(size_of(a) for a in args))
        if isinstance(owner, str):
            if name in _STR_WIDTH_METHODS:
                refuse_big_ints([*args, *kwargs.values()], f"str.{name}")
                if (
                    name == "expandtabs"
                    and args
                    and isinstance(args[0], int)
                    and owner.count("\t") * args[0] > output_cap()
                ):
                    raise too_big("str.expandtabs")
            elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
                bounded_replace(owner, args[0], args[1])
            elif name == "join" and args:
                bounded_join(args[0], owner)
            elif name == "translate" and args and isinstance(args[0], dict):
                longest = max((len(v) for v in args[0].values() if isinstance(v, str)), default=1)
                bounded_fill(owner, "x" * min(longest, output_cap() + 1), len(owner), "str.translate")
        out = _ordered(super().call(__context, __obj, *args, **kwargs))
        return charged_output(built(out, owner, *args), (owner, *args))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt = value.__self__
        refuse_wide_format(fmt)
        nested = _NESTED_SPEC.search(fmt) is not None

        def bounded(*args: Any, **kwargs: Any) -> str:
            refuse_big_ints([*args, *kwargs.values()], "str.format")  # a width given as an argument
            if nested:  # `'{:{}}'.format('a', '>99999999999')`: a whole spec given as an argument
                for a in [*args, *kwargs.values()]:
                    if isinstance(a, str):
                        refuse_wide_format(a)
            deep_size([args, kwargs], "str.format")
            out = str(built(wrapped(*args, **kwargs)))
            tick(len(out))  # what it wrote: a width of a million is a million characters
            return out

        return bounded


# --- JSON data -----------------------------------------------------------------------


class NotData(Exception):
    pass


_SCALARS = (bool, int, float, str)


def as_data(value: Any) -> Any:
    """`value` itself when it is JSON data (None, bool, number, str, list, tuple, or a
    mapping with string keys, all the way down), else NotData saying what sits where.
    Iterative (no depth limit of the interpreter's) and not copied. Charged per node
    reached, so a structure a template built from shared parts costs what walking it
    whole costs (its budget runs out long before 2^60 nodes). A value looked up in the
    scope as it is (`{{ fetch.data }}`) is not checked at all (templates.py `_render`)."""
    stack: list[Any] = [value]
    markup = False
    walked = 0
    while stack:
        v = stack.pop()
        walked += 1
        if walked >= CHARGE_BATCH:
            tick(walked * WALK_WEIGHT)
            walked = 0
        if v is None or isinstance(v, _SCALARS):
            if type(v) is not str and isinstance(v, Markup):
                markup = True
            continue
        if isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
            if not all(isinstance(k, str) for k in v):
                _not_data(value)
        else:
            _not_data(value)
    tick(walked * WALK_WEIGHT)
    # `|safe` and `|escape` make Markup, a str the wire encoder does not take as one
    return msgspec.to_builtins(value, enc_hook=str) if markup else value


def _not_data(value: Any) -> None:
    """Say what sits where in a value that is not JSON data (the fast walk found one):
    walked again, with paths, to the first offender."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        v, path = stack.pop()
        if v is None or isinstance(v, _SCALARS):
            continue
        if isinstance(v, (list, tuple)):
            stack.extend((x, f"{path}[{i}]") for i, x in enumerate(v))
            continue
        if isinstance(v, dict):
            for k, x in v.items():
                if not isinstance(k, str):
                    raise NotData(f"mapping key {k!r}{' at ' + path if path else ''} is not a string")
                stack.append((x, f"{path}.{k}" if path else k))
            continue
        what = "an undefined value" if isinstance(v, jinja2.Undefined) else f"a {type(v).__name__}"
        raise NotData(f"{what}{' at ' + path if path else ''} is not JSON data")
    raise NotData("a value is not JSON data")  # not reached: the fast walk found an offender


def _json_output(value: Any) -> Any:
    """`finalize`: every `{{ }}` of a string template prints JSON data only, and no more
    of it than the output bound (checked before Jinja turns it into text)."""
    try:
        as_data(value)
    except NotData as e:
        raise TemplateError(f"value {e}") from None
    if not isinstance(value, str):
        deep_size(value, "a value printed")
    return value


ENVIRONMENT = _BoundedEnvironment()
