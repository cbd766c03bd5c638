"""A schedule's fire (stream SCHEDULES, `schedules.fire.<name>`) as the start it asks
for. The server publishes the schedule's start message there at each cron tick, with
the schedule's next tick in `Nats-Schedule-Next`; the execution id is derived here from
the schedule's name and the fire time, so every delivery of one fire (redelivered, read
by another starter, after a restart of every pod) names the same execution.

The fire time is the second the fire was stored in, but never later than a second
before the next tick the fire announces: a fire the server stored late (past the next
tick's second, on a loaded server) keeps its own tick's name instead of taking the next
one's. Both come from the fire message itself, so a redelivery derives the same.

A fire sent by hand ("run now", actors/client/schedules.py) names the request that sent
it (`Actors-Run-Now: <request id>`): its execution is the tick's id and a digest of the
request, so two run-nows in one second, or one in the second of a cron tick, start
executions of their own, while the same request sent twice is stored once and starts
one (its Nats-Msg-Id)."""

from __future__ import annotations

import datetime
import hashlib

import msgspec
from nats.aio.msg import Msg

from actors.natsio import log_time
from actors.natsio.schedules import SCHEDULE_NEXT
from actors.wire.codec import CLEAR, PayloadCodec
from actors.wire.messages import StartMessage
from actors.wire.nesting import START_MESSAGE_DEPTH, json_within, too_deep
from streams.ids import scheduled_execution_id
from streams.subjects import schedule_of_fire

_start_decoder = msgspec.json.Decoder(StartMessage)
RUN_NOW = "Actors-Run-Now"  # on a fire sent by hand: the request's id ("1" from older clients)


def fire_execution_id(schedule: str, stored: float, next_tick: str | None, run_now: str | None = None) -> str:
    """The execution a fire starts, from the fire message's own facts: the schedule,
    when it was stored, the next tick it announces, and the request of a fire sent by
    hand. The starter and the client (which returns the id of a run now) both use it."""
    eid = scheduled_execution_id(schedule, fire_time(stored, next_tick))
    if run_now and run_now != "1":
        # <= 128 with a 100-character name: "-n" and 8 hex digits after the 117 of the tick
        eid += "-n" + hashlib.blake2b(run_now.encode(), digest_size=4).hexdigest()
    return eid


def fire_time(stored: float, next_tick: str | None) -> float:
    """The tick a fire stands for, in whole epoch seconds: the second it was `stored`
    in, or one second before `next_tick` (RFC 3339) if that is earlier."""
    when = float(int(stored))
    if next_tick:
        try:
            announced = datetime.datetime.fromisoformat(next_tick).timestamp()
        except ValueError:
            return when  # not a time (a one-shot's `purge`): the stored second
        when = min(when, float(int(announced)) - 1.0)
    return when


def fire_start(msg: Msg, codec: PayloadCodec = CLEAR) -> tuple[str, StartMessage]:
    """The execution id and start message of a fire (msgspec errors for a body that is
    not a start message; `PayloadUnreadable` for a payload this pod cannot decrypt;
    `TooDeep` for one nested too deep, measured before decoding: a decoder recurses)."""
    if not json_within(msg.data, START_MESSAGE_DEPTH):
        raise too_deep("the start message", START_MESSAGE_DEPTH)
    start = codec.decode(_start_decoder, msg.data)
    headers = msg.headers or {}
    eid = fire_execution_id(
        schedule_of_fire(msg.subject), log_time(msg), headers.get(SCHEDULE_NEXT), headers.get(RUN_NOW)
    )
    return eid, start
