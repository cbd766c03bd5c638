"""NATS header blocks as bytes: read the way nats-py reads them, and rebuilt from the
headers nats-py parsed. Pure: no connection, no nats-py internals (the protocol reader
in actors/natsio/private.py uses `header_lines` for the blocks nats-py still reads)."""

from __future__ import annotations

import re

_CRLF = b"\r\n"
_PLAIN = b"NATS/1.0\r\n"
_PLAIN_SIZE = len(_PLAIN)
_SPACE = re.compile(r"\s")
_names: dict[bytes, str | None] = {}  # header names read so far (a few distinct ones); None: skipped
_NAMES_KEPT = 256


def has_status(block: bytes) -> bool:
    """Does a header block start with a status (a heartbeat, a 503, "no messages")?
    nats-py's own code reads those (`plain_headers` does not)."""
    return not block.startswith(_PLAIN)


def plain_headers(block: bytes) -> dict[str, str] | None:
    """The headers of a header block without a status ("NATS/1.0\\r\\n" then
    name-value lines), as nats-py's `Client._process_headers` reads them: None when
    there are none."""
    return header_lines(block[_PLAIN_SIZE:]) or None


def header_lines(raw: bytes) -> dict[str, str]:
    """Name-value lines as nats-py's `Client._parse_header_lines` reads them, the names
    decoded and checked once and cached (a few distinct ones come again and again; that
    check is a generator over each name's characters in nats-py). `install_reader` puts
    it in place of nats-py's on the connection, for the messages nats-py's own code reads
    (a status watch, a request's reply)."""
    out: dict[str, str] = {}
    names = _names
    for line in raw.split(_CRLF):
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        try:
            key = names[name]
        except KeyError:
            key = _header_name(name)
            if len(names) < _NAMES_KEPT:
                names[name] = key
        if key is not None:
            out[key] = value.strip().decode("utf-8", "replace")
    return out


def _header_name(name: bytes) -> str | None:
    """A header's name as nats-py reads it, or None for one it skips (not ASCII, or with
    a space inside)."""
    try:
        key = name.strip().decode("ascii")
    except UnicodeDecodeError:
        return None
    return None if _SPACE.search(key) else key


def header_block(headers: dict[str, str] | None) -> bytes | None:
    """A header block with `headers` (as nats-py parsed them: a status in "Status" and
    "Description"), for a handler of raw bytes given a `Msg`."""
    if not headers:
        return None
    status = headers.get("Status")
    first = b"NATS/1.0" if status is None else b"NATS/1.0 " + status.encode()
    if status is not None and headers.get("Description"):
        first += b" " + headers["Description"].encode()
    lines = [first] + [
        f"{k}: {v}".encode() for k, v in headers.items() if status is None or k not in ("Status", "Description")
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n"
