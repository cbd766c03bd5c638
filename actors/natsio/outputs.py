"""What the engine and the counter both put on NATS besides their decisions' messages:
timers, stored in the log as scheduled messages, and stop requests for commands."""

from __future__ import annotations

import datetime
import time

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from actors.core.effects import CommandCancel, Timer
from actors.natsio.publishing import publish_all
from actors.wire import encode
from streams.layout import IN, SCH

SCHEDULE = "Nats-Schedule"
SCHEDULE_TARGET = "Nats-Schedule-Target"


def schedule_at(epoch: float) -> str:
    """The `Nats-Schedule` value for a one-shot timer (millisecond precision, UTC)."""
    stamp = datetime.datetime.fromtimestamp(epoch, datetime.UTC).isoformat(timespec="milliseconds")
    return "@at " + stamp.replace("+00:00", "Z")


async def arm_timers(js: JetStreamContext, timers: list[Timer], *, prefix: str, id_prefix: str) -> None:
    """Store each timer in the log as a scheduled message (`<prefix>.sch.<id>`): the
    server delivers it to `<prefix>.in.timer.<id>` when due, whatever happened to the
    process that armed it. Re-arming is idempotent (one schedule per subject); a timer
    already due (a replay after an outage) is delivered at once."""
    if not timers:
        return
    now = time.time()
    later = [t for t in timers if t.due > now + 0.05]
    due = [t for t in timers if t.due <= now + 0.05]
    await publish_all(
        js,
        [(f"{prefix}.{SCH}.{t.timer_id}", encode(t.fire), f"{id_prefix}:sch:{t.timer_id}") for t in later],
        headers=[{SCHEDULE: schedule_at(t.due), SCHEDULE_TARGET: f"{prefix}.{IN}.timer.{t.timer_id}"} for t in later],
    )
    await publish_all(
        js, [(f"{prefix}.{IN}.timer.{t.timer_id}", encode(t.fire), f"{id_prefix}:timer:{t.timer_id}") for t in due]
    )


async def stop_commands(nc: NATS, execution_id: str, cancels: list[CommandCancel]) -> None:
    """Tell the tool actors to stop each command: the one running it stops it, and one
    that takes it from the queue later answers `Cancelled` without running it (tool
    actors remember recent cancels).

    Commands are never purged from the work queue: a filtered purge of CMD while some of
    its messages are pending on a consumer whose client has died leaves other messages
    in the stream that the consumer never delivers again (nats-server; found by
    tests/test_chaos.py, the same class as nats-server issue #7680). A cancelled command
    that does run anyway (a tool pod that started after the cancel) has its result
    ignored: it answers a command that is no longer in flight."""
    for c in cancels:
        await nc.publish(f"cancel.{execution_id}.{c.command_id}", b"")
