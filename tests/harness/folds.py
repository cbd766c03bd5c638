"""The pure cores as the shells call them, and replay: every call into
actors/core is here. The engine's `fold` with the reply subject a shell would give it,
the counter's `fold_loop` with the spec's parsed step and the execution's template
limits; outputs turned into plain data; and the determinism check: a run's log
replayed by the core's Replayer (actors/core/replay.py), the one the engine, the
counter and the client use."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from actors.core.decide import fold
from actors.core.effects import Effects
from actors.core.loop import LoopRun
from actors.core.replay import (
    LogRecord,
    Mismatch,
    Recorded,
    Replayer,
    loop_fold,
    replay_execution,
    replay_loop,
)
from actors.core.state import Execution
from actors.wire.events import FailureDecidedData, decision_decoder, event_decoder
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


# --- replay: the core's Replayer (actors/core/replay.py), on a run's log -------------


def log_of(run: Run) -> list[LogRecord]:
    """A harness run as the log a shell would read: each input, then its decision
    record and its lifecycle events (values through JSON, as the engine stores them)."""
    subjects = exec_subjects(run.execution_id)
    log: list[LogRecord] = []
    for (inp, seq, at), out in zip(run.inputs, run.outputs, strict=True):
        tag = type(inp).__struct_config__.tag or type(inp).__name__
        log.append(LogRecord(seq, subjects.input(str(tag)), at, "in", inp))
        if out["events"]:
            record = msgspec.json.encode({"cause": seq, "events": out["events"]})
            log.append(LogRecord(seq, subjects.decision, at, "ev", decision_decoder.decode(record)))
        for ev in out["lifecycle"]:
            log.append(
                LogRecord(seq, subjects.lifecycle(ev["type"]), at, "lc", event_decoder.decode(msgspec.json.encode(ev)))
            )
    return log


def loop_log(run: Run, loop_id: str) -> list[LogRecord]:
    """One loop's inputs as its log (the harness numbers them in order)."""
    subjects = loop_subjects(run.execution_id, loop_id)
    return [LogRecord(i + 1, subjects.inputs, at, "in", inp) for i, (inp, at, _) in enumerate(run.loops[loop_id])]


def mismatch(run: Run, *, read_back: bool = True) -> Mismatch | None:
    """The first decision of `run` (or of one of its loops) a replay does not
    reproduce, as the engine and the counter would report it."""
    found = replay_execution(
        run.execution_id, log_of(run), subjects=exec_subjects(run.execution_id), read_back=read_back
    ).mismatch
    if found is not None:
        return found
    for loop_id in run.loops:
        found = replay_loop(
            run.execution_id, loop_id, loop_log(run, loop_id), subjects=loop_subjects(run.execution_id, loop_id)
        ).mismatch
        if found is not None:
            return found
    return None


def replay(run: Run, *, read_back: bool = True) -> bool:
    """Fold `run`'s recorded inputs again, into fresh state, through the Replayer as a
    replaying engine (and counter) would: True when it reports no mismatch and every
    output (commands, timers and loops too, which the harness keeps beside the log) is
    the same as the first time. With `read_back`, failure decisions are read back from
    the log as the engine does; without, the rules are evaluated again (and must decide
    the same)."""
    eid = run.execution_id
    again = replay_execution(eid, log_of(run), subjects=exec_subjects(eid), read_back=read_back)
    if again.mismatch is not None or [plain(fx) for _, fx in again.outputs] != run.outputs:
        return False
    for loop_id, entries in run.loops.items():
        looped = replay_loop(eid, loop_id, loop_log(run, loop_id), subjects=loop_subjects(eid, loop_id))
        if looped.mismatch is not None or [plain(fx) for fx in looped.outputs] != [first for _, _, first in entries]:
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
    read_back = Recorded(
        failures={key: msgspec.convert(data, FailureDecidedData) for key, data in (recorded or {}).items()}
    )
    ex = Replayer(execution_id, read_back).fresh()
    subjects = subjects or exec_subjects(execution_id)
    return [plain(fold(ex, inp, seq=seq, at=at, subjects=subjects)) for inp, seq, at in inputs]


def decisions(output: Any) -> list[dict[str, Any]]:
    """The events one decision (an item of `refold`) writes to the log: its decision
    record's events, then its lifecycle events, as plain data."""
    return [*output["events"], *output["lifecycle"]]


def counter_fold(state: LoopRun, inp: Any, at: float) -> Effects:
    """Fold one input of a loop's log as the counter does (the core's `loop_fold`)."""
    return loop_fold(state, inp, at, loop_subjects(state.execution_id, state.loop_id))
