"""What a tool pod does, once, before it runs anyone's steps, about its own secrets.

The pod's own process environment holds what steps must never see (``NATS_PASSWORD``,
``ACTORS_PAYLOAD_KEY``, the ``ACTORS_CREDENTIAL_*`` variables). A step starts from a
clean environment, as another user when the pod is root, and the pod's process is not
dumpable, so a step of its own user cannot read it through ``/proc`` or ptrace: the
rules every child of a pod is started by (actors/runtime/children.py).

1. `make_undumpable` (`protect_pod`): ``prctl(PR_SET_DUMPABLE, 0)`` on the pod's
   process, whose ``/proc`` files then are root's; no core dump either.
2. `pod_secrets`: the pod's NATS password and token (given or read from their files), its
   payload keys and the web UI's token, handed to the redactor, so a step that finds them
   anyway (a pod configured to run steps as root, a file mounted where steps can read it)
   cannot publish them in clear: ``***`` wherever credentials are masked.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path

from actors.config.settings import Settings
from actors.runtime.children import dumpable, make_undumpable, protect_pod
from actors.tools.redact import REDACTOR, Redactor

__all__ = ["dumpable", "guard_pod", "make_undumpable", "pod_secrets"]


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
    """Mask the pod's secrets in what it publishes and logs; make the process undumpable
    (once per process: a second tool actor in it changes nothing)."""
    redactor.add(pod_secrets(settings))
    protect_pod()
