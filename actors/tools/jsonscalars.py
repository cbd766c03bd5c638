"""The values JSON lacks, as every data tool gives them (docs/language.md: the postgres and
duckdb type tables): a non-finite float as the string `NaN`, `Infinity` or `-Infinity`,
bytes as base64, a date, time or timestamp in ISO 8601, a UUID as its text. What differs
between the tools (decimals, intervals, nested values) stays with each. Pure: imported by
the pod (actors/tools/pgvalues.py) and by the duckdb worker (actors/tools/duckdbrun.py)."""

from __future__ import annotations

import base64
import datetime as dt
import math
import uuid
from typing import Any

NOT_A_SCALAR = object()  # `json_scalar`'s answer for a value it does not shape


def json_float(f: float) -> float | str:
    if math.isfinite(f):
        return f
    return "NaN" if math.isnan(f) else ("Infinity" if f > 0 else "-Infinity")


def json_scalar(v: Any) -> Any:
    """`v` as JSON data when it is one of the values above; NOT_A_SCALAR otherwise."""
    if isinstance(v, float):
        return json_float(v)
    if isinstance(v, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(v)).decode("ascii")
    if isinstance(v, dt.datetime | dt.date | dt.time):
        return v.isoformat()
    if isinstance(v, uuid.UUID):
        return str(v)
    return NOT_A_SCALAR
