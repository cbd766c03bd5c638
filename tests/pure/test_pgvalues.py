"""PostgreSQL values as JSON values (actors/tools/pgvalues.py): the shaping of Postgres'
text and of the driver's Python values, without a server (tests/system/test_postgres_tool.py
checks the same table against a real one)."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid

import pytest

from actors.tools import pgvalues as v


@pytest.mark.timeout(10)
def test_timestamps_become_iso_8601_with_a_full_offset() -> None:
    assert v.timestamptz_text("2024-01-02 03:04:05.25+00") == "2024-01-02T03:04:05.25+00:00"
    assert v.timestamptz_text("2024-01-02 03:04:05+05:30") == "2024-01-02T03:04:05+05:30"
    assert v.timestamptz_text("infinity") == "infinity"
    assert v.timestamptz_text("0044-03-15 10:00:00+00 BC") == "0044-03-15 10:00:00+00 BC"
    assert v.timestamp_text("2024-01-02 03:04:05") == "2024-01-02T03:04:05"
    assert v.timestamp_text("-infinity") == "-infinity"
    assert v.timetz_text("03:04:05-07") == "03:04:05-07:00"
    assert v.timetz_text("03:04:05+05:45") == "03:04:05+05:45"


@pytest.mark.timeout(10)
def test_python_values_the_driver_loads_become_json_values() -> None:
    assert v.json_value(float("nan")) == "NaN"
    assert v.json_value(float("inf")) == "Infinity" and v.json_value(float("-inf")) == "-Infinity"
    assert v.json_value(1.5) == 1.5
    assert v.json_value(decimal.Decimal("12.50")) == "12.50"
    assert v.json_value(b"\xde\xad\xbe\xef") == "3q2+7w=="
    assert v.json_value(memoryview(b"ab")) == "YWI="
    u = uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
    assert v.json_value(u) == str(u)
    tz = dt.timezone(dt.timedelta(hours=2))
    assert v.json_value(dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=tz)) == "2024-01-02T03:04:05+02:00"
    assert v.json_value(dt.date(2024, 1, 2)) == "2024-01-02"
    assert v.json_value(dt.timedelta(days=1, seconds=30)) == "P1DT30S"
    assert v.json_value([[1.0, float("nan")], [None]]) == [[1.0, "NaN"], [None]]
    assert v.json_value({"a": 1}) == {"a": 1}
    assert v.row_values((1, "x", None, True, decimal.Decimal("1.0"))) == [1, "x", None, True, "1.0"]
