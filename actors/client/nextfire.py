"""A schedule's next tick, computed from its cron for a schedule the server has not
announced one for yet (a new schedule before its first fire, or one just resumed).

The server announces the next tick with each fire (`Nats-Schedule-Next`), and that
announcement wins whenever there is one: it is what the server will do. Before the
first fire there is nothing announced, and a nightly schedule would show no next fire
for up to a day; croniter (pallets-eco) reads the same patterns the server does: five
fields (minute first, as crontab), six (seconds first) and the `@hourly`-style names.
A pattern it cannot read gives None (unknown), never an error: `list` must not fail
on a schedule the server accepted."""

from __future__ import annotations

import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter


def next_tick(pattern: str, timezone: str | None, after: float) -> str | None:
    """The first tick of the server's `pattern` (actors/client/schedules.py
    `cron_pattern`: six fields, seconds first, or `@name`) strictly after `after`
    (epoch seconds), in `timezone` (IANA; None: UTC), as RFC 3339 with its offset."""
    try:
        zone = ZoneInfo(timezone) if timezone else datetime.UTC
    except (ZoneInfoNotFoundError, ValueError):
        return None
    start = datetime.datetime.fromtimestamp(after, zone)
    text = " ".join(pattern.split())
    try:
        if text.startswith("@"):
            it = croniter(text, start)
        else:
            it = croniter(text, start, second_at_beginning=True)
        tick: datetime.datetime = it.get_next(datetime.datetime)
    except (CroniterError, ValueError, KeyError, OverflowError):
        return None
    return tick.isoformat()
