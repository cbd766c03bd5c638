"""What a tool pod does, once, before it runs anyone's steps, about its own secrets.

Shell and python steps run as the pod's user. The pod's own process environment holds
what steps must never see (``NATS_PASSWORD``, ``ACTORS_PAYLOAD_KEY``, the
``ACTORS_CREDENTIAL_*`` variables): a step is given a clean environment
(actors/tools/environment.py), but could still read its parent's through
``/proc/<pid>/environ`` (and its memory through ``/proc/<pid>/mem`` or ptrace), which
Linux lets a process of the same user do.

1. `make_undumpable`: ``prctl(PR_SET_DUMPABLE, 0)`` on the pod's process. The kernel then
   owns the process's ``/proc`` files as root and refuses ptrace, so a process of the same
   (non-root) user cannot read them; it also means no core dump. Children get the flag
   back when they ``exec`` (a step's process is dumpable, but holds only its clean
   environment). Root (any uid 0 step, or one with CAP_SYS_PTRACE) still reads everything:
   run the pod as a non-root user (the image runs as uid 10001).
2. `pod_secrets`: the pod's NATS password and token (given or read from their files), its
   payload keys and the web UI's token, handed to the redactor, so a step that finds them anyway (root, a
   mounted file) cannot publish them in clear: ``***`` wherever credentials are masked.
"""

from __future__ import annotations

import base64
import binascii
import logging
import sys
import threading
from pathlib import Path

from actors.settings import Settings
from actors.tools.redact import REDACTOR, Redactor

__all__ = ["dumpable", "guard_pod", "make_undumpable", "pod_secrets"]

log = logging.getLogger("actors.tools.podguard")

_PR_GET_DUMPABLE = 3
_PR_SET_DUMPABLE = 4

_lock = threading.Lock()
_done = False


def _prctl() -> object | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def dumpable() -> int | None:
    """This process's dumpable flag (0: its /proc files are root's), None off Linux."""
    prctl = _prctl()
    if prctl is None:
        return None
    result: int = prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0)  # type: ignore[operator]
    return result


def make_undumpable() -> bool:
    """Clear this process's dumpable flag (Linux); True when it is clear afterwards."""
    prctl = _prctl()
    if prctl is None:
        return False
    if prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:  # type: ignore[operator]
        import ctypes

        log.warning("prctl(PR_SET_DUMPABLE, 0) failed (errno %d): steps may read the pod's /proc", ctypes.get_errno())
        return False
    return dumpable() == 0


def _file_text(path: str | None) -> str | None:
    if not path:
        return None
    try:
        return Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError):  # the connection reports it; nothing to mask
        return None


def _key_forms(text: str) -> list[str]:
    """A payload key as written (``ID:BASE64`` or ``BASE64``), its base64 part, and the
    other base64 spellings of the same bytes (padded or not, standard or URL-safe)."""
    text = text.strip()
    b64 = text.rpartition(":")[2]
    forms = [text, b64]
    try:
        padded = b64 + "=" * (-len(b64) % 4)
        raw = base64.b64decode(padded.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        return forms  # not a key the codec would take (the pod will not start): mask the text anyway
    for encoded in (base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode()):
        forms += [encoded, encoded.rstrip("=")]
    return forms


def pod_secrets(settings: Settings) -> list[str]:
    """The pod's own secrets, every form a step could print them in."""
    found: list[str] = []
    for value in (
        settings.nats_password,
        settings.nats_token,
        settings.ui_token,  # a pod running `all` roles, or one env shared by every pod
        _file_text(settings.nats_password_file),
        _file_text(settings.nats_token_file),
        _file_text(settings.ui_token_file),
    ):
        if value:
            found.append(value)
    keys: list[str] = []
    if settings.payload_key:
        keys.append(settings.payload_key)
    key_file = _file_text(settings.payload_key_file)
    if key_file:
        keys += [line.split("#", 1)[0] for line in key_file.splitlines()]
    keys += (settings.payload_old_keys or "").split(",")
    for key in keys:
        if key.strip():
            found += _key_forms(key)
    return found


def guard_pod(settings: Settings, redactor: Redactor = REDACTOR) -> None:
    """Mask the pod's secrets in what it publishes and logs; make the process undumpable,
    once per process (a second tool actor in it changes nothing)."""
    redactor.add(pod_secrets(settings))
    global _done
    with _lock:
        if _done:
            return
        _done = True
        if not make_undumpable() and sys.platform.startswith("linux"):
            log.warning("the tool pod's process is dumpable: a step of the same user can read its environment")
