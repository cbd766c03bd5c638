"""A pure harness for the engine's semantics: synthetic inputs in, decisions out.

Like a workflow replayer, it drives the pure cores the way their shells do, with no
NATS, no I/O and no sleeps: the engine's `fold` (actors/core/decide.py, as
actors/engine/actor.py calls it) and the counter's `fold_loop` (actors/core/loop.py,
as actors/counter.py calls it). The harness plays every other part itself:
* the log: each input gets a stream sequence and a log time from a synthetic clock,
  which moves only when a durable timer is due (then it jumps to the timer's `due`);
* tool actors: a command is answered by the test's tool function (`Call` in, a result
  out, or `Fail` raised, or `PENDING`: the command runs until it is cancelled, then it
  answers `Cancelled` as a stopped tool does), a chunk answered item by item;
* the counter: a loop handed over becomes a `LoopRun` folded by `fold_loop`, its
  verdict fed back to the execution;
* the starter: `tool: playbook` starts a child execution from the harness's catalog,
  and the child's end goes back to the parent's command; cancels are delivered.

Every touch of the core's API is in this module; tests see a stable view (`Run`:
status, result, error, the log as plain `Item`s, the tool calls made), so a change of
the core's types changes this file, not the tests. `replay(run)` folds a run's
recorded inputs again into fresh state and says whether every decision came out the
same (the determinism property), for any run.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from actors.core.decide import Output, fold
from actors.core.effects import CommandCancel, Timer
from actors.core.loop import LoopOutput, LoopRun, fold_loop
from actors.core.state import Execution
from actors.playbook.loader import parsed_playbook
from actors.playbook.templates import call_with_limits
from actors.wire import (
    CallDone,
    CallError,
    CancelRequest,
    ChunkDone,
    Command,
    ErrorInfo,
    IterationOutcome,
    Limits,
    LoopSpec,
    StartMessage,
    StartRecord,
)

START_TIME = 1_000.0  # the synthetic clock's first reading (log time, epoch seconds)
PENDING = object()  # a tool function's answer for "still running": no result until cancelled
TERMINAL_EVENTS = {"playbook.completed": "COMPLETED", "playbook.failed": "FAILED", "execution.cancelled": "CANCELLED"}


class Fail(Exception):
    """Raised by a tool function: the attempt fails with this error."""

    def __init__(self, type_: str, message: str = "", *, retryable: bool = False, status: int | None = None) -> None:
        super().__init__(message)
        self.error = ErrorInfo(type=type_, message=message or type_, retryable=retryable, status=status)


@dataclass(frozen=True)
class Call:
    """One run of a tool, as a tool actor would see it (one item of a chunk, one
    iteration, or a plain step's attempt)."""

    execution_id: str
    step: str
    kind: str
    tool: dict[str, Any]
    args: dict[str, Any]
    attempt: int
    command_id: str
    iteration: int | None = None
    element: Any = None
    timeout: float | None = None
    chunked: bool = False


Tool = Callable[[Call], Any]


@dataclass(frozen=True)
class Item:
    """One entry of an execution's log: an input (`cls` "in"), an event of a decision
    record ("ev") or a lifecycle event ("lc"); `data` is plain JSON-like data."""

    cls: str
    type: str
    step: str | None
    data: dict[str, Any]
    at: float
    seq: int


@dataclass
class Run:
    """What happened to one execution: its log and the tool calls made for it."""

    execution_id: str
    items: list[Item] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)  # command ids the engine or counter stopped
    children: list[str] = field(default_factory=list)  # child execution ids, in start order
    # for replay: the inputs folded, in order, with their sequence and log time
    inputs: list[tuple[Any, int, float]] = field(default_factory=list, repr=False)
    outputs: list[Any] = field(default_factory=list, repr=False)  # plain data of each decision
    loops: dict[str, list[tuple[Any, float, Any]]] = field(default_factory=dict, repr=False)

    def events(self, type_: str | None = None, step: str | None = None) -> list[Item]:
        return [i for i in self.items if (type_ is None or i.type == type_) and (step is None or i.step == step)]

    def lifecycle(self) -> list[str]:
        return [i.type for i in self.items if i.cls == "lc"]

    def exits(self) -> list[tuple[str | None, str]]:
        """(step, status) of every `step.exit`, in order."""
        return [(i.step, i.data["status"]) for i in self.events("step.exit")]

    def entered(self) -> list[str | None]:
        return [i.step for i in self.events("step.enter")]

    def ended(self) -> Item | None:
        """The lifecycle event that ended the execution, if it ended."""
        ends = [i for i in self.items if i.cls == "lc" and i.type in TERMINAL_EVENTS]
        return ends[-1] if ends else None

    @property
    def status(self) -> str:
        end = self.ended()
        if end is None:
            return "RUNNING" if self.items else "PENDING"
        return TERMINAL_EVENTS[end.type]

    @property
    def result(self) -> Any:
        end = self.ended()
        return end.data.get("result") if end is not None else None

    @property
    def error(self) -> dict[str, Any] | None:
        end = self.ended()
        return end.data.get("error") if end is not None and end.type == "playbook.failed" else None


def _plain(value: Any) -> Any:
    return msgspec.to_builtins(value)


def _item(cls: str, raw: dict[str, Any], seq: int, at: float) -> Item:
    """A log entry from an input or an event, as plain data."""
    if cls == "in":
        raw = dict(raw)
        return Item(cls, raw.pop("type"), raw.get("step"), raw, at, seq)
    return Item(cls, raw["type"], raw.get("step"), dict(raw.get("data", {})), raw["at"], raw["cause"])


class Harness:
    """Runs executions to quiescence on the pure cores. `tools` answers commands: one
    function for every call, or a mapping step -> function, constant result, `Fail`
    (every attempt fails so) or PENDING; a step it does not name answers like `noop`
    (its args). `playbooks`: the catalog
    `tool: playbook` resolves paths in."""

    def __init__(self, tools: Tool | dict[str, Any] | None = None, *, playbooks: dict[str, str] | None = None,
                 limits: Limits | None = None) -> None:
        self.tools = tools if tools is not None else {}
        self.playbooks = dict(playbooks or {})
        self.limits = limits or Limits()
        self.now = START_TIME
        self.runs: dict[str, Run] = {}
        self._states: dict[str, Execution] = {}
        self._loops: dict[tuple[str, str], LoopRun] = {}
        self._seq = 0
        self._queue: deque[tuple[tuple[str, ...], Any]] = deque()  # (target, input) in arrival order
        self._timers: list[tuple[float, int, tuple[str, ...], Any]] = []
        self._running: dict[str, tuple[tuple[str, ...], Command, Call]] = {}  # PENDING commands by id
        self._ids = 0
        self._last = ""  # the execution `run()` reports on

    # --- what tests call ------------------------------------------------------------

    def start(self, source: str, payload: dict[str, Any] | None = None, *, execution_id: str | None = None,
              path: str = "pb") -> str:
        """Queue an execution's start record; `run()` then runs it."""
        self._ids += 1
        eid = execution_id or f"e{self._ids}"
        self._deliver(("exec", eid), StartRecord(execution_id=eid, playbook_path=path, playbook_source=source,
                                                  payload=payload or {}, limits=self.limits))
        self.runs[eid] = Run(eid)
        self._last = eid
        return eid

    def run(self, source: str | None = None, payload: dict[str, Any] | None = None, *,
            until: Callable[[Harness], bool] | None = None) -> Run:
        """Start `source` (if given) and fold until nothing is left to do (or `until`
        holds); timers fire as the clock reaches them. Returns the (last started) run."""
        eid = self.start(source, payload) if source is not None else self._last
        while not (until is not None and until(self)):
            if self._queue:
                target, inp = self._queue.popleft()
                self._fold(target, inp)
            elif self._timers:
                due, _, target, fire = heapq.heappop(self._timers)
                self.now = max(self.now, due)
                self._fold(target, fire)
            else:
                break
        return self.runs[eid]

    def cancel(self, execution_id: str, reason: str = "") -> None:
        self._deliver(("exec", execution_id), CancelRequest(execution_id=execution_id, reason=reason))

    def running(self) -> list[Call]:
        """Calls still running (their tool answered PENDING), oldest first."""
        return [call for _, _, call in self._running.values()]

    def answer(self, command_id: str, result: Any = None, *, error: Fail | None = None) -> None:
        """Answer a PENDING command now."""
        target, cmd, call = self._running.pop(command_id)
        self._deliver(target, self._reply(cmd, call, result, error))

    # --- the log --------------------------------------------------------------------

    def _deliver(self, target: tuple[str, ...], inp: Any) -> None:
        self._queue.append((target, inp))

    def _fold(self, target: tuple[str, ...], inp: Any) -> None:
        self._seq += 1
        seq, at = self._seq, self.now
        if target[0] == "exec":
            self._fold_execution(target[1], inp, seq, at)
        else:
            self._fold_loop(target[1], target[2], inp, at)

    def _fold_execution(self, eid: str, inp: Any, seq: int, at: float) -> None:
        run = self.runs.setdefault(eid, Run(eid))
        ex = self._states.setdefault(eid, Execution(execution_id=eid))
        out = fold(ex, inp, seq=seq, at=at, reply_to=_reply_to(eid))
        plain = _plain(out)
        run.inputs.append((inp, seq, at))
        run.outputs.append(plain)
        run.items.append(_item("in", _plain(inp), seq, at))
        run.items += [_item("ev", e, seq, at) for e in plain["events"]]
        run.items += [_item("lc", e, seq, at) for e in plain["lifecycle"]]
        self._effects(("exec", eid), run, out)

    def _fold_loop(self, eid: str, loop_id: str, inp: Any, at: float) -> None:
        run = self.runs[eid]
        state = self._loops.setdefault((eid, loop_id), LoopRun(execution_id=eid, loop_id=loop_id))
        out = _counter_fold(state, inp, at)
        run.loops.setdefault(loop_id, []).append((inp, at, _plain(out)))
        self._loop_effects(("loop", eid, loop_id), run, out)

    # --- what the shells do with a decision ---------------------------------------------

    def _effects(self, here: tuple[str, ...], run: Run, out: Output) -> None:
        self._work(here, run, out)
        for spec in out.loops:
            self._deliver(("loop", run.execution_id, spec.loop_id), spec)
        for lc in out.loop_cancels:
            self._deliver(("loop", run.execution_id, lc.loop_id), lc)
        for child in out.child_cancels:
            self.cancel(child, f"parent execution {run.execution_id} cancelled it")
        if out.reply is not None:
            subject, msg = out.reply
            self._deliver(_target_of(subject), msg)

    def _loop_effects(self, here: tuple[str, ...], run: Run, out: LoopOutput) -> None:
        self._work(here, run, out)
        for child in out.child_cancels:
            self.cancel(child, f"loop {here[2]} of {run.execution_id} stopped")
        if out.verdict is not None:
            self._deliver(("exec", run.execution_id), out.verdict)

    def _work(self, here: tuple[str, ...], run: Run, out: Output | LoopOutput) -> None:
        """What engine and counter alike ask for: commands run, timers armed, commands
        stopped, children started."""
        self._commands(here, run, out.commands)
        self._arm(here, out.timers)
        self._stop(run, out.cancels)
        self._start_children(run, out.starts)

    def _arm(self, here: tuple[str, ...], timers: Iterable[Timer]) -> None:
        for t in timers:
            self._ids += 1
            heapq.heappush(self._timers, (t.due, self._ids, here, t.fire))

    def _stop(self, run: Run, cancels: Iterable[CommandCancel]) -> None:
        for c in cancels:
            run.cancelled.append(c.command_id)
            running = self._running.pop(c.command_id, None)
            if running is not None:  # a stopped tool answers Cancelled
                target, cmd, call = running
                self._deliver(target, self._reply(cmd, call, None, Fail("Cancelled", "tool call cancelled")))

    def _start_children(self, run: Run, starts: Iterable[StartMessage]) -> None:
        for s in starts:
            assert s.execution_id is not None
            if s.execution_id in self.runs:
                continue  # one execution per id, as the starter does
            run.children.append(s.execution_id)
            self.runs[s.execution_id] = Run(s.execution_id)
            source = self.playbooks.get(s.playbook)
            error = None if source is not None else ErrorInfo(type="PlaybookNotFound",
                                                              message=f"playbook {s.playbook!r} is not registered")
            self._deliver(("exec", s.execution_id), StartRecord(
                execution_id=s.execution_id, playbook_path=s.playbook, playbook_version=s.version,
                playbook_source=source, payload=s.payload, parent=s.parent, error=error, limits=self.limits))

    # --- tool actors ----------------------------------------------------------------

    def _commands(self, here: tuple[str, ...], run: Run, commands: Iterable[Command]) -> None:
        for cmd in commands:
            if cmd.chunk is not None:
                outcomes = []
                for item in cmd.chunk:
                    call = self._call(cmd, args=item.args, iteration=item.iteration_index, element=item.element)
                    run.calls.append(call)
                    result, error = self._outcome(self._tool_for(call))
                    outcomes.append(IterationOutcome(iteration_index=item.iteration_index, result=result,
                                                     error=error.error if error else None))
                self._deliver(here, ChunkDone(execution_id=cmd.execution_id, command_id=cmd.command_id,
                                              step=cmd.step, attempt_number=cmd.attempt_number, outcomes=outcomes))
                continue
            call = self._call(cmd, args=cmd.args, iteration=cmd.iteration_index, element=cmd.element)
            run.calls.append(call)
            answer = self._tool_for(call)
            if answer is PENDING:
                self._running[cmd.command_id] = (here, cmd, call)
                continue
            result, error = self._outcome(answer)
            self._deliver(here, self._reply(cmd, call, result, error))

    def _call(self, cmd: Command, *, args: dict[str, Any], iteration: int | None, element: Any) -> Call:
        return Call(execution_id=cmd.execution_id, step=cmd.step, kind=cmd.kind, tool=cmd.tool, args=args,
                    attempt=cmd.attempt_number, command_id=cmd.command_id, iteration=iteration, element=element,
                    timeout=cmd.timeout, chunked=cmd.chunk is not None)

    def _tool_for(self, call: Call) -> Any:
        """The tool function's answer: a result, PENDING, or the `Fail` it raised."""
        tool = self.tools if callable(self.tools) else self.tools.get(call.step, lambda c: c.args)
        try:
            return tool(call) if callable(tool) else tool
        except Fail as e:
            return e

    @staticmethod
    def _outcome(answer: Any) -> tuple[Any, Fail | None]:
        if isinstance(answer, Fail):
            return None, answer
        assert answer is not PENDING, "a chunk item cannot stay running"
        return answer, None

    @staticmethod
    def _reply(cmd: Command, call: Call, result: Any, error: Fail | None) -> CallDone | CallError:
        if error is not None:
            return CallError(execution_id=cmd.execution_id, command_id=cmd.command_id, step=cmd.step,
                             error=error.error, attempt_number=cmd.attempt_number, iteration_index=call.iteration)
        return CallDone(execution_id=cmd.execution_id, command_id=cmd.command_id, step=cmd.step, result=result,
                        attempt_number=cmd.attempt_number, iteration_index=call.iteration)


# --- subjects: only the harness reads them (the cores put them in reply_to) ------------


def _reply_to(eid: str) -> str:
    return f"exec.0.{eid}.in.result"


def _loop_reply(eid: str, loop_id: str) -> str:
    return f"loop.0.{eid}.{loop_id}.in.res"


def _target_of(subject: str) -> tuple[str, ...]:
    """Where a reply subject leads: an execution's inputs or a loop's."""
    parts = subject.split(".")
    return ("exec", parts[2]) if parts[0] == "exec" else ("loop", parts[2], parts[3])


# --- replay --------------------------------------------------------------------------


def replay(run: Run, *, read_back: bool = True) -> bool:
    """Fold `run`'s recorded inputs again, into fresh state, as a replaying engine (and
    counter) would: True when every decision is the same as the first time. With
    `read_back`, failure decisions are read back from the log as the engine does;
    without, the rules are evaluated again (and must decide the same)."""
    decided = run.events("step.failure_decided") if read_back else []
    recorded = {(i.data["activation"], i.data["attempt_number"]): i.data for i in decided}
    if refold(run.execution_id, run.inputs, recorded=recorded) != run.outputs:
        return False
    for loop_id, log in run.loops.items():
        state = LoopRun(execution_id=run.execution_id, loop_id=loop_id)
        if [_plain(_counter_fold(state, inp, at)) for inp, at, _ in log] != [first for _, _, first in log]:
            return False
    return True


def refold(execution_id: str, inputs: Iterable[tuple[Any, int, float]], *, reply_to: str | None = None,
           recorded: dict[tuple[int, int], dict[str, Any]] | None = None) -> list[Any]:
    """Fold an execution's inputs (each with its stream sequence and log time) into
    fresh state, as a replaying engine does, with `recorded` failure decisions read
    back; each decision's outputs as plain data (see `decisions`)."""
    ex = Execution(execution_id=execution_id, recorded=dict(recorded or {}))
    reply_to = reply_to or _reply_to(execution_id)
    return [_plain(fold(ex, inp, seq=seq, at=at, reply_to=reply_to)) for inp, seq, at in inputs]


def decisions(output: Any) -> list[dict[str, Any]]:
    """The events one decision (an item of `refold`) writes to the log: its decision
    record's events, then its lifecycle events, as plain data."""
    return [*output["events"], *output["lifecycle"]]


def _counter_fold(state: LoopRun, inp: Any, at: float) -> LoopOutput:
    """Fold one input of a loop's log as the counter does: the spec with its parsed
    step, every input under the execution's template limits."""
    step = parsed_playbook(inp.playbook_source, inp.playbook_path).step(inp.step) if isinstance(inp, LoopSpec) else None
    spec = inp if isinstance(inp, LoopSpec) else state.spec
    assert spec is not None, "a loop's log starts with its spec"
    reply_prefix = _loop_reply(state.execution_id, state.loop_id)
    return call_with_limits(spec.limits, lambda: fold_loop(state, inp, at=at, reply_prefix=reply_prefix, step=step))
