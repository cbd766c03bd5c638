"""PostgreSQL values as JSON values: what a `postgres` step's rows hold (docs/language.md,
"postgres"). Pure: no driver, no I/O. The driver's loaders (actors/tools/pgpool.py) hand
the text Postgres wrote for the types below to these functions, and every other value
goes through `json_value`.

| Postgres | JSON |
|---|---|
| int2, int4, int8, oid | number |
| float4, float8 | number; `NaN`, `Infinity`, `-Infinity` as those strings |
| numeric | string, exact as Postgres writes it (`"12.50"`, `"NaN"`, `"Infinity"`) |
| bool | true / false |
| text, varchar, char, name, enum | string |
| json, jsonb | the value itself |
| timestamptz | `"2024-01-02T03:04:05.123456+00:00"` (ISO 8601, the session's offset) |
| timestamp | `"2024-01-02T03:04:05.123456"` (no offset: it has none) |
| date | `"2024-01-02"` |
| time / timetz | `"03:04:05.5"` / `"03:04:05+02:00"` |
| interval | ISO 8601 duration, `"P1Y2M3DT4H5M6S"` |
| infinite date or timestamp | `"infinity"`, `"-infinity"` |
| uuid | string |
| bytea | base64 string |
| arrays | lists (of the element's JSON value) |
| anything else (inet, money, ranges, geometry, ...) | its text |

Dates before year 1 keep Postgres' ` BC` suffix (`"0044-03-15 BC"`).
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
from collections.abc import Callable
from typing import Any

from actors.tools.jsonscalars import NOT_A_SCALAR, json_scalar

__all__ = [
    "TEXT_TYPES",
    "date_text",
    "interval_text",
    "json_value",
    "numeric_text",
    "row_values",
    "time_text",
    "timestamp_text",
    "timestamptz_text",
    "timetz_text",
]

# an offset of whole hours, as Postgres writes it (`+00`, `-05`): ISO 8601 wants `+00:00`
_HOURS_OFFSET = re.compile(r"([+-]\d\d)$")
_PLAIN = (str, int, bool, type(None))


def numeric_text(s: str) -> str:
    """numeric: the exact text (a JSON number would round it in most readers)."""
    return s


def date_text(s: str) -> str:
    return s


def timestamp_text(s: str) -> str:
    """``2024-01-02 03:04:05`` -> ``2024-01-02T03:04:05`` (infinity and BC dates as written)."""
    return s if " " not in s or s.endswith(" BC") else s.replace(" ", "T", 1)


def timestamptz_text(s: str) -> str:
    """``2024-01-02 03:04:05+00`` -> ``2024-01-02T03:04:05+00:00``."""
    if s.endswith(" BC") or " " not in s:
        return s
    return _HOURS_OFFSET.sub(r"\1:00", s.replace(" ", "T", 1))


def time_text(s: str) -> str:
    return s


def timetz_text(s: str) -> str:
    """``03:04:05+02`` -> ``03:04:05+02:00``."""
    return _HOURS_OFFSET.sub(r"\1:00", s)


def interval_text(s: str) -> str:
    """interval, written by Postgres with ``intervalstyle = iso_8601`` (``P1Y2M3DT4H5M6S``):
    months and days kept apart, which a Python timedelta cannot do."""
    return s


# the types read as text and shaped here (date, timestamps, numeric: Python's types would
# refuse `infinity` and round nothing, but lose the text's exact scale): name -> function
TEXT_TYPES: dict[str, Callable[[str], Any]] = {
    "numeric": numeric_text,
    "date": date_text,
    "timestamp": timestamp_text,
    "timestamptz": timestamptz_text,
    "time": time_text,
    "timetz": timetz_text,
    "interval": interval_text,
    "uuid": str,
}


def _duration(d: dt.timedelta) -> str:
    sign = "-" if d < dt.timedelta(0) else ""
    d = abs(d)
    seconds = d.seconds + d.microseconds / 1e6
    return f"{sign}P{d.days}DT{seconds:g}S"


def json_value(v: Any) -> Any:
    """A value the driver loaded, as a JSON value (the table in the module docstring)."""
    if isinstance(v, _PLAIN):
        return v
    if isinstance(v, list | tuple):
        return [json_value(x) for x in v]
    if isinstance(v, dict):  # json / jsonb: already JSON (their floats are finite)
        return v
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, dt.timedelta):
        return _duration(v)
    shaped = json_scalar(v)  # floats, bytes, dates and times, UUIDs
    return str(v) if shaped is NOT_A_SCALAR else shaped


def row_values(row: tuple[Any, ...] | list[Any]) -> list[Any]:
    """One row's values as JSON values (plain values pass as they are: the common case)."""
    return [x if isinstance(x, _PLAIN) else json_value(x) for x in row]
