"""The commands a tool actor has taken and not acked yet: kept alive (`in_progress`)
while they run, so the server does not hand them to another pod meanwhile, but not for
ever.

A command whose step has a timeout is done, one way or the other, within that timeout
(times its chunk's items, twice with a sink) plus the time its answer may take to be
stored (publish retries, a python worker's boot): `HOLD_MARGIN`. One held past that is
stuck in this pod (a bug: waiting on something that will never come), and beating for it
would keep its execution RUNNING for ever, silently. So it is let go, with an error in
the log: the server delivers it again after `ack_wait` (here or on another pod), and
`max_deliver` bounds how often. A step without a timeout may run as long as it likes.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

from nats.aio.msg import Msg

from actors.wire.messages import Command

__all__ = ["HOLD_MARGIN", "HeldCommands", "hold_bound"]

log = logging.getLogger("actors.tools")

# seconds a command may be held beyond its step's timeout: its answer's publish retries
# (RETRY_BUDGET 30 s, then a PubAck deadline of 10 s), a python worker's boot (up to
# 60 s), an output blob; with room to spare, since letting go runs the step again
HOLD_MARGIN = 180.0


def hold_bound(cmd: Command) -> float:
    """Seconds `cmd` may be held (inf: its step has no timeout)."""
    if cmd.timeout is None:
        return math.inf
    runs = (len(cmd.chunk) if cmd.chunk is not None else 1) * (2 if cmd.sink is not None else 1)
    return float(cmd.timeout) * runs


class HeldCommands:
    """The commands held: by ack subject, the message, when it was taken and the command."""

    def __init__(self, *, margin: float = HOLD_MARGIN) -> None:
        self.margin = margin
        self._held: dict[str, tuple[Msg, float, Command]] = {}  # ack subject -> (msg, held since, command)
        self.let_go = 0  # commands given up on so far

    def hold(self, msg: Msg, cmd: Command) -> None:
        """`msg` (carrying `cmd`) runs here: keep it alive until `release`."""
        self._held[msg.reply] = (msg, time.monotonic(), cmd)  # its bound is worked out at the beats

    def holds(self, reply: str) -> bool:
        """Is the command still held (not released, not let go)?"""
        return reply in self._held

    def release(self, reply: str) -> None:
        """The command is answered (or failed before its answer): no more beats."""
        self._held.pop(reply, None)

    async def keep_alive(self, period: float) -> None:
        """Every `period` seconds, an `in_progress` for each command held; the ones held
        past their bound are let go instead (see the module docstring). Runs until
        cancelled."""
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for reply, (msg, since, cmd) in list(self._held.items()):
                if reply not in self._held:
                    continue  # released while an earlier beat was sent
                allowed = hold_bound(cmd)
                if now - since > allowed + self.margin:
                    del self._held[reply]
                    self.let_go += 1
                    # `allowed`, not the step's timeout: a chunk runs it once per item, a sink twice
                    log.error(
                        "command %s (execution %s, step %r) still unanswered after %.0fs, more than the %gs "
                        "its timeout allows plus %gs; no longer kept alive: the server will deliver it again",
                        cmd.command_id,
                        cmd.execution_id,
                        cmd.step,
                        now - since,
                        allowed,
                        self.margin,
                    )
                    continue
                try:
                    await msg.in_progress()
                except Exception as e:  # a closed connection: the next beat tries again
                    log.debug("keep-alive of %s: %s", reply, e)
