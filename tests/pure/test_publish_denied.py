"""A permissions violation the server tells a connection (its -ERR, handed to the error
callback) names what was refused: what `Publisher.denied` fails at once, and what a
client's timed-out call and actors-cli's message name (actors/natsio/denials.py; the
system tests: tests/system/test_permissions.py)."""

from __future__ import annotations

import nats.errors
import pytest

from actors.natsio.denials import Denial, Denials, denial_of

pytestmark = pytest.mark.timeout(10)


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


def test_a_call_learns_of_the_violations_told_since_it_began() -> None:
    told = Denials()
    assert told.note(nats.errors.Error("nats: stale connection")) is None and told.since(0) is None
    told.note(nats.errors.Error('nats: permissions violation for publish to "$KV.status.x"'))
    began = told.told
    assert told.since(began) is None  # told before the call began: not its
    told.note(nats.errors.Error('nats: permissions violation for subscription to "_INBOX.>"'))
    assert told.since(began) == Denial("subscription", "_INBOX.>")
    assert "NATS_INBOX_PREFIX" in Denial("subscription", "_INBOX.>").explain()
    assert "NATS_INBOX_PREFIX" in Denial("subscription", "_inbox.abc.*").explain()  # as nats-py says it
    assert "publish to $KV.status.x" in Denial("publish", "$KV.status.x").explain()
