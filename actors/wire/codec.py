"""The payload codec: users' values encrypted on their way to NATS, decrypted on the way back.

One encode/decode pair for every message (`PayloadCodec.encode`, `.decode`) and one for
the object store's bytes (`seal_bytes`, `open_bytes`). Which fields are values is said
on the Structs themselves (actors/wire/secrecy.py markers), so a field added later is
encrypted by being marked, and `tests/pure/test_codec.py` fails for one that can hold data
and is neither marked nor declared clear. The pure core never sees a ciphertext: log
actors decrypt what they read before folding and encrypt what they publish.

A connection carries its codec (`actors.natsio.binding`: `bind`, `codec_of`): the
codec itself needs no NATS. A connection with no codec bound writes in clear, and
reads clear values as before.

Encryption: AES-256-GCM (or 128/192 by the key's length) through `cryptography`. A
sealed value is the text `$sealed:<key id>:<base64url(nonce || ciphertext || tag)>`,
placed where the value was with the value's JSON kind kept (a mapping becomes
`{"$sealed": token}`, a list `[{"$sealed": token}]`, anything else the token), so every typed
decoder still reads the message and the key id travels with each value.

Determinism: the nonce is not random. It is HMAC-SHA256 (a subkey derived from the
key) of the plaintext, cut to 96 bits, as in a synthetic-IV scheme: the same plaintext
under the same key gives byte-identical ciphertext (a replay republishes exactly what
it published, with the same `Nats-Msg-Id`), and two different plaintexts share a nonce
only by a 96-bit collision (about 2^-96 per pair; far beyond any log's size before the
2^48 birthday bound). GCM breaks when one nonce encrypts two different plaintexts;
here a nonce repeats only with its own plaintext, which reveals nothing but that the two
values are equal. That equality is what the log still shows: two fields holding the same
value under the same key have the same ciphertext.

A user's value shaped like a token (text starting `$sealed:`, in a token's place) is
never taken for one: with a key it is sealed like any value; in clear it is written
with one more `$` (`$$sealed:...`, and so on for more) and the `$` dropped on reading,
so it reads back exactly and a reader never tries to open it.

Rotation: values are written with the current key and read with whichever key their id
names, the current one or one of the old keys kept for reading.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import msgspec
from msgspec import UNSET, Struct

from actors.errors import UserError
from actors.wire.nesting import START_MESSAGE_DEPTH, json_within
from actors.wire.secrecy import ERROR, ERROR_SECRET_KEYS, SEAL, VALUE

PREFIX = "$sealed:"
_PREFIX_B = PREFIX.encode()
_KEY_ID = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
_NONCE = 12
HOW_TO_GIVE = "ACTORS_PAYLOAD_KEY, ACTORS_PAYLOAD_KEY_FILE or --payload-key-file"

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Decoder(Protocol[T_co]):
    """A typed JSON decoder (`msgspec.json.Decoder`, `events.decision_decoder`)."""

    def decode(self, data: bytes, /) -> T_co: ...


class PayloadUnreadable(UserError, ValueError):
    """An encrypted value that cannot be read: no key given, a key id this reader does
    not hold, or a key that does not decrypt it. The message is one line."""


class PayloadKeyMissing(PayloadUnreadable):
    pass


class PayloadKeyInvalid(ValueError):
    """A key setting that cannot be used (one line naming the setting)."""


# --- keys ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PayloadKey:
    key_id: str
    secret: bytes

    def __repr__(self) -> str:  # never the secret
        return f"PayloadKey({self.key_id!r})"


def parse_key(text: str, *, where: str) -> PayloadKey:
    """`ID:BASE64` or `BASE64` (16, 24 or 32 bytes: AES-128/192/256). Without an id, the
    id is derived from the key (`k` and 8 hex digits of an HMAC of it)."""
    text = text.strip()
    key_id, _, b64 = text.rpartition(":")
    if key_id and not _KEY_ID.match(key_id):
        raise PayloadKeyInvalid(f"{where}: key id {key_id!r}: only letters, digits, '_' and '-' (at most 32)")
    try:
        padded = b64 + "=" * (-len(b64) % 4)
        secret = base64.b64decode(padded.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        raise PayloadKeyInvalid(f"{where}: not base64 (a key is ID:BASE64 or BASE64 of 32 bytes)") from None
    if len(secret) not in (16, 24, 32):
        raise PayloadKeyInvalid(f"{where}: a key is 16, 24 or 32 bytes (32 for AES-256), not {len(secret)}")
    if not key_id:
        key_id = "k" + hmac.new(secret, b"actors payload key id", hashlib.sha256).hexdigest()[:8]
    return PayloadKey(key_id, secret)


@dataclass(frozen=True)
class PayloadKeys:
    """The key values are written with, and every key they may be read with."""

    current: PayloadKey
    old: tuple[PayloadKey, ...] = ()

    @classmethod
    def from_settings(cls, key: str | None, key_file: str | None, old_keys: str | None) -> PayloadKeys | None:
        """From `ACTORS_PAYLOAD_KEY` (one key), `ACTORS_PAYLOAD_KEY_FILE` (one key a
        line: the first is current, the others old; `#` comments and blank lines
        skipped) and `ACTORS_PAYLOAD_OLD_KEYS` (keys separated by commas). The file
        wins over the variable. None: no key, nothing encrypted."""
        keys: list[PayloadKey] = []
        if key_file:
            try:
                lines = Path(key_file).read_text().splitlines()
            except OSError as e:
                raise PayloadKeyInvalid(f"payload key file {key_file}: {e.strerror or e}") from None
            for n, line in enumerate(lines, 1):
                line = line.split("#", 1)[0].strip()
                if line:
                    keys.append(parse_key(line, where=f"payload key file {key_file}, line {n}"))
            if not keys:
                raise PayloadKeyInvalid(f"payload key file {key_file}: no key in it")
        elif key:
            keys.append(parse_key(key, where="ACTORS_PAYLOAD_KEY"))
        for n, item in enumerate((old_keys or "").split(","), 1):
            if item.strip():
                keys.append(parse_key(item, where=f"ACTORS_PAYLOAD_OLD_KEYS, key {n}"))
        if not keys:
            return None
        ids = [k.key_id for k in keys]
        dup = next((i for i in ids if ids.count(i) > 1), None)
        if dup is not None and len({k.secret for k in keys if k.key_id == dup}) > 1:
            raise PayloadKeyInvalid(f"payload keys: two different keys share the id {dup!r}")
        return cls(keys[0], tuple(keys[1:]))


class _Cipher:
    """One key's AES-GCM and its nonce subkey."""

    def __init__(self, key: PayloadKey) -> None:
        # imported here: only a process with a key pays for it (every CLI command imports this module)
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF

        def derive(info: bytes) -> bytes:
            return HKDF(algorithm=hashes.SHA256(), length=len(key.secret), salt=None, info=info).derive(key.secret)

        self.key_id = key.key_id
        self.aead = AESGCM(derive(b"actors payload encryption"))
        self.nonce_key = derive(b"actors payload nonce")
        self.aad = b"actors payload v1 " + key.key_id.encode()

    def seal(self, plain: bytes) -> bytes:
        nonce = hmac.digest(self.nonce_key, plain, "sha256")[:_NONCE]  # the one-shot C HMAC
        return nonce + self.aead.encrypt(nonce, plain, self.aad)

    def open(self, blob: bytes) -> bytes:
        from cryptography.exceptions import InvalidTag

        try:
            return self.aead.decrypt(blob[:_NONCE], blob[_NONCE:], self.aad)
        except InvalidTag:
            raise PayloadUnreadable(
                f"payload key {self.key_id!r} does not decrypt this value: another key was given under that id, "
                "or the data was altered"
            ) from None


# --- which fields: plans read off the Structs' markers ---------------------------------

_NESTED = "nested"
_plans: dict[type, tuple[tuple[str, str], ...]] = {}


def _marker(t: Any) -> str | None:
    if isinstance(t, msgspec.inspect.Metadata):
        return (t.extra or {}).get(SEAL) or _marker(t.type)
    if isinstance(t, msgspec.inspect.UnionType):
        return next((m for m in map(_marker, t.types) if m), None)
    return None


def _holds_struct(t: Any) -> bool:
    if isinstance(t, msgspec.inspect.StructType):
        return bool(plan_of(t.cls))  # a Struct with nothing to seal (say `Limits`) is not walked
    if isinstance(t, msgspec.inspect.Metadata):
        return _holds_struct(t.type)
    if isinstance(t, msgspec.inspect.UnionType):
        return any(map(_holds_struct, t.types))
    if isinstance(t, (msgspec.inspect.ListType, msgspec.inspect.VarTupleType)):
        return _holds_struct(t.item_type)
    return False


def plan_of(cls: type) -> tuple[tuple[str, str], ...]:
    """(field, what to do) for each field of `cls` that is a value, an error, or holds
    Structs that may have some."""
    plan = _plans.get(cls)
    if plan is None:
        steps = []
        for f in msgspec.structs.fields(cls):
            try:
                t = msgspec.inspect.type_info(f.type)
            except TypeError:  # a union msgspec cannot describe alone (tagged and untagged events): walk it
                steps.append((f.name, _NESTED))
                continue
            mark = _marker(t)
            if mark:
                steps.append((f.name, mark))
            elif _holds_struct(t):
                steps.append((f.name, _NESTED))
        plan = _plans[cls] = tuple(steps)
    return plan


def _walk(obj: Any, value: Callable[[Any], Any]) -> Any:
    """`obj` with every marked value passed through `value`, as a copy (the original,
    which an actor's state may hold, is left as it was)."""
    if isinstance(obj, Struct):
        changes = {}
        for name, what in plan_of(type(obj)):
            v = getattr(obj, name)
            if v is None or v is UNSET:
                continue
            if what == VALUE:
                nv = value(v)
            elif what == ERROR:
                nv = _walk(v, value) if isinstance(v, Struct) else _error_dict(v, value)
            else:
                nv = _walk(v, value)
            if nv is not v:
                changes[name] = nv
        return msgspec.structs.replace(obj, **changes) if changes else obj
    if isinstance(obj, (list, tuple)):
        out = [_walk(v, value) for v in obj]
        return out if any(a is not b for a, b in zip(out, obj, strict=True)) else obj
    return obj


def _error_dict(err: Any, value: Callable[[Any], Any]) -> Any:
    if not isinstance(err, dict) or not any(err.get(k) is not None for k in ERROR_SECRET_KEYS):
        return err
    return {k: value(v) if k in ERROR_SECRET_KEYS and v is not None else v for k, v in err.items()}


def token_of(v: Any) -> str | None:
    """The sealed token a value is, in any of its three shapes; None for a clear value."""
    if isinstance(v, str):
        return v if v.startswith(PREFIX) else None
    if isinstance(v, dict):
        t = v.get(PREFIX[:-1]) if len(v) == 1 else None
        return t if isinstance(t, str) and t.startswith(PREFIX) else None
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], dict):
        return token_of(v[0])
    return None


def _looks_sealed(s: str) -> bool:
    """A string in a token's place that a reader would take for a token once one `$` is
    dropped: `$sealed:...`, `$$sealed:...`, and so on."""
    return s.startswith("$") and s.lstrip("$").startswith(PREFIX[1:])


def _escape(s: str) -> str:
    # one more `$`: a user's "$sealed:x:y" is written "$$sealed:x:y", never taken for a token
    return "$" + s if _looks_sealed(s) else s


def _unescape(s: str) -> str:
    return s[1:] if s.startswith("$$") and _looks_sealed(s) else s


def _in_token_place(v: Any, f: Callable[[str], str]) -> Any:
    """`v` with `f` applied to the string where a token would sit (the value itself, the
    `{"$sealed": ...}` mapping's string, or that mapping's in a list of one); `v` itself
    (the same object) when `f` changes nothing."""
    if isinstance(v, str):
        return f(v)
    if isinstance(v, dict) and len(v) == 1:
        s = v.get(PREFIX[:-1])
        if isinstance(s, str):
            ns = f(s)
            return v if ns is s else {PREFIX[:-1]: ns}
        return v
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], dict):
        inner = _in_token_place(v[0], f)
        return v if inner is v[0] else [inner]
    return v


def escape_value(v: Any) -> Any:
    """A clear value as written: one that looks sealed gets one more `$` (see `unescape_value`)."""
    if isinstance(v, msgspec.Raw):  # a tool's result, encoded once where it was measured
        if _PREFIX_B not in bytes(v):
            return v
        plain = msgspec.json.decode(v)
        escaped = _in_token_place(plain, _escape)
        return v if escaped is plain else msgspec.Raw(_encode(escaped))
    return _in_token_place(v, _escape)


def unescape_value(v: Any) -> Any:
    """A clear value as read: the `$` `escape_value` added is dropped, so it reads back exactly."""
    return _in_token_place(v, _unescape)


def _key_id_of(token: str) -> str:
    return token[len(PREFIX) :].split(":", 1)[0]


# --- the codec -------------------------------------------------------------------------


class PayloadCodec:
    """Encrypts marked values with the current key and decrypts them with the key their
    id names. `PayloadCodec(None)` (`CLEAR`) writes in clear and refuses to read a sealed
    value with `PayloadKeyMissing`."""

    def __init__(self, keys: PayloadKeys | None) -> None:
        self.keys = keys
        self._writer = _Cipher(keys.current) if keys else None
        self._readers = {k.key_id: _Cipher(k) for k in ((keys.current, *keys.old) if keys else ())}
        # keyed digest for blob names: a plain digest of a value would let anyone who
        # can list the object store confirm a guess of it
        self._digest_key = self._writer.nonce_key if self._writer else b""

    @property
    def encrypts(self) -> bool:
        return self._writer is not None

    @property
    def key_id(self) -> str | None:
        return self._writer.key_id if self._writer else None

    # values
    def seal_value(self, v: Any) -> Any:
        assert self._writer is not None
        # a value that looks sealed is sealed like any other (it reads back as the text it
        # is): passing it through would let a user's text be taken for a token and opened
        token = PREFIX + self._writer.key_id + ":" + _b64(self._writer.seal(msgspec.json.encode(v)))
        if isinstance(v, dict):
            return {PREFIX[:-1]: token}
        if isinstance(v, list):
            return [{PREFIX[:-1]: token}]  # a list of one mapping: fits `list[Any]` and `list[dict]` fields
        return token

    def open_value(self, v: Any) -> Any:
        token = token_of(v)
        if token is None:
            return unescape_value(v)  # clear: written with no key set (and escaped if it looked sealed)
        key_id, _, body = token[len(PREFIX) :].partition(":")
        plain = self._cipher(key_id).open(_unb64(body))
        if not json_within(plain, START_MESSAGE_DEPTH):  # measured first: decoding recurses per level
            raise PayloadUnreadable(f"a sealed value nests deeper than {START_MESSAGE_DEPTH} levels")
        return msgspec.json.decode(plain)

    def _cipher(self, key_id: str) -> _Cipher:
        cipher = self._readers.get(key_id)
        if cipher is not None:
            return cipher
        if not self._readers:
            raise PayloadKeyMissing(f"this value is encrypted (payload key {key_id!r}): give the key ({HOW_TO_GIVE})")
        held = ", ".join(repr(k) for k in self._readers)
        raise PayloadUnreadable(
            f"this value is encrypted with payload key {key_id!r}, which is not among the keys given ({held}); "
            "add it to ACTORS_PAYLOAD_OLD_KEYS or the key file"
        )

    # Structs
    def seal(self, obj: T) -> T:
        """`obj` with its marked values encrypted (a copy; `obj` unchanged)."""
        return _walk(obj, escape_value if self._writer is None else self.seal_value)  # type: ignore[no-any-return]

    def open(self, obj: T) -> T:
        """`obj` with its sealed values decrypted. Raises `PayloadUnreadable`."""
        return _walk(obj, self.open_value)  # type: ignore[no-any-return]

    def open_for_display(self, obj: T) -> T:
        """Like `open`, but a value this codec cannot read is shown as a one-line note
        instead of raising (a status read without the key)."""

        def value(v: Any) -> Any:
            try:
                return self.open_value(v)
            except PayloadUnreadable:
                token = token_of(v)
                return f"<encrypted with payload key {_key_id_of(token or '')!r}>"

        return _walk(obj, value)  # type: ignore[no-any-return]

    # messages
    def encode(self, obj: Any) -> bytes:
        if self._writer is None:
            data = _encode(obj)
            # in clear, only a message holding a text that looks sealed needs the walk (escaping it)
            return data if _PREFIX_B not in data else _encode(_walk(obj, escape_value))
        return _encode(self.seal(obj))

    def decode(self, decoder: Decoder[T], data: bytes) -> T:
        obj = decoder.decode(data)
        if _PREFIX_B not in data:
            # nothing sealed or escaped in it ("$$sealed:" holds "$sealed:" too): skip the walk
            return obj
        return self.open(obj)

    # the object store's bytes
    def seal_bytes(self, data: bytes) -> bytes:
        if self._writer is None:
            # bytes that start like a sealed blob (a step's output can) get one more `$`, as values do
            return b"$" + data if _bytes_look_sealed(data) else data
        return _PREFIX_B + self._writer.key_id.encode() + b":" + self._writer.seal(data)

    def open_bytes(self, data: bytes) -> bytes:
        if not data.startswith(_PREFIX_B):
            return data[1:] if data.startswith(b"$$") and _bytes_look_sealed(data) else data
        key_id, _, body = data[len(_PREFIX_B) :].partition(b":")
        return self._cipher(key_id.decode(errors="replace")).open(body)

    def digest(self, data: bytes, size: int = 12) -> str:
        return hashlib.blake2b(data, digest_size=size, key=self._digest_key[:64]).hexdigest()


_encode = msgspec.json.Encoder().encode


def _bytes_look_sealed(data: bytes) -> bool:
    return data.startswith(b"$") and data.lstrip(b"$").startswith(_PREFIX_B[1:])


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise PayloadUnreadable("an encrypted value is damaged (not base64)") from None


CLEAR = PayloadCodec(None)
