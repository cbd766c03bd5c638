"""What an execution's steps printed (`StepOutput` events, written by tool actors; see
actors/tools/outputs.py): read as it is, or followed live until the execution ends,
and the whole text of one."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from typing import Any

from actors.client.checks import check_execution_id
from actors.client.reading import Reader
from actors.store.blobs import BLOB_MISSING, get_blob_bytes, stored_bytes
from actors.wire.events import StepOutput, step_output_decoder
from streams.layout import EXEC_STREAM, LOOP_STREAM
from streams.subjects import loop_outputs_filter

__all__ = ["StepOutputs", "output_key"]


def output_key(o: StepOutput) -> tuple[str, int | None]:
    """One output per command (per iteration of a chunk): a copy stored twice counts once."""
    return o.command_id, o.iteration_index


class StepOutputs(Reader):
    """`outputs`, `follow_outputs`, `output_text`."""

    def _output_filters(self, execution_id: str) -> list[tuple[str, str]]:
        check_execution_id(execution_id)
        return [
            (EXEC_STREAM, self.layout.execution(execution_id).outputs),
            (LOOP_STREAM, loop_outputs_filter(execution_id, self.layout.partitions)),
        ]

    async def outputs(self, execution_id: str, *, step: str | None = None) -> list[StepOutput]:
        """What the execution's steps (and its loops' iterations) printed so far, in the
        order it was printed; only `step`'s when given."""
        found: dict[tuple[str, int | None], StepOutput] = {}
        what = f"reading the output of execution {execution_id}"
        for stream, subject in self._output_filters(execution_id):
            for o in await self._ride(what, functools.partial(self._read_outputs, stream, subject, execution_id)):
                if step is None or o.step == step:
                    found.setdefault(output_key(o), o)
        return sorted(found.values(), key=lambda o: o.at)

    async def _read_outputs(self, stream: str, subject: str, execution_id: str) -> list[StepOutput]:
        def expand(subject: str, data: bytes, seq: int, at: float) -> list[StepOutput]:
            return [self.codec.decode(step_output_decoder, data)]

        found: list[StepOutput] = await self._read_all(stream, subject, expand, execution_id=execution_id)
        return found

    async def follow_outputs(self, execution_id: str, *, step: str | None = None) -> AsyncIterator[StepOutput]:
        """What the steps print, from the start, then live until the execution ends."""
        queue: asyncio.Queue[StepOutput] = asyncio.Queue()
        seen: set[tuple[str, int | None]] = set()

        async def arrived(msg: Any) -> None:
            queue.put_nowait(self.codec.decode(step_output_decoder, msg.data))

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
                if output_key(o) not in seen and (step is None or o.step == step):
                    seen.add(output_key(o))
                    yield o
            ended.result()
            # whatever was stored before the end and not delivered yet
            for o in await self.outputs(execution_id, step=step):
                if output_key(o) not in seen:
                    seen.add(output_key(o))
                    yield o
        finally:
            ended.cancel()
            for sub in subs:
                await sub.unsubscribe()

    async def output_text(self, o: StepOutput) -> str:
        """The whole text `o` stands for: read from the object store when it was longer
        than the event's head and tail; past the cap, what was kept, a marker and the end."""
        if o.output_ref is None:
            return o.head if not o.tail else f"{o.head}\n... {o.size:,} bytes in all, middle not kept ...\n{o.tail}"
        ref = o.output_ref
        try:
            data = await self._ride(f"reading output {ref}", lambda: get_blob_bytes(self.js, ref))
        except BLOB_MISSING:
            stored = await self._archived_blob(ref)  # retired: from its archive
            if stored is None:
                return f"{o.head}\n... {o.size:,} bytes in all, the whole text is gone from the store ...\n{o.tail}"
            data = stored_bytes(self.js, ref, stored)
        text = data.decode("utf-8", errors="replace")
        if o.size > o.stored:
            text += f"\n... {o.size - o.stored:,} more bytes not kept (ACTORS_STEP_OUTPUT_MAX_BYTES); the last ones:\n"
            text += o.tail
        return text
