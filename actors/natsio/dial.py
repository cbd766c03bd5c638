"""Connecting a short-lived client (the CLI) to NATS within a deadline.

`actors.pod.roles.connect` retries an unreachable server for ever, which is what a pod
must do (it waits for its server to come up). A person at a terminal, or a script,
needs the opposite: an answer within a bound, and at once when the server refuses
the credentials (retrying the same password cannot help). Once connected, the
connection reconnects like any other, so a watch rides out a NATS node going away.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
import time
from collections.abc import Callable
from typing import Any

import nats.errors
from nats.aio.client import Client as NATS

from actors.errors import Unavailable
from actors.natsio.connopts import ConnectOptions
from actors.natsio.denials import note_violation
from actors.natsio.publishing import publisher
from actors.natsio.reader import install_reader

log = logging.getLogger("actors.natsio.dial")
# Seconds a client command (and `actors.client.Client`, per call) keeps trying when NATS
# does not answer or refuses for a while. It covers a stream leader election: on the
# 3-node loopback cluster (`python bench/election.py`) a stream named a new leader
# 4.3-7.0 s after its leader was killed (10 runs) and took publishes again after
# 5.1-10.1 s (15 runs, START and EXEC; the re-send pauses round that up by up to 2 s), so 30 s
# is three of the slowest, with room for a reconnect.
CLIENT_TIMEOUT = 30.0
RECONNECT_WAIT = 0.5  # seconds between tries of the same server
ATTEMPT_TIMEOUT = 2.0  # seconds one TCP connect + CONNECT/PING may take


class NatsUnavailable(Unavailable):
    """No usable connection: the server is unreachable, refused the credentials, or
    does not answer. The message is one line for a user, with no password in it."""


# the userinfo of each URL in a list: to the LAST `@` before the host's end (`/` or the `,`
# between servers), so a password holding an `@` (`u:p@ss@host`) is masked whole
_USERINFO = re.compile(r"://([^/,]*)@")


def redact(url: str) -> str:
    """The URL(s) without passwords or tokens: `nats://user:***@host:4222`, `nats://***@host`."""

    def mask(m: re.Match[str]) -> str:
        user, colon, _ = m.group(1).partition(":")  # a user name holds no `:`; the password may
        return f"://{user}:***@" if colon else "://***@"

    return _USERINFO.sub(mask, url)


def is_auth_error(e: BaseException) -> bool:
    """The server refused who we are (user/password, token): not a reachability problem."""
    if isinstance(e, nats.errors.AuthorizationError):
        return True
    text = str(e).lower()
    return "authorization violation" in text or "authentication" in text


# a connection cut during the handshake (a node going down): worth another try, unlike a
# certificate refused by either side
_TLS_CUT = (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


def is_tls_error(e: BaseException) -> bool:
    """The TLS handshake failed: the server's certificate is not trusted, or the server
    refused ours (or wanted one). Trying the same certificates again cannot help."""
    return isinstance(e, ssl.SSLError) and not isinstance(e, _TLS_CUT)


def refusal(e: BaseException, url: str, options: ConnectOptions) -> str | None:
    """One line for an error that retrying cannot cure (credentials refused, a TLS
    handshake failed), naming what to check and never a secret; None for any other."""
    where = redact(url)
    if is_auth_error(e):
        return f"NATS at {where} refused the credentials ({_one_line(e)}): check {options.credentials()}"
    if is_tls_error(e):
        check = f"the server's certificate must chain to {options.trust()}"
        if options.tls_cert:
            check += f"; and it must accept the client certificate {options.tls_cert}"
        elif "certificate" in str(e).lower() and "verify failed" not in str(e).lower():
            check += "; a server that verifies clients needs NATS_TLS_CERT and NATS_TLS_KEY (--tls-cert/--tls-key)"
        return f"TLS with NATS at {where} failed ({_one_line(e)}): {check}"
    return None


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    text = re.sub(r" \(_ssl\.c:\d+\)", "", text)  # where in CPython's ssl module: nothing for a user
    return text.removeprefix("nats: ").strip("'")


class OutageNotices:
    """A line (`say`) when a connected client loses NATS and one when it has it again.
    A command that waits for an execution (`run`, `status --watch`) rides out an outage
    as the connection reconnects; its user should know that it now waits for NATS, not
    for the execution. `down_since`: wall time the connection went down, None while up."""

    def __init__(self, url: str, say: Callable[[str], None]) -> None:
        self.url = redact(url)
        self.say = say
        self.nc: NATS | None = None
        self.down_since: float | None = None

    async def lost(self) -> None:
        if self.nc is None or self.nc.is_closed:
            return  # our own close: nothing lost
        self.down_since = time.time()
        self.say(f"lost the connection to NATS at {self.url}; trying again (the execution goes on without us)")

    async def back(self) -> None:
        if self.down_since is not None:
            self.say(f"connected to NATS again after {time.time() - self.down_since:.0f}s")
        self.down_since = None


async def connect_within(
    url: str,
    *,
    timeout: float,
    name: str = "actors-cli",
    options: ConnectOptions | None = None,
    notices: OutageNotices | None = None,
) -> NATS:
    """Connect to `url` (comma-separated for a cluster) within `timeout` seconds or
    raise NatsUnavailable saying why; refused credentials or a failed TLS handshake
    raise at once. `options`: credentials and TLS (default: the environment's).
    `notices`: told when the connection, once made, goes down and comes back."""
    options = options if options is not None else ConnectOptions.from_environment()
    servers = [u.strip() for u in url.split(",") if u.strip()]
    refused: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    last: list[BaseException] = []

    async def on_error(e: Exception) -> None:
        last[:] = [e]
        log.info("nats: %s", e)
        denial = note_violation(nc, e)  # what this user may not (actors/natsio/denials.py)
        if denial is not None and denial.kind == "publish":  # a JetStream publish waiting: failed now
            publisher(nc).denied(denial.subject, denial.explain())
        why = refusal(e, url, options)
        if why is not None and not refused.done():
            refused.set_result(why)

    # nats-py annotates these two as int; it takes fractions of a second
    tuning: dict[str, Any] = {
        "reconnect_time_wait": RECONNECT_WAIT,
        "connect_timeout": max(0.1, min(ATTEMPT_TIMEOUT, timeout)),
    }
    if notices is not None:
        tuning |= {"disconnected_cb": notices.lost, "reconnected_cb": notices.back}
    nc = install_reader(NATS())  # the faster protocol reader (actors/natsio/reader.py)
    if notices is not None:
        notices.nc = nc
    connecting: asyncio.Future[Any] = asyncio.ensure_future(
        nc.connect(servers, name=name, max_reconnect_attempts=-1, error_cb=on_error, **tuning, **options.nats_kwargs())
    )
    try:
        await asyncio.wait((connecting, refused), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        connecting.cancel()
        raise
    if connecting.done() and connecting.exception() is None:
        return nc
    connecting.cancel()
    await asyncio.gather(connecting, return_exceptions=True)
    try:
        await nc.close()
    except Exception:  # never connected: nothing much to close
        pass
    where = redact(url)
    if refused.done():
        raise NatsUnavailable(refused.result())
    if connecting.done() and not connecting.cancelled() and connecting.exception() is not None:
        last[:] = [connecting.exception() or RuntimeError("connect failed")]
    why = f": {_one_line(last[0])}" if last else ""
    raise NatsUnavailable(f"cannot reach NATS at {where} within {timeout:g}s{why}")
