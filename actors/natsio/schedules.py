"""Durable timers' headers: a timer is stored in the log as a scheduled message
(actors/runtime/outbox.py arms them), which the server delivers when due."""

from __future__ import annotations

import datetime
import math

SCHEDULE = "Nats-Schedule"
SCHEDULE_TARGET = "Nats-Schedule-Target"


def schedule_at(epoch: float) -> str:
    """The `Nats-Schedule` value for a one-shot timer (millisecond precision, UTC)."""
    # rounded up to the millisecond: a timer is never delivered before its due time (a
    # wait's `until` is a promise of "not before")
    stamp = datetime.datetime.fromtimestamp(math.ceil(epoch * 1000) / 1000, datetime.UTC).isoformat(
        timespec="milliseconds"
    )
    return "@at " + stamp.replace("+00:00", "Z")


# recurring schedules (actors/client/schedules.py): a cron pattern in a time zone; each
# fire the server publishes carries the schedule's subject and its next fire time
SCHEDULE_TIME_ZONE = "Nats-Schedule-Time-Zone"
SCHEDULE_TTL = "Nats-Schedule-TTL"
SCHEDULER = "Nats-Scheduler"
SCHEDULE_NEXT = "Nats-Schedule-Next"
