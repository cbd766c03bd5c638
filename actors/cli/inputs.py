"""What a command reads from its flags and the environment: its settings, its --timeout,
and the user's execution id and payload, checked before they get near NATS."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import msgspec

from actors.cli.exits import UsageError
from actors.dial import CLIENT_TIMEOUT
from actors.settings import Settings


def payload_of(raw: str | None) -> dict[str, Any]:
    if raw is None:
        return {}
    from actors.jsonvalues import loads  # integers beyond 64 bits too

    text = Path(raw[1:]).read_bytes() if raw.startswith("@") else raw
    try:
        value = loads(text)
    except msgspec.DecodeError as e:
        raise UsageError(f"--payload: not JSON ({e})") from None
    if not isinstance(value, dict):
        raise UsageError("--payload: must be a JSON object")
    return value


# the flags of actors/cli/security.py, named as their `Settings` fields
CONNECTION_FLAGS = (
    "nats_user",
    "nats_password_file",
    "nats_token_file",
    "nats_creds",
    "nats_nkey",
    "nats_inbox_prefix",
    "tls_ca",
    "tls_cert",
    "tls_key",
)


def settings_of(args: argparse.Namespace) -> Settings:
    """The settings of this command: the environment, with the flags it was given over it."""
    return Settings.from_env(os.environ).with_flags(
        nats_url=getattr(args, "nats", None) or None,
        http_host=getattr(args, "http_host", None),
        http_port=getattr(args, "http_port", None),
        drain_timeout=getattr(args, "drain_timeout", None),
        payload_key_file=getattr(args, "payload_key_file", None),
        **{name: getattr(args, name, None) for name in CONNECTION_FLAGS},
    )


def timeout_of(args: argparse.Namespace) -> float:
    """Seconds the command may take to reach NATS: its --timeout, else CLIENT_TIMEOUT."""
    given = getattr(args, "timeout", None)
    return CLIENT_TIMEOUT if given is None else float(given)


def checked_execution_id(raw: str | None) -> str | None:
    """A user's execution id, checked before it gets near a subject or a key."""
    from actors.client import check_execution_id

    return None if raw is None else check_execution_id(raw)
