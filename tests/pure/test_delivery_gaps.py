"""actors/runtime/gaps.py and what a log actor does with it (actors/runtime/logactor.py
`in_order`, `overtaken`): which deliveries may have had an input lost before them, when
the actor asks its log whether an input is the next one, and that an input lost on the
way is folded in its place by a replay, never skipped and never folded after a later one.
The log is a list here (the lookup and the replay read it); the real server's part is in
tests/system/test_lost_deliveries.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from nats.aio.msg import Msg

import actors.runtime.logactor as logactor
from actors.natsio.metadata import stream_seq
from actors.runtime.gaps import DeliveryGaps, mark
from actors.runtime.logactor import LogActor

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(10)]


async def test_deliveries_numbered_one_after_another_stay_in_one_epoch() -> None:
    gaps = DeliveryGaps()
    first = gaps.delivered("EXEC", "engine-p0", 41)  # the first seen counts as after a gap
    assert [gaps.delivered("EXEC", "engine-p0", n) for n in (42, 43, 44)] == [first] * 3
    assert gaps.epoch("EXEC", "engine-p0") == first


async def test_a_number_skipped_or_repeated_starts_a_new_epoch_on_that_consumer_only() -> None:
    gaps = DeliveryGaps()
    a = gaps.delivered("LOOP", "counter-p1", 1)
    b = gaps.delivered("LOOP", "counter-p2", 1)
    skipped = gaps.delivered("LOOP", "counter-p1", 3)  # delivery 2 never arrived
    assert skipped == a + 1
    assert gaps.delivered("LOOP", "counter-p1", 4) == skipped
    assert gaps.delivered("LOOP", "counter-p1", 2) == skipped + 1  # numbered back: a new leader, a consumer made again
    assert gaps.delivered("LOOP", "counter-p2", 2) == b  # the other consumer saw no gap
    assert gaps.epoch("EXEC", "engine-p1") == 0  # a consumer never seen


class _Actor(LogActor):
    source = "test"
    stream = "EXEC"


def _folded(live: list[int], *, replayed_to: int = 0) -> LogActor:
    actor: Any = _Actor.__new__(_Actor)
    LogActor.__init__(actor, host=None, key="x", execution_id="x", outbox=None)  # type: ignore[arg-type]
    actor.last_seq = replayed_to
    actor.replayed_to = replayed_to
    for seq in live:
        actor.folded(seq)
    return actor


async def test_an_input_before_the_last_folded_one_that_was_never_folded_is_overtaken() -> None:
    actor = _folded([12, 15, 19], replayed_to=10)
    assert [s for s in range(1, 25) if actor.overtaken(s)] == [11, 13, 14, 16, 17, 18]
    # at or before the replay's end: folded by it; after the last folded: not yet seen
    assert not actor.overtaken(10) and not actor.overtaken(20)


class _Log:
    """A loop's log (its inputs' stream sequences) and what an actor did with it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, stored: list[int]) -> None:
        self.stored = stored
        self.asked: list[int] = []  # lookups: the first input after this sequence
        self.acked: list[int] = []

        async def next_message(nc: Any, stream: str, subject: str, *, after: int) -> Any:
            self.asked.append(after)
            return SimpleNamespace(seq=min(s for s in self.stored if s > after))

        async def ack(msg: Msg) -> None:
            self.acked.append(stream_seq(msg))

        monkeypatch.setattr(logactor, "next_message", next_message)
        monkeypatch.setattr(logactor, "ack", ack)


class _Folding(LogActor):
    """Folds by noting the sequence; a replay (-1) folds the whole log."""

    source = "test"
    stream = "LOOP"
    max_batch = 100

    def __init__(self, log: _Log, *, folded_through: int, epoch: int) -> None:
        host = SimpleNamespace(nc=None, gap_epoch=lambda stream, key: epoch)
        super().__init__(host, key="k", execution_id="x", outbox=None)  # type: ignore[arg-type]
        self.log, self.folds = log, list[int]()
        self.hydrated, self.last_seq, self.replayed_to, self.seen_epoch = True, folded_through, folded_through, epoch

    @property
    def finished(self) -> bool:
        return False

    def log_inputs(self) -> str:
        return "loop.0.x.l.in.>"

    async def fold_input(self, entry: Any, into: Any = None) -> Any:
        self.last_seq = entry.seq
        self.folds.append(entry.seq)
        return None

    async def rehydrate(self) -> None:
        self.folds.append(-1)
        self.last_seq, self.hydrated = max(self.log.stored), True


def _delivered(seq: int, *, number: int, deliveries: int = 1, epoch: int) -> Msg:
    reply = f"$JS.ACK.LOOP.counter-p0.{deliveries}.{seq}.{number}.1764241234123456789.0"
    msg = Msg(_client=None, subject=f"loop.0.x.l.in.res.c{seq}", reply=reply, data=b"")  # type: ignore[arg-type]
    mark(msg, epoch, again=deliveries > 1)
    return msg


async def test_inputs_in_one_epoch_are_folded_with_no_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    log = _Log(monkeypatch, [9, 10, 11])
    actor = _Folding(log, folded_through=8, epoch=1)
    await actor.handle([_delivered(s, number=s, epoch=1) for s in (9, 10, 11)])
    assert (actor.folds, log.asked, log.acked) == ([9, 10, 11], [], [9, 10, 11])


async def test_after_a_gap_the_next_input_is_asked_for_once(monkeypatch: pytest.MonkeyPatch) -> None:
    log = _Log(monkeypatch, [9, 10, 11])
    actor = _Folding(log, folded_through=8, epoch=1)
    await actor.handle([_delivered(9, number=20, epoch=2)])
    await actor.handle([_delivered(10, number=21, epoch=2), _delivered(11, number=22, epoch=2)])
    assert (actor.folds, log.asked) == ([9, 10, 11], [8])


async def test_an_input_lost_before_the_next_one_is_folded_by_a_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    log = _Log(monkeypatch, [9, 10, 11])
    actor = _Folding(log, folded_through=8, epoch=1)
    await actor.handle([_delivered(10, number=21, epoch=2)])  # 9 was lost on the way
    assert actor.folds == [-1] and actor.last_seq == 11
    await actor.handle([_delivered(9, number=30, deliveries=2, epoch=3)])  # back after ack_wait: folded already
    assert actor.folds == [-1] and log.acked == [10, 9]


async def test_two_inputs_lost_together_come_back_apart_and_neither_is_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """9 and 11 lost in one outage; 9 comes back, 12 comes for the first time, then 11:
    no gap shows between them, yet 12 must not be folded before 11."""
    log = _Log(monkeypatch, [9, 11, 12])
    actor = _Folding(log, folded_through=8, epoch=1)
    await actor.handle([_delivered(9, number=30, deliveries=2, epoch=2)])
    await actor.handle([_delivered(12, number=31, epoch=2)])
    assert actor.folds == [9, -1]  # 12 not folded live: a replay folded 11 and 12 in order
    log2 = _Log(monkeypatch, [9, 11, 12])
    actor = _Folding(log2, folded_through=8, epoch=1)
    batch = [
        _delivered(9, number=30, deliveries=2, epoch=2),
        _delivered(12, number=31, epoch=2),
        _delivered(11, number=32, deliveries=2, epoch=2),
    ]
    await actor.handle(batch)  # all three in one batch (a counter takes up to 4096)
    assert actor.folds == [-1] and sorted(log2.acked) == [9, 11, 12]
