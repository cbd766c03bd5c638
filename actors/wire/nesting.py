"""How deeply a user's value may nest, checked without recursion.

Every JSON decoder and encoder we use (msgspec, orjson), and every walk of a value in
Python (deep merge, templates, the playbook loader), recurses once per level: a payload
3,000 levels deep raises RecursionError wherever it is first touched, which is not a
user error anybody can act on. So a value from a user is measured first, by loops that
keep their own count, and refused past `MAX_DEPTH` levels with an error that says so.

Depth counts containers: `1` and `"x"` are 0 deep, `[]` and `{}` 1, `{"a": [1]}` 2.
"""

from __future__ import annotations

import re
from itertools import accumulate
from typing import Any

from actors.errors import UserError

# Far beyond what data nests to (documents from APIs seldom pass a dozen levels), and far
# below the ~1,000 frames of Python's recursion limit even when a walk of the value
# starts deep in an actor's stack and spends a few frames a level.
MAX_DEPTH = 64
# The most a start message may nest to be decoded at all (measured on its text first).
# Its payload is then held to MAX_DEPTH, but a payload a little deeper must still be
# read, so that the execution it starts (a child's: its args may carry a step's result,
# up to the 255 levels orjson writes) fails saying why and its parent hears of it,
# where a message left unread could only be dead-lettered. Decoding 256 levels is safe:
# the starter's stack is shallow, far from the ~1,000 frames of the recursion limit.
START_MESSAGE_DEPTH = 256


class TooDeep(UserError, ValueError):
    """A value nested deeper than allowed; the message names it and the limit."""


def too_deep(what: str, limit: int = MAX_DEPTH) -> TooDeep:
    return TooDeep(f"{what} nests deeper than {limit} levels of lists and mappings (the most allowed)")


def check_value_depth(what: str, value: Any, limit: int = MAX_DEPTH) -> None:
    """Raise TooDeep naming `what` when `value` (Python data) nests deeper than `limit`."""
    if not value_within(value, limit):
        raise too_deep(what, limit)


def value_within(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether `value` nests at most `limit` lists, tuples and mappings deep. Stops at the
    first container past the limit, so a value that contains itself ends too."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, (list, tuple)) else None
        if children is None:
            continue
        if depth + 1 > limit:
            return False
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list, tuple)))
    return True


# A JSON string, escapes included; an unterminated one runs to the end of the data
# (`"?`), so every match ends at a quote or at the end: one linear pass, whatever the input.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_OPEN, _CLOSE = b"[{", b"]}"
_NOT_BRACKETS = bytes(b for b in range(256) if b not in _OPEN + _CLOSE)
# each bracket as a signed step of the depth: +1 opens, -1 (0xFF as a signed byte) closes
_STEPS = bytes.maketrans(_OPEN + _CLOSE, b"\x01\x01\xff\xff")


def json_within(data: bytes | bytearray | memoryview | str, limit: int = MAX_DEPTH) -> bool:
    """Whether JSON text nests at most `limit` arrays and objects deep, read without
    decoding it (so without recursion). Brackets in strings do not count. Text that is
    not JSON gets an answer too (its decoder then says what is wrong with it)."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return True  # it cannot nest deeper than the containers it has: most messages stop here
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    # the running sum of the steps is the depth after each bracket, computed in C
    return max(accumulate(memoryview(brackets.translate(_STEPS)).cast("b")), default=0) <= limit


# Values in one value (result, payload, collection) stored as a blob: decoded, each costs
# the pod 50-80 bytes (a 63 MB list of 21 million `{}` took 1.6 GB), so this many is about
# 300 MB at most, whatever the bytes allow (ACTORS_MAX_VALUE_BYTES)
MAX_VALUE_NODES = 4_000_000
_NOT_SEPARATORS = bytes(b for b in range(256) if b not in b"[{,")


def json_nodes(data: bytes | bytearray | memoryview) -> int:
    """At least as many as the values in JSON text (arrays and objects, and their items),
    counted without decoding: its brackets and commas outside strings, plus one."""
    raw = bytes(data)
    if raw.count(b",") + raw.count(b"[") + raw.count(b"{") < MAX_VALUE_NODES:
        return raw.count(b",") + raw.count(b"[") + raw.count(b"{") + 1  # brackets in strings only add
    return len(_STRING.sub(b"", raw).translate(None, _NOT_SEPARATORS)) + 1
