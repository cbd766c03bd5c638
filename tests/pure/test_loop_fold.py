"""The counter's pure core: whatever order results arrive in, however often they are
delivered, alone or gathered into batches (an iteration may be answered in two
batches), each iteration is counted once, the concurrency bound holds, the verdict
comes once with results in collection order, and a replay decides the same."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.core.effects import Effects
from actors.core.loop import LoopRun, fold_loop, tolerated
from actors.playbook.loader import parsed_playbook
from actors.playbook.model import Loop
from actors.wire.messages import (
    CallDone,
    CallError,
    ChunkDone,
    Command,
    ErrorInfo,
    IterationOutcome,
    IterationResult,
    Limits,
    LoopInput,
    LoopSpec,
    ResultBatch,
)
from streams.subjects import LoopSubjects

pytestmark = pytest.mark.timeout(60)

SOURCE = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: fold}
workflow:
  - step: each
    tool: {kind: noop}
    args: {v: "{{ x }}"}
    loop: {collection: [], element: x, mode: %s, concurrency: %d, chunk_size: %d, tolerated_failures: %d}
"""


SUBJECTS = LoopSubjects("loop.0.e1.0-1")


def spec_for(n: int, source: str) -> LoopSpec:
    return LoopSpec(
        execution_id="e1",
        loop_id="0-1",
        step="each",
        playbook_path="fold",
        playbook_source=source,
        collection=list(range(n)),
        reply_to="exec.0.e1.in.iterator.0-1",
    )


def answer(cmd: Command, fail: set[int]) -> LoopInput:
    if cmd.chunk is not None:
        return ChunkDone(
            execution_id="e1",
            command_id=cmd.command_id,
            step="each",
            attempt_number=1,
            outcomes=[
                IterationOutcome(
                    iteration_index=i.iteration_index,
                    result=i.args["v"],
                    error=ErrorInfo(type="Boom", message="x") if i.iteration_index in fail else None,
                )
                for i in cmd.chunk
            ],
        )
    assert cmd.iteration_index is not None
    if cmd.iteration_index in fail:
        return CallError(
            execution_id="e1",
            command_id=cmd.command_id,
            step="each",
            attempt_number=cmd.attempt_number,
            error=ErrorInfo(type="Boom", message="x"),
            iteration_index=cmd.iteration_index,
        )
    return CallDone(
        execution_id="e1",
        command_id=cmd.command_id,
        step="each",
        attempt_number=cmd.attempt_number,
        result=cmd.args["v"],
        iteration_index=cmd.iteration_index,
    )


def entry(res: CallDone | CallError) -> IterationResult:
    """A single answer as a tool actor writes it into a batch."""
    return IterationResult(
        command_id=res.command_id,
        attempt_number=res.attempt_number,
        iteration_index=res.iteration_index,
        result=res.result if isinstance(res, CallDone) else None,
        error=res.error if isinstance(res, CallError) else None,
    )


def drive(
    n: int, mode: str, concurrency: int, chunk: int, tol: int, fail: set[int], seed: int, batching: bool = False
) -> tuple[list[LoopInput], list[Effects], LoopRun]:
    """Run a loop to its end, answering commands in a random order and delivering some
    answers twice; with `batching`, answers often go out several at a time in one
    `result.batch` (and a batch may repeat answers delivered before, alone or in
    another batch). Return the log (inputs in order) and every output."""
    rng = random.Random(seed)
    source = SOURCE % (mode, concurrency, chunk, tol)
    step = parsed_playbook(source, "fold", Limits().max_attempts).step("each")
    run = LoopRun(execution_id="e1", loop_id="0-1")
    spec = spec_for(n, source)
    log: list[LoopInput] = [spec]
    outs = [fold_loop(run, spec, at=0.0, subjects=SUBJECTS, step=step)]
    open_: list[Command] = list(outs[0].commands)
    delivered: list[LoopInput] = []
    answered: list[IterationResult] = []  # every single answer given so far, as a batch entry
    while open_ or delivered:
        inp: LoopInput
        if delivered and rng.random() < 0.2:
            inp = rng.choice(delivered)  # a redelivery
        else:
            if not open_:
                break
            singles = [c for c in open_ if c.chunk is None]
            if batching and singles and rng.random() < 0.6:
                picked = rng.sample(singles, rng.randint(1, min(len(singles), 6)))
                for c in picked:
                    open_.remove(c)
                entries = [entry(a) for a in (answer(c, fail) for c in picked) if isinstance(a, (CallDone, CallError))]
                answered += entries
                if rng.random() < 0.3:
                    entries.append(rng.choice(answered))  # answered again, in a second batch
                rng.shuffle(entries)
                inp = ResultBatch(execution_id="e1", loop_id="0-1", step="each", results=entries)
            else:
                inp = answer(open_.pop(rng.randrange(len(open_))), fail)
                if isinstance(inp, (CallDone, CallError)):
                    answered.append(entry(inp))
            delivered.append(inp)
        log.append(inp)
        out = fold_loop(run, inp, at=float(len(log)), subjects=SUBJECTS)
        outs.append(out)
        open_ += out.commands
        assert len(run.inflight) <= (1 if mode == "sequential" else concurrency)
        if run.finished:
            break
    return log, outs, run


@settings(max_examples=120, deadline=None)
@given(
    n=st.integers(1, 60),
    mode=st.sampled_from(["async", "sequential", "chunked"]),
    concurrency=st.integers(1, 8),
    chunk=st.integers(1, 7),
    tol=st.integers(0, 5),
    fail_ratio=st.floats(0, 0.3),
    seed=st.integers(0, 10_000),
    batching=st.booleans(),
)
def test_each_iteration_counted_once_and_one_verdict(
    n: int, mode: str, concurrency: int, chunk: int, tol: int, fail_ratio: float, seed: int, batching: bool
) -> None:
    fail = {i for i in range(n) if random.Random(seed + i).random() < fail_ratio}
    log, outs, _ = drive(n, mode, concurrency, chunk, tol, fail, seed, batching)
    verdicts = [o.verdict for o in outs if o.verdict is not None]
    assert len(verdicts) == 1
    v = verdicts[0]
    if len(fail) > tol:
        assert v.failed == tol + 1 and type(v).__name__ == "IteratorFailed"  # fails fast
    else:
        assert type(v).__name__ == "IteratorCompleted"
        assert (v.total, v.succeeded, v.failed) == (n, n - len(fail), len(fail))
        assert v.results == [None if i in fail else i for i in range(n)]
    issued = [c.command_id for o in outs for c in o.commands]
    assert len(issued) == len(set(issued))  # no command twice
    # a replay of the same log decides exactly the same
    source = SOURCE % (mode, concurrency, chunk, tol)
    again = LoopRun(execution_id="e1", loop_id="0-1")
    step = parsed_playbook(source, "fold", Limits().max_attempts).step("each")
    replayed = [
        fold_loop(again, inp, at=0.0 if i == 0 else float(i + 1), subjects=SUBJECTS, step=step if i == 0 else None)
        for i, inp in enumerate(log)
    ]
    assert [[c.command_id for c in o.commands] for o in replayed] == [[c.command_id for c in o.commands] for o in outs]
    assert [o.verdict for o in replayed] == [o.verdict for o in outs]


@pytest.mark.parametrize(
    ("tf", "total", "count"),
    [(3, 10, 3), ("10%", 10, 1), ("10%", 9, 0), ("50%", 7, 3), ("100%", 4, 4), ("0%", 100, 0), ("2.5%", 1000, 25)],
)
def test_tolerated_failures_as_a_count(tf: int | str, total: int, count: int) -> None:
    assert tolerated(Loop(collection=[], element="x", tolerated_failures=tf), total) == count
