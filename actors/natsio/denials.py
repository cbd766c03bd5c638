"""What the server refused a connection's user: its permissions violations, told to the
connection's error callback (deploy/nats/permissions.conf; docs/security.md "Least
privilege").

The server answers a publish or a subscription its user may not make with an `-ERR`
(`Permissions Violation for Publish to "<subject>"`), not on the request's reply
subject: the request itself simply gets no answer. Without this record a client asking
what its user may not ask (a read of a stream it has no right to, replies on an inbox
prefix it may not subscribe to) waits out its whole timeout and then blames NATS for
not answering. With it:

* a JetStream publish the server names fails at once (`Publisher.denied`);
* any other call of a client (`Session._ride`) whose try timed out while a violation
  was told fails then with `Denied`, saying which subject was refused and what to check,
  instead of asking again until its budget is spent;
* `actors-cli` words a bare timeout by the last violation its connection was told
  (`latest`): one process, one command.

Fed only by clients' connections (actors/natsio/dial.py `connect_within`): a pod keeps
retrying as for any lost reply and logs the violation."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from nats.aio.client import Client as NATS

from actors.errors import Unavailable
from actors.natsio.private import connection_denials

# nats-py: "nats: permissions violation for publish to "<subject>"" (the server's words,
# subject included, lower-cased by nats-py 2.x); subscriptions: "... for subscription to "<subject>""
_VIOLATION = re.compile(r'Permissions Violation for (Publish|Subscription) to "([^"]+)"', re.IGNORECASE)
KEPT = 32  # violations remembered per connection: the most recent ones
T = TypeVar("T")


class Denied(Unavailable):
    """The server refused this NATS user something a call needed (a permissions
    violation): asking again changes nothing; another user may (the message says what
    to check)."""


@dataclass(frozen=True, slots=True)
class Denial:
    """One violation the server told: a `publish` or a `subscription`, on `subject` (as
    nats-py reports it: lower-cased)."""

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


def denial_of(error: BaseException) -> Denial | None:
    """The violation `error` (as the connection's error callback gets it) tells, or None."""
    found = _VIOLATION.search(str(error))
    return Denial(found.group(1).lower(), found.group(2)) if found else None


class Denials:
    """The violations told on one connection, counted, the last KEPT of them kept."""

    def __init__(self) -> None:
        self.told = 0
        self._kept: deque[Denial] = deque(maxlen=KEPT)

    def note(self, error: BaseException) -> Denial | None:
        """Record the violation `error` tells, if it tells one."""
        global _latest
        denial = denial_of(error)
        if denial is not None:
            self.told += 1
            self._kept.append(denial)
            _latest = denial
        return denial

    def since(self, told: int) -> Denial | None:
        """The most recent violation told after the first `told` ones, or None."""
        return self._kept[-1] if self.told > told and self._kept else None


_latest: Denial | None = None  # the most recent violation any connection of this process was told


def denials(nc: NATS) -> Denials:
    """`nc`'s record of violations (empty unless its error callback feeds it)."""
    return connection_denials(nc, Denials)


async def unless_denied(nc: NATS, what: str, call: Callable[[], Awaitable[T]]) -> T:
    """`await call()`; if it times out while `nc` is told of a permissions violation,
    Denied saying that `what` failed and what was refused (the likely reason nothing
    answered), in place of the TimeoutError a caller would ask again after."""
    told = denials(nc)
    before = told.told
    try:
        return await call()
    except TimeoutError:
        denial = told.since(before)
        if denial is None:
            raise
        raise Denied(f"{what} failed: {denial.explain()}") from None


def latest() -> Denial | None:
    """The most recent violation told in this process (actors-cli: its one connection's)."""
    return _latest


__all__ = ["Denial", "Denials", "Denied", "denial_of", "denials", "latest", "unless_denied"]
