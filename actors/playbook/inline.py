"""Which templates may render on a pod's own thread: those cheap by construction.

Counting operations makes a render's outcome deterministic, but it cannot make the
event loop safe: `{{ ns.a == ns.b }}` over structures that share their parts is charged
a few dozen operations and walks 2^60 elements. So a pod renders a template itself only
when its syntax proves the work is linear in the data it reads (which the pod already
decoded from the log, so it paid as much once) or in its own source, and small:

* names, constants, literal lists and mappings, attribute and item lookups (no slices);
* `and`, `or`, `not`, `a if c else b`, `~`, comparisons (`==`, `<`, `in`, ...), unary
  `-`/`+`, `a + b`, `a - b`: each walks its operands once, and none of them can be built
  bigger than the scope's own values without a statement or a call; `a * k` with `k` a
  whole-number constant of at most `MAX_FACTOR`, `a / k` and `a // k` with `k` a
  non-zero number constant (the index arithmetic of loops: `{{ i * 2 }}`, `{{ n // 10 }}`);
* the filters and tests of `INLINE_FILTERS` and `INLINE_TESTS`, which look at a value or
  walk it once;
* `{% if %}` blocks, at most `MAX_IF_DEPTH` deep, and plain text.

Anything else (a call, a loop, `set`, a macro, arithmetic that can grow a value, a
filter not listed, a source over `INLINE_MAX_SOURCE` characters) renders in a render
process with OS limits (actors/runtime/render_process.py). The check is made once per template
source, on its parse tree, and cached.
"""

from __future__ import annotations

from functools import lru_cache

import jinja2
from jinja2 import nodes

__all__ = ["INLINE_FILTERS", "INLINE_MAX_SOURCE", "INLINE_TESTS", "MAX_IF_DEPTH", "inline_safe"]

INLINE_MAX_SOURCE = 1_024  # characters: compiling it is cheap too (about 25 ms at most; 0.3 s for 12 kB)
MAX_IF_DEPTH = 8  # nested `{% if %}`: Python's compiler refuses 20 nested blocks
MAX_FACTOR = 16  # `a * k`: at most this many times what the scope holds

# look at a value, or walk it once (a string or a list the scope holds)
INLINE_FILTERS = frozenset(
    {
        "default",
        "d",
        "length",
        "count",
        "first",
        "last",
        "lower",
        "upper",
        "trim",
        "int",
        "float",
        "bool",
        "abs",
        "string",
        "list",
        "capitalize",
    }
)
INLINE_TESTS = frozenset(
    {
        "defined",
        "undefined",
        "none",
        "boolean",
        "false",
        "true",
        "integer",
        "float",
        "number",
        "string",
        "mapping",
        "sequence",
        "iterable",
        "eq",
        "equalto",
        "ne",
        "==",
        "!=",
        "lt",
        "le",
        "gt",
        "ge",
        "in",
        "lower",
        "upper",
        "odd",
        "even",
    }
)
_LEAVES = (nodes.Name, nodes.Const, nodes.TemplateData)
_WALKS_ONCE = (
    nodes.Getattr,
    nodes.Getitem,
    nodes.Compare,
    nodes.Operand,
    nodes.And,
    nodes.Or,
    nodes.Not,
    nodes.Neg,
    nodes.Pos,
    nodes.CondExpr,
    nodes.Concat,
    nodes.List,
    nodes.Tuple,
    nodes.Dict,
    nodes.Pair,
    nodes.Output,
    nodes.Template,
)
_parser = jinja2.Environment()  # parsing only: the templates' environment has the same syntax


@lru_cache(maxsize=4096)
def inline_safe(source: str) -> bool:
    """Whether the template `source` (a whole template string) may render on the pod's
    own thread; False for anything that does not parse (its error comes from a render)."""
    if len(source) > INLINE_MAX_SOURCE:
        return False
    try:
        tree = _parser.parse(source)
    except (jinja2.TemplateError, RecursionError, MemoryError):
        return False
    return _safe(tree, 0)


def _small_whole(node: nodes.Node) -> bool:
    v = node.value if isinstance(node, nodes.Const) else None
    return type(v) is int and abs(v) <= MAX_FACTOR


def _nonzero_number(node: nodes.Node) -> bool:
    v = node.value if isinstance(node, nodes.Const) else None
    return type(v) in (int, float) and v != 0


def _safe(node: nodes.Node, ifs: int) -> bool:
    if isinstance(node, _LEAVES):
        return not (isinstance(node, nodes.Name) and node.ctx != "load")
    if isinstance(node, nodes.If):
        ifs += 1
        if ifs > MAX_IF_DEPTH:
            return False
    elif isinstance(node, nodes.Filter):
        if node.name not in INLINE_FILTERS or node.dyn_args is not None or node.dyn_kwargs is not None:
            return False
    elif isinstance(node, nodes.Test):
        if node.name not in INLINE_TESTS or node.dyn_args is not None or node.dyn_kwargs is not None:
            return False
    elif isinstance(node, nodes.Keyword):
        pass
    elif isinstance(node, (nodes.Add, nodes.Sub)):
        pass
    elif isinstance(node, nodes.Mul):
        if not (_small_whole(node.left) or _small_whole(node.right)):
            return False
    elif isinstance(node, (nodes.Div, nodes.FloorDiv)):
        if not _nonzero_number(node.right):
            return False
    elif not isinstance(node, _WALKS_ONCE):
        return False  # calls, loops, statements, slices, arithmetic, ...
    return all(_safe(child, ifs) for child in node.iter_child_nodes())
