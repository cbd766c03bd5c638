"""Partition ownership across pods: leases in the KV bucket `owners`, whose entries age
out after the lease TTL (the bucket's max age) unless renewed.

Each pod of a role (engine, counter) heartbeats `members.<role>.<pod>` and, every
`period`, balances: it renews the leases it holds (`<role>.p<N>`, compare-and-set on
the revision it last wrote, so a lease someone else took is lost, never stolen back),
releases leases above its fair share (ceil(partitions / live members); the newest
pods get theirs as older ones release), and takes free ones up to its share with
`create`, which succeeds for one pod only. The server decides every conflict: there is
no election of our own.

A pod consumes a partition only while it holds its lease, and drops it as soon as a
renewal fails or the lease may have run out without a successful renewal (a pod cut
off from NATS stops before another can take over). What overlap remains at a handover
(a pod paused past its TTL) is covered by the engine's determinism: both would fold the
same log into the same decisions, published under the same message ids.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
import re
import socket
import time
from collections.abc import Awaitable, Callable

import msgspec
from nats.aio.client import Client as NATS
from nats.errors import ConnectionReconnectingError
from nats.js.errors import BadRequestError, KeyNotFoundError, KeyValueError, NotFoundError
from nats.js.kv import KeyValue

from actors.core.replay import SEMANTICS
from actors.natsio import TRANSIENT_REQUEST
from actors.natsio.subjectlist import stream_subjects
from actors.runtime.stopping import cancel_and_wait
from streams.layout import OWNERS_BUCKET
from streams.subjects import kv_stream

log = logging.getLogger("actors.runtime.ownership")
Callback = Callable[[int], Awaitable[None]]


class Member(msgspec.Struct):
    """What a pod's `members.<role>.<pod>` entry says of it: the engine semantics it
    runs (actors/core/replay.py). An entry written before it said so (empty) is of
    semantics 1. `features`: what it knows of start records that an older pod would
    drop without a word (docs/upgrades.md "Features"); an entry without one is a pod
    that knows none."""

    semantics: int = 1
    features: list[str] = msgspec.field(default_factory=list)


# `redrive`: a start record's `RetryOf.redrive` and a loop spec's `LoopSpec.only` are
# honoured (an older counter runs every item again; an older engine cannot decode it).
# `signals`: a `SignalSent` in an execution's or a loop's log is folded (an older engine
# or counter cannot decode it, and would fault the execution)
FEATURES = ["redrive", "signals"]
MEMBER_RECORD = msgspec.json.encode(Member(semantics=SEMANTICS, features=FEATURES))
_member = msgspec.json.Decoder(Member)


def member_semantics(value: bytes | None) -> int:
    """The semantics a member entry names (1: empty, or not one this code reads)."""
    try:
        return _member.decode(value).semantics if value else 1
    except msgspec.DecodeError:
        return 1


async def member_entries(nc: NATS, kv: KeyValue, role: str) -> dict[str, bytes]:
    """The pods of `role` with a live member entry (`members.<role>.<pod>`), each with
    its entry, sorted by name. Read as the bucket's subjects (one stream lookup, which
    every user may make) and a get of each: no consumer, which `KeyValue.keys` makes
    (and fills with the whole bucket) on every call; every pod asks every lease period.
    A subject whose last message is a delete (a pod that stopped) is skipped."""
    prefix = f"$KV.{OWNERS_BUCKET}.members.{role}."
    found: dict[str, bytes] = {}
    for subject in sorted(await stream_subjects(nc, kv_stream(OWNERS_BUCKET), prefix + ">")):
        member = subject[len(prefix) :]
        try:
            entry = await kv.get(f"members.{role}.{member}")
        except KeyNotFoundError:
            continue  # deleted, or aged out meanwhile
        found[member] = entry.value or b""
    return found


async def members(nc: NATS, kv: KeyValue, role: str) -> list[str]:
    """The pods of `role` with a live member entry, sorted (`member_entries`)."""
    return list(await member_entries(nc, kv, role))


async def semantics_in_use(nc: NATS, kv: KeyValue, role: str = "engine") -> int:
    """The semantics every live pod of `role` runs: the lowest any member entry names
    (entries age out with the lease TTL; a stopped pod deletes its own), or this
    code's when none is found. A starter stamps new executions with it, so that during
    a rolling upgrade an execution starts under semantics every engine pod knows:
    none halts on `SemanticsUnknown` because an older engine met it (docs/upgrades.md)."""
    return min((member_semantics(v) for v in (await member_entries(nc, kv, role)).values()), default=SEMANTICS)


async def lacking(nc: NATS, kv: KeyValue, feature: str, roles: tuple[str, ...] = ("engine", "counter")) -> list[str]:
    """The live pods of `roles` (`<role>/<pod>`) whose member entry does not name
    `feature`: older code, which must not meet a start that relies on it (a client's
    NATS user may read them: `member_entries`)."""
    found: list[str] = []
    for role in roles:
        for member, value in (await member_entries(nc, kv, role)).items():
            try:
                features = _member.decode(value).features if value else []
            except msgspec.DecodeError:
                features = []
            if feature not in features:
                found.append(f"{role}/{member}")
    return found


_runtimes = itertools.count(1)


def pod_name() -> str:
    """A KV-key-safe member name, new at each call: host, process and a sequence
    number, so that two runtimes in one process (a test's pods, a role restarted in
    place) are two members and never renew or release each other's leases."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", f"{socket.gethostname()}-{os.getpid()}-{next(_runtimes)}")


class Leases:
    def __init__(
        self,
        nc: NATS,
        *,
        role: str,
        partitions: int,
        ttl: float,
        on_gain: Callback,
        on_lose: Callback,
        pod: str | None = None,
    ) -> None:
        self.nc = nc
        self.role = role
        self.partitions = partitions
        self.ttl = ttl
        self.period = ttl / 4
        self.pod = pod or pod_name()
        self.on_gain = on_gain
        self.on_lose = on_lose
        self.held: dict[int, int] = {}  # partition -> revision of our last write
        self._renewed_at = 0.0  # monotonic time of the last successful balance
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._balancing = asyncio.Lock()

    def _key(self, p: int) -> str:
        return f"{self.role}.p{p}"

    async def start(self) -> None:
        self.kv = await self.nc.jetstream().key_value(OWNERS_BUCKET)
        await self.balance()
        self._task = asyncio.create_task(self._run(), name=f"leases:{self.role}")

    async def stop(self) -> None:
        """Hand every partition back at once (a graceful stop does not make the others
        wait for a TTL). Without NATS (a stop during an outage) each partition is still
        let go here, at once; its lease then expires after the TTL: asking the server
        would only wait out a request timeout per partition."""
        await cancel_and_wait([self._task])
        unreachable: BaseException | None = None if self.nc.is_connected else ConnectionReconnectingError()
        for p in sorted(self.held):
            if unreachable is None:
                try:
                    await self._release(p)
                except TRANSIENT_REQUEST as e:
                    unreachable = e  # `p` was let go before its delete failed; the rest only are
            else:
                await self._let_go(p)
            self._changed.set()
        if unreachable is not None:
            log.warning(
                "%s leases: not handed back (%s); they expire within %.0fs",
                self.role,
                str(unreachable) or type(unreachable).__name__,
                self.ttl,
            )
            return
        try:
            await self.kv.delete(f"members.{self.role}.{self.pod}")
        except Exception:
            pass

    async def wait_changed(self) -> None:
        """Until the set of held partitions changes (for tests and readiness)."""
        self._changed.clear()
        await self._changed.wait()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            try:
                await self.balance()
            except Exception as e:  # NATS unreachable, a timeout: keep what is still safe
                log.warning("%s leases: balance failed: %s", self.role, e)
                if time.monotonic() - self._renewed_at > self.ttl * 0.75:
                    # our leases may run out before we can renew: stop first
                    for p in sorted(self.held):
                        del self.held[p]
                        await self.on_lose(p)
                    self._changed.set()

    async def balance(self) -> None:
        """Renew, give back and take leases until this pod holds its fair share. One
        balance at a time: two at once would renew the same lease twice on one
        revision, and the loser would drop a lease this pod holds."""
        async with self._balancing:
            await self._balance()

    async def _balance(self) -> None:
        started = time.monotonic()
        await self.kv.put(f"members.{self.role}.{self.pod}", MEMBER_RECORD)
        members = await self._members()
        fair = math.ceil(self.partitions / max(len(members), 1))
        before = set(self.held)
        for p, rev in list(self.held.items()):
            try:
                self.held[p] = await self.kv.update(self._key(p), self.pod.encode(), last=rev)
            except KeyValueError:
                del self.held[p]
                log.warning("%s leases: lost partition %d", self.role, p)
                await self.on_lose(p)
        for p in sorted(self.held, reverse=True)[: max(len(self.held) - fair, 0)]:
            await self._release(p)
        if len(self.held) < fair:
            for p in self._preference(members):
                if len(self.held) >= fair:
                    break
                if p in self.held:
                    continue
                try:
                    self.held[p] = await self.kv.create(self._key(p), self.pod.encode())
                except KeyValueError:
                    continue  # someone holds it
                await self.on_gain(p)
        self._renewed_at = started
        if set(self.held) != before:
            log.info("%s leases: %s holds partitions %s", self.role, self.pod, sorted(self.held))
            self._changed.set()

    def _preference(self, members: list[str]) -> list[int]:
        """Partitions in this pod's order of preference: its own stripe first
        (p = index mod members), so pods that start together rarely race for a key."""
        index = members.index(self.pod) if self.pod in members else 0
        n = max(len(members), 1)
        mine = [p for p in range(self.partitions) if p % n == index]
        return mine + [p for p in range(self.partitions) if p % n != index]

    async def _members(self) -> list[str]:
        return await members(self.nc, self.kv, self.role)

    async def _let_go(self, p: int) -> int | None:
        """No longer consume partition `p` (its lease left as it is): the revision held."""
        rev = self.held.pop(p, None)
        await self.on_lose(p)
        return rev

    async def _release(self, p: int) -> None:
        rev = await self._let_go(p)
        if rev is not None:
            try:
                await self.kv.delete(self._key(p), last=rev)
            except (KeyNotFoundError, KeyValueError, NotFoundError, BadRequestError):
                # our revision is stale (a renewal cancelled by stop() had reached the
                # server): delete it only if it still names us, else it is not ours
                try:
                    entry = await self.kv.get(self._key(p))
                    if entry.value == self.pod.encode():
                        await self.kv.delete(self._key(p), last=entry.revision)
                except (KeyNotFoundError, KeyValueError, NotFoundError, BadRequestError):
                    pass
        self._changed.set()
