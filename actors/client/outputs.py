"""What an execution's steps printed (`StepOutput` events, written by tool actors when a
step ends, and `StepOutputPart` events written while it runs; see actors/tools/outputs.py):
read as it is, or followed live until the execution ends, and the whole text of one.

Which run is shown: per command (per iteration of a chunk), the last delivery's. A
command delivered again after its pod died runs again and writes parts and a
`step.output` of its own delivery; readers show those, never the earlier run's mixed in
(`follow_printed` has shown the earlier run's lines already: it starts the later run
under a header of its own). A step still running (parts, no `step.output` yet) is read
as a `RunningOutput`: its text so far.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from actors.client.checks import check_execution_id
from actors.client.reading import Reader
from actors.playbook.loader import parsed_playbook
from actors.store.blobs import BLOB_MISSING, get_blob_bytes, stored_bytes
from actors.wire.events import StepOutput, StepOutputPart, any_output_decoder
from streams.layout import LOOP_STREAM
from streams.subjects import loop_outputs_filter

__all__ = ["Printed", "RunningOutput", "StepOutputs", "cut_marker", "output_key"]

Record = StepOutput | StepOutputPart


class RunningOutput(StepOutput, tag="step.output.running"):
    """What a step still running printed so far (its parts joined): never stored, made
    by readers. `size` counts the bytes shown so far."""


def output_key(o: StepOutput | StepOutputPart) -> tuple[str, int | None]:
    """One output per command (per iteration of a chunk)."""
    return o.command_id, o.iteration_index


def cut_marker(o: StepOutput) -> str:
    """What follows the kept text of an output past the cap ("" when all was kept)."""
    if o.output_ref is None or o.size <= o.stored:
        return ""
    return f"\n... {o.size - o.stored:,} more bytes not kept (ACTORS_STEP_OUTPUT_MAX_BYTES); the last ones:\n{o.tail}"


@dataclass(slots=True)
class Printed:
    """One thing `follow_printed` has to show: `text` of `record` (a part as it came,
    or a whole output); `begins`: it starts that run's output (print a header first);
    `again`: that command ran again (a redelivery) after some of an earlier run's
    output was shown."""

    record: StepOutput | StepOutputPart
    text: str
    begins: bool
    again: bool = False


@dataclass(slots=True)
class _Run:
    delivery: int
    next_part: int = 0
    ended: bool = False


class StepOutputs(Reader):
    """`outputs`, `follow_outputs`, `follow_printed`, `output_text`, `step_names`."""

    def _output_filters(self, execution_id: str) -> list[tuple[str, str]]:
        check_execution_id(execution_id)
        return [
            (self.layout.exec_stream_of(execution_id), self.layout.execution(execution_id).outputs),
            (LOOP_STREAM, loop_outputs_filter(execution_id, self.layout.partitions)),
        ]

    async def _records(self, execution_id: str, step: str | None) -> list[Record]:
        what = f"reading the output of execution {execution_id}"
        found: list[Record] = []
        for stream, subject in self._output_filters(execution_id):
            for o in await self._ride(what, functools.partial(self._read_outputs, stream, subject, execution_id)):
                if step is None or o.step == step:
                    found.append(o)
        return found

    async def outputs(self, execution_id: str, *, step: str | None = None) -> list[StepOutput]:
        """What the execution's steps (and its loops' iterations) printed so far, in the
        order it was printed; only `step`'s when given. Per command, its last run's; a
        step still running is a `RunningOutput` (its text so far)."""
        finals: dict[tuple[str, int | None], StepOutput] = {}
        parts: dict[tuple[str, int | None], list[StepOutputPart]] = {}
        for o in await self._records(execution_id, step):
            key = output_key(o)
            if isinstance(o, StepOutputPart):
                parts.setdefault(key, []).append(o)
            elif key not in finals or o.delivery > finals[key].delivery:
                finals[key] = o  # a copy stored twice counts once; a later delivery wins
        shown: list[StepOutput] = []
        for key in finals.keys() | parts.keys():
            final = finals.get(key)
            last = max((p.delivery for p in parts.get(key, [])), default=-1)
            if final is not None and final.delivery >= last:
                shown.append(final)
            else:
                shown.append(_running([p for p in parts[key] if p.delivery == last]))
        return sorted(shown, key=lambda o: o.at)

    async def _read_outputs(self, stream: str, subject: str, execution_id: str) -> list[Record]:
        def expand(subject: str, data: bytes, seq: int, at: float) -> list[Record]:
            return [self.codec.decode(any_output_decoder, data)]

        found: list[Record] = await self._read_all(stream, subject, expand, execution_id=execution_id)
        return found

    async def follow_outputs(self, execution_id: str, *, step: str | None = None) -> AsyncIterator[StepOutput]:
        """Each step's output once it has ended (its `step.output`), from the start, then
        live until the execution ends (what it prints while it runs: `follow_printed`)."""
        async for p in self.follow_printed(execution_id, step=step):
            if isinstance(p.record, StepOutput):  # once per run, streamed or not
                yield p.record

    async def follow_printed(self, execution_id: str, *, step: str | None = None) -> AsyncIterator[Printed]:
        """What the steps print, from the start, then live until the execution ends: a
        step's parts as they come while it runs, then, once it ended, what was not
        shown yet (all of it when it ended before its first part was due)."""
        queue: asyncio.Queue[Record] = asyncio.Queue()
        runs: dict[tuple[str, int | None], _Run] = {}

        async def arrived(msg: Any) -> None:
            queue.put_nowait(self.codec.decode(any_output_decoder, msg.data))

        subs = [
            await self.js.subscribe(subject, stream=stream, ordered_consumer=True, cb=arrived, pending_msgs_limit=-1)
            for stream, subject in self._output_filters(execution_id)
        ]
        ended = asyncio.ensure_future(self.wait(execution_id))
        try:
            while not ended.done():
                got = asyncio.ensure_future(queue.get())
                await asyncio.wait({got, ended}, return_when=asyncio.FIRST_COMPLETED)
                if not got.done():
                    got.cancel()
                    continue
                o = got.result()
                if step is None or o.step == step:
                    shown = await self._printed(o, runs)
                    if shown is not None:
                        yield shown
            ended.result()
            # whatever was stored before the end and not delivered yet
            for o in sorted(await self._records(execution_id, step), key=lambda r: r.at):
                shown = await self._printed(o, runs)
                if shown is not None:
                    yield shown
        finally:
            ended.cancel()
            for sub in subs:
                await sub.unsubscribe()

    async def _printed(self, o: Record, runs: dict[tuple[str, int | None], _Run]) -> Printed | None:
        """What to show of `o`, given what was shown (`runs`); None: nothing (a copy,
        or an earlier run's)."""
        key = output_key(o)
        run = runs.get(key)
        if run is not None and o.delivery < run.delivery:
            return None  # an earlier run's, come late: the later run is what is shown
        again = run is not None and o.delivery > run.delivery and (run.next_part > 0 or run.ended)
        if run is None or o.delivery > run.delivery:
            run = runs[key] = _Run(o.delivery)
        if run.ended:
            return None
        if isinstance(o, StepOutputPart):
            if o.part != run.next_part:
                return None  # a copy (parts of one run are stored in order, without gaps)
            run.next_part += 1
            return Printed(o, o.text, begins=o.part == 0, again=again)
        run.ended = True
        if o.parts and run.next_part == o.parts:  # every part shown: what they miss, what was cut
            missed = ""
            if o.rest > 0:
                data = await self._kept_bytes(o) or b""
                missed = data[max(0, len(data) - o.rest) :].decode("utf-8", errors="replace")
            return Printed(o, missed + cut_marker(o), begins=False)
        # it ended before its first part was due (or some parts never came): all of it
        return Printed(o, await self.output_text(o), begins=True, again=again or run.next_part > 0)

    async def output_text(self, o: StepOutput) -> str:
        """The whole text `o` stands for: read from the object store when it was longer
        than the event's head and tail; past the cap, what was kept, a marker and the end."""
        if o.output_ref is None:
            return o.head if not o.tail else f"{o.head}\n... {o.size:,} bytes in all, middle not kept ...\n{o.tail}"
        data = await self._kept_bytes(o)
        if data is None:
            return f"{o.head}\n... {o.size:,} bytes in all, the whole text is gone from the store ...\n{o.tail}"
        return data.decode("utf-8", errors="replace") + cut_marker(o)

    async def _kept_bytes(self, o: StepOutput) -> bytes | None:
        """The kept text of `o` as stored: its head, or its object (None: gone)."""
        ref = o.output_ref
        if ref is None:
            return o.head.encode("utf-8", errors="replace")
        try:
            data: bytes = await self._ride(f"reading output {ref}", lambda: get_blob_bytes(self.js, ref))
        except BLOB_MISSING:
            stored = await self._archived_blob(ref)  # retired: from its archive
            if stored is None:
                return None
            data = stored_bytes(self.js, ref, stored)
        return data

    async def step_names(self, execution_id: str) -> set[str] | None:
        """The steps of the playbook the execution runs; None when that is not known
        (no start record yet, or a playbook this client cannot read)."""
        record = await self.start_record(execution_id)  # type: ignore[attr-defined]
        if record is None or not record.playbook_source:
            return None
        try:
            book = parsed_playbook(
                record.playbook_source, record.playbook_file or "<playbook>", record.limits.max_attempts
            )
        except Exception:
            return None
        return set(book.steps)


def _running(parts: list[StepOutputPart]) -> RunningOutput:
    """The parts of one run, joined (up to the first gap)."""
    parts = sorted({p.part: p for p in parts}.values(), key=lambda p: p.part)
    texts = []
    for n, p in enumerate(parts):
        if p.part != n:
            break
        texts.append(p.text)
    first = parts[0]
    text = "".join(texts)
    return RunningOutput(
        execution_id=first.execution_id,
        step=first.step,
        command_id=first.command_id,
        attempt_number=first.attempt_number,
        iteration_index=first.iteration_index,
        at=first.at,
        size=len(text.encode("utf-8", errors="replace")),
        head=text,
        delivery=first.delivery,
        parts=len(texts),
    )
