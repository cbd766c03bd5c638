"""The playbook catalog: every registered version of every playbook, in KV `catalog`.

Keys: `<path>.v<version>` (the entry) and `<path>.latest` (the newest version number).
Registering the same source again returns the existing version; a new source without
`metadata.version` gets latest+1; a `metadata.version` that exists with other content
is refused, because running executions replay the version they started with.

A catalog path is its own key, unchanged (`PATH_RULE`): one path, one key, and a path
that would need rewriting to be a key (a `.`, a space, a `/` at either end) is refused
(`CatalogPathInvalid`) by `register`, `resolve` and so by the starter. Before paths
were checked such characters became `_`, so `ops/nightly.backup` and
`ops/nightly_backup` shared a key; an entry whose stored path is not the one asked for
is such a collision, refused too. A record that cannot be read (a `latest` that is not
a version number, an entry that is not one) is `CatalogRecordInvalid`, naming its key.
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from pathlib import PurePath

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from actors.errors import UserError
from actors.playbook.loader import load_playbook
from actors.playbook.model import Playbook
from actors.store.records import RecordInvalid
from actors.wire.messages import CatalogEntry, encode
from streams.layout import CATALOG_BUCKET
from streams.subjects import CATALOG_PATH

_entry = msgspec.json.Decoder(CatalogEntry)
PATH_RULE = (
    "a catalog path is letters, digits, '_', '-' and '=' in segments separated by single '/' "
    "(no '.', no spaces, no '/' at either end)"
)
_VERSION = re.compile(r"[1-9][0-9]{0,17}")


class CatalogError(UserError):
    """A playbook that cannot be registered or resolved; one line. `error_type`: the
    error a start of it fails with (`StartRecord.error`, a start request's reply)."""

    error_type = "PlaybookNotFound"


class PlaybookNotRegistered(CatalogError):
    """No such path, or no such version of it."""


class CatalogPathInvalid(CatalogError):
    """A path that breaks `PATH_RULE`, or one whose key holds another path's entries."""

    error_type = "PlaybookPathInvalid"


class CatalogRecordInvalid(CatalogError, RecordInvalid):
    """A catalog record that cannot be read; the message names its key."""

    error_type = "CatalogRecordInvalid"


def check_path(path: str) -> str:
    """`path`, when it is a catalog path (`PATH_RULE`); CatalogPathInvalid otherwise."""
    if not CATALOG_PATH.fullmatch(path):
        raise CatalogPathInvalid(f"catalog path {path!r} is not allowed: {PATH_RULE}")
    return path


def _key(path: str, suffix: str) -> str:
    # the path is the key as it is: no two paths share one (a path has no `.`, so the
    # suffix after the last `.` cannot be mistaken for part of it)
    return f"{check_path(path)}.{suffix}"


class VersionConflict(CatalogError):
    """A `metadata.version` already registered with other content."""

    error_type = "VersionConflict"


async def register(js: JetStreamContext, source: str, *, max_attempts: int, file: str = "<string>") -> CatalogEntry:
    # raises PlaybookInvalid with every error; `max_attempts`: the caller's ceiling on
    # retries (`Settings.limits`), the one the pod's starter will bound them by
    return await register_loaded(js, load_playbook(source, file=file, max_attempts=max_attempts), source, file=file)


async def register_loaded(js: JetStreamContext, pb: Playbook, source: str, *, file: str) -> CatalogEntry:
    """Register `source`, already loaded as `pb` (a pod loads a playbook a request brings
    in a render process, never on its event loop: actors/gateway/answers.py)."""
    path = pb.metadata.catalog_path
    try:
        check_path(path)
    except CatalogPathInvalid as e:
        raise CatalogPathInvalid(f"{file}: {e} (metadata.path, or metadata.name when no path is given)") from None
    kv = await js.key_value(CATALOG_BUCKET)
    for _ in range(20):  # optimistic concurrency on `latest`
        latest, latest_rev = await _latest(kv, path)
        # read even when a version is given: the key may hold another path's entries
        current = await _current(kv, path, latest)
        if pb.metadata.version is not None:
            version = pb.metadata.version
        elif current is not None and current.source == source:
            return current
        else:
            version = latest + 1
        entry = CatalogEntry(
            path=path, version=version, source=source, registered_at=time.time(), file=_file_name(file)
        )
        try:
            await kv.create(_key(path, f"v{version}"), encode(entry))
        except KeyWrongLastSequenceError:
            existing = await _get(kv, path, version)
            if existing.source != source:
                raise VersionConflict(
                    f"{file}: playbook {path} version {version} is already registered with other content; "
                    "bump metadata.version or omit it"
                ) from None
            entry = existing
        if version > latest:
            try:
                if latest_rev is None:
                    await kv.create(_key(path, "latest"), str(version).encode())
                else:
                    await kv.update(_key(path, "latest"), str(version).encode(), last=latest_rev)
            except Exception:
                continue
        return entry
    raise CatalogError(f"{file}: could not register {path}: too much contention on its latest version")


def _file_name(file: str) -> str | None:
    """The name a traceback gives the playbook: the file's own name, without the
    directories of the machine it was registered from; None for a source that came
    without one (`<string>`, `<request>`)."""
    if not file or file.startswith("<"):
        return None
    return PurePath(file).name or None


async def _latest(kv: KeyValue, path: str) -> tuple[int, int | None]:
    """The newest version of `path` and the revision of its `latest` key; (0, None)
    when it has none. CatalogRecordInvalid when the key holds no version number."""
    key = _key(path, "latest")
    try:
        got = await kv.get(key)
    except KeyNotFoundError:
        return 0, None
    text = (got.value or b"").decode("utf-8", "replace").strip()
    if not _VERSION.fullmatch(text):
        raise CatalogRecordInvalid(
            f"KV {CATALOG_BUCKET!r} key {key!r}: not a version number ({text[:40]!r}); "
            "it must hold the newest registered version of the path: fix or delete it"
        )
    return int(text), got.revision


def decode_entry(data: bytes, *, key: str) -> CatalogEntry:
    """The catalog entry stored under `key`; CatalogRecordInvalid when it is not one."""
    try:
        return _entry.decode(data)
    except msgspec.DecodeError as e:
        why = " ".join(str(e).split())[:200]
        raise CatalogRecordInvalid(f"KV {CATALOG_BUCKET!r} key {key!r}: not a catalog entry ({why})") from None


async def _current(kv: KeyValue, path: str, latest: int) -> CatalogEntry | None:
    """The entry `latest` names; None when there is none (no version yet, or removed)."""
    if not latest:
        return None
    try:
        return await _get(kv, path, latest)
    except KeyNotFoundError:
        return None


async def _get(kv: KeyValue, path: str, version: int) -> CatalogEntry:
    """The entry of `path` at `version`. KeyNotFoundError when absent; CatalogRecordInvalid
    when it is not an entry; CatalogPathInvalid when it is another path's."""
    key = _key(path, f"v{version}")
    entry = decode_entry((await kv.get(key)).value or b"", key=key)
    if entry.path != path:
        # registered before paths were checked, when both became this key
        raise CatalogPathInvalid(
            f"catalog path {path!r} collides with {entry.path!r}, registered before under the same key {key!r}: "
            f"{PATH_RULE}; register the playbook under a path of its own"
        )
    if entry.version != version:
        raise CatalogRecordInvalid(f"KV {CATALOG_BUCKET!r} key {key!r}: holds version {entry.version}, not {version}")
    return entry


class CatalogReader:
    """Resolves playbooks again and again (the starter, once per start). A registered
    version never changes (see `register`), so each (path, version) is read from KV
    once and kept, up to `cache` of them; `latest` is read every time, since a newer
    version may have been registered meanwhile."""

    def __init__(self, js: JetStreamContext, *, cache: int = 256) -> None:
        self.js = js
        self._kv: KeyValue | None = None
        self._entries: OrderedDict[tuple[str, int], CatalogEntry] = OrderedDict()
        self._cache = cache

    async def resolve(self, path: str, version: int | None = None) -> CatalogEntry:
        """The entry for `path` at `version` (latest when None): PlaybookNotRegistered if
        absent, CatalogPathInvalid for a path that is not one (or whose key holds another
        path's entries), CatalogRecordInvalid for a record that cannot be read."""
        check_path(path)
        if self._kv is None:
            self._kv = await self.js.key_value(CATALOG_BUCKET)
        try:
            if version is None:
                latest = (await _latest(self._kv, path))[0]
                if not latest:
                    raise PlaybookNotRegistered(f"playbook {path!r} is not registered")
                version = latest
            entry = self._entries.get((path, version))
            if entry is None:
                entry = self._entries[(path, version)] = await _get(self._kv, path, version)
                if len(self._entries) > self._cache:
                    self._entries.popitem(last=False)
            return entry
        except KeyNotFoundError:
            at = f" version {version}" if version is not None else ""
            raise PlaybookNotRegistered(f"playbook {path!r}{at} is not registered") from None
