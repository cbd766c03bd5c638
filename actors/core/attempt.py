"""What follows an attempt of a step, as a value.

The rules that read an attempt's outcome (actors/core/failure.py: retry, on_error,
on_failure) record what they decide and return what, of it, takes the step further in
its work: complete and route on (`Complete`), meet the failure rules (`Fail`), send the
next attempt now (`REISSUE`), or nothing more (`None`: the step failed, was routed, or
waits on a timer). actors/core/work.py `settle` is the one place that applies it, so
failure.py never calls back into work.py: work imports failure, never the reverse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from actors.wire.messages import ErrorInfo


@dataclass(frozen=True, slots=True)
class Complete:
    """The step completed with `result` and routes on by its `next` rules. With
    `ignored_error` it completed despite that error (an on_error `ignore` decision): a
    routing error then fails the step directly, never re-entering the rules that just
    decided."""

    result: Any
    ignored_error: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Fail:
    """No retry rule takes the failure (any more): the step meets its on_error rules,
    then its on_failure edges. `exhausted`: its retry rules ran out; `summarised`: the
    error is already in the step's retry summary (a tool's error, added on arrival)."""

    error: ErrorInfo
    exhausted: bool = False
    summarised: bool = False


@dataclass(frozen=True, slots=True)
class Reissue:
    """The next attempt (already counted and recorded as scheduled) is sent now."""


REISSUE = Reissue()

# None: nothing more follows in the step's work
Outcome = Complete | Fail | Reissue | None
