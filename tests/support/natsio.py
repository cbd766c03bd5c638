"""Messages as a plain nats-py subscriber receives them, for comparing what the actors'
own NATS code puts on the wire with what nats-py would; an execution's log as stored,
and the starts a stream holds."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any


async def received(nc: Any, n: int, subject: str = "t.>") -> tuple[asyncio.Event, list[Any]]:
    """(an event set once `n` messages on `subject` came, the messages so far)."""
    got: list[Any] = []
    done = asyncio.Event()

    async def cb(msg: Any) -> None:
        got.append(msg)
        if len(got) == n:
            done.set()

    await nc.subscribe(subject, cb=cb)
    return done, got


async def execution_log(nc: Any, layout: Any, execution_id: str) -> list[tuple[str, bytes, int, float]]:
    """An execution's log as stored in EXEC: (subject, data, stream seq, log time) in
    stream order, read with an ordered consumer."""
    from actors.natsio import log_time, stream_seq
    from streams.layout import EXEC_STREAM

    sub = await nc.jetstream().subscribe(layout.execution(execution_id).log, stream=EXEC_STREAM, ordered_consumer=True)
    out = []
    try:
        while True:
            msg = await sub.next_msg(timeout=5)
            out.append((msg.subject, msg.data, stream_seq(msg), log_time(msg)))
            if msg.metadata.num_pending == 0:
                return out
    finally:
        await sub.unsubscribe()


# what tests/support/playbooks.py THREE_STEPS stores in its log from semantics 6 where
# asks are served: the start with the first decision (holding a's command), a's result
# with the decision holding b's, b's with c's, c's with the execution's end
THREE_STEPS_ANSWERED = [
    "in.answer.lc.playbook.initialized.cmd.python",
    "in.answer.cmd.python",
    "in.answer.cmd.python",
    "in.answer.lc.playbook.completed",
]


def log_kinds(log: list[tuple[str, bytes, int, float]]) -> list[str]:
    """Each message of `log` (`execution_log`) by its subject past `exec.<p>.<id>.`."""
    return [subject.split(".", 3)[3] for subject, _, _, _ in log]


async def stored_starts(nc: Any, prefix: str = "", stream: str = "EXEC") -> Counter[str]:
    """How many starts the stream holds for each execution whose id starts with
    `prefix`: start records (`in.start`), and (semantics 6) starts stored with their
    first decision, the log's first input: an answer record of cause 0, on a subject
    carried by `playbook.initialized`, or by the end when that decision ended the
    execution (a step the engine decides alone: `in.answer.lc.playbook.completed`)."""
    from actors.wire.messages import start_of_record_answer
    from streams.subjects import is_start_answer

    counts: Counter[str] = Counter()
    for filter_ in ("exec.*.*.in.start", "exec.*.*.in.answer.lc.>"):
        info = await nc.jsm().stream_info(stream, subjects_filter=filter_)
        for subject, n in (info.state.subjects or {}).items():
            eid = subject.split(".")[2]
            if not eid.startswith(prefix):
                continue
            if subject.endswith(".in.start") or is_start_answer(subject):
                counts[eid] += n
            elif start_of_record_answer((await nc.jsm().get_msg(stream, 1, subject=subject, next=True)).data or b""):
                counts[eid] += 1  # a start whose first decision ended it (one message, one start)
    return counts
