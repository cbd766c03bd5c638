"""The pod's limits for executions it starts, from the environment.

Only the starter reads these: it fixes them in each start record (`wire.Limits`), and
the engine and counter decide by the record, never by their own process's settings.
Every variable is optional; an unparsable or non-positive value is refused at start-up
with a one-line error rather than silently replaced.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from actors.wire import Limits

ENV = {
    "template_ops": "ACTORS_TEMPLATE_OPS",
    "template_output": "ACTORS_TEMPLATE_OUTPUT",
    "max_activations": "ACTORS_MAX_STEPS",
    "max_attempts": "ACTORS_MAX_ATTEMPTS_CEILING",
}


class LimitsInvalid(ValueError):
    pass


def limits_from_env(environ: Mapping[str, str] | None = None) -> Limits:
    env = os.environ if environ is None else environ
    values: dict[str, int] = {}
    for field_name, var in ENV.items():
        raw = env.get(var, "").strip()
        if not raw:
            continue
        try:
            value = int(raw)
        except ValueError:
            raise LimitsInvalid(f"{var}={raw!r}: not a whole number") from None
        if value < 1:
            raise LimitsInvalid(f"{var}={raw!r}: must be at least 1")
        values[field_name] = value
    return Limits(**values)
