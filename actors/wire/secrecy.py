"""Which fields of the wire's Structs carry users' values, marked on the fields themselves.

A field annotated `Annotated[T, SECRET]` holds a value (a payload, args, a result, a
collected list, what a step printed, an error's type, message or traceback): with a
payload key set, the codec (actors/wire/codec.py) encrypts it whole wherever the Struct is
written to NATS. A field annotated `Annotated[ErrorView, SECRET_ERROR]` is an error as a
mapping (`type`, `message`, `step`, ...): only its `type`, `message` and `traceback` are
encrypted, so a status still says which step failed. An error's type is a value too: a
python step's is the name of whatever class its code raised, which may be built from
anything, a credential included. Everything else (ids, step names, states, times,
counts, event types) stays in clear.

The markers are plain `msgspec.Meta` (no constraint, no change to the JSON), so this
module imports nothing but msgspec: the tool actor's worker processes import the wire
types without the crypto library. `tests/pure/test_codec.py` checks that every field able
to hold arbitrary data is either marked or listed there as clear on purpose.
"""

from __future__ import annotations

import msgspec

SEAL = "seal"  # the key of a marker in `Meta.extra`
VALUE = "value"  # encrypted whole
ERROR = "error"  # a mapping whose `type`, `message` and `traceback` are encrypted

SECRET = msgspec.Meta(extra={SEAL: VALUE})
SECRET_ERROR = msgspec.Meta(extra={SEAL: ERROR})

# a value written before the type was sealed reads back as it is (the codec opens a
# clear value as itself): old logs still replay
ERROR_SECRET_KEYS = ("type", "message", "traceback")
