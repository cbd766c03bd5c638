"""Webhooks: an HTTP endpoint of the UI server (`POST /hooks/<name>`) that starts an
execution of a playbook, or sends a signal to one, for whoever holds the hook's token.

A hook is one entry of KV `hooks` (key: its name), a `HookSpec`: what it does (`start`
or `signal`, exactly one) and the SHA-256 of its token, never the token itself. The token
is made by `actors-cli hook add` / `hook rotate` (`new_token`), shown once, and checked
in constant time against the stored digest (`token_digest`, `token_matches`). A plain
digest is enough where a password would need a slow one: the token is 256 random bits,
so nobody can guess it from its digest, however fast the guesses.

`hook_id` is random per `hook add`: the execution and signal ids a hook derives from a
caller's `Idempotency-Key` (`hook_execution_id`, `hook_signal_id`) include it, so a hook
deleted and added again under the same name does not answer a new request with an
execution its predecessor started. A rotation keeps it: the same key still names the
same execution.

Pure: no NATS, no I/O.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

from msgspec import Struct

HOOK_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # a URL path segment and a KV key
TOKEN_PREFIX = "ahk_"  # says what a leaked string is (secret scanners, logs)
DIGEST_PREFIX = "sha256:"
IDEMPOTENCY_KEY_MAX = 256  # characters of an `Idempotency-Key` header


class HookStart(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Start `playbook` (a catalog path) at `version` (None: the latest at each call),
    with the request's body as the payload."""

    playbook: str
    version: int | None = None


class HookSignal(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Send signal `name` to the execution the request's path names, with the request's
    body as its data: only to an execution of `playbook` (a catalog path), so a hook's
    token reaches one playbook's waits, not every execution's."""

    name: str
    playbook: str


class HookSpec(Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """A webhook as KV `hooks` holds it (key = `name`). No user value in it: the
    payload comes with each request, so nothing here is sealed with the payload key."""

    name: str
    hook_id: str  # random per `hook add`: see the module's docstring
    token_digest: str  # "sha256:<hex>" of the token (`token_digest`)
    created_at: float
    start: HookStart | None = None
    signal: HookSignal | None = None
    rotated_at: float | None = None

    @property
    def action(self) -> str:
        """What it does, in a few words: `start lib/etl@3`, `signal approval`."""
        if self.start is not None:
            version = "" if self.start.version is None else f"@{self.start.version}"
            return f"start {self.start.playbook}{version}"
        if self.signal is not None:
            return f"signal {self.signal.name} to {self.signal.playbook}"
        return "nothing"


def new_token() -> str:
    """A fresh token: 256 random bits, URL-safe, with a prefix that says what it is."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def new_hook_id() -> str:
    return secrets.token_hex(8)


def token_digest(token: str) -> str:
    return DIGEST_PREFIX + hashlib.sha256(token.encode("utf-8", errors="surrogatepass")).hexdigest()


# what an unknown hook's token is compared with, so that a request for a hook that does
# not exist takes the same steps as one with a wrong token
_NOBODY = token_digest(secrets.token_urlsafe(32))
# the KV key an unknown or invalid hook name reads instead (`.`: no hook's name), so its
# request does the same work as a known one's: a KV read, a decode, a compare
NOBODY_KEY = "nobody.hook"
NOBODY_SPEC = HookSpec(
    name="nobody", hook_id="0" * 16, token_digest=_NOBODY, created_at=0.0, start=HookStart(playbook="nobody")
)


def token_matches(token: str, spec: HookSpec | None) -> bool:
    """Whether `token` is `spec`'s, compared in constant time (hmac.compare_digest) on
    the digests; False for no spec, after the same comparison."""
    given = token_digest(token)
    stored = spec.token_digest if spec is not None else _NOBODY
    same = hmac.compare_digest(given.encode(), stored.encode())
    return same and spec is not None and bool(token)


def _digest(*parts: str) -> str:
    # NUL between the parts: no two different tuples make the same text
    return hashlib.sha256("\0".join(parts).encode("utf-8", errors="surrogatepass")).hexdigest()[:32]


def hook_execution_id(spec: HookSpec, idempotency_key: str) -> str:
    """The execution a start hook's request with `idempotency_key` starts: the same key
    again names the same execution, so it starts nothing twice. At most 5 + 64 + 1 + 32
    characters: an execution id (^[A-Za-z0-9_-]{1,128}$)."""
    return f"hook-{spec.name}-{_digest(spec.hook_id, idempotency_key)}"


def hook_signal_id(spec: HookSpec, execution_id: str, idempotency_key: str, key: str = "") -> str:
    """The signal a signal hook's request with `idempotency_key` sends to
    `execution_id` for the wait of `key` (`?key=`): the same request again is the same
    signal (one signal); the same Idempotency-Key for another key is another signal
    (a caller reusing one header across keys loses none of them). No key: the id it had
    before keys counted, so a request retried across an upgrade is still one signal."""
    parts = (spec.hook_id, execution_id, idempotency_key) + ((key,) if key else ())
    return f"hook-{_digest(*parts)}"
