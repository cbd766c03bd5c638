"""An execution's state: what the fold of its inputs has established so far.

Plain data, no I/O. The engine keeps one per live execution; a restart rebuilds it by
folding the execution's inputs again (actors/core/decide.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from actors.core.retry import Gathered
from actors.playbook.model import Playbook
from actors.wire.events import (
    TERMINAL_STATES,
    ActivationStatus,
    ArrivalStatus,
    ExecState,
    FailureDecidedData,
    WaitEntry,
)
from actors.wire.messages import CancelRequest, ErrorInfo, Limits, ParentRef, Redrive, SignalSent

# Routing work a decision has yet to do (actors/core/decide.py): start an activation,
# or see whether the branch that just left was the last one before `end`
Pending = tuple[Literal["begin", "settle"], int]


@dataclass(slots=True)
class Activation:
    """One visit of a step (a step can be visited more than once, and a parallel
    branch is its own activation). Its id is the branch's token."""

    id: int
    step: str
    status: ActivationStatus = ActivationStatus.RUNNING
    attempt: int = 1
    command_id: str | None = None
    from_activation: int | None = None
    timer_id: str | None = None  # a retry waiting on a durable timer
    next_args: dict[str, Any] | None = None  # next_call args for the next attempt
    gathered: Gathered = field(default_factory=Gathered)  # what a collecting retry rule gathered
    kind: str | None = None  # tool kind of the command in flight
    child: str | None = None  # child execution id, for `tool: playbook`
    max_attempts: int | None = None  # from the retry rule that last matched
    errors: list[str] = field(default_factory=list)  # one line per failed attempt: the retry summary
    failure: dict[str, Any] | None = None  # `failure` in scope, for a remediation step


@dataclass(slots=True)
class Wait:
    """A step's attempt waiting (`tool: wait`, actors/core/waits.py): for a signal
    named `signal` with `key` (None: only a date), until `deadline` (None: no bound),
    on the durable timer `timer_id`. A loop of waits (`loop_id`) is the counter's to
    match: the execution forwards it each signal of its name."""

    activation: int
    step: str
    since: float
    signal: str | None
    key: str = ""
    until: float | None = None
    deadline: float | None = None
    timer_id: str | None = None
    approval: bool = False
    loop_id: str | None = None


@dataclass(slots=True)
class Arrival:
    """A branch that reached `end`."""

    step: str
    status: ArrivalStatus
    routed_to_end: bool = False


@dataclass(slots=True)
class Execution:
    execution_id: str
    playbook: Playbook | None = None
    playbook_path: str = ""
    playbook_source: str = ""  # handed to the counter with each loop
    playbook_file: str | None = None  # the start record's: python commands say where their code starts
    workload: dict[str, Any] = field(default_factory=dict)
    status: ExecState = ExecState.PENDING
    started_at: float | None = None
    results: dict[str, Any] = field(default_factory=dict)  # by step name, latest visit
    activations: dict[int, Activation] = field(default_factory=dict)
    live: dict[int, None] = field(default_factory=dict)  # ordered set of running branches
    by_command: dict[str, int] = field(default_factory=dict)  # command id -> activation
    arrivals: list[Arrival] = field(default_factory=list)
    failed_steps: list[str] = field(default_factory=list)  # unhandled failures
    # the first unhandled failure (step, error): what the execution's error names
    root_failure: tuple[str, ErrorInfo] | None = None
    end_activation: int | None = None
    inputs_folded: int = 0
    parent: ParentRef | None = None
    aborted: bool = False
    limits: Limits = field(default_factory=Limits)  # from the start record: what bounds this execution
    # failure decisions read back from the log during a replay: (activation, attempt) ->
    # the recorded `step.failure_decided` data; a recorded decision is never re-evaluated
    recorded: dict[tuple[int, int], FailureDecidedData] = field(default_factory=dict)
    # routing not done yet, last to be done first; carried over to the next decision
    # only when one decision reached its share of routing (decide.ROUTING_SLICE)
    pending: list[Pending] = field(default_factory=list)
    retries: list[str] = field(default_factory=list)  # executions started as retries of this one
    # a cancel that reached the log before the start record (a start still queued in
    # stream START when it was sent): the execution ends CANCELLED as soon as it starts
    early_cancel: CancelRequest | None = None
    # the engine semantics the start record pinned (actors/core/replay.py SEMANTICS): a
    # change of behaviour that would alter decisions branches on it, so an execution
    # keeps the behaviour it started with across upgrades (docs/upgrades.md)
    semantics: int = 1
    # a redrive (RetryOf.redrive): by loop step, what its next loop runs again and keeps;
    # once that loop starts, by its loop id until its verdict
    redrive: dict[str, Redrive] = field(default_factory=dict)
    redriving: dict[str, Redrive] = field(default_factory=dict)
    # waits (actors/core/waits.py): by activation, in the order they began; the signals
    # kept for a later wait (the mailbox), in arrival order; every signal id taken, kept
    # or forwarded (the same id again is the same signal); what `execution.waiting` last
    # said, and whether the waits changed since (checked once per decision)
    waits: dict[int, Wait] = field(default_factory=dict)
    mailbox: list[SignalSent] = field(default_factory=list)
    mailbox_bytes: int = 0  # what the mailbox's signals weigh (waits.signal_bytes): bounded
    signal_ids: set[str] = field(default_factory=set)
    waits_shown: list[WaitEntry] = field(default_factory=list)
    waits_changed: bool = False

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATES

    @property
    def step_budget(self) -> int:
        """Steps (activations) this execution may enter: the pod's bound from the start
        record, or the playbook's own `limits.max_steps` when that is smaller."""
        own = self.playbook.limits.max_steps if self.playbook and self.playbook.limits else None
        return min(own, self.limits.max_activations) if own is not None else self.limits.max_activations

    def scope(self, act: Activation | None = None) -> dict[str, Any]:
        """Template scope: workload, execution_id, every completed step's result, and
        `failure` for a remediation step."""
        scope = {**self.results, "workload": self.workload, "execution_id": self.execution_id}
        if act is not None and act.failure is not None:
            scope["failure"] = act.failure
        return scope
