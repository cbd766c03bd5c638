"""The one root of the errors this package raises on purpose, and their families.

A family says whose the problem is, which is what a caller acts on: `UserError` (the
input is wrong: fix it, asking again changes nothing), `Unavailable` (NATS cannot be
reached or stopped answering: asking again later may work), `NotFinished` (the
execution has not ended yet). `actors-cli` turns a family into its exit code
(actors/cli/exits.py) and prints the error's one-line message instead of a traceback;
an error of no family is a bug of ours and keeps its traceback.

Each concrete error keeps the builtin base it had (`ValueError`, `OSError`), so an
`except ValueError` written against it still catches it.

Pure: no I/O and no nats, so actors/core and actors/playbook may import it. The
streams/ package imports nothing of actors/: its errors have their own root
(`streams.errors.StreamsError`), which the CLI maps beside nats-py's errors.
"""

from __future__ import annotations


class ActorsError(Exception):
    """An error this package raises on purpose; its message is one line for a user."""


class UserError(ActorsError):
    """Bad input: a playbook, payload, execution id, setting, path, or a stored record
    the request named, that cannot be used as it is (`actors-cli` exits 3)."""


class Unavailable(ActorsError):
    """NATS is unreachable, refused the connection, or stopped answering; or a publish
    went unconfirmed (`actors-cli` exits 5)."""


class NotFinished(ActorsError):
    """The execution has not ended: no result yet (`actors-cli` exits 4)."""


__all__ = ["ActorsError", "NotFinished", "Unavailable", "UserError"]
