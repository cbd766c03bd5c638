"""The output bound of template renders, `template_output` (`wire.Limits`), and the
charge of work done by size.

No string, list or mapping a template builds, nor its result, may exceed the bound, and
operations that would build a larger one (`'a' * 10**9`, `9 ** 9 ** 9`, `'%999999999d'`,
`'x'.ljust(10**9)`, `|center(10**9)`) are refused *before* they allocate. Work done in
one go (a filter, a method call, `+`, `*`, `~`, `in`, a slice) is charged one operation
per element it touches (actors/playbook/budget.py counts them).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from actors.playbook.budget import TemplateLimit, thread_state, tick

_DIGITS = re.compile(r"\d+")


def output_cap() -> int:
    return thread_state.budget.limits.template_output


def too_big(what: str) -> TemplateLimit:
    return TemplateLimit(
        f"{what} would exceed the output bound of {output_cap():,} (template_output)", limit="template_output"
    )


def size_of(value: Any) -> int:
    return len(value) if isinstance(value, (str, bytes, list, tuple, dict, set, frozenset, range)) else 1


def built(value: Any, *inputs: Any) -> Any:
    """A string a filter or method made: refused over the output bound, unless it is
    one of its inputs handed back (a value from the scope passes through unbounded:
    only what a template builds is). Lists they make are no longer than their inputs."""
    if isinstance(value, str) and len(value) > output_cap() and not any(value is x for x in inputs):
        raise too_big(f"a string of {len(value):,} characters")
    return value


def grown(value: Any) -> Any:
    """What an operator built (`+`, `*`, `%`, ...): bounded, and charged by its size."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value.bit_length() > MAX_INT_BITS:
            raise TemplateLimit(
                f"an integer of {value.bit_length():,} bits (more than {MAX_INT_BITS:,}: template_output)",
                limit="template_output",
            )
        return value
    n = size_of(value)
    if n > output_cap():
        raise too_big(f"a value of {n:,} elements")
    tick(n)
    return value


MAX_SOURCE = 65_536  # characters of one template: compiling is not charged, so it is bounded by size
MAX_INT_BITS = 65_536  # about 20,000 digits: integers a template may build or compute with
MAX_DEPTH = 64  # macro calls nested in one another


def deep_size(value: Any, what: str) -> int:
    """The size of `value` once written out (characters of its strings and numbers, one
    per other node), refused as soon as it passes the output bound: called before a
    value is turned into text, which a list of the same big string a thousand times
    over would make a gigabyte of. Iterative, and charged for what it walks."""
    cap = output_cap()
    total, walked = written_size(value, cap)
    if total > cap:
        raise too_big(f"{what} of more than {total:,} characters")
    tick(walked)
    return total


CHARGE_BATCH = 4_096  # nodes walked between two charges: a tick per node would double the walk's cost


# operations per node a comparison or the JSON check reaches: what the budget's other operations cost
WALK_WEIGHT = 2


def charge_walk(value: Any) -> None:
    """WALK_WEIGHT operations per node of `value`, a part shared by several places
    counted each time it is reached, as a comparison or a JSON check reaches it: a list
    holding itself twice, sixty levels deep, is 2^60 nodes here, not 60."""
    stack, n = [value], 0
    while stack:
        v = stack.pop()
        n += 1
        if isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
        if n >= CHARGE_BATCH:
            tick(n * WALK_WEIGHT)
            n = 0
    tick(n * WALK_WEIGHT)


def charge_compare(left: Any, right: Any, *, ordered: bool) -> None:
    """What comparing two containers may walk: nothing when `==`/`!=` answers from their
    sizes; else the smaller of the two, whole (shared parts counted each time), which
    is as far as a comparison can get."""
    both_seq = isinstance(left, (list, tuple)) and isinstance(right, (list, tuple))
    both_map = isinstance(left, dict) and isinstance(right, dict)
    if not ordered and (both_seq or both_map) and len(left) != len(right):
        tick()
        return
    charge_walk(left if size_of(left) <= size_of(right) else right)


def written_size(value: Any, cap: int, passed_on: set[int] | None = None) -> tuple[int, int]:
    """`value`'s size written out (characters of its strings and numbers, one per other
    node), and the nodes walked to find it, stopping as soon as it passes `cap`. A part
    in `passed_on` (by identity: a value of the scope handed on) counts 1 where it is
    first met; met again, it counts its whole size: a list of a thousand references to
    one big string is a thousand of it once written out."""
    total, walked, stack, seen = 0, 0, [value], set()
    while stack and total <= cap:
        v = stack.pop()
        walked += 1
        if passed_on is not None and id(v) in passed_on and id(v) not in seen:
            seen.add(id(v))
            total += 1
        elif isinstance(v, str):
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
    return total, walked


def bounded_result(value: Any, scope: Mapping[str, Any], names: Iterable[str]) -> None:
    """A single expression's result (`{{ [a * 60, b] }}`, a list it builds) within the
    output bound, as a string template's output is; what it hands on from the scope as
    it is (`{{ [fetch.data, 1] }}`) counts once, whatever its size. The scope's entries
    of `names` (what the template reads) are walked, and charged, only when the result
    is large."""
    if not isinstance(value, (str, list, tuple, dict)):
        return
    cap = output_cap()
    if written_size(value, cap)[0] <= cap:
        return
    passed_on: set[int] = set()
    stack, n = [scope[k] for k in names if k in scope], 0
    while stack:  # the strings and containers of what the template read: charged as walked
        v = stack.pop()
        if isinstance(v, (str, list, tuple, dict)):
            passed_on.add(id(v))
            n += 1
            if isinstance(v, dict):
                stack.extend(v.values())
            elif not isinstance(v, str):
                stack.extend(v)
        if n >= CHARGE_BATCH:
            tick(n)
            n = 0
    tick(n)
    if id(value) in passed_on:
        return
    size = written_size(value, cap, passed_on)[0]
    if size > cap:
        raise too_big(f"a result of more than {size:,} characters")


def int_cost(left: Any, right: Any, operator: str) -> None:
    """Arithmetic on big integers is not one operation: charge it by the words it
    multiplies, and refuse integers past MAX_INT_BITS."""
    if not (isinstance(left, int) and isinstance(right, int)) or isinstance(left, bool) or isinstance(right, bool):
        return
    a, b = left.bit_length(), right.bit_length()
    if max(a, b) > MAX_INT_BITS:
        raise TemplateLimit(
            f"'{operator}' on an integer of {max(a, b):,} bits (more than {MAX_INT_BITS:,}: template_output)",
            limit="template_output",
        )
    tick(1 + (a // 64) * (b // 64) // 16)


def refuse_big_ints(values: Any, what: str) -> None:
    """A width, count or padding above the output bound can only build a value over it."""
    cap = output_cap()
    for v in values:
        if isinstance(v, int) and not isinstance(v, bool) and v > cap:
            raise too_big(f"{what} with {v:,}")


def refuse_wide_format(fmt: str) -> None:
    cap = output_cap()
    for digits in _DIGITS.findall(fmt):
        if len(digits) > 12 or int(digits) > cap:
            raise too_big(f"a format width of {digits}")


def bounded_replace(s: str, old: str, new: str) -> None:
    hits = s.count(old) if old else len(s) + 1
    if len(s) + hits * max(len(new) - len(old), 0) > output_cap():
        raise too_big("a replace")


def bounded_join(items: Any, sep: Any) -> None:
    """A join's size, before it is built: the separator once between every two items
    (of a list, a range, a mapping's keys: anything with a length)."""
    if not isinstance(sep, str) or not hasattr(items, "__len__"):
        return
    n = len(items)
    total = len(sep) * max(n - 1, 0)
    if total <= output_cap() and isinstance(items, (list, tuple)):
        total += sum(size_of(x) if isinstance(x, str) else 1 for x in items)
    if total > output_cap():
        raise too_big(f"a join of {total:,} characters")


_FORMAT_FIELD = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[a-zA-Z%]")


def bounded_percent(fmt: str, args: Any) -> None:
    """A `%` format's size, before it is built: every conversion may print the largest
    argument (`"%(a)s" * 2000 % {"a": big}` prints `big` 2,000 times)."""
    fields = len(_FORMAT_FIELD.findall(fmt))
    values = args.values() if isinstance(args, dict) else args if isinstance(args, tuple) else (args,)
    largest = max((deep_size(v, "a '%' format") for v in values), default=0)
    total = len(fmt) + fields * largest
    if total > output_cap():
        raise too_big(f"a '%' format of {fields:,} conversions, about {total:,} characters")


def bounded_fill(s: str, fill: str, per: int, what: str) -> None:
    """`fill` added `per` times (an indent per line, a translation per character)."""
    if len(s) + per * len(fill) > output_cap():
        raise too_big(f"{what} of about {len(s) + per * len(fill):,} characters")
