"""Redaction: every credential value a tool actor has resolved, and the userinfo of any URL
(`http://user:KEY@host`), replaced by ``***`` in what the actor publishes and logs.

The set of values is the process's (`REDACTOR`), not one call's: a value resolved for one
step is masked in every other step's errors and output too, and in every log line the
process writes, whoever wrote it. Values enter when a credential is resolved
(actors/tools/credentials.py), with the forms they take when text is escaped on its way
into an error: JSON string escapes, Python `repr` escapes, percent-encoding.

Short values: a value of fewer than `MIN_SECRET` (4) characters is not masked. Masking
``"a"`` or ``"42"`` everywhere would mangle every message (and show the value by where the
masks fall); the resolver logs a warning naming the credential and key instead.

Logs: `install_log_redaction` wraps the logging record factory, so every record is masked
when it is made, before any handler sees it: handlers added later (`logging.basicConfig`
in the CLI, pytest's caplog) are covered too, which a filter on today's root handlers
would miss.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

from actors.tools.capture import TAIL, Captured

__all__ = ["MASK", "MIN_SECRET", "REDACTOR", "Redactor", "install_log_redaction"]

MASK = "***"
MIN_SECRET = 4

# scheme://userinfo@host : userinfo runs to the LAST `@` before the path (greedy, `@` allowed):
# a password with an unescaped `@` (`svc:p@ss@host`) is masked whole, not up to its own `@`
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)[^\s/?#'\"<>]+@")
_USERINFO_B = re.compile(rb"([A-Za-z][A-Za-z0-9+.\-]*://)[^\s/?#'\"<>]+@")
# the end of a text still printing that could begin a URL's userinfo (a scheme, its
# `://`, the userinfo so far): more bytes may make it one
_USERINFO_OPEN_B = re.compile(rb"[A-Za-z][A-Za-z0-9+.\-]*(?::(?:/(?:/[^\s/?#'\"<>]*)?)?)?\Z")


def _forms(value: str) -> set[str]:
    """`value` and the escaped forms it takes inside JSON text, a repr and a URL."""
    forms = {value, json.dumps(value)[1:-1], repr(value)[1:-1], quote(value, safe="")}
    return {f for f in forms if len(f) >= MIN_SECRET}


class Redactor:
    """The values to mask, as one compiled alternation (longest first, so a value that
    contains another is masked whole). Read from any thread; `add` swaps the patterns."""

    def __init__(self) -> None:
        self._seen: set[str] = set()  # values given to `add` (most calls bring none that is new)
        self._values: set[str] = set()
        self._lock = threading.Lock()
        self._text: re.Pattern[str] | None = None
        self._data: re.Pattern[bytes] | None = None
        self._edges: tuple[bytes, ...] = ()

    def add(self, values: Iterable[str]) -> None:
        """Mask `values` (and their escaped forms) from now on; short ones are ignored."""
        fresh = [v for v in values if v not in self._seen]
        if not fresh:
            return
        self._seen.update(fresh)
        new = {f for v in fresh if len(v) >= MIN_SECRET for f in _forms(v)} - self._values
        if not new:
            return
        with self._lock:
            self._values |= new
            ordered = sorted(self._values, key=len, reverse=True)
            self._text = re.compile("|".join(re.escape(v) for v in ordered))
            encoded = [v.encode("utf-8", "surrogatepass") for v in ordered]
            self._data = re.compile(b"|".join(re.escape(b) for b in encoded))
            self._edges = tuple(encoded)

    def text(self, s: str) -> str:
        """`s` with every known value and every URL's userinfo masked."""
        pattern = self._text
        if pattern is not None:
            s = pattern.sub(MASK, s)
        if "://" in s:
            s = _USERINFO.sub(r"\1" + MASK + "@", s)
        return s

    def maybe(self, s: str | None) -> str | None:
        return None if s is None else self.text(s)

    def data(self, b: bytes) -> bytes:
        """`text` for bytes (what a tool printed)."""
        pattern = self._data
        if pattern is not None:
            b = pattern.sub(MASK.encode(), b)
        if b"://" in b:
            b = _USERINFO_B.sub(rb"\1" + MASK.encode() + b"@", b)
        return b

    def safe_cut(self, b: bytes, n: int, final: bool) -> int:
        """The largest cut <= `n` of `b` (printed and not published yet; more follows
        unless `final`) at which `b[:cut]` masked alone is the start of `b` masked whole
        (of all that will be printed): no value nor URL userinfo straddles it, and,
        unless `final`, none may yet begin before it and end in what is to come (an
        end of `b` that is the start of a value, an unfinished URL)."""
        pattern = self._data
        if pattern is not None and not final:  # held back: an end that begins a value
            held = max((k for v in self._edges for k in range(1, len(v)) if b.endswith(v[:k])), default=0)
            n = min(n, len(b) - held)
        for p in (pattern, _USERINFO_B if b"://" in b else None):
            if p is None:
                continue
            for m in p.finditer(b):
                if m.start() >= n:
                    break
                if m.end() > n:
                    n = m.start()
                    break
        if not final:  # in the last KiB only (a regex anchored at the end is quadratic)
            opened = _USERINFO_OPEN_B.search(b, max(0, len(b) - 1024))
            if opened is not None and opened.start() < n:
                n = opened.start()
        return n

    def captured(self, c: Captured) -> Captured:
        """What a tool printed, masked. Kept whole: masked as one text. Cut (past the cap):
        the kept start and the tail are masked apart, and a value cut in two by either
        cut is masked too (the part of it at the end of the start, at the start of the tail)."""
        if len(c.kept) == c.size:
            kept = self.data(c.kept)
            return Captured(size=len(kept), kept=kept, tail=kept[-TAIL:])
        kept = self._cut_end(self.data(c.kept))
        # `size` as if the kept text had been printed masked: `size - len(kept)` is still
        # the count of bytes not kept (the "N more bytes not kept" of readers)
        return Captured(size=c.size - len(c.kept) + len(kept), kept=kept, tail=self._cut_start(self.data(c.tail)))

    def _cut_end(self, b: bytes) -> bytes:
        for v in self._edges:
            for k in range(len(v) - 1, MIN_SECRET - 1, -1):
                if b.endswith(v[:k]):
                    return b[:-k] + MASK.encode()
        return b

    def _cut_start(self, b: bytes) -> bytes:
        for v in self._edges:
            for k in range(len(v) - 1, MIN_SECRET - 1, -1):
                if b.startswith(v[-k:]):
                    return MASK.encode() + b[k:]
        return b

    def value(self, v: Any) -> Any:
        """Every string in a JSON value masked (a shell step's captured stdout and stderr)."""
        if isinstance(v, str):
            return self.text(v)
        if isinstance(v, dict):
            return {k: self.value(x) for k, x in v.items()}
        if isinstance(v, list):
            return [self.value(x) for x in v]
        return v


REDACTOR = Redactor()

_installed = False
_install_lock = threading.Lock()


def install_log_redaction(redactor: Redactor = REDACTOR) -> None:
    """Mask every log record this process makes from now on (idempotent)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        _installed = True
        make = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = make(*args, **kwargs)
            _mask_record(record, redactor)
            return record

        logging.setLogRecordFactory(factory)


def _mask_record(record: logging.LogRecord, redactor: Redactor) -> None:
    try:
        message = record.getMessage()
    except Exception:  # a bad format string: logging reports it when the record is emitted
        return
    masked = redactor.text(message)
    if masked != message:
        record.msg, record.args = masked, None
    if record.exc_info and record.exc_info[0] is not None:
        # formatted here, masked: a record whose exc_info is gone prints its exc_text as is
        text = logging.Formatter().formatException(record.exc_info)
        masked = redactor.text(text)
        if masked != text:
            record.exc_text, record.exc_info = masked, None
    if record.stack_info:
        record.stack_info = redactor.text(record.stack_info)
