"""The pure cores as the shells call them, and replay: every call into
actors/core is here. The engine's `fold` with the reply subject a shell would give it,
the counter's `fold_loop` with the spec's parsed step and the execution's template
limits; outputs turned into plain data; and the determinism check, folding recorded
inputs again into fresh state."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from actors.core.decide import fold
from actors.core.effects import Effects
from actors.core.loop import LoopRun, fold_loop
from actors.core.state import Execution
from actors.playbook.loader import parsed_playbook
from actors.playbook.templates import call_with_limits
from actors.wire.events import FailureDecidedData
from actors.wire.messages import LoopSpec
from streams.subjects import ExecSubjects, LoopSubjects
from tests.harness.view import Run


def plain(value: Any) -> Any:
    """A core value (Struct, dataclass) as plain data."""
    return msgspec.to_builtins(value)


def engine_fold(ex: Execution, inp: Any, seq: int, at: float) -> Effects:
    """Fold one input into an execution, as the engine shell does."""
    return fold(ex, inp, seq=seq, at=at, subjects=exec_subjects(ex.execution_id))


# --- subjects: only the harness reads them (the cores put them in reply_to) ------------


def exec_subjects(eid: str) -> ExecSubjects:
    return ExecSubjects.of(eid, 1)


def loop_subjects(eid: str, loop_id: str) -> LoopSubjects:
    return LoopSubjects.of(eid, loop_id, 1)


def target_of(subject: str) -> tuple[str, ...]:
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
        if [plain(counter_fold(state, inp, at)) for inp, at, _ in log] != [first for _, _, first in log]:
            return False
    return True


def refold(
    execution_id: str,
    inputs: Iterable[tuple[Any, int, float]],
    *,
    subjects: ExecSubjects | None = None,
    recorded: dict[tuple[int, int], dict[str, Any]] | None = None,
) -> list[Any]:
    """Fold an execution's inputs (each with its stream sequence and log time) into
    fresh state, as a replaying engine does, with `recorded` failure decisions read
    back; each decision's outputs as plain data (see `decisions`)."""
    read_back = {key: msgspec.convert(data, FailureDecidedData) for key, data in (recorded or {}).items()}
    ex = Execution(execution_id=execution_id, recorded=read_back)
    subjects = subjects or exec_subjects(execution_id)
    return [plain(fold(ex, inp, seq=seq, at=at, subjects=subjects)) for inp, seq, at in inputs]


def decisions(output: Any) -> list[dict[str, Any]]:
    """The events one decision (an item of `refold`) writes to the log: its decision
    record's events, then its lifecycle events, as plain data."""
    return [*output["events"], *output["lifecycle"]]


def counter_fold(state: LoopRun, inp: Any, at: float) -> Effects:
    """Fold one input of a loop's log as the counter does: the spec with its parsed
    step, every input under the execution's template limits."""
    spec = inp if isinstance(inp, LoopSpec) else state.spec
    assert spec is not None, "a loop's log starts with its spec"
    step = (
        parsed_playbook(inp.playbook_source, inp.playbook_path, spec.limits.max_attempts).step(inp.step)
        if isinstance(inp, LoopSpec)
        else None
    )
    subjects = loop_subjects(state.execution_id, state.loop_id)
    return call_with_limits(spec.limits, lambda: fold_loop(state, inp, at=at, subjects=subjects, step=step))
