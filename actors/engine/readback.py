"""An input's values that travel as blobs (too large for a message) read back before
it is folded: by the engine, live and in a replay, and by `Client.retry` folding an
old execution's log. A blob that is gone becomes the input's error (the step or the
execution fails saying so), never an input retried for ever."""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from actors.blobs import BLOB_MISSING, get_blob, resolve_result
from actors.core.effects import loop_failed
from actors.wire import CallDone, ErrorInfo, Input, IteratorCompleted, StartRecord


async def read_back(js: JetStreamContext, inp: Input) -> Input:
    """`inp` with the values it names as blobs read back into it."""
    if isinstance(inp, CallDone) and inp.result_ref is not None:
        return await resolve_result(js, inp)
    if isinstance(inp, StartRecord) and inp.payload_ref is not None:
        try:
            payload = await get_blob(js, inp.payload_ref)
        except BLOB_MISSING:
            payload = None
        if isinstance(payload, dict):
            inp.payload, inp.payload_ref = payload, None
        elif inp.error is None:
            inp.error = ErrorInfo(
                type="ValueMissing", message=f"start payload blob {inp.payload_ref} not found (expired or removed)"
            )
        return inp
    if isinstance(inp, IteratorCompleted) and inp.results is None and inp.results_ref:
        try:
            inp.results = await get_blob(js, inp.results_ref)
        except NotFoundError:
            # the blob expired or was removed: the loop's results are gone, say so
            missing = ErrorInfo(type="ResultsMissing", message=f"blob {inp.results_ref} not found")
            return loop_failed(
                inp.execution_id,
                inp.loop_id,
                inp.step,
                missing,
                total=inp.total,
                succeeded=inp.succeeded,
                failed=inp.failed,
            )
    return inp
