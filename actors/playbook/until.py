"""A wait step's `until` (`tool: wait`, docs/language.md "Waiting"): the rendered value
as epoch seconds. Pure: the engine's fold and the counter's read it, and the loader
checks a literal one (and the step's `zone`) before any execution starts.

Accepted: an ISO 8601 time (`2026-11-27T12:00:00Z`, `2026-11-27T12:00:00+01:00`,
`2026-11-27 12:00`, `2026-11-27`), read in `zone` (an IANA name, default UTC) when it
carries no offset; or epoch seconds (a number, or a string of one). Anything else is
an `UntilInvalid` that says what was given."""

from __future__ import annotations

import datetime
import importlib.resources
import math
import re
import zoneinfo
from functools import lru_cache
from typing import Any

UTC = datetime.UTC
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
# the latest time a timer can be set to: what `datetime` (and the server's schedule
# header) can represent
_LATEST = datetime.datetime(9999, 1, 1, tzinfo=UTC).timestamp()


class UntilInvalid(ValueError):
    """An `until` that is not a time, or a `zone` that is not one."""


@lru_cache(maxsize=256)
def zone_of(name: str | None) -> datetime.tzinfo:
    """The IANA zone `name` (None: UTC); UntilInvalid when the zone data has no such
    zone. Read from the `tzdata` package (a dependency) before the host's files: pods
    built from one image then agree on every zone's rules, which a replay needs (it
    compares the deadlines it computes with those the log records); the host's data
    only for a zone the package lacks (docs/semantics.md)."""
    if name is None or name.upper() == "UTC":
        return UTC
    packaged = _packaged_zone(name)
    if packaged is not None:
        return packaged
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise UntilInvalid(f"unknown time zone {name!r} (an IANA name such as 'Europe/Paris')") from None


_ZONE_NAME = re.compile(r"^[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*$")  # no `..`, no absolute path


def _packaged_zone(name: str) -> datetime.tzinfo | None:
    if not _ZONE_NAME.match(name):
        return None
    try:
        data = importlib.resources.files("tzdata.zoneinfo").joinpath(*name.split("/"))
        if not data.is_file():
            return None
        with data.open("rb") as f:
            return zoneinfo.ZoneInfo.from_file(f, key=name)
    except (ModuleNotFoundError, OSError, ValueError):
        return None


def parse_until(value: Any, zone: str | None = None) -> float:
    """Epoch seconds of `value` (see the module)."""
    try:
        return _parse(value, zone)
    except OverflowError:
        # a number past any float (`{{ 10 ** 400 }}`), a date whose offset takes it
        # past what `datetime` holds: the user's value, not the engine, is at fault
        raise UntilInvalid(f"not a time a timer can be set to: {_shown(value)}") from None


def _shown(value: Any) -> str:
    """`value` for a message, short (a huge int is not even turned into digits)."""
    if isinstance(value, int) and value.bit_length() > 200:
        return f"a number of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _parse(value: Any, zone: str | None) -> float:
    if isinstance(value, bool) or value is None:
        raise UntilInvalid(f"must be an ISO 8601 time or epoch seconds, got {value!r}")
    if isinstance(value, (int, float)):
        return _bounded(float(value), value)
    if not isinstance(value, str):
        raise UntilInvalid(f"must be an ISO 8601 time or epoch seconds, got {type(value).__name__}")
    text = value.strip()
    if _NUMBER.match(text):
        return _bounded(float(text), value)
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        shown = text if len(text) <= 80 else text[:77] + "..."
        raise UntilInvalid(f"not an ISO 8601 time: {shown!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=zone_of(zone))
    return _bounded(when.timestamp(), value)


def _bounded(seconds: float, given: Any) -> float:
    if not math.isfinite(seconds) or seconds < 0 or seconds >= _LATEST:
        raise UntilInvalid(f"not a time a timer can be set to: {_shown(given)}")
    return seconds


def iso_utc(seconds: float) -> str:
    """Epoch seconds as ISO 8601 in UTC (`...Z`): what a timer to a date results in."""
    text = datetime.datetime.fromtimestamp(seconds, UTC).isoformat()
    return text.removesuffix("+00:00") + "Z"
