"""A permissions violation the server tells a connection (its -ERR, handed to the error
callback) names what was refused: what `Publisher.denied` fails at once, what a
client's call that keeps timing out while refused the same thing fails with, and what
actors-cli's message names (actors/natsio/denials.py; the system tests:
tests/system/test_permissions.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import nats.errors
import pytest
from nats.aio.client import Client as NATS

from actors.natsio.denials import Denial, Denials, DenialWatch, Denied, denial_of, denials

pytestmark = [pytest.mark.timeout(10)]


@pytest.mark.parametrize(
    ("error", "denial"),
    [
        # as nats-py words it (lower case since 2.x) and as the server does
        ('nats: permissions violation for publish to "exec.2.abc.in.start"', Denial("publish", "exec.2.abc.in.start")),
        (
            'nats: Permissions Violation for Publish to "$JS.API.DIRECT.GET.EXEC"',
            Denial("publish", "$JS.API.DIRECT.GET.EXEC"),
        ),
        ('nats: permissions violation for subscription to "_INBOX.>"', Denial("subscription", "_INBOX.>")),
        # not one: a reply subject refused, anything else
        ('nats: permissions violation for publish with reply of "_INBOX.x"', None),
        ("nats: stale connection", None),
    ],
)
def test_a_violation_names_what_was_refused(error: str, denial: Denial | None) -> None:
    assert denial_of(nats.errors.Error(error)) == denial


def test_the_subject_keeps_the_case_the_server_said_it_in() -> None:
    lowered = nats.errors.Error('nats: permissions violation for publish to "$kv.status.x"')
    said = 'Permissions Violation for Publish to "$KV.status.x"'
    assert denial_of(lowered, said) == Denial("publish", "$KV.status.x")
    # words of another error (an earlier one): not taken
    assert denial_of(lowered, 'Permissions Violation for Publish to "$KV.other"') == Denial("publish", "$kv.status.x")
    assert "NATS_INBOX_PREFIX" in Denial("subscription", "_inbox.abc.*").explain()
    assert "publish to $KV.status.x" in Denial("publish", "$KV.status.x").explain()


def violation(subject: str) -> nats.errors.Error:
    return nats.errors.Error(f'nats: permissions violation for publish to "{subject}"')


def test_a_call_learns_only_of_the_violations_told_since_it_began() -> None:
    told = Denials()
    assert told.note(nats.errors.Error("nats: stale connection")) is None and told.since(0) is None
    told.note(violation("$KV.status.x"))
    began = told.told
    assert told.since(began) is None  # told before the call began: not its
    told.note(violation("$KV.catalog.y"))
    assert told.since(began) == Denial("publish", "$KV.catalog.y")


@pytest.mark.asyncio
async def test_a_call_is_denied_when_two_tries_in_a_row_meet_the_same_violation() -> None:
    nc = NATS()  # never connected: only its record of violations is used
    told = denials(nc)

    def times_out_after(*subjects: str) -> Callable[[], Awaitable[str]]:
        async def call() -> str:
            for subject in subjects:
                told.note(violation(subject))
            raise nats.errors.TimeoutError()

        return call

    watch = DenialWatch(nc, "reading the status of execution x")
    with pytest.raises(nats.errors.TimeoutError):  # once: it may be another call's, or an election
        await watch.attempt(times_out_after("$JS.API.STREAM.MSG.GET.KV_status"))
    with pytest.raises(Denied, match=r"reading the status of execution x failed: .*KV_status"):
        await watch.attempt(times_out_after("$JS.API.STREAM.MSG.GET.KV_status"))

    other = DenialWatch(nc, "listing")
    for subject in ("$JS.API.ONE", "$JS.API.OTHER"):  # not the same thing twice: asked again
        with pytest.raises(nats.errors.TimeoutError):
            await other.attempt(times_out_after(subject))

    async def answered() -> str:
        return "answered"

    unrelated = DenialWatch(nc, "reading")
    with pytest.raises(nats.errors.TimeoutError):
        await unrelated.attempt(times_out_after("$JS.API.SOMEONE.ELSES"))
    assert await unrelated.attempt(answered) == "answered"  # the next try is answered: no Denied


@pytest.mark.asyncio
async def test_a_connection_refused_its_own_replies_is_denied_at_the_first_timeout() -> None:
    """Its inbox subscription is made once: no later try brings a second violation, and
    none will be answered. Another user's inboxes refused (a subscription it tried) say
    nothing about its own replies."""
    nc = NATS()  # inbox prefix _INBOX
    told = denials(nc)

    async def times_out() -> str:
        raise nats.errors.TimeoutError()

    told.note(nats.errors.Error('nats: permissions violation for subscription to "_INBOX_engine.>"'))
    with pytest.raises(nats.errors.TimeoutError):
        await DenialWatch(nc, "listing").attempt(times_out)
    told.note(nats.errors.Error('nats: permissions violation for subscription to "_INBOX.abc.*"'))
    with pytest.raises(Denied, match="NATS_INBOX_PREFIX"):
        await DenialWatch(nc, "listing").attempt(times_out)
