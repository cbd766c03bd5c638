"""What the server refused a connection's user: its permissions violations, told to the
connection's error callback (deploy/nats/permissions.conf; docs/security.md "Least
privilege").

The server answers a publish or a subscription its user may not make with an `-ERR`
(`Permissions Violation for Publish to "<subject>"`), not on the request's reply
subject: the request itself simply gets no answer. Without this record a client asking
what its user may not ask (a read of a stream it has no right to, replies on an inbox
prefix it may not subscribe to) waits out its whole timeout and then blames NATS for
not answering. With it:

* a JetStream publish to the subject a violation names fails at once
  (`Publisher.denied`);
* a call of a client (`Session._ride`, the streams' look-up) whose tries time out and
  are refused the same thing twice in a row fails then with `Denied`, naming it,
  instead of asking again until its budget is spent. Twice, because a violation is told
  to the connection, not to the call: one told while a try timed out may be another
  call's (a long-lived client such as the web UI shares its connection), and that try
  may have timed out for another reason (an election). Once is enough when the
  connection was refused the subscription to its own inbox prefix: no reply reaches it;
* `actors-cli` words a bare timeout by a violation told in the last CLI_RECENT seconds,
  as the likely reason (`recent`).

Subjects keep the case the server said them in (nats-py lower-cases its error text; the
fast reader keeps the original: actors/natsio/private.py `server_error_text`).
Fed only by clients' connections (actors/natsio/dial.py `connect_within`): a pod keeps
retrying as for any lost reply and logs the violation."""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from nats.aio.client import Client as NATS

from actors.errors import Unavailable
from actors.natsio.private import connection_denials, inbox_prefix, server_error_text

# the server: `Permissions Violation for Publish to "<subject>"`, `... for Subscription
# to "<subject>"` (nats-py hands it on lower-cased, after "nats: ")
_VIOLATION = re.compile(r'Permissions Violation for (Publish|Subscription) to "([^"]+)"', re.IGNORECASE)
CLI_RECENT = 30.0  # seconds a violation is taken as the likely reason of a bare timeout
T = TypeVar("T")


class Denied(Unavailable):
    """The server refused this NATS user something a call needed (a permissions
    violation): asking again changes nothing; another user may (the message says what
    to check)."""


@dataclass(frozen=True, slots=True)
class Denial:
    """One violation the server told: a `publish` or a `subscription`, on `subject`."""

    kind: str
    subject: str

    def explain(self) -> str:
        """What was refused, and what to check, in one clause."""
        if self.kind == "subscription" and self.subject.lower().startswith("_inbox"):
            return (
                f"NATS refused this user the subscription to {self.subject}, where its replies come: "
                "set NATS_INBOX_PREFIX to this user's inbox prefix (docs/security.md, Least privilege)"
            )
        return (
            f"NATS refused this user the {self.kind} to {self.subject} (permissions violation): "
            "run it as a user that may (docs/security.md, Least privilege)"
        )


def denial_of(error: BaseException, said: str = "") -> Denial | None:
    """The violation `error` (as the connection's error callback gets it) tells, or None;
    its subject as the server `said` it when that is the same text."""
    text = said if said and said.lower() in str(error).lower() else str(error)
    found = _VIOLATION.search(text)
    return Denial(found.group(1).lower(), found.group(2)) if found else None


class Denials:
    """The violations told on one connection: how many, and the last one, when."""

    def __init__(self) -> None:
        self.told = 0
        self.last: Denial | None = None
        self.last_at = 0.0  # time.monotonic() it was told
        # the last subscription refused: the connection's own replies, if it is to its
        # inbox prefix (made once per connection: every request after it goes unanswered)
        self.subscription: Denial | None = None

    def note(self, error: BaseException, said: str = "") -> Denial | None:
        """Record the violation `error` tells, if it tells one (`said`: the server's own words)."""
        global _recent, _recent_at
        denial = denial_of(error, said)
        if denial is not None:
            self.told += 1
            self.last, self.last_at = denial, time.monotonic()
            _recent, _recent_at = denial, self.last_at
            if denial.kind == "subscription":
                self.subscription = denial
        return denial

    def since(self, told: int) -> Denial | None:
        """The last violation, if any was told after the first `told` ones."""
        return self.last if self.told > told else None


_recent: Denial | None = None  # the last violation any connection of this process was told
_recent_at = 0.0


def denials(nc: NATS) -> Denials:
    """`nc`'s record of violations (empty unless its error callback feeds it)."""
    return connection_denials(nc, Denials)


def note_violation(nc: NATS, error: BaseException) -> Denial | None:
    """Record on `nc` the violation its error callback was told, if `error` is one."""
    return denials(nc).note(error, server_error_text(nc))


class DenialWatch:
    """One call's tries (`ride_out`), each run by `attempt`: a try that times out while
    the connection is told the same violation as the try before it raises Denied,
    saying that `what` failed and what was refused."""

    def __init__(self, nc: NATS, what: str) -> None:
        self.nc = nc
        self.told = denials(nc)
        self.what = what
        self.before: Denial | None = None  # the violation told during the last try that timed out

    async def attempt(self, call: Callable[[], Awaitable[T]]) -> T:
        start = self.told.told
        try:
            return await call()
        except TimeoutError:
            replies = self.told.subscription
            if replies is not None and replies.subject.startswith(inbox_prefix(self.nc) + "."):
                # no reply reaches this connection: no try will be answered
                raise Denied(f"{self.what} failed: {replies.explain()}") from None
            denial = self.told.since(start)
            if denial is not None and denial == self.before:
                raise Denied(f"{self.what} failed: {denial.explain()}") from None
            self.before = denial
            raise


def recent() -> Denial | None:
    """The last violation told in this process (actors-cli: its one connection's), if
    it was told within CLI_RECENT seconds."""
    return _recent if _recent is not None and time.monotonic() - _recent_at <= CLI_RECENT else None


__all__ = [
    "CLI_RECENT",
    "Denial",
    "DenialWatch",
    "Denials",
    "Denied",
    "denial_of",
    "denials",
    "note_violation",
    "recent",
]
