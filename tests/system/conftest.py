"""Fixtures of the system tests beyond tests/conftest.py: `secured` (a nats-server with
the least-privilege account) and `pods` (each role on its own user), for the tests of
permissions, tampering and the UI on the cli user (tests/support/secured.py)."""

from __future__ import annotations

from tests.support.secured import pods, secured

__all__ = ["pods", "secured"]
