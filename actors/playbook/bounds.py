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
                f"an integer of {value.bit_length():,} bits (more than {MAX_INT_BITS:,})", limit="template_output"
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
    cap, total, walked = output_cap(), 0, 0
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
            raise too_big(f"{what} of more than {total:,} characters")
    tick(walked)
    return total


def int_cost(left: Any, right: Any, operator: str) -> None:
    """Arithmetic on big integers is not one operation: charge it by the words it
    multiplies, and refuse integers past MAX_INT_BITS."""
    if not (isinstance(left, int) and isinstance(right, int)) or isinstance(left, bool) or isinstance(right, bool):
        return
    a, b = left.bit_length(), right.bit_length()
    if max(a, b) > MAX_INT_BITS:
        raise TemplateLimit(
            f"'{operator}' on an integer of {max(a, b):,} bits (more than {MAX_INT_BITS:,})", limit="template_output"
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
    if isinstance(items, (list, tuple)) and isinstance(sep, str):
        total = len(sep) * max(len(items) - 1, 0) + sum(size_of(x) if isinstance(x, str) else 1 for x in items)
        if total > output_cap():
            raise too_big(f"a join of {total:,} characters")
