"""`Client.prepare_rollback`: what a roll back from semantics 6 to an engine of 5 needs
first (docs/upgrades.md "From 5 to 6"; `actors-cli prepare-rollback`).

An engine pod of 5 cannot read a start stored with its first decision (an answer record
holding a start record): its replay stops comparing at it and folds what follows into a
state that never started, so an input reaching it (a signal, a result) is decided wrongly
and that decision is stored, which 6 later finds differs (a halt no release resumes).
A plain copy of the start record on `in.start` after it makes a pod of 5 halt there
instead (`SemanticsUnknown`: a start of semantics 6), before it folds anything after,
and hand the execution back untouched; semantics 6 folds the copy as a second start,
which decides nothing (the first won). So every execution not ended whose log opens with
a start answer gets one such copy: under a message id of its own (`start_copy_id`) and
only while `in.start` is empty, so running this twice writes nothing new and a plain
start there already is not doubled."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from nats.js.errors import NotFoundError

from actors.client.session import Session
from actors.natsio import EXPECTED_LAST_SUBJECT_SEQUENCE, held_start, subject_taken
from actors.natsio.replay import first_message
from actors.store.records import status_or_none
from actors.wire.events import TERMINAL_STATES
from streams.ids import start_copy_id
from streams.layout import EXECUTION_ID, STATUS_BUCKET
from streams.subjects import is_answer_record, kv_key_subject, kv_stream

AT_ONCE = 64  # executions looked at (and copied) at once
NEXT_TIMEOUT = 10.0  # seconds a status may take to come (actors/natsio/readall.py)


@dataclass(slots=True)
class RollbackReport:
    """What `Client.prepare_rollback` did, by what each execution not ended was."""

    running: int = 0  # executions whose status is not terminal
    copied: int = 0  # a start answer first: its plain copy written now
    copied_before: int = 0  # a start answer first, and a plain start on `in.start` already (a run before)
    plain: int = 0  # started plain, or not started yet: nothing to do (an engine of 5 reads its start)


class Rollbacks(Session):
    """Make the executions of semantics 6 safe for an engine of 5 to meet."""

    async def prepare_rollback(self, *, progress: Callable[[str, str], None] | None = None) -> RollbackReport:
        """For every execution whose status (KV `status`) is not terminal and whose log's
        first input is its start stored with its first decision, append a plain copy of
        the start record on `in.start` (see the module's docstring). `progress` hears
        of each execution looked at: its id and what it was (`copied`, `copied_before`,
        `plain`). Idempotent: run it again after an interruption, or if in doubt."""
        report = RollbackReport()
        running = await self._ride("reading the statuses (KV status)", self._running)
        for at in range(0, len(running), AT_ONCE):
            batch = running[at : at + AT_ONCE]
            outcomes = await asyncio.gather(*(self._prepare(eid) for eid in batch))
            for eid, outcome in zip(batch, outcomes, strict=True):
                report.running += 1
                setattr(report, outcome, getattr(report, outcome) + 1)
                if progress is not None:
                    progress(eid, outcome)
        return report

    async def _running(self) -> list[str]:
        """The ids of the executions whose status is not terminal, read from the bucket's
        stream by an ordered consumer (its only message per key: history 1; the bucket
        allows no batched direct get). On a stream of three replicas the consumer may sit
        on one catching up; no start answer is stored in such a deployment (asks are
        served on a log of one replica only: docs/architecture.md "The next layout")."""
        stream = kv_stream(STATUS_BUCKET)
        try:
            info = await self.nc.jsm().stream_info(stream)
        except NotFoundError:
            return []  # no status ever written: no execution
        if not info.state.messages:
            return []
        found: list[str] = []
        sub = await self.js.subscribe(
            kv_key_subject(STATUS_BUCKET, ">"), stream=stream, ordered_consumer=True, pending_msgs_limit=-1
        )
        try:
            while True:
                msg = await sub.next_msg(timeout=NEXT_TIMEOUT)
                where = f"{stream} message {msg.metadata.sequence.stream}"
                st = status_or_none(msg.data, key=where) if msg.data else None  # none: a key deleted (retired)
                if st is not None and st.state not in TERMINAL_STATES and EXECUTION_ID.fullmatch(st.execution_id):
                    found.append(st.execution_id)
                if msg.metadata.num_pending == 0:
                    return found
        finally:
            await sub.unsubscribe()

    async def _prepare(self, eid: str) -> str:
        """One execution: `copied`, `copied_before` or `plain` (see `RollbackReport`)."""
        stream, subjects = self.layout.exec_stream_of(eid), self.layout.execution(eid)
        what = f"the start of execution {eid}"
        try:
            first = await self._ride(what, lambda: first_message(self.nc, stream, subjects.inputs))
        except NotFoundError:
            return "plain"  # not started yet (its start still queued), or retired since
        held = held_start(first.subject or "", first.data or b"") if is_answer_record(first.subject or "") else None
        if held is None:
            return "plain"
        try:
            ack = await self._publish(
                f"a plain copy of {what}",
                subjects.start,
                held,
                start_copy_id(eid),
                headers={EXPECTED_LAST_SUBJECT_SEQUENCE: "0"},
            )
        except Exception as e:
            if not subject_taken(e):
                raise
            return "copied_before"  # `in.start` holds a start already
        return "copied_before" if ack.duplicate else "copied"


__all__ = ["RollbackReport", "Rollbacks"]
