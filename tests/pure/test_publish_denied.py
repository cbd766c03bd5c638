"""A publish the server refuses by permission (its -ERR, handed to the connection's error
callback) names its subject: what `Publisher.denied` fails at once (the system test:
tests/system/test_permissions.py, prepare-rollback as the cli user)."""

from __future__ import annotations

import nats.errors
import pytest

from actors.natsio.publishing import denied_subject

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(
    ("error", "subject"),
    [
        # as nats-py words it (lower case since 2.x) and as the server does
        ('nats: permissions violation for publish to "exec.2.abc.in.start"', "exec.2.abc.in.start"),
        ('nats: Permissions Violation for Publish to "answer.start.3"', "answer.start.3"),
        # not a publish refused: a subscription, a reply subject, anything else
        ('nats: permissions violation for subscription to "_INBOX.>"', None),
        ('nats: permissions violation for publish with reply of "_INBOX.x"', None),
        ("nats: stale connection", None),
    ],
)
def test_a_refused_publish_names_its_subject(error: str, subject: str | None) -> None:
    assert denied_subject(nats.errors.Error(error)) == subject
