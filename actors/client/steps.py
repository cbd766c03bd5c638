"""A step's whole story, folded from its execution's log: its args as rendered, every
attempt (start, end, worker, result or error with its traceback, what it printed),
the retries scheduled between them, the on_error decisions and failure rules that
fired, how it exited; a loop step's done/total/failed from the counter's verdict (the
iterations themselves stay in the loop's log). `actors-cli describe` and the web UI's
step panel both show it.

`fold_stories` is pure (log items and the commands the decisions hold in, stories
out); `StepStories.step_stories` reads the log and folds it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from actors.client.checks import check_execution_id
from actors.client.logview import LogItem, log_items
from actors.client.outcome import ExecutionNotFound
from actors.client.reading import Reader
from actors.errors import UserError
from actors.wire.codec import PayloadUnreadable
from actors.wire.events import EventType, embedded_command
from actors.wire.messages import Command, command_decoder
from streams.layout import EV, IN, LC, class_of
from streams.subjects import OUT, is_answer_record

__all__ = ["Attempt", "StepStories", "StepStory", "UnknownStep", "fold_stories"]


class UnknownStep(UserError):
    """The execution has no step of that name in its log."""


@dataclass(slots=True)
class Attempt:
    """One attempt of a step: one command, its answer, what it printed, and what the
    step's rules made of its failure."""

    number: int
    command_id: str
    activation: int
    kind: str
    issued_at: float
    args: dict[str, Any] | None = None  # as rendered (None: not in the log, e.g. held in a blob)
    started_at: float | None = None
    ended_at: float | None = None
    worker: str | None = None
    state: str = "RUNNING"  # RUNNING | COMPLETED | FAILED
    result: Any = None
    error: dict[str, Any] | None = None  # type, message, traceback
    output: dict[str, Any] | None = None  # size, head, tail
    decision: dict[str, Any] | None = None  # the on_error decision: decision, rule, delay
    retry: dict[str, Any] | None = None  # the retry it scheduled: delay, due, rule, reason

    def to_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "command_id": self.command_id,
            "activation": self.activation,
            "kind": self.kind,
            "issued_at": self.issued_at,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "duration": _duration(self.started_at, self.ended_at),
            "worker": self.worker,
            "state": self.state,
            "args": self.args,
            "result": self.result,
            "error": self.error,
            "output": self.output,
            "decision": self.decision,
            "retry": self.retry,
        }


@dataclass(slots=True)
class StepStory:
    """Everything the log says of one step (every visit of it, in a cycle)."""

    step: str
    state: str = "RUNNING"  # the last visit's: RUNNING | COMPLETED | FAILED | CANCELLED | SKIPPED ...
    kind: str | None = None
    entered_at: float | None = None
    exited_at: float | None = None
    visits: int = 0
    attempts: list[Attempt] = field(default_factory=list)
    error: dict[str, Any] | None = None  # how it failed, as its exit says
    exit: dict[str, Any] | None = None  # status, reason, next, failure_route, handled, ignored_error
    retry_exhausted: dict[str, Any] | None = None  # attempts, max_attempts, rule
    loop: dict[str, Any] | None = None  # size, mode, done, total, succeeded, failed, errors (the verdict's first)
    # a wait step's last wait (`tool: wait`): signal, key, since, deadline, approval, state
    # (WAITING, SIGNALLED, TIMED_OUT, UNTIL, ENDED) and the signal it took (`received`)
    wait: dict[str, Any] | None = None
    waits: int = 0  # a wait step's attempts: each waited (`step.waiting`) or ended at once

    @property
    def attempt_count(self) -> int:
        """Its attempts: a command's, or a wait step's (which issues no command)."""
        return len(self.attempts) or self.waits

    @property
    def duration(self) -> float | None:
        return _duration(self.entered_at, self.exited_at)

    @property
    def args(self) -> dict[str, Any] | None:
        """The last attempt's args, as rendered."""
        return self.attempts[-1].args if self.attempts else None

    @property
    def result(self) -> Any:
        done = [a for a in self.attempts if a.state == "COMPLETED"]
        if not done and self.wait is not None and self.wait.get("received"):
            return self.wait["received"].get("data")  # a wait step's result: the signal's data
        return done[-1].result if done else None

    @property
    def error_type(self) -> str | None:
        if self.error is not None:
            return str(self.error.get("type"))
        failed = [a for a in self.attempts if a.error is not None]
        return str(failed[-1].error.get("type")) if failed and failed[-1].error else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "state": self.state,
            "kind": self.kind,
            "entered_at": self.entered_at,
            "exited_at": self.exited_at,
            "duration": self.duration,
            "visits": self.visits,
            "args": self.args,
            "result": self.result,
            "error": self.error,
            "exit": self.exit,
            "retry_exhausted": self.retry_exhausted,
            "loop": self.loop,
            "wait": self.wait,
            "attempt_count": self.attempt_count,
            "attempts": [a.to_dict() for a in self.attempts],
        }


def _duration(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else max(0.0, end - start)


def _error(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        return None
    return {k: value.get(k) for k in ("type", "message", "traceback", "status", "retryable") if k in value}


def fold_stories(items: list[LogItem], commands: dict[str, Command] | None = None) -> dict[str, StepStory]:
    """Each step's story, in the order the steps were first entered. `commands`: the
    commands the decision records hold, by command id (their rendered args)."""
    commands = commands or {}
    stories: dict[str, StepStory] = {}
    attempts: dict[str, Attempt] = {}  # by command id
    last: dict[str, Attempt] = {}  # by step: the attempt a failure decision or retry follows

    def story(step: str) -> StepStory:
        found = stories.get(step)
        if found is None:
            found = stories[step] = StepStory(step)
        return found

    signals: dict[str, dict[str, Any]] = {}  # signals in the log, by id: what a wait took
    for it in items:
        step, d = it.step, it.data
        if it.cls == IN and it.type == "signal.sent":
            signals.setdefault(str(d.get("signal_id")), d)
            continue
        if it.type in _STOPS_ALL and step is None:
            # a cancel (or an engine fault) stops every live step and writes no
            # `step.exit` for them: a step still running (waiting, sleeping, its command
            # running) ends here, cancelled
            for s in stories.values():
                _cancelled(s, it.at)
            continue
        if step is None and it.type != "timer.fired":
            continue
        if it.cls == EV and step is not None:
            s = story(step)
            if it.type == EventType.STEP_ENTER:
                s.visits += 1
                s.state, s.entered_at, s.exited_at = "RUNNING", it.at, None
            elif it.type == EventType.STEP_EXIT:
                s.state, s.exited_at = str(d.get("status")), it.at
                if s.wait is not None and s.wait.get("state") == "WAITING":
                    s.wait["state"] = "ENDED"  # cancelled, aborted: the wait ended with its step
                s.exit = {k: v for k, v in d.items() if k not in ("activation", "error")}
                s.error = _error(d.get("error"))
                if s.kind is None and s.state == "COMPLETED" and not s.attempts:
                    s.kind = "noop"  # decided by the engine itself: a router or data step
            elif it.type == EventType.COMMAND_CANCELLED:
                _cancelled(s, it.at)  # its step.exit, if any (an abort), follows
            elif it.type == EventType.COMMAND_ISSUED:
                cid = str(d.get("command_id"))
                cmd = commands.get(cid)
                a = Attempt(
                    number=int(d.get("attempt_number") or 1),
                    command_id=cid,
                    activation=int(d.get("activation") or 0),
                    kind=str(d.get("kind")),
                    issued_at=it.at,
                    args=cmd.args if cmd is not None and cmd.body_ref is None else None,
                )
                if d.get("child_execution_id"):
                    a.worker = f"execution {d['child_execution_id']}"
                s.kind = a.kind
                s.attempts.append(a)
                attempts[cid] = last[step] = a
            elif it.type == EventType.ITERATOR_STARTED:
                s.kind = "loop"
                s.loop = {
                    "loop_id": d.get("loop_id"),
                    "size": d.get("size"),
                    "mode": d.get("mode"),
                    "tolerated_failures": d.get("tolerated_failures"),
                    "total": d.get("size"),
                    "done": 0,
                    "succeeded": 0,
                    "failed": 0,
                    "state": "RUNNING",
                }
            elif it.type in _WAIT_EVENTS:
                _waited(s, it, signals)
            elif it.type == EventType.ITERATOR_COMPLETED and s.loop is not None:  # an empty collection
                s.loop.update(total=0, done=0, state="COMPLETED")
            elif it.type == EventType.RETRY_SCHEDULED:
                before = last.get(step)
                if before is not None:
                    before.retry = {k: d.get(k) for k in ("delay", "due", "rule", "reason")}
            elif it.type == EventType.RETRY_EXHAUSTED:
                s.retry_exhausted = {k: d.get(k) for k in ("attempts", "max_attempts", "rule")}
            elif it.type == EventType.FAILURE_DECIDED:
                before = last.get(step)
                if before is not None:
                    before.decision = {k: d[k] for k in ("decision", "rule", "delay") if k in d}
        elif it.cls == IN and step is not None:
            if it.type in ("call.done", "call.error"):
                answered = attempts.get(str(d.get("command_id")))
                if answered is None:
                    continue
                answered.started_at, answered.ended_at = d.get("started_at") or None, d.get("ended_at") or None
                answered.worker = answered.worker or d.get("worker") or None
                if it.type == "call.done":
                    answered.state, answered.result = "COMPLETED", d.get("result")
                else:
                    answered.state, answered.error = "FAILED", _error(d.get("error"))
            elif it.type in ("iterator.completed", "iterator.failed"):
                s = story(step)
                loop = s.loop if s.loop is not None else {}
                loop.update(
                    total=d.get("total"),
                    succeeded=d.get("succeeded"),
                    failed=d.get("failed"),
                    done=int(d.get("succeeded") or 0) + int(d.get("failed") or 0),
                    not_run=d.get("not_run", 0),
                    tolerated=d.get("tolerated", 0),
                    errors=[{"index": e.get("index"), "error": _error(e.get("error"))} for e in d.get("errors") or []],
                    state="COMPLETED" if it.type == "iterator.completed" else "FAILED",
                )
                s.loop = loop
        elif it.cls == OUT and step is not None:
            printed = attempts.get(str(d.get("command_id")))
            if printed is not None and d.get("iteration_index") is None:
                printed.output = {k: d.get(k) for k in ("size", "head", "tail", "output_ref")}
    return stories


# a wait's decisions (actors/wire/events.py: step.waiting, signal.received, wait.ended)
_WAIT_EVENTS = ("step.waiting", "signal.received", "wait.ended")
# what stops every live step of an execution without a `step.exit` of theirs
_STOPS_ALL = (EventType.EXECUTION_CANCELLED.value, EventType.ENGINE_FAULT.value)


def _cancelled(s: StepStory, at: float) -> None:
    """The step's activation was cancelled: a step still running ends CANCELLED, and a
    wait it waited on ENDED."""
    if s.state != "RUNNING":
        return
    s.state, s.exited_at = "CANCELLED", at
    if s.wait is not None and s.wait.get("state") == "WAITING":
        s.wait["state"] = "ENDED"
        s.wait["ended_at"] = at
    if s.loop is not None and s.loop.get("state") == "RUNNING":
        s.loop["state"] = "CANCELLED"


def _waited(s: StepStory, it: LogItem, signals: dict[str, dict[str, Any]]) -> None:
    """A wait step's story: the wait it started, the signal it took, its timer."""
    d = it.data
    if it.type == "step.waiting":
        if not d.get("loop_id"):
            s.waits += 1
        s.kind = "wait"
        s.wait = {
            "signal": d.get("signal"),
            "key": d.get("key") or "",
            "since": it.at,
            "deadline": d.get("deadline"),
            "approval": bool(d.get("approval")),
            "attempt_number": d.get("attempt_number"),
            "loop_id": d.get("loop_id"),
            "state": "WAITING",
            "received": None,
        }
        return
    wait = s.wait if s.wait is not None else {}
    if wait.get("state") != "WAITING":
        s.waits += 1  # an attempt that ended at once: a kept signal taken, an `until` past
    if it.type == "signal.received":
        sent = signals.get(str(d.get("signal_id")), {})
        wait["state"] = "SIGNALLED"
        wait["received"] = {
            "signal_id": d.get("signal_id"),
            "name": d.get("name"),
            "key": d.get("key"),
            "by": d.get("by"),
            "sent_at": d.get("sent_at"),
            "at": it.at,
            "kept": bool(d.get("kept")),
            "data": sent.get("data"),
        }
    else:  # wait.ended: its timer fired
        wait["state"] = "UNTIL" if d.get("reason") == "until" else "TIMED_OUT"
        wait["ended_at"], wait["due"] = it.at, d.get("due")  # due: the date it waited for
    s.wait = wait


class StepStories(Reader):
    """`step_stories`, `step_story`."""

    async def step_stories(self, execution_id: str) -> list[StepStory]:
        """Every step of the execution its log names, in the order first entered, each
        with its whole story (`StepStory`). ExecutionNotFound for an id with no log."""
        log = self.layout.execution(check_execution_id(execution_id)).log
        found: list[tuple[LogItem | None, Command | None]] = await self._ride(
            f"reading the steps of execution {execution_id}",
            lambda: self._read_all(
                self.layout.exec_stream_of(execution_id), log, self._story_records, execution_id=execution_id
            ),
        )
        if not found:
            raise ExecutionNotFound(f"no execution {execution_id!r} (not started, or not recorded yet)")
        items = [i for i, _ in found if i is not None]
        commands = {c.command_id: c for _, c in found if c is not None}
        return list(fold_stories(items, commands).values())

    async def step_story(self, execution_id: str, step: str) -> StepStory:
        """One step's story; UnknownStep when the execution's log has no such step."""
        stories = await self.step_stories(execution_id)
        for s in stories:
            if s.step == step:
                return s
        names = ", ".join(s.step for s in stories) or "none yet"
        raise UnknownStep(f"execution {execution_id} has no step {step!r} (its steps: {names})")

    def _story_records(self, subject: str, data: bytes, seq: int, at: float) -> list[tuple[Any, Any]]:
        out: list[tuple[Any, Any]] = [(i, None) for i in log_items(subject, data, seq, at, self.codec)]
        # a decision record, a lifecycle event carrying one, or a result stored with its decision
        if class_of(subject) in (EV, LC) or is_answer_record(subject):
            try:
                held = embedded_command(data)
            except msgspec.DecodeError:
                held = None
            if held is not None:
                try:
                    cmd = self.codec.decode(command_decoder, held)
                except PayloadUnreadable:  # a key this reader lacks: the args show as encrypted
                    cmd = self.codec.open_for_display(command_decoder.decode(held))
                except msgspec.DecodeError:
                    cmd = None
                if cmd is not None:
                    out.append((None, cmd))
        return out
