"""The harness's driver: it plays the log, the tool actors, the counter's shell and
the starter around the pure folds (tests/harness/folds.py), with a synthetic clock."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from actors.core.effects import CommandCancel, Effects, Timer
from actors.core.loop import LoopRun
from actors.core.replay import SEMANTICS
from actors.core.rerun import plan_retry
from actors.core.state import Execution
from actors.wire.messages import (
    CallDone,
    CallError,
    CancelRequest,
    ChunkDone,
    Command,
    ErrorInfo,
    IterationOutcome,
    Limits,
    RetriedBy,
    RetryOf,
    StartMessage,
    StartRecord,
)
from tests.harness.folds import counter_fold, engine_fold, plain, target_of
from tests.harness.view import PENDING, Call, Fail, Run, Tool, item_of

START_TIME = 1_000.0  # the synthetic clock's first reading (log time, epoch seconds)


class Harness:
    """Runs executions to quiescence on the pure cores. `tools` answers commands: one
    function for every call, or a mapping step -> function, constant result, `Fail`
    (every attempt fails so) or PENDING; a step it does not name answers like `noop`
    (its args). `playbooks`: the catalog `tool: playbook` resolves paths in."""

    def __init__(
        self,
        tools: Tool | dict[str, Any] | None = None,
        *,
        playbooks: dict[str, str] | None = None,
        limits: Limits | None = None,
    ) -> None:
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

    def start(
        self,
        source: str,
        payload: dict[str, Any] | None = None,
        *,
        execution_id: str | None = None,
        path: str = "pb",
        retry_of: RetryOf | None = None,
    ) -> str:
        """Queue an execution's start record; `run()` then runs it."""
        self._ids += 1
        eid = execution_id or f"e{self._ids}"
        self._deliver(
            ("exec", eid),
            StartRecord(
                execution_id=eid,
                playbook_path=path,
                playbook_source=source,
                payload=payload or {},
                limits=self.limits,
                retry_of=retry_of,
            ),
        )
        self.runs[eid] = Run(eid)
        self._last = eid
        return eid

    def run(
        self,
        source: str | None = None,
        payload: dict[str, Any] | None = None,
        *,
        until: Callable[[Harness], bool] | None = None,
    ) -> Run:
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

    def retry(self, execution_id: str, *, from_step: str | None = None, payload: dict[str, Any] | None = None) -> str:
        """Queue a retry of a terminal execution as `Client.retry` and the starter make
        it: planned from the old state (actors/core/rerun.py), its start record carrying
        `retry_of`, and the link into the old execution's inputs."""
        record = next(inp for inp, _, _ in self.runs[execution_id].inputs if isinstance(inp, StartRecord))
        plan = plan_retry(self._states[execution_id], record, from_step=from_step, payload=payload)
        self._ids += 1
        eid = f"r{self._ids}"
        self._deliver(
            ("exec", eid),
            StartRecord(
                execution_id=eid,
                playbook_path=plan.playbook_path,
                playbook_version=plan.playbook_version,
                playbook_source=record.playbook_source,
                payload=plan.payload,
                limits=self.limits,
                retry_of=plan.retry_of,
            ),
        )
        link = RetriedBy(execution_id=execution_id, retry_execution_id=eid, from_step=plan.retry_of.from_step)
        self._deliver(("exec", execution_id), link)
        self.runs[eid] = Run(eid)
        self._last = eid
        return eid

    def state(self, execution_id: str) -> Execution:
        """An execution's folded state (what the engine holds for it)."""
        return self._states[execution_id]

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
        out = engine_fold(ex, inp, seq, at)
        decided = plain(out)
        run.inputs.append((inp, seq, at))
        run.outputs.append(decided)
        run.items.append(item_of("in", plain(inp), seq, at))
        run.items += [item_of("ev", e, seq, at) for e in decided["events"]]
        run.items += [item_of("lc", e, seq, at) for e in decided["lifecycle"]]
        self._effects(("exec", eid), run, out)

    def _fold_loop(self, eid: str, loop_id: str, inp: Any, at: float) -> None:
        run = self.runs[eid]
        state = self._loops.setdefault((eid, loop_id), LoopRun(execution_id=eid, loop_id=loop_id))
        out = counter_fold(state, inp, at)
        run.loops.setdefault(loop_id, []).append((inp, at, plain(out)))
        self._loop_effects(("loop", eid, loop_id), run, out)

    # --- what the shells do with a decision ---------------------------------------------

    def _effects(self, here: tuple[str, ...], run: Run, out: Effects) -> None:
        self._work(here, run, out)
        for spec in out.loops:
            self._deliver(("loop", run.execution_id, spec.loop_id), spec)
        for lc in out.loop_cancels:
            self._deliver(("loop", run.execution_id, lc.loop_id), lc)
        for child in out.child_cancels:
            self.cancel(child, f"parent execution {run.execution_id} cancelled it")
        if out.reply is not None:
            subject, msg = out.reply
            self._deliver(target_of(subject), msg)

    def _loop_effects(self, here: tuple[str, ...], run: Run, out: Effects) -> None:
        self._work(here, run, out)
        for child in out.child_cancels:
            self.cancel(child, f"loop {here[2]} of {run.execution_id} stopped")
        if out.verdict is not None:
            self._deliver(("exec", run.execution_id), out.verdict)

    def _work(self, here: tuple[str, ...], run: Run, out: Effects) -> None:
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
            error = (
                None
                if source is not None
                else ErrorInfo(type="PlaybookNotFound", message=f"playbook {s.playbook!r} is not registered")
            )
            self._deliver(
                ("exec", s.execution_id),
                StartRecord(
                    execution_id=s.execution_id,
                    playbook_path=s.playbook,
                    playbook_version=s.version,
                    playbook_source=source,
                    payload=s.payload,
                    parent=s.parent,
                    error=error,
                    limits=self.limits,
                ),
            )

    # --- tool actors ----------------------------------------------------------------

    def _commands(self, here: tuple[str, ...], run: Run, commands: Iterable[Command]) -> None:
        for cmd in commands:
            if cmd.chunk is not None:
                outcomes = []
                for item in cmd.chunk:
                    call = self._call(cmd, args=item.args, iteration=item.iteration_index, element=item.element)
                    run.calls.append(call)
                    result, error = self._outcome(self._tool_for(call))
                    outcomes.append(
                        IterationOutcome(
                            iteration_index=item.iteration_index,
                            result=result,
                            error=error_info(error) if error else None,
                        )
                    )
                self._deliver(
                    here,
                    ChunkDone(
                        execution_id=cmd.execution_id,
                        command_id=cmd.command_id,
                        step=cmd.step,
                        attempt_number=cmd.attempt_number,
                        outcomes=outcomes,
                    ),
                )
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
        return Call(
            execution_id=cmd.execution_id,
            step=cmd.step,
            kind=cmd.kind,
            tool=cmd.tool,
            args=args,
            attempt=cmd.attempt_number,
            command_id=cmd.command_id,
            iteration=iteration,
            element=element,
            timeout=cmd.timeout,
            chunked=cmd.chunk is not None,
        )

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
        done = CallDone(
            execution_id=cmd.execution_id,
            command_id=cmd.command_id,
            step=cmd.step,
            result=result if error is None else None,
            attempt_number=cmd.attempt_number,
            iteration_index=call.iteration,
        )
        return done if error is None else done.failed(error_info(error))


def error_info(fail: Fail) -> ErrorInfo:
    return ErrorInfo(type=fail.type, message=fail.message, retryable=fail.retryable, status=fail.status)


class Stamped(Harness):
    """The harness whose start records (a child's too) are stamped with `semantics`, as
    a starter does (with this code's while every engine pod runs it)."""

    def __init__(self, *args: Any, semantics: int = SEMANTICS, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.semantics = semantics

    def _deliver(self, target: tuple[str, ...], inp: Any) -> None:
        if isinstance(inp, StartRecord):
            inp.semantics = self.semantics
        super()._deliver(target, inp)
