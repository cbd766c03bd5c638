"""`--since T`: a moment given as an ISO 8601 time (`2026-11-23T22:00:00Z`, a time with
no zone is local) or as an age before now (`90s`, `15m`, `2h`, `7d`)."""

from __future__ import annotations

import datetime as dt
import re
import time

from actors.cli.exits import UsageError

_AGE = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, *, now: float | None = None, flag: str = "--since") -> float:
    """The Unix time `text` names; UsageError (exit 3) saying what is accepted otherwise."""
    age = _AGE.fullmatch(text.strip())
    if age is not None:
        return (time.time() if now is None else now) - float(age[1]) * _UNIT[age[2]]
    try:
        moment = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"{flag} {text!r}: expected an ISO 8601 time (2026-11-23T22:00:00Z) or an age (90s, 15m, 2h, 7d)"
        ) from None
    return moment.timestamp()  # naive: local time, as the tables print it
