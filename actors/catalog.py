"""The playbook catalog: every registered version of every playbook, in KV `catalog`.

Keys: `<path>.v<version>` (the entry) and `<path>.latest` (the newest version number).
Registering the same source again returns the existing version; a new source without
`metadata.version` gets latest+1; a `metadata.version` that exists with other content
is refused, because running executions replay the version they started with.
"""

from __future__ import annotations

import time
from collections import OrderedDict

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from actors.playbook.loader import load_playbook
from actors.settings import limits_from_env
from actors.wire import CatalogEntry, encode
from streams.layout import CATALOG_BUCKET

_entry = msgspec.json.Decoder(CatalogEntry)


class CatalogError(Exception):
    pass


def _key(path: str, suffix: str) -> str:
    # KV keys allow [-/_=.a-zA-Z0-9]; a path is already [a-z0-9_/-] by convention
    safe = "".join(c if c.isalnum() or c in "-/_=" else "_" for c in path.strip("/"))
    return f"{safe}.{suffix}"


async def register(js: JetStreamContext, source: str, *, file: str = "<string>") -> CatalogEntry:
    # raises PlaybookInvalid with every error; retries bounded as the pod's starter will bound them
    pb = load_playbook(source, file=file, max_attempts=limits_from_env().max_attempts)
    path = pb.metadata.catalog_path
    kv = await js.key_value(CATALOG_BUCKET)
    for _ in range(20):  # optimistic concurrency on `latest`
        try:
            latest_entry = await kv.get(_key(path, "latest"))
            latest, latest_rev = int(latest_entry.value or b"0"), latest_entry.revision
        except KeyNotFoundError:
            latest, latest_rev = 0, None
        if pb.metadata.version is not None:
            version = pb.metadata.version
        elif latest and (current := await _get(kv, path, latest)).source == source:
            return current
        else:
            version = latest + 1
        entry = CatalogEntry(path=path, version=version, source=source, registered_at=time.time())
        try:
            await kv.create(_key(path, f"v{version}"), encode(entry))
        except KeyWrongLastSequenceError:
            existing = await _get(kv, path, version)
            if existing.source != source:
                raise CatalogError(
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


async def _get(kv: KeyValue, path: str, version: int) -> CatalogEntry:
    e = await kv.get(_key(path, f"v{version}"))
    return _entry.decode(e.value or b"")


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
        """The entry for `path` at `version` (latest when None); CatalogError if absent."""
        if self._kv is None:
            self._kv = await self.js.key_value(CATALOG_BUCKET)
        try:
            if version is None:
                version = int((await self._kv.get(_key(path, "latest"))).value or b"0")
            entry = self._entries.get((path, version))
            if entry is None:
                entry = self._entries[(path, version)] = await _get(self._kv, path, version)
                if len(self._entries) > self._cache:
                    self._entries.popitem(last=False)
            return entry
        except KeyNotFoundError:
            at = f" version {version}" if version is not None else ""
            raise CatalogError(f"playbook {path!r}{at} is not registered") from None
