"""Webhooks (actors/wire/hooks.py): add, list, rotate and delete them, and what the UI
server's `POST /hooks/<name>` does once a request's token is checked: start the hook's
playbook with the body as payload, or send its signal with the body as data.

A hook is one entry of KV `hooks` (key: its name). Its token is made here, returned
once by `hook_add` and `hook_rotate`, and stored only as its SHA-256: `hook_authorized`
compares a request's token with it in constant time, and takes the same steps for a
hook that does not exist, so an answer does not tell whether a name is a hook.

A request's `Idempotency-Key` names what it does: a start hook's execution id, a signal
hook's signal id are derived from the hook and the key (`hook_execution_id`; for a
signal also its execution and its `?key=`: `hook_signal_id`), so the same request sent
again starts nothing and signals nothing twice. Without one, every request starts its
own execution (sends its own signal).

A signal hook is bound to one playbook: an execution of another is refused as an
unknown one is (ExecutionNotFound), and its signals carry `by = hook:<name>`, which is
who an approval names (actors/playbook/waits.py `rejection`), whatever the body says.

An unknown hook's request reads a fixed KV key that is no hook's (`NOBODY_KEY`) and
decodes and compares as a known one's, so its timing says little of whether a hook
exists: the residue (a few microseconds of a key found or not) is under the network's
noise, not nil (docs/security.md)."""

from __future__ import annotations

import time
from typing import Any

import msgspec
from nats.js.errors import KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from actors.client.checks import check_execution_id
from actors.client.outcome import ExecutionNotFound
from actors.client.session import within_timeout
from actors.client.signals import ExecutionNotKnownYet, Signals
from actors.client.writing import StartOutcome
from actors.errors import UserError
from actors.natsio import kv_keys
from actors.natsio.kvonce import create_once, delete_once, update_once
from actors.playbook.model import SIGNAL_NAME
from actors.store.catalog import check_path
from actors.wire.hooks import (
    HOOK_NAME,
    IDEMPOTENCY_KEY_MAX,
    NOBODY_KEY,
    NOBODY_SPEC,
    HookSignal,
    HookSpec,
    HookStart,
    hook_execution_id,
    hook_signal_id,
    new_hook_id,
    new_token,
    token_digest,
    token_matches,
)
from actors.wire.messages import SignalReply
from streams.layout import HOOKS_BUCKET

__all__ = ["HookError", "Hooks", "check_hook_name", "check_idempotency_key"]

_spec_decoder = msgspec.json.Decoder(HookSpec)
_NOBODY_BYTES = msgspec.json.encode(NOBODY_SPEC)


class HookError(UserError, ValueError):
    """A hook request that cannot be done as asked (bad name, no such hook, one already
    there, neither or both of a playbook and a signal, a bad Idempotency-Key): one line."""


def check_hook_name(name: str) -> str:
    if not isinstance(name, str) or not HOOK_NAME.fullmatch(name):
        raise HookError(f"invalid hook name {str(name)[:80]!r}: must match {HOOK_NAME.pattern}")
    return name


def check_idempotency_key(key: str) -> str:
    """A caller's `Idempotency-Key`: printable, at most IDEMPOTENCY_KEY_MAX characters
    (it is hashed into an id, never used as one)."""
    if not key or len(key) > IDEMPOTENCY_KEY_MAX or not key.isprintable():
        raise HookError(f"Idempotency-Key must be printable text of 1 to {IDEMPOTENCY_KEY_MAX} characters")
    return key


class Hooks(Signals):
    """`hook_add`, `hooks`, `hook_rotate`, `hook_delete`; `hook_authorized`,
    `hook_start`, `hook_signal` (the UI server's endpoint)."""

    @within_timeout
    async def hook_add(
        self, name: str, *, playbook: str | None = None, version: int | None = None, signal: str | None = None
    ) -> tuple[HookSpec, str]:
        """Create hook `name`: it starts `playbook` (at `version`; None: the latest at
        each call), or, with `signal`, sends that signal to executions of `playbook`
        (only those). Returns its spec and its token: the only time the token is seen
        (only its digest is kept). HookError for a bad name, no playbook, a bad signal
        name, a version with a signal, a hook of that name already there; CatalogError
        for a playbook (or version) the catalog does not hold."""
        check_hook_name(name)
        if playbook is None:
            raise HookError(
                "a hook starts a playbook (--playbook P) or sends a signal to its executions "
                "(--signal S --playbook P): give --playbook"
            )
        check_path(playbook)
        start = sig = None
        if signal is None:
            await self._catalog_entry(playbook, version)  # CatalogError names what is missing
            start = HookStart(playbook=playbook, version=version)
        else:
            if version is not None:
                raise HookError("--version goes with a start hook, not with --signal")
            if not isinstance(signal, str) or not SIGNAL_NAME.fullmatch(signal):
                raise HookError(
                    f"invalid signal name {str(signal)[:80]!r}: letters, digits, `_` and `-`, at most 64 characters"
                )
            await self._catalog_entry(playbook, None)
            sig = HookSignal(name=signal, playbook=playbook)
        token = new_token()
        spec = HookSpec(
            name=name,
            hook_id=new_hook_id(),
            token_digest=token_digest(token),
            created_at=time.time(),
            start=start,
            signal=sig,
        )
        kv = await self._hooks_kv()
        value = msgspec.json.encode(spec)  # its hook id and token digest make it this call's own
        if await self._ride(f"adding hook {name}", lambda: create_once(kv, name, value)) is None:
            raise HookError(f"hook {name} already exists (delete it first, or rotate its token)")
        return spec, token

    async def hooks(self) -> list[HookSpec]:
        """Every hook, by name (an entry that cannot be read is left out:
        `unreadable_hooks` names those)."""
        kv = await self._hooks_kv()
        specs = []
        for name in await self._ride("listing hooks", lambda: kv_keys(self.js, HOOKS_BUCKET)):
            spec = await self._read_hook(kv, name)
            if spec is not None:
                specs.append(spec[0])
        return specs

    async def unreadable_hooks(self) -> dict[str, str]:
        """The hooks whose entry this version cannot read (a newer version's, one
        written by hand), each with why: no token can call them; `hook_delete` removes
        them."""
        kv = await self._hooks_kv()
        found = {}
        for name in await self._ride("listing hooks", lambda: kv_keys(self.js, HOOKS_BUCKET)):
            if not HOOK_NAME.fullmatch(name):
                continue
            try:
                entry = await self._ride(f"reading hook {name}", lambda: kv.get(name))  # noqa: B023
            except KeyNotFoundError:
                continue
            try:
                _spec_decoder.decode(entry.value or b"")
            except msgspec.DecodeError as e:
                found[name] = str(e)[:300]
        return found

    async def hook(self, name: str) -> HookSpec:
        """Hook `name`'s spec; HookError when there is none."""
        return (await self._hook_spec(name))[0]

    @within_timeout
    async def hook_rotate(self, name: str) -> tuple[HookSpec, str]:
        """A new token for `name` (the old one stops working at once); returns the spec
        and the token, seen this once. Idempotency keys keep naming what they named."""
        spec, revision = await self._hook_spec(name)
        token = new_token()
        spec = msgspec.structs.replace(spec, token_digest=token_digest(token), rotated_at=time.time())
        kv, value = await self._hooks_kv(), msgspec.json.encode(spec)
        if await self._ride(f"rotating hook {name}", lambda: update_once(kv, name, value, last=revision)) is None:
            raise HookError(f"hook {name} changed meanwhile (rotated or deleted elsewhere): try again")
        return spec, token

    @within_timeout
    async def hook_delete(self, name: str) -> None:
        """Remove hook `name`: its token is refused from now on (executions it started
        stay). An entry this version cannot read is removed too."""
        check_hook_name(name)
        kv = await self._hooks_kv()
        try:
            entry = await self._ride(f"reading hook {name}", lambda: kv.get(name))
        except KeyNotFoundError:
            raise HookError(f"no hook {name}") from None
        revision = entry.revision or 0
        if not await self._ride(f"removing hook {name}", lambda: delete_once(kv, name, last=revision)):
            raise HookError(f"hook {name} changed meanwhile (rotated elsewhere): try again")

    async def hook_authorized(self, name: str, token: str) -> HookSpec | None:
        """Hook `name`'s spec when `token` is its token; None otherwise: a wrong or
        empty token, a name that is no hook (or not a hook name), after the same
        constant-time comparison, so the answer says nothing of which."""
        kv = await self._hooks_kv()
        known = isinstance(name, str) and HOOK_NAME.fullmatch(name) is not None
        # an unknown or invalid name does a known one's work: a read (of a key that is no
        # hook's), a decode, a compare
        found = await self._read_hook(kv, name if known else NOBODY_KEY)
        if found is None:
            _spec_decoder.decode(_NOBODY_BYTES)
        spec = found[0] if found is not None and known else None
        return spec if token_matches(token, spec) else None

    async def hook_start(
        self, spec: HookSpec, payload: dict[str, Any], *, idempotency_key: str | None = None
    ) -> StartOutcome:
        """Start `spec`'s playbook with `payload` (a start hook's request): under the id
        `idempotency_key` derives when given (`existing`: started before, nothing sent
        now), else a new one. TooLarge / TooDeep for the payload; CatalogError when the
        catalog no longer resolves the playbook."""
        if spec.start is None:
            raise HookError(f"hook {spec.name} sends a signal: POST /hooks/{spec.name}/<execution id>")
        eid = None if idempotency_key is None else hook_execution_id(spec, check_idempotency_key(idempotency_key))
        return await self.start_execution(
            spec.start.playbook, payload=payload, version=spec.start.version, execution_id=eid
        )

    async def hook_signal(
        self, spec: HookSpec, execution_id: str, data: Any, *, key: str = "", idempotency_key: str | None = None
    ) -> SignalReply:
        """Send `spec`'s signal to `execution_id` with `data` (a signal hook's request),
        by `hook:<name>`, under the id `idempotency_key` derives when given. What
        `Client.signal` raises and answers (not accepted: the execution has ended);
        ExecutionNotFound, as for no such execution, for one of another playbook than
        the hook's; ExecutionNotKnownYet while its start is queued (its playbook unread)."""
        if spec.signal is None:
            raise HookError(f"hook {spec.name} starts executions: POST /hooks/{spec.name}")
        await self._hook_playbook_check(spec.signal.playbook, check_execution_id(execution_id))
        sid = None
        if idempotency_key is not None:
            sid = hook_signal_id(spec, execution_id, check_idempotency_key(idempotency_key), key)
        return await self.signal(execution_id, spec.signal.name, data, key=key, signal_id=sid, by=f"hook:{spec.name}")

    async def _hook_playbook_check(self, playbook: str, execution_id: str) -> None:
        """ExecutionNotFound unless `execution_id` runs `playbook` (the same answer as
        for no such execution: a hook's caller learns nothing of other playbooks')."""
        status = await self._ride(
            f"reading the status of execution {execution_id}", lambda: self._live_status(execution_id)
        )
        runs = status.playbook if status is not None else None
        if runs is None:
            record = await self._ride(f"reading execution {execution_id}", lambda: self._start_record(execution_id))
            runs = record.playbook_path if record is not None else None
        if runs is None:
            if status is None and await self.start_queued(execution_id) is not False:
                raise ExecutionNotKnownYet(f"execution {execution_id!r} has not started yet: ask again")
            runs = ""
        if runs != playbook:
            raise ExecutionNotFound(f"no execution {execution_id!r}: nothing to signal")

    async def _hooks_kv(self) -> KeyValue:
        try:
            return await self._ride(f"reading bucket {HOOKS_BUCKET}", lambda: self.bucket(HOOKS_BUCKET))
        except NotFoundError:
            raise HookError(
                f"KV bucket {HOOKS_BUCKET!r} is missing: engine pods of this version create it at their start"
            ) from None

    async def _read_hook(self, kv: KeyValue, name: str) -> tuple[HookSpec, int] | None:
        try:
            entry = await self._ride(f"reading hook {name}", lambda: kv.get(name))
        except KeyNotFoundError:
            return None
        try:
            return _spec_decoder.decode(entry.value or b""), entry.revision or 0
        except msgspec.DecodeError:
            return None  # not a spec this version wrote: no token can match it

    async def _hook_spec(self, name: str) -> tuple[HookSpec, int]:
        check_hook_name(name)
        found = await self._read_hook(await self._hooks_kv(), name)
        if found is None:
            raise HookError(f"no hook {name}")
        return found
