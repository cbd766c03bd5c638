"""Schedules: start a playbook on a cron, built on JetStream scheduled messages.

A schedule is two things in NATS: its spec in KV `schedules` (what `list` shows, and
what `resume` puts back) and, unless paused, its definition on
`schedules.def.<name>` in stream SCHEDULES: a message with a `Nats-Schedule` cron
header whose body is the start message. The server publishes that body to
`schedules.fire.<name>` at every tick; the starter turns each fire into an execution
whose id is the schedule's name and the fire time (`streams.ids.scheduled_execution_id`),
so a fire delivered twice, or after any restart, starts one execution.

The last fire is the last message on `schedules.fire.<name>` (kept for `fire_ttl`):
its time, and the execution it started (the same id the starter derives from it), are
read from there, with no write of their own. "Run now" publishes a fire by hand on the
same subject (marked `Actors-Run-Now` with its request id), so the starter starts it as
it starts any fire, under an id of its own (the tick's and the request's: two run-nows
in one second, or one in a cron tick's second, are two executions), and it is the
schedule's last fire from then on.

Pausing removes the definition (the server schedules nothing for it any more);
resuming publishes it again. A fire missed while the server was down is run once when
it comes back (the server's own policy), not once per missed tick.
"""

from __future__ import annotations

import datetime
import re
import time
from typing import Any

import msgspec
from nats.js.errors import BadRequestError, KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from actors.client.checks import check_size
from actors.client.nextfire import next_tick
from actors.client.session import PUBLISH_FAILED, Session, within_timeout
from actors.errors import UserError
from actors.natsio import MSG_ID, kv_keys, publisher
from actors.natsio.batchget import stamp_time
from actors.natsio.dial import NatsUnavailable
from actors.natsio.kvonce import create_once, delete_once, update_once
from actors.natsio.schedules import SCHEDULE, SCHEDULE_NEXT, SCHEDULE_TARGET, SCHEDULE_TIME_ZONE, SCHEDULE_TTL
from actors.wire.messages import ScheduleSpec, StartMessage, encode
from actors.wire.nesting import check_value_depth
from streams.ids import schedule_definition_id, schedule_run_id
from streams.layout import SCHEDULE_STREAM, SCHEDULES_BUCKET
from streams.subjects import schedule_definition_subject, schedule_fire_subject

# a subject token and a KV key; with the fire time it makes an execution id (<= 128)
SCHEDULE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,100}$")
# the server's answers to a pattern or a time zone it cannot use (ADR-51)
_BAD_PATTERN, _BAD_TIME_ZONE = 10189, 10223
_spec_decoder = msgspec.json.Decoder(ScheduleSpec)
# on a fire sent by hand (`schedule_run_now`): its request id (actors.engine.fires.RUN_NOW)
RUN_NOW = "Actors-Run-Now"
# the next tick a fire sent by hand passes on from the last fire, for `list`: the server
# refuses a message carrying its own Nats-Schedule-* headers (no scheduler sent it)
RUN_NOW_NEXT = "Actors-Schedule-Next"
MSG_TTL = "Nats-TTL"  # a fire sent by hand expires as the server's fires do
REQUEST_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ScheduleError(UserError):
    """A schedule request that cannot be done as asked (bad name, cron or time zone,
    no such schedule, one already there): one line for the user."""


class ScheduleView(msgspec.Struct):
    """A schedule as `list` shows it: its spec and, when it has fired, the next fire
    time the server announced (RFC 3339, in the schedule's time zone); its last fire
    (epoch seconds), the execution that fire started and whether it was a "run now"."""

    spec: ScheduleSpec
    next_fire: str | None = None
    last_fire: float | None = None
    last_execution_id: str | None = None
    last_run_now: bool = False


def cron_pattern(cron: str) -> str:
    """The server's pattern for a user's cron: 5 fields (minute first, as crontab) get
    a seconds field of 0; 6 fields (seconds first) and `@hourly`-style names are kept."""
    text = " ".join(cron.split())
    if text.startswith("@"):
        return text
    fields = text.split(" ") if text else []
    if len(fields) == 5:
        return "0 " + text
    if len(fields) == 6:
        return text
    raise ScheduleError(
        f"invalid cron {cron!r}: expected 5 fields (minute hour day month weekday), 6 (seconds first) or @hourly-style"
    )


def check_schedule_name(name: str) -> str:
    if not SCHEDULE_NAME.fullmatch(name):
        raise ScheduleError(f"invalid schedule name {name!r}: must match {SCHEDULE_NAME.pattern}")
    return name


class Scheduling(Session):
    """Add, list, pause, resume and delete schedules."""

    @within_timeout
    async def schedule_add(
        self,
        name: str,
        *,
        playbook: str,
        cron: str,
        payload: dict[str, Any] | None = None,
        timezone: str | None = None,
        version: int | None = None,
    ) -> ScheduleSpec:
        """Create schedule `name`. Refused (ScheduleError) if it exists, or if the cron
        or time zone is one the server cannot use; CatalogError for an unknown playbook.
        Nothing is left behind by a refused add."""
        check_schedule_name(name)
        check_value_depth(f"schedule {name}'s payload", payload)  # every fire's starter would refuse it
        pattern = cron_pattern(cron)
        await self._catalog_entry(playbook, version)  # CatalogError names what is missing
        spec = ScheduleSpec(
            name=name,
            playbook=playbook,
            cron=pattern,
            timezone=timezone,
            version=version,
            payload=payload or {},
            created=time.time(),
        )
        check_size(f"schedule {name}'s payload", len(encode(spec)), self.value_limit())
        kv = await self._schedules_kv()
        value = self.codec.encode(spec)  # its creation time makes it this call's own
        revision = await self._ride(f"adding schedule {name}", lambda: create_once(kv, name, value))
        if revision is None:
            raise ScheduleError(f"schedule {name} already exists (delete it first)")
        try:
            await self._define(spec, revision)
        except PUBLISH_FAILED as e:
            # the definition may still be stored (a copy in flight when NATS went away):
            # the schedule is kept, so that it can be seen and removed, and said so. (A
            # cancel, the same: kept, since its definition may be stored too.)
            raise NatsUnavailable(
                f"schedule {name} is stored but NATS did not confirm its definition within {self.timeout:g}s "
                f"({e!r}): it may or may not fire; `actors-cli schedule pause {name}` then `resume` defines it "
                f"again, `actors-cli schedule delete {name}` removes it"
            ) from e
        except Exception:
            # the server refused the definition (its cron, its time zone, this user): no schedule at all
            await self._ride(f"removing schedule {name}", lambda: delete_once(kv, name, last=revision))
            raise
        return spec

    async def schedules(self) -> list[ScheduleView]:
        """Every schedule, by name, with its next fire time when it has one."""
        kv = await self._schedules_kv()
        names = await self._ride("listing schedules", lambda: kv_keys(self.js, SCHEDULES_BUCKET))
        views = []
        for name in names:
            try:
                entry = await self._ride(f"reading schedule {name}", lambda: kv.get(name))  # noqa: B023
            except KeyNotFoundError:
                continue  # deleted meanwhile
            spec = self.codec.open_for_display(_spec_decoder.decode(entry.value or b""))
            views.append(await self._view(spec))
        return views

    async def _view(self, spec: ScheduleSpec) -> ScheduleView:
        last = await self._last_fire(spec.name)
        if last is None:
            return ScheduleView(spec=spec, next_fire=_computed(spec))
        headers = last.headers or {}
        stored = stamp_time(headers)
        if stored < spec.created:
            # a fire of an earlier schedule of this name (deleted, added again): not this one's
            return ScheduleView(spec=spec, next_fire=_computed(spec))
        announced = headers.get(SCHEDULE_NEXT)
        return ScheduleView(
            spec=spec,
            next_fire=None if spec.paused else _upcoming(announced or headers.get(RUN_NOW_NEXT)) or _computed(spec),
            last_fire=stored,
            last_execution_id=_fired_execution(spec.name, stored, announced, headers.get(RUN_NOW)),
            last_run_now=bool(headers.get(RUN_NOW)),
        )

    @within_timeout
    async def schedule_run_now(self, name: str, *, request_id: str) -> str:
        """Start `name`'s playbook with its payload now, paused or not, as a fire of the
        schedule sent by hand: the starter starts it as it starts every fire (under the
        id derived from the schedule and the fire's time, which this returns), and it
        is the schedule's last fire. `request_id` names this request: the same one sent
        again (a double click) is stored once, so it starts one execution."""
        if not REQUEST_ID.fullmatch(request_id):
            raise ScheduleError(f"invalid request id {request_id!r}: must match {REQUEST_ID.pattern}")
        spec, _ = await self._spec(name)
        start = StartMessage(playbook=spec.playbook, version=spec.version, payload=spec.payload)
        # the request's id in the fire: its execution is its own, not another fire's of the same second
        headers = {
            MSG_ID: schedule_run_id(name, request_id),
            MSG_TTL: f"{int(self.layout.fire_ttl)}s",
            RUN_NOW: request_id,
        }
        last = None if spec.paused else await self._last_fire(name)
        before = (last.headers or {}) if last is not None else {}
        upcoming = _upcoming(before.get(SCHEDULE_NEXT) or before.get(RUN_NOW_NEXT))
        if upcoming is not None:
            headers[RUN_NOW_NEXT] = upcoming  # `list` keeps showing the next tick
        acks = await publisher(self.nc).send(
            [(schedule_fire_subject(name), self.codec.encode(start), headers)], budget=self._left()
        )
        # a duplicate's ack names the first copy: its time, hence the same execution
        fire = await self._ride(
            f"reading the fire of schedule {name}",
            lambda: self.nc.jsm().get_msg(SCHEDULE_STREAM, seq=acks[0].seq, direct=True),
        )
        headers = fire.headers or {}
        return _fired_execution(name, stamp_time(headers), headers.get(SCHEDULE_NEXT), headers.get(RUN_NOW))

    @within_timeout
    async def schedule_pause(self, name: str) -> bool:
        """Stop firing `name` until resumed; False if it was paused already."""
        spec, revision = await self._spec(name)
        was_running = not spec.paused
        if was_running:
            spec.paused = True
            await self._update(spec, revision)
        # removed even when the spec says paused: a pause cut short before this line is finished
        await self._purge_definition(name)
        return was_running

    @within_timeout
    async def schedule_resume(self, name: str) -> bool:
        """Fire `name` again from its next tick (ticks while paused are not caught up);
        False if it was not paused. A schedule not paused but with no definition (a
        resume or an add cut short after its entry was stored: it would never fire) is
        defined again, and that is a resume too."""
        spec, revision = await self._spec(name)
        if not spec.paused:
            # a one-time `@at` the server has fired and removed is not defined again
            if spec.cron.startswith("@at") or await self._definition(name) is not None:
                return False
            await self._define(spec, revision)  # the message id of the revision it was stored at
            return True
        spec.paused = False
        await self._define(spec, await self._update(spec, revision))
        return True

    @within_timeout
    async def schedule_delete(self, name: str) -> None:
        """Remove `name` for good: no further fire (executions it started stay)."""
        try:
            _, revision = await self._spec(name)
        except ScheduleError:
            # no spec, but maybe a definition that fires all the same (an add whose
            # definition NATS stored after its client gave up and removed the spec)
            if await self._definition(name) is None:
                raise
            await self._purge_definition(name)
            return
        await self._purge_definition(name)
        kv = await self._schedules_kv()
        if not await self._ride(f"removing schedule {name}", lambda: delete_once(kv, name, last=revision)):
            raise ScheduleError(f"schedule {name} changed meanwhile (elsewhere): try again")

    async def _spec(self, name: str) -> tuple[ScheduleSpec, int]:
        check_schedule_name(name)
        kv = await self._schedules_kv()
        try:
            entry = await self._ride(f"reading schedule {name}", lambda: kv.get(name))
        except KeyNotFoundError:
            raise ScheduleError(f"no schedule {name}") from None
        return self.codec.decode(_spec_decoder, entry.value or b""), entry.revision or 0

    async def _schedules_kv(self) -> KeyValue:
        return await self._ride(f"reading bucket {SCHEDULES_BUCKET}", lambda: self.bucket(SCHEDULES_BUCKET))

    async def _update(self, spec: ScheduleSpec, revision: int) -> int:
        """Store `spec` over the revision it was read at; its new revision. ScheduleError
        when another client changed the schedule meanwhile."""
        kv, value = await self._schedules_kv(), self.codec.encode(spec)
        stored = await self._ride(
            f"changing schedule {spec.name}", lambda: update_once(kv, spec.name, value, last=revision)
        )
        if stored is None:
            raise ScheduleError(f"schedule {spec.name} changed meanwhile (elsewhere): try again")
        return stored

    async def _definition(self, name: str) -> Any:
        """The cron definition stored for `name` (a RawStreamMsg), or None."""
        return await self._last_on(schedule_definition_subject(name), f"reading schedule {name}'s definition")

    async def _purge_definition(self, name: str) -> None:
        """Remove the definition stored now, and only that one: the purge stops below
        the next sequence, so one sent again (its reply lost) never removes a definition
        a resume stored meanwhile (a schedule that says it runs and never fires)."""
        current = await self._definition(name)
        if current is None:
            return
        await self._ride(
            f"removing schedule {name}'s definition",
            lambda: self.js.purge_stream(
                SCHEDULE_STREAM, seq=current.seq + 1, subject=schedule_definition_subject(name)
            ),
        )

    async def _define(self, spec: ScheduleSpec, revision: int) -> None:
        """Publish the cron definition the server fires; the server checks the pattern
        and the time zone, and its refusal is turned into one line."""
        start = StartMessage(playbook=spec.playbook, version=spec.version, payload=spec.payload)
        headers = {
            SCHEDULE: spec.cron,
            SCHEDULE_TARGET: schedule_fire_subject(spec.name),
            # fires are kept as long as the logs they start, then expire on their own
            SCHEDULE_TTL: f"{int(self.layout.fire_ttl)}s",
            MSG_ID: schedule_definition_id(spec.name, revision),
        }
        if spec.timezone:
            headers[SCHEDULE_TIME_ZONE] = spec.timezone
        try:
            await publisher(self.nc).send(
                [(schedule_definition_subject(spec.name), self.codec.encode(start), headers)], budget=self._left()
            )
        except BadRequestError as e:
            if e.err_code == _BAD_TIME_ZONE:
                raise ScheduleError(f"invalid time zone {spec.timezone!r}: NATS refused it ({e.description})") from None
            if e.err_code == _BAD_PATTERN:
                raise ScheduleError(f"invalid cron {spec.cron!r}: NATS refused it ({e.description})") from None
            raise

    async def _last_fire(self, name: str) -> Any:
        """The last message on the schedule's fire subject (a RawStreamMsg), or None."""
        return await self._last_on(schedule_fire_subject(name), f"reading schedule {name}'s last fire")

    async def _last_on(self, subject: str, what: str) -> Any:
        """The last message on `subject` in the schedules' stream (a RawStreamMsg), or None."""
        try:
            return await self._ride(what, lambda: self.nc.jsm().get_last_msg(SCHEDULE_STREAM, subject, direct=True))
        except NotFoundError:
            return None


def _computed(spec: ScheduleSpec) -> str | None:
    """The next tick from the cron itself, when the server has announced none that is
    still ahead (actors/client/nextfire.py); None for a paused schedule."""
    if spec.paused:
        return None
    try:
        pattern = cron_pattern(spec.cron)
    except ScheduleError:
        return None  # a spec stored by hand that the server could not have taken either
    return next_tick(pattern, spec.timezone, time.time())


def _upcoming(announced: str | None) -> str | None:
    """A next fire time a fire announced, if it is still ahead: a time already past is
    stale (announced before a pause, or an outage), so unknown."""
    try:
        return announced if announced and datetime.datetime.fromisoformat(announced).timestamp() > time.time() else None
    except ValueError:
        return None


def _fired_execution(name: str, stored: float, announced: str | None, run_now: str | None) -> str:
    """The execution a fire stored at `stored` starts: what the starter derives from it
    (actors/engine/fires.py), from the same facts of the same message."""
    from actors.engine.fires import fire_execution_id  # the starter's own rule, so both agree

    return fire_execution_id(name, stored, announced, run_now)
