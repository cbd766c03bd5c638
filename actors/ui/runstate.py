"""What an execution's log says about each step, for the graph: its state now, its
attempts and visits, its last error, the routes it took, its loop's counts.

A fold over the log items `Client.events(id)` returns (`LogItem`: class, type, step,
data, log time), reading the engine's decision events (`step.enter`, `command.issued`,
`iterator.started`, `retry.scheduled`, `retry.due`, `step.failure_decided`,
`step.exit`), the inputs that carry results and loop verdicts, and the terminal
lifecycle event. What comes after the terminal event changes nothing (a late result
is folded into a terminal execution and ignored, as the engine does). Pure: no NATS.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from actors.playbook.model import END
from actors.wire.events import TERMINAL_EVENTS, ExecState

# node states, as the page colours them
PENDING = "pending"
RUNNING = "running"
RETRYING = "retrying"
COMPLETED = "completed"
FAILED = "failed"
CANCELLED = "cancelled"
SKIPPED = "skipped"  # never entered by an execution that has ended

ERROR_CHARS = 300  # an error's one line, as a hover title shows it


class Item(Protocol):
    """What is read of a log item (actors/client/logview.py `LogItem`)."""

    @property
    def cls(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def step(self) -> str | None: ...
    @property
    def at(self) -> float: ...
    @property
    def data(self) -> dict[str, Any]: ...


@dataclass(slots=True)
class LoopRun:
    """A loop step's latest run (its latest attempt as a whole)."""

    loop_id: str
    size: int
    started_at: float
    ended_at: float | None = None
    succeeded: int = 0
    failed: int = 0
    ok: bool | None = None  # the verdict: None while it runs


@dataclass(slots=True)
class StepRun:
    """One step of one execution, from its log."""

    state: str = PENDING
    attempts: int = 0  # commands issued (a loop: each run of the whole loop)
    visits: int = 0  # activations: a step in a cycle is entered more than once
    error: str | None = None  # the last error, one line
    decision: str | None = None  # the last on_error decision taken
    decisions: set[str] = field(default_factory=set)  # every on_error decision taken
    handled: bool = False  # failed, but a rule handled it
    children: list[str] = field(default_factory=list)  # child executions (`tool: playbook`)
    loop: LoopRun | None = None
    taken: set[tuple[str, str]] = field(default_factory=set)  # (target, how): routes taken
    live: dict[int, str] = field(default_factory=dict)  # activation -> running | retrying
    exited: str | None = None  # how its last finished activation ended
    kept: bool = False  # a retry took its result over from the execution it retries


@dataclass(slots=True)
class RunState:
    """Every step named in the log, and how the execution ended (None: it runs)."""

    steps: dict[str, StepRun] = field(default_factory=dict)
    ended: ExecState | None = None
    started_at: float | None = None
    ended_at: float | None = None
    kept: set[str] = field(default_factory=set)  # a retry: steps whose results it took over

    def step(self, name: str) -> StepRun:
        """The step's run; a step the log never names is pending (or skipped, ended)."""
        run = self.steps.get(name)
        if run is not None:
            return run
        return StepRun(state=PENDING if self.ended is None else SKIPPED)


_EXIT_STATES = {"COMPLETED": COMPLETED, "FAILED": FAILED, "CANCELLED": CANCELLED}
_END_STATES = {ExecState.COMPLETED: COMPLETED, ExecState.FAILED: FAILED, ExecState.CANCELLED: CANCELLED}


def one_line(error: Any) -> str | None:
    """`Type: message` of an error view, on one line, bounded."""
    if not isinstance(error, dict):
        return None
    text = f"{error.get('type') or 'Error'}: {error.get('message') or ''}".strip()
    text = " ".join(text.split())
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 1] + "…"


@dataclass(slots=True)
class Log:
    """The log split for folding: the events up to the terminal one, and the answers
    (by command id) and loop verdicts (by loop id) that came before it.

    An answer can be stored before the event that issued its command: the engine
    publishes a command before its decision record, and a fast tool answers in
    between. So answers are looked up when their command is met, not folded where
    they stand. What comes after the terminal event is left out: a late result
    changes nothing, as in the engine."""

    events: list[Item] = field(default_factory=list)
    answers: dict[str, Item] = field(default_factory=dict)
    verdicts: dict[str, Item] = field(default_factory=dict)


def split_log(items: Iterable[Item]) -> Log:
    log = Log()
    for item in items:
        if item.cls == "in" and item.type in ("call.done", "call.error"):
            log.answers.setdefault(str(item.data.get("command_id")), item)
        elif item.type in ("iterator.completed", "iterator.failed") and item.cls in ("in", "ev"):
            log.verdicts.setdefault(str(item.data.get("loop_id")), item)
        elif item.cls in ("ev", "lc"):
            log.events.append(item)
            if item.cls == "lc" and item.type in TERMINAL_EVENTS:
                break
    return log


def fold_run(items: Iterable[Item]) -> RunState:
    """Each step's state from the log items (in log order)."""
    run = RunState()
    log = split_log(items)
    for item in log.events:
        if item.cls == "lc":
            _lifecycle(run, item)
        elif item.type == "execution.retry_of":
            run.kept.update(item.data.get("kept_steps") or ())
        elif item.step is not None:
            _step_item(run.steps.setdefault(item.step, StepRun()), item, log)
    if run.ended is not None:
        run.steps.setdefault(END, StepRun())  # end shows how the execution ended, entered or not
    for name in run.kept:
        run.steps.setdefault(name, StepRun(kept=True))
    for name, step in run.steps.items():
        _settle(run, name, step)
    return run


def _lifecycle(run: RunState, item: Item) -> None:
    if item.type == "playbook.initialized":
        run.started_at = item.data.get("started_at", item.at)
    ended = TERMINAL_EVENTS.get(item.type)
    if ended is not None:
        run.ended = ended
        run.ended_at = item.data.get("ended_at", item.at)
        if run.started_at is None:
            run.started_at = item.data.get("started_at")


def _step_item(step: StepRun, item: Item, log: Log) -> None:
    d = item.data
    act = int(d.get("activation", -1))
    match item.type:
        case "step.enter":
            step.visits += 1
            step.live[act] = RUNNING
        case "command.issued":
            step.attempts += 1
            step.live[act] = RUNNING
            child = d.get("child_execution_id")
            if child and child not in step.children:
                step.children.append(child)
            answer = log.answers.get(str(d.get("command_id")))
            if answer is not None and answer.type == "call.error":
                step.error = one_line(answer.data.get("error"))
        case "iterator.started":
            step.attempts += 1
            step.live[act] = RUNNING
            loop_id = str(d.get("loop_id"))
            step.loop = LoopRun(loop_id=loop_id, size=int(d.get("size", 0)), started_at=item.at)
            verdict = log.verdicts.get(loop_id)
            if verdict is not None:
                step.loop.ended_at = max(item.at, verdict.at)
                step.loop.succeeded = int(verdict.data.get("succeeded", 0))
                step.loop.failed = int(verdict.data.get("failed", 0))
                step.loop.ok = verdict.type == "iterator.completed"
        case "retry.scheduled":
            if act in step.live:
                step.live[act] = RETRYING
        case "retry.due":
            if act in step.live:
                step.live[act] = RUNNING
        case "step.failure_decided":
            step.decision = d.get("decision")
            step.error = one_line(d.get("error")) or step.error
            if step.decision:
                step.decisions.add(step.decision)
        case "step.exit":
            step.live.pop(act, None)
            step.exited = _EXIT_STATES.get(str(d.get("status")), FAILED)
            step.error = one_line(d.get("error")) or step.error
            step.handled = bool(d.get("handled")) or step.handled
            for target in d.get("next") or ():
                step.taken.add((target, "next"))
            route = d.get("failure_route")
            if isinstance(route, dict) and route.get("status") == "selected" and route.get("target"):
                step.taken.add((route["target"], "on_failure"))


def _settle(run: RunState, name: str, step: StepRun) -> None:
    if name == END and run.ended is not None:
        step.state = _END_STATES[run.ended]
    elif step.live:
        if run.ended is not None:
            step.state = CANCELLED  # cut off by the execution's end (a cancel or an abort)
        elif RUNNING in step.live.values():
            step.state = RUNNING
        else:
            step.state = RETRYING
    elif step.exited is not None:
        step.state = step.exited
    elif name in run.kept:
        step.state = COMPLETED  # done by the execution this one retries
    else:
        step.state = PENDING if run.ended is None else SKIPPED
