"""JSON text of values from tools, logs and users, with integers of any size.

orjson is the fast path, but it refuses an integer beyond 64 bits when encoding and
reads one as a float when decoding (silently changing it). So: encode with orjson,
and when it refuses for that one reason, write those integers as they are (orjson
`Fragment`s) and let orjson judge the rest as before (a set, an object stay refused);
decode with msgspec, which reads integers of any size exactly.
"""

from __future__ import annotations

from typing import Any

import msgspec
import orjson

_LOW, _HIGH = -(2**63), 2**64 - 1  # what orjson writes itself


def dumps(value: Any, *, indent: bool = False, any_keys: bool = False) -> bytes:
    """Raises TypeError for what is not JSON data (with `any_keys`, mapping keys that
    are not strings are written as strings, as the log's encoder does)."""
    option = (orjson.OPT_INDENT_2 if indent else 0) | (orjson.OPT_NON_STR_KEYS if any_keys else 0)
    try:
        return orjson.dumps(value, option=option)
    except TypeError as exc:
        if "64-bit" not in str(exc):  # orjson: "Integer exceeds 64-bit range"
            raise
    return orjson.dumps(_big_ints_written(value), option=option)


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """Raises ValueError (msgspec.DecodeError) for what is not JSON."""
    return msgspec.json.decode(data)


def _big_ints_written(value: Any) -> Any:
    """`value` with every integer orjson cannot write replaced by its JSON text."""
    if isinstance(value, int) and not isinstance(value, bool) and not _LOW <= value <= _HIGH:
        return orjson.Fragment(str(int(value)))
    if isinstance(value, dict):
        return {k: _big_ints_written(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_big_ints_written(v) for v in value]
    return value
