"""A schedule's fire (stream SCHEDULES, `schedules.fire.<name>`) as the start it asks
for. The server publishes the schedule's start message there at each cron tick; the
execution id is derived here from the schedule's name and the time the fire was
stored, to the second (cron's resolution), so every delivery of one fire (redelivered,
read by another starter, after a restart of every pod) names the same execution."""

from __future__ import annotations

import msgspec
from nats.aio.msg import Msg

from actors.natsio import log_time
from actors.wire import StartMessage
from streams.ids import scheduled_execution_id
from streams.subjects import schedule_of_fire

_start_decoder = msgspec.json.Decoder(StartMessage)


def fire_start(msg: Msg) -> tuple[str, StartMessage]:
    """The execution id and start message of a fire (msgspec errors for a body that is
    not a start message)."""
    start = _start_decoder.decode(msg.data)
    return scheduled_execution_id(schedule_of_fire(msg.subject), log_time(msg)), start
