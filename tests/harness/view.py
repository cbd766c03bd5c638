"""What a test sees of a harness run: plain data, no type of the core.

`Run` is one execution: its log as `Item`s (inputs, decision events, lifecycle events;
`data` is plain JSON-like data), the tool `Call`s made for it, the commands stopped,
the children started. A tool function gets a `Call` and returns a result, raises
`Fail`, or returns `PENDING` (still running).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PENDING = object()  # a tool function's answer for "still running": no result until cancelled
TERMINAL_EVENTS = {"playbook.completed": "COMPLETED", "playbook.failed": "FAILED", "execution.cancelled": "CANCELLED"}


class Fail(Exception):
    """Raised by a tool function: the attempt fails with this error."""

    def __init__(self, type_: str, message: str = "", *, retryable: bool = False, status: int | None = None) -> None:
        super().__init__(message)
        self.type, self.message, self.retryable, self.status = type_, message or type_, retryable, status


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


def item_of(cls: str, raw: dict[str, Any], seq: int, at: float) -> Item:
    """A log entry from an input or an event, as plain data."""
    if cls == "in":
        raw = dict(raw)
        return Item(cls, raw.pop("type"), raw.get("step"), raw, at, seq)
    return Item(cls, raw["type"], raw.get("step"), dict(raw.get("data", {})), raw["at"], raw["cause"])
