"""An execution's steps on a time axis (a Gantt), from its log: for the execution page.

`step_timeline(items)` reads the log items `Client.events(id)` returns and gives a row
per step, in the order the steps were first entered, each with its bars:

* `run`: one attempt of the step's tool, from the moment the tool started it to its
  answer (the tool's own `started_at`/`ended_at` on `call.done`/`call.error`), or from
  the command's issue while no answer has come (`end` null, state `running`); a step
  with no command (a router, a step that failed rendering its args, an aggregating
  `end`) is one bar from entry to exit;
* `waiting`: a command issued but not started yet: from `command.issued` to the tool's
  `started_at` (the time it spent in the work queue);
* `delay`: a retry's backoff, from `retry.scheduled` to the timer firing (`retry.due`),
  or to its planned `due` while it waits; state `retrying`;
* a wait step (`tool: wait`): one `run` bar per attempt, from `step.waiting` to the
  signal it took (`signal.received`) or its timer (`wait.ended`: a timeout fails it);
  open (state `running`) while it waits;
* a loop step is one row, one `run` bar per run of the whole loop (`iterator.started`
  to its verdict), with `loop` counts: its iterations are in the loop's own log, not
  the execution's.

Times are epoch seconds: the log's times, and the tool's clock for a run's start and
end (clamped into the command's span should the clocks disagree). Anything after the
execution's terminal event is ignored; bars still open then end with it, `cancelled`.
Pure: no NATS, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from actors.ui.runstate import CANCELLED, COMPLETED, FAILED, PENDING, RETRYING, RUNNING, Item, Log, one_line, split_log
from actors.wire.events import TERMINAL_EVENTS

Bar = dict[str, Any]
_EXIT = {"COMPLETED": COMPLETED, "FAILED": FAILED, "CANCELLED": CANCELLED}


def step_timeline(items: Iterable[Item]) -> dict[str, Any]:
    """`{"start", "end", "rows": [{"step", "loop", "bars": [...]}]}` (see the module)."""
    return _Timeline().fold(items)


class _Timeline:
    def __init__(self) -> None:
        self.start: float | None = None
        self.end: float | None = None
        self.rows: dict[str, list[Bar]] = {}
        self.loops: set[str] = set()
        self.commands: dict[str, Bar] = {}  # command id -> its run bar
        self.timers: dict[tuple[str, int], Bar] = {}  # (step, activation) -> its open delay bar
        self.loop_runs: dict[str, Bar] = {}  # loop id -> its run bar
        self.entered: dict[tuple[str, int], float] = {}  # (step, activation) -> entry time
        self.worked: set[tuple[str, int]] = set()  # activations that issued a command or a loop
        self.waits: dict[tuple[str, int], Bar] = {}  # (step, activation) -> its open wait bar
        self.log = Log()

    def fold(self, items: Iterable[Item]) -> dict[str, Any]:
        items = list(items)
        self.log = split_log(items)
        for item in self.log.events:
            if item.cls == "lc":
                self._lifecycle(item)
            elif item.step is not None:
                self._step(item.step, item)
        return {
            "start": self.start if self.start is not None else items[0].at if items else None,
            "end": self.end,
            "rows": [{"step": s, "loop": s in self.loops, "bars": bars} for s, bars in self.rows.items()],
        }

    def _lifecycle(self, item: Item) -> None:
        if item.type == "playbook.initialized":
            self.start = item.data.get("started_at", item.at)
        if item.type not in TERMINAL_EVENTS:
            return
        self.end = item.data.get("ended_at", item.at)
        if self.start is None:
            self.start = item.data.get("started_at") or item.at
        waiting = [*self.timers.values()]  # timers disarmed by the end: cut short
        open_runs = [bar for bars in self.rows.values() for bar in bars if bar["end"] is None]
        for bar in waiting + open_runs:
            bar["end"] = max(bar["start"], min(bar["end"] or self.end, self.end))
            bar["state"] = CANCELLED

    def _bar(self, step: str, kind: str, attempt: int, start: float, state: str, **extra: Any) -> Bar:
        bar: Bar = {
            "attempt": attempt,
            "iteration": None,
            "start": start,
            "end": None,
            "state": state,
            "kind": kind,
            "error": None,
            **extra,
        }
        self.rows.setdefault(step, []).append(bar)
        return bar

    def _step(self, step: str, item: Item) -> None:
        d, at = item.data, item.at
        act = int(d.get("activation", -1))
        match item.type:
            case "step.enter":
                self.rows.setdefault(step, [])
                self.entered[(step, act)] = at
            case "command.issued":
                self.worked.add((step, act))
                bar = self._bar(step, "run", int(d.get("attempt_number", 1)), at, RUNNING, activation=act)
                command = str(d.get("command_id"))
                self.commands[command] = bar
                answer = self.log.answers.get(command)
                if answer is not None:
                    self._answer(step, bar, answer)
            case "command.cancelled":
                stopped = self.commands.get(d.get("command_id", ""))
                if stopped is not None and stopped["end"] is None:
                    stopped["end"], stopped["state"] = max(stopped["start"], at), CANCELLED
            case "retry.scheduled":
                bar = self._bar(step, "delay", int(d.get("attempt_number", 2)), at, RETRYING, activation=act)
                bar["end"] = max(at, float(d.get("due", at)))  # planned; the timer's firing replaces it
                bar["reason"] = d.get("reason")
                self.timers[(step, act)] = bar
            case "retry.due":
                fired = self.timers.pop((step, act), None)
                if fired is not None:
                    fired["end"] = max(fired["start"], at)  # when it fired (it may be late)
            case "step.waiting" if d.get("loop_id") is None:
                self.worked.add((step, act))
                bar = self._bar(step, "run", int(d.get("attempt_number", 1)), at, RUNNING, activation=act, wait=True)
                self.waits[(step, act)] = bar
            case "signal.received" | "wait.ended":
                waited = self.waits.pop((step, act), None)
                if waited is not None:
                    waited["end"] = max(waited["start"], at)
                    timed_out = item.type == "wait.ended" and d.get("reason") == "timeout"
                    waited["state"] = FAILED if timed_out else COMPLETED
                    waited["error"] = "WaitTimeout" if timed_out else None
            case "iterator.started":
                self.worked.add((step, act))
                self.loops.add(step)
                bar = self._bar(step, "run", int(d.get("attempt_number", 1)), at, RUNNING, activation=act)
                bar["loop"] = {"size": d.get("size", 0), "succeeded": 0, "failed": 0}
                verdict = self.log.verdicts.get(str(d.get("loop_id")))
                if verdict is not None:
                    self._verdict(bar, verdict)
            case "step.exit":
                self._exit(step, act, item)

    @staticmethod
    def _verdict(bar: Bar, verdict: Item) -> None:
        d = verdict.data
        bar["end"] = max(bar["start"], verdict.at)
        bar["state"] = COMPLETED if verdict.type == "iterator.completed" else FAILED
        bar["loop"].update(succeeded=d.get("succeeded", 0), failed=d.get("failed", 0))
        errors = d.get("errors") or []
        if errors and isinstance(errors[0], dict):
            bar["error"] = f"iteration {errors[0].get('index')}: {one_line(errors[0].get('error'))}"

    def _answer(self, step: str, bar: Bar, item: Item) -> None:
        d = item.data
        issued = bar["start"]
        started = float(d.get("started_at") or 0.0)
        ended = float(d.get("ended_at") or 0.0) or item.at
        started = min(max(started, issued), item.at) if started else issued
        if started > issued:
            wait = self._bar(step, "waiting", bar["attempt"], issued, PENDING, activation=bar["activation"])
            wait["end"] = started
            rows = self.rows[step]
            rows.insert(rows.index(bar), rows.pop())  # the wait goes before its run
        bar["start"], bar["end"] = started, min(max(ended, started), max(item.at, started))
        if item.type == "call.error":
            bar["state"], bar["error"] = FAILED, one_line(d.get("error"))
        else:
            bar["state"] = COMPLETED

    def _exit(self, step: str, act: int, item: Item) -> None:
        rejected = self.rows.get(step, [])[-1:] if item.data.get("status") == "FAILED" else []
        if (
            rejected
            and rejected[0].get("wait")
            and rejected[0]["activation"] == act
            and rejected[0]["state"] == COMPLETED
        ):
            # a wait that took its signal and failed anyway (an approval rejected)
            rejected[0]["state"], rejected[0]["error"] = FAILED, one_line(item.data.get("error"))
        if (step, act) in self.worked:
            return
        entered = self.entered.get((step, act), item.at)
        bar = self._bar(step, "run", 1, entered, _EXIT.get(str(item.data.get("status")), FAILED), activation=act)
        bar["end"] = max(entered, item.at)
        bar["error"] = one_line(item.data.get("error"))
