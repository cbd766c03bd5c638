"""Fuzzing template containment: templates generated from a grammar of Jinja constructs
(nesting, comprehension-like filters, formatting, big numbers, structures that share
their parts, string growth), rendered where a pod renders them.

* In a real render process (actors/runtime/render_process.py), every render ends within its
  bounds: it returns JSON data, or raises `TemplateError`/`TemplateLimit` (the budget,
  the output bound), or `RenderFault` (the pod's deadline, the process's memory); the
  call returns (the deadline enforced by the kill, not by the template); and the same
  template and scope give the same outcome twice when no RenderFault occurred (the
  budget is a pure function of template and scope).
* A template `inline_safe` accepts (actors/playbook/inline.py) renders in-process under
  a small budget and is charged at most a bound polynomial in its source and scope
  (`_inline_bound` says which and why it is not linear); one it refuses is never
  rendered on the event loop (`SliceExhausted`, nothing charged).

What the fuzzer found (a long chain that recursed in the pod's parse, a cubic parse of
filter chains, a single expression's result over the output bound, tests and built
strings left uncharged, a `tojson` chain taken as inline-safe) is pinned at the end,
one regression test each.

CI runs 150 derandomized examples per property (~15 s alone, under ~40 s on 2 busy
cores). A long run, with fresh random examples each time:

    TEMPLATE_FUZZ_EXAMPLES=5000 .venv/bin/pytest tests/integration/test_template_fuzz.py
"""

from __future__ import annotations

import os
import resource
import threading
import time
from collections.abc import Iterator
from typing import Any

import jinja2
import pytest
from hypothesis import HealthCheck, Phase, event, example, given, note, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from jinja2 import nodes

from actors.playbook.budget import begin_budget, end_budget, thread_state
from actors.playbook.inline import INLINE_FILTERS, INLINE_TESTS, inline_safe
from actors.playbook.templates import (
    INLINE_TEMPLATE_OPS,
    RenderFault,
    SliceExhausted,
    TemplateError,
    TemplateLimit,
    call_with_slice,
    names_read,
    render_value,
    template_limits,
)
from actors.runtime.render_process import RenderBounds, RenderProcess
from actors.wire.messages import Limits

LONG = int(os.environ.get("TEMPLATE_FUZZ_EXAMPLES", "0"))
EXAMPLES = LONG or 150  # per property in CI: the render-process one dominates (two renders each)
SECONDS = 1.0  # the render process's deadline, in CPU seconds (a busy machine does not stretch it)
MEMORY = 512 << 20  # its address space: a runaway hits it in well under a second of filling
BOUNDS = RenderBounds(seconds=SECONDS, memory=MEMORY)
# a render returns within its wall-clock deadline (a render starved of CPU is killed
# after `wall_factor` times its CPU seconds) plus this: the kill (SIGKILL, reaped within
# 5 s), the pod's own parse of the template, slack
WALL = SECONDS * BOUNDS.wall_factor
MARGIN = 20.0

# a whole long run, and a CI run with some renders killed at their deadline
pytestmark = pytest.mark.timeout(int(180 + LONG * 2 * (SECONDS + 1)) if LONG else 180)

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    # CI: the same examples every run (no flakes); a long run: new ones each time
    derandomize=not LONG,
    database=None if not LONG else settings.default.database,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    # CI reports a failure as found (shrinking one can take minutes of renders); a long
    # run shrinks it to a minimal example
    phases=tuple(Phase) if LONG else (Phase.explicit, Phase.generate),
)

# --- the grammar ---------------------------------------------------------------------

SCOPE_NAMES = ("x", "big", "s", "items", "nums", "others", "objs", "obj")
LEAVES = (
    *SCOPE_NAMES,
    "obj.a",
    "obj.b",
    "obj.items",
    "objs[0]",
    "items[1:]",
    "nums[::-1]",
    "ns.a",
    "ns.b",
    "i",  # a loop variable: undefined outside a loop (a TemplateError, an outcome like any)
)
WIDTHS = st.sampled_from([0, 1, 3, 10, 100, 10_000, 999_999, 10**9, 10**20])
COUNTS = st.sampled_from([0, 1, 2, 5, 20, 60, 1_000, 99_999, 10**6])


def _literal() -> st.SearchStrategy[str]:
    return st.one_of(
        st.integers(-3, 64).map(str),
        st.sampled_from([20, 400]).map(lambda n: "9" * n),  # an int of many digits
        st.sampled_from(["''", "'a'", "'ab,c'", "'{}'", "'%s'", "'-'", '"\'"', "'<&>'", "'\\\\'", "1.5", "none"]),
        st.sampled_from(["[1, 2, 3]", "[]", "{'a': 1, 'b': 'x'}", "[[1], [1]]", "{}", "true"]),
        COUNTS.map(lambda n: f"range({n}) | list"),
    )


NAMES = st.sampled_from(LEAVES)
LEAF = st.one_of(NAMES, NAMES, _literal())

# comprehension-like filters and formatting; `{e}` is another expression, `{n}` a width
FILTERS = (
    "map('upper') | list",
    "map('string') | list",
    "map('length') | list",
    "map(attribute='a') | list",
    "map('center', {n}) | list",
    "select('odd') | list",
    "reject('none') | list",
    "selectattr('a') | list",
    "rejectattr('b') | list",
    "sort",
    "sort(attribute='a')",
    "sort(reverse=true)",
    "unique | list",
    "join(',')",
    "join({e})",
    "sum",
    "sum(start=[])",
    "groupby('a') | list",
    "format({e}, {e})",
    "indent({n})",
    "center({n})",
    "wordwrap({n})",
    "replace({e}, {e})",
    "truncate({n})",
    "batch({n}) | list",
    "slice({n}) | list",
    "reverse | list",
    "dictsort",
    "tojson",
    "string",
    "pprint",
    "urlencode",
    "length",
    "list",
    "first",
    "last",
    "max",
    "min",
    "upper",
    "title",
    "trim",
    "int",
    "float",
    "abs",
    "round",
    "wordcount",
    "default({e})",
)
BINOPS = ("+", "-", "*", "**", "//", "%", "~", "and", "or")
COMPARISONS = ("==", "!=", "<", ">=", "in", "not in")
TESTS = ("is eq {e}", "is in {e}", "is odd", "is defined", "is divisibleby 3", "is sameas {e}", "is string")


def _fill(form: str, e: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """`form` with each `{e}` an expression from `e` and each `{n}` a width."""
    parts = form.replace("{n}", "\0n\0").replace("{e}", "\0e\0").split("\0")
    pieces = [e if p == "e" else WIDTHS.map(str) if p == "n" else st.just(p) for p in parts]
    return st.tuples(*pieces).map("".join)


def _expressions(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(inner, st.sampled_from(BINOPS), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(inner, st.sampled_from(COMPARISONS), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(inner, st.sampled_from(FILTERS).flatmap(lambda f: _fill(f, inner))).map(
            lambda t: f"({t[0]} | {t[1]})"
        ),
        st.tuples(inner, st.sampled_from(TESTS).flatmap(lambda f: _fill(f, inner))).map(lambda t: f"({t[0]} {t[1]})"),
        st.tuples(inner, inner, inner).map(lambda t: f"({t[0]} if {t[1]} else {t[2]})"),
        st.lists(inner, min_size=0, max_size=4).map(lambda xs: "[" + ", ".join(xs) + "]"),
        st.tuples(inner, inner).map(lambda t: f"{t[0]}[{t[1]}]"),
        # formatting through methods and `%`
        st.sampled_from(
            [
                "'{:>{}}'.format({e}, {n})",
                "'{}{}'.format({e}, {e})",
                "'{:{}}'.format({e}, {e})",
                "('' ~ {e}).translate({97: 'xyz', 98: none})",
                "('' ~ {e}).ljust({n})",
                "('' ~ {e}).replace('a', '' ~ {e})",
                "('' ~ {e}).split(',')",
                "('' ~ {e}).count('a')",
                "'-'.join({e})",
                "'%s-%s' % ({e}, {e})",
                "'%*d' % ({n}, 1)",
                "'%s' * {n} % {e}",
            ]
        ).flatmap(lambda f: _fill(f, inner)),
    )


EXPR = st.recursive(LEAF, _expressions, max_leaves=8)


# long chains: a parser and a compiler recurse on them
CHAINS = st.tuples(st.sampled_from([1, 10, 60, 2_000]), st.sampled_from(["|upper", " ~ s", " + 1", " and x"])).map(
    lambda t: "{{ s" + t[1] * t[0] + " }}"
)

TEXT = st.sampled_from(["", "x", " ", "\n", "-", "{", "%}", "ab\n  cd", "é"])
NS_STEPS = st.sampled_from(
    [
        "{% set ns.a = [ns.a, ns.a] %}",
        "{% set ns.b = [ns.b, ns.b] %}",
        "{% set ns.a = ns.a ~ ns.a %}",
        "{% set ns.a = ns.a * 2 %}",
        "{% set ns.a = ns.a ** 2 %}",
        "{% set ns.a = ns.a + ns.a %}",
        "{% set ns.b = ns.b ~ s %}",
        "{% set ns.b = {'k': ns.b, 'l': ns.b} %}",
    ]
)


def _statements(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    body = st.lists(inner, min_size=1, max_size=3).map("".join)
    return st.one_of(
        st.tuples(EXPR, body, body).map(lambda t: f"{{% if {t[0]} %}}{t[1]}{{% else %}}{t[2]}{{% endif %}}"),
        st.tuples(st.sampled_from(["i", "j"]), COUNTS, body).map(
            lambda t: f"{{% for {t[0]} in range({t[1]}) %}}{t[2]}{{% endfor %}}"
        ),
        st.tuples(EXPR, body).map(lambda t: f"{{% for i in {t[0]} %}}{t[1]}{{% endfor %}}"),
        st.tuples(body, EXPR).map(lambda t: f"{{% macro m(v) %}}{t[0]}{{% endmacro %}}{{{{ m({t[1]}) }}}}"),
        st.tuples(body).map(lambda t: f"{{% filter upper %}}{t[0]}{{% endfilter %}}"),
        st.tuples(EXPR, body).map(lambda t: f"{{% with t = {t[0]} %}}{t[1]}{{% endwith %}}"),
    )


SIMPLE_STATEMENT = st.one_of(
    TEXT,
    EXPR.map(lambda e: f"{{{{ {e} }}}}"),
    EXPR.map(lambda e: f"{{% set t = {e} %}}{{{{ t }}}}"),
    NS_STEPS,
    st.tuples(st.sampled_from(["a", "b"]), EXPR).map(lambda t: f"{{% set ns.{t[0]} = {t[1]} %}}"),
    COUNTS.map(
        lambda n: (
            "{% macro r(n) %}{% if n > 0 %}{{ r(n - 1) }}{{ r(n - 1) }}{% endif %}{% endmacro %}" + f"{{{{ r({n}) }}}}"
        )
    ),
)
STATEMENTS = st.recursive(SIMPLE_STATEMENT, _statements, max_leaves=6)

NAMESPACE = st.one_of(
    st.just("{% set ns = namespace(a=[1], b=[1]) %}"),
    st.tuples(LEAF, LEAF).map(lambda t: f"{{% set ns = namespace(a={t[0]}, b={t[1]}) %}}"),
)
# what is done with structures that share their parts, once built
SHARED_USES = st.sampled_from(
    [
        "ns.a == ns.b",
        "ns.a != ns.b",
        "ns.a < ns.b",
        "ns.a",
        "ns.a | tojson",
        "ns.a | string",
        "ns.a in [ns.b]",
        "ns.a is in [ns.b]",
        "ns.a is eq ns.b",
        "[ns.a, ns.b] | sort",
        "[ns.a, ns.b] | unique | list",
        "ns.a | length",
        "ns.a | sum(start=[])",
        "ns.a ~ ''",
        "'%s' % [ns.a]",
        "ns.a | max",
    ]
)
SHARED = st.tuples(
    NAMESPACE, st.sampled_from([1, 5, 20, 60]), st.lists(NS_STEPS, min_size=1, max_size=2), SHARED_USES
).map(lambda t: f"{t[0]}{{% for i in range({t[1]}) %}}{''.join(t[2])}{{% endfor %}}{{{{ {t[3]} }}}}")

# wide strings built per element or per iteration: little charged, much done
WIDE = st.sampled_from(["i | string | center({n})", "'{:>{n}}'.format(i)", "('' ~ i).ljust({n})", "'%*d' % ({n}, i)"])
MANY = st.sampled_from([1_000, 99_999])
WIDE_WIDTHS = st.sampled_from([1_000, 100_000, 999_999])
HEAVY = st.one_of(
    st.tuples(MANY, st.sampled_from(["center", "indent", "wordwrap"]), WIDE_WIDTHS).map(
        lambda t: f"{{{{ range({t[0]}) | map('string') | map('{t[1]}', {t[2]}) | map('length') | sum }}}}"
    ),
    st.tuples(MANY, WIDE, WIDE_WIDTHS).map(
        lambda t: (
            "{% set ns = namespace(n=0) %}"
            + f"{{% for i in range({t[0]}) %}}{{% set ns.n = ns.n + ({t[1].replace('{n}', str(t[2]))} | length) %}}"
            + "{% endfor %}{{ ns.n }}"
        )
    ),
)

SINGLE = EXPR.map(lambda e: f"{{{{ {e} }}}}")  # a single expression keeps its type
TEXT_TEMPLATES = st.tuples(st.one_of(st.just(""), NAMESPACE), st.lists(STATEMENTS, min_size=1, max_size=3)).map(
    lambda t: t[0] + "".join(t[1])
)
TEMPLATES = st.one_of(SINGLE, SINGLE, TEXT_TEMPLATES, TEXT_TEMPLATES, TEXT_TEMPLATES, SHARED, SHARED, HEAVY, CHAINS)


# templates inline_safe is meant to accept (the constructs its docstring lists)
def _safe_expressions(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    filters = [*sorted(INLINE_FILTERS - {"default", "d"}), "default({e})"]
    # the tests that take an argument, with one
    binary = {"eq", "equalto", "ne", "==", "!=", "lt", "le", "gt", "ge", "in"}
    tests = [*sorted(INLINE_TESTS - binary), "eq {e}", "in {e}", "lt {e}"]
    return st.one_of(
        st.tuples(inner, st.sampled_from(("and", "or", "~", *COMPARISONS)), inner).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"
        ),
        st.tuples(inner, st.sampled_from(filters).flatmap(lambda f: _fill(f, inner))).map(
            lambda t: f"({t[0]} | {t[1]})"
        ),
        st.tuples(inner, st.sampled_from(tests).flatmap(lambda f: _fill(f, inner))).map(
            lambda t: f"({t[0]} is {t[1]})"
        ),
        st.tuples(inner, inner, inner).map(lambda t: f"({t[0]} if {t[1]} else {t[2]})"),
        inner.map(lambda e: f"(not {e})"),
        inner.map(lambda e: f"(-{e})"),
        st.lists(inner, max_size=4).map(lambda xs: "[" + ", ".join(xs) + "]"),
        st.tuples(inner, inner).map(lambda t: f"{{'k': {t[0]}, 'l': {t[1]}}}"),
        st.tuples(inner, inner).map(lambda t: f"{t[0]}[{t[1]}]"),
    )


SAFE_LEAF = st.one_of(
    st.sampled_from([*SCOPE_NAMES, "obj.a", "obj.b", "obj.items", "objs[0]", "items[1]"]),
    st.integers(-3, 64).map(str),
    st.sampled_from(["''", "'a'", "'ab,c'", "'\"'", '"\'"', "'\\\\'", "'<&>'", "none", "1.5"]),
)
SAFE_EXPR = st.recursive(SAFE_LEAF, _safe_expressions, max_leaves=10)
SAFE_TEMPLATES = st.one_of(
    SAFE_EXPR.map(lambda e: f"{{{{ {e} }}}}"),
    st.recursive(
        st.one_of(TEXT, SAFE_EXPR.map(lambda e: f"{{{{ {e} }}}}")),
        lambda inner: st.tuples(SAFE_EXPR, st.lists(inner, min_size=1, max_size=3), inner).map(
            lambda t: f"{{% if {t[0]} %}}{''.join(t[1])}{{% else %}}{t[2]}{{% endif %}}"
        ),
        max_leaves=5,
    ),
    # the same filter or operator many times over: a value grown by each
    st.tuples(
        st.sampled_from(["s", '"\'"', "items", "obj"]),
        st.sampled_from(["|tojson", "|string", " ~ s"]),
        st.integers(1, 40),
    ).map(lambda t: "{{ " + t[0] + t[1] * t[2] + " }}"),
)


@st.composite
def scopes(draw: st.DrawFn) -> dict[str, Any]:
    """A step's scope as a pod holds it: JSON data (decoded from the log, so no part is
    shared), of sizes from nothing to some thousands of elements (made, not drawn
    element by element, so a large one costs nothing to generate)."""
    n = draw(st.sampled_from([0, 1, 3, 20, 300, 5_000]))
    word = draw(st.text(alphabet="ab'\"\\<{}%,x \n", max_size=6))
    m = draw(st.sampled_from([0, 1, 5, 100, 2_000]))
    return {
        "x": draw(st.one_of(st.integers(-5, 70), st.integers(-(10**30), 10**30))),
        "big": int("7" * draw(st.sampled_from([1, 20, 300, 4_000]))),
        "s": word * m,
        "items": [f"{word}{i}" for i in range(n)],
        "nums": list(range(n)),
        "others": list(range(n)),  # equal to nums, not the same object
        "objs": [{"a": i % 3, "b": f"{word}{i}"} for i in range(n)],
        "obj": {"a": n, "b": word, "items": [word] * min(n, 3)},
    }


# --- measures ------------------------------------------------------------------------


def _written(value: Any) -> int:
    """A value's size once written out, measured as the output bound measures it
    (actors/playbook/bounds.py `deep_size`): characters of strings and numbers, one per
    other node."""
    total, stack = 0, [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v)
        elif isinstance(v, dict):
            total += 1 + len(v)
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            total += 1 + len(v)
            stack.extend(v)
        elif isinstance(v, int) and not isinstance(v, bool):
            total += v.bit_length() // 3 + 1
        else:
            total += 1
    return total


def _is_json(value: Any) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if v is None or isinstance(v, (bool, int, float, str)):
            continue
        if isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, dict) and all(isinstance(k, str) for k in v):
            stack.extend(v.values())
        else:
            return False
    return True


def _max_rss_mb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10


# --- a render process, shared by the examples ----------------------------------------


class Renderer:
    """One render process for a whole run (starting one costs a fresh interpreter),
    started again after a render killed it."""

    def __init__(self, bounds: RenderBounds) -> None:
        self.bounds = bounds
        self.proc: RenderProcess | None = None
        self.started = 0

    def get(self) -> RenderProcess:
        if self.proc is None or self.proc.killed or not self.proc.alive():
            if self.proc is not None:
                self.proc.kill()  # reaped, its pipes closed
            self.proc = RenderProcess(self.bounds)
            self.started += 1
        return self.proc

    def close(self) -> None:
        if self.proc is not None:
            self.proc.close()


@pytest.fixture(scope="module")
def renderer() -> Iterator[Renderer]:
    r = Renderer(BOUNDS)
    try:
        yield r
    finally:
        r.close()


Outcome = tuple[Any, ...]


def _event(value: str) -> None:
    """Hypothesis's `event`, or nothing outside a property (the pinned tests call too)."""
    try:
        event(value)
    except InvalidArgument:
        pass


def _note(value: str) -> None:
    try:
        note(value)
    except InvalidArgument:
        pass


def render_outcome(renderer: Renderer, template: str, scope: dict[str, Any], limits: Limits) -> Outcome:
    """What one render in the render process ends with. The call runs on a thread of its
    own so that a render that does not return fails the example (naming the template)
    instead of hanging the run."""
    proc = renderer.get()
    box: dict[str, Any] = {}

    def call() -> None:
        try:
            box["value"] = proc.render(template, scope, "args.v", limits, "fuzz")
        except BaseException as e:
            box["error"] = e

    started = time.monotonic()
    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(WALL + MARGIN)
    if t.is_alive():
        proc.kill()  # unblocks the call
        t.join(10)
        pytest.fail(f"the render did not return within {WALL + MARGIN:g} s (deadline {WALL:g} s): {template!r}")
    took = time.monotonic() - started
    if "value" in box:
        value = box["value"]
        assert _is_json(value), f"a render returned something that is not JSON data: {value!r:.200}"
        return ("value", value)
    e = box["error"]
    if isinstance(e, RenderFault):
        assert e.limit in ("template_seconds", "template_memory"), e.describe()
        assert e.step == "fuzz" and e.where == "args.v"
        _event(f"RenderFault {e.limit}")
        _note(f"RenderFault after {took:.2f} s: {e.describe()}")
        return ("fault", e.limit)
    if isinstance(e, TemplateLimit):
        assert e.limit in ("template_ops", "template_output", "template_source"), e
        _event(f"TemplateLimit {e.limit}")
        return ("limit", e.limit, e.message, e.where)
    if isinstance(e, TemplateError):
        _event("TemplateError")
        return ("error", e.message, e.where)
    raise AssertionError(f"a render raised {type(e).__name__}, no outcome of a template's: {e}") from e


# --- the properties ------------------------------------------------------------------

NESTED_LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}done"
SHARED_COMPARISON = (
    "{% set ns = namespace(a=[1], b=[1]) %}{% for i in range(60) %}{% set ns.a = [ns.a, ns.a] %}"
    "{% set ns.b = [ns.b, ns.b] %}{% endfor %}{{ ns.a == ns.b }}"
)
# charged a few operations per element, each building a string as wide as the output
# bound: within its budget, longer than any deadline here
SLOW_WITHIN_BUDGET = "{{ range(99999) | map('string') | map('center', 1000000) | map('length') | sum }}"
# the same, keeping what it builds: past the render process's memory
HUNGRY_WITHIN_BUDGET = "{{ range(99999) | map('string') | map('center', 1000000) | list | length }}"
EMPTY: dict[str, Any] = {}


@FUZZ
@given(
    template=TEMPLATES,
    scope=scopes(),
    ops=st.sampled_from([1_000, 30_000, 300_000]),
    output=st.sampled_from([1_000, 100_000, 1_000_000]),  # the last, the default: wide strings
)
@example(template=NESTED_LOOP, scope=EMPTY, ops=300_000, output=100_000)
@example(template=SHARED_COMPARISON, scope=EMPTY, ops=300_000, output=100_000)
@example(template=SLOW_WITHIN_BUDGET, scope=EMPTY, ops=2_000_000, output=1_000_000)
@example(template=HUNGRY_WITHIN_BUDGET, scope=EMPTY, ops=2_000_000, output=1_000_000)
def test_a_render_in_a_render_process_ends_within_its_bounds(
    renderer: Renderer, template: str, scope: dict[str, Any], ops: int, output: int
) -> None:
    limits = Limits(template_ops=ops, template_output=output)
    rss = _max_rss_mb()
    first = render_outcome(renderer, template, scope, limits)
    if first[0] == "value":
        # no more than a template may build, plus what it may pass on from its scope
        assert _written(first[1]) <= output + _written(scope), f"a result over the output bound: {template!r}"
    if first[0] == "fault":
        return  # a fault is the pod's, not the template's: nothing to repeat
    second = render_outcome(renderer, template, scope, limits)
    if second[0] == "fault":
        return  # the same render, killed this time by a busy machine: allowed, recorded as such
    assert first == second, f"two renders of one template and scope differ: {first!r:.300} / {second!r:.300}"
    # what a reply can make the pod hold: a result the size of the output bound, decoded
    assert _max_rss_mb() - rss < 256 + 4 * (output + _written(scope)) // 1_000_000


def _inline_bound(template: str, scope: dict[str, Any], output: int) -> int:
    """What an inline-safe template may be charged, at most: C * (N + 1) * (R * S + T + L).

    No loop, no call, no `set`: every node of the template's tree (N of them) runs at
    most once. What one node walks is its operands and its result: a value it built
    (at most the output bound T: every string a filter or `~` builds is refused past
    it), a literal of the source (at most L characters), or values of the scope, read
    at most R times in all (R the names the source reads, S the scope's written size).
    C = 4: a node walks a value a few times over (its charge, the output bound's
    check, `as_data` on the result), each pass one operation per element; in 2,000
    examples the largest charge was 0.19 times this with C = 1 (`items|string|string...`).

    Not linear in L + S: `{{ s ~ s ~ ... ~ s }}` (k reads) builds k * len(s) characters;
    `(s ~ ... ~ s) | upper | ... | upper` walks that once per filter (quadratic in the
    source); `{{ "'" | tojson | tojson ... }}` doubles its string with every `tojson`,
    exponential in the source until the output bound stops it: not inline-safe (pinned below)."""
    tree = jinja2.Environment().parse(template)
    all_nodes = list(tree.find_all(nodes.Node))
    reads = sum(1 for n in all_nodes if isinstance(n, nodes.Name))
    return 4 * (len(all_nodes) + 1) * (reads * _written(scope) + output + len(template))


SMALL_BUDGET = 2_000_000  # operations: a fraction of a second of CPU, however the template spends them


@FUZZ
@given(template=st.one_of(SAFE_TEMPLATES, TEMPLATES), scope=scopes(), output=st.sampled_from([1_000, 100_000]))
def test_an_inline_safe_template_is_charged_at_most_its_bound(
    template: str, scope: dict[str, Any], output: int
) -> None:
    if not inline_safe(template):
        # on the event loop (a slice, no render process) it is never rendered: the fold
        # moves off the loop before anything is charged
        event("refused by inline_safe")
        before = INLINE_TEMPLATE_OPS

        def on_the_loop() -> int:
            with pytest.raises(SliceExhausted):
                render_value(template, scope, where="args.v")
            return before - (thread_state.slice_left or 0)

        assert call_with_slice(before, on_the_loop) == 0
        return
    event("accepted by inline_safe")
    bound = _inline_bound(template, scope, output)
    limits = Limits(template_ops=SMALL_BUDGET, template_output=output)
    with template_limits(limits):
        outer = begin_budget()  # the render's own budget, read after it (nested renders share it)
        started = time.process_time()
        try:
            render_value(template, scope, where="args.v")
            event("rendered")
        except TemplateLimit as e:
            event(f"TemplateLimit {e.limit}")
            # past the small budget: only allowed when the bound is past it too
            assert e.limit != "template_ops" or bound > SMALL_BUDGET, (template, bound)
        except TemplateError:
            event("TemplateError")
        finally:
            used = thread_state.budget.used
            cpu = time.process_time() - started
            end_budget(outer)
    note(f"charged {used:,} of a bound of {bound:,}; {cpu * 1e3:.1f} ms of CPU")
    assert used <= bound, f"{template!r} charged {used:,}, more than its bound of {bound:,}"
    # work not charged (none is expected): a catastrophe net, far above the ~1 us an
    # operation costs, so a busy machine cannot trip it
    assert cpu < 1.0 + 50e-6 * used, f"{template!r}: {cpu:.2f} s of CPU for {used:,} operations"


# --- the findings, pinned (strict: each passes once fixed, then loses its mark) ------


def test_a_long_chain_is_a_template_error_not_a_pod_crash(renderer: Renderer) -> None:
    """`s.a.a...a` 327 times or more (661 characters; any left-nested chain: `|f`, `+`,
    `and`, `[0]`): `check`'s parse recurses past the interpreter's limit in the pod
    (RenderProcess.render -> names_read, and the loader), and RecursionError is raised
    to the caller, as no error of the template's."""
    outcome = render_outcome(renderer, "{{ s" + ".a" * 400 + " }}", {"s": {"a": 1}}, Limits())
    assert outcome[0] in ("limit", "error"), outcome


def test_the_pod_reads_a_templates_names_in_linear_time() -> None:
    """`templates.check` finds the names a template reads with
    `jinja2.meta.find_undeclared_variables`, whose code generator runs Jinja's optimizer
    whatever the environment says (`optimized=False` is not passed on): at every
    filter of a chain it tries to fold the whole chain below it into a constant. In the
    pod (RenderProcess.render -> names_read; core/work.py), before any deadline:
    `{{ s|upper ... }}` 150 filters (907 characters) take 2.6 s of CPU, 250 take 10 s,
    300 take 19 s."""
    template = "{{ s" + "|upper" * 150 + " }}"

    def parsed(*args: object, **kwargs: object) -> None:
        raise AssertionError("names_read parsed the template (Jinja's optimizer runs on a parse)")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(jinja2.Environment, "parse", parsed)
        mp.setattr(jinja2.Environment, "_parse", parsed)
        mp.setattr(jinja2.Environment, "lex", parsed)
        assert names_read(template) >= {"s"}


def test_a_single_expression_result_is_within_the_output_bound(renderer: Renderer) -> None:
    outcome = render_outcome(renderer, "{{ ['x' * 60, 'x' * 60] }}", {}, Limits(template_output=100))
    assert outcome[0] == "limit" and outcome[1] == "template_output", outcome


def _charged(template: str, scope: dict[str, Any]) -> tuple[Any, int]:
    with template_limits(Limits()):
        outer = begin_budget()
        try:
            value = render_value(template, scope)
        finally:
            used = thread_state.budget.used
            end_budget(outer)
    return value, used


def test_an_inline_test_is_charged_for_what_it_compares() -> None:
    """`a is eq b` compares two lists element by element as `a == b` does, which is
    charged per element; the test is charged nothing. Inline-safe: on the event loop, a
    2.4 KB template reading two 100,000-element lists 400 times over takes ~0.4 s of
    CPU for 2 operations, where the slice stops `==` at 50,000."""
    scope = {"a": list(range(10_000)), "b": list(range(10_000))}
    assert inline_safe("{{ a is eq b }}")
    _, used_operator = _charged("{{ a == b }}", scope)
    _, used_test = _charged("{{ a is eq b }}", scope)
    assert used_test >= used_operator >= 10_000


def test_a_filter_that_grows_its_string_at_every_link_is_not_inline_safe() -> None:
    """Each `tojson` escapes the backslashes of the last: 18 of them on one quote, 171
    characters and no scope, charge 655,000 operations. Not rendered on a pod's thread."""
    template = '{{ "\'"' + " | tojson" * 18 + " }}"
    assert not inline_safe(template)
    _, used = _charged(template, {})
    assert used > 64 * len(template)  # why: what it builds is charged, and it is a lot


def test_a_filter_is_charged_for_the_string_it_builds() -> None:
    """bounds.py: 'Work done in one go (a filter, a method call, ...) is charged one
    operation per element it touches'. `center`, `str.ljust`, `'{:>N}'.format` build N
    characters for a few operations: SLOW_WITHIN_BUDGET above spends ~25 us of CPU per
    operation (the nested loop ~0.13), so only the deadline ends it."""
    for template in ("{{ 'a' | center(100000) }}", "{{ 'a'.ljust(100000) }}", "{{ '{:>100000}'.format('a') }}"):
        value, used = _charged(template, {})
        assert used >= len(value), (template, used)
