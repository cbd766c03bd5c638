"""A schedule's next tick before the server has announced one: computed from the cron
the server was given (five fields get a seconds field of 0, six are seconds first,
`@name`s), in the schedule's time zone; a pattern it cannot read is unknown, not an error."""

from __future__ import annotations

import datetime

import pytest

from actors.client.nextfire import next_tick
from actors.client.schedules import cron_pattern

pytestmark = [pytest.mark.timeout(10)]

# 2026-11-26 21:44:30 UTC, a Thursday
NOW = datetime.datetime(2026, 11, 26, 21, 44, 30, tzinfo=datetime.UTC).timestamp()


@pytest.mark.parametrize(
    ("cron", "zone", "expected"),
    [
        ("0 2 * * *", None, "2026-11-27T02:00:00+00:00"),  # crontab's five fields: a nightly at 2
        ("*/5 * * * *", None, "2026-11-26T21:45:00+00:00"),
        ("*/2 * * * * *", None, "2026-11-26T21:44:32+00:00"),  # six: seconds first
        ("30 0 9 * * 1", None, "2026-11-30T09:00:30+00:00"),  # Mondays at 09:00:30
        ("0 2 * * *", "Europe/Paris", "2026-11-27T02:00:00+01:00"),  # read in the schedule's zone
        ("@hourly", None, "2026-11-26T22:00:00+00:00"),
        ("@daily", "America/New_York", "2026-11-27T00:00:00-05:00"),
    ],
)
def test_the_next_tick_is_the_first_after_now_in_the_schedules_zone(cron: str, zone: str | None, expected: str) -> None:
    assert next_tick(cron_pattern(cron), zone, NOW) == expected


@pytest.mark.parametrize(("pattern", "zone"), [("61 * * * * *", None), ("@every 5m", None), ("0 0 2 * * *", "No/Such")])
def test_a_pattern_or_zone_it_cannot_read_is_unknown(pattern: str, zone: str | None) -> None:
    assert next_tick(pattern, zone, NOW) is None
