"""What a command reads from its flags and the environment: its settings, its --timeout,
and the user's execution id and payload, checked before they get near NATS."""

from __future__ import annotations

import argparse
import math
import os
from typing import Any

import msgspec

from actors.cli.exits import UsageError
from actors.config.settings import Settings
from actors.natsio.dial import CLIENT_TIMEOUT


def payload_of(raw: str | None) -> dict[str, Any]:
    """The JSON object of --payload: the text given, or `@file`'s contents (a regular
    file of at most the value cap, ACTORS_MAX_VALUE_BYTES: past it the payload would be
    refused anyway), nested at most `MAX_DEPTH` deep (checked before it is decoded)."""
    if raw is None:
        return {}
    from actors.wire.jsonvalues import loads  # integers beyond 64 bits too
    from actors.wire.nesting import json_within, too_deep

    text = _payload_file(raw[1:]) if raw.startswith("@") else raw
    if not json_within(text):
        raise UsageError(f"--payload: {too_deep('it')}")
    try:
        value = loads(text)
    except msgspec.DecodeError as e:
        raise UsageError(f"--payload: not JSON ({e})") from None
    if not isinstance(value, dict):
        raise UsageError("--payload: must be a JSON object")
    return value


def _payload_file(path: str) -> bytes:
    from actors.playbook.userfiles import UnreadableFile, read_regular_file

    cap = Settings.from_env(os.environ).max_value_bytes  # past it the payload is refused anyway
    try:
        return read_regular_file(
            path, limit=cap, what="the payload", over=f"the {cap:,}-byte cap on values (ACTORS_MAX_VALUE_BYTES)"
        )
    except UnreadableFile as e:
        raise UsageError(f"--payload @{path}: {e.strerror}") from None


def seconds(text: str) -> float:
    """An argparse type: a number of seconds that a wait can last, finite and above 0
    (`nan` compares false with everything, so a timeout of nan would never end)."""
    value = _number(text)
    if not (0 < value < math.inf):
        raise argparse.ArgumentTypeError(f"{text!r}: must be a finite number of seconds above 0")
    return value


def seconds_or_zero(text: str) -> float:
    """An argparse type: a finite number of seconds, 0 included (0: no wait at all)."""
    value = _number(text)
    if not (0 <= value < math.inf):
        raise argparse.ArgumentTypeError(f"{text!r}: must be a finite number of seconds, 0 or more")
    return value


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


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
