"""The root of this package's errors. streams/ imports nothing of actors/, so its errors
cannot share actors' root (actors/errors.py); `actors-cli` maps this one itself: NATS
cannot serve the layout, or the embedded nats-server did not start (exit 5)."""

from __future__ import annotations


class StreamsError(Exception):
    """NATS cannot be used as the layout needs it; the message says why."""
