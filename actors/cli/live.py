"""The live view of a running execution (`actors-cli run`): a line per finished step on
stdout, what it printed indented under it, a progress bar per running loop on stderr."""

from __future__ import annotations

import sys
from typing import Any

from actors.cli.logs import excerpt_lines, output_header
from actors.events import ActivationStatus, EventType, StepOutput

# iterations of one loop step whose output `run` shows under it (the rest: `actors-cli logs`)
SHOWN_ITERATIONS = 20


async def progress_bars(client: Any, eid: str) -> None:
    """A progress bar per running loop on stderr: redrawn in place on a terminal, a
    line a second (and the last one) otherwise."""
    tty = sys.stderr.isatty()
    shown: dict[str, float] = {}
    first: dict[str, tuple[float, int]] = {}
    async for p in client.progress(eid):
        t0, d0 = first.setdefault(p.loop_id, (p.at, p.done))
        finished = p.done >= p.total
        if not tty and not finished and p.at - shown.get(p.loop_id, 0.0) < 1.0:
            continue
        shown[p.loop_id] = p.at
        rate = (p.done - d0) / (p.at - t0) if p.at > t0 else 0.0
        width = 30
        filled = int(width * p.done / p.total) if p.total else width
        line = (
            f"  {p.step:20} [{'#' * filled}{'.' * (width - filled)}] {p.done}/{p.total}"
            f"  {rate:,.0f} it/s  {p.in_flight} in flight" + (f"  {p.failed} failed" if p.failed else "")
        )
        if tty:
            sys.stderr.write("\r" + line + ("\n" if finished else ""))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


async def follow_steps(client: Any, eid: str, *, quiet: bool) -> Any:
    """Print a line per finished step while the execution runs; return its terminal
    lifecycle event."""
    from actors.events import TERMINAL_EVENTS

    entered: dict[int, float] = {}
    printed: dict[int, list[StepOutput]] = {}  # a step's output, shown under its line
    loops: set[int] = set()  # activations that ran a loop: their iterations' output is in LOOP
    t0: float | None = None
    async for item in client.follow(eid):
        t0 = item.at if t0 is None else t0
        if item.type == EventType.STEP_ENTER:
            entered[item.data.get("activation", -1)] = item.at
        elif item.type == EventType.ITERATOR_STARTED:
            loops.add(item.data.get("activation", -1))
        elif item.type == "step.output" and not quiet:
            out = StepOutput(execution_id=eid, step=item.step or "", **item.data)
            printed.setdefault(_activation(out.command_id), []).append(out)
        elif item.type == EventType.STEP_EXIT and not quiet:
            began = entered.get(item.data.get("activation", -1), item.at)
            status = item.data.get("status", "")
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
        elif item.type in TERMINAL_EVENTS:
            return item
    raise RuntimeError("log ended without a terminal event")


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
