"""Rendered tool fields read as what they must be (seconds, a mapping, a flag, text), or
ToolFailure(ToolConfigError) naming the field."""

from __future__ import annotations

import math
from typing import Any

from actors.tools.failures import ToolFailure
from actors.wire.jsonvalues import dumps, loads

__all__ = ["flag", "mapping", "seconds", "text"]


def seconds(value: Any, what: str) -> float:
    try:
        if isinstance(value, bool):
            raise ValueError
        s = float(value)
    except (TypeError, ValueError):
        raise ToolFailure("ToolConfigError", f"{what} must be a number of seconds, got {value!r}") from None
    if math.isnan(s):
        raise ToolFailure("ToolConfigError", f"{what} must be a number of seconds, got {value!r}")
    return s


def mapping(value: Any, what: str) -> dict[str, Any] | None:
    """A rendered field that must be a mapping (a JSON object string is accepted)."""
    if value is None:
        return None
    if isinstance(value, str):
        if not value.strip():
            return None
        try:
            value = loads(value)
        except ValueError:
            raise ToolFailure("ToolConfigError", f"{what} must be a mapping, got the string {value[:80]!r}") from None
    if not isinstance(value, dict):
        raise ToolFailure("ToolConfigError", f"{what} must be a mapping, got {type(value).__name__}")
    return value


def flag(value: Any, what: str, default: bool) -> bool:
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return bool(value)
    if isinstance(value, str):
        v = value.strip().lower()
        if v in ("true", "yes", "on", "1"):
            return True
        if v in ("false", "no", "off", "0", "none", "null", ""):
            return False
    raise ToolFailure("ToolConfigError", f"{what} must be a boolean, got {value!r}")


def text(value: Any) -> str:
    return value if isinstance(value, str) else dumps(value).decode()
