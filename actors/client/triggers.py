"""Triggers: start a playbook for every message on a NATS subject (docs/triggers.md).

A trigger is its spec in KV `triggers` (`TriggerSpec`, actors/wire/triggers.py), which
the trigger pods (actors/triggers/) watch, and, on a subject of a stream, a durable
consumer `trigger-<name>` on that stream, made by the trigger pods from the spec's
creation time (so nothing stored since `add` is missed, whenever a pod makes it): the
server keeps the messages for the pods, whether or not one runs. This client makes and
deletes no consumer: the cli user may not (deploy/nats/permissions.conf), so it can
neither delete the system's consumers nor make one that steals their messages. On a
core subject the pods hold a queue subscription: at most once, a message sent while
none listens is gone.

`add` refuses (one line, `TriggerError`, nothing left behind) a bad name, an unknown
playbook or version (`CatalogError`), a stream that does not exist or does not hold the
subject, the system's own streams and subjects (actors/triggers/guard.py: a trigger on
them feeds itself or steals inputs), wildcards on a core subject, a core subject a
stream stores (read it through the stream instead), and a payload template that does
not compile or reads anything but `message`. Pausing and resuming rewrite the spec:
the pods drop or take up the subscription (a paused stream trigger's messages wait in
the stream). `delete` removes a core trigger's spec and counts; a stream trigger's it
marks `deleting`, and a trigger pod deletes its consumer, then its counts and spec.
Executions it started stay. A spec this version cannot read (written by a newer one)
is listed as unreadable, with the reason, and can be deleted.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import msgspec
from nats.js.errors import (
    BadRequestError,
    BucketNotFoundError,
    KeyNotFoundError,
    NotFoundError,
)
from nats.js.kv import KeyValue

from actors.client.checks import check_size
from actors.client.session import Session, within_timeout
from actors.errors import UserError
from actors.natsio import kv_keys
from actors.natsio.kvonce import create_once, delete_once, update_once
from actors.playbook.templates import TemplateError, check, is_template
from actors.triggers.guard import is_system_stream, refusal
from actors.wire.messages import encode
from actors.wire.nesting import check_value_depth
from actors.wire.triggers import TRIGGER_NAME, TriggerSpec, TriggerStats, consumer_name, new_add_id, stats_key
from streams.layout import TRIGGERS_BUCKET

_spec_decoder = msgspec.json.Decoder(TriggerSpec)
_stats_decoder = msgspec.json.Decoder(TriggerStats)
_TOKEN = re.compile(r"^[^\s.*>]+$")
# subjects a core trigger may not listen on: the server's and the clients' own
_RESERVED = ("$", "_INBOX", "_trigger", "_deliver")
MAX_SUBJECT = 255
DELETE_WAIT = 5.0  # seconds `trigger_delete` waits for a trigger pod to remove a stream trigger


class TriggerError(UserError):
    """A trigger request that cannot be done as asked (bad name, subject, stream or
    template, no such trigger, one already there): one line for the user."""


class TriggerView(msgspec.Struct):
    """A trigger as `list` shows it: its spec, what the pods counted (started,
    dead-lettered, the last of each), and for a stream trigger the messages waiting
    for it (stored, not yet started: `waiting`), or why that cannot be read
    (`problem`: its stream or consumer gone). `unreadable`: why its spec cannot be
    read (a newer version's, say); `spec` then holds only its name."""

    spec: TriggerSpec
    stats: TriggerStats
    waiting: int | None = None
    problem: str | None = None
    unreadable: str | None = None


def check_trigger_name(name: str) -> str:
    if not TRIGGER_NAME.fullmatch(name):
        raise TriggerError(f"invalid trigger name {name!r}: must match {TRIGGER_NAME.pattern}")
    return name


def check_subject(subject: str, *, wildcards: bool) -> str:
    """A NATS subject: tokens separated by dots, none empty, no whitespace; `*` and `>`
    only as whole tokens, `>` last; with `wildcards` False, neither."""
    if not subject or len(subject) > MAX_SUBJECT:
        raise TriggerError(f"invalid subject {subject!r}: 1 to {MAX_SUBJECT} characters")
    tokens = subject.split(".")
    for i, t in enumerate(tokens):
        if t in ("*", ">"):
            if not wildcards:
                raise TriggerError(
                    f"subject {subject!r} has wildcards: a trigger on a core subject takes one subject "
                    "(wildcards are for a subject of a stream, with --stream)"
                )
            if t == ">" and i != len(tokens) - 1:
                raise TriggerError(f"invalid subject {subject!r}: '>' may only be the last token")
        elif not _TOKEN.fullmatch(t):
            raise TriggerError(f"invalid subject {subject!r}: empty token, whitespace or a partial wildcard")
    return subject


def subject_within(subject: str, pattern: str) -> bool:
    """Is every subject `subject` matches (itself a pattern) matched by `pattern`?"""
    s, p = subject.split("."), pattern.split(".")
    for i, pt in enumerate(p):
        if pt == ">":
            return len(s) > i
        if i >= len(s):
            return False
        st = s[i]
        if st == ">":
            return False  # `>` covers more tokens than any pattern but `>` does
        if pt == "*":
            continue
        if st == "*" or st != pt:
            return False
    return len(s) == len(p)


def check_template(template: Any) -> None:
    """A payload template: a JSON object (its strings may be templates) or one template
    string that makes one, reading only `message`. Compiled here, so a syntax error or
    an unknown filter is refused at `add`, not at the first message."""
    if template is None:
        return
    if not isinstance(template, dict) and not is_template(template):
        raise TriggerError("invalid payload template: a JSON object (its strings may be templates), or a template")
    try:
        check_value_depth("the payload template", template)
    except ValueError as e:
        raise TriggerError(f"invalid payload template: {e}") from None
    for where, source in _templates(template, "payload"):
        try:
            names = check(source)
        except TemplateError as e:
            raise TriggerError(f"invalid payload template at {where}: {e.message}") from None
        unknown = sorted(names - {"message"})
        if unknown:
            raise TriggerError(
                f"invalid payload template at {where}: it reads {', '.join(unknown)}; "
                "a trigger's template reads only `message` (subject, data, headers, seq, time)"
            )


def _templates(value: Any, where: str) -> list[tuple[str, str]]:
    if isinstance(value, str):
        return [(where, value)] if is_template(value) else []
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in _templates(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [t for i, v in enumerate(value) for t in _templates(v, f"{where}[{i}]")]
    return []


class Triggering(Session):
    """Add, list, pause, resume and delete triggers."""

    @within_timeout
    async def trigger_add(
        self,
        name: str,
        *,
        subject: str,
        playbook: str,
        stream: str | None = None,
        version: int | None = None,
        payload: Any = None,
    ) -> TriggerSpec:
        """Create trigger `name`: every message on `subject` (of `stream`, or a core
        subject when None) from now on starts `playbook`, its payload rendered from the
        template `payload` over `message` (None: the message's JSON body). Refused
        (TriggerError, CatalogError) as the module says; nothing is left behind."""
        check_trigger_name(name)
        check_subject(subject, wildcards=stream is not None)
        refused = refusal(subject, stream)
        if refused is not None:
            raise TriggerError(refused)
        check_template(payload)
        await self._catalog_entry(playbook, version)  # CatalogError names what is missing
        if stream is None:
            await self._trigger_check_core(subject)
        else:
            await self._trigger_check_stream(stream, subject)
        spec = TriggerSpec(
            name=name,
            subject=subject,
            playbook=playbook,
            stream=stream,
            version=version,
            payload=payload,
            created_at=time.time(),
            add_id=new_add_id(),
        )
        check_size(f"trigger {name}'s payload template", len(encode(spec)), self.value_limit())
        kv = await self._triggers_kv()
        value = self.codec.encode(spec)  # its add id makes it this call's own
        if await self._ride(f"adding trigger {name}", lambda: create_once(kv, name, value)) is None:
            try:
                existing: TriggerSpec | None = (await self._trigger_spec(name))[0]
            except TriggerError:
                existing = None  # unreadable, or gone meanwhile
            if existing is not None and existing.deleting:
                raise TriggerError(
                    f"trigger {name} is being deleted (a trigger pod removes its consumer first): try again once "
                    "`actors-cli trigger list` no longer shows it"
                )
            raise TriggerError(f"trigger {name} already exists (delete it first)")
        return spec

    async def _trigger_check_core(self, subject: str) -> None:
        if subject.startswith(_RESERVED):
            raise TriggerError(f"subject {subject!r} is reserved (NATS's own, or replies): not a trigger's subject")
        try:
            held = await self._ride(
                f"looking up the stream of subject {subject!r}", lambda: self.js.find_stream_name_by_subject(subject)
            )
        except NotFoundError:
            return
        raise TriggerError(
            f"subject {subject!r} is stored by stream {held}: add --stream {held} to read it durably "
            "(a core trigger would start again what the stream already holds, at most once)"
        )

    async def _trigger_check_stream(self, stream: str, subject: str) -> None:
        try:
            info = await self._ride(f"reading stream {stream}", lambda: self.js.stream_info(stream))
        except NotFoundError:
            raise TriggerError(f"no stream {stream!r}") from None
        except BadRequestError as e:
            raise TriggerError(f"invalid stream name {stream!r}: {e.description}") from None
        if is_system_stream(info.config.name or ""):
            raise TriggerError(refusal(subject, info.config.name) or f"stream {stream} is the system's own")
        subjects = info.config.subjects or []
        if not any(subject_within(subject, p) for p in subjects):
            held = ", ".join(subjects) or "none: it is a mirror or sourced"
            raise TriggerError(f"stream {stream} does not hold subject {subject!r} (its subjects: {held})")

    async def triggers(self) -> list[TriggerView]:
        """Every trigger, by name, with its counts and (stream) the messages waiting."""
        kv = await self._triggers_kv()
        names = [
            k for k in await self._ride("listing triggers", lambda: kv_keys(self.js, TRIGGERS_BUCKET)) if "." not in k
        ]
        views = []
        for name in sorted(names):
            try:
                entry = await self._ride(f"reading trigger {name}", lambda: kv.get(name))  # noqa: B023
            except KeyNotFoundError:
                continue  # deleted meanwhile
            try:
                spec = self.codec.open_for_display(_spec_decoder.decode(entry.value or b""))
            except Exception as e:  # a newer version's, or written by hand: shown, not fatal
                placeholder = TriggerSpec(name=name, subject="", playbook="")
                views.append(TriggerView(spec=placeholder, stats=TriggerStats(), unreadable=_unreadable(e)))
                continue
            views.append(await self._trigger_view(spec))
        return views

    async def _trigger_view(self, spec: TriggerSpec) -> TriggerView:
        kv = await self._triggers_kv()
        try:
            entry = await self._ride(f"reading trigger {spec.name}'s counts", lambda: kv.get(stats_key(spec.name)))
            stats = _stats_decoder.decode(entry.value or b"{}")
        except (KeyNotFoundError, msgspec.DecodeError):
            stats = TriggerStats()
        if spec.stream is None:
            return TriggerView(spec=spec, stats=stats)
        if spec.deleting:
            return TriggerView(spec=spec, stats=stats, problem="being deleted: a trigger pod removes its consumer")
        stream = spec.stream
        try:
            info = await self._ride(
                f"reading trigger {spec.name}'s consumer",
                lambda: self.js.consumer_info(stream, consumer_name(spec.name)),
            )
        except NotFoundError:
            # made by a trigger pod: none has run since `add`, or it was deleted by hand
            return TriggerView(
                spec=spec, stats=stats, problem=f"no consumer on stream {spec.stream} yet (a trigger pod makes it)"
            )
        waiting = (info.num_pending or 0) + (info.num_ack_pending or 0)
        return TriggerView(spec=spec, stats=stats, waiting=waiting)

    @within_timeout
    async def trigger_pause(self, name: str) -> bool:
        """Start nothing for `name` until resumed (a stream's messages wait); False if
        it was paused already."""
        return await self._trigger_set_paused(name, True)

    @within_timeout
    async def trigger_resume(self, name: str) -> bool:
        """Start again (a stream trigger: from the first message that waited); False if
        it was not paused."""
        return await self._trigger_set_paused(name, False)

    async def _trigger_set_paused(self, name: str, paused: bool) -> bool:
        kv = await self._triggers_kv()
        for _ in range(5):
            spec, revision = await self._trigger_spec(name)
            if spec.deleting:
                raise TriggerError(f"trigger {name} is being deleted")
            if spec.paused == paused:
                return False
            spec.paused = paused
            value = self.codec.encode(spec)
            changed = await self._ride(
                f"changing trigger {name}",
                lambda: update_once(kv, name, value, last=revision),  # noqa: B023
            )
            if changed is not None:
                return True
            # changed meanwhile: read it again
        raise TriggerError(f"trigger {name} keeps changing under this request; try again")

    @within_timeout
    async def trigger_delete(self, name: str) -> bool:
        """Remove `name` for good: its spec, its counts and its consumer (executions it
        started stay). A stream trigger is marked `deleting` and a trigger pod removes
        it, consumer first: True once it is gone, False if no trigger pod did within
        DELETE_WAIT seconds (one will when it runs). A spec that cannot be read is
        removed as it is (its consumer, if any, is left to the version that wrote it)."""
        kv = await self._triggers_kv()
        spec: TriggerSpec | None
        try:
            spec, revision = await self._trigger_spec(name)
        except UnreadableTrigger:
            spec = None
            revision = (await self._ride(f"reading trigger {name}", lambda: kv.get(name))).revision or 0
        if spec is None or spec.stream is None:
            if not await self._ride(f"removing trigger {name}", lambda: delete_once(kv, name, last=revision)):
                raise TriggerError(f"trigger {name} changed meanwhile: try again")
            # its counts: written by trigger pods all along, so removed whatever their revision
            await self._ride(f"removing trigger {name}'s counts", lambda: kv.delete(stats_key(name)))
            return True
        if not spec.deleting:
            spec.deleting = True
            value = self.codec.encode(spec)
            marked = await self._ride(f"deleting trigger {name}", lambda: update_once(kv, name, value, last=revision))
            if marked is None and not await self._being_deleted(name, spec.add_id):
                raise TriggerError(f"trigger {name} changed meanwhile: try again")
        deadline = time.monotonic() + DELETE_WAIT
        while time.monotonic() < deadline:
            try:
                await self._ride(f"reading trigger {name}", lambda: kv.get(name))
            except KeyNotFoundError:
                return True
            await asyncio.sleep(0.05)
        return False

    async def _being_deleted(self, name: str, add_id: str) -> bool:
        """Whether trigger `name` (the one added as `add_id`) is marked for deletion or
        gone already: a deletion mark whose reply was lost may have been acted on by a
        trigger pod, which removes the key, before the mark is sent again."""
        try:
            spec, _ = await self._trigger_spec(name)
        except UnreadableTrigger:
            return False
        except TriggerError:  # no trigger any more
            return True
        return spec.deleting and spec.add_id == add_id

    async def _triggers_kv(self) -> KeyValue:
        try:
            return await self._ride(f"reading bucket {TRIGGERS_BUCKET}", lambda: self.bucket(TRIGGERS_BUCKET))
        except BucketNotFoundError:
            raise TriggerError(
                f"no KV bucket {TRIGGERS_BUCKET!r}: an engine pod of a version with triggers creates it at its start"
            ) from None

    async def _trigger_spec(self, name: str) -> tuple[TriggerSpec, int]:
        check_trigger_name(name)
        kv = await self._triggers_kv()
        try:
            entry = await self._ride(f"reading trigger {name}", lambda: kv.get(name))
        except KeyNotFoundError:
            raise TriggerError(f"no trigger {name}") from None
        try:
            return self.codec.decode(_spec_decoder, entry.value or b""), entry.revision or 0
        except Exception as e:
            raise UnreadableTrigger(
                f"trigger {name}: its spec cannot be read ({_unreadable(e)}); "
                "`actors-cli trigger delete` removes it, or use the version that wrote it"
            ) from None


class UnreadableTrigger(TriggerError):
    """A spec this version cannot read (a newer version's, a hand-written one)."""


def _unreadable(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:300]
