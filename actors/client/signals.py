"""`Client.signal`: send a signal to an execution, for a step that waits for it (`tool:
wait`, docs/language.md "Waiting: signals, approvals and timers"); `Client.approve`:
answer a waiting approval step (`approval: true`), as `actors-cli approve`/`reject` and
the web UI's buttons do.

A signal is an input in the execution's log (`exec.<p>.<id>.in.signal`, Nats-Msg-Id
`signal_msg_id`): sent twice under one `signal_id` it is one signal. It is checked
before anything is written: its name and ids; that the execution exists (a start still
queued in stream START counts: the signal is kept for it) and is not finished (refused:
`accepted=False` with its status, nothing written); that it was not retired (its log is
gone: a signal would be the one record left of it, for ever); and that every live
engine and counter pod knows signals (an older pod would not decode the input).

The gateway answers `execution.signal` requests with this same call
(actors/gateway/answers.py), so a client of any language gets the same checks."""

from __future__ import annotations

import hashlib
import re
import time
import unicodedata
import uuid
from typing import Any

from nats.js.errors import KeyNotFoundError

from actors.client.checks import check_execution_id, check_size
from actors.client.outcome import ExecutionNotFound
from actors.client.retrying import Retrier
from actors.errors import UserError
from actors.natsio.batchget import from_sequence
from actors.playbook.model import SIGNAL_NAME
from actors.store.records import status_record
from actors.wire.events import TERMINAL_STATES
from actors.wire.messages import ExecutionStatus, SignalReply, SignalSent, WaitInfo
from actors.wire.nesting import check_value_depth
from streams.ids import signal_msg_id
from streams.layout import STATUS_BUCKET

__all__ = [
    "ExecutionNotKnownYet",
    "InvalidSignal",
    "NotWaiting",
    "SignalRefused",
    "Signals",
    "approval_signal_id",
    "clean_text",
]

SIGNAL_ID = r"^[A-Za-z0-9_.:=+@-]{1,200}$"  # becomes part of a Nats-Msg-Id: no spaces, no line ends
MAX_KEY = 1000  # characters of a signal's key (shown in statuses and `events`)
MAX_BY = 200  # characters of who sent it
MAX_COMMENT = 1000  # characters of an approval's comment
FEATURE_CACHE = 30.0  # seconds a client trusts that every engine and counter pod knows signals
QUEUED_LOOKUP = 5.0  # seconds a signal for an id with no start record waits for a long queue of starts
SIGNALS_FEATURE = "signals"  # what engine and counter pods name in their member entries when they know signals
_SIGNAL_ID = re.compile(SIGNAL_ID)


class InvalidSignal(UserError, ValueError):
    """A signal's name, key, id or sender that cannot be sent (the message says which)."""


class SignalRefused(UserError):
    """No signal can be sent now: an engine or counter pod runs code that does not know
    signals (finish the upgrade first)."""


class ExecutionNotKnownYet(ExecutionNotFound):
    """Whether the execution exists cannot be told yet: more starts are queued than are
    looked through, and its start record did not come meanwhile. Asking again is safe."""


class NotWaiting(UserError):
    """`approve`/`reject` of an execution with no approval step waiting (or not the one
    named)."""


def clean_text(text: str, *, limit: int, what: str) -> str:
    """`text` on one line, without control characters (a terminal's escapes), trimmed;
    InvalidSignal past `limit` characters."""
    plain = "".join(" " if unicodedata.category(c) in ("Cc", "Cf") else c for c in text)
    plain = " ".join(plain.split())
    if len(plain) > limit:
        raise InvalidSignal(f"{what} is at most {limit:,} characters ({len(plain):,} given)")
    return plain


def approval_signal_id(wait: WaitInfo, key: str | None = None) -> str:
    """The id of the answer to one approval wait: approving (or rejecting) the same wait
    twice, from the CLI and the UI at once, is one signal, the first; a later wait of the
    step (a retry, a cycle) starts later and gets an answer of its own. A loop of
    approvals waits once for all its iterations: each iteration's answer (its `key`)
    has an id of its own."""
    step = hashlib.sha256(wait.step.encode()).hexdigest()[:16]
    sid = f"approval-{step}-{wait.activation}-{round(wait.since * 1000)}"
    if wait.loop and key is not None:
        sid += "-" + hashlib.sha256(key.encode()).hexdigest()[:16]
    return sid


class Signals(Retrier):
    """`signal`, `approve`."""

    # until when (time.monotonic) every live engine and counter pod was seen to know
    # signals: one client's signals read the owners bucket once per FEATURE_CACHE, not
    # each time (that read was most of a signal's cost). Only this positive answer is
    # kept: while any pod lacks the feature the check runs on every signal and refuses
    # it. The gate is for a rolling upgrade, where the older pods are live before the
    # first signal; what the cache lets through is an older pod started (a rollback)
    # within FEATURE_CACHE of a check that found none
    _signals_known_until: float = -1.0

    async def signal(
        self,
        execution_id: str,
        name: str,
        data: Any = None,
        *,
        key: str = "",
        signal_id: str | None = None,
        by: str = "",
    ) -> SignalReply:
        """Send signal `name` (with `data`, and `key` for a step that waits on one) to the
        execution. `accepted`: it is in the execution's log (a step waiting for it takes
        it; else the execution keeps it for a later wait). Not accepted: the execution has
        ended (`status` says how) and nothing was written. `signal_id`: the same id sent
        again is one signal (default: a new uuid4 hex): `duplicate` says that one of this
        id was in the log already (within the streams' duplicate window), so this one was
        not written and the first stands (this call's own copy, stored before a lost
        PubAck, is not a duplicate). Raises InvalidSignal (a bad
        name, key, id or sender), InvalidExecutionId, TooLarge / TooDeep (the data),
        ExecutionNotFound (no such execution, or retired), SignalRefused (a pod runs code
        older than signals); NatsUnavailable as every call does."""
        eid = check_execution_id(execution_id)
        sid = self.check_signal(name, key, signal_id, by)
        check_value_depth("the signal's data", data)
        by = clean_text(by, limit=MAX_BY, what="a signal's sender (by)")
        msg = SignalSent(execution_id=eid, signal_id=sid, name=name, key=key, data=data, sent_at=time.time(), by=by)
        encoded = self.codec.encode(msg)
        check_size(f"signal {name!r}", len(encoded), self.value_limit())
        if time.monotonic() >= self._signals_known_until:
            older = await self._ride("reading which pods run", lambda: self._pods_lacking(SIGNALS_FEATURE))
            if older:
                shown = ", ".join(older[:5]) + (f" and {len(older) - 5} more" if len(older) > 5 else "")
                raise SignalRefused(
                    f"a signal needs every engine and counter pod to know signals; these run older code: {shown} "
                    "(finish the upgrade first, docs/upgrades.md)"
                )
            self._signals_known_until = time.monotonic() + FEATURE_CACHE
        # one status read: the archive and the queued starts are looked at only when the
        # execution has no status (retired, not started yet, or no such execution)
        status = await self._ride(f"reading the status of execution {eid}", lambda: self._live_status(eid))
        if status is not None and status.state in TERMINAL_STATES:
            return SignalReply(execution_id=eid, signal_id=sid, accepted=False, status=status)
        if status is None:
            await self._ride(f"looking up execution {eid}", lambda: self._check_exists(eid))
        ack = await self._publish(
            f"signal {name!r} to execution {eid}", self.layout.execution(eid).signal, encoded, signal_msg_id(eid, sid)
        )
        duplicate = bool(ack.duplicate) and not await self._ride(
            f"reading signal {sid} of execution {eid}",
            lambda: self._stored_is(ack.stream or self.layout.exec_stream_of(eid), ack.seq, encoded),
        )
        return SignalReply(execution_id=eid, signal_id=sid, accepted=True, status=status, duplicate=duplicate)

    async def _stored_is(self, stream: str, seq: int, encoded: bytes) -> bool:
        """Whether the message the stream holds at `seq` (the first of a signal's id, as a
        duplicate's PubAck names it) is this very message: a publish sent again because
        its first PubAck was lost is answered `duplicate`, though what stands is ours.
        Another sender's (another approval of the same wait) differs, if only in its
        `sent_at`. A message that cannot be read is taken as another's: a `duplicate`
        said wrongly asks the user to look; a success said wrongly hides a lost answer."""
        if seq <= 0:
            return False
        got = await from_sequence(self.nc, stream, seq, 1)
        return bool(got) and got[0][0] == seq and got[0][1] == encoded

    @staticmethod
    def check_signal(name: str, key: str = "", signal_id: str | None = None, by: str = "") -> str:
        """The signal's id (a new one when None), once its name, key and id pass."""
        if not isinstance(name, str) or not SIGNAL_NAME.fullmatch(name):
            raise InvalidSignal(
                f"signal name {str(name)[:80]!r} is not valid: letters, digits, `_` and `-`, at most 64 characters"
            )
        if not isinstance(key, str) or len(key) > MAX_KEY or not key.isprintable():
            raise InvalidSignal(f"a signal's key is printable text of at most {MAX_KEY:,} characters")
        if not isinstance(by, str):
            raise InvalidSignal("a signal's sender (by) is text")
        sid = uuid.uuid4().hex if signal_id is None else signal_id
        if not isinstance(sid, str) or not _SIGNAL_ID.fullmatch(sid):
            raise InvalidSignal(f"signal id {str(sid)[:80]!r} is not valid: it must match {SIGNAL_ID}")
        return sid

    async def _live_status(self, execution_id: str) -> ExecutionStatus | None:
        """The status KV holds (not the archive's: a retired execution is not signalled)."""
        kv = await self.bucket(STATUS_BUCKET)
        try:
            entry = await kv.get(execution_id)
        except KeyNotFoundError:
            return None
        return self.codec.open_for_display(status_record(entry.value or b"", key=execution_id))

    async def _check_exists(self, execution_id: str) -> None:
        """An execution with no status yet: its start record is written (the projector's
        lag), or its start waits in stream START; else ExecutionNotFound (retired, or no
        such execution) or ExecutionNotKnownYet."""
        if await self.archives.has(execution_id):
            raise ExecutionNotFound(
                f"execution {execution_id} was retired after its retention: it takes no more signals"
            )
        if await self._start_record(execution_id) is not None:
            return
        queued = await self.start_queued(execution_id)
        if queued:
            return  # kept in its log for it: its start record comes after, and its waits take it
        found = await self._exists(execution_id, QUEUED_LOOKUP) if queued is None else False
        if found is None:
            raise ExecutionNotKnownYet(
                f"cannot tell yet whether execution {execution_id!r} exists (starts are still queued): ask again"
            )
        if not found:
            raise ExecutionNotFound(f"no execution {execution_id!r}: nothing to signal")

    async def approve(
        self,
        execution_id: str,
        step: str | None = None,
        *,
        approved: bool = True,
        comment: str = "",
        by: str = "",
        signal_id: str | None = None,
        key: str | None = None,
    ) -> SignalReply:
        """Answer the execution's waiting approval step (`approval: true`; `step` when
        more than one waits): its signal, with data `{approved, comment, by}`. A loop of
        approvals is answered one iteration at a time: `key` is the iteration's (its
        wait's rendered `key`); a step that waits on a key may be named by it too. A
        rejection (`approved=False`) fails the step with `Rejected`. The signal's id is
        the wait's own (`approval_signal_id`) unless given: answering one wait twice is
        one answer, the first: the second's reply says `duplicate` (someone answered
        first; the step took that answer). Not accepted (nothing sent) for an execution
        that has ended. InvalidSignal for a rejection whose comment is blank.
        NotWaiting when no approval step waits (yet: a status is recorded a moment
        after the step starts waiting), none named `step` (or waiting on `key`), or the
        one that waits is a loop of approvals and no `key` is given."""
        eid = check_execution_id(execution_id)
        if key is not None:
            self.check_signal("approval", key)  # InvalidSignal for a key no signal can carry
        comment = clean_text(comment, limit=MAX_COMMENT, what="an approval's comment")
        if not approved and not comment:  # blank once cleaned: spaces, control characters
            raise InvalidSignal("a rejection needs a comment: say why")
        by = clean_text(by, limit=MAX_BY, what="an approval's sender (by)")
        status = await self._ride(f"reading the status of execution {eid}", lambda: self._live_status(eid))
        if status is None:
            await self._ride(f"looking up execution {eid}", lambda: self._check_exists(eid))
            raise NotWaiting(f"execution {eid} has not started yet: no approval step waits")
        if status.state in TERMINAL_STATES:
            return SignalReply(execution_id=eid, signal_id=None, accepted=False, status=status)
        wait = approval_wait(status, step, key)
        assert wait.signal is not None  # an approval waits for a signal (WaitTool)
        data = {"approved": approved, "comment": comment, "by": by}
        sid = signal_id if signal_id is not None else approval_signal_id(wait, key)
        answer_key = key if wait.loop and key is not None else wait.key
        return await self.signal(eid, wait.signal, data, key=answer_key, signal_id=sid, by=by)


def approval_wait(status: ExecutionStatus, step: str | None, key: str | None = None) -> WaitInfo:
    """The approval wait of `status` that `step` names (the only one when None) and,
    given `key`, that waits on it (a loop of approvals waits on each iteration's key:
    which ones the status does not list, so any key is its), or NotWaiting saying what
    does wait. Without `key` a loop of approvals is not answered: which iteration?"""
    waits = [w for w in status.waiting or [] if w.signal is not None and w.approval]
    named = [w for w in waits if step is None or w.step == step]
    if key is None:
        approvals = [w for w in named if not w.loop]
    else:
        approvals = [w for w in named if w.loop or w.key == key]
    if len(approvals) == 1:
        return approvals[0]
    eid = status.execution_id
    if approvals:
        names = ", ".join(sorted({w.step for w in approvals}))
        raise NotWaiting(f"execution {eid} waits for approval in more than one step ({names}): name the step")
    loops = sorted({w.step for w in named if w.loop})
    if key is None and len(loops) == 1:
        raise NotWaiting(f"step {loops[0]!r} is a loop of approvals: answer one with --key ITEM_KEY")
    if key is None and loops:
        names = ", ".join(loops)
        raise NotWaiting(f"steps {names} are loops of approvals: name the step and answer one with --key ITEM_KEY")
    others = ", ".join(sorted({_shown(w) for w in waits})) or "none"
    asked = f"approval step {step!r}" if step is not None else "approval step"
    on = f" waiting on key {key!r}" if key is not None else " waiting"
    if step is not None or key is not None:
        raise NotWaiting(f"execution {eid} has no {asked}{on} (approval steps waiting: {others})")
    raise NotWaiting(f"execution {eid} is {status.state} and no approval step waits")


def _shown(wait: WaitInfo) -> str:
    """An approval wait as a NotWaiting error names it: its step, and what key it waits on."""
    if wait.loop:
        return f"{wait.step} (a loop: --key ITEM_KEY)"
    return f"{wait.step} (key {wait.key!r})" if wait.key else wait.step
