"""The corpus: logs an earlier release recorded (tests/corpus/*.jsonl, written by
`python -m tests.corpus.record`) replayed by this code through the engine's own
Replayer (actors/core/replay.py) to identical decisions: every decision record and
lifecycle event of every execution, every answer in every loop's log, and the state
each execution ended in; and every answer in an execution's log is where the
replayed command would send it. A change that would make a running execution decide
otherwise after an upgrade fails here, naming the first record it does not reproduce
(docs/upgrades.md).

Blobs the logs name (big values, start payloads) are served by a real nats-server's
object store, filled from the file, and read back by the engine's own code; values
sealed with the file's payload key are opened with it, as a pod holding it would."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from actors.config.settings import Settings
from actors.core.effects import Effects
from actors.core.replay import LogRecord, Mismatch, answer_records, lifecycle_records, replay_execution, replay_loop
from actors.engine.readback import read_back
from actors.natsio.binding import bind, codec_of
from actors.pod.roles import connect
from actors.store.blobs import get_blob, resolve_chunk, resolve_result
from actors.wire.events import ExecState, answer_decoder, decision_decoder, event_decoder, extras_decoder
from actors.wire.messages import (
    CallDone,
    CallError,
    ChunkDone,
    IteratorCompleted,
    IteratorFailed,
    LoopSpec,
    answer_subject,
    input_decoder,
    loop_input_decoder,
)
from streams.layout import ensure
from streams.server import NatsServer
from streams.subjects import EV, IN, LC, ExecSubjects, LoopSubjects, class_of, is_answer_record, loop_class
from tests.conftest import make_layout
from tests.corpus.load import Corpus, Entry, corpus_files, load

pytestmark = [pytest.mark.timeout(120)]

FILES = corpus_files()


def _prefix(entries: list[Entry], tokens: int) -> str:
    return ".".join(entries[0].subject.split(".")[:tokens])


async def _execution_log(js: Any, entries: list[Entry]) -> list[LogRecord]:
    codec = codec_of(js)
    log: list[LogRecord] = []
    for e in entries:
        cls = class_of(e.subject)
        value: Any = None
        if cls == IN and is_answer_record(e.subject):  # a result (6: or the start) with its decision (5)
            held = codec.decode(answer_decoder, e.data)  # `in.answer.lc.<type>`: with its lifecycle events
            record = held.record
            answer = codec.decode(input_decoder, bytes(record.answer)) if record.answer is not None else None
            if answer is not None:
                answer = await read_back(js, answer)  # a start's payload blob (semantics 6)
            log += answer_records(e.seq, e.subject, record, answer, held.lifecycle)
            continue
        if cls == IN:
            value = await read_back(js, codec.decode(input_decoder, e.data))
        elif cls == EV:
            value = codec.decode(decision_decoder, e.data)
        elif cls == LC:
            ev, extras = codec.decode(event_decoder, e.data), codec.decode(extras_decoder, e.data)
            log += lifecycle_records(e.seq, e.subject, e.time, ev, extras)
            continue
        log.append(LogRecord(e.seq, e.subject, e.time, cls, value))
    return log


async def _loop_log(js: Any, entries: list[Entry]) -> list[LogRecord]:
    """A loop's inputs with what they name read back, as the counter reads them."""
    codec = codec_of(js)
    log: list[LogRecord] = []
    for e in entries:
        if loop_class(e.subject) != IN:
            continue
        inp: Any = codec.decode(loop_input_decoder, e.data)
        if isinstance(inp, LoopSpec):
            if inp.collection is None and inp.collection_ref:
                inp.collection = await get_blob(js, inp.collection_ref)
            if inp.scope_ref is not None:
                inp.scope = await get_blob(js, inp.scope_ref)
        elif isinstance(inp, CallDone) and inp.result_ref is not None:
            inp = await resolve_result(js, inp)
        elif isinstance(inp, ChunkDone):
            inp = await resolve_chunk(js, inp)
        log.append(LogRecord(e.seq, e.subject, e.time, IN, inp))
    return log


def _misaddressed(eid: str, log: list[LogRecord], outputs: list[tuple[int, Effects]]) -> list[str]:
    """Each answer in the log stored where the replayed command (or child start) no
    longer sends it, and each command that no longer names a subject of its own: a
    reply subject is part of what an execution's semantics fixes (semantics 4: a tool
    of this version answers on the shared `in.result`, `Command.answer_on`, an older
    tool pod on the command's own `reply_to`; before 4 only the latter), and a decision
    record's comparison does not look at commands."""
    allowed: dict[str, set[str]] = {}
    asked: dict[str, str] = {}  # semantics 5: a command whose answer may be in its execution's answer record
    own: list[str] = []
    for _, fx in outputs:
        for c in fx.commands:
            allowed[c.command_id] = {answer_subject(c), c.reply_to}
            if c.ask_on:
                asked[c.command_id] = c.reply_to.split(f".{IN}.", 1)[0] + "."
            if c.iteration_index is None and not c.reply_to.endswith(f".{IN}.result.{c.command_id}"):
                own.append(f"{eid}: command {c.command_id} names no subject of its own: {c.reply_to}")
        for st in fx.starts:
            if st.parent and st.parent.reply_to:
                allowed[st.parent.command_id] = {st.parent.reply_to}
        for spec in fx.loops:  # a verdict: where this code's counter sends it, or an older one
            allowed[f"loop:{spec.loop_id}"] = {spec.answer_on or spec.reply_to, spec.reply_to}
    return own + [
        f"{eid}: the answer to {key} is on {r.subject}; this code sends it to {sorted(allowed[key])}"
        for r in log
        if r.cls == IN
        and (key := _answers(r.value)) is not None
        and key in allowed
        and r.subject not in allowed[key]
        and not (key in asked and is_answer_record(r.subject) and r.subject.startswith(asked[key]))
    ]


def _answers(value: Any) -> str | None:
    """What an input answers: a command (by its id) or a loop (`loop:<id>`)."""
    if isinstance(value, (CallDone, CallError)):
        return value.command_id
    if isinstance(value, (IteratorCompleted, IteratorFailed)):
        return f"loop:{value.loop_id}"
    return None


async def _replay(js: Any, corpus: Corpus) -> tuple[list[Mismatch | str], dict[str, str]]:
    """Every execution and loop of the file replayed: the mismatches (and answers the
    replayed commands would send elsewhere), and the state each execution's replay ends
    in."""
    found: list[Mismatch | str] = []
    states: dict[str, str] = {}
    for eid in corpus.executions():
        entries = corpus.execution_log(eid)
        log = await _execution_log(js, entries)
        replay = replay_execution(eid, log, subjects=ExecSubjects(_prefix(entries, 3)))
        if replay.mismatch is not None:
            found.append(replay.mismatch)
        found += _misaddressed(eid, log, replay.outputs)
        states[eid] = str(replay.state.status)
        for loop_id, loop_entries in corpus.loop_logs(eid).items():
            looped = replay_loop(
                eid, loop_id, await _loop_log(js, loop_entries), subjects=LoopSubjects(_prefix(loop_entries, 4))
            )
            if looped.mismatch is not None:
                found.append(looped.mismatch)
    return found, states


async def replay_file(server: NatsServer, path: Path) -> tuple[Corpus, list[Mismatch | str], dict[str, str]]:
    corpus = load(path)
    nc = await connect(server.url, name="corpus")
    try:
        bind(nc, Settings(payload_key=corpus.payload_key).payload_codec)
        js = nc.jetstream()
        await ensure(js, make_layout())
        for (bucket, key), data in corpus.blobs.items():
            await (await js.object_store(bucket)).put(key, data)
        found, states = await _replay(js, corpus)
    finally:
        await nc.close()
    return corpus, found, states


def test_the_corpus_is_there() -> None:
    """Without recorded logs the corpus test would pass by checking nothing."""
    assert FILES, "tests/corpus holds no *.jsonl: record it (python -m tests.corpus.record)"


@pytest.mark.asyncio
@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
async def test_a_recorded_execution_replays_to_the_decisions_it_recorded(nats_server: NatsServer, path: Path) -> None:
    corpus, found, states = await replay_file(nats_server, path)
    assert not found, "\n".join(m if isinstance(m, str) else m.describe() for m in found)
    assert corpus.execution_id in states, f"{path.name} holds no log of {corpus.execution_id}"
    assert corpus.state in {s.value for s in ExecState}
    assert states[corpus.execution_id] == corpus.state
