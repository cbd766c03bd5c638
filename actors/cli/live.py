"""The live view of a running execution (`actors-cli run`): a line per finished step on
stdout, what it printed indented under it, a progress bar per running loop on stderr."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from actors.cli.logs import excerpt_lines, output_header
from actors.playbook.model import END
from actors.wire.events import ActivationStatus, EventType, StepOutput

# iterations of one loop step whose output `run` shows under it (the rest: `actors-cli logs`)
SHOWN_ITERATIONS = 20


class ProgressBars:
    """A progress bar per running loop on stderr: redrawn in place on a terminal, a line
    a second otherwise. Before a step line is printed the bar in place is erased (it
    would otherwise run into the line), and a loop whose step ends gets its last state
    as a final line of its own, finished or not (a failed loop never reaches its total)."""

    def __init__(self, out: TextIO | None = None, *, tty: bool | None = None) -> None:
        self.out = out or sys.stderr
        self.tty = self.out.isatty() if tty is None else tty
        self._latest: dict[str, Any] = {}  # loop id -> the last progress seen, not yet final
        self._shown_at: dict[str, float] = {}
        self._first: dict[str, tuple[float, int]] = {}
        self._in_place = False  # a bar without its newline is on the terminal

    def show(self, p: Any) -> None:
        t0, d0 = self._first.setdefault(p.loop_id, (p.at, p.done))
        finished = p.done >= p.total
        self._latest[p.loop_id] = p
        last = self._shown_at.get(p.loop_id)
        if not self.tty and not finished and last is not None and p.at - last < 1.0:
            return
        self._shown_at[p.loop_id] = p.at
        self._draw(p, t0, d0, final=finished)

    def settle(self, step: str | None = None) -> None:
        """Make room for a line of output: erase the bar in place and give each loop of
        `step` (None: every loop) its final line."""
        self._erase()
        for loop_id, p in list(self._latest.items()):
            if step is None or p.step == step:
                t0, d0 = self._first[loop_id]
                self._draw(p, t0, d0, final=True)

    def _draw(self, p: Any, t0: float, d0: int, *, final: bool) -> None:
        rate = (p.done - d0) / (p.at - t0) if p.at > t0 else 0.0
        width = 30
        filled = int(width * p.done / p.total) if p.total else width
        line = (
            f"  {p.step:20} [{'#' * filled}{'.' * (width - filled)}] {p.done}/{p.total}"
            f"  {rate:,.0f} it/s  {p.in_flight} in flight" + (f"  {p.failed} failed" if p.failed else "")
        )
        if final:
            self._latest.pop(p.loop_id, None)
        if self.tty:
            self.out.write("\r\x1b[K" + line + ("\n" if final else ""))
            self._in_place = not final
        else:
            self.out.write(line + "\n")
        self.out.flush()

    def _erase(self) -> None:
        if self._in_place:
            self.out.write("\r\x1b[K")
            self.out.flush()
            self._in_place = False


async def progress_bars(client: Any, eid: str, bars: ProgressBars) -> None:
    """Draw the execution's loop progress on `bars` until cancelled."""
    async for p in client.progress(eid):
        bars.show(p)


async def follow_steps(client: Any, eid: str, *, quiet: bool, bars: ProgressBars | None = None) -> Any:
    """Print a line per finished step while the execution runs; return its terminal
    lifecycle event."""
    from actors.wire.events import TERMINAL_EVENTS

    entered: dict[int, float] = {}
    printed: dict[int, list[StepOutput]] = {}  # a step's output, shown under its line
    loops: set[int] = set()  # activations that ran a loop: their iterations' output is in LOOP
    streamed: dict[tuple[str, int], int] = {}  # (command, delivery) -> its parts printed while it ran
    held_end: tuple[Any, float] | None = None  # `end`'s exit, shown once the workflow's outcome is known
    t0: float | None = None
    async for item in client.follow(eid):
        t0 = item.at if t0 is None else t0
        if item.type == EventType.STEP_ENTER:
            entered[item.data.get("activation", -1)] = item.at
        elif item.type == EventType.ITERATOR_STARTED:
            loops.add(item.data.get("activation", -1))
        elif item.type == "step.output.part" and not quiet:
            live_part(item, streamed)  # printed while the step runs (actors/cli/logs.py says how)
        elif item.type == "step.output" and not quiet:
            out = StepOutput(execution_id=eid, step=item.step or "", **item.data)
            if not streamed_already(out, streamed):
                printed.setdefault(_activation(out.command_id), []).append(out)
        elif item.type == EventType.STEP_EXIT and not quiet:
            if bars is not None:
                bars.settle(item.step)
            began = entered.get(item.data.get("activation", -1), item.at)
            status = item.data.get("status", "")
            if item.step == END and status == ActivationStatus.COMPLETED:
                held_end = (item, began)  # `end` gathered the branches: ok only if the workflow is
                continue
            mark = "ok " if status == ActivationStatus.COMPLETED else "ERR"
            why = ""
            if item.data.get("error"):
                why = f"  {item.data['error'].get('type')}: {str(item.data['error'].get('message'))[:120]}"
            nxt = item.data.get("next")
            route = f" -> {', '.join(nxt)}" if nxt else ""
            print(
                f"  [{(item.at - t0) * 1000:8.1f} ms] {mark} {item.step:20} "
                f"{(item.at - began) * 1000:7.1f} ms{route}{why}",
                flush=True,
            )
            activation = item.data.get("activation", -1)
            outputs = printed.pop(activation, [])
            if activation in loops:
                outputs += [o for o in await client.outputs(eid, step=item.step) if o.iteration_index is not None]
            _show(outputs, eid, item.step)
        elif item.type in (EventType.WORKFLOW_COMPLETED, EventType.WORKFLOW_FAILED) and held_end and not quiet:
            end, began = held_end
            held_end = None
            failed = item.type == EventType.WORKFLOW_FAILED
            why = f"  failed steps: {', '.join(item.data.get('failed_steps') or [])}" if failed else ""
            print(
                f"  [{(end.at - t0) * 1000:8.1f} ms] {'ERR' if failed else 'ok '} {end.step:20} "
                f"{(end.at - began) * 1000:7.1f} ms{why}",
                flush=True,
            )
        elif item.type == EventType.EXECUTION_HALTED:
            # not an end: a pod whose code decides as the log does resumes it, so the
            # command keeps waiting (up to its --timeout) and says why nothing moves
            error = item.data.get("error") or {}
            print(
                f"  halted: {error.get('type')}: {str(error.get('message'))[:300]} "
                "(waiting for a pod that replays it as recorded: docs/upgrades.md)",
                file=sys.stderr,
                flush=True,
            )
        elif item.type == EventType.EXECUTION_RESUMED:
            print("  resumed: a pod replays the log as recorded", file=sys.stderr, flush=True)
        elif item.type in TERMINAL_EVENTS:
            if bars is not None:
                bars.settle()
            return item
    raise RuntimeError("log ended without a terminal event")


def live_part(item: Any, streamed: dict[tuple[str, int], int]) -> None:
    """A part of a step's output, printed as it comes: `step | line`, in order, once."""
    key = (str(item.data.get("command_id")), int(item.data.get("delivery", 0)))
    part = int(item.data.get("part", 0))
    if streamed.get(key, 0) != part:
        return  # a copy, or a part of a run whose start was not seen
    streamed[key] = part + 1
    text = str(item.data.get("text", ""))
    lines = text.rstrip("\n").split("\n") if text else []
    if lines:
        print("\n".join(f"    {item.step} | {line}" for line in lines), flush=True)


def streamed_already(out: StepOutput, streamed: dict[tuple[str, int], int]) -> bool:
    """Every part of `out` was printed while its step ran (what was cut is left out
    of `run`: `actors-cli logs` shows it)."""
    return bool(out.parts) and streamed.get((out.command_id, out.delivery)) == out.parts


def _activation(command_id: str) -> int:
    """The activation a step's command belongs to (`<activation>-<attempt>`)."""
    head = command_id.split("-", 1)[0]
    return int(head) if head.isdigit() else -1


def _show(outputs: list[StepOutput], eid: str, step: str | None) -> None:
    """What a step printed, under its line: each attempt's, and the first iterations'."""
    direct = [o for o in outputs if o.iteration_index is None]
    iterations = sorted((o for o in outputs if o.iteration_index is not None), key=lambda o: o.iteration_index or 0)
    for o in direct + iterations[:SHOWN_ITERATIONS]:
        if len(outputs) > 1:
            print(f"    {output_header(o)}")
        print("\n".join(excerpt_lines(o, eid)), flush=True)
    if len(iterations) > SHOWN_ITERATIONS:
        more = len(iterations) - SHOWN_ITERATIONS
        print(f"    ... {more} more iterations printed output: actors-cli logs {eid} --step {step}", flush=True)
