"""Cancels reaching a tool actor: `cancel.<execution>` stops all of an execution's commands
running here, `cancel.<execution>.<command>` one of them; recent cancels are remembered,
to answer a cancelled command still queued (`Cancelled`, without running it)."""

from __future__ import annotations

from collections import OrderedDict

from actors.tools.failures import CancelSignal
from actors.wire.messages import Command
from streams.subjects import cancel_target

__all__ = ["CANCELS_REMEMBERED", "Cancels"]

CANCELS_REMEMBERED = 100_000  # recent `cancel.>` subjects kept, to answer queued cancelled commands


class Cancels:
    """The cancel signal of every command running here, and the cancels seen lately."""

    def __init__(self) -> None:
        self._running: dict[str, dict[str, CancelSignal]] = {}  # execution -> command -> cancel
        self._cancelled: OrderedDict[str, None] = OrderedDict()  # "<execution>[.<command>]", oldest first

    def on_cancel(self, subject: str) -> None:
        """A `cancel.<execution>[.<command>]` message arrived."""
        eid, command_id = cancel_target(subject)
        self._cancelled[f"{eid}.{command_id}" if command_id else eid] = None
        if len(self._cancelled) > CANCELS_REMEMBERED:
            self._cancelled.popitem(last=False)
        running = self._running.get(eid, {})
        for cid, ev in running.items():
            if not command_id or cid == command_id:
                ev.set()

    def begin(self, cmd: Command) -> CancelSignal:
        """The cancel signal of `cmd`, which starts running here (already set if a cancel
        for it came first: cancelled commands stay queued, see actors/runtime/outbox.py `Outbox.stop`)."""
        cancel = CancelSignal()
        if self._cancelled and self._was_cancelled(cmd):
            cancel.set()  # answered `Cancelled` without running
        running = self._running.get(cmd.execution_id)
        if running is None:
            running = self._running[cmd.execution_id] = {}
        running[cmd.command_id] = cancel
        return cancel

    def end(self, cmd: Command) -> None:
        """`cmd` no longer runs here."""
        running = self._running.get(cmd.execution_id)
        if running is None:
            return
        running.pop(cmd.command_id, None)
        if not running:
            del self._running[cmd.execution_id]

    def _was_cancelled(self, cmd: Command) -> bool:
        """A cancel for this command (or its execution) came before the command did."""
        return cmd.execution_id in self._cancelled or f"{cmd.execution_id}.{cmd.command_id}" in self._cancelled
